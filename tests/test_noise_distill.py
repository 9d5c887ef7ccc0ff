import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import forgetkit as fk
from forgetkit import noise
from forgetkit.cli import main
from forgetkit.datasets import load_fashion_mnist, read_idx
from forgetkit.fusion.distill import soft_targets, write_soft_targets

from .conftest import make_run, require_real_part


def test_symmetric_noise():
    y = np.repeat(np.arange(10), 100)
    noisy, mask = noise.symmetric(y, 0.3, 10, seed=1)
    assert mask.sum() == 300 and (noisy[mask] != y[mask]).all() and (noisy[~mask] == y[~mask]).all()
    # every wrong class is reachable, roughly uniformly
    shift = (noisy[mask] - y[mask]) % 10
    assert set(shift) == set(range(1, 10))
    again, _ = noise.symmetric(y, 0.3, 10, seed=1)
    assert np.array_equal(noisy, again)
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]; got 1.5"):
        noise.symmetric(y, 1.5, 10)
    with pytest.raises(ValueError, match="labels must lie in"):
        noise.symmetric(y, 0.1, 5)


def test_asymmetric_noise():
    y = np.repeat(np.arange(4), 50)
    mapping = np.array([1, 2, 3, 0])
    noisy, mask = noise.asymmetric(y, 0.5, mapping, seed=0)
    assert mask.sum() == 100 and (noisy[mask] == mapping[y[mask]]).all()
    fixed = np.array([1, 0, 2, 3])  # classes 2 and 3 map to themselves and stay clean
    noisy, mask = noise.asymmetric(y, 1.0, fixed)
    assert mask.sum() == 100 and (noisy[y >= 2] == y[y >= 2]).all()
    with pytest.raises(ValueError, match="mapping values"):
        noise.asymmetric(y, 0.5, np.array([0, 1, 2, 7]))


def test_soft_targets_and_files(tmp_path):
    val, train = make_run(seed=0), make_run(seed=0, n_samples=80)
    kf = fk.KnowledgeFusion().fit(val)
    q = soft_targets(kf, train)
    np.testing.assert_array_equal(q, kf.predict_proba(train))
    hot = soft_targets(kf, train, temperature=0.5)
    np.testing.assert_allclose(hot.sum(1), 1, atol=1e-12)
    assert (hot.max(1) >= q.max(1) - 1e-12).all()  # T < 1 sharpens
    train = fk.Run(train.outputs, train.labels, sample_ids=[f"img{i}" for i in range(80)])
    write_soft_targets(tmp_path / "t.parquet", kf, train, temperature=2.0)
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column("sample_id").to_pylist()[:2] == ["img0", "img1"]
    t = np.stack(table.column("targets").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(t, soft_targets(kf, train, temperature=2.0), rtol=1e-6)
    write_soft_targets(tmp_path / "t.npy", kf, train)
    side = json.loads((tmp_path / "t.forgetkit.json").read_text())
    assert side["sample_id"][5] == "img5" and np.load(tmp_path / "t.npy").shape == (80, 5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        soft_targets(kf, train, temperature=0)
    with pytest.raises(ValueError, match=".parquet or .npy"):
        write_soft_targets(tmp_path / "t.csv", kf, train)


def test_cli_distill(tmp_path, capsys):
    run = make_run()
    fk.save(run, tmp_path / "r.npz")
    fk.KnowledgeFusion().fit(run).to_json(tmp_path / "p.json")
    assert main(["distill", str(tmp_path / "p.json"), str(tmp_path / "r.npz"), "--out",
                 str(tmp_path / "targets.parquet")]) == 0
    assert pq.read_table(tmp_path / "targets.parquet").num_rows == run.n_samples


def test_idx_reader(tmp_path):
    header = bytes([0, 0, 0x08, 2]) + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
    (tmp_path / "a-idx2-ubyte").write_bytes(header + bytes(range(6)))
    assert read_idx(tmp_path / "a-idx2-ubyte").tolist() == [[0, 1, 2], [3, 4, 5]]
    (tmp_path / "b").write_bytes(header + bytes(range(5)))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist("test", root=tmp_path)


def test_fashion_mnist_matches_the_sample_run(real_run):
    try:
        x, y = load_fashion_mnist("test")
    except FileNotFoundError:
        x = y = None
    require_real_part("Fashion-MNIST (Debian package dataset-fashion-mnist)", x is not None)
    assert x.shape == (10000, 28, 28) and np.array_equal(y, real_run.labels)


def test_large_loss_dominance_by_hand():
    # 6 samples, 2 noisy (4, 5); large-loss set = top 2 (the noise rate)
    losses = np.array([[0.1, 0.2, 0.3, 0.4, 5.0, 6.0],    # both noisy on top: 0 - 2
                       [0.1, 0.2, 9.0, 0.4, 5.0, 0.0],    # one clean, one noisy: 1 - 1
                       [7.0, 8.0, 0.3, 0.4, 0.0, 0.0]])   # memorised: 2 - 0
    mask = np.array([0, 0, 0, 0, 1, 1], bool)
    assert noise.large_loss_dominance(losses, mask).tolist() == [-2, 0, 2]
    assert noise.large_loss_dominance(losses, mask, frac=0.5).tolist() == [-1, 1, 3]
    with pytest.raises(ValueError, match="noise_mask"):
        noise.large_loss_dominance(losses, mask[:5])


def test_training_losses_are_cross_entropy():
    run = make_run(n_epochs=3)
    losses = noise.training_losses(run)
    p = run.probs(1)[np.arange(run.n_samples), run.labels]
    np.testing.assert_allclose(losses[1], -np.log(p))
