"""numba's static shares against blocks claimed one at a time (`forgetkit.kernels.schedule`).

    python -m bench.bench_schedule [--threads 1 2 8 16] [--blocks 1024]

Two loops of the same blocks: ``prange`` over the blocks (each thread gets a fixed, equal
share) and worker slots that claim blocks from a shared counter, as forgetkit's kernels do.
Each block is pure arithmetic (no memory traffic): "equal" blocks all cost the same,
"uneven" ones follow a Pareto law (a few rows cost many times the rest, as in the eps
search's re-checks). Prints the speed-up of each schedule at each thread count over the
same schedule at the first count given (default 1; best of 5), measured in one process.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

from forgetkit.kernels.schedule import claim, new_counter

from .common import machine


@njit(inline="always")
def _block(b, reps):
    s = 0.0
    x = 1.0 + b * 1e-9
    for _ in range(reps):
        x = x * 1.0000001 + 1e-9
        s += np.sqrt(x)
    return s


@njit(parallel=True, cache=True)
def static_shares(reps, out):
    for b in prange(reps.shape[0]):
        out[b] = _block(b, reps[b])


@njit(parallel=True, cache=True)
def claimed_blocks(reps, out):
    n_blocks = reps.shape[0]
    counter = new_counter()
    for _ in prange(n_blocks):
        b = claim(counter)
        while b < n_blocks:
            out[b] = _block(b, reps[b])
            b = claim(counter)


def best_of(fn, reps, repeat=5):
    out = np.zeros(reps.size)
    fn(reps, out)  # compile or load, off the clock
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(reps, out)
        times.append(time.perf_counter() - t)
    return min(times), out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+",
                   default=sorted({1, 2, numba.config.NUMBA_NUM_THREADS // 2,
                                   numba.config.NUMBA_NUM_THREADS}))
    p.add_argument("--blocks", type=int, default=1024)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    loops = {"equal": np.full(args.blocks, 200_000, np.int64),
             "uneven": (rng.pareto(2.0, args.blocks) * 100_000 + 50_000).astype(np.int64)}
    static_shares(loops["equal"][:2], np.zeros(2))  # starts the threading layer
    print(f"machine: {machine()}; numba {numba.__version__}, threading layer "
          f"{numba.threading_layer()}")
    print("\n| blocks | threads | static shares | claimed blocks |\n|---|---|---|---|")
    for name, reps in loops.items():
        base = {}
        for threads in args.threads:
            numba.set_num_threads(threads)
            (s, a), (d, b) = best_of(static_shares, reps), best_of(claimed_blocks, reps)
            assert np.array_equal(a, b)
            base.setdefault("s", s), base.setdefault("d", d)
            print(f"| {name} | {threads} | {s:.3f} s ({base['s'] / s:.2f}x) | "
                  f"{d:.3f} s ({base['d'] / d:.2f}x) |")


if __name__ == "__main__":
    main()
