"""Memory and time of the data map and label issues on an ImageNet-sized summary run.

    python -m bench.bench_summary_scale [--epochs 90 --samples 1280000 --classes 1000]

A synthetic summary (16 bytes per epoch and sample: 1.8 GB at E=90, N=1.28M) is written
epoch by epoch with `forgetkit.io.summary.SummaryWriter` (durable=False: the operating
system flushes) under bench/data/; then `fk.data_map(fk.load(path))` and
`fk.label_issues(fk.load(path))` each run in a fresh process, loading included. Memory is
the peak anonymous RSS (RssAnon: the memmap's file pages are reclaimable and not counted).

The records: the label's logit rises over the epochs (20% of the samples, "mislabelled",
stay low), the largest other class is the sample's usual confuser at 70% of the epochs and
a random class otherwise (so that the label-issues pass meets more classes than it tracks),
and the log-sum-exp leaves 998 further classes each below the largest other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from .common import DATA, cat_seconds, machine, peak_rss_anon, rss_anon_mb

TASKS = ("data_map", "label_issues")


def write_summary(path, n_epochs, n_samples, n_classes, *, seed=0):
    """The synthetic summary at ``path`` (kept when it already holds every epoch)."""
    import forgetkit as fk
    from forgetkit.io.summary import SummaryWriter
    from forgetkit.kinds.summary import SUMMARY_DTYPE

    if path.exists():
        try:
            run = fk.load(path)
            if run.outputs.shape == (n_epochs, n_samples, n_classes):
                return 0.0
        except Exception:  # noqa: BLE001 - rewritten below
            pass
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n_samples)
    confuser = (labels + rng.integers(1, n_classes, n_samples)) % n_classes
    noisy = rng.random(n_samples) < 0.2
    rest = np.log(n_classes - 2.0)
    records = np.empty(n_samples, dtype=SUMMARY_DTYPE)
    start = time.perf_counter()
    with SummaryWriter(path, n_samples, n_classes, labels=labels, mode="w",
                       durable=False) as w:
        for e in range(n_epochs):
            rise = 4.0 * e / max(n_epochs - 1, 1)
            label = rng.normal(np.where(noisy, -1.0, rise), 1.0).astype(np.float32)
            other = rng.normal(np.where(noisy, 1.0 + rise / 2, 0.5), 1.0).astype(np.float32)
            random_other = (labels + rng.integers(1, n_classes, n_samples)) % n_classes
            other_class = np.where(rng.random(n_samples) < 0.7, confuser, random_other)
            below = other.astype(np.float64) - 2.0 + rest  # the other classes' log-sum-exp
            lse = np.logaddexp(np.logaddexp(label, other), below)
            records["label"], records["other"] = label, other
            records["other_class"], records["lse"] = other_class, lse
            w.append(e, records)
    return time.perf_counter() - start


def child(path, task):
    import forgetkit as fk

    tiny = fk.summarize(fk.Run(np.zeros((2, 3, 4), np.float32), [0, 1, 2]))
    fk.data_map(tiny), fk.label_issues(tiny)  # imports outside the measurement
    start = rss_anon_mb()
    with peak_rss_anon() as mem:
        t = time.perf_counter()
        getattr(fk, task)(fk.load(path))
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "peak_mb": mem["peak_mb"], "start_mb": start}))


def measure(path, task):
    out = subprocess.run([sys.executable, "-m", "bench.bench_summary_scale", "--child",
                          str(path), task], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{task} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--samples", type=int, default=1_280_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    e, n, c = args.epochs, args.samples, args.classes
    DATA.mkdir(exist_ok=True)
    path = DATA / f"summary_{e}x{n}x{c}.npy"
    written = write_summary(path, e, n, c, seed=5)
    size_mb = path.stat().st_size / 2**20
    cat_seconds(path)  # warm the page cache
    floor = cat_seconds(path)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; command: python -m "
          f"bench.bench_summary_scale {' '.join(sys.argv[1:])}".rstrip())
    print(f"summary: E={e}, N={n:,}, C={c}, {size_mb:.0f} MB on disk"
          + (f" (written in {written:.0f} s)" if written else " (reused)")
          + f"; cat (I/O floor): {floor:.2f} s")
    print("| pass (load included) | wall s | peak RssAnon MB | before the pass MB |")
    print("|---|---|---|---|")
    for task in TASKS:
        r = min((measure(path, task) for _ in range(args.repeat)), key=lambda r: r["seconds"])
        print(f"| fk.{task}(fk.load(path)) | {r['seconds']:.1f} | {r['peak_mb']:.0f} | "
              f"{r['start_mb']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
