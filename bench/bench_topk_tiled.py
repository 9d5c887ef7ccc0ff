"""Certified fusion on a real token run, as ratios to its forgetting pass.

    python -m bench.bench_topk_tiled [--tile 40] [--repeat 5] [--tasks fit,certified,...]
        [--run RUN]

The GPT-2 sample run (data_samples/lm_fortunes_gpt2_heldout_top8.npy: 26 checkpoints x
3,048 tokens, k = 8, vocabulary 8,192) tiled ``--tile`` times along its tokens (each copy's
sequence ids shifted): real per-token candidate sets, which are wider than the synthetic
records of `bench.bench_topk_fusion`; ``--run`` another top-k run (``--tile 1``: as it is).
In one process, kernels compiled first on the run itself (`warm`): CPU and wall seconds,
each the best of ``--repeat`` rounds of every task in turn (`interleaved`), of the
forgetting pass (`fk.forget_fraction`), `KnowledgeFusion().fit`, `certified_accuracy` of
the fitted plan, `EnsembleSelection().fit`, `LikelihoodFusion().fit` and `fk.label_issues`
(which refuses a token run: its message is printed), each also as a ratio to the
forgetting pass.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .common import machine

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / \
    "lm_fortunes_gpt2_heldout_top8.npy"


#: The timed tasks (``--tasks``).
TASKS = ("fit", "certified", "selection", "likelihood", "label_issues")


def tiler(run, copies, package=None):
    """A callable giving a new Run (nothing cached) of ``run``'s tokens repeated ``copies``
    times, each copy's sequence ids shifted; a Run of ``package`` (another tree's forgetkit
    imported under another name, as `bench.ab_topk` does; default: forgetkit)."""
    import importlib

    import forgetkit as fk
    from forgetkit.kinds import kind_of

    package = fk if package is None else package
    outputs = importlib.import_module(package.__name__ + ".kinds.topk").TopKOutputs
    records = np.tile(np.asarray(kind_of(run).read_records(run)), (1, copies))
    shift = int(run.sequence_ids.max()) + 1
    sequences = np.concatenate([run.sequence_ids + shift * i for i in range(copies)])
    positions, labels = np.tile(run.positions, copies), np.tile(run.labels, copies)
    return lambda: package.Run(outputs(records, run.n_classes, sequences, positions), labels,
                               kind="topk", epochs=run.epochs)


def warm(package, *tasks):
    """Run each of ``tasks`` (callables) once with every kernel compiled
    (``package.kernels.forced("serial")``: no numpy twin taken, see `forgetkit.kernels.jit`),
    then once as the work decides: the timed calls after find their kernels warm, as after
    ``forgetkit warmup``. A plain first call leaves a kernel with a twin uncompiled where its
    calls are small (a fit's label leads: some 1.5 forgetting passes on the real run)."""
    for task in tasks:
        with package.kernels.forced("serial"):
            task()
        task()


def time_kernels(jit, record):
    """Wrap ``jit.run`` (a forgetkit tree's ``kernels.jit``) so that every kernel call
    reports record(kernel name, its CPU seconds)."""
    run_kernel = jit.run

    def timed(kernel, n_threads, args):
        start = time.process_time()
        try:
            return run_kernel(kernel, n_threads, args)
        finally:
            record(kernel.__name__, time.process_time() - start)

    jit.run = timed


def cpu_seconds(fn, new_run, repeat):
    """Best (CPU, wall) seconds of ``fn(run)`` over ``repeat`` calls, each on a new run."""
    return interleaved({"task": fn}, new_run, repeat)["task"]


def interleaved(tasks, new_run, repeat):
    """{name: ((best CPU, best wall) seconds, the last result)} of each of ``tasks`` ({name:
    fn(run)}), run in ``repeat`` rounds of every task in turn, each call on a new run: a
    slow minute of the machine then slows one round of every task, not every call of one."""
    best = {name: (float("inf"), float("inf"), None) for name in tasks}
    for _ in range(repeat):
        for name, fn in tasks.items():
            run = new_run()
            cpu, wall = time.process_time(), time.perf_counter()
            out = fn(run)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            best[name] = (min(best[name][0], cpu), min(best[name][1], wall), out)
    return {name: ((cpu, wall), out) for name, (cpu, wall, out) in best.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tile", type=int, default=40)
    p.add_argument("--run", default=str(SAMPLE), help="a top-k run (default: the sample)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tasks", default=",".join(TASKS),
                   help=f"comma-separated, of {', '.join(TASKS)} (default: all)")
    args = p.parse_args(argv)
    tasks = args.tasks.split(",")
    import forgetkit as fk

    sample = fk.load(args.run)
    warm(fk, lambda: fk.forget_fraction(sample),
         lambda: fk.KnowledgeFusion().fit(sample).certified_accuracy(sample),
         lambda: fk.EnsembleSelection().fit(sample), lambda: fk.LikelihoodFusion().fit(sample))
    new_run = tiler(sample, args.tile)
    kf = fk.KnowledgeFusion().fit(new_run())  # the plan whose accuracy is certified
    timed = {"forgetting pass": fk.forget_fraction,
             "KnowledgeFusion().fit": lambda r: fk.KnowledgeFusion().fit(r),
             "certified_accuracy": kf.certified_accuracy,
             "EnsembleSelection().fit": lambda r: fk.EnsembleSelection().fit(r),
             "LikelihoodFusion().fit": lambda r: fk.LikelihoodFusion().fit(r)}
    chosen = {"forgetting pass"} | {name for name, task in zip(
        list(timed)[1:], ("fit", "certified", "selection", "likelihood"), strict=True)
        if task in tasks}
    results = interleaved({k: v for k, v in timed.items() if k in chosen}, new_run,
                          args.repeat)
    rows = {name: seconds for name, (seconds, _) in results.items()}
    issues = None
    if "label_issues" in tasks:
        rows["label_issues"], issues = cpu_seconds(_label_issues, new_run, 1)
    base = rows["forgetting pass"]
    run = new_run()
    print(json.dumps({"machine": machine(), "tokens": run.n_samples,
                      "checkpoints": run.n_epochs, "plan": kf.plan_,
                      "label_issues": issues, "rows": {
                          k: {"cpu_s": round(v[0], 3), "x_forgetting": round(v[0] / base[0], 1),
                              "wall_s": round(v[1], 3),
                              "x_forgetting_wall": round(v[1] / base[1], 1)}
                          for k, v in rows.items()}}, indent=1))


def _label_issues(run):
    """`fk.label_issues` of ``run``: its flagged count, or the message of its refusal."""
    import forgetkit as fk

    try:
        return int(fk.label_issues(run)["is_issue"].sum())
    except fk.ForgetkitError as refused:
        return f"refused: {refused}"


if __name__ == "__main__":
    main()
