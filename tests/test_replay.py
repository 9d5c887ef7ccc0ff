"""Replays: saved checkpoints evaluated into a run (forgetkit.exporters.*.replay, the CLI).

Each framework's test trains a tiny model a few epochs with its recorder and its own
checkpointing, then replays the saved checkpoints: the run must equal the recorded one bit
for bit (on the CPU)."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.cli import main as cli_main

from .conftest import ROOT, import_real_part, kill_when_ready
from .test_recording import TokenDataset, tiny_bert, train_recording

torch = import_real_part("torch", "PyTorch (pip install forgetkit[torch])")
from torch import nn  # noqa: E402

from forgetkit.exporters.torch import LogitRecorder, replay  # noqa: E402


def small_net():
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def data(n=90, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def train_and_save(tmp_path, epochs=(8, 9, 10), name="model_{}.pt", save=None):
    """Train small_net, record every epoch with LogitRecorder and save a checkpoint."""
    torch.manual_seed(0)
    net = small_net()
    x, y = data(200, seed=0)
    test = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=32)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    files = []
    with LogitRecorder(tmp_path / "recorded.npy", test, dtype="float32") as rec:
        for e in epochs:
            net.train()
            for i in range(0, 200, 50):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x[i:i + 50]), y[i:i + 50]).backward()
                opt.step()
            rec.record(net, e)
            f = tmp_path / name.format(e)
            (save or torch.save)(net.state_dict(), f)
            files.append(f)
    return test, files


def assert_same_run(run, recorded):
    assert np.array_equal(np.asarray(run.outputs), np.asarray(recorded.outputs))
    assert np.array_equal(run.labels, recorded.labels)
    assert run.epochs.tolist() == recorded.epochs.tolist()


def test_replay_of_saved_state_dicts_is_the_recorded_run(tmp_path):
    test, files = train_and_save(tmp_path)
    # model_10 sorts before model_8 by name: the epochs come from the numbers
    run = replay(small_net(), str(tmp_path / "model_*.pt"), test, tmp_path / "replayed.npy",
                 dtype="float32")
    recorded = fk.load(tmp_path / "recorded.npy")
    assert_same_run(run, recorded)
    entries = run.meta["replay"]["checkpoints"]
    assert [e["epoch"] for e in entries] == [8, 9, 10]
    assert [e["file"] for e in entries] == [str(f) for f in files]
    assert len({e["sha256"] for e in entries}) == 3 and entries[0]["step"] is None
    # several devices (here three CPU replicas) take whole checkpoints, written in order
    multi = replay(small_net(), files, test, tmp_path / "multi.npy", dtype="float32",
                   devices=["cpu", "cpu", "cpu"])
    assert_same_run(multi, recorded)


def test_several_devices_share_checkpoints_by_who_is_free(tmp_path, monkeypatch):
    """A device that is slow gets fewer checkpoints than a free one, and the run is still
    written in epoch order; with BALANCE off checkpoint i goes to device i mod n. With
    BALANCE the first device (0) starts taking checkpoints after the other has taken its
    first (so both are running: a device that starts alone may take its read-ahead share
    before the other asks) and is slow by waiting, at its first load, until the other has
    loaded the four it may take meanwhile, instead of by a fixed sleep that a loaded
    machine can outlast; without BALANCE it sleeps 0.5 s per load."""
    from forgetkit.exporters import _torch_replay as R

    test, files = train_and_save(tmp_path, epochs=tuple(range(6)))
    recorded = fk.load(tmp_path / "recorded.npy")
    load, next_position, done = R.Device.load, R._Results.next_position, []

    def slow_load(self, item):
        first = self.model is net
        if first and R.BALANCE and not any(f for f, _ in done):
            assert others_loaded.wait(60), ("the free device was not given the others", done)
        elif first:
            time.sleep(0.5)
        done.append((first, item.position))
        out = load(self, item)
        if not first and sum(not f for f, _ in done) >= 4:
            others_loaded.set()
        return out

    def in_turn(self, d, held=0):
        if R.BALANCE and d == 0:
            assert other_asked.wait(60), "the second device never asked for a checkpoint"
        p = next_position(self, d, held)
        if d == 1:
            other_asked.set()
        return p

    monkeypatch.setattr(R.Device, "load", slow_load)
    monkeypatch.setattr(R._Results, "next_position", in_turn)
    for balance in (True, False):
        monkeypatch.setattr(R, "BALANCE", balance)
        net, done[:] = small_net(), []
        others_loaded, other_asked = threading.Event(), threading.Event()
        run = replay(net, files, test, tmp_path / f"b{balance}.npy", dtype="float32",
                     devices=["cpu", "cpu"])
        assert_same_run(run, recorded)
        slow = sorted(p for first, p in done if first)
        assert sorted(p for _, p in done) == list(range(6))
        assert len(slow) <= 2 if balance else slow == [0, 2, 4]


class FakeCapture:
    """The CUDA graph capture's stand-in on the CPU (`_torch_replay.CAPTURE`), so that the
    GPU path runs here: a "graph" runs its call again when replayed and writes the results
    into the outputs it gave when captured, in place (the same work on the same memory, as
    a CUDA graph's replay: it reads its static input and the model's weights as they are
    then)."""

    graphs = []
    fail = False

    @staticmethod
    def supports(device):
        return True

    def __init__(self, device):
        pass

    def warm(self, fn):
        fn()

    def graph(self, fn):
        if FakeCapture.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        graph = FakeGraph(fn)
        FakeCapture.graphs.append(graph)
        return graph, graph.out

    def abandon(self):
        pass


class FakeGraph:
    def __init__(self, fn):
        self.fn, self.out, self.replays = fn, fn(), 0

    def replay(self):
        self.replays += 1
        for k, v in self.fn().items():
            if isinstance(v, torch.Tensor):
                self.out[k].copy_(v)


def test_the_graph_path_replays_a_graph_of_one_batch_per_batch(tmp_path, monkeypatch):
    """The GPU path on the CPU (the capture stood in by FakeCapture): one graph per batch
    shape (90 samples in batches of 32: 32, 32 and 26, so two per device), replayed once per
    batch of every checkpoint with the batch copied into its input; the run equals the
    eager one bit for bit on one and two devices, also with device summaries (where the
    labels copied in enter the outputs). A capture that fails falls back to eager, with a
    warning."""
    from forgetkit.exporters import _torch_replay as R

    _, files = train_and_save(tmp_path, epochs=(8, 9, 10, 11))
    arrays = data()
    common = dict(batch_size=32, dtype="float32")
    eager = replay(small_net(), files, arrays, tmp_path / "eager.npy", **common)
    eager_summary = replay(small_net(), files, arrays, tmp_path / "eager_s.npy", summary=True,
                           **common)
    monkeypatch.setattr(R, "CAPTURE", FakeCapture)
    for devices in (["cpu"], ["cpu", "cpu"]):
        FakeCapture.graphs = []
        run = replay(small_net(), files, arrays, tmp_path / f"g{len(devices)}.npy",
                     devices=devices, **common)
        assert_same_run(run, eager)
        assert len(FakeCapture.graphs) == 2 * len(devices)
        assert sorted(len(g.out["values"]) for g in FakeCapture.graphs) == \
            [26] * len(devices) + [32] * len(devices)
        per_kind = {32: 0, 26: 0}
        for g in FakeCapture.graphs:
            per_kind[len(g.out["values"])] += g.replays
        assert per_kind == {32: 2 * len(files), 26: len(files)}
    summary = replay(small_net(), files, arrays, tmp_path / "g_s.npy", summary=True, **common)
    assert summary.kind == eager_summary.kind == "summary"
    assert np.load(tmp_path / "g_s.npy").tobytes() == np.load(tmp_path / "eager_s.npy").tobytes()
    FakeCapture.fail = True
    try:
        with pytest.warns(UserWarning, match="could not be captured as a CUDA graph"):
            run = replay(small_net(), files, arrays, tmp_path / "f.npy", **common)
    finally:
        FakeCapture.fail = False
    assert_same_run(run, eager)


def test_a_graph_input_has_the_layout_and_alignment_of_its_batch():
    from forgetkit.exporters._torch_replay import ALIGN, static_like

    base = torch.randn(64, 40)
    for t in (base[3:9], base[:, 5:11], base.t(), torch.zeros(5, dtype=torch.bool)[1:],
              torch.zeros((0, 3)), base.double()[1:, :3]):
        s = static_like(t)
        assert (s.shape, s.stride(), s.dtype, s.device) == \
            (t.shape, t.stride(), t.dtype, t.device)
        assert s.data_ptr() % ALIGN == t.data_ptr() % ALIGN or t.numel() == 0
        s.copy_(t)
        assert torch.equal(s, t)


def test_checkpoint_containers_prefixes_and_safetensors(tmp_path):
    test, files = train_and_save(tmp_path, epochs=(0, 1))
    states = [torch.load(f, weights_only=True) for f in files]
    # a training script's dict (with its own epoch), DDP's "module." prefix, safetensors
    torch.save({"model_state_dict": states[0], "epoch": 0, "optimizer": {}},
               tmp_path / "a.pth")
    torch.save({"state_dict": {f"module.{k}": v for k, v in states[1].items()}, "epoch": 1},
               tmp_path / "b.pth")
    run = replay(small_net(), [tmp_path / "b.pth", tmp_path / "a.pth"], test,
                 tmp_path / "dicts.npy", dtype="float32")
    assert_same_run(run, fk.load(tmp_path / "recorded.npy"))
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save_file(states[1], str(tmp_path / "w_1.safetensors"))
    one = replay(small_net(), str(tmp_path / "w_1.safetensors"), test, tmp_path / "st.npy",
                 dtype="float32")
    assert np.array_equal(np.asarray(one.outputs[0]), np.asarray(run.outputs[1]))
    # the same weights in another container have the same content hash
    assert one.meta["replay"]["checkpoints"][0]["sha256"] == \
        run.meta["replay"]["checkpoints"][1]["sha256"]


def test_a_replay_resumes_after_the_checkpoints_it_holds(tmp_path):
    test, files = train_and_save(tmp_path)
    out = tmp_path / "run.npy"
    replay(small_net(), files[:2], test, out, dtype="float32")
    net = small_net()
    calls = []
    net.register_forward_hook(lambda *a: calls.append(1))
    run = replay(net, files, test, out, dtype="float32")
    assert len(calls) == len(test)  # one checkpoint evaluated: the third
    assert_same_run(run, fk.load(tmp_path / "recorded.npy"))
    # a run of other checkpoints is refused; mode="w" replaces it
    with pytest.raises(fk.ForgetkitError, match="other checkpoints.*mode='w'"):
        replay(small_net(), files[1:], test, out, dtype="float32")
    assert fk.load(out).n_epochs == 3
    assert replay(small_net(), files[1:], test, out, dtype="float32", mode="w").n_epochs == 2
    # a run the recorder wrote (no checkpoints) is not appended to
    with pytest.raises(fk.ForgetkitError, match="not replayed from checkpoints"):
        replay(small_net(), files, test, tmp_path / "recorded.npy", dtype="float32")


@pytest.mark.parametrize("entry, message", [
    ("not a dict", "is a str, not a checkpoint's entry"),
    ({"epoch": 8, "file": "a.pt", "step": None}, "no sha256 content hash"),
    ({"epoch": 8, "file": 5, "step": None, "sha256": "0" * 64}, "names no checkpoint file"),
    ({"epoch": 7, "file": "a.pt", "step": None, "sha256": "0" * 64}, "epoch 7, not the run's"),
])
def test_a_malformed_replay_record_is_one_line_and_keeps_the_run(tmp_path, entry, message,
                                                                  capsys, monkeypatch):
    test, files = train_and_save(tmp_path)
    replay(small_net(), files[:2], test, tmp_path / "run.npy", dtype="float32")
    run = fk.load(tmp_path / "run.npy")
    record = run.meta["replay"]
    bad = run.replace(meta={**run.meta, "replay": {"checkpoints": [entry,
                                                                   *record["checkpoints"][1:]]}})
    out = tmp_path / "bad.npy"
    fk.save(bad, out)
    before = out.read_bytes()
    with pytest.raises(fk.ForgetkitError, match=message):
        replay(small_net(), files, test, out, dtype="float32")
    # the command line: one line, exit 1, the run untouched
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "netmod.py").write_text(
        "from tests.test_replay import small_net\n\ndef make():\n    return small_net()\n",
        encoding="utf-8")
    x, y = data()
    np.savez(tmp_path / "test.npz", x=x.numpy(), labels=y.numpy())
    code = cli_main(["replay", *map(str, files), "--model", "netmod:make", "--data",
                     "test.npz", "--out", "bad.npy", "--dtype", "float32"])
    err = capsys.readouterr().err
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    assert out.read_bytes() == before


KILLED_REPLAY = """
import sys, time
from pathlib import Path
import torch
from torch import nn
import forgetkit.exporters._torch_replay as R
from forgetkit.exporters.torch import replay

g = torch.Generator().manual_seed(1)
x, y = torch.randn(90, 6, generator=g), torch.randint(0, 3, (90,), generator=g)
load, loads = R.Device.load, []

def slow(self, item):  # a replay that is still running when killed
    loads.append(1)
    if len(loads) == 3:
        print("ready", flush=True)
    time.sleep(0.3)
    return load(self, item)

R.Device.load = slow
net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
replay(net, str(Path(sys.argv[1]).parent / "model_*.pt"), (x, y), sys.argv[1],
       batch_size=32, dtype="float32", progress=False)
"""


def test_a_killed_replay_keeps_its_epochs_and_resumes(tmp_path):
    """A replay killed (SIGKILL) while it runs leaves a run of the epochs it stored, each
    with its checkpoint's record; replaying again continues after them, to the run an
    uninterrupted replay writes."""
    _, files = train_and_save(tmp_path, epochs=tuple(range(6)))
    arrays = data()
    common = dict(batch_size=32, dtype="float32", progress=False)
    full = replay(small_net(), files, arrays, tmp_path / "full.npy", **common)
    out = tmp_path / "run.npy"
    kill_when_ready(KILLED_REPLAY, out)
    kept = fk.load(out)
    assert 1 <= kept.n_epochs < 6
    k = kept.n_epochs
    assert kept.meta["replay"]["checkpoints"] == full.meta["replay"]["checkpoints"][:k]
    assert np.array_equal(np.asarray(kept.outputs), np.asarray(full.outputs)[:k])
    net, calls = small_net(), []
    net.register_forward_hook(lambda *a: calls.append(1))
    run = replay(net, files, arrays, out, **common)
    assert len(calls) == 3 * (6 - k)  # the checkpoints after the stored ones, 3 batches each
    assert_same_run(run, full)
    assert run.meta == full.meta


def test_duplicate_weights_warn_skip_or_error(tmp_path):
    test, files = train_and_save(tmp_path, epochs=(1, 2))
    copy = tmp_path / "model_3.pt"
    copy.write_bytes(files[1].read_bytes())
    with pytest.warns(UserWarning, match="model_3.pt.*same weights as.*model_2.pt"):
        run = replay(small_net(), files + [copy], test, tmp_path / "warn.npy")
    assert run.epochs.tolist() == [1, 2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = replay(small_net(), files + [copy], test, tmp_path / "skip.npy",
                     on_duplicate="skip")
    assert run.epochs.tolist() == [1, 2]
    # resuming a run with a duplicate left out between its checkpoints reads past it
    later = tmp_path / "model_4.pt"
    torch.save({k: v + 1 if v.is_floating_point() else v
                for k, v in torch.load(files[1], weights_only=True).items()}, later)
    run = replay(small_net(), files + [copy, later], test, tmp_path / "skip.npy",
                 on_duplicate="skip")
    assert run.epochs.tolist() == [1, 2, 4]
    net = small_net()
    net.register_forward_hook(lambda *a: pytest.fail("a stored checkpoint was evaluated"))
    assert replay(net, files + [copy, later], test, tmp_path / "skip.npy",
                  on_duplicate="skip").epochs.tolist() == [1, 2, 4]
    with pytest.raises(fk.ForgetkitError, match="model_3.pt.*same weights.*model_2.pt"):
        replay(small_net(), files + [copy], test, tmp_path / "err.npy", on_duplicate="error")
    assert fk.load(tmp_path / "err.npy").epochs.tolist() == [1, 2]  # written before it
    with pytest.raises(ValueError, match="on_duplicate must be one of"):
        replay(small_net(), files, test, tmp_path / "x.npy", on_duplicate="keep")


class WritesAFile:
    """A pickle that would create ``path`` when loaded."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_empty_data_and_data_that_does_not_fit_the_model(tmp_path, capsys, monkeypatch):
    _, files = train_and_save(tmp_path)
    with pytest.raises(fk.ForgetkitError, match="data holds no sample"):
        replay(small_net(), files, (torch.zeros(0, 6), torch.zeros(0)), tmp_path / "e.npy",
               progress=False)
    with pytest.raises(fk.ForgetkitError, match="batch_size must be a positive integer"):
        replay(small_net(), files, data(), tmp_path / "e.npy", batch_size=0, progress=False)
    # the command line: the model's own error on data of another shape is one line, exit 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "netmod.py").write_text(
        "from tests.test_replay import small_net\n\ndef make():\n    return small_net()\n",
        encoding="utf-8")
    np.savez(tmp_path / "wide.npz", x=np.zeros((20, 5), np.float32), labels=np.zeros(20, int))
    assert cli_main(["replay", *map(str, files), "--model", "netmod:make", "--data",
                     "wide.npz", "--out", "bad.npy"]) == 1
    err = capsys.readouterr().err
    assert "the model failed on --data: RuntimeError" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad.npy").exists()


def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path):
    test, files = train_and_save(tmp_path, epochs=(0,))
    marker = tmp_path / "pwned"
    state = torch.load(files[0], weights_only=True)
    torch.save({"state_dict": state, "payload": WritesAFile(marker)}, tmp_path / "evil_0.pt")
    with pytest.raises(fk.ForgetkitError, match="evil_0.pt.*arbitrary code.*trust_pickle"):
        replay(small_net(), str(tmp_path / "evil_*.pt"), test, tmp_path / "run.npy")
    assert not marker.exists()
    # trusted: loaded with weights_only=False (the payload runs: that is what it refused)
    run = replay(small_net(), str(tmp_path / "evil_*.pt"), test, tmp_path / "run.npy",
                 trust_pickle=True)
    assert marker.exists() and run.n_epochs == 1


def test_a_truncated_checkpoint_names_the_file_and_keeps_earlier_epochs(tmp_path):
    test, files = train_and_save(tmp_path)
    data_ = files[1].read_bytes()
    files[1].write_bytes(data_[: len(data_) // 2])
    with pytest.raises(fk.ForgetkitError, match="model_9.pt"):
        replay(small_net(), files, test, tmp_path / "run.npy", dtype="float32")
    kept = fk.load(tmp_path / "run.npy")
    assert kept.epochs.tolist() == [8]
    assert np.array_equal(np.asarray(kept.outputs[0]),
                          np.asarray(fk.load(tmp_path / "recorded.npy").outputs[0]))


def test_nan_weights_are_refused_with_their_epoch_and_earlier_epochs_kept(tmp_path):
    test, files = train_and_save(tmp_path, epochs=(1, 2, 3))
    state = torch.load(files[1], weights_only=True)
    state["3.bias"][:] = float("nan")
    torch.save(state, files[1])
    with pytest.raises(fk.ForgetkitError, match="epoch 2 contain NaN or inf"):
        replay(small_net(), files, test, tmp_path / "run.npy", dtype="float32")
    assert fk.load(tmp_path / "run.npy").epochs.tolist() == [1]


def test_checkpoints_that_do_not_fit_the_model(tmp_path):
    test, files = train_and_save(tmp_path, epochs=(0,))
    other_names = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    with pytest.raises(fk.ForgetkitError,
                       match=r"does not fit the model: .*missing keys \(first '2.weight'\).*"
                             r"unexpected keys \(first '1.weight'\)"):
        replay(other_names, files, test, tmp_path / "a.npy")
    wider = nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
    with pytest.raises(fk.ForgetkitError, match=r"'0.weight' has shape \(16, 6\) there and "
                                                r"\(32, 6\) in the model"):
        replay(wider, files, test, tmp_path / "b.npy")
    with pytest.raises(fk.ForgetkitError, match="no checkpoint matches"):
        replay(small_net(), str(tmp_path / "nothing_*.pt"), test, tmp_path / "c.npy")
    with pytest.raises(fk.ForgetkitError, match="cannot tell the epoch"):
        replay(small_net(), [_renamed(files[0], tmp_path / "final.pt")], test,
               tmp_path / "d.npy")
    with pytest.raises(fk.ForgetkitError, match="shuffle"):
        loader = torch.utils.data.DataLoader(test.dataset, batch_size=32, shuffle=True)
        replay(small_net(), files, loader, tmp_path / "e.npy")
    assert not any((tmp_path / f"{c}.npy").exists() for c in "abcde")


def _renamed(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


def test_checkpoint_tensors_packed_into_one_buffer_come_back_as_views():
    from forgetkit.exporters._torch_replay import pack, unpack

    tensors = [torch.arange(5, dtype=torch.float32), torch.tensor(7),  # 0-d int64
               torch.zeros((0, 3)), torch.tensor([True, False]),
               torch.randn(3, 2, dtype=torch.float64), torch.ones(3, dtype=torch.float16)]
    buffer, layout = pack(tensors)
    assert buffer.dtype == torch.uint8 and buffer.numel() == sum(
        t.numel() * t.element_size() for t in tensors)
    back = unpack(buffer.clone(), layout)
    for t, b in zip(tensors, back, strict=True):
        assert b.dtype == t.dtype and b.shape == t.shape and torch.equal(b, t)
    assert pack([])[0].numel() == 0 and unpack(*pack([])) == []


def test_staged_checkpoints_load_as_bytes_or_converted(tmp_path, monkeypatch):
    """The GPU's staging on the CPU (`STAGE_ALWAYS`): each checkpoint packed into one buffer
    is copied into the model byte for byte from that buffer when its dtypes are the model's
    and the model's tensors are contiguous; else (a float64 checkpoint for a float32 model,
    a model with a transposed weight) tensor by tensor, converted. The run equals the
    unstaged replay bit for bit every time, on one and two devices."""
    from forgetkit.exporters import _torch_replay as R

    test, files = train_and_save(tmp_path)
    doubles = []
    for f in files:
        doubles.append(tmp_path / f"double_{f.name}")
        torch.save({k: v.double() if v.is_floating_point() else v
                    for k, v in torch.load(f, weights_only=True).items()}, doubles[-1])

    def transposed():
        net = small_net()
        net[0].weight = nn.Parameter(torch.randn(6, 16).t())  # (16, 6), not contiguous
        return net

    cases = [(small_net, files, True), (small_net, doubles, False), (transposed, files, False)]
    plain = [replay(make(), ckpts, test, tmp_path / f"plain{i}.npy", dtype="float32")
             for i, (make, ckpts, _) in enumerate(cases)]
    assert_same_run(plain[0], fk.load(tmp_path / "recorded.npy"))
    load, bytewise = R.Device.load, []

    def watched(self, item):
        bytewise.append(item.tensors is None)
        return load(self, item)

    monkeypatch.setattr(R.Device, "load", watched)
    monkeypatch.setattr(R, "STAGE_ALWAYS", True)
    for i, (make, ckpts, as_bytes) in enumerate(cases):
        for devices in (["cpu"], ["cpu", "cpu"]):
            bytewise.clear()
            run = replay(make(), ckpts, test, tmp_path / f"s{i}{len(devices)}.npy",
                         dtype="float32", devices=devices)
            assert_same_run(run, plain[i])
            assert bytewise == [as_bytes] * len(files)


def test_content_hashes_in_groups_and_pending_are_the_same(monkeypatch):
    """Buffers hashed in groups on a pool, or handed back pending (`wait=False`), give the
    digest of one hash after another."""
    from forgetkit.exporters import _checkpoints as C

    rng = np.random.default_rng(0)
    items = [(f"t{i}", "float32", (n,), rng.random(n).astype(np.float32))
             for i, n in enumerate([0, 3, 5000, 1, 70000, 2, 2, 90000])]
    serial = C.content_hash(items)
    monkeypatch.setattr(C, "HASH_GROUP", 10000)  # several groups of consecutive buffers
    assert len(C._groups([it[3] for it in items])) == 3
    with C.hash_pool() as pool:
        assert C.content_hash(items, pool=pool) == serial
        pending = C.content_hash(items, pool=pool, wait=False)
        assert isinstance(pending, C.PendingHash)
        assert C.resolved(pending) == serial == C.resolved(serial)
    items[2][3][7] += 1
    assert C.content_hash(items) != serial


def test_own_epoch_reads_the_pickle_only_where_it_may_say(tmp_path, monkeypatch):
    """A checkpoint's own epoch: a pickle without the letters of ``epoch`` or ``step`` (and
    no escape) is not unpickled; one holding them, or an escaped key, is."""
    import zipfile

    from forgetkit.exporters import _torch_replay as R

    state = small_net().state_dict()
    torch.save(state, tmp_path / "bare.pt")
    torch.save({"state_dict": state, "epoch": 4, "global_step": 40}, tmp_path / "pl.ckpt")
    with zipfile.ZipFile(tmp_path / "escaped.pt", "w") as z:  # protocol 0: {"epoch": 7}
        z.writestr("archive/data.pkl", b"(dp0\nVep\\u006fch\np1\nI7\ns.")
    peeked = []

    class Peek(R._Peek):
        def load(self):
            peeked.append(1)
            return super().load()

    monkeypatch.setattr(R, "_Peek", Peek)
    assert R.own_epoch(tmp_path / "bare.pt") == (None, None) and not peeked
    assert R.own_epoch(tmp_path / "pl.ckpt") == (4, 40) and len(peeked) == 1
    assert R.own_epoch(tmp_path / "escaped.pt") == (7, None) and len(peeked) == 2


def test_a_checkpoint_torch_cannot_map_is_read(tmp_path):
    """The reader maps each file into memory; a legacy (not zip) checkpoint, which torch
    cannot map, is read instead, with the same result."""
    from forgetkit.exporters._torch_replay import read_checkpoint

    test, files = train_and_save(tmp_path, epochs=(0, 1))
    legacy = tmp_path / "legacy_1.pt"
    torch.save(torch.load(files[1], weights_only=True), legacy,
               _use_new_zipfile_serialization=False)
    mapped, _, _ = read_checkpoint(legacy, mmap=True)
    for k, v in torch.load(files[1], weights_only=True).items():
        assert torch.equal(mapped[k], v)
    run = replay(small_net(), [files[0], legacy], test, tmp_path / "run.npy", dtype="float32")
    assert_same_run(run, fk.load(tmp_path / "recorded.npy"))


def test_recorder_options_are_one_keyword_set(tmp_path):
    from forgetkit.exporters._common import RecorderOptions

    with pytest.raises(TypeError, match="unknown recorder option 'dtyp'"):
        LogitRecorder(tmp_path / "r.npy", data(), dtyp="float32")
    rec = LogitRecorder(tmp_path / "r.npy", data(), dtype="float32", durable=False)
    assert rec.options == RecorderOptions(dtype="float32", durable=False)


# ------------------------------------------------------------------------- CLI
MODEL_MODULE = textwrap.dedent("""
    import torch
    from torch import nn

    def make_model():
        return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def make_data():
        g = torch.Generator().manual_seed(1)
        return torch.randn(90, 6, generator=g), torch.randint(0, 3, (90,), generator=g)

    def broken_data():
        raise RuntimeError("no such dataset")
""")


def test_cli_replay(tmp_path, capsys, monkeypatch):
    test, files = train_and_save(tmp_path)
    (tmp_path / "mymodels.py").write_text(MODEL_MODULE)
    monkeypatch.chdir(tmp_path)
    x, y = data()
    np.savez(tmp_path / "test.npz", inputs=x.numpy(), labels=y.numpy())
    args = ["replay", "model_*.pt", "--model", "mymodels:make_model", "--dtype", "float32",
            "--batch-size", "32"]
    assert cli_main(args + ["--data", "test.npz", "--out", "a.npy"]) == 0
    assert "wrote a.npy: 3 epochs from 3 checkpoints" in capsys.readouterr().out
    recorded = fk.load(tmp_path / "recorded.npy")
    assert_same_run(fk.load(tmp_path / "a.npy"), recorded)
    assert cli_main(args + ["--data", "mymodels.py:make_data", "--out", "b.npy",
                            "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert_same_run(fk.load(tmp_path / "b.npy"), recorded)
    # bad input: one line each, exit 1
    for extra, message in (
            (["--data", "mymodels:broken_data", "--out", "c.npy"],
             "--data 'mymodels:broken_data' raised RuntimeError: no such dataset"),
            (["--data", "nomodule:f", "--out", "c.npy"], "cannot import 'nomodule'"),
            (["--data", "test.npz", "--out", "c.npy", "--devices", "x"], "--devices"),
            (["--data", "test.npz", "--out", "c.npy", "--batch-size", "0"],
             "batch_size must be a positive integer; got 0"),
            (["--data", "test.npz", "--out", "c.npy", "--batch-size", "-5"],
             "batch_size must be a positive integer; got -5")):
        assert cli_main(args + extra) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    files[2].write_bytes(files[2].read_bytes()[:100])
    assert cli_main(args + ["--data", "test.npz", "--out", "d.npy"]) == 1
    err = capsys.readouterr().err
    assert "model_10.pt" in err and len(err.strip().splitlines()) == 1
    assert fk.load(tmp_path / "d.npy").epochs.tolist() == [8, 9]
    assert cli_main(["replay", "none_*.pt", "--model", "mymodels:make_model",
                     "--data", "test.npz", "--out", "e.npy"]) == 1
    assert "no checkpoint matches 'none_*.pt'" in capsys.readouterr().err


LM_MODULE = """
from tests.test_tokens_record import TinyLM

def make_model():
    return TinyLM(9)
"""


def test_cli_replay_top_k_writes_a_token_run(tmp_path, capsys, monkeypatch):
    from .test_tokens_record import TinyLM, token_data

    for e in (0, 1):
        torch.save(TinyLM(e).state_dict(), tmp_path / f"lm-{e}.pt")
    (tmp_path / "lms.py").write_text(LM_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    data = token_data()
    np.savez(tmp_path / "tokens.npz", **{k: v.numpy() for k, v in data.items()})
    args = ["replay", "lm-*.pt", "--model", "lms:make_model", "--data", "tokens.npz",
            "--batch-size", "4", "--quiet"]
    assert cli_main(args + ["--top-k", "5", "--out", "k5.npy"]) == 0
    expected = replay(TinyLM(9), str(tmp_path / "lm-*.pt"), data, tmp_path / "py.npy",
                      top_k=5, batch_size=4, progress=False)
    assert expected.kind == "topk" and expected.top_k == 5
    assert np.load(tmp_path / "k5.npy").tobytes() == np.load(tmp_path / "py.npy").tobytes()
    assert cli_main(args + ["--tokens", "--out", "k8.npy"]) == 0
    assert fk.load(tmp_path / "k8.npy").top_k == 8
    assert cli_main(args + ["--tokens", "--dtype", "float16", "--out", "x.npy"]) == 1
    assert "--dtype does not apply to a token run" in capsys.readouterr().err
    np.savez(tmp_path / "bad.npz", ids=data["input_ids"].numpy())
    bad = [a if a != "tokens.npz" else "bad.npz" for a in args]
    assert cli_main(bad + ["--tokens", "--out", "y.npy"]) == 1
    assert "must hold the token ids as 'input_ids'" in capsys.readouterr().err


def test_token_replay_refuses_nan_and_settles_cut_ties_exactly(tmp_path):
    """A token replay refuses a checkpoint whose logits are not finite (earlier epochs
    kept); the top-k that a GPU evaluation computes without waiting says when a batch cut a
    tie (then the exact, sorting path is taken) and otherwise equals it."""
    from forgetkit.exporters._torch_tokens import topk_candidates, topk_rows
    from forgetkit.exporters.torch import TokenRecorder

    from .test_tokens_record import TinyLM, token_data

    for e in (0, 1):
        torch.save(TinyLM(e).state_dict(), tmp_path / f"lm-{e}.pt")
    bad = TinyLM(2)
    with torch.no_grad():
        bad.out.bias[3] = float("nan")
    torch.save(bad.state_dict(), tmp_path / "lm-2.pt")
    with pytest.raises(fk.ForgetkitError, match="epoch 2 contain NaN or inf"):
        replay(TinyLM(9), str(tmp_path / "lm-*.pt"), token_data(), tmp_path / "run.npy",
               top_k=5, batch_size=4, progress=False)
    assert fk.load(tmp_path / "run.npy").epochs.tolist() == [0, 1]
    minus = TinyLM(3)
    with torch.no_grad():
        minus.out.bias[4] = -float("inf")  # -inf is refused too (not only NaN and +inf)
    with pytest.raises(fk.ForgetkitError, match="NaN or inf"):
        TokenRecorder(tmp_path / "minus.npy", token_data(), top_k=5).record(minus, 0)
    g = torch.Generator().manual_seed(3)
    z = torch.randn(50, 40, generator=g)
    t = torch.randint(0, 40, (50,), generator=g)
    rows, settled = topk_candidates(z, t, 5)
    assert bool(settled) and torch.equal(rows, topk_rows(z, t, 5))
    z[7, :] = 0.0  # every logit equal: torch.topk takes 5 of 40 ties
    assert not bool(topk_candidates(z, t, 5)[1])


# ------------------------------------------------------------ torch.distributed
DISTRIBUTED_REPLAY = """
import json, os, sys
import numpy as np, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from tests.test_replay import data, small_net
from tests.test_tokens_record import TinyLM, token_data
from forgetkit.exporters.torch import replay

tmp = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
x, y = data()
files = [f"{tmp}/model_{e}.pt" for e in range(7)]
out = {}

def attempt(name, fn):
    try:
        out[name] = fn()
    except Exception as err:
        out[name] = f"{type(err).__name__}: {err}"

def logits(path, checkpoints, **options):
    run = replay(small_net(), checkpoints, (x, y), f"{tmp}/{path}", batch_size=32,
                 dtype="float32", progress=False, **options)
    return None if run is None else run.epochs.tolist()

attempt("logits", lambda: logits("logits.npy", files))
attempt("summary", lambda: logits("summary.npy", files, summary=True))
attempt("resumed", lambda: logits("resumed.npy", files))  # holds epochs 0 and 1 already
attempt("tokens", lambda: None if (run := replay(
    TinyLM(9), f"{tmp}/lm-*.pt", token_data(), f"{tmp}/tokens.npy", top_k=5, batch_size=4,
    progress=False)) is None else run.epochs.tolist())
from forgetkit.exporters.huggingface import replay as hf_replay
attempt("hf", lambda: None if (run := hf_replay(
    f"{tmp}/hf", token_data(), f"{tmp}/hf.npy", top_k=5, batch_size=4,
    progress=False)) is None else run.epochs.tolist())
attempt("other files", lambda: logits("other.npy", files[:6 + rank]))
attempt("corrupt", lambda: logits("corrupt.npy", files[:4] + [f"{tmp}/broken_4.pt"]))
attempt("duplicate", lambda: logits("dup.npy", files[:3] + [f"{tmp}/again_3.pt"],
                                    on_duplicate="error"))
with open(f"{tmp}/rank{rank}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def test_replay_under_torch_distributed_equals_one_process(tmp_path):
    """torchrun with 2 ranks (gloo): each rank evaluates every other checkpoint, rank 0
    writes the run equal bit for bit to a one-process replay (logits, summary, tokens,
    resumed); the other rank writes nothing and returns None; a failure on either rank is
    raised on both, the epochs before it kept."""
    from .test_tokens_record import TinyLM, token_data

    torch.manual_seed(0)
    x, y = data()
    files = []
    for e in range(7):
        net = small_net()
        with torch.no_grad():
            net[1].running_mean.normal_()
        files.append(tmp_path / f"model_{e}.pt")
        torch.save(net.state_dict(), files[-1])
        torch.save(TinyLM(e).state_dict(), tmp_path / f"lm-{e}.pt")
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from .test_tokens_record import tiny_gpt2

    for e in (1, 2, 3):
        tiny_gpt2(transformers, seed=e).save_pretrained(tmp_path / "hf" / f"checkpoint-{e}")
    (tmp_path / "broken_4.pt").write_bytes(files[4].read_bytes()[:200])
    (tmp_path / "again_3.pt").write_bytes(files[1].read_bytes())
    options = dict(batch_size=32, dtype="float32", progress=False)
    replay(small_net(), files[:2], (x, y), tmp_path / "resumed.npy", **options)
    script = tmp_path / "worker.py"
    script.write_text(DISTRIBUTED_REPLAY)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script), str(tmp_path), str(ROOT)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["logits"] == list(range(7)) and ranks[1]["logits"] is None
    # the command line under torchrun: it starts the process group itself
    (tmp_path / "nets.py").write_text("from tests.test_replay import small_net\n")
    np.savez(tmp_path / "test.npz", inputs=x.numpy(), labels=y.numpy())
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "forgetkit.cli", "replay",
                           "model_*.pt", "--model", "nets:small_net", "--data", "test.npz",
                           "--out", "cli.npy", "--dtype", "float32", "--batch-size", "32"],
                          env=dict(env, PYTHONPATH=os.pathsep.join(
                              [str(ROOT), env.get("PYTHONPATH", "")])),
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("wrote cli.npy: 7 epochs from 7 checkpoints") == 1
    assert np.load(tmp_path / "cli.npy").tobytes() == np.load(tmp_path / "logits.npy").tobytes()
    for name, extra in (("logits", {}), ("summary", {"summary": True})):
        one = tmp_path / f"one_{name}.npy"
        replay(small_net(), files, (x, y), one, **options, **extra)
        assert np.load(tmp_path / f"{name}.npy").tobytes() == np.load(one).tobytes()
        assert fk.load(tmp_path / f"{name}.npy").meta == fk.load(one).meta
    assert fk.load(tmp_path / "resumed.npy").meta == fk.load(tmp_path / "one_logits.npy").meta
    assert np.load(tmp_path / "resumed.npy").tobytes() == \
        np.load(tmp_path / "one_logits.npy").tobytes()
    one = replay(TinyLM(9), str(tmp_path / "lm-*.pt"), token_data(), tmp_path / "one_lm.npy",
                 top_k=5, batch_size=4, progress=False)
    assert ranks[0]["tokens"] == list(range(7)) and ranks[1]["tokens"] is None
    assert np.load(tmp_path / "tokens.npy").tobytes() == np.load(tmp_path / "one_lm.npy").tobytes()
    assert np.array_equal(fk.load(tmp_path / "tokens.npy").positions, one.positions)
    from forgetkit.exporters.huggingface import replay as hf_replay

    # on one torch thread, as each rank runs (OMP_NUM_THREADS=1): transformers' attention
    # sums in another order on more threads (5.24 on 2 cores: other bits for a few logits)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hf_replay(tmp_path / "hf", token_data(), tmp_path / "one_hf.npy", top_k=5,
                  batch_size=4, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert ranks[0]["hf"] == [1, 2, 3] and ranks[1]["hf"] is None
    assert np.load(tmp_path / "hf.npy").tobytes() == np.load(tmp_path / "one_hf.npy").tobytes()
    # failures: the same error on both ranks; the epochs before the failing one are written
    for r in ranks:
        assert r["other files"].startswith("ForgetkitError: the ranks replay different "
                                           "checkpoints"), r["other files"]
        assert r["corrupt"].startswith("CorruptFileError: cannot read checkpoint") and \
            "broken_4.pt" in r["corrupt"], r["corrupt"]
        assert "has the same weights as" in r["duplicate"] and \
            "on_duplicate='error'" in r["duplicate"], r["duplicate"]
    assert not (tmp_path / "other.npy").exists()
    assert fk.load(tmp_path / "corrupt.npy").epochs.tolist() == [0, 1, 2, 3]
    assert fk.load(tmp_path / "dup.npy").epochs.tolist() == [0, 1, 2]


# ------------------------------------------------------------- PyTorch Lightning
def test_lightning_model_checkpoints_replay_to_the_recorded_run(tmp_path):
    L = import_real_part("lightning", "PyTorch Lightning (pip install forgetkit[lightning])")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = small_net()

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, i):
            return nn.functional.cross_entropy(self.model(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data(128, seed=0)),
                                        batch_size=32)
    test = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=32)
    recorder = LogitRecorder(tmp_path / "recorded.npy", test, dtype="float32")
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    trainer = L.Trainer(max_epochs=3, callbacks=[recorder.lightning_callback(), checkpoints],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    trainer.fit(Module(), train)
    # the inner network (keys without Lightning's "model." prefix) or the module itself
    run = replay(small_net(), str(tmp_path / "ckpt" / "*.ckpt"), test, tmp_path / "inner.npy",
                 dtype="float32")
    recorded = fk.load(tmp_path / "recorded.npy")
    assert_same_run(run, recorded)  # epochs from the checkpoints: 0, 1, 2
    assert [e["step"] for e in run.meta["replay"]["checkpoints"]] == [4, 8, 12]
    whole = replay(Module(), str(tmp_path / "ckpt"), test, tmp_path / "module.npy",
                   dtype="float32")
    assert_same_run(whole, recorded)


# ---------------------------------------------------------- Hugging Face Trainer
def test_trainer_checkpoints_replay_to_the_recorded_run(tmp_path):
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from forgetkit.exporters.huggingface import replay as hf_replay

    _, test, _ = train_recording(transformers, tmp_path / "out", tmp_path / "recorded.npy",
                                 save_strategy="epoch")
    run = hf_replay(tmp_path / "out", test, tmp_path / "replayed.npy", batch_size=10,
                    dtype="float32")
    recorded = fk.load(tmp_path / "recorded.npy")
    assert np.array_equal(np.asarray(run.outputs), np.asarray(recorded.outputs))
    assert np.array_equal(run.labels, recorded.labels)
    assert run.epochs.tolist() == [4, 8]  # the Trainer's global steps
    assert [os.path.basename(e["file"]) for e in run.meta["replay"]["checkpoints"]] == \
        ["checkpoint-4", "checkpoint-8"]
    # on several devices (issue 36: models built in two threads at once failed)
    two = hf_replay(tmp_path / "out", test, tmp_path / "two.npy", batch_size=10,
                    dtype="float32", devices=["cpu", "cpu"])
    assert np.array_equal(np.asarray(two.outputs), np.asarray(recorded.outputs))
    # the CLI: a Trainer output directory and arrays
    np.savez(tmp_path / "test.npz", input_ids=test.ids.numpy(),
             attention_mask=test.mask.numpy(), labels=test.labels.numpy())
    assert cli_main(["replay", str(tmp_path / "out"), "--data", str(tmp_path / "test.npz"),
                     "--out", str(tmp_path / "cli.npy"), "--batch-size", "10",
                     "--dtype", "float32", "--quiet"]) == 0
    assert np.array_equal(np.asarray(fk.load(tmp_path / "cli.npy").outputs),
                          np.asarray(recorded.outputs))
    # ... and a folder saved by datasets' save_to_disk
    datasets = import_real_part("datasets", "datasets (pip install forgetkit[huggingface])")
    datasets.Dataset.from_dict({"input_ids": test.ids.numpy(), "labels": test.labels.numpy(),
                                "attention_mask": test.mask.numpy(),
                                "text": ["unused"] * len(test)}).save_to_disk(tmp_path / "ds")
    assert cli_main(["replay", str(tmp_path / "out"), "--data", str(tmp_path / "ds"),
                     "--out", str(tmp_path / "ds.npy"), "--batch-size", "10",
                     "--dtype", "float32", "--quiet"]) == 0
    assert np.array_equal(np.asarray(fk.load(tmp_path / "ds.npy").outputs),
                          np.asarray(recorded.outputs))


def test_trainer_folders_load_into_one_model_per_device(tmp_path, monkeypatch):
    """Checkpoint folders of one architecture: one model per device, built once, receives
    each folder's weights (a language model's tied output embedding included), on one or
    several devices, logits or tokens, with or without labels (then the next input ids are
    the targets); a folder of another config gets a model of its own."""
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from forgetkit.exporters import huggingface as H

    from .test_tokens_record import Sequences, expected_run, tiny_gpt2, token_data

    for e in (1, 2, 3):
        tiny_gpt2(transformers, seed=e).save_pretrained(tmp_path / "out" / f"checkpoint-{e}")
    data = token_data(7, seed=2)
    unlabelled = {k: v for k, v in data.items() if k != "labels"}
    built = []
    build = H.build
    monkeypatch.setattr(H, "build", lambda *a: built.append(a[1]) or build(*a))
    options = dict(top_k=5, batch_size=3, progress=False)
    run = H.replay(tmp_path / "out", data, tmp_path / "one.npy", **options)
    assert len(built) == 1 and run.epochs.tolist() == [1, 2, 3]
    reference = []  # from_pretrained per folder, as the Trainer's model
    for e in (1, 2, 3):
        model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out" /
                                                             f"checkpoint-{e}").eval()
        with torch.no_grad():
            reference.append(model(input_ids=data["input_ids"],
                                   attention_mask=data["attention_mask"]).logits)
    for e, logits in enumerate(reference):
        records, *_ = expected_run(lambda ids, z=logits: {"logits": z}, data, 5)
        stored = np.load(tmp_path / "one.npy")[e]
        assert np.array_equal(fk.kinds.topk.token_ids(stored),
                              fk.kinds.topk.token_ids(records))
        np.testing.assert_allclose(stored["logits"], records["logits"], rtol=1e-5, atol=1e-5)
    # the content hash is the one of the model from_pretrained builds: runs replayed before
    # resume
    from forgetkit.exporters._checkpoints import content_hash
    from forgetkit.exporters._torch_replay import flat_bytes

    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out" / "checkpoint-1")
    assert run.meta["replay"]["checkpoints"][0]["sha256"] == content_hash(
        [(k, str(t.dtype), tuple(t.shape), flat_bytes(t))
         for k, t in sorted(model.state_dict().items())])
    built.clear()
    two = H.replay(tmp_path / "out", Sequences(unlabelled), tmp_path / "two.npy",
                   devices=["cpu", "cpu"], **options)
    assert len(built) == 1  # copied to the second device
    labelled = dict(unlabelled, labels=torch.where(data["attention_mask"].bool(),
                                                   data["input_ids"], -100))
    full = H.replay(tmp_path / "out", labelled, tmp_path / "full.npy", **options)
    assert np.load(tmp_path / "two.npy").tobytes() == np.load(tmp_path / "full.npy").tobytes()
    assert np.array_equal(two.positions, full.positions)
    assert len(full.positions) > len(run.positions)  # no position labelled -100
    # the command line: a Trainer's folder and arrays, --top-k
    np.savez(tmp_path / "tokens.npz", **{k: v.numpy() for k, v in data.items()})
    assert cli_main(["replay", str(tmp_path / "out"), "--data", str(tmp_path / "tokens.npz"),
                     "--out", str(tmp_path / "cli.npy"), "--top-k", "5", "--batch-size", "3",
                     "--quiet"]) == 0
    assert np.load(tmp_path / "cli.npy").tobytes() == np.load(tmp_path / "one.npy").tobytes()
    # a folder of another configuration: from_pretrained, a model of its own
    tiny_gpt2(transformers, vocab=40).save_pretrained(tmp_path / "out" / "checkpoint-4")
    built.clear()
    with pytest.raises(fk.ForgetkitError, match="vocabulary of 40 tokens"):
        H.replay(tmp_path / "out", data, tmp_path / "mixed.npy", **options)
    assert [os.path.basename(str(f)) for f in built] == ["checkpoint-1", "checkpoint-4"]


def test_trainer_callback_takes_what_it_needs_from_its_arguments(tmp_path):
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from forgetkit.exporters.huggingface import LogitRecorderCallback

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[],
                                          use_cpu=True)
    model = tiny_bert(transformers)
    callback = LogitRecorderCallback(tmp_path / "run.npy")
    with pytest.raises(fk.ForgetkitError, match="needs dataset="):
        callback.on_train_begin(args, None, None, model=model, train_dataloader=None,
                                eval_dataloader=None)
    test = TokenDataset(12, seed=2)
    evaluation = torch.utils.data.DataLoader(test, batch_size=4)
    callback.on_train_begin(args, None, None, model=model, train_dataloader=None,
                            eval_dataloader=evaluation)
    assert callback.recorder.data.dataset is test


# ------------------------------------------------------------------------ Keras 3
def test_keras_model_checkpoints_replay_to_the_recorded_run(tmp_path):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = import_real_part("keras", "Keras 3 (pip install forgetkit[keras])")
    from forgetkit.exporters.keras import LogitRecorderCallback
    from forgetkit.exporters.keras import replay as keras_replay

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    y = rng.integers(0, 3, 120)

    def build():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    keras.utils.set_random_seed(0)
    model = build()
    recorder = LogitRecorderCallback(tmp_path / "recorded.npy", (x, y), dtype="float32")
    weights = keras.callbacks.ModelCheckpoint(str(tmp_path / "w_{epoch:02d}.weights.h5"),
                                              save_weights_only=True)
    whole = keras.callbacks.ModelCheckpoint(str(tmp_path / "m_{epoch:02d}.keras"))
    model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=[recorder, weights, whole])
    recorded = fk.load(tmp_path / "recorded.npy")
    for pattern in ("w_*.weights.h5", "m_*.keras"):
        run = keras_replay(build(), str(tmp_path / pattern), (x, y),
                           tmp_path / f"{pattern[0]}.npy", epochs=[0, 1, 2], dtype="float32")
        assert_same_run(run, recorded)
    # epochs from the file names (Keras counts them from 1)
    run = keras_replay(build(), str(tmp_path / "w_*.weights.h5"), (x, y), tmp_path / "n.npy")
    assert run.epochs.tolist() == [1, 2, 3]


def test_replay_needs_no_framework_at_import():
    code = ("import sys, forgetkit, forgetkit.cli; "
            "print(sorted(m for m in ('torch', 'keras', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert json.loads(out.stdout.replace("'", '"')) == []


KILLED_AT_RENAME = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
k, calls, real = int(sys.argv[2]), [0], os.replace


def replace(src, dst):  # SIGKILL at the k-th rename of the replay's writes
    calls[0] += 1
    if calls[0] - 1 == k:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)


os.replace = replace
from tests.test_replay import data, small_net
from forgetkit.exporters.torch import replay

replay(small_net(), sys.argv[4:], data(), sys.argv[3], dtype="float32", progress=False)
print(calls[0])
"""


def test_a_replay_killed_at_any_commit_step_resumes_to_the_full_run(tmp_path):
    """A SIGKILL at each rename of a replay's writes (the tensor, the sidecar, the
    metadata), then a replay into the same path: the run of every checkpoint, once."""
    _, files = train_and_save(tmp_path)
    files = [str(f) for f in files]
    reference = replay(small_net(), files, data(), tmp_path / "ref.npy", dtype="float32",
                       progress=False)

    def killed(path, k):
        return subprocess.run([sys.executable, "-c", KILLED_AT_RENAME, str(ROOT), str(k),
                               str(path), *files], capture_output=True, text=True)

    done = killed(tmp_path / "count.npy", -1)
    assert done.returncode == 0, done.stderr
    renames = int(done.stdout.strip().splitlines()[-1])
    assert renames >= len(files)  # every epoch commits by a rename at least
    for k in range(renames):
        path = tmp_path / f"killed_{k}.npy"
        assert killed(path, k).returncode == -9
        run = replay(small_net(), files, data(), path, dtype="float32", progress=False)
        assert_same_run(run, reference)
        stored = [c["sha256"] for c in run.meta["replay"]["checkpoints"]]
        assert stored == [c["sha256"] for c in reference.meta["replay"]["checkpoints"]]
