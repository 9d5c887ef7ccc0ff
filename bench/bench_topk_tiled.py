"""Certified fusion on a real token run, as ratios to its forgetting pass.

    python -m bench.bench_topk_tiled [--tile 40] [--repeat 3]

The GPT-2 sample run (data_samples/lm_fortunes_gpt2_heldout_top8.npy: 26 checkpoints x
3,048 tokens, k = 8, vocabulary 8,192) tiled ``--tile`` times along its tokens (each copy's
sequence ids shifted): real per-token candidate sets, which are wider than the synthetic
records of `bench.bench_topk_fusion`. In one process, kernels compiled first on the sample
itself: CPU seconds (best of ``--repeat``) of the forgetting pass (`fk.forget_fraction`),
`KnowledgeFusion().fit`, `certified_accuracy` of the fitted plan and `fk.label_issues`,
each also as a ratio to the forgetting pass.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .common import machine

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / \
    "lm_fortunes_gpt2_heldout_top8.npy"


def tiled(run, copies):
    """``run`` with its tokens repeated ``copies`` times (sequence ids shifted per copy)."""
    import forgetkit as fk
    from forgetkit.kinds import kind_of
    from forgetkit.kinds.topk import TopKOutputs

    records = np.asarray(kind_of(run).read_records(run))
    shift = int(run.sequence_ids.max()) + 1
    outputs = TopKOutputs(np.tile(records, (1, copies)), run.n_classes,
                          np.concatenate([run.sequence_ids + shift * i for i in range(copies)]),
                          np.tile(run.positions, copies))
    return fk.Run(outputs, np.tile(run.labels, copies), kind="topk", epochs=run.epochs)


def cpu_seconds(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        out = fn()
        best = min(best, time.process_time() - start)
    return best, out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tile", type=int, default=40)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    import forgetkit as fk

    sample = fk.load(SAMPLE)
    fk.forget_fraction(sample)
    fk.KnowledgeFusion().fit(sample).certified_accuracy(sample)  # compiles the kernels
    run = tiled(sample, args.tile)
    rows = {}
    rows["forgetting pass"], _ = cpu_seconds(lambda: fk.forget_fraction(run), args.repeat)
    rows["KnowledgeFusion().fit"], kf = cpu_seconds(lambda: fk.KnowledgeFusion().fit(run),
                                                    args.repeat)
    rows["certified_accuracy"], _ = cpu_seconds(lambda: kf.certified_accuracy(run),
                                                args.repeat)
    try:
        rows["label_issues"], _ = cpu_seconds(lambda: fk.label_issues(run), 1)
    except fk.ForgetkitError as err:
        rows["label_issues"] = f"refused: {err}"
    base = rows["forgetting pass"]
    print(json.dumps({"machine": machine(), "tokens": run.n_samples,
                      "checkpoints": run.n_epochs, "rows": {
                          k: v if isinstance(v, str) else
                          {"cpu_s": round(v, 3), "x_forgetting": round(v / base, 1)}
                          for k, v in rows.items()}}, indent=1))


if __name__ == "__main__":
    main()
