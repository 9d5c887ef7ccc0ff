"""Knowledge Fusion on a top-k run larger than memory, held as NPY shards on dask.

    python -m bench.bench_topk_dask --tokens 10000000 --epochs 50 [--k 8 --vocab 50257]
        [--shard-tokens 250000 --distinct 4 --chunks 0 --workers 2 --dir /tmp --keep]
    python -m bench.bench_topk_dask --shards DIR_OR_PATTERN   # existing shards (kept)

The synthetic records of `bench.bench_topk_fusion` (the same recipe, one seed per shard:
12 to 20 classes per token over the 50 checkpoints; with ``--distinct n`` only the first n
shards are drawn, the others hold their records in other token orders), written shard by
shard and checkpoint by checkpoint with `forgetkit.TopKWriter` (durable=False): memory
stays one shard's draws. Then, each in a fresh client process on a
`distributed.LocalCluster` of ``--workers`` worker processes (one task at a time each, its
kernels on cores // workers threads) over ``fk.load(DIR/shard-*.npy, chunks=...)``:

- the forgetting pass (``fk.forget_fraction``), the baseline;
- ``KnowledgeFusion().fit`` (grid 101, window 1), then ``certified_accuracy`` of the plan
  on the same run;
- with ``--memory``, the same on the records concatenated in memory, in one process
  without dask (its plan and interval must be the same).

Reported: wall and CPU seconds (the client's and the workers', user + system), the
client's and the workers' peak RssAnon, the plan and the certified interval. The shards
are removed at the end unless ``--keep`` (or ``--shards``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .bench_topk_fusion import POOL
from .bench_topk_scale import commit
from .common import machine, peak_rss_anon, rss_anon_mb


def write_shard(path, start, n_epochs, n_tokens, k, vocab, *, seed):
    """One shard of the synthetic run: tokens start..start + n_tokens (sequence ids and
    positions of the whole run), written checkpoint by checkpoint. The records of
    `bench.bench_topk_fusion`: each token has a pool of `POOL` plausible next tokens (its
    target among them) whose logits move from checkpoint to checkpoint, the target's rising
    with training; the rest of the vocabulary sits well below the pool."""
    import forgetkit as fk
    from forgetkit.kinds.topk import set_token_ids, topk_dtype

    rng = np.random.default_rng(seed)
    pool = np.stack([rng.choice(vocab, POOL, replace=False) for _ in range(1024)])
    pool = pool[rng.integers(0, 1024, n_tokens)]  # (n, POOL) distinct ids per token
    every = np.arange(n_tokens)
    target_at = rng.integers(0, POOL, n_tokens)
    targets = pool[every, target_at]
    skill = rng.normal(0.0, 1.0, n_tokens)
    base = rng.normal(0.0, 1.0, (n_tokens, POOL))
    rest = np.log(vocab - POOL) - 4.0  # the other classes' log-sum-exp, below the pool
    rows = every[:, None]
    records = np.empty(n_tokens, dtype=topk_dtype(k, vocab))
    index = start + every
    with fk.TopKWriter(path, vocab_size=vocab, top_k=k, targets=targets,
                       sequence_ids=index // 512, positions=index % 512, mode="w",
                       durable=False) as w:
        for e in range(n_epochs):
            z = base + rng.normal(0.0, 0.7, (n_tokens, POOL))
            z[every, target_at] += skill + 3.0 * e / max(n_epochs - 1, 1)
            # the pool stays above every other class; float32, as the records store it
            z = np.maximum(z, -3.0).astype(np.float32).astype(np.float64)
            order = np.lexsort((pool, -z), axis=1)[:, :k]  # equal logits: ascending ids
            records["logits"] = z[rows, order]
            set_token_ids(records, pool[rows, order])
            records["target"] = z[every, target_at]
            records["lse"] = np.logaddexp(np.log(np.exp(z).sum(axis=1)), rest)
            w.append(e, records)


def copy_shard(source, path, start, seed):
    """A shard at ``path`` holding the records of the shard ``source`` with its tokens in
    a random order (sequence ids and positions of tokens start..), written checkpoint by
    checkpoint: tiles of a few distinct shards make a large run without drawing every
    token."""
    import forgetkit as fk

    run = fk.load(source)
    records = run.outputs.records  # a memmap: one checkpoint in memory at a time
    order = np.random.default_rng(seed).permutation(run.n_samples)
    index = start + np.arange(run.n_samples)
    with fk.TopKWriter(path, vocab_size=run.n_classes, top_k=run.top_k,
                       targets=run.labels[order], sequence_ids=index // 512,
                       positions=index % 512, mode="w", durable=False) as w:
        for e in range(run.n_epochs):
            w.append(e, np.asarray(records[e])[order])


def write_shards(folder, n_epochs, n_tokens, k, vocab, shard_tokens, distinct=None):
    """The synthetic run as shards ``folder/shard-00000.npy``...: the first ``distinct``
    (default: every one) drawn, each later one a copy of one of them in another token
    order (`copy_shard`). Returns (wall, cpu) seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    starts = range(0, n_tokens, shard_tokens)
    distinct = len(starts) if distinct is None else distinct
    for i, start in enumerate(starts):
        n = min(shard_tokens, n_tokens - start)
        path = folder / f"shard-{i:05d}.npy"
        if i < distinct or n != shard_tokens:
            write_shard(path, start, n_epochs, n, k, vocab, seed=i)
        else:
            copy_shard(folder / f"shard-{i % distinct:05d}.npy", path, start, seed=i)
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


def in_memory(pattern):
    """The shards at ``pattern`` as one top-k Run held in memory (records concatenated)."""
    import forgetkit as fk
    from forgetkit.kinds.topk import TopKOutputs

    runs = [fk.load(f) for f in sorted(glob.glob(pattern)) if not f.endswith(".tokens.npy")]
    records = np.concatenate([np.asarray(r.outputs.records) for r in runs], axis=1)
    cat = [np.concatenate([getattr(r, name) for r in runs])
           for name in ("labels", "sequence_ids", "positions")]
    return fk.Run(TopKOutputs(records, runs[0].n_classes, cat[1], cat[2]), cat[0],
                  kind="topk", epochs=runs[0].epochs)


def memory_child(pattern):
    """The fit and certified accuracy of the shards held in memory, in this (fresh)
    process; prints a JSON line."""
    import forgetkit as fk

    run = in_memory(pattern)
    with peak_rss_anon() as mem:
        wall, cpu = time.perf_counter(), time.process_time()
        kf = fk.KnowledgeFusion().fit(run)
        fit_wall = time.perf_counter() - wall
        certified = list(kf.certified_accuracy(run))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"wall": wall, "client_cpu": cpu, "client_peak_mb": mem["peak_mb"],
                      "fit_wall": fit_wall, "certified": certified,
                      "plan": [[int(a), float(e)] for a, e in kf.plan_]}))


def child(pattern, task, workers, chunks):
    """One task in this (fresh) process on a new LocalCluster; prints a JSON line."""
    if task == "memory":
        return memory_child(pattern)
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
        run = fk.load(pattern, chunks=chunks or None)
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
    # the workers' kernels on cores // workers threads each (as fk.sweep's): no
    # oversubscription of the cores
    env = dict(os.environ, NUMBA_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // workers)))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
    p.add_argument("--distinct", type=int, help="shards drawn (default: every one); the "
                                                 "others copy them in other token orders")
    p.add_argument("--chunks", type=int, default=0,
                   help="tokens per dask chunk (default 0: one per shard, each checkpoint of "
                        "a shard read whole and verified by its checksum)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--keep", action="store_true")
    p.add_argument("--memory", action="store_true",
                   help="also fit the run held in memory (the records must fit)")
    p.add_argument("--write-only", action="store_true", help="write the shards and stop")
    p.add_argument("--shards", help="existing shards (kept): a folder (its shard-*.npy) or "
                                    "a glob pattern")
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
                                 args.shard_tokens, args.distinct)
            os.sync()
            print(f"written {folder} in {write[0]:.0f} s ({write[1]:.0f} s CPU)", flush=True)
            if args.write_only:
                args.keep = True
                return 0
        pattern = str(folder) if glob.has_magic(str(folder)) else str(folder / "shard-*.npy")
        shards = sorted(f for f in glob.glob(pattern) if not f.endswith(".tokens.npy"))
        size_mb = sum(os.path.getsize(f[: -len(".npy")] + suffix) for f in shards
                      for suffix in (".npy", ".tokens.npy", ".forgetkit.json")) / 1e6
        load_before = os.getloadavg()
        base = run_child(pattern, "forget", args.workers, args.chunks)
        fit = run_child(pattern, "fit", args.workers, args.chunks)
        memory = run_child(pattern, "memory", args.workers, args.chunks) if args.memory \
            else None
        load_after = os.getloadavg()
    finally:
        if not args.keep and not args.shards:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; commit: "
          f"{commit()}; command: python -m bench.bench_topk_dask "
          f"{' '.join(argv or sys.argv[1:])}".rstrip())
    print(f"top-k run: {fit['n_epochs']} checkpoints x {fit['n_tokens']:,} tokens, "
          f"{size_mb:,.0f} MB in {len(shards)} shards"
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
    if memory is not None:
        print(f"| the same in memory, one process (no dask) | {memory['wall']:.1f} | "
              f"{memory['client_cpu']:.1f} | | {memory['wall'] / base['wall']:.1f} | "
              f"{memory['client_peak_mb']:.0f} (records in memory) | |")
        print(f"in memory: fit alone {memory['fit_wall']:.1f} s; the same plan: "
              f"{memory['plan'] == fit['plan']}; the same certified accuracy: "
              f"{memory['certified'] == fit['certified']}")
    print(f"fit alone {fit['fit_wall']:.1f} s; plan {fit['plan']}; k = {fit['k']}; final "
          f"checkpoint {100 * fit['initial_accuracy']:.2f}%; certified accuracy "
          f"[{100 * fit['certified'][0]:.2f}%, {100 * fit['certified'][1]:.2f}%]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
