"""The forgetting pass over a top-k run at language-model scale, against `cat` of its files.

    python -m bench.bench_topk_scale [--epochs 100 --tokens 1000000 --k 8 --vocab 50257]
        [--run PATH] [--baseline CHECKOUT]

A synthetic top-k run (56 bytes per checkpoint and token at k = 8: 5.6 GB at 100
checkpoints x 1M tokens) is written checkpoint by checkpoint with
`forgetkit.io.topk.TopKWriter` (durable=False) under a temporary folder (``--dir``,
default /tmp), and removed at the end (``--keep`` keeps it). Then, with the page cache warm
and in the same run, alternately (``--repeat`` times each):

- ``cat`` of the run's files (records, token table, sidecar) to /dev/null: the floor of one
  sequential read of the bytes;
- a fresh process that runs ``fk.forget_fraction(fk.load(path))``: loading (sidecar, token
  table), the forgetting pass and the checksums of what it reads (each checkpoint's argmax
  ids), then the same again in that process (the file verified: no checksum; memory that
  the first pass freed is reused).

``--run PATH`` measures an existing top-k run instead (kept); ``--baseline CHECKOUT`` also
times the fresh-process pass of another checkout of forgetkit (its own
``bench.bench_topk_scale --child``, run with that checkout as the working directory) in the
same alternation, for before/after figures from one run.

The written run is synced to disk before the measurements (writeback of the 5.6 GB of
dirty pages slowed a first attempt's passes 3-4x).

Reported: wall and CPU seconds of each (best of the repeats), their ratio, the peak
anonymous RSS of the pass (RssAnon: the memory-mapped records are reclaimable file pages
and not counted) and the machine's load average around the measurements (the 2 cores are
shared).

The records: targets fixed per token; each token is learned at a random checkpoint and
forgotten again with a small chance at every later one (so F_e has mass); when correct,
the target is the first of the k ids; otherwise the k ids are other tokens and the target's
logit lies below the k-th.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import machine, peak_rss_anon, rss_anon_mb

STRIDE = 7919  # distinct ids (y + s + j * STRIDE) % V for j < k at V = 50,257


def write_run(path, n_epochs, n_tokens, k, vocab, *, seed=0):
    """The synthetic top-k run at ``path``; returns (wall, cpu) seconds of writing it."""
    import forgetkit as fk
    from forgetkit.kinds.topk import set_token_ids, topk_dtype

    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, n_tokens)
    learned = rng.integers(0, n_epochs, n_tokens)
    sequences, positions = np.arange(n_tokens) // 1024, np.arange(n_tokens) % 1024
    records = np.empty(n_tokens, dtype=topk_dtype(k, vocab))
    steps = (np.arange(k) * STRIDE)[None, :]
    wall, cpu = time.perf_counter(), time.process_time()
    with fk.TopKWriter(path, vocab_size=vocab, top_k=k, targets=targets, sequence_ids=sequences,
                       positions=positions, mode="w", durable=False) as w:
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
    return time.perf_counter() - wall, time.process_time() - cpu


def files_of(path):
    from forgetkit.io.record import sidecar_path
    from forgetkit.io.topk import tokens_path

    return [str(path), str(tokens_path(path)), str(sidecar_path(path))]


def cat(files):
    """(wall, cpu) seconds of ``cat files > /dev/null`` (CPU: user + system, from
    getrusage, in microseconds)."""
    before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.perf_counter() - wall,
            after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def child(path):
    import forgetkit as fk

    start = rss_anon_mb()
    with peak_rss_anon() as mem:
        wall, cpu = time.perf_counter(), time.process_time()
        run = fk.load(path)
        loaded = time.perf_counter() - wall
        f = fk.forget_fraction(run)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del run
    again, again_cpu = time.perf_counter(), time.process_time()
    fk.forget_fraction(fk.load(path))  # the file verified in this process: no checksums
    again, again_cpu = time.perf_counter() - again, time.process_time() - again_cpu
    print(json.dumps({"wall": wall, "cpu": cpu, "load": loaded, "peak_mb": mem["peak_mb"],
                      "start_mb": start, "max_forget": float(f.max()), "again": again,
                      "again_cpu": again_cpu}))


def forgetting_pass(path, checkout=None):
    out = subprocess.run([sys.executable, "-m", "bench.bench_topk_scale", "--child",
                          str(Path(path).resolve())], capture_output=True, text=True,
                         cwd=checkout)
    if out.returncode:
        raise RuntimeError(f"the pass failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pass_rows(results, cat_wall, cat_cpu, fresh, again):
    """The table's two rows of the passes ``results`` (best wall and CPU of each, and
    their ratios to `cat`'s): the fresh process's pass, named ``fresh``, and the same again
    in that process, named ``again``."""
    def row(name, wall, cpu):
        return (f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / cat_wall:.2f} | "
                f"{cpu / max(cat_cpu, 1e-9):.2f} |")

    return [row(fresh, min(r["wall"] for r in results), min(r["cpu"] for r in results)),
            row(again, min(r["again"] for r in results),
                min(r["again_cpu"] for r in results))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50_257)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--keep", action="store_true")
    p.add_argument("--run", help="an existing top-k run to measure (not written, kept)")
    p.add_argument("--baseline", help="another checkout whose pass is timed alongside")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.run:
        path, folder, write_wall, write_cpu = Path(args.run), None, None, None
    else:
        folder = Path(tempfile.mkdtemp(prefix="fk_topk_scale_", dir=args.dir))
        path = folder / "run.npy"
    try:
        if folder is not None:
            write_wall, write_cpu = write_run(path, args.epochs, args.tokens, args.k,
                                              args.vocab)
            os.sync()  # the written pages on disk: no writeback during the measurements
        files = files_of(path)
        import forgetkit as fk

        loaded = fk.load(path)
        shape = (loaded.n_epochs, loaded.n_samples, loaded.top_k, loaded.n_classes)
        del loaded
        size_mb = sum(os.path.getsize(f) for f in files) / 1e6
        cat(files), cat(files)  # warm the page cache
        load_before = os.getloadavg()
        cats, passes, baselines = [], [], []
        for _ in range(args.repeat):
            cats.append(cat(files))
            passes.append(forgetting_pass(path))
            if args.baseline:
                baselines.append(forgetting_pass(path, args.baseline))
        load_after = os.getloadavg()
    finally:
        if folder is not None and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        elif folder is not None:
            print(f"kept: {path}")
    cat_wall, cat_cpu = min(c[0] for c in cats), min(c[1] for c in cats)
    best = min(passes, key=lambda r: r["wall"])
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; commit: {commit()}; "
          f"command: python -m bench.bench_topk_scale {' '.join(argv or sys.argv[1:])}".rstrip())
    written = f"written by TopKWriter in {write_wall:.0f} s ({write_cpu:.0f} s CPU)" \
        if write_wall is not None else f"the existing run {str(path)!r}"
    print(f"top-k run: {shape[0]} checkpoints x {shape[1]:,} tokens, k={shape[2]}, "
          f"vocabulary {shape[3]:,}: {size_mb:,.0f} MB in 3 files, {written}")
    print(f"load average (1, 5, 15 min) before {load_before[0]:.1f} {load_before[1]:.1f} "
          f"{load_before[2]:.1f}, after {load_after[0]:.1f} {load_after[1]:.1f} "
          f"{load_after[2]:.1f}")
    print(f"| (best of {args.repeat}, page cache warm) | wall s | CPU s | wall / cat | "
          "CPU / cat |")
    print("|---|---|---|---|---|")
    print(f"| `cat` of the files > /dev/null | {cat_wall:.2f} | {cat_cpu:.2f} | 1.00 | 1.00 |")
    for line in pass_rows(passes, cat_wall, cat_cpu, "`fk.forget_fraction(fk.load(path))`, "
                          "fresh process", "the same again in that process (file verified: "
                          "no checksum)"):
        print(line)
    if baselines:
        for line in pass_rows(baselines, cat_wall, cat_cpu,
                              f"baseline {args.baseline}, fresh process",
                              "baseline, the same again in that process"):
            print(line)
        base = min(baselines, key=lambda r: r["wall"])
        print(f"baseline: peak RssAnon {base['peak_mb']:.0f} MB; every wall time "
              f"{[round(r['wall'], 2) for r in baselines]}; same F_e: "
              f"{all(r['max_forget'] == passes[0]['max_forget'] for r in baselines)}")
    print(f"loading (sidecar, token table): {best['load']:.2f} s; peak RssAnon of the pass "
          f"{best['peak_mb']:.0f} MB ({best['start_mb']:.0f} MB before it); every wall time: "
          f"cat {[round(c[0], 2) for c in cats]}, pass {[round(r['wall'], 2) for r in passes]}")


if __name__ == "__main__":
    sys.exit(main())
