"""What a kernel call pays to run on the pool's threads: threads that wait awake between
calls (`forgetkit.kernels.jit.AWAKE_NS`) against threads that sleep on their locks.

    python -m bench.bench_pool [--threads 1 2 4 8 16] [--calls 1000] [--tasks kf_fit data_map]
                               [--repeat 5] [--json OUT]

In one process (the kernels and the wait loops compiled first, off the clock):

- per-call time of a kernel that doubles 1,000 values (``--calls`` calls, the best of
  ``--repeat``) on each thread count, on a new pool of each kind: what a hand-off costs;
- the warm passes on the cifar-sized run (60 x 10,000 x 100 float32 logits,
  ``bench/data/cifar_f32.npy``, written by ``bench.bench_warm``'s ``prepare``) on all of
  numba's threads, the two kinds of pool alternating, ``--repeat`` times each: the best
  wall seconds and the process's CPU seconds of that call.

Prints one JSON object (and writes it to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _doubling_kernel():
    from forgetkit.kernels import jit
    from forgetkit.kernels.schedule import claim, span

    def double(x, out, n_blocks, counter):
        n = x.shape[0]
        blk = claim(counter)
        while blk < n_blocks:
            lo, hi = span(blk, n, n_blocks)
            for i in range(lo, hi):
                out[i] = 2.0 * x[i]
            blk = claim(counter)

    return jit.Kernel(double)  # not a forgetkit kernel: not in jit.KERNELS


def new_pool(awake):
    """Start a new shared pool whose threads wait awake (``awake``) or sleep at once."""
    from forgetkit.kernels import jit

    jit._POOL = jit._Pool()
    jit._POOL.awake = jit.AWAKE_NS if awake else 0
    return jit._POOL


def per_call(thread_counts, calls, repeat):
    """{kind: {threads: best microseconds per call}}."""
    from forgetkit.kernels import jit

    k = _doubling_kernel()
    x, out = np.random.default_rng(0).random(1000), np.empty(1000)
    result = {}
    for kind in ("asleep", "awake"):
        new_pool(kind == "awake")
        result[kind] = {}
        for n in thread_counts:
            jit.run(k, n, (x, out))
            best = np.inf
            for _ in range(repeat):
                t = time.perf_counter()
                for _ in range(calls):
                    jit.run(k, n, (x, out))
                best = min(best, (time.perf_counter() - t) / calls)
            result[kind][n] = round(best * 1e6, 1)
    return result


def passes(tasks, repeat):
    """{task: {kind: (best wall s, its CPU s)}} on the cifar-sized run."""
    import forgetkit as fk

    data = ROOT / "bench" / "data"
    values, labels = np.load(data / "cifar_f32.npy"), np.load(data / "cifar_labels.npy")
    work = {"kf_fit": lambda run: fk.KnowledgeFusion().fit(run), "data_map": fk.data_map,
            "label_issues": fk.label_issues,
            "forgetting": lambda run: (fk.forget_fraction(run), fk.learn_fraction(run))}
    result = {}
    for task in tasks:
        work[task](fk.Run(values, labels))  # compiled or loaded off the clock
        best = {}
        for _ in range(repeat):
            for kind in ("asleep", "awake"):
                new_pool(kind == "awake")
                run = fk.Run(values, labels)
                t, c = time.perf_counter(), time.process_time()
                work[task](run)
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                if kind not in best or wall < best[kind][0]:
                    best[kind] = (round(wall, 4), round(cpu, 3))
        result[task] = best
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--tasks", nargs="*", default=["kf_fit", "data_map"],
                   choices=["kf_fit", "data_map", "label_issues", "forgetting"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    import numba

    import forgetkit as fk
    from forgetkit.kernels import jit

    jit.compile_waits()
    out = {"forgetkit": fk.__file__, "numba_threads": numba.get_num_threads(),
           "awake_ns": jit.AWAKE_NS,
           "per_call_us": per_call(args.threads, args.calls, args.repeat),
           "passes": passes(args.tasks, args.repeat)}
    text = json.dumps(out)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
