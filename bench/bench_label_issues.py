"""Label issues against the peers, on training-set runs with a known noise mask.

    python -m bench.bench_label_issues [RUN ...] [--out FILE]

Each RUN (default: data_samples/fmnist_resnet18_sym20_h200_train5k.npz) is a run of
training-set outputs whose ``meta["noise_mask"]`` lists the samples whose label was
flipped. In the same process, on the same run, every method scores each sample (higher =
more likely mislabelled) and/or flags a set:

- forgetkit: ``fk.label_issues`` (score and flagged set);
- cartography confidence: one minus the mean probability of the label (Swayamdipta et al.);
- AUM: minus the mean margin of the label's logit (Pleiss et al.);
- forgetting events: the number of forgetting events, never-learned samples ranked first
  (Toneva et al. count them as forgotten infinitely often; here n_epochs, above any count);
- cleanlab ``get_label_quality_scores`` (one minus the default self-confidence quality) and
  ``find_label_issues`` (defaults), each on the final epoch's and on the epoch-mean
  probabilities (``fk.pred_probs(run, how=...)``).

Scores are judged by AUROC and average precision against the mask, flagged sets by
precision, recall and F1 (`forgetkit.analysis.ranking_metrics`, `set_metrics`, the
definitions of scikit-learn's). Needs cleanlab (``pip install forgetkit[cleanlab]``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .common import machine

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / \
    "fmnist_resnet18_sym20_h200_train5k.npz"
FORGETKIT = "forgetkit label_issues"


def noise_mask(run, path):
    flipped = run.meta.get("noise_mask")
    if flipped is None:
        raise ValueError(f"{path} has no meta['noise_mask'] (the indices of its noisy labels)")
    mask = np.zeros(run.n_samples, dtype=bool)
    mask[np.asarray(flipped, dtype=np.int64)] = True
    return mask


def methods(run):
    """(name, score or None, flagged or None) of every method on ``run``."""
    import cleanlab.filter
    import cleanlab.rank

    import forgetkit as fk

    li = fk.label_issues(run)
    yield FORGETKIT, li["score"].to_numpy(), li["is_issue"].to_numpy()
    dm = fk.data_map(run)
    yield "cartography confidence", -dm["confidence"].to_numpy(), None
    yield "AUM", -dm["aum"].to_numpy(), None
    events = dm["forgetfulness"].to_numpy(dtype=np.float64)
    yield "forgetting events", np.where(dm["never_learned"], run.n_epochs, events), None
    for how in ("final", "mean"):
        probs = fk.pred_probs(run, how=how)
        quality = cleanlab.rank.get_label_quality_scores(run.labels, probs)
        yield f"cleanlab label quality ({how})", 1 - quality, None
        flagged = cleanlab.filter.find_label_issues(run.labels, probs)
        yield f"cleanlab find_label_issues ({how})", None, flagged


def bench_run(path):
    """Rows [run, method, AUROC, AP, flagged, precision, recall, F1] of one run."""
    import forgetkit as fk
    from forgetkit.analysis import ranking_metrics, set_metrics

    run = fk.load(path)
    mask = noise_mask(run, path)
    rows = []
    for name, score, flagged in methods(run):
        r = ranking_metrics(score, mask) if score is not None else None
        s = set_metrics(flagged, mask) if flagged is not None else None
        rows.append({
            "run": Path(path).name, "method": name,
            "auroc": np.nan if r is None else r["auroc"], "ap": np.nan if r is None else r["ap"],
            "flagged": np.nan if s is None else s["n_flagged"],
            "precision": np.nan if s is None else s["precision"],
            "recall": np.nan if s is None else s["recall"], "f1": np.nan if s is None else s["f1"],
        })
    return rows, run, mask


def fmt(x, spec):
    return "" if x != x else format(x, spec)


def goals(rows):
    """The targets on one run's rows: forgetkit's AUROC against the best peer's, its F1
    against cleanlab find_label_issues' best."""
    ours = next(r for r in rows if r["method"] == FORGETKIT)
    peers = [r for r in rows if r["method"] != FORGETKIT and r["auroc"] == r["auroc"]]
    best = max(peers, key=lambda r: r["auroc"])
    cl_f1 = max(r["f1"] for r in rows if r["method"].startswith("cleanlab find_label_issues"))
    return (f"{rows[0]['run']}: forgetkit AUROC {ours['auroc']:.5f} vs best peer "
            f"{best['method']} {best['auroc']:.5f} ({ours['auroc'] - best['auroc']:+.5f}); "
            f"F1 {ours['f1']:.4f} vs cleanlab find_label_issues best {cl_f1:.4f} "
            f"({ours['f1'] - cl_f1:+.4f})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", default=[str(SAMPLE)], metavar="RUN")
    p.add_argument("--out", help="also write the markdown table here")
    args = p.parse_args(argv)
    try:
        import cleanlab
    except ImportError:
        sys.exit("bench_label_issues needs cleanlab: pip install forgetkit[cleanlab]")
    all_rows, notes = [], []
    for path in args.runs:
        rows, run, mask = bench_run(path)
        all_rows += rows
        notes.append(goals(rows) + f" [{run.n_epochs} epochs, {run.n_samples} samples, "
                                   f"{mask.mean():.1%} noisy]")
    head = ["run", "method", "AUROC", "AP", "flagged", "precision", "recall", "F1"]
    lines = [f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; cleanlab "
             f"{cleanlab.__version__}; command: python -m bench.bench_label_issues "
             f"{' '.join(sys.argv[1:])}".rstrip(), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in all_rows:
        lines.append("| " + " | ".join([
            r["run"], r["method"], fmt(r["auroc"], ".5f"), fmt(r["ap"], ".5f"),
            fmt(r["flagged"], ".0f"), fmt(r["precision"], ".4f"), fmt(r["recall"], ".4f"),
            fmt(r["f1"], ".4f")]) + " |")
    if len(args.runs) > 1:
        names = list(dict.fromkeys(r["method"] for r in all_rows))
        lines += ["", "| method | mean AUROC | mean F1 |", "|---|---|---|"]
        for name in names:
            mine = [r for r in all_rows if r["method"] == name]
            lines.append(f"| {name} | {fmt(np.mean([r['auroc'] for r in mine]), '.5f')} | "
                         f"{fmt(np.mean([r['f1'] for r in mine]), '.4f')} |")
    lines += [""] + notes
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
