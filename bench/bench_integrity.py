"""The cost of verifying checksums: the forgetting pass with ``verify=True`` against
``verify=False``, in the same process, on a float16 NPY run of about 1 GB.

Each repetition loads the run both ways (alternating which goes first) and runs the
forgetting pass (`Run.predictions`) on it; the verified-file cache is cleared before every
verified load, so each one checks every epoch (CRC32C of the whole file, in threads). The
page cache is warm (the run is read once first), so the cost is the checksum itself, not
the disk. CPU seconds (`time.process_time`, all threads) and wall seconds, best of
``--repeat``.

    python -m bench.bench_integrity [--epochs 10 --samples 500000 --classes 100 --repeat 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .common import DATA, machine, write_synthetic_npy


def throughput(seconds=1.0):
    """GiB/s (CPU time, one thread) of CRC32C (the `crc32c` package) and zlib.crc32 over a
    64 MiB buffer in memory."""
    import zlib

    import crc32c
    import numpy as np

    data = memoryview(np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8))
    out = {}
    for name, fn in (("crc32c", crc32c.crc32c), ("zlib.crc32", zlib.crc32)):
        fn(data)
        start, n = time.process_time(), 0
        while time.process_time() - start < seconds:
            fn(data)
            n += 1
        out[name] = n * 64 / 1024 / (time.process_time() - start)
    return out


def timed_pass(path, verify):
    """(cpu s, wall s) of load + forgetting pass."""
    import forgetkit as fk
    from forgetkit.io.integrity import forget_verified

    forget_verified(path)
    cpu, wall = time.process_time(), time.perf_counter()
    fk.load(path, verify=verify).predictions()
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=500_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    path = Path(DATA) / f"integrity-{args.epochs}x{args.samples}x{args.classes}.npy"
    write_synthetic_npy(path, args.epochs, args.samples, args.classes)
    size = path.stat().st_size
    timed_pass(path, False)  # warm: page cache, numba's kernels
    best = {True: [float("inf")] * 2, False: [float("inf")] * 2}
    for r in range(args.repeat):
        for verify in ((True, False) if r % 2 == 0 else (False, True)):
            got = timed_pass(path, verify)
            best[verify] = [min(a, b) for a, b in zip(best[verify], got, strict=True)]
    print(f"machine: {machine()}")
    print("checksum throughput (GiB/s, one thread, in memory): " + ", ".join(
        f"{k} {v:.2f}" for k, v in throughput().items()))
    print(f"run: {path.name}, {size / 1e9:.2f} GB float16; best of {args.repeat}")
    for what, i in (("cpu", 0), ("wall", 1)):
        off, on = best[False][i], best[True][i]
        print(f"{what}: verify=False {off:.3f} s, verify=True {on:.3f} s, "
              f"cost {100 * (on - off) / off:+.1f}%")
    import forgetkit as fk

    fk.load(path)  # verified once in this process: a later load of the unchanged file is free
    cpu, wall = time.process_time(), time.perf_counter()
    fk.load(path).predictions()
    print(f"a second verified load and pass in the same process: cpu "
          f"{time.process_time() - cpu:.3f} s, wall {time.perf_counter() - wall:.3f} s")


if __name__ == "__main__":
    main()
