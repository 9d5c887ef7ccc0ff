"""Where a top-k run's fit or selection goes: the CPU seconds of each kernel (every call of
it summed, both threads' time), the rest as Python, each as a ratio to the run's forgetting
pass (best CPU seconds of REPEAT rounds of both, each on a new copy of the run), and the
system's part of the task (mostly the page faults of its new arrays).

    python -m bench.topk_breakdown RUN TILE fit|selection [REPEAT]

RUN: a top-k run, tiled TILE times (`bench.bench_topk_tiled.tiler`). The kernels are
compiled on the run itself first, off the clock (`bench.bench_topk_tiled.warm`).
"""

from __future__ import annotations

import collections
import resource
import sys
import time

import forgetkit as fk
from forgetkit.kernels import jit

from .bench_topk_tiled import tiler, time_kernels, warm

TASKS = {"fit": lambda run: fk.KnowledgeFusion().fit(run),
         "selection": lambda run: fk.EnsembleSelection().fit(run)}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path, tile, task = argv[0], int(argv[1]), TASKS[argv[2]]
    repeat = int(argv[3]) if len(argv) > 3 else 5
    seconds, calls = collections.Counter(), collections.Counter()

    def record(kernel, spent):
        seconds[kernel] += spent
        calls[kernel] += 1

    time_kernels(jit, record)
    source = fk.load(path)
    warm(fk, lambda: task(source), lambda: fk.forget_fraction(source))  # off the clock
    new = tiler(source, tile, fk)

    def cpu(fn, run):
        """(CPU seconds, of them the system's: page faults of new arrays) of fn(run)."""
        start, sys_start = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        fn(run)
        return (time.process_time() - start,
                resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys_start.ru_stime)

    forget, best = float("inf"), None
    for _ in range(repeat):  # in turn: a slow minute slows one round of both
        forget = min(forget, cpu(fk.forget_fraction, new())[0])
        run = new()
        seconds.clear()
        calls.clear()
        total, system = cpu(task, run)
        if best is None or total < best[0]:
            best = (total, system, dict(seconds), dict(calls))
    total, system, kernel_s, n_calls = best
    print(f"forgetting pass {forget:.4f} s; {argv[2]} {total:.3f} s = {total / forget:.1f}x "
          f"(system {system:.3f} s = {system / forget:.1f}x)")
    for name, s in sorted(kernel_s.items(), key=lambda item: -item[1]):
        print(f"  {name:28s} {s:.3f} s {s / forget:5.1f}x  calls {n_calls[name]}")
    rest = total - sum(kernel_s.values())
    print(f"  {'Python':28s} {rest:.3f} s {rest / forget:5.1f}x")


if __name__ == "__main__":
    main()
