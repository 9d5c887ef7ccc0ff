"""The cost of durable appends: `RunWriter` with and without fsync.

Appends E epochs of N x C float16 outputs, with ``durable=True`` (every epoch flushed to disk,
with its record and folder, before `append` returns) and ``durable=False`` (the operating
system flushes when it likes), for NPY and Parquet, in the same process, alternating the
two so that both see the same machine state; each configuration's figure is its best of
``--repeat`` runs. The Parquet time includes `close` (the merge of the staged epochs).

    python -m bench.bench_durability [--epochs 50 --samples 10000 --classes 100 --repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import DATA, machine


def append_run(path, outputs, labels, durable):
    """Seconds to write ``outputs`` (E, N, C) epoch by epoch, `close` included."""
    import forgetkit as fk

    n_epochs, n_samples, n_classes = outputs.shape
    start = time.perf_counter()
    with fk.RunWriter(path, n_samples, n_classes, labels=labels, durable=durable) as writer:
        for e in range(n_epochs):
            writer.append(e, outputs[e])
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=str(DATA),
                        help="where the runs are written (the disk being measured)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    outputs = rng.normal(size=(args.epochs, args.samples, args.classes)).astype(np.float16)
    labels = rng.integers(0, args.classes, args.samples)
    mb = outputs.nbytes / 1e6
    print(f"machine: {machine()}; {args.epochs} epochs of {args.samples} x {args.classes} "
          f"float16 ({mb:.0f} MB) written to {args.folder}")
    print("| format | fsync s | no fsync s | fsync cost | per epoch ms (fsync / no fsync) |")
    print("|---|---|---|---|---|")
    for suffix in (".npy", ".parquet"):
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.repeat):
            for durable in (True, False):
                folder = Path(tempfile.mkdtemp(dir=args.folder, prefix="durability-"))
                try:
                    seconds = append_run(folder / f"run{suffix}", outputs, labels, durable)
                finally:
                    shutil.rmtree(folder)
                best[durable] = min(best[durable], seconds)
        cost = best[True] / best[False] - 1
        print(f"| {suffix[1:]} | {best[True]:.2f} | {best[False]:.2f} | {cost:+.0%} | "
              f"{1e3 * best[True] / args.epochs:.1f} / {1e3 * best[False] / args.epochs:.1f} |")


if __name__ == "__main__":
    main()
