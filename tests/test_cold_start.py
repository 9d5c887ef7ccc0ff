"""The kernels' two builds (serial for small calls, parallel for large ones), which build a
call runs, the compile notice and ``forgetkit warmup``."""

import io
import re

import numpy as np
import pandas as pd
import pytest
from numba import njit

from forgetkit import cli, kernels
from forgetkit.kernels import jit, warmup


def _assert_same(a, b):
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    elif isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


#: The kernels whose two builds tests/test_parallel_kernels.py compares (each of its tests
#: runs on both): the test below compiles the parallel builds of the others only.
BOTH_BUILDS_ELSEWHERE = {
    "argmax_f16", "argmax_f16_at", "argmax_float_at", "row_top", "softmax_rows",
    "combine_softmax", "softmax_stats", "take_samples", "label_leads", "window_grid_counts",
    "mix_window_into", "em_pass", "score_recipes", "live_rows", "add_softmax_live_rows",
    "class_max", "add_into", "selection_cached_counts"}


def test_parallel_builds_and_numpy_twins_give_the_same_bits(tmp_path, monkeypatch):
    """The warmup's passes (forgetting, dynamics, label issues, compare with every fuser and
    the probability cache on and off, the exact eps search, the EM pass) on float16 runs in
    memory and memory-mapped give the same bits on the numpy twins (the serial build where
    a kernel has none) as on the parallel builds (the serial ones of the kernels
    test_parallel_kernels compares on both builds), and reach every kernel but the
    float32/64 argmax ones."""
    (tmp_path / "s").mkdir(), (tmp_path / "p").mkdir()
    with jit.forced("numpy"):
        twins = warmup.workload(tmp_path / "s", dtypes=(np.float16,))
    reached, choose = set(), jit.choose

    def parallel_where_not_compared_elsewhere(parallel, work, args):
        reached.add(parallel.__name__)
        if parallel.__name__ in BOTH_BUILDS_ELSEWHERE:
            return parallel.serial
        return choose(parallel, work, args)

    monkeypatch.setattr(jit, "choose", parallel_where_not_compared_elsewhere)
    with jit.forced("parallel"):
        parallel = warmup.workload(tmp_path / "p", dtypes=(np.float16,))
    assert len(twins) == len(parallel) > 10
    for a, b in zip(twins, parallel, strict=True):
        _assert_same(a, b)
    assert {k.__name__ for k in jit.KERNELS} - reached <= {"argmax_float", "argmax_float_at"}


def test_choose_runs_small_calls_serially_and_large_ones_in_parallel(monkeypatch):
    import numba

    k = kernels._argmax.argmax_f16
    args = (np.zeros((2, 3), np.int16), np.empty(2, np.int32))
    assert jit.choose(k, jit.PARALLEL_WORK - 1, args) is k.serial
    assert jit.choose(k, jit.COMPILE_WORK, args) is k
    # in between: parallel where that build is already compiled, else serial
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: False)
    assert jit.choose(k, jit.PARALLEL_WORK, args) is k.serial
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: True)
    assert jit.choose(k, jit.PARALLEL_WORK, args) is k
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert jit.choose(k, jit.COMPILE_WORK, args) is k.serial  # one thread: serial
    finally:
        numba.set_num_threads(threads)
    with jit.forced("parallel"):
        assert jit.choose(k, 0, args) is k
    with jit.forced("serial"):
        assert jit.choose(k, jit.COMPILE_WORK, args) is k.serial
    with pytest.raises(ValueError, match="build must be 'serial', 'parallel', 'numpy' or None; "
                                         "got 'gpu'"):
        with jit.forced("gpu"):
            pass


def test_compiled_sees_builds_in_this_process_and_in_the_cache():
    bits = np.zeros((4, 3), np.int16)
    kernels.argmax_rows(bits.view(np.float16), np.empty(4, np.int32))  # compiles or loads
    k = kernels._argmax.argmax_f16
    assert jit._compiled(k.serial, (kernels.source(bits.view(np.float16)),
                                    np.empty(4, np.int32)))
    assert not jit._compiled(k.serial, (np.zeros((4, 3, 2), np.int16), np.empty(4, np.int32)))


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
    monkeypatch.setattr(warmup, "workload", lambda folder: calls.append(jit._FORCED))
    assert cli.main(["warmup"]) == 0
    assert calls == ["serial", "parallel"]
    out, err = capsys.readouterr()
    assert re.search(r"forgetkit's kernels are compiled into numba's cache \(\d+\.\d s\)", out)
    assert "compiling forgetkit's kernels (serial) ..." in err
    assert cli.main(["warmup", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")


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
    assert list((tmp_path / "__pycache__").glob("cached_probe.probe-*.nbi.lock"))
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

    from .conftest import ROOT, compile_lock_path

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
