"""Compile every kernel into numba's on-disk cache ahead of use (``forgetkit warmup``,
``python -m forgetkit.kernels``): for container images and CI, so that no later process
pays the compilation.

The kernels are compiled for the argument types forgetkit passes them by running the
library's passes on tiny runs (float16, float32 and float64 outputs, in memory and memory
mapped, the probability cache on and off), on every thread (`jit.forced`): each kernel has
one build, whatever the number of threads (``jit``).
"""

from __future__ import annotations

import sys
import tempfile
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


def workload(folder, *, dtypes=(np.float16, np.float32, np.float64)):
    """The library's passes on tiny runs of ``dtypes`` (files written to ``folder``):
    forgetting, training dynamics, label issues, every fuser's fit and prediction through
    `compare` (probabilities held; softmax statistics and gathered values; streamed), the
    exact eps search, a sample subset read in place, the checksumming forgetting pass (that
    of a verified load), the EM pass, and certified fusion on a top-k token run. Returns
    their results, a list of arrays and tables."""
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
    return results + _topk_workload(folder)


def _topk_workload(folder):
    """Certified fusion on a tiny top-k token run, in memory and memory-mapped from .npy
    (read-only records: the kernels read their fields in place): every fuser through
    `compare`, and the certificates of a Knowledge Fusion plan, also with k equal to the
    vocabulary."""
    import forgetkit as fk
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
    return results


def missing():
    """The kernels not compiled in this process: [name]."""
    return [f"{k.py_func.__module__}.{k.__name__}" for k in jit.KERNELS
            if not k.build.overloads]


def warmup(*, stream=None, quiet=False):
    """Compile every kernel into numba's cache (kernels already cached are loaded, not
    compiled again). Writes a line to ``stream`` (stderr) unless ``quiet``. Returns the
    seconds taken."""
    stream = stream or sys.stderr
    start = time.perf_counter()
    if not quiet:
        stream.write("compiling forgetkit's kernels ...")
        stream.flush()
    with tempfile.TemporaryDirectory(prefix="forgetkit-warmup-") as folder, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with jit.forced("parallel"):
            workload(folder)
        twins.row_sums(np.zeros((1, 1)), np.empty(1))  # the one compiled piece of the twins
    seconds = time.perf_counter() - start
    if not quiet:
        stream.write(f" {seconds:.1f} s\n")
        left = missing()
        if left:
            stream.write("not compiled (no pass of the workload reaches them): "
                         + ", ".join(left) + "\n")
    return seconds
