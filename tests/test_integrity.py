"""Integrity (issue 25): checksums of every stored epoch, a tensor and its sidecar changed
together, locks that follow no symbolic link, summaries' fields range-checked."""

import json
import os

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.io import pair
from forgetkit.io.pair import pending_path
from forgetkit.io.record import sidecar_path

from .crashes import Killed, kill_at_rename, saving_in_turn
from .test_fuzz import write_format

E, N, C = 3, 16, 4


def make_run(seed=0, n_epochs=E):
    rng = np.random.default_rng(seed)
    return fk.Run(rng.normal(size=(n_epochs, N, C)).astype(np.float32),
                  rng.integers(0, C, N), epochs=list(range(1, 2 * n_epochs, 2)))


RUN = make_run()


def write(folder, fmt, run=RUN):
    """``run`` written in format ``fmt`` into ``folder`` (as the fuzz suite writes it)."""
    return write_format(folder, fmt, run)


def values_of(run):
    if run.kind == "summary":
        return np.asarray(run.outputs.records).view(np.uint8)
    return np.asarray(run.outputs)


FORMATS = ["npy", "npz", "parquet-list", "parquet-binary", "summary", "summary-parquet"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_byte_anywhere_loads_the_same_data_or_is_refused(tmp_path, fmt):
    path = write(tmp_path, fmt)
    expected = values_of(fk.load(path))
    original = path.read_bytes()
    size = len(original)
    refused = 0
    for where in np.unique(np.linspace(0, size - 1, 97).astype(int)):
        data = bytearray(original)
        data[where] ^= 0x10
        path.write_bytes(bytes(data))
        try:
            run = fk.load(path)
            got = values_of(run)
            run.predictions() if run.kind != "summary" else run.correctness()
        except fk.ForgetkitError:
            refused += 1
            continue
        assert np.array_equal(got, expected), f"byte {where} of {size}: loaded other data"
        assert np.array_equal(run.labels, RUN.labels)
        assert np.array_equal(run.epochs, RUN.epochs)
    assert refused > 0


@pytest.mark.parametrize("fmt", ["npy", "parquet-list", "parquet-binary", "summary"])
def test_a_flipped_value_names_the_file_and_epoch_and_verify_false_skips(tmp_path, fmt):
    path = write(tmp_path, fmt)
    data = bytearray(path.read_bytes())
    # the last epoch's values sit near the end of an NPY file; Parquet: find them
    if fmt.startswith("parquet"):
        needle = np.ascontiguousarray(RUN.outputs[2]).tobytes()[:64]
        at = bytes(data).find(needle)
        assert at > 0
    else:
        at = len(data) - 4
    data[at + 3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(fk.errors.CorruptFileError, match=r"epoch 5\b.*\(index 2\).*(checksum|CRC)"):
        np.asarray(fk.load(path).outputs) if fmt.startswith("parquet") else fk.load(path)
    fk.load(path, verify=False)  # loads: the caller chose not to check
    result = fk.verify(path)
    assert result["verifiable"] and result["bad"] == [5]


def test_labels_and_epoch_numbers_are_checksummed(tmp_path):
    path = write(tmp_path, "npy")
    sidecar = sidecar_path(path)
    record = json.loads(sidecar.read_text())
    record["labels"][0] = (record["labels"][0] + 1) % C
    sidecar.write_text(json.dumps(record))
    with pytest.raises(fk.errors.CorruptFileError, match="labels do not match"):
        fk.load(path)
    record["labels"][0] = int(RUN.labels[0])
    record["epochs"] = [1, 2, 5]
    sidecar.write_text(json.dumps(record))
    with pytest.raises(fk.errors.CorruptFileError, match="epoch numbers"):
        fk.load(path)


def test_verify_command(tmp_path, capsys):
    good = write(tmp_path, "npy")
    old = tmp_path / "old.npy"  # written before checksums existed: version 1, none stored
    np.save(old, np.asarray(RUN.outputs))
    sidecar_path(old).write_text(json.dumps({"kind": "logits", "labels": RUN.labels.tolist(),
                                             "epochs": RUN.epochs.tolist()}))
    assert np.array_equal(np.asarray(fk.load(old).outputs), np.asarray(RUN.outputs))
    assert main(["verify", str(good), str(old)]) == 0
    out = capsys.readouterr().out
    assert "ok (3 epochs)" in out and "cannot be verified" in out
    bad = tmp_path / "bad.npy"
    fk.save(RUN, bad)
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0x40
    bad.write_bytes(bytes(data))
    assert main(["verify", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"{bad}: bad: epoch 5 does not match its checksum"


@pytest.mark.parametrize("fmt", ["npy", "parquet-list", "summary"])
def test_writers_store_checksums_that_verify(tmp_path, fmt):
    path = tmp_path / ("r.parquet" if fmt.startswith("parquet") else "r.npy")
    writer = fk.SummaryWriter(path, N, C, labels=RUN.labels) if fmt == "summary" \
        else fk.RunWriter(path, N, C, labels=RUN.labels, dtype="float32")
    with writer:
        for e in range(E):
            writer.append(e, RUN.outputs[e])
        writer.append(1, RUN.outputs[2], replace=True)
    assert fk.verify(path) == {"path": str(path), "verifiable": True, "metadata": True,
                               "epochs": 2, "bad": []}
    run = fk.load(path)
    assert run.epochs.tolist() == [0, 1]
    if fmt != "summary":
        assert np.array_equal(np.asarray(run.outputs[1]), RUN.outputs[2])
    converted = tmp_path / "c.parquet"
    if fmt != "summary":
        fk.convert(path, converted)
        assert fk.verify(converted)["bad"] == []


# ------------------------------------------------------------ pairs change together
def _state(path):
    run = fk.load(path)
    return values_of(run), run.labels, run.epochs


def _same(state, run):
    values, labels, epochs = state
    return (np.array_equal(values, values_of(run)) and np.array_equal(labels, run.labels)
            and np.array_equal(epochs, run.epochs))


@pytest.mark.parametrize("what", ["save", "summarize"])
def test_a_kill_at_any_rename_leaves_the_old_run_or_the_new(tmp_path, monkeypatch, what):
    old, new = make_run(1), make_run(2, n_epochs=2)  # the new one has fewer epochs
    seen = set()
    for k in range(4):
        path = tmp_path / f"k{k}.npy"
        if what == "save":
            fk.save(old, path)
        else:
            fk.summarize(old, path)
        expected_old, expected_new = fk.load(path), (fk.summarize(new) if what == "summarize"
                                                     else new)
        with monkeypatch.context() as m:
            calls = kill_at_rename(m, k)
            try:
                fk.save(new, path) if what == "save" else fk.summarize(new, path)
            except Killed:
                pass
        state = _state(path)
        is_old, is_new = _same(state, expected_old), _same(state, expected_new)
        assert is_old or is_new, f"kill at rename {k}: a mix"
        seen.add("old" if is_old else "new")
        if calls["n"] <= k:
            break
    assert seen == {"old", "new"}


def test_a_kill_between_the_tensor_and_the_sidecar_loads_the_new_run(tmp_path, monkeypatch):
    path = tmp_path / "r.npy"
    old, new = make_run(1), make_run(2, n_epochs=2)
    fk.save(old, path)
    real = os.replace

    def replace(src, dst):
        if str(dst) == str(sidecar_path(path)):
            raise Killed  # after the tensor was renamed into place
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Killed):
        fk.save(new, path)
    monkeypatch.undo()
    assert pending_path(path).exists()
    assert _same(_state(path), new)
    fk.save(old, path)  # the next write commits as usual
    assert not pending_path(path).exists() and _same(_state(path), old)


@pytest.mark.parametrize("writer_kind", ["run", "summary", "staged-parquet"])
def test_a_kill_inside_a_replacing_append_leaves_the_old_run_or_the_new(
        tmp_path, monkeypatch, writer_kind):
    suffix = ".parquet" if writer_kind == "staged-parquet" else ".npy"

    def make(path):
        if writer_kind == "summary":
            return fk.SummaryWriter(path, N, C, labels=RUN.labels)
        return fk.RunWriter(path, N, C, labels=RUN.labels, dtype="float32")

    outcomes = set()
    for k in range(4):
        path = tmp_path / f"w{k}{suffix}"
        w = make(path)
        for e in range(E):
            w.append(e, RUN.outputs[e])
        # a staged Parquet run is a training under way: abort keeps its staged epochs
        w.abort() if writer_kind == "staged-parquet" else w.close()
        before = _state(path)
        w = make(path)
        with monkeypatch.context() as m:
            calls = kill_at_rename(m, k)
            try:
                w.append(1, RUN.outputs[0], replace=True)
            except Killed:
                pass
        w._lock.release()  # the process "died": its lock goes with it
        state = _state(path)
        if all(np.array_equal(a, b) for a, b in zip(state, before, strict=True)):
            outcomes.add("old")
        else:
            assert state[2].tolist() == [0, 1]
            if writer_kind != "summary":
                assert np.array_equal(state[0][1], RUN.outputs[0])
            outcomes.add("new")
        assert fk.verify(path)["bad"] == []
        if calls["n"] <= k:
            break
    assert outcomes == {"old", "new"}
    if writer_kind == "staged-parquet":
        with make(path) as w:  # resumes the staged epochs, merges them on close
            w.append(2, RUN.outputs[2])
        assert fk.load(path).epochs.tolist() == [0, 1, 2]
        assert not fk.io.staging_path(path).exists()


def test_a_reader_never_sees_one_runs_tensor_with_the_others_sidecar(tmp_path):
    path = tmp_path / "r.npy"
    runs = [make_run(1), make_run(2, n_epochs=2)]
    loads = 0
    with saving_in_turn(runs, path):
        for _ in range(150):
            state = _state(path)
            assert _same(state, runs[0]) or _same(state, runs[1])
            loads += 1
    assert loads == 150


def test_open_pair_gives_up_on_a_tensor_that_matches_no_sidecar(tmp_path, monkeypatch):
    path = write(tmp_path, "npy")
    pending_path(path).write_text(sidecar_path(path).read_text())
    data = bytearray(path.read_bytes())
    data[-2] ^= 1
    path.write_bytes(bytes(data))
    monkeypatch.setattr(pair, "READ_ATTEMPTS", 2)
    with pytest.raises(fk.errors.CorruptFileError, match="does not match its sidecar"):
        fk.load(path, verify=False)


# -------------------------------------------------------------------------- locks
@pytest.mark.parametrize("planted", ["symlink", "folder", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_and_untouched(tmp_path, planted):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = tmp_path / "r.npy"
    lock = tmp_path / "r.npy.lock"
    if planted == "symlink":
        lock.symlink_to(victim)
    elif planted == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    for attempt in (lambda: fk.save(RUN, path),
                    lambda: fk.RunWriter(path, N, C, labels=RUN.labels)):
        with pytest.raises(fk.ForgetkitError, match="lock file .* is (a symbolic link|not a "
                                                    "regular file): refused"):
            attempt()
    assert victim.read_text() == "keep me" and not path.exists()
    assert main(["convert", str(write(tmp_path, "npz")), str(path), "--quiet"]) == 1


# ---------------------------------------------------------------------- summaries
def test_a_summary_with_an_other_class_out_of_range_is_refused(tmp_path, capsys):
    path = write(tmp_path, "summary")
    records = np.load(path, mmap_mode="r+")
    records["other_class"][1, 3] = C + 5
    records.flush()
    del records
    with pytest.raises(fk.errors.CorruptFileError, match="other_class"):
        fk.load(path, verify=False)
    assert main(["analyze", str(path), "--quiet"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_wrong_argument_types_are_named():
    dm = fk.data_map(RUN)
    with pytest.raises(fk.errors.InputTypeError, match="frac must be a number; got str"):
        fk.select(dm, region="easy", frac="abc")
    with pytest.raises(fk.errors.InputTypeError, match="run must be a forgetkit.Run; got str "
                                                       "'x.npy' .*forgetkit.load"):
        fk.data_map("x.npy")
    for fn in (fk.forget_fraction, fk.learn_fraction, fk.sample_dynamics, fk.label_issues,
               fk.compare, fk.data_scores):
        with pytest.raises(fk.errors.InputTypeError, match="run must be a forgetkit.Run; got "
                                                           "str"):
            fn("x.npy")
    for fn in (fk.load, fk.verify):
        with pytest.raises(fk.errors.InputTypeError, match="path must be a path .*got int"):
            fn(123)
    with pytest.raises(fk.errors.InputTypeError, match="run must be a forgetkit.Run or the "
                                                       "path"):
        fk.summarize(123)
    with pytest.raises(fk.errors.InputTypeError, match="verify must be True or False"):
        fk.load("x.npy", verify="no")
    with pytest.raises(fk.errors.InputTypeError, match="val_frac must be a number; got str"):
        RUN.split("a")


def test_an_npz_that_expands_implausibly_is_refused_before_allocation(tmp_path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, logits=np.zeros((4, 1 << 20, 10), dtype=np.float16),
                        labels=np.zeros(1 << 20, dtype=np.int64))
    assert path.stat().st_size < 1 << 20
    with pytest.raises(fk.errors.CorruptFileError, match="would expand .*refused before"):
        fk.load(path)
    small = tmp_path / "zeros.npz"  # a small run of zeros still loads
    np.savez_compressed(small, logits=np.zeros((2, 50, 3), dtype=np.float32),
                        labels=np.zeros(50, dtype=np.int64))
    assert fk.load(small).shape == (2, 50, 3)


def test_datamap_checks_frac_before_any_work(tmp_path, capsys, monkeypatch):
    import forgetkit.cli as cli

    path = write(tmp_path, "npy")

    def no_work(*args, **kwargs):
        raise AssertionError("the data map was computed before --frac was checked")

    monkeypatch.setattr(cli, "data_map", no_work)
    for frac in ("1.5", "0", "-0.1", "0.01"):
        capsys.readouterr()
        assert main(["datamap", str(path), "--select", "ambiguous", "--frac", frac, "--out",
                     str(tmp_path / "ids.csv")]) == 1
        err = capsys.readouterr().err
        assert "--frac" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ids.csv").exists()


# ------------------------------------------------------------------------- shards
def _shards(tmp_path, fmt="npy", ids=((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))):
    paths = []
    for i, rows in enumerate((slice(0, 8), slice(8, 16))):
        part = RUN.isel(samples=np.arange(N)[rows]).replace(sample_ids=list(ids[i]))
        paths.append(tmp_path / f"shard-{i}.{fmt}")
        fk.save(part, paths[-1])
    return paths


@pytest.mark.parametrize("fmt", ["npy", "parquet"])
def test_shards_are_verified_on_the_workers_and_errors_name_the_shard(tmp_path, fmt):
    pytest.importorskip("dask")
    import dask

    paths = _shards(tmp_path, fmt)
    pattern = str(tmp_path / f"shard-*.{fmt}")
    with dask.config.set(scheduler="synchronous"):
        assert np.array_equal(np.asarray(fk.load(pattern).outputs), np.asarray(RUN.outputs))
        data = bytearray(paths[1].read_bytes())
        if fmt == "npy":
            data[-3] ^= 0x01
        else:
            needle = np.ascontiguousarray(RUN.outputs[2, 8:]).tobytes()[:32]
            data[bytes(data).find(needle) + 1] ^= 0x01
        paths[1].write_bytes(bytes(data))
        with pytest.raises(fk.ForgetkitError, match=r"shard-1.*(checksum|CRC)"):
            fk.load(pattern).predictions().compute()


def test_npy_shards_read_in_several_chunks_are_verified_from_their_parts(tmp_path):
    """A shard split into chunks (8 samples in 3 + 3 + 2) is verified from the CRC32C of each
    chunk, combined on a worker; a flipped byte in any chunk fails the pass, naming the
    shard; verify=False reads the same values without the check."""
    pytest.importorskip("dask")
    import dask

    paths = _shards(tmp_path, "npy")
    pattern = str(tmp_path / "shard-*.npy")
    original = paths[1].read_bytes()
    epoch_bytes = 8 * C * 4
    first = len(original) - E * epoch_bytes
    with dask.config.set(scheduler="threads"):
        run = fk.load(pattern, chunks=3)
        assert np.array_equal(np.asarray(run.outputs), np.asarray(RUN.outputs))
        assert np.array_equal(run.predictions().compute(), RUN.predictions())
        for where in (first + 2, first + epoch_bytes + 3 * C * 4 + 1, len(original) - 3):
            data = bytearray(original)  # in chunk 1, 2 and 3 of epochs 0, 1 and 2
            data[where] ^= 0x01
            paths[1].write_bytes(bytes(data))
            with pytest.raises(fk.ForgetkitError, match=r"shard-1.*epoch index \d does not "
                                                        r"match its checksum"):
                fk.load(pattern, chunks=3).predictions().compute()
            fk.load(pattern, chunks=3, verify=False).predictions().compute()


def test_shard_labels_nan_and_duplicate_ids_name_the_shard(tmp_path):
    pytest.importorskip("dask")
    import dask

    paths = _shards(tmp_path, ids=(range(8), range(7, 15)))
    with pytest.raises(fk.errors.CorruptFileError,
                       match=r"sample id 7 appears twice \(shards .*shard-0.npy.* and "
                             r".*shard-1.npy"):
        fk.load(str(tmp_path / "shard-*.npy"))
    paths = _shards(tmp_path)
    sidecar = sidecar_path(paths[1])
    record = json.loads(sidecar.read_text())
    good = record["labels"][0]
    record["labels"][0] = C + 3
    sidecar.write_text(json.dumps(record))
    with pytest.raises(fk.ForgetkitError, match=r"shard .*shard-1.npy.*labels"):
        fk.load(str(tmp_path / "shard-*.npy"))
    record["labels"][0] = good
    sidecar.write_text(json.dumps(record))
    values = np.asarray(RUN.outputs[:, 8:]).copy()
    values[1, 2, 0] = np.nan
    np.save(tmp_path / "nan.npy", values)
    sidecar_path(tmp_path / "nan.npy").write_text(json.dumps(
        {k: v for k, v in record.items() if k != "crc32c"} | {"version": 1}))
    with dask.config.set(scheduler="synchronous"), pytest.raises(
            fk.ForgetkitError, match=r"shard .*nan.npy.*NaN or inf at epoch index 1 "
                                     r"\(sample 2"):
        fk.load([str(paths[0]), str(tmp_path / "nan.npy")]).predictions().compute()


def test_duplicate_sample_ids_in_a_sidecar_are_refused(tmp_path):
    with pytest.raises(fk.ForgetkitError, match="sample id 's0' appears twice"):
        RUN.replace(sample_ids=[f"s{i % 15}" for i in range(N)])  # never written so
    path = write(tmp_path, "npy")
    sidecar = sidecar_path(path)
    record = json.loads(sidecar.read_text())  # as written before checksums: unverified
    record.pop("crc32c")
    sidecar.write_text(json.dumps(dict(record, version=1,
                                       sample_ids=[f"s{i % 15}" for i in range(N)])))
    with pytest.raises(fk.errors.CorruptFileError, match="sample id 's0' appears twice "
                                                         r"\(samples 0 and 15\)"):
        fk.load(path)


# ---------------------------------------------------------------------- recorders
def test_recorders_refuse_non_integer_labels_and_name_an_empty_loader(tmp_path):
    torch = pytest.importorskip("torch")
    from forgetkit.exporters.torch import LogitRecorder

    x = torch.randn(20, 5)
    model = torch.nn.Linear(5, 3)
    with pytest.raises(fk.ForgetkitError, match=r"epoch 0: labels must be integers .*2\.7"):
        LogitRecorder(tmp_path / "f.npy", (x, torch.full((20,), 2.7))).record(model, 0)
    assert not (tmp_path / "f.npy").exists()
    rec = LogitRecorder(tmp_path / "i.npy", (x, torch.full((20,), 2.0)))
    rec.record(model, 0)  # integral floats are labels, as fk.Run takes them
    rec.close()
    assert fk.load(tmp_path / "i.npy").labels.tolist() == [2] * 20
    empty = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:0], x[:0, 0]))
    with pytest.raises(fk.ForgetkitError, match="epoch 3: the evaluation data yielded no "
                                                "batch"):
        LogitRecorder(tmp_path / "e.npy", empty).record(model, 3)


def test_the_jax_recorder_names_an_empty_loader(tmp_path):
    pytest.importorskip("jax")
    from forgetkit.exporters.jax import LogitRecorder

    rec = LogitRecorder(tmp_path / "j.npy", [], lambda params, x: x @ params)
    with pytest.raises(fk.ForgetkitError, match="epoch 2: the data yielded no batch"):
        rec.record(np.ones((3, 3), np.float32), 2)


def test_summaries_in_parquet_equal_the_npy_summary(tmp_path):
    npy, parquet = write(tmp_path, "summary"), write(tmp_path, "summary-parquet")
    a, b = fk.load(npy), fk.load(parquet)
    assert b.kind == "summary" and b.shape == a.shape
    assert np.array_equal(np.asarray(a.outputs.records), np.asarray(b.outputs.records))
    assert np.array_equal(a.correctness(), b.correctness())
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.epochs, b.epochs)
    fk.save(a, tmp_path / "copy.parquet")  # a summary run saves as what it is
    assert fk.load(tmp_path / "copy.parquet").kind == "summary"
    assert fk.verify(parquet)["verifiable"]


def test_sweep_checks_its_options_before_starting_a_cluster(tmp_path, capsys, monkeypatch):
    pytest.importorskip("distributed")
    import distributed

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started before the options were checked")

    monkeypatch.setattr(distributed, "LocalCluster", no_cluster)
    path = write(tmp_path, "npy")
    for option in (["--val-frac", "5"], ["--window", "-1"], ["--seeds", "-2"]):
        capsys.readouterr()
        assert main(["sweep", str(path), "--out", str(tmp_path / "s.csv"), *option]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and option[0].strip("-").replace("-", "_")[:4] in err[0], err
    assert not (tmp_path / "s.csv").exists()


def test_soft_targets_change_together_and_are_checked(tmp_path, monkeypatch):
    """.npy soft targets and their sidecar are committed as one: a kill at any rename of a
    rewrite leaves the old targets or the new ones with their own ids; a flipped byte is
    refused."""
    val = make_run(3)
    kf = fk.KnowledgeFusion().fit(val)
    old = fk.Run(RUN.outputs, RUN.labels, epochs=RUN.epochs,
                 sample_ids=[f"a{i}" for i in range(N)])
    new = fk.Run(make_run(4).outputs[:, ::-1], RUN.labels[::-1].copy(), epochs=RUN.epochs,
                 sample_ids=[f"b{i}" for i in range(N)])
    expected = {name: (run.sample_ids.tolist(), run.labels.tolist(),
                       fk.soft_targets(kf, run).astype(np.float32))
                for name, run in (("old", old), ("new", new))}
    seen = set()
    for k in range(4):
        path = tmp_path / f"t{k}.npy"
        fk.write_soft_targets(path, kf, old)
        with monkeypatch.context() as m:
            calls = kill_at_rename(m, k)
            try:
                fk.write_soft_targets(path, kf, new)
            except Killed:
                pass
        ids, labels, targets = fk.read_soft_targets(path)
        got = [name for name, (i, y, t) in expected.items()
               if ids == i and labels.tolist() == y and np.array_equal(targets, t)]
        assert got, f"kill at rename {k}: a mix"
        seen.add(got[0])
        if calls["n"] <= k:
            break
    assert seen == {"old", "new"}
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(fk.errors.CorruptFileError, match="does not match the checksum"):
        fk.read_soft_targets(path)
    fk.write_soft_targets(tmp_path / "t.parquet", kf, old)
    ids, labels, targets = fk.read_soft_targets(tmp_path / "t.parquet")
    assert ids == expected["old"][0] and np.array_equal(targets, expected["old"][2])
