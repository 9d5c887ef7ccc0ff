"""The exps of top-k records: the C library's exp (what the top-k kernels call) against the
kernels' vectorised exp for non-positive arguments (`kernels.softmax._exp_nonpositive`,
within 1 ulp of the correctly rounded exp), on records of k float32 logits less a float32
log-sum-exp, as the record cache computes them.

    python -m bench.bench_record_exp [--records 500000] [--k 8] [--repeat 5]

One thread; nanoseconds per exp, best of ``--repeat``, and the share of results whose bits
differ. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from numba import njit

from forgetkit.kernels.softmax import _exp_nonpositive


@njit
def _libm(z, lse, out):
    for s in range(z.shape[0]):
        top = np.float64(lse[s])
        for j in range(z.shape[1]):
            out[s, j] = np.exp(np.float64(z[s, j]) - top)


@njit(fastmath={"contract"})
def _vectorised(z, lse, out):
    for s in range(z.shape[0]):
        top = np.float64(lse[s])
        for j in range(z.shape[1]):
            out[s, j] = _exp_nonpositive(np.float64(z[s, j]) - top)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    z = (rng.normal(size=(args.records, args.k)) * 3 - 8).astype(np.float32)
    lse = np.zeros(args.records, np.float32)
    outs = {f.__name__.strip("_"): np.empty(z.shape) for f in (_libm, _vectorised)}
    ns = {}
    for f in (_libm, _vectorised):
        name = f.__name__.strip("_")
        f(z, lse, outs[name])  # compiles
        best = np.inf
        for _ in range(args.repeat):
            t = time.perf_counter()
            f(z, lse, outs[name])
            best = min(best, time.perf_counter() - t)
        ns[name] = round(best / z.size * 1e9, 2)
    print(json.dumps({"ns_per_exp": ns,
                      "bits_differ": round(float(np.mean(outs["libm"] != outs["vectorised"])),
                                           4)}))


if __name__ == "__main__":
    sys.exit(main())
