"""The correctness pass (argmax per epoch and sample) on a float16 NPY run on disk.

Compares forgetkit's numba kernel with numpy's argmax over the same memory-mapped chunks and
with `cat file > /dev/null` (one sequential read). Each pass runs in a fresh subprocess so
that peak anonymous memory (RssAnon, the memory a streaming pass really holds) is its own.

    python -m bench.bench_forgetting [--epochs 100 --samples 10000 --classes 1000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from .common import DATA, cat_seconds, machine, peak_rss_anon, write_synthetic_npy


def numpy_pass(run):
    """Straightforward numpy: argmax over classes of each chunk of epochs."""
    from forgetkit.run import epoch_chunks

    out = np.empty(run.shape[:2], dtype=np.int64)
    per_epoch = run.n_samples * run.n_classes * run.outputs.itemsize
    for start, stop in epoch_chunks(run.n_epochs, per_epoch):
        out[start:stop] = np.argmax(run.outputs[start:stop], axis=-1)
    return out == run.labels


def child(path, method):
    import forgetkit as fk
    from forgetkit import kernels

    # compile outside the timing (numba caches to disk; this makes sure)
    kernels.argmax_rows(np.zeros((2, 3), np.float16), np.empty(2, np.int32))
    run = fk.load(path)
    with peak_rss_anon() as mem:
        t = time.perf_counter()
        if method == "numba":
            fk.forget_fraction(run)
        else:
            numpy_pass(run)
        secs = time.perf_counter() - t
    print(json.dumps({"seconds": secs, "peak_rss_anon_mb": mem["peak_mb"]}))


def measure(path, method):
    out = subprocess.run([sys.executable, "-m", "bench.bench_forgetting", "--child", str(path),
                          method], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--samples", type=int, default=10000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    rows = []
    for n_epochs in (args.epochs // 2, args.epochs):
        path = write_synthetic_npy(DATA / f"forget_{n_epochs}x{args.samples}x{args.classes}.npy",
                                   n_epochs, args.samples, args.classes)
        gb = n_epochs * args.samples * args.classes * 2 / 1e9
        cat_seconds(path)  # warm the page cache
        floor = min(cat_seconds(path) for _ in range(2))
        numba = min((measure(path, "numba") for _ in range(2)), key=lambda r: r["seconds"])
        numpy_ = measure(path, "numpy")
        rows.append((n_epochs, gb, floor, numba, numpy_))
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}")
    print("| E | GB | cat (floor) s | numba s | numba GB/s | numpy s | numba vs numpy | "
          "numba vs floor | peak RssAnon numba / numpy MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n_epochs, gb, floor, nb, npy in rows:
        print(f"| {n_epochs} | {gb:.2f} | {floor:.2f} | {nb['seconds']:.2f} | "
              f"{gb / nb['seconds']:.1f} | {npy['seconds']:.2f} | "
              f"{npy['seconds'] / nb['seconds']:.1f}x faster | "
              f"{floor / nb['seconds']:.2f}x floor speed | "
              f"{nb['peak_rss_anon_mb']:.0f} / {npy['peak_rss_anon_mb']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
