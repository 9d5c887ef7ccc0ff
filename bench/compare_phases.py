"""Where `compare`'s time goes: wall seconds of each phase of `forgetkit.compare` on the
suite's L run (E=90, N=50,000, C=1,000, float16 memmap) at a given number of numba threads.

    python -m bench.compare_phases THREADS [SIZE]   (default L; prints one JSON line)

Each phase is the summed wall time of the calls of one function (kernels and fits, nested:
ES.fit includes its kernels). The kernels are first loaded from numba's cache by the same
compare on the tiny warm-up run (`bench.common.warm_compare`), off the clock. Run it at 1 and at
16 threads on the same machine to see which phases scale.
"""

from __future__ import annotations

import json
import sys
import time

import numba

import forgetkit as fk
from forgetkit import evaluate, kernels
from forgetkit.fusion import likelihood, selection

from .common import suite_run, warm_compare

KERNELS = ("add_softmax_live_rows", "entry_needs", "move_entries", "fill_entries",
           "selection_gathered_counts", "score_recipes", "window_grid_counts",
           "mix_into", "softmax_stats", "take_samples", "em_pass")


def timed_phases():
    """Wrap the phases' functions so that each call adds its wall time to the dict returned."""
    seconds = {}

    def wrap(owner, name, label):
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)

    for name in KERNELS:
        wrap(kernels, name, name)
    wrap(fk.Run, "predictions", "forgetting pass")
    wrap(fk.KnowledgeFusion, "fit", "KF fit")
    wrap(selection.EnsembleSelection, "fit", "ES fit")
    wrap(likelihood.LikelihoodFusion, "fit", "LF fit")
    return seconds


def main(argv=None):
    args = argv or sys.argv[1:]
    threads, size = int(args[0]), (args[1] if len(args) > 1 else "L")
    numba.set_num_threads(threads)
    path, _ = suite_run(size)
    warm_compare()
    seconds = timed_phases()
    t = time.perf_counter()
    evaluate.compare(fk.load(path))
    seconds["total"] = time.perf_counter() - t
    print(json.dumps({"threads": threads, "size": size,
                      **{k: round(v, 3) for k, v in seconds.items()}}))


if __name__ == "__main__":
    sys.exit(main())
