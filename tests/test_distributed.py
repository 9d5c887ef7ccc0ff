"""Runs on dask arrays, shards and sweeps on a real dask.distributed cluster (2 worker
processes): every result equals the in-memory path's exactly, also after a worker is killed
mid-computation. The tests of equal results also run on the local executor reading the run
in blocks of samples (`mode` "blocks": the same algorithms, the same chunks, here)."""

import io
import os
import signal
import subprocess
import sys
from functools import partial

import numpy as np
import pandas as pd
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.execution import LocalExecutor, executor_for, use_executor

from .conftest import ROOT, import_real_part, make_run

dask = import_real_part("dask", "dask (the forgetkit[dask] extra)")
da = import_real_part("dask.array", "dask (the forgetkit[dask] extra)")
distributed = import_real_part("distributed", "dask.distributed (the forgetkit[dask] extra)")

from forgetkit.fusion import knowledge as fknowledge  # noqa: E402


def on_dask(run, chunk):
    """The run with its outputs as a dask array of ``chunk`` samples per chunk."""
    return run.replace(outputs=da.from_array(np.asarray(run.outputs), chunks=(-1, chunk, -1)))


class RunBlocks(LocalExecutor):
    """The local executor reading each run given to `chunked` in its blocks of samples
    (other runs, the references, as one chunk)."""

    def __init__(self):
        super().__init__()
        self.runs = {}  # id -> (run, chunks)

    def bounds(self, run):
        chunks = self.runs.get(id(run), (None, None))[1]
        return LocalExecutor(chunks).bounds(run)


@pytest.fixture(params=["dask", "blocks"])
def mode(request):
    """"dask": runs on dask arrays on the cluster; "blocks": the local executor reading
    them in blocks of samples (in use for the whole test)."""
    if request.param == "dask":
        request.getfixturevalue("client")
        yield "dask"
        return
    blocks = RunBlocks()
    with use_executor(blocks):
        yield "blocks"


def chunked(mode, run, chunks):
    """The run on a dask array of ``chunks`` samples per chunk (an int or the sizes), or a
    copy of it that the "blocks" executor reads in blocks of those samples."""
    if mode == "dask":
        return uneven(run, chunks)
    new = run.replace()
    executor = fk.execution.executor_for(new)
    executor.runs[id(new)] = (new, chunks)
    assert not executor.whole(new)
    return new


def computed(x):
    """The values of a result (a dask array computed)."""
    return x.compute() if isinstance(x, da.Array) else x


def lazy(mode, x):
    """Whether ``x`` is what a run in ``mode`` gives: a dask array on dask, else ndarray."""
    return isinstance(x, da.Array if mode == "dask" else np.ndarray)


def write_shards(run, folder, bounds, suffix=".npy"):
    """The run saved as shards of samples bounds[i]..bounds[i+1]; returns their glob."""
    folder.mkdir()
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        fk.save(run.isel(samples=np.arange(a, b)), folder / f"shard-{i:03d}{suffix}")
    return str(folder / f"shard-*{suffix}")


def tie_heavy_run(n_epochs=12, n_samples=3000, n_classes=5, seed=0):
    """Probabilities that are multiples of 1/64 (rows of 64 counts): many exact ties."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n_samples)
    pull = np.linspace(0.2, 3.0, n_epochs)[:, None, None] * np.eye(n_classes)[labels][None]
    p = np.exp(rng.normal(size=(n_epochs, n_samples, n_classes)) + pull)
    p /= p.sum(axis=2, keepdims=True)
    counts = np.stack([[rng.multinomial(64, row) for row in epoch] for epoch in p])
    return fk.Run(counts / 64.0, labels, kind="probs")


def assert_same_kf(dask_run, run, **params):
    ref = fk.KnowledgeFusion(**params).fit(run)
    got = fk.KnowledgeFusion(**params).fit(dask_run)
    assert got.plan_ == ref.plan_
    assert got.val_accuracy_ == ref.val_accuracy_
    assert got.checkpoints_ == ref.checkpoints_
    assert got.initial_accuracy_ == ref.initial_accuracy_
    return got, ref


# --------------------------------------------------------------------- imports
def test_import_forgetkit_does_not_import_dask():
    code = ("import sys, forgetkit; bad = [m for m in ('dask', 'distributed') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_dask_run_is_not_computed_when_built():
    def never():
        raise AssertionError("the tensor was computed")

    x = da.from_delayed(dask.delayed(never)(), shape=(4, 10, 3), dtype=np.float32)
    run = fk.Run(x, np.zeros(10, dtype=int))
    assert run.is_distributed and run.shape == (4, 10, 3)
    sub = run.isel(epochs=[1, 3], samples=[2, 5, 7])
    assert sub.is_distributed and sub.shape == (2, 3, 3)
    assert isinstance(run.predictions(), da.Array) and run.cache_probs() is None


# ------------------------------------------------------------- forgetting pass
def test_forgetting_on_shards_equals_in_memory(client, real_run, tmp_path):
    pattern = write_shards(real_run, tmp_path / "shards", [0, 3000, 7001, 10000])
    run = fk.load(pattern, chunks=1500)
    assert run.is_distributed and run.shape == real_run.shape
    assert run.outputs.chunks[1] == (1500, 1500, 1500, 1500, 1001, 1500, 1499)  # per shard
    for fn in (fk.accuracy, fk.forget_fraction, fk.learn_fraction):
        np.testing.assert_array_equal(fn(run), fn(real_run))
    pd.testing.assert_frame_equal(fk.sample_dynamics(run), fk.sample_dynamics(real_run))
    assert fk.analysis.summary(run) == fk.analysis.summary(real_run)
    np.testing.assert_array_equal(run.predictions().compute(), real_run.predictions())


def test_forgetting_on_tie_heavy_data_and_a_dip(mode):
    run = tie_heavy_run()
    dask_run = chunked(mode, run, 700)
    for fn in (fk.forget_fraction, fk.learn_fraction):
        np.testing.assert_array_equal(fn(dask_run), fn(run))
    pd.testing.assert_frame_equal(fk.sample_dynamics(dask_run), fk.sample_dynamics(run))
    # a double descent with its fractions (a dip in the middle of training)
    dip = make_run(n_epochs=30, n_samples=2000, seed=3)
    values = dip.outputs.copy()
    values[10:18] = np.random.default_rng(1).normal(size=values[10:18].shape)
    dip = dip.replace(outputs=values)
    found = fk.double_descent(dip, min_drop=0.05)
    assert found.found
    assert fk.double_descent(chunked(mode, dip, 300), min_drop=0.05) == found


def test_run_methods_on_dask_return_dask_arrays_of_the_same_values(client, real_small):
    run = on_dask(real_small, 600)
    for got, ref in ((run.probs(59), real_small.probs(59)),
                     (run.probs([3, 59]), real_small.probs([3, 59])),
                     (run.mean_probs([57, 58, 59]), real_small.mean_probs([57, 58, 59])),
                     (run.weighted_probs([1, 59], [0.25, 0.75]),
                      real_small.weighted_probs([1, 59], [0.25, 0.75])),
                     (run.label_probs(), real_small.label_probs())):
        assert isinstance(got, da.Array)
        np.testing.assert_array_equal(got.compute(), ref)
    with pytest.raises(ValueError, match="out= needs a run held in memory"):
        run.mean_probs([1], out=np.empty((2000, 10)))


def test_map_reduce_plugs_in_a_per_chunk_function(mode, real_small):
    run = chunked(mode, real_small, 300)
    counts = executor_for(run).map_reduce(run, per_class_correct)
    np.testing.assert_array_equal(counts, per_class_correct(real_small))
    with pytest.warns(FutureWarning, match="Run.map_reduce is deprecated"):
        np.testing.assert_array_equal(run.map_reduce(per_class_correct), counts)


def per_class_correct(run):
    """Correct final predictions per class: a per-chunk count vector (n_classes,)."""
    hit = run.correctness()[-1]
    return np.bincount(run.labels[hit], minlength=run.n_classes)


# ------------------------------------------------- data maps and label issues
NOISY_TRAIN = ("fmnist_resnet18_sym20_h200_train5k.npz", "fmnist_cnn_sym20_h200_train4k.npz")


def refuse_gathering(monkeypatch):
    """Make any gathering of a dask array into this process (np.asarray, .compute) fail."""
    def refuse(*args, **kwargs):
        raise AssertionError("a dask array was gathered into the client")

    monkeypatch.setattr(da.Array, "__array__", refuse)
    monkeypatch.setattr(da.Array, "compute", refuse)


def uneven(run, sizes):
    """The run on a dask array of chunks of ``sizes`` samples (ids kept)."""
    return run.replace(outputs=da.from_array(np.asarray(run.outputs), chunks=(-1, sizes, -1)))


def assert_same_table(got, ref):
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert got.attrs == ref.attrs


@pytest.mark.parametrize("name", NOISY_TRAIN)
def test_data_map_and_label_issues_on_dask_equal_in_memory(mode, name, monkeypatch):
    run = fk.load(ROOT / "data_samples" / name)
    n = run.n_samples
    sizes = (n // 4, n // 10, n // 2, n - n // 4 - n // 10 - n // 2)
    dask_run = chunked(mode, run, sizes)
    refs = (fk.data_map(run), fk.data_map(run, burn_out=7), fk.label_issues(run),
            fk.label_issues(run, n_issues=100))
    assert refs[2]["is_issue"].sum() > 0.1 * n  # the 20% flipped labels are found
    with monkeypatch.context() as m:
        refuse_gathering(m)
        got = (fk.data_map(dask_run), fk.data_map(dask_run, burn_out=7),
               fk.label_issues(dask_run), fk.label_issues(dask_run, n_issues=100))
        picked = fk.select(dask_run, region="ambiguous", frac=0.1)
    for g, r in zip(got, refs, strict=True):
        assert_same_table(g, r)
    np.testing.assert_array_equal(picked, fk.select(refs[0], region="ambiguous", frac=0.1))
    for how in ("mean", "final"):
        probs = fk.pred_probs(dask_run, how=how)
        assert lazy(mode, probs)
        np.testing.assert_array_equal(computed(probs), fk.pred_probs(run, how=how))


def test_data_map_and_label_issues_on_dask_on_tie_heavy_data(mode, monkeypatch):
    # 2 epochs of multiples of 1/64, every sample three times (the copies in other chunks)
    base = tie_heavy_run(n_epochs=2, n_samples=1000, seed=7)
    run = fk.Run(np.tile(base.outputs, (1, 3, 1)), np.tile(base.labels, 3), kind="probs",
                 sample_ids=np.arange(3000)[::-1] * 7)
    with pytest.warns(UserWarning, match="aum .* is NaN"):
        ref_map = fk.data_map(run)
    ref_issues = fk.label_issues(run)
    with monkeypatch.context() as m:
        refuse_gathering(m)
        with pytest.warns(UserWarning, match="aum .* is NaN"):
            got_map = fk.data_map(chunked(mode, run, (1, 999, 1234, 766)))
        got_issues = fk.label_issues(chunked(mode, run, (1500, 1, 1499)))
    assert_same_table(got_map, ref_map)
    assert_same_table(got_issues, ref_issues)
    # ties: samples at both region thresholds, and a flagged set that splits equal scores
    cuts = ref_map.attrs["thresholds"]
    assert (ref_map["variability"] == cuts["variability"]).sum() > 10
    assert (ref_map["confidence"] == cuts["confidence"]).sum() > 10
    score = ref_issues["score"].to_numpy()
    last = np.sort(score)[::-1][ref_issues.attrs["summary"]["n_issues"] - 1]
    assert 0 < ref_issues["is_issue"].to_numpy()[score == last].sum() < (score == last).sum()


def test_token_analyses_on_dask_equal_in_memory(mode, tmp_path):
    from .test_tokens import all_tables, assert_same, token_run, topk_twin

    run, seq, pos = token_run(seed=5, sample_ids=True)
    ref = all_tables(run, seq, pos)
    n = run.n_samples  # chunks that cut sequences
    assert_same(all_tables(chunked(mode, run, (3, n - 50, 47)), seq, pos), ref)
    # the top-k run of the same logits: its own token table, checked on the workers
    topk = topk_twin(run.replace(sample_ids=None), seq, pos, tmp_path)
    ref = all_tables(topk, None, None)
    got = fk.load(tmp_path / "topk.npy", chunks=40) if mode == "dask" else \
        chunked(mode, topk, (3, n - 50, 47))
    assert got.is_distributed == (mode == "dask")
    assert_same(all_tables(got, None, None), ref)


# ------------------------------------------------------------ Knowledge Fusion
def test_kf_on_dask_equals_in_memory_on_real_data(mode, real_run):
    val, test = real_run.split(0.5, seed=0)
    got, ref = assert_same_kf(chunked(mode, val, 1100), val)
    assert sum(eps > 0 for _, eps in got.plan_) >= 2  # the fusion did mix windows in
    fused = got.predict_proba(chunked(mode, test, 900))
    assert lazy(mode, fused)
    np.testing.assert_array_equal(computed(fused), ref.predict_proba(test))
    assert_same_kf(chunked(mode, val, 2500), val, max_windows=1, rule="paper", window=2)


def test_staged_predictions_on_dask_equal_in_memory(client, real_small):
    val, test = real_small.split(0.5, seed=1)
    kf = fk.KnowledgeFusion().fit(val)
    stages = list(kf.staged_predict_proba(on_dask(test, 700)))
    ref = list(kf.staged_predict_proba(test))
    assert len(stages) == len(ref) > 2
    assert all(isinstance(stage, da.Array) for stage in stages)
    for got, want in zip(stages, ref, strict=True):
        np.testing.assert_array_equal(got.compute(), want)
    curve = fk.evaluate.ensemble_size_curve(on_dask(real_small, 900), seeds=(1,))
    pd.testing.assert_frame_equal(curve, fk.evaluate.ensemble_size_curve(real_small,
                                                                         seeds=(1,)))


def test_kf_on_dask_equals_in_memory_on_tie_heavy_data(mode):
    run = tie_heavy_run(seed=4)
    got, ref = assert_same_kf(chunked(mode, run, 800), run)
    np.testing.assert_array_equal(computed(got.predict_proba(chunked(mode, run, 1000))),
                                  ref.predict_proba(run))
    assert_same_kf(chunked(mode, run, 800), run, rule="paper", max_checkpoints=4)


def test_every_fuser_predicts_a_dask_run_as_in_memory(client, real_small):
    run = on_dask(real_small, 700)
    for fuser in (fk.CheckpointAverage("horizontal", max_checkpoints=3),
                  fk.LikelihoodFusion(max_checkpoints=4), fk.EnsembleSelection(max_checkpoints=3)):
        fuser.fit(real_small)
        np.testing.assert_array_equal(fuser.predict_proba(run).compute(),
                                      fuser.predict_proba(real_small))


def test_fusers_fit_on_dask_as_in_memory_or_refuse_by_name(client, real_small):
    """Likelihood fusion fits on the label probabilities computed on the workers (the same
    weights); ensemble selection, which reads the outputs every round, refuses by name."""
    run = on_dask(real_small, 700)
    got, ref = fk.LikelihoodFusion(max_checkpoints=4).fit(run), \
        fk.LikelihoodFusion(max_checkpoints=4).fit(real_small)
    assert got.checkpoints_ == ref.checkpoints_
    np.testing.assert_array_equal(got.weights_, ref.weights_)
    with pytest.raises(fk.ForgetkitError, match="ensemble selection needs a run held"):
        fk.EnsembleSelection(max_checkpoints=3).fit(run)


def test_compare_on_dask_equals_in_memory_without_ensemble_selection(client, real_run):
    """compare on a dask run (the streamed run's shared softmax pass in memory) gives the
    in-memory table exactly; with ensemble selection among its methods it refuses at once."""
    methods = [m for m in fk.evaluate.DEFAULT_METHODS if m != "ensemble_selection"]
    got = fk.compare(on_dask(real_run, 2500), seeds=(0,), methods=methods)
    pd.testing.assert_frame_equal(got, fk.compare(real_run, seeds=(0,), methods=methods))
    with pytest.raises(fk.ForgetkitError, match="pass methods without 'ensemble_selection'"):
        fk.compare(on_dask(real_run, 2500), seeds=(0,))


def test_kf_on_dask_refuses_the_continuous_search(mode, real_small):
    with pytest.raises(ValueError, match="grid=None .* needs a run held in memory"):
        fk.KnowledgeFusion(grid=None).fit(chunked(mode, real_small, 500))


# ------------------------------------------------------------- worker failures
def kill_worker_once(marker, run):
    """A per-chunk count that kills its worker process the first time it runs."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return per_class_correct(run)


def test_map_reduce_survives_a_killed_worker(client, real_small, tmp_path):
    fn = partial(kill_worker_once, str(tmp_path / "killed"))
    run = on_dask(real_small, 250)
    counts = executor_for(run).map_reduce(run, fn)
    assert (tmp_path / "killed").exists()
    np.testing.assert_array_equal(counts, per_class_correct(real_small))


def test_kf_fit_survives_a_worker_killed_mid_fit(client, real_run, monkeypatch):
    val = real_run.isel(samples=np.arange(6000))
    mix = fknowledge.ChunkedFitState.mix
    killed = []

    def mix_after_a_kill(state, window, eps):
        on_workers = getattr(state.parts, "client", None) is not None  # not the reference
        if on_workers and state.n_mixed == 2:  # two windows mixed in: kill a worker holding
            # fit states
            pid = next(iter(state.parts.client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        mix(state, window, eps)

    monkeypatch.setattr(fknowledge.ChunkedFitState, "mix", mix_after_a_kill)
    assert_same_kf(on_dask(val, 500), val)
    assert killed


# ------------------------------------------------------------------- shards
def test_parquet_shards_by_url_equal_in_memory(client, real_small, tmp_path):
    pattern = write_shards(real_small, tmp_path / "pq", [0, 900, 2000], suffix=".parquet")
    run = fk.load("file://" + pattern, chunks=400)
    assert run.is_distributed and run.shape == real_small.shape
    np.testing.assert_array_equal(fk.forget_fraction(run), fk.forget_fraction(real_small))
    pd.testing.assert_frame_equal(fk.sample_dynamics(run), fk.sample_dynamics(real_small))


def test_a_missing_pattern_or_shard_names_it(client, real_small, tmp_path):
    with pytest.raises(FileNotFoundError, match="no shard matches .*nothing-"):
        fk.load(str(tmp_path / "nothing-*.npy"))
    pattern = write_shards(real_small, tmp_path / "s", [0, 1000, 2000])
    run = fk.load(pattern, chunks=500)
    (tmp_path / "s" / "shard-001.npy").unlink()
    with pytest.raises(FileNotFoundError, match="shard .*shard-001.npy.* is missing"):
        fk.forget_fraction(run)


def test_a_corrupt_or_mismatched_shard_names_it(client, real_small, tmp_path):
    pattern = write_shards(real_small, tmp_path / "s", [0, 1000, 2000])
    bad = tmp_path / "s" / "shard-001.npy"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="shard .*shard-001.npy.* truncated or corrupt"):
        fk.load(pattern)
    bad.write_bytes(b"not an npy file at all")
    with pytest.raises(ValueError, match="shard .*shard-001.npy.* truncated or corrupt"):
        fk.load(pattern)
    fk.save(real_small.isel(epochs=np.arange(59), samples=np.arange(1000, 2000)), bad)
    with pytest.raises(ValueError, match="shard .*shard-001.npy.* has epochs 59.*60"):
        fk.load(pattern)


# -------------------------------------------------------------------- sweeps
def test_sweep_equals_compare_per_run(client, real_small, tmp_path):
    paths = []
    for i, rows in enumerate((np.arange(0, 1200), np.arange(800, 2000))):
        paths.append(tmp_path / f"run{i}.npz")
        fk.save(real_small.isel(samples=rows), paths[-1])
    methods = ["single", "kf", "horizontal"]
    table = fk.sweep(str(tmp_path / "run*.npz"), methods=methods, client=client, seeds=(0, 1))
    assert list(table.columns[:2]) == ["run", "method"]
    for path in paths:
        ref = fk.compare(fk.load(path), methods=methods, seeds=(0, 1)).reset_index()
        got = table[table["run"] == str(path)].drop(columns="run").reset_index(drop=True)
        pd.testing.assert_frame_equal(got, ref)
    with pytest.raises(FileNotFoundError, match="no such run: .*missing.npz"):
        fk.sweep([paths[0], tmp_path / "missing.npz"], client=client)


def test_sweep_command_on_a_scheduler_and_on_its_own_cluster(client, tmp_path, capsys):
    for i in range(2):
        fk.save(make_run(n_samples=400, seed=i), tmp_path / f"r{i}.npy")
    out = tmp_path / "sweep.csv"
    args = [str(tmp_path / "r*.npy"), "--methods", "single", "kf", "--seeds", "0", "--out",
            str(out), "--quiet"]
    assert main(["sweep", *args, "--scheduler", client.scheduler.address]) == 0
    by_scheduler = pd.read_csv(out)
    assert len(by_scheduler) == 4 and by_scheduler["run"].nunique() == 2
    assert main(["sweep", *args, "--workers", "1"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out), by_scheduler)
    corrupt = tmp_path / "r9.npy"
    corrupt.write_bytes(b"garbage")
    assert main(["sweep", str(corrupt), "--out", str(out), "--scheduler",
                 client.scheduler.address]) == 1
    assert "r9.npy" in capsys.readouterr().err


def test_a_failed_run_is_one_line_without_the_workers_traceback(tmp_path, capfd):
    (tmp_path / "r9.npy").write_bytes(b"garbage")
    assert main(["sweep", str(tmp_path / "r9.npy"), "--out", str(tmp_path / "s.csv"),
                 "--workers", "1", "--quiet"]) == 1
    err = capfd.readouterr().err
    assert "r9.npy" in err
    assert "Compute Failed" not in err and "Traceback" not in err, err


def test_sweep_keeps_the_good_runs_rows_and_names_each_failed_run(client, tmp_path, capsys):
    fk.save(make_run(n_samples=400, seed=0), tmp_path / "r0.npy")
    (tmp_path / "r1.npy").write_bytes(b"garbage")
    out = tmp_path / "sweep.csv"
    capsys.readouterr()
    assert main(["sweep", str(tmp_path / "r*.npy"), "--methods", "single", "--seeds", "0",
                 "--out", str(out), "--quiet", "--scheduler", client.scheduler.address]) == 1
    table = pd.read_csv(out, keep_default_na=False)
    good = table[table["run"] == str(tmp_path / "r0.npy")]
    assert len(good) == 1 and (good["error"] == "").all()
    assert good["method"].tolist() == ["single"]
    bad = table[table["run"] == str(tmp_path / "r1.npy")]
    assert len(bad) == 1 and "r1.npy" in bad["error"].iloc[0]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("forgetkit sweep: error: run ")
    assert "r1.npy" in err[0]
    with pytest.raises(fk.ForgetkitError, match="r1.npy"):
        fk.sweep(str(tmp_path / "r*.npy"), methods=["single"], seeds=(0,), client=client)


# ----------------------------------------------------------- executor details
def test_progress_on_dask_counts_chunks(client, real_small, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    run = on_dask(real_small, 500)
    fk.data_map(run, progress=True)
    fk.label_issues(run, progress=True)
    fk.analysis.summary(run, progress=True)
    assert term.getvalue().count("training dynamics: 4/4 chunks") == 2
    assert "forgetting pass: 4/4 chunks" in term.getvalue()


def test_a_dask_run_needs_dask_only(tmp_path):
    """Without dask.distributed (dask's own threaded scheduler), a run on a dask array gives
    the in-memory results, progress included; sweeps say what to install."""
    code = """
import io, sys
sys.modules["distributed"] = None  # not installed
import numpy as np, pandas as pd, dask.array as da, forgetkit as fk
from tests.conftest import make_run
run = make_run(n_samples=300, ties=True)
x = da.from_array(np.asarray(run.outputs), chunks=(-1, 70, -1))
dask_run = fk.Run(x, run.labels)
np.testing.assert_array_equal(dask_run.predictions().compute(), run.predictions())
pd.testing.assert_frame_equal(fk.label_issues(dask_run), fk.label_issues(run))
assert fk.KnowledgeFusion().fit(dask_run).plan_ == fk.KnowledgeFusion().fit(run).plan_
class Terminal(io.StringIO):
    def isatty(self):
        return True
sys.stderr = term = Terminal()
fk.data_map(dask_run, progress=True)
assert "training dynamics: 5/5 chunks" in term.getvalue(), term.getvalue()
try:
    fk.sweep([])
except ImportError as err:
    assert "sweeps need dask.distributed" in str(err)
else:
    raise AssertionError("no ImportError")
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
