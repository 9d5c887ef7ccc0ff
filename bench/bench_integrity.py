"""The cost of verifying checksums: the forgetting pass with ``verify=True`` against
``verify=False``, in the same process, on a float16 NPY run of about 1 GB (``--dtype``:
float32/float64, the same values stored wider).

Each repetition loads the run three ways (in a rotating order) and runs the forgetting pass
(`Run.predictions`) on it: ``verify=False``; ``verify=True`` (the forgetting pass computes
the CRC32C of the rows it reads, `forgetkit.kernels.argmax_crc`); and ``verify=True`` with a
separate CRC32C pass over the file first (the `crc32c` package, in threads: how float32/64
runs, probabilities and `fk.verify` check; with ``--dtype float32`` the first two modes
already take it). The verified-file cache is cleared before every verified load,
so each one checks every epoch. The page cache is warm and every mode has run once before
the timed repeats (numba's kernels loaded), so the cost is the checksum itself, not the
disk or a compile. Repeat r runs the modes rotated by r, in reverse order on odd r, so that
each mode takes each place equally. CPU seconds (`time.process_time`, all threads) and wall
seconds, best and median of ``--repeat``; the paired cost (each repeat's verified pass
against the plain one of the same repeat), median, min and ratio of the sums, CPU and wall;
the load average and numba's thread count.

Then the kernels alone (`kernel_costs`): the pass, the checksumming pass and the CRC alone.

    python -m bench.bench_integrity [--epochs 10 --samples 500000 --classes 100 --repeat 3
                                     --kernel-repeat 7]
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


MODES = ("verify=False", "verify=True", "separate CRC pass")


def kernel_costs(path, repeat):
    """CPU seconds per GB (best, median of ``repeat``, alternating) of the kernels alone on
    the memory-mapped run, its pages mapped once (no load, no page faults): the plain
    forgetting pass (`kernels.argmax_rows`), the pass that checksums what it reads
    (`kernels.argmax_crc` and the combination of its lanes' CRCs; float16 runs only), and
    the CRC32C alone (the `crc32c` package, one thread)."""
    import statistics

    import numpy as np

    from forgetkit import kernels
    from forgetkit.io import integrity

    values = np.load(path, mmap_mode="r")
    n_epochs, n_samples, n_classes = values.shape
    out = np.empty((n_epochs, n_samples), dtype=np.int32)
    ways = {
        "argmax pass": lambda: kernels.argmax_rows(values.reshape(-1, n_classes),
                                                   out.reshape(-1)),
        "argmax + CRC pass": lambda: integrity.epoch_crcs_and_predictions(values, out),
        "CRC alone (crc32c)": lambda: [integrity.crc_array(v) for v in values],
    }
    if not integrity.fused(values):  # the checksumming pass reads float16 only
        del ways["argmax + CRC pass"]
    for way in ways.values():
        way()
    times = {name: [] for name in ways}
    for r in range(repeat):
        for name in list(ways)[::-1] if r % 2 else list(ways):
            cpu = time.process_time()
            ways[name]()
            times[name].append(time.process_time() - cpu)
    gb = values.nbytes / 1e9
    return {name: (min(t) / gb, statistics.median(t) / gb) for name, t in times.items()}


def timed_pass(path, mode):
    """(cpu s, wall s) of load + forgetting pass; ``mode`` one of MODES."""
    import forgetkit as fk
    from forgetkit.io import integrity

    integrity.forget_verified(path)
    fused = integrity.fused
    if mode == MODES[2]:
        integrity.fused = lambda array: False  # verify_epochs takes its separate pass
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        fk.load(path, verify=mode != MODES[0]).predictions()
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        integrity.fused = fused


def main(argv=None):
    import os
    import statistics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=500_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32", "float64"])
    parser.add_argument("--kernel-repeat", type=int, default=7,
                        help="repeats of the kernels alone (0: skip them)")
    args = parser.parse_args(argv)
    suffix = "" if args.dtype == "float16" else f"-{args.dtype}"
    path = Path(DATA) / f"integrity-{args.epochs}x{args.samples}x{args.classes}{suffix}.npy"
    write_synthetic_npy(path, args.epochs, args.samples, args.classes, dtype=args.dtype)
    size = path.stat().st_size
    for mode in MODES:  # warm: page cache, numba's kernels
        timed_pass(path, mode)
    times = {mode: [] for mode in MODES}
    load = [os.getloadavg()[0]]
    for r in range(args.repeat):
        order = [MODES[(r + i) % len(MODES)] for i in range(len(MODES))]
        for mode in order[::-1] if r % 2 else order:
            times[mode].append(timed_pass(path, mode))
        load.append(os.getloadavg()[0])
    import numba

    print(f"machine: {machine()}; numba threads: {numba.get_num_threads()}")
    print(f"load average (1 min) during the runs: {min(load):.1f} to {max(load):.1f}")
    print("checksum throughput (GiB/s, one thread, in memory): " + ", ".join(
        f"{k} {v:.2f}" for k, v in throughput().items()))
    print(f"run: {path.name}, {size / 1e9:.2f} GB {args.dtype}; {args.repeat} repeats")
    for what, i in (("cpu", 0), ("wall", 1)):
        for stat, fn in (("best", min), ("median", statistics.median)):
            off = fn(t[i] for t in times[MODES[0]])
            print(f"{what} {stat}: " + ", ".join(
                f"{mode} {fn(t[i] for t in times[mode]):.3f} s"
                + ("" if mode == MODES[0] else
                   f" ({100 * (fn(t[i] for t in times[mode]) - off) / off:+.1f}%)")
                for mode in MODES))
    for what, i in (("cpu", 0), ("wall", 1)):
        for mode in MODES[1:]:  # paired: each repeat's verified pass against its plain one
            ratios = [on[i] / off[i] for on, off in zip(times[mode], times[MODES[0]],
                                                        strict=True)]
            total = sum(t[i] for t in times[mode]) / sum(t[i] for t in times[MODES[0]])
            print(f"{what}, {mode} against verify=False of the same repeat: median "
                  f"{100 * (statistics.median(ratios) - 1):+.1f}%, min "
                  f"{100 * (min(ratios) - 1):+.1f}%, sum over the repeats "
                  f"{100 * (total - 1):+.1f}%")
    if args.kernel_repeat:
        costs = kernel_costs(path, args.kernel_repeat)
        print("kernels alone (cpu s per GB, best / median, pages mapped): " + ", ".join(
            f"{name} {best:.3f} / {median:.3f}" for name, (best, median) in costs.items()))
    import forgetkit as fk

    fk.load(path)  # verified once in this process: a later load of the unchanged file is free
    cpu, wall = time.process_time(), time.perf_counter()
    fk.load(path).predictions()
    print(f"a second verified load and pass in the same process: cpu "
          f"{time.process_time() - cpu:.3f} s, wall {time.perf_counter() - wall:.3f} s")


if __name__ == "__main__":
    main()
