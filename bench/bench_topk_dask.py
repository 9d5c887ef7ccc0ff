"""Knowledge Fusion on a top-k run larger than memory, held as NPY shards on dask.

    python -m bench.bench_topk_dask --tokens 10000000 --epochs 50 [--k 8 --vocab 50257]
        [--shard-tokens 250000 --chunks 65536 --workers 2 --dir /tmp --keep]
    python -m bench.bench_topk_dask --shards DIR   # an existing run's shards (kept)

The synthetic records of `bench.bench_topk_scale` (the same recipe, one seed per shard),
written shard by shard and checkpoint by checkpoint with `forgetkit.TopKWriter`
(durable=False): memory stays one checkpoint of one shard. Then, each in a fresh client
process on a `distributed.LocalCluster` of ``--workers`` worker processes (one thread each)
over ``fk.load(DIR/shard-*.npy, chunks=...)``:

- the forgetting pass (``fk.forget_fraction``), the baseline;
- ``KnowledgeFusion().fit`` (grid 101, window 1), then ``certified_accuracy`` of the plan
  on the same run.

Reported: wall and CPU seconds (the client's and the workers', user + system), the
client's and the workers' peak RssAnon, the plan and the certified interval. The shards
are removed at the end unless ``--keep`` (or ``--shards``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .bench_topk_scale import STRIDE, commit
from .common import machine, peak_rss_anon, rss_anon_mb


def write_shard(path, start, n_epochs, n_tokens, k, vocab, *, seed):
    """One shard of the synthetic run: tokens start..start + n_tokens (sequence ids and
    positions of the whole run), written checkpoint by checkpoint."""
    import forgetkit as fk
    from forgetkit.kinds.topk import set_token_ids, topk_dtype

    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, n_tokens)
    learned = rng.integers(0, n_epochs, n_tokens)
    index = np.arange(start, start + n_tokens)
    records = np.empty(n_tokens, dtype=topk_dtype(k, vocab))
    steps = (np.arange(k) * STRIDE)[None, :]
    with fk.TopKWriter(path, vocab_size=vocab, top_k=k, targets=targets,
                       sequence_ids=index // 1024, positions=index % 1024, mode="w",
                       durable=False) as w:
        for e in range(n_epochs):
            correct = (learned <= e) & (rng.random(n_tokens) > 0.1)
            shift = rng.integers(1, 1000, n_tokens)[:, None]
            ids = (targets[:, None] + shift + steps) % vocab
            ids[correct, 0] = targets[correct]
            top = rng.normal(5.0, 1.0, n_tokens).astype(np.float32)
            gaps = 0.01 + rng.exponential(0.5, (n_tokens, k)).astype(np.float32)  # no ties
            gaps[:, 0] = 0
            logits = top[:, None] - np.cumsum(gaps, axis=1)
            records["logits"] = logits
            set_token_ids(records, ids)
            records["target"] = np.where(correct, logits[:, 0],
                                         logits[:, -1] - np.float32(1.0))
            records["lse"] = top + np.log1p(np.exp(rng.normal(1.0, 1.0, n_tokens))).astype(
                np.float32)
            w.append(e, records)


def write_shards(folder, n_epochs, n_tokens, k, vocab, shard_tokens):
    """The synthetic run as shards ``folder/shard-00000.npy``...; returns (wall, cpu)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i, start in enumerate(range(0, n_tokens, shard_tokens)):
        write_shard(folder / f"shard-{i:05d}.npy", start, n_epochs,
                    min(shard_tokens, n_tokens - start), k, vocab, seed=i)
    return time.perf_counter() - wall, time.process_time() - cpu


def worker_peaks(client):
    """{worker: peak RssAnon MB} of the cluster's worker processes (VmHWM-like: sampled by
    each worker's own thread since it started, see `_track`)."""
    return client.run(lambda dask_worker: dask_worker._fk_peak["peak_mb"])


def _track(dask_worker):
    """Start sampling this worker's RssAnon (kept on the worker)."""
    ctx = peak_rss_anon()
    dask_worker._fk_peak = ctx.__enter__()
    dask_worker._fk_ctx = ctx


def _cpu(dask_worker):
    t = os.times()
    return t.user + t.system


def child(pattern, task, workers, chunks):
    """One task in this (fresh) process on a new LocalCluster; prints a JSON line."""
    from distributed import Client, LocalCluster

    import forgetkit as fk

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0", memory_limit=0)
    client = Client(cluster)
    client.run(_track)
    start = rss_anon_mb()
    cpu0 = sum(client.run(_cpu).values())
    out = {}
    with peak_rss_anon() as mem:
        wall, cpu = time.perf_counter(), time.process_time()
        run = fk.load(pattern, chunks=chunks)
        if task == "forget":
            out["max_forget"] = float(fk.forget_fraction(run).max())
        else:
            kf = fk.KnowledgeFusion().fit(run)
            out["fit_wall"] = time.perf_counter() - wall
            out["plan"] = [[int(a), float(e)] for a, e in kf.plan_]
            out["k"] = kf.ensemble_size_
            out["initial_accuracy"] = kf.initial_accuracy_
            out["certified"] = list(kf.certified_accuracy(run))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out.update(wall=wall, client_cpu=cpu, client_peak_mb=mem["peak_mb"], client_start_mb=start,
               workers_cpu=sum(client.run(_cpu).values()) - cpu0,
               workers_peak_mb=worker_peaks(client), n_tokens=run.n_samples,
               n_epochs=run.n_epochs, chunks=len(run.outputs.stored.chunks[1]))
    client.close()
    cluster.close()
    print(json.dumps(out))


def run_child(pattern, task, workers, chunks):
    cmd = [sys.executable, "-m", "bench.bench_topk_dask", "--child", task, "--shards", pattern,
           "--workers", str(workers), "--chunks", str(chunks)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{task} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50_257)
    p.add_argument("--shard-tokens", type=int, default=250_000)
    p.add_argument("--chunks", type=int, default=65_536, help="tokens per dask chunk")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--keep", action="store_true")
    p.add_argument("--write-only", action="store_true", help="write the shards and stop")
    p.add_argument("--shards", help="a folder of existing shards (kept), or with --child "
                                    "their pattern")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.shards, args.child, args.workers, args.chunks)
    write = None
    if args.shards:
        folder = Path(args.shards)
    else:
        folder = Path(tempfile.mkdtemp(prefix="fk_topk_dask_", dir=args.dir))
    try:
        if not args.shards:
            write = write_shards(folder, args.epochs, args.tokens, args.k, args.vocab,
                                 args.shard_tokens)
            os.sync()
            print(f"written {folder} in {write[0]:.0f} s ({write[1]:.0f} s CPU)", flush=True)
            if args.write_only:
                args.keep = True
                return 0
        size_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        pattern = str(folder / "shard-*.npy")
        load_before = os.getloadavg()
        base = run_child(pattern, "forget", args.workers, args.chunks)
        fit = run_child(pattern, "fit", args.workers, args.chunks)
        load_after = os.getloadavg()
    finally:
        if not args.keep and not args.shards:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; commit: "
          f"{commit()}; command: python -m bench.bench_topk_dask "
          f"{' '.join(argv or sys.argv[1:])}".rstrip())
    print(f"top-k run: {fit['n_epochs']} checkpoints x {fit['n_tokens']:,} tokens, "
          f"{size_mb:,.0f} MB in {len(list(folder.glob('shard-*.npy')))} shards"
          + (f", written by TopKWriter in {write[0]:.0f} s" if write else "")
          + f"; {fit['chunks']} dask chunks, {args.workers} worker processes")
    print(f"load average before {load_before}, after {load_after}")
    print("| task | wall s | client CPU s | workers CPU s | x forgetting pass (wall) | "
          "client peak RssAnon MB | workers' peak RssAnon MB |")
    print("|---|---|---|---|---|---|---|")
    for name, r in (("forgetting pass (`fk.forget_fraction`)", base),
                    ("`KnowledgeFusion().fit` + `certified_accuracy`", fit)):
        print(f"| {name} | {r['wall']:.1f} | {r['client_cpu']:.1f} | {r['workers_cpu']:.1f} "
              f"| {r['wall'] / base['wall']:.1f} | {r['client_peak_mb']:.0f} | "
              f"{', '.join(f'{v:.0f}' for v in r['workers_peak_mb'].values())} |")
    print(f"fit alone {fit['fit_wall']:.1f} s; plan {fit['plan']}; k = {fit['k']}; final "
          f"checkpoint {100 * fit['initial_accuracy']:.2f}%; certified accuracy "
          f"[{100 * fit['certified'][0]:.2f}%, {100 * fit['certified'][1]:.2f}%]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
