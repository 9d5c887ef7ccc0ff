"""Scaling with cores: the forgetting pass, the Knowledge Fusion fit and `compare` at 1, 2,
4, 8, 16 numba threads on a synthetic float16 memory-mapped run.

    python -m bench.bench_scaling [--size L] [--threads 1 2 4 8 16] [--tasks ...] [--out DIR]

Sizes as in the suite (S, M, L; default L: E=90, N=50,000, C=1,000, 9 GB), written once into
bench/data/ by `bench.common.write_synthetic_npy` (the suite's files, reused). Each
measurement runs in a fresh process that calls ``numba.set_num_threads(t)`` (BLAS limited to
t threads too) and first runs the task on a tiny run (loading every kernel from numba's
on-disk cache, a fixed cost of a few seconds, off the clock), then times it on a freshly
loaded memmap with a warm page cache; its peak RssAnon is sampled from outside the process.
Prints a markdown table (wall seconds, speed-up over 1 thread, efficiency) with the I/O
floor (``cat file > /dev/null``), and writes the rows as JSON and the table as markdown
under ``--out`` after every measurement (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import SIZES, cat_seconds, machine, rss_anon_mb, suite_run, warm_compare, warm_run

TASKS = ("forgetting", "kf_fit", "compare")
LABELS = {"forgetting": "forgetting pass (F_e, L_e, per-sample stats)",
          "kf_fit": "KF(inf) fit on the validation half",
          "compare": "compare (3 splits, 8 methods)"}


# ----------------------------------------------------------------- measurements
def _task(task, path):
    """Run ``task`` on the run at ``path``; returns the seconds it took."""
    import forgetkit as fk

    run = fk.load(path)
    t = time.perf_counter()
    if task == "forgetting":
        fk.forget_fraction(run), fk.learn_fraction(run), fk.sample_dynamics(run)
    elif task == "warm":  # every path compare takes on a large run, in memory and streamed
        warm_compare(path)
    elif task == "kf_fit":
        val, _ = run.split(0.5, seed=0)
        t = time.perf_counter()
        fk.KnowledgeFusion().fit(val)
    else:
        fk.compare(run)
    return time.perf_counter() - t


def child(task, path, threads):
    import numba

    numba.set_num_threads(int(threads))
    if task != "warm":  # load the kernels from numba's cache off the clock (a fixed cost)
        from forgetkit.kernels import forced

        with forced("parallel"):  # every kernel loaded (one build each, on every thread)
            _task("warm" if task == "compare" else task, warm_run())
    print(json.dumps({"seconds": _task(task, path), "threads": numba.get_num_threads()}))


def measure(task, path, threads, timeout):
    """Run ``task`` in a child process with ``threads`` threads; its peak RssAnon over its
    whole life (imports and the warm-up run included) is sampled every 5 ms from this
    process, so no thread of the child's own competes with its kernels."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "bench.bench_scaling", "--child", task,
                                  str(path), str(threads)], stdout=out, stderr=err, env=env)
        peak, deadline = 0.0, time.monotonic() + timeout
        try:
            while child.poll() is None:
                mb = rss_anon_mb(child.pid)
                peak = max(peak, mb) if mb == mb else peak  # nan once it has exited
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(child.args, timeout)
                time.sleep(0.005)
        finally:
            child.kill()
            child.wait()
        out.seek(0), err.seek(0)
        if child.returncode:
            raise RuntimeError(f"{task} at {threads} threads failed:\n{err.read()[-2000:]}")
        return dict(json.loads(out.read().strip().splitlines()[-1]), peak_mb=peak)


def warm(path):
    """Compile the kernels into numba's cache (a tiny run, every task, compare also with
    the budgets that make it stream), off the clock."""
    small = warm_run()
    for task in TASKS + ("warm",):
        measure(task, small, 1, timeout=600)
    cat_seconds(path)  # warm the page cache


# ------------------------------------------------------------------------ table
def table(rows, floor, gb, header):
    threads = sorted({r["threads"] for r in rows})
    lines = [header, "",
             f"I/O floor (`cat` of the {gb:.2f} GB run, warm cache): {floor:.2f} s "
             f"({gb / floor:.1f} GB/s)", "",
             "| task | " + " | ".join(f"{t} thr s" for t in threads)
             + f" | speed-up at {threads[-1]} | efficiency at {threads[-1]} | peak RssAnon MB |",
             "|---|" + "---|" * (len(threads) + 3)]
    for task in TASKS:
        mine = {r["threads"]: r for r in rows if r["task"] == task}
        if not mine:
            continue
        base = mine.get(threads[0])
        cells = [f"{mine[t]['seconds']:.2f} ({base['seconds'] / mine[t]['seconds']:.1f}x)"
                 if t in mine and base else "" for t in threads]
        top = mine.get(threads[-1])
        speedup = base["seconds"] / top["seconds"] if top and base else float("nan")
        peak = max(r["peak_mb"] for r in mine.values())
        lines.append(f"| {LABELS[task]} | " + " | ".join(cells)
                     + f" | {speedup:.1f}x | {speedup / threads[-1]:.0%} | {peak:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="L", choices=list(SIZES))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--repeat", type=int, default=1, help="best of this many runs per point")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per measurement")
    p.add_argument("--out", default="bench/results", help="folder of the JSON and markdown")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    import numba

    n_epochs, n_samples, n_classes = SIZES[args.size]
    path, gb = suite_run(args.size)
    usable = [t for t in args.threads if t <= numba.config.NUMBA_NUM_THREADS]
    skipped = sorted(set(args.threads) - set(usable))
    warm(path)
    floor = min(cat_seconds(path) for _ in range(2))
    header = (f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; size {args.size} "
              f"(E={n_epochs}, N={n_samples}, C={n_classes}, float16 memmap); command: "
              f"python -m bench.bench_scaling {' '.join(sys.argv[1:])}"
              + (f"; skipped {skipped} threads (NUMBA_NUM_THREADS="
                 f"{numba.config.NUMBA_NUM_THREADS})" if skipped else ""))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in args.tasks:
        for threads in usable:
            best = min((measure(task, path, threads, args.timeout) for _ in range(args.repeat)),
                       key=lambda r: r["seconds"])
            rows.append(dict(best, task=task, threads=threads, size=args.size))
            print(f"{task} at {threads} threads: {best['seconds']:.2f} s", file=sys.stderr,
                  flush=True)
            text = table(rows, floor, gb, header)
            (out / f"scaling_{args.size}.json").write_text(json.dumps(
                {"machine": machine(), "floor_seconds": floor, "gb": gb, "rows": rows},
                indent=1))
            (out / f"scaling_{args.size}.md").write_text(text + "\n")
    print(table(rows, floor, gb, header))


if __name__ == "__main__":
    sys.exit(main())
