"""Where a warm Knowledge Fusion fit's time goes, kernel call by kernel call.

    python -m bench.bench_fit_calls [--size sample|cifar] [--repeat 5]

Runs `KnowledgeFusion().fit` on the clean sample run (60 x 10,000 x 10, float16) or the
CIFAR-100-sized run (60 x 10,000 x 100, float32, bench/data/cifar_f32.npy, written by
`bench.bench_warm`), kernels loaded first. Then replays the fit's kernel calls (their
arguments recorded) per kernel: on the threads each call chose, on one thread and on every
thread. Prints one JSON object: the fit's best wall seconds, and per kernel its calls, the
threads they chose, and the best wall seconds of each replay. The gap between the fit and
the sum of its calls is Python; between the chosen threads' time and one thread's divided
by the threads, the pool's hand-off and what does not scale.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import numpy as np

from .common import machine

ROOT = Path(__file__).resolve().parents[1]


def load(size):
    """(values (E, N, C), labels (N,)) of the run of ``size``."""
    import forgetkit as fk

    if size == "sample":
        base = fk.load(ROOT / "data_samples" / "fmnist_resnet18_clean_seed100.npz")
        return np.asarray(base.outputs), base.labels
    data = ROOT / "bench" / "data"
    return np.load(data / "cifar_f32.npy"), np.load(data / "cifar_labels.npy")


def best_wall(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="sample", choices=["sample", "cifar"])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    import numba

    import forgetkit as fk
    from forgetkit.kernels import jit

    values, labels = load(args.size)

    def fit():
        fk.KnowledgeFusion().fit(fk.Run(values, labels))

    fit()  # kernels loaded (or compiled), their costs measured
    seconds = best_wall(fit, args.repeat)
    calls, run = collections.defaultdict(list), jit.run

    def recording(k, n_threads, call_args):
        calls[k.__name__].append((k, n_threads, call_args))
        return run(k, n_threads, call_args)

    jit.run = recording
    try:
        fit()
    finally:
        jit.run = run
    most = numba.get_num_threads()
    per_kernel = {}
    for name, made in calls.items():
        def replay(threads=None, made=made):
            for k, n, call_args in made:
                run(k, n if threads is None else threads, call_args)

        per_kernel[name] = {
            "calls": len(made), "threads": sorted({n for _, n, _ in made}),
            "chosen_s": best_wall(replay, args.repeat),
            "one_thread_s": best_wall(lambda: replay(1), args.repeat),
            "every_thread_s": best_wall(lambda: replay(most), args.repeat)}
    print(json.dumps({"machine": machine(), "size": args.size, "threads": most,
                      "fit_s": seconds, "kernels": per_kernel}, indent=1))


if __name__ == "__main__":
    main()
