"""Memory and time of the training-dynamics passes on a large float16 NPY run on disk.

    python -m bench.bench_dynamics [--epochs 20 --samples 1000000 --classes 10]

`fk.data_map` and `fk.label_issues` each run in a fresh process on a synthetic run written
by `RunWriter` (memory-mapped, streamed epoch by epoch); memory is the peak anonymous RSS
(RssAnon: the memmap's file pages are reclaimable and not counted). For scale, the table
also gives the run's size on disk and the float64 probabilities of every epoch, which a
pass holding the whole tensor in memory would need, and `cat file > /dev/null`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from .common import DATA, cat_seconds, machine, peak_rss_anon, rss_anon_mb, write_synthetic_npy

TASKS = ("data_map", "label_issues")


def child(path, task):
    import forgetkit as fk

    # compile (or load from numba's cache) outside the measurement
    tiny = fk.Run(np.zeros((2, 3, 4), np.float16), [0, 1, 2])
    fk.label_issues(tiny)
    run = fk.load(path)
    start = rss_anon_mb()
    with peak_rss_anon() as mem:
        t = time.perf_counter()
        getattr(fk, task)(run)
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "peak_mb": mem["peak_mb"], "start_mb": start}))


def measure(path, task):
    out = subprocess.run([sys.executable, "-m", "bench.bench_dynamics", "--child", str(path),
                          task], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{task} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    e, n, c = args.epochs, args.samples, args.classes
    path = write_synthetic_npy(DATA / f"dynamics_{e}x{n}x{c}.npy", e, n, c, seed=3, noise=0.2)
    cat_seconds(path)  # warm the page cache
    floor = min(cat_seconds(path) for _ in range(2))
    disk_mb, f64_mb = e * n * c * 2 / 2**20, e * n * c * 8 / 2**20
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; command: python -m "
          f"bench.bench_dynamics {' '.join(sys.argv[1:])}".rstrip())
    print(f"run: E={e}, N={n:,}, C={c}, float16 NPY {disk_mb:.0f} MB on disk (float64 "
          f"probabilities of every epoch: {f64_mb:.0f} MB); cat (I/O floor): {floor:.2f} s")
    print("| pass | wall s | peak RssAnon MB | before the pass MB | added per sample (bytes) |")
    print("|---|---|---|---|---|")
    for task in TASKS:
        r = min((measure(path, task) for _ in range(2)), key=lambda r: r["seconds"])
        added = (r["peak_mb"] - r["start_mb"]) * 2**20 / n
        print(f"| fk.{task} | {r['seconds']:.2f} | {r['peak_mb']:.0f} | {r['start_mb']:.0f} | "
              f"{added:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
