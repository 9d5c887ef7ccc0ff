"""KF(inf) fit: forgetkit (exact O(N*C) eps search in numba) against a straightforward numpy
implementation (brute-force accuracy at every grid point), same plan required.

    python -m bench.bench_fusion [--ref-steps-large 2] [--repeat 5] [--ref-repeat 3]

Sizes: E=100, N=5,000, C=100 (reference run to the end) and E=90, N=25,000, C=1,000 (float16
NPY on disk, 4.5 GB; the reference is timed on its first --ref-steps-large steps and its
total extrapolated from the mean step time, since it would run for about half an hour).
Each side's figure is its best of several runs (timeit's rule): this shared 2-core machine's
speed drifts by about 10% from minute to minute.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .common import DATA, machine, peak_rss_anon, write_synthetic_npy


def numpy_probs(run, epochs):
    """Plain numpy softmax (float64) of the stored outputs of ``epochs``: (k, N, C)."""
    x = np.asarray(run.outputs[list(epochs)], dtype=np.float64)
    e = np.exp(x - x.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


def numpy_kf(run, *, window=1, grid=101, max_steps=None, softmax="numpy"):
    """Brute-force Knowledge Fusion (docs/definitions.md's algorithm read literally), streaming the
    probabilities of each window from the run. Returns (plan, seconds per step, seconds
    before the first step).

    softmax="numpy" is the straightforward implementation: numpy computes correctness and
    every softmax. softmax="forgetkit" takes both from forgetkit's kernels instead, leaving
    only the grid search in numpy (the first baseline this benchmark had).
    """
    import forgetkit as fk

    t = time.perf_counter()
    n_epochs, y = run.n_epochs, run.labels
    G = np.arange(grid) / (grid - 1)
    if softmax == "numpy":
        correct = np.stack([np.argmax(run.outputs[e], axis=1) == y for e in range(n_epochs)])
        probs = lambda epochs: numpy_probs(run, epochs)  # noqa: E731
    else:
        correct = fk.correctness(run)
        probs = run.probs
    prob = probs([n_epochs - 1])[0]
    setup = time.perf_counter() - t
    explore = set(range(n_epochs))
    plan, step_times = [], []
    while explore and (max_steps is None or len(plan) < max_steps):
        t = time.perf_counter()
        cur = np.argmax(prob, axis=1) == y
        f = {e: np.mean(correct[e] & ~cur) for e in explore}
        a = min(e for e in explore if f[e] == max(f.values()))
        for e in range(a - window, a + window + 1):
            explore.discard(e)
        lo, hi = max(a - window, 0), min(a + window, n_epochs - 1)
        A = np.mean(probs(range(lo, hi + 1)), axis=0)
        acc = [np.mean(np.argmax(eps * A + (1 - eps) * prob, axis=1) == y) for eps in G]
        eps = G[int(np.argmax(acc))]
        plan.append((a, float(eps)))
        prob = eps * A + (1 - eps) * prob
        step_times.append(time.perf_counter() - t)
    return plan, step_times, setup


def bench_size(n_epochs, n_samples, n_classes, ref_steps, repeat, ref_repeat):
    """Best of ``repeat`` forgetkit fits and of ``ref_repeat`` reference runs, each on a
    freshly loaded (memory-mapped) run."""
    import forgetkit as fk

    path = write_synthetic_npy(DATA / f"kf_{n_epochs}x{n_samples}x{n_classes}.npy", n_epochs,
                               n_samples, n_classes, seed=1, noise=0.1)
    # load the kernels for these array types (memory-mapped, read-only) before timing
    warm = write_synthetic_npy(DATA / f"warm_{n_classes}.npy", 6, 300, n_classes, seed=1)
    for build in ("serial", "parallel"):  # a tiny run alone would take the serial build
        with fk.kernels.forced(build):
            fk.KnowledgeFusion().fit(fk.load(warm))
    secs = float("inf")
    for _ in range(repeat):
        run = fk.load(path)
        with peak_rss_anon() as mem:
            t = time.perf_counter()
            kf = fk.KnowledgeFusion().fit(run)
            secs = min(secs, time.perf_counter() - t)
    refs = {}
    for softmax in ("numpy", "forgetkit"):
        best = float("inf")
        for _ in range(ref_repeat):
            plan, step_times, setup = numpy_kf(fk.load(path), max_steps=ref_steps,
                                               softmax=softmax)
            best = min(best, setup + float(np.mean(step_times)) * len(kf.plan_))
        refs[softmax] = dict(seconds=best, steps=len(plan),
                             same=kf.plan_[: len(plan)] == plan)
    return dict(shape=(n_epochs, n_samples, n_classes), seconds=secs, steps=len(kf.plan_),
                k=kf.ensemble_size_, refs=refs, peak_mb=mem["peak_mb"],
                gb=run.outputs.nbytes / 1e9)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref-steps-large", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="forgetkit fits per size (best kept)")
    p.add_argument("--ref-repeat", type=int, default=3,
                   help="reference runs at the small size (best kept; 1 at the large size)")
    p.add_argument("--skip-large", action="store_true")
    args = p.parse_args(argv)
    sizes = [(100, 5000, 100, None, args.repeat, args.ref_repeat)]
    if not args.skip_large:
        sizes.append((90, 25000, 1000, args.ref_steps_large, args.repeat, 1))
    rows = [bench_size(*s) for s in sizes]
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}")
    print("| E x N x C | GB (f16) | KF steps / k | forgetkit s | brute force, all numpy s | "
          "speed-up | brute force, forgetkit softmax s | speed-up | identical plans | "
          "peak RssAnon MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells, same = [], []
        for softmax in ("numpy", "forgetkit"):
            ref = r["refs"][softmax]
            cell = f"{ref['seconds']:.1f}"
            if ref["steps"] < r["steps"]:
                cell += f" (extrapolated from {ref['steps']} of {r['steps']} steps)"
            cells += [cell, f"{ref['seconds'] / r['seconds']:.0f}x"]
            same.append(("yes" if ref["same"] else "NO")
                        + (f" (first {ref['steps']} steps)" if ref["steps"] < r["steps"] else ""))
        print(f"| {'x'.join(map(str, r['shape']))} | {r['gb']:.2f} | {r['steps']} / {r['k']} | "
              f"{r['seconds']:.3f} | {' | '.join(cells)} | {' / '.join(same)} | "
              f"{r['peak_mb']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
