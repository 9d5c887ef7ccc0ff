"""Two trees' certified fusion on one top-k run in one process, interleaved.

    python -m bench.ab_topk --base TREE [--run RUN] [--tile 40] [--repeat 7]
        [--tasks forget,fit,selection] [--kernels]

Separate processes of this machine (and of a lent host) differ by 10-20% in speed, more
than a kernel change often moves a task. Here the ``forgetkit`` package of another source
tree ``TREE`` (e.g. ``git archive <commit> forgetkit | tar -x -C TREE``) is copied to a
temporary folder as the package ``fk_base`` and imported beside this tree's ``forgetkit``;
each task (the forgetting pass, `KnowledgeFusion().fit`, `EnsembleSelection().fit`) runs on
a new run of the records of ``--run`` tiled ``--tile`` times (the GPT-2 sample by default),
base then this tree, ``--repeat`` rounds: best CPU seconds of each, its ratio to the same
tree's forgetting pass, and this tree's over the base's. Both compile on the untiled run
first (`bench.bench_topk_tiled.warm`). The plans and picks of the last round are compared
(they must be equal). With ``--kernels``, also each kernel's CPU seconds within the
fit and the selection (every call summed, the best round of each) in both trees.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import importlib
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from .bench_topk_tiled import SAMPLE, tiler, time_kernels, warm

TASKS = ("forget", "fit", "selection")


def _import_base(tree):
    """``tree``'s forgetkit package, imported as ``fk_base`` from a temporary copy."""
    home = Path(tempfile.mkdtemp(prefix="ab_topk_"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    shutil.copytree(Path(tree) / "forgetkit", home / "fk_base",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(home))
    return importlib.import_module("fk_base")


def _task(pkg, name, run):
    if name == "forget":
        return pkg.forget_fraction(run)
    if name == "fit":
        return pkg.KnowledgeFusion().fit(run).plan_
    return pkg.EnsembleSelection().fit(run).selection_


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="a source tree holding forgetkit/")
    p.add_argument("--run", default=str(SAMPLE))
    p.add_argument("--tile", type=int, default=40)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--kernels", action="store_true",
                   help="also each kernel's CPU seconds in the fit and the selection")
    args = p.parse_args(argv)
    tasks = args.tasks.split(",")
    import forgetkit as fk

    base = _import_base(args.base)
    trees = {"base": base, "this": fk}
    spent = collections.Counter()  # (tree, kernel): CPU seconds of the task timed now
    if args.kernels:
        for name, pkg in trees.items():
            time_kernels(importlib.import_module(pkg.__name__ + ".kernels.jit"),
                         partial(_add, spent, name))
    per_kernel = {}  # (tree, task, kernel): best seconds
    new_run = {}
    for name, pkg in trees.items():
        small = pkg.load(args.run)
        warm(pkg, *(partial(_task, pkg, task, small) for task in tasks))
        new_run[name] = tiler(fk.load(args.run), args.tile, pkg)
    best = {(name, task): float("inf") for name in trees for task in tasks}
    plans = {}
    for _ in range(args.repeat):
        for name, pkg in trees.items():
            for task in tasks:
                run = new_run[name]()
                spent.clear()
                start = time.process_time()
                out = _task(pkg, task, run)
                best[name, task] = min(best[name, task], time.process_time() - start)
                for (tree, kernel), seconds in spent.items():
                    key = (tree, task, kernel)
                    per_kernel[key] = min(per_kernel.get(key, float("inf")), seconds)
                if task != "forget":
                    plans[name, task] = out
    print(f"{fk.load(args.run).n_samples * args.tile} tokens; base {base.__file__}, this "
          f"{fk.__file__}; best CPU s of {args.repeat}")
    for name in trees:
        unit = best[name, "forget"] if "forget" in tasks else 1.0
        print(f"{name:5s}", "  ".join(f"{t} {best[name, t]:.3f} s ({best[name, t] / unit:.1f}x)"
                                      for t in tasks))
    print("this / base", "  ".join(f"{t} {best['this', t] / best['base', t]:.2f}"
                                   for t in tasks))
    for task in tasks:
        if task != "forget":
            print(f"same {task} result:", plans["base", task] == plans["this", task])
    for task in tasks:
        names = sorted({k for _, t, k in per_kernel if t == task})
        for kernel in names if task != "forget" else ():
            a, b = (per_kernel.get((tree, task, kernel), float("nan")) for tree in trees)
            print(f"  {task} {kernel:22s} base {a:.3f} s  this {b:.3f} s  this / base "
                  f"{b / a:.2f}")


def _add(spent, tree, kernel, seconds):
    spent[tree, kernel] += seconds


if __name__ == "__main__":
    main()
