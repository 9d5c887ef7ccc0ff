"""The kernels' one build run on threads (the caller's alone for small calls), the numpy
twins, the compile notice and ``forgetkit warmup``."""

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from numba import njit

from forgetkit import cli, kernels
from forgetkit.kernels import jit, warmup
from forgetkit.kernels.schedule import claim


def _assert_same(a, b):
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    elif isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def test_threads_and_numpy_twins_give_the_same_bits(tmp_path, monkeypatch):
    """The warmup's passes (forgetting, dynamics, label issues, compare with every fuser and
    the probability cache on and off, the exact eps search, the EM pass) on float16 runs in
    memory and memory-mapped give the same bits on the numpy twins (the kernel on one
    thread where it has none) as on every thread, and reach every kernel but the
    float32/64 argmax ones."""
    (tmp_path / "s").mkdir(), (tmp_path / "p").mkdir()
    with jit.forced("numpy"):
        twins = warmup.workload(tmp_path / "s", dtypes=(np.float16,))
    reached, run = set(), jit.run

    def recording(k, n_threads, args):
        reached.add(k.__name__)
        return run(k, n_threads, args)

    monkeypatch.setattr(jit, "run", recording)
    with jit.forced("parallel"):
        threaded = warmup.workload(tmp_path / "p", dtypes=(np.float16,))
    assert len(twins) == len(threaded) > 10
    for a, b in zip(twins, threaded, strict=True):
        _assert_same(a, b)
    assert {k.__name__ for k in jit.KERNELS} - reached <= {"argmax_float", "argmax_float_at"}


def test_small_calls_run_on_the_callers_thread_and_large_ones_on_every_thread():
    import numba

    threads = numba.get_num_threads()
    assert jit.threads(jit.PARALLEL_WORK - 1) == 1
    assert jit.threads(jit.PARALLEL_WORK) == min(2, threads)
    assert jit.threads(threads * jit.THREAD_WORK) == threads  # one per THREAD_WORK values
    assert jit.threads(1 << 40) == threads
    assert jit.threads(None) == threads  # a kernel called directly
    try:
        numba.set_num_threads(1)
        assert jit.threads(1 << 30) == 1
    finally:
        numba.set_num_threads(threads)
    with jit.forced("parallel"):
        assert jit.threads(0) == threads
    for build in ("serial", "numpy"):
        with jit.forced(build):
            assert jit.threads(1 << 30) == 1
    with pytest.raises(ValueError, match="build must be 'serial', 'parallel', 'numpy' or None; "
                                         "got 'gpu'"):
        with jit.forced("gpu"):
            pass


def test_a_call_takes_threads_by_its_kernels_measured_cost(monkeypatch):
    """Once timed, a kernel's call of W seconds of work takes sqrt(W / `jit.THREAD_HANDOFF`)
    threads (the fewest seconds of W / t + handoff * t), not one per `jit.THREAD_WORK`
    values: a call of few but costly values (a softmax and a grid of eps per row) gets
    many threads, one of many cheap values stays on one."""
    import numba

    monkeypatch.setattr(numba, "get_num_threads", lambda: 16)
    h = jit.THREAD_HANDOFF
    assert jit.threads(200_000) == 3  # not timed: one per THREAD_WORK values
    assert jit.threads(1000, 400 * h / 1000) == 16  # 400 handoffs of work: sqrt(400) = 20
    assert jit.threads(1000, 49 * h / 1000) == 7
    assert jit.threads(1000, 3 * h / 1000) == 1
    assert jit.threads(10 ** 9, h / 10 ** 12) == 1
    with jit.forced("serial"):
        assert jit.threads(1000, 400 * h / 1000) == 1

    seen = []
    run = jit.run
    monkeypatch.setattr(jit, "run", lambda k, n, args: seen.append(n) or run(k, n, args))
    k = kernels.topk.settle_scan  # any kernel: its cost is measured by `call`
    k.cost = None
    data = np.zeros((2, 50, 4), dtype=np.float32)
    ids = np.tile(np.arange(4, dtype=np.uint16), (2, 50, 1))
    src, targets = np.arange(50, dtype=np.int64), np.zeros(50, dtype=np.int64)
    args = (data, ids, data[..., 0], data[..., 0], np.arange(2, dtype=np.int64), src, targets,
            10, np.full(50, 1, dtype=np.int64), np.empty(50, dtype=bool))
    jit.call(k, 400, *args)
    assert k.cost is not None and k.cost > 0
    k.cost = 64 * h / 8_000
    jit.call(k, 8_000, *args)
    assert seen[-1] == 8


@pytest.mark.parametrize("n_threads", [2, 3, 8])
def test_a_call_on_threads_runs_every_block_once_and_adds_the_threads_sums(n_threads):
    """`jit.run` on more threads than numba's (the pool grows) or fewer: each block of
    rows runs once, whichever thread claims it, and the counts the threads return add up
    to the call's."""
    k = kernels._argmax.mixture_correct_count
    rng = np.random.default_rng(3)
    a, b = rng.random((5000, 4)), rng.random((5000, 4))
    y = rng.integers(0, 4, 5000)
    expected = int(np.count_nonzero((0.3 * a + 0.7 * b).argmax(axis=1) == y))
    for blocks in (1, 7, 64):
        assert jit.run(k, n_threads, (a, b, y, 0.3, blocks)) == expected
        assert jit.run(k, 1, (a, b, y, 0.3, blocks)) == expected
    out = np.full(5000, -7, np.int32)
    jit.run(kernels._argmax.argmax_float, n_threads, (a, out, 64))
    np.testing.assert_array_equal(out, a.argmax(axis=1))


def test_calls_from_several_threads_at_once_share_the_pool_or_run_alone():
    """Callers on several threads at once: one holds the pool, the others run on their own
    thread; every result is right, and an error in a pool thread reaches its caller."""
    from concurrent.futures import ThreadPoolExecutor

    k = kernels._argmax.mixture_correct_count
    rng = np.random.default_rng(4)
    a, b = rng.random((3000, 5)), rng.random((3000, 5))
    y = rng.integers(0, 5, 3000)
    expected = [int(np.count_nonzero((e * a + (1 - e) * b).argmax(axis=1) == y))
                for e in np.linspace(0, 1, 40)]
    with ThreadPoolExecutor(4) as callers:
        got = list(callers.map(lambda e: jit.run(k, 3, (a, b, y, e, 16)),
                               np.linspace(0, 1, 40)))
    assert got == expected
    for _ in range(5):  # block 5 on the caller's thread or on a pool thread
        with pytest.raises(ValueError, match="block 5"):
            jit.run(_FAILING, 3, (np.zeros(4), 16))
    assert jit.run(k, 3, (a, b, y, 0.0, 16)) == expected[0]  # the pool is free again


def _raise_at_block_5(x, n_blocks, counter):
    blk = claim(counter)
    while blk < n_blocks:
        if blk == 5:
            raise ValueError("block 5")
        blk = claim(counter)


_FAILING = jit.Kernel(_raise_at_block_5)  # not a forgetkit kernel: not in jit.KERNELS


def test_compiled_sees_builds_in_this_process_and_in_the_cache():
    bits = np.zeros((4, 3), np.int16)
    kernels.argmax_rows(bits.view(np.float16), np.empty(4, np.int32))  # compiles or loads
    k = kernels._argmax.argmax_f16
    assert jit._compiled(k.build, k.full_args((kernels.source(bits.view(np.float16)),
                                               np.empty(4, np.int32)), 1))
    assert not jit._compiled(k.build, k.full_args((np.zeros((4, 3, 2), np.int16),
                                                   np.empty(4, np.int32)), 1))


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _fresh_forgetkit_function():
    """A function numba has never compiled (no cache), counted as one of forgetkit's."""
    def probe(x):
        return x * 2 + 1

    probe.__module__ = "forgetkit.kernels.probe"
    return njit(probe)


def test_compile_notice_says_once_how_long_compiling_took():
    stream = _Terminal()
    with kernels.compile_notice(stream=stream):
        _fresh_forgetkit_function()(1)
        _fresh_forgetkit_function()(2.0)
    text = stream.getvalue()
    assert text.startswith("compiling forgetkit's kernels, once per installation ...\n")
    assert re.search(r"\ncompiling forgetkit's kernels, once per installation: \d+\.\d s\n$",
                     text)
    assert text.count("\n") == 2  # said once, however many kernels compiled


@pytest.mark.parametrize("case", ["not a terminal", "disabled", "nothing compiled",
                                  "not forgetkit's"])
def test_compile_notice_is_silent(case):
    stream = io.StringIO() if case == "not a terminal" else _Terminal()
    f = _fresh_forgetkit_function()
    if case == "nothing compiled":
        f(1)
    if case == "not forgetkit's":
        f = njit(lambda x: x + 3)
    with kernels.compile_notice(stream=stream, enabled=case != "disabled"):
        f(1)
    assert stream.getvalue() == ""


def test_cli_warmup_compiles_the_workload_and_reports(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(warmup, "_processes", lambda: 1)  # the parts in this process
    monkeypatch.setattr(warmup, "workload", lambda folder, dtypes, topk: calls.append(
        (jit._FORCED, np.dtype(dtypes[0]).name, topk)))
    monkeypatch.setattr(warmup, "_topk_workload",
                        lambda folder: calls.append((jit._FORCED, "topk")))
    assert cli.main(["warmup"]) == 0
    # one pass per part, the longest first: one build per kernel, on every thread
    assert calls == [("parallel", "topk"), ("parallel", "float16", False),
                     ("parallel", "float32", False), ("parallel", "float64", False)]
    out, err = capsys.readouterr()
    assert re.search(r"forgetkit's kernels are compiled into numba's cache \(\d+\.\d s\)", out)
    assert "compiling forgetkit's kernels ..." in err
    assert cli.main(["warmup", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")


def test_the_warmup_runs_its_parts_in_processes_that_share_the_cache(tmp_path, monkeypatch):
    """Two processes at once run a part each (here the same one) through numba's cache, a
    save and a compile of a signature locked across them, and report what they compiled."""
    monkeypatch.setattr(warmup, "PARTS", ("topk", "topk"))
    compiled = warmup._run_parts(str(tmp_path), 2)
    assert "forgetkit.kernels.topk.certify_rows" in compiled
    assert "forgetkit.kernels.argmax.argmax_f16" not in compiled


def test_a_failing_warmup_part_raises_with_its_error(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "PARTS", ("no-such-dtype",))
    with pytest.raises(RuntimeError, match="(?s)part no-such-dtype failed.*TypeError"):
        warmup._run_parts(str(tmp_path), 1)


def test_the_tests_lock_numba_cache_saves(tmp_path, monkeypatch):
    """conftest's lock around numba's cache saves (the workers of ``pytest -n 2`` share the
    cache): a cached function's two signatures are saved under the lock and load back."""
    import importlib
    import subprocess
    import sys

    from numba.core import caching

    assert caching.IndexDataCacheFile.save.locked
    (tmp_path / "cached_probe.py").write_text(
        "from numba import njit\n\n@njit(cache=True)\ndef probe(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.import_module("cached_probe").probe
    assert (probe(1), probe(1.5)) == (2, 2.5)
    index = Path(probe._cache._cache_file._index_path)  # __pycache__, or NUMBA_CACHE_DIR's
    assert index.with_name(index.name + ".lock").exists()
    loaded = subprocess.run(
        [sys.executable, "-c", "from cached_probe import probe; probe(1); probe(1.5); "
         "print(sum(probe.stats.cache_hits.values()))"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "2"


def test_the_tests_compile_a_signature_once_across_processes(tmp_path, monkeypatch):
    """conftest's lock around numba's compiles: a process that needs a cached function's
    signature while another compiles it waits, then loads that build instead of compiling
    it again."""
    import fcntl
    import importlib
    import os
    import subprocess
    import sys
    import time

    from numba import types

    from forgetkit.kernels.warmup import compile_lock_path

    from .conftest import ROOT

    (tmp_path / "cached_twice.py").write_text(
        "from numba import njit\n\n@njit(cache=True)\ndef probe(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.import_module("cached_twice").probe
    path = compile_lock_path(probe, (types.int64,))
    (tmp_path / "__pycache__").mkdir(exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as if this process were compiling probe(int)
        other = subprocess.Popen(
            [sys.executable, "-c", "import tests.conftest; from cached_twice import probe; "
             "print('calling', flush=True); probe(1); print(sum(probe.stats.cache_hits.values()), "
             "sum(probe.stats.cache_misses.values()))"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
            stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "calling"
        time.sleep(1.0)  # the other process now waits for the lock, compiling nothing
        assert other.poll() is None
        type(probe).compile.original(probe, (types.int64,))  # compiles and saves, locked
        fcntl.flock(lock, fcntl.LOCK_UN)
    out, _ = other.communicate(timeout=60)
    assert other.returncode == 0
    assert out.split() == ["1", "0"]  # one cache hit, no miss: loaded, not compiled


def test_twins_note_their_kernels_for_a_compile_after_the_run(tmp_path, monkeypatch):
    """A call that takes its twin because its kernel is not compiled notes the kernel and
    its argument types; ``python -m forgetkit.kernels --later FILE`` (the detached process
    `jit.compile_later` starts at exit, not under pytest) compiles them into the cache,
    where the next process finds them."""
    import os
    import pickle
    import subprocess
    import sys

    from .conftest import ROOT

    monkeypatch.setattr(jit, "_WANTED", set())
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: False)
    a, b = np.zeros((3, 2)), np.zeros((3, 2))
    kernels.mix(a, b, 0.5)  # the twin
    sig = tuple(jit.typeof(x) for x in kernels._eps.mix.full_args((a, b, 0.5), 1))
    assert jit._WANTED == {("forgetkit.kernels.eps_search", "mix", sig)}
    assert jit.compile_later() is None and jit._WANTED  # under pytest: nothing started
    with jit.forced("serial"):
        kernels.mix(a, b, 0.5)
    assert len(jit._WANTED) == 1  # forced calls note nothing
    path = tmp_path / "wanted.pkl"
    path.write_bytes(pickle.dumps(sorted(jit._WANTED, key=str)))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "forgetkit.kernels", "--later", str(path)], env=env,
                   check=True, timeout=300)
    assert not path.exists()
    found = subprocess.run(
        [sys.executable, "-c", "import numpy as np; from forgetkit.kernels import jit, "
         "eps_search as e; a = np.zeros((3, 2)); "
         "print(jit._compiled(e.mix.build, e.mix.full_args((a, a, 0.5), 1)))"],
        env=env, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "True"


def test_a_call_that_took_the_pool_for_want_of_a_region_notes_it_for_the_compile_after(
        tmp_path, monkeypatch):
    """Where numba has `jit.REGION_THREADS` threads, a call of a kernel with a region that
    is not compiled runs on the pool and notes the kernel once; the compile after the run
    (``--later``) compiles its region too, which the next process then runs."""
    import os
    import pickle
    import subprocess
    import sys

    from .conftest import ROOT

    k, region_threads = kernels._argmax.argmax_float, jit.REGION_THREADS
    monkeypatch.setattr(jit, "_WANTED", set())
    monkeypatch.setattr(jit, "_REGION_READY", {})
    monkeypatch.setattr(jit, "REGION_THREADS", 2)
    monkeypatch.setattr(jit.numba, "get_num_threads", lambda: 2)
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: dispatcher is k.build)
    values, out = np.random.default_rng(2).random((300_000, 3)), np.empty(300_000, np.int32)
    for _ in range(2):
        kernels.argmax_rows(values, out)  # on 2 threads: work above jit.PARALLEL_WORK
        assert not k.ran_region
    np.testing.assert_array_equal(out, values.argmax(axis=1))
    sig = tuple(jit.typeof(x) for x in k.full_args((kernels.source(values), out), 2))
    assert jit._WANTED == {("forgetkit.kernels.argmax", "argmax_float", sig)}
    path = tmp_path / "wanted.pkl"
    path.write_bytes(pickle.dumps(sorted(jit._WANTED, key=str)))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT),
           "NUMBA_NUM_THREADS": str(region_threads)}  # the processes below: regions wanted
    subprocess.run([sys.executable, "-m", "forgetkit.kernels", "--later", str(path)], env=env,
                   check=True, timeout=300)
    ran = subprocess.run([sys.executable, "-c", _RUN_ARGMAX_REGION], env=env,
                         capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["True", "0", "True"]  # the region, loaded: nothing compiled


_RUN_ARGMAX_REGION = """
import numpy as np
from numba.core import event

from forgetkit import kernels
from forgetkit.kernels import jit

values, out = np.random.default_rng(2).random((300_000, 3)), np.empty(300_000, np.int32)
k = kernels._argmax.argmax_float
with event.install_recorder("numba:compile") as compiled:
    jit.run(k, 2, (kernels.source(values), out))
print(k.ran_region, len(compiled.buffer), (out == values.argmax(axis=1)).all())
"""


def test_a_forked_child_starts_its_own_pool():
    """A child forked after calls on the pool (multiprocessing's fork start method) runs
    kernels on threads of its own: the parent's do not exist there."""
    import multiprocessing

    k = kernels._argmax.mixture_correct_count
    a = np.random.default_rng(5).random((2000, 3))
    y = a.argmax(axis=1)
    assert jit.run(k, 3, (a, a, y, 0.5, 16)) == 2000  # the parent's pool is started
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(jit.run, (k, 3, (a, a, y, 0.5, 16))) == 2000


def _argmax_in_child(values):
    """In a forked child: the argmax on 2 threads, forced "parallel" (a region wherever one
    may run), and whether it ran as a region."""
    out = np.empty(values.shape[0], np.int32)
    with jit.forced("parallel"):
        jit.run(kernels._argmax.argmax_float, 2, (kernels.source(values), out))
    return out, kernels._argmax.argmax_float.ran_region


@pytest.mark.parametrize("parent_ran_a_region", [False, True])
def test_a_forked_child_runs_its_calls_on_the_pool(parent_ran_a_region, monkeypatch):
    """numba's OpenMP threading layer terminates a child that starts a parallel region once
    its parent has started the layer's threads (any call does): a forked child runs no
    region, its calls run on the pool."""
    import multiprocessing

    monkeypatch.setattr(jit, "REGION_THREADS", 1)
    k = kernels._argmax.argmax_float
    values = np.random.default_rng(6).random((5000, 3))
    out = np.empty(5000, np.int32)
    k.ran_region = False
    jit.numba.get_num_threads()  # starts the threading layer's threads
    with jit.forced("parallel"):
        jit.run(k, 2 if parent_ran_a_region else 1, (kernels.source(values), out))
    assert k.ran_region == (parent_ran_a_region and jit.numba.get_num_threads() > 1)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got, ran_region = pool.apply_async(_argmax_in_child, (values,)).get(timeout=60)
    np.testing.assert_array_equal(got, values.argmax(axis=1))
    assert not ran_region
