"""`compare` on the suite's L run at several thread counts in one process.

    python -m bench.compare_threads THREADS... (e.g. 1 16 16 16; one JSON line per run)

The kernels are loaded (`bench.common.warm_compare`: a tiny run, every path compare
takes) and the run read once at the full thread count, off the clock; then each count sets
``numba.set_num_threads`` and times `compare` on a freshly loaded memmap. Speed-ups taken
within one process and minute are not blurred by the lent hosts' speed, which varies from
call to call. To time another tree beside it, run the same command with that tree's root
first on ``PYTHONPATH`` (its ``bench/data`` linked to this one's).
"""

from __future__ import annotations

import json
import sys
import time

import numba

import forgetkit as fk
from forgetkit import evaluate

from .common import suite_run, warm_compare


def main(argv=None):
    counts = [int(t) for t in (argv or sys.argv[1:])]
    path, _ = suite_run("L")
    warm_compare()
    evaluate.compare(fk.load(path))  # the page cache and every specialisation
    for threads in counts:
        numba.set_num_threads(threads)
        run = fk.load(path)
        t = time.perf_counter()
        evaluate.compare(run)
        print(json.dumps({"threads": threads, "seconds": round(time.perf_counter() - t, 3),
                          "forgetkit": fk.__file__}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
