"""Shared helpers of the benchmarks: synthetic runs on disk, timing, peak anonymous memory."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"


def machine():
    cpu = "unknown cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.python_version()}"


def rss_anon_mb(pid="self"):
    """RssAnon of process ``pid`` in MB (nan once it has exited)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


@contextmanager
def peak_rss_anon():
    """Sample RssAnon every 5 ms; yields a dict whose 'peak_mb' is set on exit."""
    result = {"peak_mb": rss_anon_mb()}
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            result["peak_mb"] = max(result["peak_mb"], rss_anon_mb())
            time.sleep(0.005)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield result
    finally:
        stop.set()
        t.join()
        result["peak_mb"] = max(result["peak_mb"], rss_anon_mb())


def timed(fn, *args, repeat=1, **kw):
    """(best wall seconds over ``repeat`` calls, last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn(*args, **kw)
        best = min(best, time.perf_counter() - t)
    return best, out


def cat_seconds(path):
    """Wall time of `cat path > /dev/null`: one sequential read, the I/O floor."""
    t = time.perf_counter()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def synthetic_logits(n_epochs, n_samples, n_classes, *, seed=0, noise=0.0):
    """Yield (epoch, logits float32 (N, C)) of a run with realistic dynamics, and the labels.

    Each sample has a difficulty; its true-class margin grows with training along a learning
    curve, with per-epoch jitter (forgetting), and a fraction ``noise`` of samples is pulled
    towards a wrong class late in training (memorised label noise).
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n_samples)
    difficulty = rng.gamma(2.0, 1.0, n_samples)
    noisy = rng.random(n_samples) < noise
    other = (labels + rng.integers(1, n_classes, n_samples)) % n_classes
    rows = np.arange(n_samples)

    def epochs():
        for e in range(n_epochs):
            progress = 1 - np.exp(-4 * (e + 1) / n_epochs)
            x = rng.standard_normal((n_samples, n_classes), dtype=np.float32)
            margin = 4 * progress - difficulty + rng.normal(0, 0.8, n_samples)
            x[rows, labels] += margin.astype(np.float32)
            late = max(0.0, (e / n_epochs - 0.5) * 2)
            x[rows[noisy], other[noisy]] += np.float32(3 * late)
            yield e, x

    return labels, epochs()


def write_synthetic_npy(path, n_epochs, n_samples, n_classes, *, seed=0, noise=0.0,
                        dtype="float16"):
    """A run on disk (stored as ``dtype``) through forgetkit's RunWriter (skipped if already
    there)."""
    import forgetkit as fk

    path = Path(path)
    if path.exists():
        try:
            run = fk.load(path)
            if run.shape == (n_epochs, n_samples, n_classes) and run.outputs.dtype == dtype:
                return path
        except (ValueError, OSError):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    labels, epochs = synthetic_logits(n_epochs, n_samples, n_classes, seed=seed, noise=noise)
    with fk.RunWriter(path, n_samples, n_classes, labels=labels, mode="w", dtype=dtype) as w:
        for e, x in epochs:
            w.append(e, x)
    return path


#: The suite's synthetic run sizes (E, N, C); XS is for quick checks.
SIZES = {"XS": (40, 5_000, 100), "S": (200, 10_000, 100), "M": (200, 10_000, 200),
         "L": (90, 50_000, 1_000)}


def suite_run(size):
    """(path, GB of float16 outputs) of the suite's synthetic run of ``size`` (written once
    into bench/data/, shared by every benchmark)."""
    n_epochs, n_samples, n_classes = SIZES[size]
    path = write_synthetic_npy(DATA / f"suite_{size}.npy", n_epochs, n_samples, n_classes,
                               seed=7, noise=0.1)
    return path, n_epochs * n_samples * n_classes * 2 / 1e9


def warm_run():
    """Path of the tiny float16 run (E=6, N=300, C=20) on which the benchmarks load their
    kernels off the clock (written once into bench/data/)."""
    return write_synthetic_npy(DATA / "warm_scaling.npy", 6, 300, 20, seed=1, noise=0.1)


def warm_compare(path=None):
    """`compare` on the tiny run at ``path`` (default `warm_run`) with the memory budgets
    that take each of its paths (probabilities held; softmax statistics and gathered
    values; streamed): every kernel it uses is loaded or compiled, off the clock."""
    import forgetkit as fk
    from forgetkit.kernels import forced

    run = fk.load(warm_run() if path is None else path)
    for build in ("serial", "parallel"):  # a tiny run alone would take the serial build
        with forced(build):
            for budget in (2 << 30, 100_000, 0):
                fk.compare(run, memory_budget=budget)
