"""Compile every kernel into numba's on-disk cache ahead of use (``forgetkit warmup``,
``python -m forgetkit.kernels``): for container images and CI, so that no later process
pays the compilation.

The kernels are compiled for the argument types forgetkit passes them by running the
library's passes on tiny runs (float16, float32 and float64 outputs, in memory and memory
mapped, the probability cache on and off; a top-k token run), on every thread
(`jit.forced`): each kernel has one build, whatever the number of threads (``jit``).

numba compiles on one thread, so the parts (`PARTS`: one per dtype, and the top-k run)
run on as many processes as the process has cores (``python -m forgetkit.kernels --parts
FOLDER``, each taking the next part as it ends one), sharing numba's cache: each save
holds a lock beside the function's index, and each compile of a signature a lock of its
own, so that a signature two parts reach is compiled once and loaded by the other
(`share_cache`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from . import jit, twins


def _runs(folder, dtypes):
    """Tiny runs of each stored dtype, each in memory and memory-mapped from .npy."""
    import forgetkit as fk

    rng = np.random.default_rng(0)
    n_epochs, n_samples, n_classes = 6, 300, 20
    labels = rng.integers(0, n_classes, n_samples)
    out = rng.normal(size=(n_epochs, n_samples, n_classes))
    out[:, np.arange(n_samples), labels] += np.linspace(0, 3, n_epochs)[:, None]
    out[2, 5, 1] = 700.0  # beyond float16's exp table: that row takes the shifted exp
    for dtype in dtypes:
        run = fk.Run(out.astype(dtype), labels)
        path = Path(folder) / f"{np.dtype(dtype).name}.npy"
        fk.save(run, path)
        yield run
        yield fk.load(path)


def workload(folder, *, dtypes=(np.float16, np.float32, np.float64), topk=True):
    """The library's passes on tiny runs of ``dtypes`` (files written to ``folder``):
    forgetting, training dynamics, label issues, every fuser's fit and prediction through
    `compare` (probabilities held; softmax statistics and gathered values; streamed), the
    exact eps search, a sample subset read in place, the checksumming forgetting pass (that
    of a verified load), the EM pass, and (``topk``) certified fusion on a top-k token run.
    Returns their results, a list of arrays and tables."""
    import forgetkit as fk
    from forgetkit.run import DEFAULT_MEMORY_BUDGET

    from . import argmax_crc, argmax_rows_at, em_pass, sum_correct_count_rows

    results = []
    for run in _runs(folder, dtypes):
        results += [fk.forget_fraction(run), fk.learn_fraction(run),
                    fk.sample_dynamics(run), fk.data_map(run), fk.label_issues(run)]
        subset = run.isel(samples=np.arange(0, run.n_samples, 2))
        results += [subset.predictions(), subset.label_probs()]
        for budget in (DEFAULT_MEMORY_BUDGET, 100_000, 0):
            results.append(fk.compare(run, methods=list(fk.evaluate.METHODS), seeds=(0,),
                                      memory_budget=budget))
        results.append(fk.KnowledgeFusion(grid=None).fit(run).predict_proba(run))
        src = np.arange(0, run.n_samples, 2)  # the forgetting pass on rows read in place
        results.append(argmax_rows_at(np.asarray(run.outputs), src,
                                      np.empty((run.n_epochs, src.size), np.int32)))
        if run.outputs.dtype == np.float16:  # the pass that verifies a loaded .npy
            pred = np.empty(run.shape[:2], np.int32)
            results += [argmax_crc(np.asarray(run.outputs), pred)[0], pred]
    rng = np.random.default_rng(1)
    q = rng.random((300, 4)) + 0.1
    results.append(em_pass(q, np.full(4, 0.25)))
    total, p = rng.random((300, 5)), rng.random((300, 5))
    results.append(sum_correct_count_rows(total, p, rng.integers(0, 5, 300), np.arange(300)))
    return results + (_topk_workload(folder) if topk else [])


def _topk_workload(folder):
    """Certified fusion on a tiny top-k token run, in memory and memory-mapped from .npy
    (read-only records: the kernels read their fields in place): every fuser through
    `compare`, and the certificates of a Knowledge Fusion plan, also with k equal to the
    vocabulary and with no room for the record cache."""
    import forgetkit as fk
    from forgetkit.kinds import topk
    from forgetkit.kinds.topk import TopKOutputs, topk_records

    rng = np.random.default_rng(2)
    n_epochs, n_tokens, vocab, k = 4, 200, 30, 3
    targets = rng.integers(0, vocab, n_tokens)
    z = rng.normal(size=(n_epochs, n_tokens, vocab))
    z[:, np.arange(n_tokens), targets] += np.linspace(0, 3, n_epochs)[:, None]
    records = np.stack([topk_records(x, targets, k) for x in z])
    run = fk.Run(TopKOutputs(records, vocab, np.arange(n_tokens) // 10,
                             np.arange(n_tokens) % 10), targets, kind="topk")
    exact = fk.Run(TopKOutputs(np.stack([topk_records(x, targets, vocab) for x in z]), vocab,
                               np.arange(n_tokens) // 10, np.arange(n_tokens) % 10),
                   targets, kind="topk")  # k = vocabulary: the exact path
    path = Path(folder) / "topk.npy"
    fk.save(run, path)
    results = [fk.KnowledgeFusion().fit(exact).certified(exact)]
    for tokens in (run, fk.load(path)):
        results += [fk.compare(tokens, methods=list(fk.evaluate.METHODS), seeds=(0,)),
                    fk.KnowledgeFusion().fit(tokens).certified(tokens)]
    budget, topk.CACHE_BYTES = topk.CACHE_BYTES, 0  # the fit without its record cache
    try:
        results.append(fk.KnowledgeFusion().fit(run).certified(run))
    finally:
        topk.CACHE_BYTES = budget
    return results


def missing():
    """The kernels not compiled in this process: [name]."""
    return [f"{k.py_func.__module__}.{k.__name__}" for k in jit.KERNELS
            if not k.build.overloads]


#: The parts of the warmup, the longest to compile first (each alone with an empty cache,
#: 2 cores: topk 39 s, float16 39 s, float32 17 s, float64 13 s; the two longest start
#: side by side, and a dtype after float16 finds the kernels that take float64 arrays
#: whatever the run's dtype compiled).
PARTS = ("topk", "float16", "float32", "float64")


def run_part(part, folder):
    """Compile the kernels of one part of `PARTS` (files written to ``folder``). Returns the
    names of the kernels compiled in this process, as `missing` writes them."""
    # a folder of its own: part processes running at once write their runs apart
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(dir=folder) as own:
        warnings.simplefilter("ignore")
        with jit.forced("parallel"):
            if part == "topk":
                _topk_workload(own)
                twins.row_sums(np.zeros((1, 1)), np.empty(1))  # the twins' compiled piece
            else:
                workload(own, dtypes=(np.dtype(part).type,), topk=False)
    return [name for name in _names() if name not in missing()]


def _names():
    return [f"{k.py_func.__module__}.{k.__name__}" for k in jit.KERNELS]


def compile_lock_path(dispatcher, args):
    """The lock file of compiling cached function ``dispatcher`` for argument types
    ``args``, beside its cache index; None for a function numba does not cache."""
    import hashlib

    index = getattr(getattr(dispatcher._cache, "_cache_file", None), "_index_path", None)
    if index is None:
        return None
    return f"{index}.{hashlib.sha1(str(tuple(args)).encode()).hexdigest()[:16]}.compiling"


def share_cache():
    """In this process, numba's cache as several processes share it (the warmup's part
    processes, the workers of ``pytest -n 2``): a save holds a lock file beside the
    function's index (numba saves unlocked: two processes saving two signatures of one
    function at once can pair one's index entry with the other's code, numba issues 4807
    and 10128), and a compile of a signature a lock file of its own
    (`compile_lock_path`), so that the process that comes second loads the first one's
    build instead of compiling it again. A lock this process holds is not taken again: the
    functions a kernel calls are locked under it, along the call graph, so no two processes
    wait on each other. Calling it again changes nothing. POSIX."""
    import fcntl

    from numba.core import caching, dispatcher, sigutils

    save = caching.IndexDataCacheFile.save
    if not getattr(save, "locked", False):
        def locked_save(self, key, data):
            with open(self._index_path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    return save(self, key, data)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

        locked_save.locked = True
        caching.IndexDataCacheFile.save = locked_save

    compile_ = dispatcher.Dispatcher.compile
    if getattr(compile_, "original", None):
        return
    held = set()

    def compile_once(self, sig):
        args, _ = sigutils.normalize_signature(sig)
        path = None if tuple(args) in self.overloads else compile_lock_path(self, args)
        if path is None or path in held:
            return compile_(self, sig)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held.add(path)
            try:
                return compile_(self, sig)  # loads the other process's build if it saved one
            finally:
                held.discard(path)
                fcntl.flock(lock, fcntl.LOCK_UN)

    compile_once.original = compile_
    dispatcher.Dispatcher.compile = compile_once


def _processes():
    """Processes the warmup runs at once: the cores this process may use (POSIX), at most
    one per part."""
    if os.name != "posix" or not hasattr(os, "sched_getaffinity"):
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), len(PARTS)))


#: The line before each part's report on a part process's stdout.
_REPORT = "forgetkit-warmup-part:"


def serve_parts(folder, lines=sys.stdin, out=sys.stdout):
    """A part process: run each part named on a line of ``lines`` (files written to
    ``folder``), then write `_REPORT` and the kernels it compiled (one JSON line)."""
    share_cache()
    for line in lines:
        compiled = run_part(line.strip(), folder)
        out.write(f"{_REPORT}\n{json.dumps(compiled)}\n")
        out.flush()


def _run_parts(folder, processes):
    """Run `PARTS` on ``processes`` part processes (``python -m forgetkit.kernels --parts
    FOLDER``), each taking the next part as it ends one; returns the kernels compiled."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    waiting, compiled, failed, lock = list(PARTS), set(), [], threading.Lock()

    def serve():
        with tempfile.TemporaryFile("w+") as err:  # a pipe could fill and stall the child
            child = subprocess.Popen([sys.executable, "-m", "forgetkit.kernels", "--parts",
                                      folder], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=err, text=True)
            part = None
            try:
                while True:
                    with lock:
                        if not waiting or failed:
                            part = None
                            break
                        part = waiting.pop(0)
                    child.stdin.write(part + "\n")
                    child.stdin.flush()
                    line = child.stdout.readline()
                    while line and line.strip() != _REPORT:  # lines the part printed
                        line = child.stdout.readline()
                    if not line:  # the child ended
                        break
                    with lock:
                        compiled.update(json.loads(child.stdout.readline()))
            finally:
                child.stdin.close()
                child.wait()
            if part is not None:
                err.seek(0)
                failed.append(f"the warmup's part {part} failed:\n{err.read()[-3000:]}")

    threads = [threading.Thread(target=serve) for _ in range(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise RuntimeError(failed[0])
    return compiled


def warmup(*, stream=None, quiet=False, processes=None):
    """Compile every kernel into numba's cache (kernels already cached are loaded, not
    compiled again), the parts of `PARTS` in ``processes`` processes at once (default: one
    per core, at most one per part; 1: in this process). Writes a line to ``stream``
    (stderr) unless ``quiet``. Returns the seconds taken."""
    stream = stream or sys.stderr
    processes = _processes() if processes is None else processes
    start = time.perf_counter()
    if not quiet:
        stream.write("compiling forgetkit's kernels ...")
        stream.flush()
    with tempfile.TemporaryDirectory(prefix="forgetkit-warmup-") as folder:
        if processes > 1:
            compiled = _run_parts(folder, processes)
        else:
            compiled = set()
            for part in PARTS:
                compiled.update(run_part(part, folder))
    seconds = time.perf_counter() - start
    if not quiet:
        stream.write(f" {seconds:.1f} s\n")
        left = [name for name in _names() if name not in compiled]
        if left:
            stream.write("not compiled (no pass of the workload reaches them): "
                         + ", ".join(left) + "\n")
    return seconds
