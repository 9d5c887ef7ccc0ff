"""A run on a dask array on a local dask.distributed cluster against the same run in memory:
wall time of the forgetting pass and of the KF(inf) fit, the client's peak anonymous memory,
and the results (required equal).

    python -m bench.bench_distributed [--size M] [--workers 2] [--chunk 1000]

The run is the suite's synthetic float16 NPY file of that size (bench/data/), loaded as a
memmap (in memory) or with ``fk.load(path, chunks=...)`` (a dask array of sample blocks read
by the workers). KF is fitted on the first half of the samples. Each side runs in a fresh
process; the dask side starts a LocalCluster of ``--workers`` processes (one thread each)
before timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from .common import DATA, SIZES, machine, peak_rss_anon, suite_run, write_synthetic_npy


def child(path, side, workers, chunk):
    import forgetkit as fk

    client = None
    if side == "dask":
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(n_workers=int(workers), threads_per_worker=1,
                                     processes=True, dashboard_address=":0"))
    fk.KnowledgeFusion().fit(fk.load(DATA / "warm.npy"))  # the kernels, off the clock
    out = {}
    with peak_rss_anon() as mem:
        run = fk.load(path, chunks=int(chunk)) if side == "dask" else fk.load(path)
        t = time.perf_counter()
        f = fk.forget_fraction(run)
        dynamics = fk.sample_dynamics(run)
        out["forgetting_seconds"] = time.perf_counter() - t
        val = run.isel(samples=np.arange(run.n_samples // 2))
        t = time.perf_counter()
        kf = fk.KnowledgeFusion().fit(val)
        out["kf_seconds"] = time.perf_counter() - t
    out.update(peak_mb=mem["peak_mb"], forget_fraction=f.tolist(), plan=kf.plan_,
               events=int(dynamics["forgetting_events"].sum()))
    if client is not None:
        client.close()
    print(json.dumps(out))


def measure(path, side, workers, chunk):
    out = subprocess.run([sys.executable, "-m", "bench.bench_distributed", "--child", str(path),
                          side, str(workers), str(chunk)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{side} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="M", choices=list(SIZES))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=1000, help="samples per chunk")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    path, gb = suite_run(args.size)
    write_synthetic_npy(DATA / "warm.npy", 6, 300, 20, seed=1, noise=0.1)
    mem = measure(path, "memory", args.workers, args.chunk)
    dsk = measure(path, "dask", args.workers, args.chunk)
    same = mem["forget_fraction"] == dsk["forget_fraction"] and mem["plan"] == dsk["plan"] \
        and mem["events"] == dsk["events"]
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; size {args.size} "
          f"({gb:.2f} GB float16); command: python -m bench.bench_distributed "
          f"{' '.join(sys.argv[1:])}\n")
    print("| side | forgetting pass s | KF(inf) fit s (first half) | client peak RssAnon MB |")
    print("|---|---|---|---|")
    print(f"| memmap, in this process | {mem['forgetting_seconds']:.2f} | "
          f"{mem['kf_seconds']:.2f} | {mem['peak_mb']:.0f} |")
    print(f"| dask array, {args.workers} workers, chunks of {args.chunk} samples | "
          f"{dsk['forgetting_seconds']:.2f} | {dsk['kf_seconds']:.2f} | {dsk['peak_mb']:.0f} |")
    print(f"\nsame F_e, forgetting events and plan ({len(mem['plan'])} steps): "
          f"{'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
