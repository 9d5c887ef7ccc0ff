import json
import time

import numpy as np
import pandas as pd
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.evaluate import (
    compare,
    compare_splits,
    ece,
    format_table,
    mcnemar,
    nll,
    prediction_metrics,
    score_fusers,
)
from forgetkit.fusion import (
    CheckpointAverage,
    EarlyStopping,
    EnsembleSelection,
    KnowledgeFusion,
    LikelihoodFusion,
)

from .conftest import SAMPLE_RUN, make_run


def test_metrics_by_hand():
    p = np.array([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3]])
    y = np.array([0, 0, 1])
    assert nll(p, y) == pytest.approx(-np.mean(np.log([0.9, 0.4, 0.3])))
    # bins (15): 0.9 -> bin 13 (hit), 0.6 -> bin 9 (miss), 0.7 -> bin 10 (miss)
    assert ece(p, y) == pytest.approx((abs(1 - 0.9) + abs(0 - 0.6) + abs(0 - 0.7)) / 3)
    a = np.array([True] * 10 + [False] * 5)
    b = np.array([False] * 10 + [False] * 5)
    assert mcnemar(a, b) == pytest.approx(2 * 0.5**10)
    assert mcnemar(a, a) == 1.0


@pytest.mark.parametrize("n", [1, 2, 7, 40, 333])
def test_mcnemar_is_scipys_exact_binomial_test(n):
    from scipy.stats import binomtest

    for a_only in range(n + 1):
        a = np.array([True] * a_only + [False] * (n - a_only) + [True] * 5)
        b = np.array([False] * a_only + [True] * (n - a_only) + [True] * 5)
        ref = binomtest(min(a_only, n - a_only), n, 0.5).pvalue
        assert mcnemar(a, b) == pytest.approx(ref, rel=1e-11)


def test_compare_on_the_real_run(real_run):
    t = time.perf_counter()
    table = compare(real_run)
    assert time.perf_counter() - t < 60  # the 30 s figure is measured in bench/
    assert list(table.index) == ["single", "kf1", "kf", "horizontal", "fixed_jumps",
                                 "early_stopping", "ensemble_selection", "likelihood"]
    assert table.loc["kf", "accuracy"] > table.loc["single", "accuracy"]
    k = table.loc["kf", "k"]
    assert table.loc["horizontal", "k"] == k and table.loc["fixed_jumps", "k"] == k
    assert table.loc["single", "gain"] == 0
    long = compare_splits(real_run, methods=["single", "kf"])
    single = long[long.method == "single"].accuracy
    assert table.loc["single", "accuracy_se"] == pytest.approx(np.std(single, ddof=1) / np.sqrt(3))
    text = format_table(table)
    assert "KF(inf)" in text and "±" in text
    assert format_table(table, fmt="markdown").startswith("| method | k |")


@pytest.mark.parametrize("source", ["real", "diffuse"])
def test_compare_streamed_equals_in_memory(source, real_small, tmp_path):
    """The same table whether the probabilities are held (default budget), only the shared
    softmax statistics with each class's bound fit (1 MB), or nothing does (0); on the real
    run and on diffuse float16 outputs over many classes with exact ties."""
    run = real_small if source == "real" else make_run(n_epochs=9, n_samples=400,
                                                      n_classes=60, dtype=np.float16,
                                                      ties=True)
    fk.save(run, tmp_path / "r.npy")
    tables = [compare_splits(fk.load(tmp_path / "r.npy"), memory_budget=budget)
              for budget in (2 << 30, 1 << 20, 0)]
    pd.testing.assert_frame_equal(tables[1], tables[0])
    pd.testing.assert_frame_equal(tables[2], tables[0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_score_fusers_in_one_pass_equals_each_predict_proba(dtype, tmp_path):
    """Every fuser's recipe run in one pass over the test half's logits gives the scores of
    its own predict_proba, bit for bit (hit, NLL, ECE), ties included."""
    run = make_run(n_epochs=9, n_samples=400, n_classes=30, dtype=dtype, ties=True)
    fk.save(run, tmp_path / "r.npy")
    val, test = fk.load(tmp_path / "r.npy").split(0.5, seed=0)
    fusers = [KnowledgeFusion().fit(val), KnowledgeFusion(window=2, grid=None).fit(val),
              CheckpointAverage("horizontal", max_checkpoints=4).fit(val),
              CheckpointAverage("fixed_jumps", max_checkpoints=3).fit(val),
              CheckpointAverage("single").fit(val),
              EarlyStopping().fit(val), EnsembleSelection(max_checkpoints=5).fit(val),
              LikelihoodFusion(max_checkpoints=4).fit(val)]
    assert max(sum(eps > 0 for _, eps in f.plan_) for f in fusers[:2]) >= 2
    for fuser, (hit, nll_, ece_) in zip(fusers, score_fusers(fusers, test), strict=True):
        ref_hit, ref_nll, ref_ece = prediction_metrics(fuser.predict_proba(test), test.labels)
        np.testing.assert_array_equal(hit, ref_hit)
        assert (nll_, ece_) == (ref_nll, ref_ece)
    out = np.array(run.outputs)
    out[4, 3, 2] = np.nan
    np.save(tmp_path / "bad.npy", out)
    bad = fk.load(tmp_path / "bad.npy", labels=run.labels)
    with pytest.raises(ValueError, match="epoch index 4"):
        score_fusers([CheckpointAverage("uniform").fit(val)], bad)


def test_compare_with_a_validation_run():
    val, test = make_run(seed=0), make_run(seed=1)
    table = compare(test, methods=["single", "kf"], val_run=val)
    assert np.isnan(table.loc["kf", "accuracy_se"])


def test_compare_rejects_unknown_methods(real_small):
    with pytest.raises(ValueError, match="method must be one of .*'kf'.*; got 'kff'"):
        compare(real_small, methods=["kff"])


def test_cli_fuse_apply_compare(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["fuse", str(SAMPLE_RUN), "--plan", str(plan), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and json.loads(plan.read_text())["plan"]
    fused = tmp_path / "fused.npy"
    assert main(["apply", str(plan), str(SAMPLE_RUN), "--out", str(fused), "--quiet"]) == 0
    p = np.load(fused)
    assert p.shape == (10000, 10)
    np.testing.assert_allclose(p.sum(1), 1, atol=1e-12)
    kf = fk.fusion.KnowledgeFusion.from_json(plan)
    np.testing.assert_array_equal(p, kf.predict_proba(fk.load(SAMPLE_RUN)))
    assert main(["compare", str(SAMPLE_RUN), "--seeds", "0", "--methods", "single", "kf",
                 "--json", str(tmp_path / "t.json")]) == 0
    assert "KF(inf)" in capsys.readouterr().out
    assert json.loads((tmp_path / "t.json").read_text())[1]["method"] == "kf"


def test_cli_fuse_with_indices_and_val_run(tmp_path, capsys):
    run = make_run()
    fk.save(run, tmp_path / "r.npz")
    np.savetxt(tmp_path / "idx.txt", np.arange(0, 300, 2), fmt="%d")
    assert main(["fuse", str(tmp_path / "r.npz"), "--val-indices", str(tmp_path / "idx.txt"),
                 "--plan", str(tmp_path / "p.json"), "--quiet"]) == 0
    assert main(["fuse", str(tmp_path / "r.npz"), "--val-run", str(tmp_path / "r.npz"),
                 "--plan", str(tmp_path / "p2.json"), "--quiet", "--rule", "paper"]) == 0


def test_apply_never_overwrites_its_input(tmp_path, capsys):
    run = make_run()
    src = tmp_path / "r.npy"
    fk.save(run, src)
    plan = tmp_path / "p.json"
    fk.fusion.KnowledgeFusion().fit(run).to_json(plan)
    before = src.read_bytes()
    assert main(["apply", str(plan), str(src), "--out", str(src)]) == 1
    assert "would overwrite the input" in capsys.readouterr().err
    assert src.read_bytes() == before
    other = make_run(n_epochs=4)
    fk.save(other, tmp_path / "o.npz")
    assert main(["apply", str(plan), str(tmp_path / "o.npz"), "--out",
                 str(tmp_path / "f.npy")]) == 1
    assert "lacks epochs" in capsys.readouterr().err
    assert not (tmp_path / "f.npy").exists()


def test_kf_fits_are_shared_between_table_and_curves(real_small, monkeypatch):
    from forgetkit import evaluate
    from forgetkit.fusion import KnowledgeFusion

    fits = {}
    table = fk.compare(real_small, methods=["single", "kf"], seeds=(0, 1), kf_fits=fits)
    assert sorted(fits) == [(0, 1), (1, 1)]
    calls = []
    original = KnowledgeFusion.fit
    monkeypatch.setattr(KnowledgeFusion, "fit",
                        lambda self, *a, **k: calls.append(self.window) or original(self, *a, **k))
    again = fk.compare(real_small, methods=["single", "kf"], seeds=(0, 1), kf_fits=fits)
    pd.testing.assert_frame_equal(table, again)
    evaluate.ensemble_size_curve(real_small, seeds=(0, 1), kf_fits=fits)
    evaluate.window_curve(real_small, windows=(0, 1), seeds=(0, 1), kf_fits=fits)
    assert calls == [0, 0]  # only the window-0 fits were new
