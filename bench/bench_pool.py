"""What a kernel call pays to run on the pool's threads (`forgetkit.kernels.jit.run`): the
time per call of a kernel that doubles 1,000 values, by thread count, on the pool and as
the kernel's region (`Kernel.on_threads`: numba's threads in one parallel region).

    python -m bench.bench_pool [--threads 1 2 4 8 16] [--calls 1000] [--repeat 5] [--json OUT]

The kernel's work is a microsecond, so the time per call is the hand-off: waking the pool's
threads (each then takes the GIL to enter its kernel and again to leave it) and waiting for
them to end. One process, the kernel compiled first, off the clock; for each thread count
the best of ``--repeat`` rounds of ``--calls`` calls. A pass of ~2 ms calls on 16 threads
pays this on each call (the KF fit makes ~42, the data map 60: bench/RESULTS.md, "Cold
start"). Prints one JSON object (and writes it to ``--json``): ``per_call_us`` (the pool),
``region_per_call_us``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _doubling_kernel():
    from numba import prange

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

    k = jit.Kernel(double)  # not a forgetkit kernel: not in jit.KERNELS
    build = k.build

    @k.on_threads
    def double_region(x, out, n_blocks, counter, n_threads):
        for _ in prange(n_threads):
            build(x, out, n_blocks, counter)

    return k


def per_call(thread_counts, calls, repeat, region):
    """{threads: best microseconds per call}, on the pool or (``region``) as the region
    (thread counts above numba's left out)."""
    import numba

    from forgetkit.kernels import jit

    k = _doubling_kernel()
    if not region:
        k.region = None
    x, out = np.random.default_rng(0).random(1000), np.empty(1000)
    result, region_threads = {}, jit.REGION_THREADS
    jit.REGION_THREADS = 1  # the region compiled and run whatever numba's threads
    try:
        with jit.forced("parallel"):
            for n in thread_counts:
                if region and n > numba.get_num_threads():
                    continue
                jit.run(k, n, (x, out))  # compiles; starts the threads
                best = np.inf
                for _ in range(repeat):
                    t = time.perf_counter()
                    for _ in range(calls):
                        jit.run(k, n, (x, out))
                    best = min(best, (time.perf_counter() - t) / calls)
                result[n] = round(best * 1e6, 1)
    finally:
        jit.REGION_THREADS = region_threads
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    import numba

    import forgetkit as fk

    out = {"forgetkit": fk.__file__, "numba_threads": numba.get_num_threads(),
           "per_call_us": per_call(args.threads, args.calls, args.repeat, region=False),
           "region_per_call_us": per_call(args.threads, args.calls, args.repeat, region=True)}
    text = json.dumps(out)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
