"""What the recorder's background writer costs a launch-bound training loop (a CPU proxy).

A GPU training loop that is CPU/launch-bound holds the GIL nearly all the time; whatever the
recorder's writer thread does while holding the GIL (or while waking up to take it back after
every system call) is time the loop stands still. This benchmark stands a tight pure-Python
loop in for the training loop (iterations per second on the main thread) while a background
thread does one piece of the writer's work every ``--interval`` seconds, and reports the main
loop's loss per epoch written, two ways:

    lost seconds per epoch = (iterations expected at the idle rate - iterations done)
                             / idle rate / epochs written
    stalled seconds per epoch = (sum of the loop's gaps > 200 us between clock reads
                                 - the same with the idle thread) / epochs written

(the stalls are the less noisy figure on a shared machine: they count only the times the
loop stood still, which is what a GIL held by the writer does to it), against an idle
background thread (it sleeps between the same ticks), configurations
alternating run by run, each figure the median of ``--repeat`` runs. The pieces: the sidecar
record (``RunWriter._record``), its JSON, the stale temporary-file scan, the sidecar's atomic
write, the float16 cast and finiteness check, and a whole `RunWriter.append` (durable and
not), and the whole path of `LogitRecorder` (`BackgroundWriter.submit` of a callable).
"wall" is the piece's own time on the writer thread.

    python -m bench.bench_recording_gil                      # 10,000 x 10 and 10,000 x 1,000
    python -m bench.bench_recording_gil --classes 10 --epochs 20 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

#: A gap this long between two clock reads of the spinning loop (normally ~10 us apart) is
#: a stall: the loop lost the GIL (or the CPU).
STALL_SECONDS = 200e-6


def spin(seconds):
    """(iterations, stalled seconds) of a pure-Python loop run for ``seconds`` (the stand-in
    training loop); stalled: the sum of the gaps longer than STALL_SECONDS between two
    consecutive clock reads."""
    n = 0
    stalled = 0.0
    clock = time.perf_counter
    last = clock()
    end = last + seconds
    while True:
        for _ in range(50):
            n += 1
        now = clock()
        if now - last > STALL_SECONDS:
            stalled += now - last
        last = now
        if now >= end:
            return n, stalled


def loaded_run(piece, epochs, interval):
    """(main-loop iterations, stalled seconds, seconds, wall seconds of the piece per call)
    with ``piece``
    (None: idle) called ``epochs`` times on a background thread, one call per interval."""
    walls = []
    go = threading.Event()

    def work():
        go.wait()
        for e in range(epochs):
            time.sleep(interval / 2)
            if piece is not None:
                t = time.perf_counter()
                piece(e)
                walls.append(time.perf_counter() - t)
            time.sleep(interval / 2)

    thread = threading.Thread(target=work)
    thread.start()
    duration = epochs * interval
    go.set()
    t = time.perf_counter()
    n, stalled = spin(duration)
    elapsed = time.perf_counter() - t
    thread.join()
    return n, stalled, elapsed, (statistics.median(walls) if walls else 0.0)


def pieces(folder, n_samples, n_classes):
    """name -> (setup() -> piece(epoch), teardown) of the writer's work."""
    import forgetkit as fk
    from forgetkit.io.atomic import remove_stale_temps, write_json_atomic
    from forgetkit.io.background import BackgroundWriter
    from forgetkit.io.record import sidecar_path

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((n_samples, n_classes)).astype(np.float32)
    labels = rng.integers(0, n_classes, n_samples)
    counter = iter(range(10**9))

    def writer(durable=True):
        path = Path(folder) / f"run{next(counter)}.npy"
        return fk.RunWriter(path, n_samples, n_classes, labels=labels, mode="w",
                            durable=durable)

    def with_writer(make):
        w = writer()
        return make(w), w.close

    def record(w):
        return lambda e: w._record() if hasattr(w, "_record") else None

    def dumps(w):
        encode = getattr(w, "_sidecar_bytes", None)
        if encode is not None:  # the writer's cached encoding
            return lambda e: encode()
        return lambda e: json.dumps(w._record())

    def stale(w):
        side = sidecar_path(w.path)
        return lambda e: remove_stale_temps(side)

    def sidecar(w):
        side = sidecar_path(w.path)
        write = getattr(w, "_write_sidecar", None)
        if write is not None:
            return lambda e: write()
        return lambda e: write_json_atomic(side, w._record(), durable=True)

    def cast(w):
        def piece(e):
            v = logits.astype(np.float16)
            return bool(np.all(np.isfinite(v)))
        return piece

    def appender(durable):
        def make():
            w = writer(durable)
            return (lambda e: w.append(e, logits)), w.close
        return make

    def background():
        bg = BackgroundWriter(writer(), max_pending=2)

        def piece(e):
            bg.submit(e, lambda: logits)
            bg.flush()
        return piece, bg.close

    return {
        "record dict": lambda: with_writer(record),
        "sidecar json": lambda: with_writer(dumps),
        "stale-temp scan": lambda: with_writer(stale),
        "sidecar write (durable)": lambda: with_writer(sidecar),
        "cast + isfinite": lambda: with_writer(cast),
        "append (durable)": appender(True),
        "append (durable=False)": appender(False),
        "BackgroundWriter epoch": background,
    }


def measure(n_samples, n_classes, epochs, interval, repeat, only=None):
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        table = pieces(folder, n_samples, n_classes)
        names = [n for n in table if only is None or n in only]
        lost = {n: [] for n in names}
        stall = {n: [] for n in names}
        walls = {n: [] for n in names}
        for _ in range(repeat):
            for name in names:
                n0, s0, t0, _ = loaded_run(None, epochs, interval)
                piece, done = table[name]()
                try:
                    n1, s1, t1, wall = loaded_run(piece, epochs, interval)
                finally:
                    done()
                rate = n0 / t0
                lost[name].append((rate * t1 - n1) / rate / epochs)
                stall[name].append((s1 - s0) / epochs)
                walls[name].append(wall)
        for name in names:
            rows[name] = {"lost_ms_per_epoch": 1e3 * statistics.median(lost[name]),
                          "stalled_ms_per_epoch": 1e3 * statistics.median(stall[name]),
                          "wall_ms": 1e3 * statistics.median(walls[name])}
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--classes", type=int, nargs="+", default=[10, 1000])
    p.add_argument("--epochs", type=int, default=12, help="epochs written per run")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between epochs")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", nargs="+", default=None, help="pieces to measure (names)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    out = {}
    for c in args.classes:
        rows = measure(args.samples, c, args.epochs, args.interval, args.repeat, args.only)
        out[f"{args.samples}x{c}"] = rows
        print(f"\n{args.samples} x {c} float32 logits -> float16 run, {args.epochs} epochs "
              f"every {args.interval}s, median of {args.repeat}")
        print(f"{'piece':26s} {'lost (ms/epoch)':>16s} {'stalled (ms/epoch)':>19s} "
              f"{'wall (ms)':>10s}")
        for name, r in rows.items():
            print(f"{name:26s} {r['lost_ms_per_epoch']:16.2f} "
                  f"{r['stalled_ms_per_epoch']:19.2f} {r['wall_ms']:10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
