"""Cold start: the main commands and library calls in fresh processes with an empty numba
cache, then again with the cache they left (warm), and the compile time of each kernel.

    python -m bench.bench_cold_start [--cases fuse compare ...] [--tree DIR ...] [--json OUT]

Each case runs in a new process with ``NUMBA_CACHE_DIR`` pointing at a new empty folder
(cold), then once more with that folder (warm). Beside wall time it reports the processes'
CPU time (``getrusage`` of the children): compiling is single-threaded CPU work, and wall
time on a shared machine is disturbed by the other processes on it. A listener on numba's
``numba:compile`` events (fired on a cache miss only) gives each kernel's compile time in
CPU seconds (the kernels it calls that are not inlined counted in its own).

``--tree DIR`` (repeatable) runs the cases on the forgetkit of another checkout (e.g. a
worktree of the previous commit) in the same run, for before/after figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from numba.core import event

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = "data_samples/fmnist_resnet18_clean_seed100.npz"

#: case -> (setup steps run first in the same cache, untimed; the timed step). A step is
#: ("cli", argv) or ("call", name); {tmp} is the case's scratch folder.
CASES = {
    "fuse": ([], ("cli", ["fuse", SAMPLE, "--plan", "{tmp}/p.json", "--quiet"])),
    "compare": ([], ("cli", ["compare", SAMPLE])),
    "analyze": ([], ("cli", ["analyze", SAMPLE, "--quiet"])),
    "report": ([("cli", ["analyze", SAMPLE, "--quiet"]),
                ("cli", ["fuse", SAMPLE, "--plan", "{tmp}/p.json", "--quiet"])],
               ("cli", ["report", SAMPLE, "-o", "{tmp}/r.html", "--quiet"])),
    "kf_fit": ([], ("call", "kf_fit")),
    "forget_fraction": ([], ("call", "forget_fraction")),
    "compare_call": ([], ("call", "compare")),
}


# --------------------------------------------------------------- inside the child
def _calls():
    import forgetkit as fk

    def kf_fit(run):
        val, _ = run.split(0.5, 0)
        fk.KnowledgeFusion().fit(val)

    return {"kf_fit": kf_fit, "forget_fraction": fk.forget_fraction, "compare": fk.compare}


class _CompileTimes(event.Listener):
    """numba:compile listener: CPU and wall seconds of each outermost compilation."""

    def __init__(self):
        self.depth, self.records, self._start = 0, [], None

    def on_start(self, event):
        if self.depth == 0:
            self._start = (time.process_time(), time.perf_counter())
        self.depth += 1

    def on_end(self, event):
        self.depth -= 1
        if self.depth == 0:
            disp = event.data["dispatcher"]
            func = getattr(disp, "py_func", None)
            name = (f"{func.__module__}.{func.__qualname__}" if func is not None
                    else str(disp))
            self.records.append({
                "kernel": name.removeprefix("forgetkit.kernels."),
                "args": str(event.data["args"]),
                "cpu": time.process_time() - self._start[0],
                "wall": time.perf_counter() - self._start[1]})


def child(kind, what, record_path):
    """Run one step, writing {"call_cpu", "call_wall", "compiles": [...]} to record_path."""
    times = _CompileTimes()
    event.register("numba:compile", times)
    code = 0
    cpu, wall = time.process_time(), time.perf_counter()
    if kind == "cli":
        from forgetkit.cli import main

        code = main(what)
    else:
        import forgetkit as fk

        run = fk.load(SAMPLE)
        cpu, wall = time.process_time(), time.perf_counter()
        _calls()[what[0]](run)
    with open(record_path, "w") as f:
        json.dump({"call_cpu": time.process_time() - cpu, "call_wall": time.perf_counter() - wall,
                   "compiles": times.records}, f)
    return code


# ---------------------------------------------------------------- in the parent
def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_step(step, tree, cache, tmp):
    """One step in a fresh process: dict of wall, cpu (the process's) and the child's
    record."""
    kind, what = step
    what = [w.format(tmp=tmp) for w in what] if kind == "cli" else [what]
    record = Path(tmp) / "record.json"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(what),
           str(record)]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if out.returncode:
        raise RuntimeError(f"{' '.join(what)} failed in {tree}:\n{out.stderr[-3000:]}")
    rec = json.loads(record.read_text())
    return dict(rec, wall=wall, cpu=cpu, compile_cpu=sum(c["cpu"] for c in rec["compiles"]))


def run_case(name, tree):
    setup, step = CASES[name]
    cache, tmp = tempfile.mkdtemp(prefix="nbcache-"), tempfile.mkdtemp(prefix="coldstart-")
    try:
        for s in setup:
            run_step(s, tree, cache, tmp)
        cold = run_step(step, tree, cache, tmp)
        warm = run_step(step, tree, cache, tmp)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"case": name, "tree": str(tree), "cold": cold, "warm": warm}


def _label(name):
    setup, (kind, what) = CASES[name]
    if kind == "cli":
        text = "forgetkit " + " ".join(w for w in what if "{tmp}" not in w and w != "--quiet")
        text = text.replace(SAMPLE, "clean").replace(" --plan", "").replace(" -o", "")
        return text + (" (after analyze, fuse)" if setup else "")
    return {"kf_fit": "fk.KnowledgeFusion().fit(val half)", "forget_fraction":
            "fk.forget_fraction(run)", "compare": "fk.compare(run)"}[what]


def table(results):
    lines = ["| tree | case | cold wall s | cold CPU s | of which compiling (CPU s) | "
             "warm wall s | warm CPU s | cold/warm (CPU) | kernels compiled |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, w = r["cold"], r["warm"]
        lines.append(f"| {r['tree']} | {_label(r['case'])} | {c['wall']:.1f} | {c['cpu']:.1f} "
                     f"| {c['compile_cpu']:.1f} | {w['wall']:.1f} | {w['cpu']:.1f} | "
                     f"{c['cpu'] / w['cpu']:.1f}x | {len(c['compiles'])} |")
    return "\n".join(lines)


def kernel_table(results):
    """Per kernel and tree: its compile CPU seconds (the largest over the cases that
    compiled it, which each start from an empty cache) and its signatures."""
    per = {}
    for r in results:
        for c in r["cold"]["compiles"]:
            k = (r["tree"], c["kernel"])
            best = per.setdefault(k, {"cpu": 0.0, "sigs": set()})
            best["cpu"] = max(best["cpu"], c["cpu"])
            best["sigs"].add(c["args"])
    lines = ["| tree | kernel | compile CPU s (one signature) | signatures seen |",
             "|---|---|---|---|"]
    for (tree, kernel), v in sorted(per.items(), key=lambda kv: (kv[0][0], -kv[1]["cpu"])):
        lines.append(f"| {tree} | {kernel} | {v['cpu']:.2f} | {len(v['sigs'])} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--tree", action="append", default=None,
                   help="checkout whose forgetkit runs the cases (default: this one)")
    p.add_argument("--json", metavar="OUT", help="write every record here")
    p.add_argument("--child", nargs=3, metavar=("KIND", "WHAT", "RECORD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child[0], json.loads(args.child[1]), args.child[2])
    trees = [Path(t).resolve() for t in (args.tree or [ROOT])]
    load = os.getloadavg()[0]
    results = []
    for name in args.cases:
        for tree in trees:
            results.append(run_case(name, tree))
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} cores; NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '-')}; "
          f"load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(table(results))
    print()
    print(kernel_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
