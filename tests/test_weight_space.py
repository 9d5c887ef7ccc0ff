"""Weight space (issue 39): averages of checkpoints against a hand computation (uniform,
weighted, EMA, integer buffers, BatchNorm re-estimated as torch's update_bn does), the
greedy soup against a plain loop, and the comparison on fk.compare's split halves."""

from __future__ import annotations

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.cli import main

from .conftest import import_real_part

torch = import_real_part("torch", "PyTorch (the torch extra)")
from forgetkit.exporters import weight_space as ws  # noqa: E402
from forgetkit.exporters.torch import (  # noqa: E402
    average_weights,
    compare_weight_space,
    replay,
)


def small_net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 3))


def save_checkpoints(folder, n=4):
    """n state dicts of different weights and BatchNorm statistics (epoch in the name)."""
    states = []
    for i in range(n):
        net = small_net(seed=i)
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
        net[1].num_batches_tracked.fill_(10 * (i + 1))
        torch.save(net.state_dict(), folder / f"epoch_{i}.pt")
        states.append({k: v.clone() for k, v in net.state_dict().items()})
    return states


def hand_average(states, w):
    out = {}
    for k in states[0]:
        if states[0][k].is_floating_point():
            total = sum(float(wi) * s[k].double() for wi, s in zip(w, states, strict=True))
            out[k] = total.to(states[0][k].dtype)
    return out


def test_averages_equal_a_hand_computation(tmp_path):
    states = save_checkpoints(tmp_path)
    for w in (None, [0.1, 0.2, 0.3, 0.4], ws.ema_weights(4, 0.7)):
        with pytest.warns(UserWarning, match=r"BatchNorm layers \(1\)"):
            model = average_weights(small_net(9), tmp_path / "*.pt", weights=w)
        want = hand_average(states, np.full(4, 0.25) if w is None else w)
        got = model.state_dict()
        for k, v in want.items():
            assert torch.equal(got[k], v), k
        assert int(got["1.num_batches_tracked"]) == 40  # the last checkpoint's
    # only the last two: integer buffers of the last of them, floats their mean
    model = average_weights(small_net(9), sorted(tmp_path.glob("*.pt"))[2:],
                            bn_data=(torch.randn(10, 4), torch.zeros(10, dtype=torch.long)))
    assert torch.equal(model[0].weight, hand_average(states[2:], [0.5, 0.5])["0.weight"])


def test_ema_weights_are_the_ema_loop():
    rng = np.random.default_rng(0)
    thetas = rng.normal(size=(6, 5))
    for d in (0.0, 0.5, 0.9):
        theta = thetas[0].copy()
        for t in thetas[1:]:
            theta = d * theta + (1 - d) * t
        np.testing.assert_allclose(ws.ema_weights(6, d) @ thetas, theta, rtol=1e-13)
        assert ws.ema_weights(6, d).sum() == pytest.approx(1.0)


def test_batch_norm_is_re_estimated_as_update_bn_does(tmp_path):
    save_checkpoints(tmp_path)
    x = torch.randn(40, 4) * 3 + 1
    y = torch.zeros(40, dtype=torch.long)
    ours = average_weights(small_net(9), tmp_path, bn_data=(x, y), batch_size=16)
    theirs = average_weights(small_net(9), tmp_path, bn_data=(x[:2], y[:2]))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    torch.optim.swa_utils.update_bn(loader, theirs)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(ours[1], name), getattr(theirs[1], name),
                                   rtol=1e-6, atol=1e-7)
    assert ours[1].momentum == 0.1 and ours.training  # restored (a new module trains)


def test_bad_weights_and_checkpoints(tmp_path):
    save_checkpoints(tmp_path)
    for w, message in (([0.5, 0.5], "one number per checkpoint"),
                       ([0.5, 0.5, 0.5, -0.5], ">= 0"),
                       ([0.1, 0.1, 0.1, 0.1], "sum to 1")):
        with pytest.raises(fk.ForgetkitError, match=message):
            average_weights(small_net(), tmp_path, weights=w, bn_data=None)
    with pytest.raises(fk.ForgetkitError, match="does not fit the model"):
        average_weights(torch.nn.Linear(4, 3), tmp_path)
    with pytest.raises(fk.ForgetkitError, match="no checkpoint matches"):
        average_weights(small_net(), tmp_path / "nothing*.pt")
    with pytest.raises(fk.ForgetkitError, match="decay"):
        ws.ema_weights(3, 1.0)


def soup_ref(val_accuracy, soup_accuracy):
    """The greedy soup, written as the paper's recipe reads."""
    ranked = sorted(range(len(val_accuracy)), key=lambda i: -val_accuracy[i])
    soup = [ranked[0]]
    for c in ranked[1:]:
        if soup_accuracy(soup + [c]) >= soup_accuracy(soup):
            soup = soup + [c]
    return soup


def test_greedy_soup_equals_a_plain_loop():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 8))
        own = np.round(rng.random(n), 1)  # ties in the order
        quality = rng.random(n)

        def soup_accuracy(indices, quality=quality):
            return float(np.round(np.mean(quality[indices]) + 0.1 * len(indices) ** 0.5, 2))

        assert ws.greedy_soup(own, soup_accuracy) == soup_ref(list(own), soup_accuracy)


# ------------------------------------------------------------------ the comparison
def blobs(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centers = np.array([[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]], dtype=np.float32)
    x = centers[y] + rng.normal(size=(n, 4)).astype(np.float32) * 1.3
    return torch.as_tensor(x), torch.as_tensor(y)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small network trained 6 epochs on blobs (a checkpoint each), its test run."""
    folder = tmp_path_factory.mktemp("ws")
    (x, y), test = blobs(600, 0), blobs(400, 1)
    net = small_net(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.3)
    for epoch in range(6):
        for i in range(0, 600, 50):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[i:i + 50]), y[i:i + 50]).backward()
            opt.step()
        torch.save(net.state_dict(), folder / f"epoch_{epoch}.pt")
    run = replay(small_net(5), folder / "*.pt", test, folder / "run.npy", dtype="float32",
                 progress=False)
    return folder, (x, y), test, run


def test_comparison_on_the_split_halves_of_compare(trained):
    folder, train, test, run = trained
    table = compare_weight_space(small_net(7), folder / "*.pt", test, run, bn_data=train,
                                 last=(2, 5, 50), decays=(0.5,), seeds=(0, 1))
    output = fk.compare(run, seeds=(0, 1))
    for m in output.index:  # fk.compare's rows, unchanged
        for col in ("accuracy", "gain", "k", "nll", "p_max"):
            assert table.loc[m, col] == output.loc[m, col], (m, col)
    weight = table[table["space"] == "weight"]
    assert list(weight.index) == ["last2", "last5", "ema0.5", "soup"]  # 50 > 6: left out
    assert (weight["forward_passes"] == 1).all()
    assert (table.loc[output.index, "forward_passes"] == output["k"]).all()
    # the mean of the last two checkpoints, by hand: its accuracy on each test half
    model = average_weights(small_net(8), sorted(folder.glob("*.pt"))[-2:], bn_data=train)
    model.eval()
    with torch.no_grad():
        pred = model(test[0]).argmax(1).numpy()
    accs = [100 * np.mean(pred[t] == run.labels[t])
            for t in (fk.split_indices(run.n_samples, 0.5, seed=s)[1] for s in (0, 1))]
    assert table.loc["last2", "accuracy"] == pytest.approx(np.mean(accs), abs=1e-9)
    assert table.loc["soup", "label"] == "weights: greedy soup"
    text = fk.format_table(table)
    assert "weights: mean of last 2" in text and "KF(inf)" in text


def test_comparison_refuses_data_and_checkpoints_of_another_run(trained, tmp_path, capsys):
    folder, train, test, run = trained
    other = blobs(400, 2)
    with pytest.raises(fk.ForgetkitError, match="labels are not the run's"):
        compare_weight_space(small_net(), folder, other, run, bn_data=train)
    with pytest.raises(fk.ForgetkitError, match="epoch numbers"):
        compare_weight_space(small_net(), folder, test, run, epochs=[10, 11, 12, 13, 14, 15],
                             bn_data=train)
    # the command line: the table, and one line for a bad input
    np.savez(tmp_path / "test.npz", x=test[0].numpy(), labels=test[1].numpy())
    np.savez(tmp_path / "train.npz", x=train[0].numpy(), labels=train[1].numpy())
    (tmp_path / "net.py").write_text(
        "import torch\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(8, 3))\n",
        encoding="utf-8")
    args = ["compare-weights", str(folder / "*.pt"), "--model", f"{tmp_path / 'net.py'}:make",
            "--data", str(tmp_path / "test.npz"), "--run", str(folder / "run.npy"),
            "--bn-data", str(tmp_path / "train.npz"), "--seeds", "0", "--last", "2",
            "--decays", "0.5", "--markdown", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| weights: greedy soup | 1 |" in out and "| KF(inf) |" in out
    assert main([*args[:-2], "--data", str(tmp_path / "train.npz"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "labels are not the run's" in err


# ------------------------------------------------------------------ Hugging Face, tokens
def test_trainer_folders_and_a_token_run(tmp_path):
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from forgetkit.exporters import huggingface as H

    from .test_tokens_record import tiny_gpt2, token_data

    folders = []
    for e in (1, 2, 3, 4):
        folders.append(tmp_path / "out" / f"checkpoint-{e}")
        tiny_gpt2(transformers, seed=e).save_pretrained(folders[-1])
    states = [transformers.GPT2LMHeadModel.from_pretrained(f).state_dict() for f in folders]
    model = H.average_weights(tmp_path / "out", weights=[0.1, 0.2, 0.3, 0.4])
    want = hand_average(states, [0.1, 0.2, 0.3, 0.4])
    for k, v in want.items():
        assert torch.equal(model.state_dict()[k], v), k
    data = token_data(40, seed=3)
    run = H.replay(tmp_path / "out", data, tmp_path / "run.npy", top_k=5, batch_size=8,
                   progress=False)
    table = H.compare_weight_space(tmp_path / "out", data, run, last=(2,), decays=(0.5,),
                                   seeds=(0, 1), batch_size=8)
    output = fk.compare(run, seeds=(0, 1))
    for m in output.index:
        assert table.loc[m, "accuracy_low"] == output.loc[m, "accuracy_low"], m
    assert list(table[table["space"] == "weight"].index) == ["last2", "ema0.5", "soup"]
    # the mean of the last two folders, by hand: next-token accuracy on each test half
    avg = H.average_weights(folders[2:])
    with torch.no_grad():
        logits = avg(input_ids=data["input_ids"]).logits[:, :-1]
    target = data["labels"][:, 1:]
    keep = target != -100
    hit = (logits.argmax(-1) == target)[keep].numpy()  # row-major: run's token order
    assert hit.shape == (run.n_samples,)
    accs = [100 * hit[fk.split_indices(run.n_samples, 0.5, seed=s)[1]].mean() for s in (0, 1)]
    assert table.loc["last2", "accuracy"] == pytest.approx(np.mean(accs), abs=1e-9)
    assert table.loc["last2", "accuracy_low"] == table.loc["last2", "accuracy_high"]
    other = token_data(40, seed=4)
    with pytest.raises(fk.ForgetkitError, match="target tokens are not the run's"):
        H.compare_weight_space(tmp_path / "out", other, run, last=(2,), decays=(),
                               soup=False, seeds=(0,))


def test_a_token_run_with_its_own_sequence_ids(tmp_path):
    """A token run recorded with `sequence_ids` (a spread of a held-out stream, say) is
    compared on the same tokens when compare_weight_space is given those ids."""
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from forgetkit.exporters.torch import TokenRecorder, compare_weight_space

    from .test_tokens_record import tiny_gpt2, token_data

    data, ids = token_data(24, seed=5), np.arange(24) * 7 + 3
    recorder = TokenRecorder(tmp_path / "run.npy", data, top_k=4, batch_size=8,
                             sequence_ids=ids, durable=False)
    for e in (1, 2, 3):
        model = tiny_gpt2(transformers, seed=e)
        torch.save(model.state_dict(), tmp_path / f"epoch_{e}.pt")
        recorder.record(model, e)
    recorder.close()
    run = fk.load(tmp_path / "run.npy")
    model = tiny_gpt2(transformers)
    options = dict(last=(2,), decays=(), soup=False, seeds=(0,), batch_size=8)
    table = compare_weight_space(model, tmp_path / "epoch_*.pt", data, run,
                                 sequence_ids=ids, **options)
    assert list(table[table["space"] == "weight"].index) == ["last2"]
    with pytest.raises(fk.ForgetkitError, match="target tokens are not the run's"):
        compare_weight_space(model, tmp_path / "epoch_*.pt", data, run, **options)
