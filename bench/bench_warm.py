"""First-run and warm speed of the kernels' passes at three sizes, on two or more trees.

    python -m bench.bench_warm --tree OLD --tree NEW [--sizes sample cifar L]
                               [--tasks kf_fit forgetting data_map label_issues compare]
                               [--repeat 3] [--rounds 1] [--json OUT]

For each size and tree: a new empty ``NUMBA_CACHE_DIR``; a first process (cold: the cache
is empty) runs the tasks in order, each once, timed with its compiling; then a second
process (warm: the cache the first left, no ``forgetkit warmup``; it starts once the
background compile the first process left, if any, has ended: ``settle`` s) runs each task
``--repeat`` times: its first call (the kernels loaded from the cache) and the best of
all; beside wall seconds, the process's CPU seconds (all its threads: on a shared machine,
what the first call compiles shows there undisturbed). The trees alternate within each
size; ``--rounds`` repeats the whole (the best of the rounds is kept). Each task runs on a
new `Run` (the forgetting pass is kept on a run).

Sizes: ``sample`` the clean sample run (60 x 10,000 x 10, float16, in memory);
``cifar`` the CIFAR-100 test size of the paper's main setting (60 x 10,000 x 100, float32
logits in memory, `bench.common.synthetic_logits`, written once to bench/data/);
``L`` the suite's L run (90 x 50,000 x 1,000 float16 memmap, 9 GB: for a lent host);
``XS`` the suite's XS run (40 x 5,000 x 100 float16 memmap: a quick check of a command).
Prints a markdown table of seconds and new / first-tree ratios; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data_samples" / "fmnist_resnet18_clean_seed100.npz"
TASKS = ("kf_fit", "forgetting", "data_map", "label_issues", "compare")


# --------------------------------------------------------------- inside the child
def _run_maker(size):
    """A function returning a new Run of ``size`` (its data read once)."""
    import numpy as np

    import forgetkit as fk

    if size == "sample":
        base = fk.load(SAMPLE)
        values, labels = np.asarray(base.outputs), base.labels
        return lambda: fk.Run(values, labels)
    if size == "cifar":
        data = ROOT / "bench" / "data"
        values = np.load(data / "cifar_f32.npy")
        labels = np.load(data / "cifar_labels.npy")
        return lambda: fk.Run(values, labels)
    path = ROOT / "bench" / "data" / f"suite_{size}.npy"  # written by the parent (`prepare`)
    return lambda: fk.load(path)


def _task(name, run):
    import forgetkit as fk

    if name == "kf_fit":
        fk.KnowledgeFusion().fit(run)
    elif name == "forgetting":
        fk.forget_fraction(run), fk.learn_fraction(run), fk.sample_dynamics(run)
    elif name == "data_map":
        fk.data_map(run)
    elif name == "label_issues":
        fk.label_issues(run)
    else:
        fk.compare(run)


def child(size, tasks, repeat):
    """Time each task ``repeat`` times in this process; prints one JSON line."""
    import numba

    import forgetkit as fk

    make = _run_maker(size)
    out = {"forgetkit": fk.__file__, "threads": numba.get_num_threads()}
    for name in tasks:
        times, cpu = [], []
        for _ in range(repeat):
            run = make()
            t, c = time.perf_counter(), time.process_time()
            _task(name, run)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        out[name], out[f"{name}_cpu"] = times, cpu
    print(json.dumps(out))


# ---------------------------------------------------------------- in the parent
def prepare(sizes):
    """Write the runs of ``sizes`` once: the suite's runs (L, XS), the cifar-sized one
    (bench/data/cifar_f32.npy and its labels)."""
    import numpy as np

    from bench.common import SIZES, suite_run, synthetic_logits

    for size in sizes:
        if size in SIZES:
            suite_run(size)
    if "cifar" not in sizes:
        return

    data = ROOT / "bench" / "data"
    if (data / "cifar_f32.npy").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    labels, epochs = synthetic_logits(60, 10_000, 100, seed=7, noise=0.1)
    values = np.empty((60, 10_000, 100), dtype=np.float32)
    for e, x in epochs:
        values[e] = x
    np.save(data / "cifar_labels.npy", labels)
    np.save(data / "cifar_f32.npy", values)


def process(tree, cache, size, tasks, repeat):
    path = os.pathsep.join([str(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=path)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", size, ",".join(tasks),
           str(repeat)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{size} on {tree} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["forgetkit"].startswith(str(tree)):
        raise RuntimeError(f"{tree}: the child imported {result['forgetkit']}")
    return result


def settled(timeout=600):
    """Wait until no background compile (``forgetkit.kernels --later``, started at the exit
    of a process whose twins ran) is running; returns the seconds waited."""
    t = time.perf_counter()
    time.sleep(1.0)  # the detached process starts after its parent's exit
    while time.perf_counter() - t < timeout and subprocess.run(
            ["pgrep", "-f", "forgetkit.kernels --later"], capture_output=True).returncode == 0:
        time.sleep(0.5)
    return time.perf_counter() - t


def measure(tree, size, tasks, repeat):
    """{task: {cold, warm_first, warm_best}} of one tree and size, in a new cache."""
    cache = tempfile.mkdtemp(prefix="nbcache-warm-")
    try:
        cold = process(tree, cache, size, tasks, 1)
        settle = settled()
        warm = process(tree, cache, size, tasks, repeat)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {name: {"settle": settle, "cold": cold[name][0], "cold_cpu": cold[f"{name}_cpu"][0],
                   "warm_first": warm[name][0], "warm_best": min(warm[name]),
                   "warm_best_cpu": min(warm[f"{name}_cpu"])} for name in tasks} | {
        "threads": warm["threads"]}


def table(rows, trees):
    base = trees[0]
    lines = ["| size | task | " + " | ".join(
        f"{Path(t).name}: cold s (CPU), warm first s, warm best s (CPU)" for t in trees)
        + " | warm best / first tree's | cold / first tree's |",
        "|---|---|" + "---|" * (len(trees) + 2)]
    for (size, task), per in rows.items():
        cells = [f"{per[t]['cold']:.3f} ({per[t].get('cold_cpu', float('nan')):.2f}), "
                 f"{per[t]['warm_first']:.3f}, {per[t]['warm_best']:.3f} "
                 f"({per[t].get('warm_best_cpu', float('nan')):.2f})" for t in trees]
        warm = ", ".join(f"{per[t]['warm_best'] / per[base]['warm_best']:.2f}"
                         for t in trees[1:])
        cold = ", ".join(f"{per[t]['cold'] / per[base]['cold']:.2f}" for t in trees[1:])
        lines.append(f"| {size} | {task} | " + " | ".join(cells) + f" | {warm} | {cold} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=False, default=[],
                   help="a checkout's root (repeatable; the first is the baseline)")
    p.add_argument("--sizes", nargs="+", default=["sample", "cifar"],
                   choices=["sample", "cifar", "L", "XS"])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child[0], args.child[1].split(","), int(args.child[2]))
    trees = [str(Path(t).resolve()) for t in (args.tree or [ROOT])]
    prepare(args.sizes)
    rows = {}
    for _ in range(args.rounds):
        for size in args.sizes:
            for tree in trees:
                t = time.perf_counter()
                got = measure(tree, size, args.tasks, args.repeat)
                print(f"{size} {Path(tree).name}: {time.perf_counter() - t:.0f} s, "
                      f"{got['threads']} threads", file=sys.stderr, flush=True)
                for task in args.tasks:
                    best = rows.setdefault((size, task), {}).get(tree)
                    rows[size, task][tree] = got[task] if best is None else {
                        k: min(best[k], got[task][k]) for k in best}
                if args.json:
                    Path(args.json).write_text(json.dumps(
                        [{"size": s, "task": k, "tree": t, **v}
                         for (s, k), per in rows.items() for t, v in per.items()], indent=1))
    print(table(rows, trees))


if __name__ == "__main__":
    sys.exit(main())
