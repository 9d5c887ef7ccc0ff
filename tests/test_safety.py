"""Nothing a user does destroys a run, mixes two runs, or prints garbage (issue 13).

One test (or parametrised group) per failure found by trying forgetkit as a new user would,
with realistic mistakes and hostile files: outputs that overwrite inputs, untrusted plans,
two writers on one path, resource claims, tracebacks, inconsistent checks, leftovers and
durability, unclear messages.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forgetkit as fk
from forgetkit import errors
from forgetkit.cli import EXIT_BUG, main
from forgetkit.io import atomic
from forgetkit.io.lock import lock_path
from forgetkit.io.parquet import staging_path

from .conftest import import_real_part, kill_when_ready, make_run


def small_run(n_epochs=6, n_samples=60, n_classes=3, seed=0):
    return make_run(n_epochs=n_epochs, n_samples=n_samples, n_classes=n_classes, seed=seed)


def cli_error(capsys, argv, match):
    """Run the CLI in process: exit 1 and one stderr line matching ``match``."""
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert __import__("re").search(match, err[0]), err[0]
    return err[0]


@pytest.fixture()
def files(tmp_path):
    """A run (.npz and .npy with sidecar) and a Knowledge Fusion plan fitted on it."""
    run = small_run()
    fk.save(run, tmp_path / "run.npz")
    fk.save(run, tmp_path / "train.npy")
    fk.KnowledgeFusion().fit(run).to_json(tmp_path / "plan.json")
    return tmp_path


def snapshot(folder):
    """{name: bytes} of every file in ``folder``."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# ----------------------------------------------------- 1. outputs that are inputs
@pytest.mark.parametrize("argv", [
    ["report", "run.npz", "-o", "run.npz"],
    ["fuse", "run.npz", "--plan", "run.npz"],
    ["analyze", "run.npz", "--json", "run.npz"],
    ["compare", "run.npz", "--json", "run.npz"],
    ["distill", "plan.json", "train.npy", "--out", "train.npy"],
    ["apply", "plan.json", "train.npy", "--out", "train.npy"],
    ["convert", "train.npy", "./train.npy"],
    ["analyze", "train.npy", "--json", "train.forgetkit.json"],  # the input's sidecar
])
def test_commands_refuse_to_overwrite_their_inputs(files, capsys, monkeypatch, argv):
    monkeypatch.chdir(files)
    before = snapshot(files)
    cli_error(capsys, argv, "would overwrite .*the output must not be one of the inputs")
    assert snapshot(files) == before


def test_sidecar_of_the_output_may_not_be_an_input(files, capsys, monkeypatch):
    """--out x.npy also writes x.forgetkit.json: refused when that file is the plan."""
    monkeypatch.chdir(files)
    (files / "x.forgetkit.json").write_text((files / "plan.json").read_text())
    before = snapshot(files)
    cli_error(capsys, ["distill", "x.forgetkit.json", "run.npz", "--out", "x.npy"],
              r"--out 'x.npy' would overwrite the input 'x.forgetkit.json'")
    assert snapshot(files) == before


@pytest.mark.parametrize("link", ["symlink", "hardlink", "relative"])
def test_links_and_relative_paths_are_the_same_file(files, capsys, monkeypatch, link):
    monkeypatch.chdir(files)
    (files / "sub").mkdir()
    if link == "symlink":
        os.symlink(files / "run.npz", files / "alias.npz")
        out = "alias.npz"
    elif link == "hardlink":
        os.link(files / "run.npz", files / "alias.npz")
        out = "alias.npz"
    else:
        out = "sub/../run.npz"
    before = (files / "run.npz").read_bytes()
    cli_error(capsys, ["analyze", "run.npz", "--json", out], "would overwrite")
    cli_error(capsys, ["report", "run.npz", "-o", out], "would overwrite")
    assert (files / "run.npz").read_bytes() == before


def test_library_writers_refuse_the_file_a_run_came_from(files):
    run = fk.load(files / "train.npy")
    before = snapshot(files)
    with pytest.raises(errors.OverwriteError, match="would overwrite"):
        fk.save(run, files / "train.npy")
    with pytest.raises(errors.OverwriteError, match="would overwrite"):
        fk.save(run.isel(samples=[0, 1, 2]), files / "train.npy")  # derived runs too
    with pytest.raises(errors.OverwriteError, match="would overwrite"):
        fk.write_report(run, files / "train.npy")
    from forgetkit.fusion.distill import write_soft_targets

    with pytest.raises(errors.OverwriteError, match="would overwrite"):
        write_soft_targets(files / "train.npy", fk.load_fuser(files / "plan.json"), run)
    with pytest.raises(errors.OverwriteError):
        fk.convert(files / "train.npy", files / "train.npy")
    assert snapshot(files) == before


# ----------------------------------------------------------- 2. untrusted plans
def plan_record(files):
    return json.loads((files / "plan.json").read_text())


def used_step(record):
    return next(i for i, s in enumerate(record["plan"]) if s["eps"] > 0)


@pytest.mark.parametrize("field, value, match", [
    ("epoch_index", 999, r"plan\[\d+\]\.epoch_index must be an integer in \[0, 5\]; got 999"),
    ("epoch_index", -3, r"plan\[\d+\]\.epoch_index .* got -3"),
    ("eps", 1.5, r"plan\[\d+\]\.eps must be a finite number in \[0.0, 1.0\]; got 1.5"),
    ("eps", 1e6, r"\.eps .* got 1000000.0"),
    ("eps", float("inf"), r"\.eps .* got inf"),
    ("eps", float("nan"), r"\.eps .* got nan"),
    ("eps", -0.25, r"\.eps .* got -0.25"),
    ("eps", "0.5", r"\.eps .* got '0.5'"),
    ("epoch", 77, r"\.epoch must be \d+ \(the epoch number at epoch_index"),
])
def test_plan_steps_are_checked(files, capsys, field, value, match):
    record = plan_record(files)
    record["plan"][used_step(record)][field] = value
    bad = files / "bad.json"
    bad.write_text(json.dumps(record))
    with pytest.raises(errors.PlanError, match=match):
        fk.load_fuser(bad)
    for argv in (["apply", str(bad), str(files / "run.npz"), "--out", str(files / "f.npy")],
                 ["distill", str(bad), str(files / "run.npz"), "--out",
                  str(files / "t.parquet")]):
        cli_error(capsys, argv, match)
    assert not (files / "f.npy").exists() and not (files / "t.parquet").exists()


@pytest.mark.parametrize("change, match", [
    (lambda r: r["params"].update(window=-5), "params: window must be >= 0; got -5"),
    (lambda r: r["params"].update(grid=10**9), "params: grid must be <= 1000001"),
    (lambda r: r["params"].update(rule="worst"), "params: rule must be one of"),
    (lambda r: r["params"].update(k=3), "params must be parameters of KnowledgeFusion"),
    (lambda r: r["params"].update(progress="yes"), "progress must be True or False"),
    (lambda r: r.update(n_classes=1), r"n_classes must be an integer in \[2,"),
    (lambda r: r.update(epochs=[0, 1, 1, 3, 4, 5]), r"epochs\[2\] must be greater"),
    (lambda r: r.update(epochs=[]), "epochs must be a non-empty list"),
    (lambda r: r.update(kind="softmax"), "kind must be one of logits, probs"),
    (lambda r: r.update(checkpoints=r["checkpoints"][::-1]), "sorted by epoch_index"),
    (lambda r: r.update(checkpoints=r["checkpoints"][:-1]), "checkpoints must be the epoch "
     "indices"),
    (lambda r: r.update(weights=[1.0] * len(r["checkpoints"])), "the sum of weights|weights "
     "must be null"),
    (lambda r: r.update(val_accuracy=[2.0] * len(r["val_accuracy"])), r"val_accuracy\[0\]"),
    (lambda r: r.update(version=3), "version must be 2"),
    (lambda r: r.update(format="something"), "format must be 'forgetkit-fuser'"),
    (lambda r: r.update(fuser="Magic"), "fuser must be one of KnowledgeFusion"),
    (lambda r: r.pop("checkpoints"), "the field 'checkpoints' is missing"),
    (lambda r: r.update(plan=[[0, 0.5]]), r"plan\[0\] must be a JSON object"),
])
def test_plan_fields_are_checked(files, change, match):
    record = plan_record(files)
    change(record)
    with pytest.raises(errors.PlanError, match=match):
        fk.load_fuser(json.dumps(record))


@pytest.mark.parametrize("text", ["[1, 2, 3]", "null", "[" * 100_000 + "]" * 100_000, "42",
                                  '{"format": "forgetkit-fuser"', "\x89PNG\r\n\x1a\n"])
def test_plans_that_are_not_objects_give_one_error(files, capsys, text):
    bad = files / "bad.json"
    bad.write_text(text, encoding="latin-1")
    for source in (bad, str(bad)):
        with pytest.raises(errors.PlanError):
            fk.load_fuser(source)
        with pytest.raises(errors.PlanError):
            fk.KnowledgeFusion.from_json(source)
    if text.lstrip()[:1] in "[n":
        with pytest.raises(errors.PlanError):
            fk.KnowledgeFusion.from_json(text)  # JSON text, not a path
    cli_error(capsys, ["apply", str(bad), str(files / "run.npz"), "--out",
                       str(files / "f.npy")], "bad.json")


def test_a_run_given_in_place_of_the_plan(files, capsys):
    cli_error(capsys, ["apply", str(files / "run.npz"), str(files / "plan.json"), "--out",
                       str(files / "f.npy")], "not a forgetkit fuser")


def _fuser_mutations(record):
    """Records that break the schema of ``record``'s fuser, each in one way."""
    n = len(record["checkpoints"])
    bad = [dict(record, checkpoints=[{"epoch_index": 99, "epoch": 99}]),
           dict(record, checkpoints=record["checkpoints"] * 2),
           dict(record, params={"nonsense": 1})]
    if record["weights"] is None:  # these fusers mix their checkpoints evenly
        bad.append(dict(record, weights=[1.0 / n] * n))
    else:
        bad += [dict(record, weights=[-0.5, 1.5] + [0.0] * (n - 2)),
                dict(record, weights=[float("nan")] * n),
                dict(record, weights=record["weights"] + [0.0]),
                dict(record, weights=[w * 2 for w in record["weights"]]),
                dict(record, weights=None)]
    fuser = record["fuser"]
    if fuser == "EnsembleSelection":
        bad += [dict(record, selection=[99] * len(record["selection"])),
                dict(record, selection=[0] * len(record["selection"]))]
    elif fuser == "EarlyStopping":
        bad += [dict(record, best_epoch_index=-1),
                dict(record, best_epoch_index=(record["best_epoch_index"] + 1) % 8)]
    elif fuser == "CheckpointAverage":
        bad.append(dict(record, checkpoints=[{"epoch_index": 0, "epoch": 0}]
                        + record["checkpoints"][1:]))
    elif fuser == "LikelihoodFusion":
        bad += [dict(record, n_iter=-1), dict(record, log_likelihood=float("nan")),
                dict(record, params=dict(record["params"], tol=-1.0))]
    return bad


@pytest.mark.parametrize("fuser", [fk.LikelihoodFusion(), fk.EnsembleSelection(max_checkpoints=4),
                                   fk.CheckpointAverage("horizontal", max_checkpoints=3),
                                   fk.EarlyStopping()], ids=lambda f: type(f).__name__)
def test_every_fusers_json_is_validated(fuser):
    record = json.loads(fuser.fit(small_run(n_epochs=8)).to_json())
    fk.load_fuser(json.dumps(record))  # the record as written loads
    for bad in _fuser_mutations(record):
        with pytest.raises(errors.PlanError):
            fk.load_fuser(json.dumps(bad))


def test_apply_never_reads_outside_the_run(files, capsys):
    """A valid plan on a run that lacks its epochs is refused, never filled with garbage."""
    fk.save(small_run(n_epochs=3), files / "short.npz")
    cli_error(capsys, ["apply", str(files / "plan.json"), str(files / "short.npz"), "--out",
                       str(files / "f.npy")], r"lacks epochs")
    run = fk.load(files / "run.npz")
    with pytest.raises(errors.ForgetkitError, match="at least one epoch"):
        run.mean_probs([])


# ------------------------------------------------------------ 3. two writers
@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
@pytest.mark.parametrize("mode", ["a", "w"])
def test_a_second_writer_is_refused_and_touches_nothing(tmp_path, suffix, mode):
    run = small_run(n_epochs=4, n_samples=20)
    other = small_run(n_epochs=4, n_samples=20, seed=1)
    path = tmp_path / f"run{suffix}"
    first = fk.RunWriter(path, 20, 3, labels=run.labels, dtype="float32")
    first.append(0, run.outputs[0])
    first.append(1, run.outputs[1])
    before = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
              and not p.name.endswith(".lock")}
    with pytest.raises(errors.RunLockedError, match=rf"being written by another writer "
                                                    rf"\(process {os.getpid()} on"):
        fk.RunWriter(path, 20, 3, labels=other.labels, dtype="float32", mode=mode)
    after = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
             and not p.name.endswith(".lock")}
    assert after == before
    with pytest.raises(errors.RunLockedError):
        fk.save(other, path)  # an atomic save may not replace a run being written either
    first.append(2, run.outputs[2])
    first.close()
    back = fk.load(path)
    assert back.epochs.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(np.asarray(back.outputs), np.asarray(run.outputs[:3]))
    assert not lock_path(path).exists() and not staging_path(path).exists()
    with fk.RunWriter(path, 20, 3, labels=run.labels, dtype="float32") as again:  # released
        again.append(3, run.outputs[3])
    assert fk.load(path).epochs.tolist() == [0, 1, 2, 3]


def test_summary_writers_lock_too(tmp_path):
    run = small_run(n_epochs=2, n_samples=20)
    path = tmp_path / "summary.npy"
    first = fk.io.SummaryWriter(path, 20, 3, labels=run.labels)
    first.append(0, run.outputs[0])
    with pytest.raises(errors.RunLockedError):
        fk.io.SummaryWriter(path, 20, 3, labels=run.labels, mode="w")
    with pytest.raises(errors.RunLockedError):
        fk.summarize(run, path)
    first.append(1, run.outputs[1])
    first.close()
    assert fk.load(path).epochs.tolist() == [0, 1]
    with pytest.raises(errors.OverwriteError):
        fk.summarize(fk.load(path), path)


HOLDER = textwrap.dedent("""
    import sys, time, numpy as np, forgetkit as fk
    w = fk.RunWriter(sys.argv[1], 10, 3, labels=np.arange(10) % 3, dtype="float32")
    w.append(0, np.zeros((10, 3), np.float32))
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_lock_of_another_process_and_its_recovery_after_a_kill(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        with pytest.raises(errors.RunLockedError, match=f"process {proc.pid} on"):
            fk.RunWriter(path, 10, 3, labels=np.arange(10) % 3, dtype="float32")
    finally:
        proc.kill()
        proc.wait()
    # the dead holder's lock file stays, but its lock went with it: the next writer resumes
    assert lock_path(path).exists()
    with fk.RunWriter(path, 10, 3, labels=np.arange(10) % 3, dtype="float32") as w:
        assert w.epochs == [0]
        w.append(1, np.ones((10, 3), np.float32))
    assert fk.load(path).epochs.tolist() == [0, 1]


def test_every_rank_recording_to_one_path_fails_clearly(tmp_path):
    """Ranks that each build a recorder on the same path (no process group): the second one
    to record fails with the lock's message instead of mixing the runs."""
    torch = import_real_part("torch", "PyTorch (pip install forgetkit[torch])")
    from forgetkit.exporters.torch import LogitRecorder

    torch.manual_seed(0)
    data = (torch.randn(8, 4), torch.arange(8) % 2)
    model = torch.nn.Linear(4, 2)
    rank0 = LogitRecorder(tmp_path / "run.npy", data)
    rank1 = LogitRecorder(tmp_path / "run.npy", data)
    rank0.record(model, 0)
    with pytest.raises(errors.RunLockedError, match="under torch.distributed, record on one"):
        rank1.record(model, 0)
    rank0.close()
    assert fk.load(tmp_path / "run.npy").epochs.tolist() == [0]


# ----------------------------------------------------------- 4. durability
@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_append_flushes_to_disk_before_returning(tmp_path, monkeypatch, suffix):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    run = small_run(n_epochs=2, n_samples=10)
    w = fk.RunWriter(tmp_path / f"run{suffix}", 10, 3, labels=run.labels)
    synced.clear()
    w.append(0, run.outputs[0])
    assert len(synced) >= 3  # the epoch's data, the record naming it, their folder
    w.close()
    quick = fk.RunWriter(tmp_path / f"quick{suffix}", 10, 3, labels=run.labels, durable=False)
    synced.clear()
    quick.append(0, run.outputs[0])
    assert synced == []
    quick.close()


# ------------------------------------------------------- 5. temporary files
DEAD_PID = 2 ** 22 + 12345  # above Linux's pid_max: never a live process


def test_stale_temporary_files_are_removed_by_the_next_write(tmp_path):
    dst = tmp_path / "out.npz"
    host = atomic.HOST
    dead = tmp_path / f".out.npz.{host}-{DEAD_PID}.abcd1234.tmp"
    alive = tmp_path / f".out.npz.{host}-{os.getpid()}.efgh5678.tmp"
    foreign = tmp_path / ".out.npz.otherhost-1.ijkl9012.tmp"
    old = tmp_path / ".out.npz.mnop3456.tmp"  # a tempfile name of an older forgetkit
    unrelated = tmp_path / ".out.npz.bak.tmp"
    for p in (dead, alive, foreign, old, unrelated):
        p.write_bytes(b"partial")
    stale = time.time() - atomic.STALE_TMP_SECONDS - 10
    os.utime(old, (stale, stale))
    fk.save(small_run(), dst)
    assert not dead.exists() and not old.exists()
    assert alive.exists() and foreign.exists() and unrelated.exists()


KILLED_WRITE = textwrap.dedent("""
    import sys, time
    from forgetkit.io.atomic import atomic_write
    with atomic_write(sys.argv[1]) as tmp:
        tmp.write_bytes(b"half a file")
        print("ready", flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("name", ["out.npz", "run.parquet"])
def test_a_killed_write_leaves_a_temporary_file_that_the_next_open_removes(tmp_path, name):
    dst = tmp_path / name
    kill_when_ready(KILLED_WRITE, dst, settle=0.0)
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and not dst.exists()
    run = small_run(n_samples=10)
    if name.endswith(".parquet"):  # a writer opening the run cleans up as well
        fk.RunWriter(dst, 10, 3, labels=run.labels).abort()
    else:
        fk.save(run, dst)
    assert not leftovers[0].exists()


def test_a_live_writers_temporary_file_is_kept(tmp_path):
    dst = tmp_path / "out.npz"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITE, str(dst)],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        fk.save(small_run(), dst)
        assert [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------- 6. one error hierarchy
def test_the_hierarchy():
    assert fk.ForgetkitError is errors.ForgetkitError
    assert issubclass(fk.ForgetkitError, ValueError)
    for cls in (errors.CorruptFileError, errors.PlanError, errors.RunLockedError,
                errors.OverwriteError, errors.InputTypeError):
        assert issubclass(cls, fk.ForgetkitError)
    assert issubclass(errors.MissingFileError, FileNotFoundError)
    assert issubclass(errors.InputTypeError, TypeError)
    with pytest.raises(errors.MissingFileError):
        fk.load("no/such/run.npz")


@pytest.mark.parametrize("cls", [errors.ForgetkitError, errors.InputTypeError,
                                 errors.CorruptFileError, errors.PlanError,
                                 errors.RunLockedError, errors.OverwriteError,
                                 errors.MissingFileError, errors.RunExistsError])
def test_errors_survive_pickling(cls):
    """Errors raised on dask workers or in subprocesses come back as themselves: plain
    pickle, and the ``cls.__new__(cls, *args)`` that tblib (dask's) rebuilds them with."""
    import pickle

    err = cls("no such shard: 'x.npy'")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)
    assert type(cls.__new__(cls, *err.args)) is cls


def test_a_bug_shows_its_traceback_and_says_so(monkeypatch, capsys):
    import forgetkit.cli as cli

    def broken(*args, **kwargs):
        raise KeyError("internal")

    monkeypatch.setattr(cli, "convert", broken)
    assert main(["convert", "a.npz", "b.npz"]) == EXIT_BUG
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and "is a bug in forgetkit" in err


def test_parquet_metadata_claims_are_checked_before_allocating(tmp_path):
    run = small_run(n_samples=20)
    for layout in ("list", "binary"):
        path = tmp_path / f"r_{layout}.parquet"
        fk.save(run, path, layout=layout)
        table = pq.read_table(path)
        md = json.loads(table.schema.metadata[b"forgetkit"])
        for field, value in (("n_classes", 10 ** 9), ("n_samples", 10 ** 9)):
            bad = tmp_path / "bad.parquet"
            pq.write_table(table.replace_schema_metadata(
                {b"forgetkit": json.dumps(dict(md, **{field: value})).encode()}), bad,
                row_group_size=20)
            with pytest.raises(errors.CorruptFileError, match=f"{field}={value}"):
                fk.load(bad)


def test_malformed_parquet_metadata_names_the_file(tmp_path):
    fk.save(small_run(n_samples=20), tmp_path / "r.parquet")
    table = pq.read_table(tmp_path / "r.parquet")
    for text, match in ((b'{"kind": "logits",', "is not valid JSON"),
                        (b"[1, 2]", "must hold a JSON object; got list")):
        pq.write_table(table.replace_schema_metadata({b"forgetkit": text}),
                       tmp_path / "bad.parquet", row_group_size=20)
        with pytest.raises(errors.CorruptFileError,
                           match=f"the forgetkit metadata of '.*bad.parquet'.*{match}"):
            fk.load(tmp_path / "bad.parquet")


def test_grid_is_bounded(files, capsys):
    cli_error(capsys, ["fuse", str(files / "run.npz"), "--grid", "1000000000", "--plan",
                       str(files / "p.json")], "grid must be <= 1000001; got 1000000000")


@pytest.mark.parametrize("content, match", [
    ("[1, 2]", "sidecar .* must hold a JSON object; got list"),
    ('{"labels": "abc"}', "field 'labels' must be a list of integers"),
    ('{"epochs": [[1]]}', "field 'epochs' must be a list of integers"),
    ('{"kind": "logits",', r"sidecar '.*train.forgetkit.json' is not valid JSON"),
    ('{"n_classes": 7}', "sidecar of .* says n_classes=7"),
])
def test_broken_sidecars_name_the_file(files, capsys, content, match):
    (files / "train.forgetkit.json").write_text(content)
    with pytest.raises(errors.CorruptFileError, match=match):
        fk.load(files / "train.npy")
    cli_error(capsys, ["analyze", str(files / "train.npy")], match)


def test_external_parquet_without_outputs_column(tmp_path, capsys):
    pq.write_table(pa.table({"epoch": [0, 0], "sample": [0, 1], "logits": [[1.0, 2.0]] * 2}),
                   tmp_path / "x.parquet")
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    cli_error(capsys, ["analyze", str(tmp_path / "x.parquet"), "--labels",
                       str(tmp_path / "y.npy")], "has no column 'outputs'")


# ---------------------------------------------------- 7. the same value checks
def test_convert_refuses_what_load_refuses(tmp_path, capsys):
    run = small_run()
    bad = np.asarray(run.outputs).copy()
    bad[3, 5, 1] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    np.save(tmp_path / "y.npy", run.labels)
    for dst in ("x.npz", "x.npy", "x.parquet"):
        cli_error(capsys, ["convert", str(tmp_path / "nan.npy"), str(tmp_path / dst),
                           "--labels", str(tmp_path / "y.npy")], "NaN or inf at epoch index 3")
        assert not (tmp_path / dst).exists()


def test_analyze_refuses_probabilities_that_fuse_refuses(tmp_path, capsys):
    probs = np.full((4, 30, 3), 0.2, dtype=np.float32)  # rows sum to 0.6
    fk.save(fk.Run(probs, np.arange(30) % 3, kind="probs", validate=False), tmp_path / "p.npy")
    for argv in (["analyze", str(tmp_path / "p.npy")],
                 ["fuse", str(tmp_path / "p.npy"), "--plan", str(tmp_path / "plan.json")],
                 ["convert", str(tmp_path / "p.npy"), str(tmp_path / "p.npz")]):
        cli_error(capsys, argv, r"p.npy': kind=\"probs\" but sample 0 .* not a probability")


# ------------------------------------------------------------- 9. messages
@pytest.mark.parametrize("suffix, what", [(".npz", "NPZ"), (".npy", "NPY"),
                                          (".parquet", "truncated or corrupt")])
def test_a_png_renamed_as_a_run(tmp_path, capsys, suffix, what):
    (tmp_path / f"pic{suffix}").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    msg = cli_error(capsys, ["analyze", str(tmp_path / f"pic{suffix}")], what)
    assert "allow_pickle" not in msg and "pic" in msg


def test_an_unwritable_destination_names_the_users_path(files, capsys):
    msg = cli_error(capsys, ["convert", str(files / "run.npz"),
                             str(files / "no" / "such" / "folder" / "x.npz")],
                    r"No such file or directory: '.*no/such/folder/x.npz'")
    assert ".tmp" not in msg and ".lock" not in msg
