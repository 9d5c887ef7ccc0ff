"""Where a replay's wall time goes: per-phase timestamps of `replay` on 1 and 2 devices.

Wraps the replay's parts (reading a checkpoint, loading it into a device's model, the
evaluation, the CUDA graph capture, the main thread waiting for each result, placing the
data) with host timestamps per thread, records a CUDA event after each load and each
evaluation (mapped onto the host clock), and probes the interpreter lock with a thread that
sleeps 1 ms in a loop (how late it wakes is how long it waited for the lock). Also, with
``--pinned``, the replay with the data kept in pinned host memory (as when it does not fit
the GPU): its outputs against the resident run's, and its time; and with ``--spawn`` the
cost of starting a worker process that imports torch and touches a GPU.

    python bench/gpu_replay_profile.py --data DIR --out OUT --ckpts DIR [--pinned]
    python bench/gpu_replay_profile.py --device cpu --n 3 --test-subset 256 --width 8 \\
        --out OUT --ckpts DIR

Writes ``<out>/profile.json``: per run its wall time, the phases and the per-device
timeline summary (see `summarize`). Works on any tree whose replay has the same parts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))

from gpu_replay import (  # noqa: E402
    first_use_off_the_clock,
    make_checkpoints,
    test_images,
)
from train_fmnist import ResNet18  # noqa: E402

import forgetkit.exporters._torch_replay as R  # noqa: E402
from forgetkit.exporters.torch import LogitRecorder, replay  # noqa: E402


class Trace:
    """Host spans (label, thread, start, end, extra) and CUDA events per device."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.spans = []
        self.events = []  # (device index, label, host time when recorded, event)
        self.refs = {}  # device index -> (event, host time)
        self.lock = threading.Lock()

    def now(self):
        return time.perf_counter() - self.t0

    def span(self, label, start, **extra):
        with self.lock:
            self.spans.append((label, threading.current_thread().name, start, self.now(),
                               extra))

    def event(self, label, **extra):
        if not torch.cuda.is_available() or not torch.cuda.is_initialized() or \
                torch.cuda.is_current_stream_capturing():
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        with self.lock:
            self.events.append((torch.cuda.current_device(), label, self.now(), ev, extra))

    def reference(self, device):
        torch.cuda.synchronize(device)
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.default_stream(device))
        torch.cuda.synchronize(device)
        self.refs[device.index] = (ev, self.now())

    def gpu_times(self):
        out = []
        for d, label, host, ev, extra in self.events:
            if d not in self.refs:
                continue
            ref, t = self.refs[d]
            ev.synchronize()
            out.append((d, label, host, t + ref.elapsed_time(ev) / 1000, extra))
        return out


TRACE = None


def wrap(owner, name, label, *, gpu=False, extra=None):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = TRACE.now() if TRACE else 0
        try:
            return original(*args, **kwargs)
        finally:
            if TRACE:
                more = extra(*args) if extra else {}
                TRACE.span(label, t, **more)
                if gpu:
                    TRACE.event(label, **more)

    wrapper.__wrapped__ = original
    setattr(owner, name, wrapper)


def instrument():
    """Wrap the replay's parts (once per process)."""
    wrap(R.Device, "read", "read", extra=lambda self, position, c: {"p": position})
    wrap(R.Device, "load", "load", gpu=True, extra=lambda self, item: {"p": item.position})
    wrap(R.Device, "evaluate_graphable", "eager_eval", gpu=True,
         extra=lambda self, *a: {"n_batches": len(a[2]) if len(a) > 2 and a[2] else
                                 len(self.batches)})
    wrap(R._Graph, "evaluate", "graph_eval", gpu=True)
    wrap(R, "_capture", "capture")
    wrap(R._Results, "take", "take", extra=lambda self, p: {"p": p})
    wrap(R._Results, "reserve", "reserve")
    wrap(R, "place", "place")
    wrap(R, "batches_of", "batches_of")
    wrap(R, "ordered", "ordered")
    wrap(LogitRecorder, "_commit", "commit")
    wrap(LogitRecorder, "close", "recorder_close")
    original_drive = R.drive

    def drive(order, devs, *args, **kwargs):
        t = TRACE.now()
        for dev in devs:
            if dev.cuda:
                TRACE.reference(dev.device)
        TRACE.span("references", t)
        t = TRACE.now()
        try:
            return original_drive(order, devs, *args, **kwargs)
        finally:
            TRACE.span("drive", t)

    R.drive = drive


def gil_probe(stop, samples, trace):
    """How late a 1 ms sleep wakes (waiting for the interpreter lock), as (time, late)."""
    while not stop.is_set():
        t = time.perf_counter()
        time.sleep(0.001)
        samples.append((trace.now(), time.perf_counter() - t - 0.001))


def summarize(trace, wall, gil):
    """Phases of one replay: setup before the device workers, per device the capture, the
    first checkpoint ready, the GPU's busy time per checkpoint and its idle gaps, and the
    tail after the last evaluation ended on a GPU."""
    spans = trace.spans
    first = {lab: min((s for s in spans if s[0] == lab), key=lambda s: s[2], default=None)
             for lab in {s[0] for s in spans}}
    drive = first.get("drive")
    out = {"wall_s": wall,
           "setup_s": drive[2] if drive else None,  # replay() entry to the workers
           "drive_s": drive[3] - drive[2] if drive else None}
    for lab in ("ordered", "batches_of", "place", "references", "recorder_close"):
        out[f"{lab}_s"] = sum(s[3] - s[2] for s in spans if s[0] == lab)
    takes = [s for s in spans if s[0] == "take"]
    out["main_wait_first_result_s"] = takes[0][3] - drive[2] if takes and drive else None
    out["main_wait_total_s"] = sum(s[3] - s[2] for s in takes)
    out["commit_total_s"] = sum(s[3] - s[2] for s in spans if s[0] == "commit")
    reads = [s[3] - s[2] for s in spans if s[0] == "read"]
    out["read_median_s"] = statistics.median(reads) if reads else None
    out["read_max_s"] = max(reads) if reads else None
    devices = {}
    for name in sorted({s[1] for s in spans if s[1].startswith("forgetkit-replay-")
                        and not s[1].startswith("forgetkit-replay-read")}):
        mine = [s for s in spans if s[1] == name]
        evals = [s for s in mine if s[0] in ("graph_eval", "eager_eval")]
        caps = [s for s in mine if s[0] == "capture"]
        loads = [s for s in mine if s[0] == "load"]
        reserves = [s for s in mine if s[0] == "reserve"]
        devices[name] = {
            "n_checkpoints": len(loads),
            "positions": [s[4].get("p") for s in loads],
            "capture_s": [round(s[3] - s[2], 4) for s in caps],
            "capture_start": [round(s[2], 4) for s in caps],
            "first_load_host": loads[0][2] if loads else None,
            "eager_evals_host_s": [round(s[3] - s[2], 4) for s in evals
                                   if s[0] == "eager_eval"],
            "reserve_wait_s": sum(s[3] - s[2] for s in reserves),
        }
    if trace.refs:
        for d, rows in _by_device(trace.gpu_times()).items():
            name = f"forgetkit-replay-{sorted(trace.refs).index(d)}"
            info = devices.setdefault(name, {})
            evals = [r for r in rows if r[1] in ("graph_eval", "eager_eval")]
            loads = [r for r in rows if r[1] == "load"]
            # an evaluation after a load is a checkpoint's; others are warm-ups
            per, gaps, last_end = [], [], None
            for i, r in enumerate(rows):
                if r[1] == "load":
                    if last_end is not None:
                        gaps.append(r[3] - last_end)
                    nxt = next((e for e in rows[i + 1:] if e[1] != "load"), None)
                    if nxt is not None:
                        per.append(nxt[3] - r[3])
                        last_end = nxt[3]
            info.update({
                "gpu_first_load_end": loads[0][3] if loads else None,
                "gpu_first_eval_end": evals[0][3] if evals else None,
                "gpu_last_eval_end": evals[-1][3] if evals else None,
                "gpu_eval_median_s": statistics.median(per) if per else None,
                "gpu_eval_first_s": per[:3],
                "gpu_gaps_total_s": sum(gaps),
                "gpu_gaps_over_2ms": [round(g, 4) for g in gaps if g > 0.002],
                "host_issue_lead_median_s": statistics.median(
                    [r[3] - r[2] for r in evals]) if evals else None,
            })
        ends = [v.get("gpu_last_eval_end") for v in devices.values()
                if v.get("gpu_last_eval_end") is not None]
        if ends and drive:
            out["tail_after_last_gpu_eval_s"] = drive[3] - max(ends)
            out["gpu_end_spread_s"] = max(ends) - min(ends)
    out["devices"] = devices
    if gil:
        late = np.array([g[1] for g in gil])
        times = np.array([g[0] for g in gil])
        out["gil_late_mean_ms"] = float(late.mean() * 1e3)
        bins = {}
        for t, v in zip(times, late, strict=False):
            bins.setdefault(int(t / 0.25), []).append(v)
        out["gil_late_ms_per_250ms"] = [round(float(np.mean(v)) * 1e3, 2)
                                        for _, v in sorted(bins.items())]
    return out


def _by_device(rows):
    out = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return out


def profiled(label, fn, results, out_file):
    """Run ``fn`` traced; store its summary under ``label``; return its run (or None)."""
    global TRACE
    TRACE = Trace()
    stop, gil = threading.Event(), []
    probe = threading.Thread(target=gil_probe, args=(stop, gil, TRACE), daemon=True)
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)
    probe.start()
    t = time.perf_counter()
    run = None
    try:
        run = fn()
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        wall = time.perf_counter() - t
        stop.set()
        probe.join()
        results[label] = summarize(TRACE, wall, gil)
        print(f"{label}: {wall:.3f} s " + json.dumps(
            {k: (round(v, 4) if isinstance(v, float) else v)
             for k, v in results[label].items() if k not in ("devices",)
             and not k.startswith("gil_late_ms")}), flush=True)
        for name, info in results[label]["devices"].items():
            print(f"  {name}: " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                              for k, v in info.items() if k != "positions"}),
                  flush=True)
    except Exception:
        stop.set()
        results[label] = {"error": traceback.format_exc()}
        print(f"{label}: FAILED\n{results[label]['error']}", flush=True)
    finally:
        TRACE = None
        Path(out_file).write_text(json.dumps(results, indent=1, default=str))
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--ckpts", required=True, help="folder of the checkpoints (made if empty)")
    p.add_argument("--n", type=int, default=60)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--test-subset", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--devices", default=None,
                   help="several devices, comma separated (default: cuda:0,cuda:1 when two "
                        "GPUs are there)")
    p.add_argument("--pinned", action="store_true", help="also the pinned-streaming path")
    p.add_argument("--static", action="store_true",
                   help="also 2 devices with BALANCE=False (where the tree has it)")
    p.add_argument("--spawn", action="store_true", help="time a worker process's start")
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    out_file = out / "profile.json"
    dev = torch.device(args.device)
    x, y = test_images(args)
    folder = Path(args.ckpts)
    folder.mkdir(parents=True, exist_ok=True)
    files = sorted(map(str, folder.glob("model_*.pt")),
                   key=lambda f: int(Path(f).stem.split("_")[1]))
    if len(files) != args.n:
        files = make_checkpoints(args, x, y, dev, folder)
    results = {"tag": args.tag, "device": torch.cuda.get_device_name(0)
               if dev.type == "cuda" else "cpu", "n_gpus": torch.cuda.device_count(),
               "torch": torch.__version__, "n_checkpoints": len(files)}
    multi = args.devices.split(",") if args.devices else (
        ["cuda:0", "cuda:1"] if dev.type == "cuda" and torch.cuda.device_count() >= 2
        else None)
    instrument()
    m1 = ResNet18(width=args.width).to(dev)
    m2 = ResNet18(width=args.width).to(dev)  # as m1: on the device before the timing
    if dev.type == "cuda":  # the first use of every GPU off the clock (context, cuDNN)
        first_use_off_the_clock(args.width, x[:256],
                                [f"cuda:{d}" for d in range(torch.cuda.device_count())])
    common = dict(batch_size=args.batch_size, mode="w", progress=False)
    runs = {}
    for rep in range(args.reps):
        runs["1"] = profiled(f"replay_1dev_rep{rep}", lambda: replay(
            m1, files, (x, y), out / "r1.npy", device=dev, **common), results, out_file)
        if multi:
            runs["2"] = profiled(f"replay_{len(multi)}dev_rep{rep}", lambda: replay(
                m2, files, (x, y), out / "r2.npy", devices=multi, **common), results,
                out_file)
    if args.static and multi and hasattr(R, "BALANCE"):
        R.BALANCE = False
        try:
            for rep in range(args.reps):
                profiled(f"replay_{len(multi)}dev_static_rep{rep}", lambda: replay(
                    m2, files, (x, y), out / "r2s.npy", devices=multi, **common), results,
                    out_file)
        finally:
            R.BALANCE = True
    if runs.get("1") is not None and runs.get("2") is not None:
        results["multi_equals_one"] = bool(np.array_equal(np.asarray(runs["1"].outputs),
                                                          np.asarray(runs["2"].outputs)))
    if args.pinned:
        real = torch.cuda.mem_get_info
        # the data "does not fit": place() keeps it pinned on the host, streamed per batch
        torch.cuda.mem_get_info = lambda device=None: (0, real(device)[1])
        try:
            for label, kw in (("pinned_1dev", {"device": dev}),
                              (f"pinned_{len(multi or [])}dev", {"devices": multi})):
                if kw.get("devices", 1) is None:
                    continue
                run = profiled(label, lambda kw=kw: replay(
                    ResNet18(width=args.width), files, (x, y), out / "rp.npy",
                    **kw, **common), results, out_file)
                if run is not None and runs.get("1") is not None:
                    results[label + "_equals_resident"] = bool(np.array_equal(
                        np.asarray(run.outputs), np.asarray(runs["1"].outputs)))
                    print(f"{label} equals the resident run: "
                          f"{results[label + '_equals_resident']}", flush=True)
        finally:
            torch.cuda.mem_get_info = real
    if args.spawn:
        code = ("import time; t = time.perf_counter(); import torch; "
                "torch.zeros(1, device='cuda:1' if torch.cuda.device_count() > 1 else 'cpu'); "
                "print(time.perf_counter() - t)")
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        results["spawn_process_s"] = time.perf_counter() - t
        results["spawn_import_and_gpu_s"] = float(done.stdout.strip() or "nan")
        print(f"worker process start: {results['spawn_process_s']:.2f} s (import torch and "
              f"first GPU use {results['spawn_import_and_gpu_s']:.2f} s)", flush=True)
    out_file.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
