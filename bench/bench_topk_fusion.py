"""Memory and time of certified Knowledge Fusion on a language-model-sized top-k run.

    python -m bench.bench_topk_fusion [--epochs 50 --tokens 1000000 --vocab 50257 --k 8]

A synthetic top-k run (56 bytes per checkpoint and token at k = 8: 2.8 GB at E=50, N=1M) is
written epoch by epoch with `forgetkit.io.topk.TopKWriter` (durable=False) under
bench/data/; then, each in a fresh process, loading included: the forgetting pass
(`fk.forget_fraction`, the baseline), `KnowledgeFusion().fit` (grid 101, window 1) and
`certified_accuracy` of the fitted plan. CPU seconds (user + system: the machine is shared)
and peak anonymous RSS (RssAnon: the memmap's file pages are reclaimable and not counted).

The records: each token has a pool of 12 plausible next tokens (its target among them)
whose logits move from checkpoint to checkpoint, the target's rising with training; the
other classes of the vocabulary sit well below the pool (their mass is the log-sum-exp's
remainder). Each checkpoint stores the pool's 8 largest.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

from .common import DATA, machine, peak_rss_anon

POOL = 12
TASKS = ("forgetting", "kf_fit", "kf_certified")


def write_run(path, n_epochs, n_tokens, vocab, k, *, seed=0):
    """The synthetic top-k run at ``path`` (kept when it already holds every epoch)."""
    import forgetkit as fk
    from forgetkit.io.topk import TopKWriter
    from forgetkit.kinds.topk import set_token_ids, topk_dtype

    if path.exists():
        try:
            run = fk.load(path, verify=False)
            if run.shape == (n_epochs, n_tokens, vocab) and run.top_k == k:
                return
        except Exception:  # noqa: BLE001 - rewritten below
            pass
    rng = np.random.default_rng(seed)
    pool = np.stack([rng.choice(vocab, POOL, replace=False) for _ in range(1024)])
    pool = pool[rng.integers(0, 1024, n_tokens)]  # (N, POOL) distinct ids per token
    target_at = rng.integers(0, POOL, n_tokens)
    targets = pool[np.arange(n_tokens), target_at]
    skill = rng.normal(0.0, 1.0, n_tokens)
    base = rng.normal(0.0, 1.0, (n_tokens, POOL))
    rest = np.log(vocab - POOL) - 4.0  # the other classes' log-sum-exp, well below the pool
    rows = np.arange(n_tokens)[:, None]
    records = np.empty(n_tokens, dtype=topk_dtype(k, vocab))
    with TopKWriter(path, vocab_size=vocab, top_k=k, targets=targets,
                    sequence_ids=np.arange(n_tokens) // 512,
                    positions=np.arange(n_tokens) % 512, mode="w", durable=False) as w:
        for e in range(n_epochs):
            z = base + rng.normal(0.0, 0.7, (n_tokens, POOL))
            z[np.arange(n_tokens), target_at] += skill + 3.0 * e / max(n_epochs - 1, 1)
            # the pool stays above every other class; float32, as the records store it
            z = np.maximum(z, -3.0).astype(np.float32).astype(np.float64)
            # equal logits (those clipped at -3) by ascending id, as the records require
            order = np.lexsort((pool, -z), axis=1)[:, :k]
            top = z[rows, order]
            records["logits"] = top
            set_token_ids(records, pool[rows, order])
            records["target"] = z[np.arange(n_tokens), target_at]
            records["lse"] = np.logaddexp(np.log(np.exp(z).sum(axis=1)), rest)
            w.append(e, records)
    return targets


def task(name, path):
    import forgetkit as fk

    start = time.process_time()
    run = fk.load(path)
    if name == "forgetting":
        result = float(fk.forget_fraction(run).max())
    elif name == "kf_fit":
        kf = fk.KnowledgeFusion().fit(run)
        result = {"k": kf.ensemble_size_, "val_accuracy": kf.val_accuracy_[-1],
                  "initial": kf.initial_accuracy_}
        (DATA / "topk_plan.json").write_text(kf.to_json())
    else:
        kf = fk.load_fuser(DATA / "topk_plan.json")
        result = kf.certified_accuracy(run)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"task": name, "cpu_s": round(time.process_time() - start, 2),
            "user_sys_s": round(usage.ru_utime + usage.ru_stime, 2), "result": result}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--task", choices=TASKS)
    args = parser.parse_args(argv)
    path = DATA / f"topk_{args.epochs}x{args.tokens}_k{args.k}.npy"
    if args.task:  # a fresh process of the parent below
        with peak_rss_anon() as peak:
            out = task(args.task, path)
        out["peak_rss_anon_mb"] = round(peak["peak_mb"], 1)
        print(json.dumps(out))
        return
    DATA.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    write_run(path, args.epochs, args.tokens, args.vocab, args.k)
    print(f"run ready at {path} after {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rows = []
    for name in TASKS:
        cmd = [sys.executable, "-m", "bench.bench_topk_fusion", "--task", name,
               "--epochs", str(args.epochs), "--tokens", str(args.tokens),
               "--vocab", str(args.vocab), "--k", str(args.k)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                              text=True).stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr)
    base = rows[0]["user_sys_s"]
    for r in rows:
        r["x_forgetting_pass"] = round(r["user_sys_s"] / base, 2)
    print(json.dumps({"machine": machine(), "epochs": args.epochs, "tokens": args.tokens,
                      "vocab": args.vocab, "k": args.k, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
