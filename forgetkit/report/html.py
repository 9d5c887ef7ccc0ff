"""A report a person reads: one self-contained HTML file (figures embedded as PNG), or the
figures as PNG files."""

from __future__ import annotations

import html
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .. import evaluate
from .._validation import (
    check_array,
    check_frame,
    check_ints,
    check_option,
    check_path,
    check_type,
)
from ..analysis import forgetting
from ..analysis.dynamics import data_map
from ..analysis.label_issues import label_issues, ranking_metrics, set_metrics
from ..errors import ForgetkitError
from ..evaluate import percent
from ..fusion import KnowledgeFusion
from ..io.atomic import atomic_write
from ..io.guard import refuse_overwrite
from ..run import check_run
from . import explorer, plots, tokens
from .page import STYLE, Figure, figure_html, render
from .readable import meta_rows


def label_issue_section(train_run, noise_mask=None, *, top=20):
    """What the report shows of a training run's label issues: a dict with ``n_samples``,
    ``n_issues``, ``noise_rate``, ``per_class`` (DataFrame), ``top`` (DataFrame of the
    ``top`` most suspicious samples: sample id, given and suggested class names, score) and
    ``metrics`` (AUROC, AP, precision, recall, F1 against ``noise_mask``; None without)."""
    li = label_issues(train_run)
    info = li.attrs["summary"]
    names = plots.class_names(train_run)
    worst = li.sort_values("score", ascending=False, kind="stable").head(top)
    table = worst.assign(label=[names[c] for c in worst["label"]],
                         suggested_label=[names[c] for c in worst["suggested_label"]])
    metrics = None
    if noise_mask is not None:
        metrics = dict(ranking_metrics(li["score"], noise_mask),
                       **set_metrics(li["is_issue"].to_numpy(), noise_mask))
    return {"n_samples": len(li), "n_issues": info["n_issues"], "noise_rate": info["noise_rate"],
            "per_class": pd.DataFrame(info["per_class"]), "top": table, "metrics": metrics}


def _label_issue_html(section):
    """The label-issue section of the report (HTML)."""
    m = section["metrics"]
    known = "" if m is None else (
        f" Against the run's known noise mask: AUROC {m['auroc']:.4f} and average precision "
        f"{m['ap']:.4f} for the score; the flagged set has precision {percent(m['precision'])}, "
        f"recall {percent(m['recall'])}, F1 {m['f1']:.3f}.")
    rows = "".join(
        f"<tr><td>{html.escape(str(i))}</td><td>{html.escape(str(r.label))}</td>"
        f"<td>{html.escape(str(r.suggested_label))}</td><td>{r.score:.3f}</td></tr>"
        for i, r in zip(section["top"].index, section["top"].itertuples(), strict=True))
    per_class = "".join(
        f"<tr><td>{html.escape(str(c))}</td><td>{r.n_samples}</td>"
        f"<td>{r.estimated_issues:.1f}</td><td>{percent(r.noise_rate)}</td></tr>"
        for c, r in zip(section["per_class"].index, section["per_class"].itertuples(),
                        strict=True))
    return "".join([
        "<h2>Label issues in the training run</h2>",
        f"<p>Confident learning on the trajectory-averaged probabilities estimates that "
        f"{percent(section['noise_rate'])} of the {section['n_samples']} training labels are "
        f"wrong; the {section['n_issues']} samples of highest score are flagged. The score "
        "is the log odds that a label is wrong, from the sample's mean log-probabilities "
        "over training and the estimated noise between classes; the suggested label is the "
        f"most likely true class.{known}</p>",
        "<table><tr><th>sample</th><th>given label</th><th>suggested label</th>"
        f"<th>score</th></tr>{rows}</table>",
        "<table><tr><th>given class</th><th>samples</th><th>estimated issues</th>"
        f"<th>estimated noise rate</th></tr>{per_class}</table>",
    ])


def build(run, *, val_frac=0.5, seeds=(0, 1, 2), window=1, train_run=None, noise_mask=None,
          progress=False):
    """Compute everything the report shows. Returns (summary dict, comparison table,
    KnowledgeFusion fitted on the first split, list of Figure). With a ``train_run``, the
    summary also holds ``label_issues`` (`label_issue_section`) and the figures its data
    map. ``progress``: the forgetting pass's and the KF fits' progress on a terminal."""
    check_run("run", run)
    if train_run is not None:
        check_run("train_run", train_run)
    if not check_ints("seeds", seeds, minimum=0):
        raise ForgetkitError("seeds must name at least one split; got none")
    if noise_mask is not None:
        check_array("noise_mask", noise_mask, ndim=1, kinds="b")
    summary = forgetting.summary(run, progress=progress)
    fits = {}  # KF(inf) fitted once per (split, window), shared by the table and curves
    table = evaluate.compare(run, seeds=seeds, val_frac=val_frac, window=window, kf_fits=fits,
                             progress=progress)
    kf = fits[(seeds[0], window)]
    size = evaluate.ensemble_size_curve(run, seeds=seeds, val_frac=val_frac, window=window,
                                        kf_fits=fits)
    windows = evaluate.window_curve(run, seeds=seeds, val_frac=val_frac, kf_fits=fits)
    f = forgetting.forget_fraction(run)
    dd = summary["double_descent"]
    dynamics = forgetting.sample_dynamics(run)
    wrong = dynamics[~dynamics["correct_final"]]
    never = int((wrong["epochs_correct"] == 0).sum())
    by_class = dynamics.groupby("label")["forgotten"].mean()
    worst = int(by_class.idxmax())
    names = plots.class_names(run)
    best_k = size.groupby("windows").agg(k=("k", "mean"), gain=("gain", "mean"))
    best_w = windows.groupby("window")["gain"].mean()
    kf_row = table.loc["kf"]

    figs = [
        ("accuracy", "Accuracy and retention",
         lambda ax, f=plots.accuracy_retention: f(run, ax=ax),
         f"Test accuracy per epoch (blue) and the share of test samples that are correct at "
         f"that epoch and still correct at the end (orange). The red band is F_e: at epoch "
         f"{summary['max_forget_epoch']} it reaches {percent(summary['max_forget_fraction'])} of "
         "the test set, knowledge the final model has lost. "
         + (f"A double-descent dip runs from epoch {dd['peak_epoch']} to {dd['dip_epoch']}."
            if dd["found"] else "No epoch-wise double descent was found.")),
        ("forget_learn", "Forget and learn fractions",
         lambda ax, f=plots.forget_learn: f(run, ax=ax),
         f"F_e (solid): correct at epoch e, wrong at the end; L_e (dashed): wrong at e, "
         f"correct at the end. The final accuracy equals a_e + L_e − F_e at every epoch. "
         f"Mean F_e over training: {percent(f.mean())}."),
        ("epochs_correct", "Wrong at the end: epochs correct",
         lambda ax, f=plots.epochs_correct_hist: f(run, ax=ax),
         f"{len(wrong)} test samples are wrong after training; {never} of them were never "
         f"right, the other {len(wrong) - never} were right at some epoch and forgotten."),
        ("last_correct", "Forgotten samples: last epoch correct",
         lambda ax, f=plots.last_correct_hist: f(run, ax=ax),
         "When each forgotten sample was last classified correctly: mass late in training "
         "means recent forgetting that nearby checkpoints can recover."),
        ("per_class", "Forgetting per class",
         lambda ax, f=plots.per_class_forgetting: f(run, ax=ax),
         f"Share of each class's test samples learned and then forgotten; {names[worst]} "
         f"loses the most ({percent(by_class.max())})."),
        ("compare", "Knowledge Fusion against the baselines",
         lambda ax: plots.compare_methods(table, ax=ax),
         f"Test accuracy over {len(seeds)} split(s) of the test set (fit on one half, score on "
         f"the other). KF(inf) gains {kf_row['gain']:.2f} ± {kf_row['gain_se']:.2f} "
         f"percentage points over the single network with k = {kf_row['k']:.1f} "
         "checkpoints; the baselines use the same k."),
        ("ensemble_size", "Gain against ensemble size",
         lambda ax: plots.gain_vs_checkpoints(size, ax=ax),
         f"KF(i) for growing i: the gain against the number of checkpoints used. The largest "
         f"mean gain, {best_k['gain'].max():.2f} pp, comes with k ≈ "
         f"{best_k.loc[best_k['gain'].idxmax(), 'k']:.0f}."),
        ("window", "Gain against window size", lambda ax: plots.gain_vs_window(windows, ax=ax),
         f"KF(inf) with windows of 2w + 1 epochs; the best mean gain is at w = "
         f"{int(best_w.idxmax())} ({best_w.max():.2f} pp)."),
    ]
    if train_run is not None and noise_mask is not None:
        figs.append((
            "noise", "Clean against noisy among large-loss training points",
            lambda ax: plots.noisy_dominance(train_run, noise_mask, epochs=train_run.epochs,
                                             ax=ax),
            f"Per epoch, among the {percent(np.mean(noise_mask))} of training samples with the "
            "largest loss: clean minus noisy count. Negative values: the mislabelled points "
            "are still the hard ones (not yet memorised)."))
    if train_run is not None:
        dm = data_map(train_run)
        regions = dm["region"].value_counts()
        figs.append((
            "datamap", "Data map of the training run",
            lambda ax: plots.confidence_variability(dm, ax=ax),
            f"Each training sample's mean probability of its label over the "
            f"{dm.attrs['n_epochs']} epochs (confidence) against its spread (variability); "
            f"colour: share of epochs classified correctly. Ambiguous (the most variable "
            f"third): {regions['ambiguous']}; easy-to-learn: {regions['easy-to-learn']}; "
            f"hard-to-learn: {regions['hard-to-learn']}, of which "
            f"{int(dm['never_learned'].sum())} were never learned."))
        summary["label_issues"] = label_issue_section(train_run, noise_mask)
    rendered = [Figure(name, title, caption, render(draw)) for name, title, draw, caption
                in figs]
    return summary, table, kf, rendered


def _meta_html(meta):
    """The run's metadata as a readable two-column table (folded: it is context)."""
    if not meta:
        return ""
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in meta_rows(meta))
    return (f"<details class='meta'><summary>Run metadata ({len(meta)} fields)</summary>"
            f"<table data-testid='run-metadata'>{rows}</table></details>")


def to_html(run, summary, table, kf, figures, *, source="", samples=None):
    """The report as one HTML string (figures inline, no external resources). ``samples``:
    the sample explorer's fragment (`forgetkit.report.explorer.fragment`), shown after the
    summary."""
    check_run("run", run)
    check_type("summary", summary, dict, "a dict (the first value `build` returns)")
    check_frame("table", table, evaluate.TABLE_COLUMNS)
    check_type("kf", kf, KnowledgeFusion, "a fitted KnowledgeFusion")._check_fitted()
    check_type("figures", figures, (list, tuple), "a list of report figures")
    dd = summary["double_descent"]
    numbers = [
        ("final accuracy", percent(summary["final_accuracy"])),
        ("best accuracy", f"{percent(summary['best_accuracy'])} at epoch {summary['best_epoch']}"),
        ("max forget fraction F_e",
         f"{percent(summary['max_forget_fraction'])} at epoch {summary['max_forget_epoch']}"),
        ("ever forgotten", f"{percent(summary['ever_forgotten'])} of test samples were right at "
                           "some epoch and wrong at the end"),
        ("double descent", (f"peak at {dd['peak_epoch']}, dip at {dd['dip_epoch']}, second "
                            f"peak at {dd['second_peak_epoch']}; forgotten in the dip "
                            f"{percent(dd['forgotten_in_dip'])}") if dd["found"] else "none found"),
    ]
    used = [(a, eps, acc) for (a, eps), acc in zip(kf.plan_, kf.val_accuracy_, strict=True)
            if eps > 0]
    plan_rows = "".join(
        f"<tr><td>{kf.epochs_[a]}</td><td>{eps:.3g}</td><td>{percent(acc)}</td></tr>"
        for a, eps, acc in used)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>forgetkit report: {html.escape(source)}</title><style>{STYLE}</style></head>",
        "<body>",
        f"<h1>Forgetting and Knowledge Fusion: {html.escape(source)}</h1>",
        f"<p>{run.n_epochs} stored epochs (numbers {run.epochs[0]}..{run.epochs[-1]}), "
        f"{run.n_samples} test samples, {run.n_classes} classes, {run.kind} stored as "
        f"{run.outputs.dtype}.</p>",
        _meta_html(run.meta),
        "<h2>Summary</h2><table class='numbers'>",
        "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                for k, v in numbers),
        "</table>",
        samples or "",
        "<h2>Comparison</h2><p>Every method is fitted on half of the test set and scored on "
        "the other half, over several random halves (the paper's protocol); mean ± standard "
        "error. * marks a gain over the single network significant (McNemar, p &lt; 0.05) on "
        "every split.</p>",
        evaluate.format_table(table, fmt="html"),
        "<h2>The fused plan</h2>",
        f"<p>Knowledge Fusion fitted on the first validation half: validation accuracy "
        f"{percent(kf.initial_accuracy_)} (final epoch) → "
        f"{percent(kf.val_accuracy_[-1] if kf.val_accuracy_ else kf.initial_accuracy_)} with "
        f"{len(used)} windows of {2 * kf.window + 1} epochs ({kf.ensemble_size_} checkpoints)."
        " Each step mixes the window's mean prediction into the current one with weight "
        "eps.</p>",
        "<table><tr><th>window centre (epoch)</th><th>eps</th><th>validation accuracy after"
        f"</th></tr>{plan_rows}</table>",
    ]
    if "label_issues" in summary:
        parts.append(_label_issue_html(summary["label_issues"]))
    parts.append("<h2>Figures</h2>")
    parts.extend(figure_html(fig) for fig in figures)
    parts.append(f"<p style='color:#888'>forgetkit, {time.strftime('%Y-%m-%d %H:%M')}</p>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(run, out, *, fmt="html", source="", inputs=None, train_inputs=None,
                 class_names=None, tokenizer=None, sequences=None, **options):
    """Write the report: ``fmt="html"`` one self-contained file at ``out``, with the sample
    explorer; ``fmt="png"`` one PNG per figure in the folder ``out``. Returns the paths.

    A token run (a language model's top-k run: sequence ids and positions per target) gets
    the token report (`forgetkit.report.tokens`): its sequences as text, decoded by
    ``tokenizer`` (a ``tokenizers`` JSON file, a Hugging Face tokenizer folder or an object
    with ``decode``; default the one the run's metadata names), with ``sequences`` (ids)
    shown beside the galleries' on runs too large to show every sequence.

    ``inputs`` / ``train_inputs``: the samples behind the rows of ``run`` / ``train_run``
    (images or texts, `forgetkit.report.inputs.load_inputs`; row i is sample id i, or row i
    when the run has no ids), shown by the explorer (HTML only). ``class_names``: a
    sequence, a comma-separated string or a file of one name per line (default: the run's
    own). Other options go to `build`. Refuses, before any work, an ``out`` that is a file
    the runs or inputs were loaded from, and inputs or class names that do not fit the runs.
    """

    check_run("run", run)
    out = Path(check_path("out", out))
    check_option("fmt", fmt, ("html", "png"))
    if tokens.is_token_run(run):
        return _write_token_report(run, out, fmt=fmt, source=source, tokenizer=tokenizer,
                                   sequences=sequences, inputs=inputs,
                                   train_inputs=train_inputs, class_names=class_names,
                                   **options)
    if tokenizer is not None or sequences is not None:
        raise ForgetkitError("tokenizer and sequences are options of a token run's report; "
                             "this run holds no sequence ids and positions (a top-k run does)")
    train_run = options.get("train_run")
    files = [x for x in (inputs, train_inputs, class_names) if isinstance(x, (str, Path))]
    refuse_overwrite({"the report": out},
                     [run.source, None if train_run is None else train_run.source] + files)
    if fmt == "png" and (inputs is not None or train_inputs is not None):
        raise ForgetkitError("inputs are shown by the HTML report's sample explorer; "
                             "fmt='png' writes the figures only")
    run, train_run, inputs, train_inputs = explorer.prepare(
        run, train_run=train_run, inputs=inputs, train_inputs=train_inputs,
        class_names=class_names)
    if "train_run" in options:
        options["train_run"] = train_run
    summary, table, kf, figures = build(run, **options)
    if fmt == "png":
        return _write_figures(figures, out)
    with atomic_write(out) as tmp:
        samples = explorer.fragment(run, train_run=train_run, inputs=inputs,
                                    train_inputs=train_inputs)
        tmp.write_text(to_html(run, summary, table, kf, figures, source=source,
                               samples=samples), encoding="utf-8")
    return [out]


def _write_figures(figures, out):
    """One PNG per figure in the folder ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fig in figures:
        path = out / f"{fig.name}.png"
        with atomic_write(path) as tmp:
            tmp.write_bytes(fig.png)
        paths.append(path)
    return paths


def _write_token_report(run, out, *, fmt, source, tokenizer, sequences, inputs, train_inputs,
                        class_names, **options):
    """`write_report` of a token run (see `forgetkit.report.tokens`)."""
    given = [name for name, value in (("inputs", inputs), ("train_inputs", train_inputs),
                                      ("class_names", class_names),
                                      ("train_run", options.pop("train_run", None)),
                                      ("noise_mask", options.pop("noise_mask", None)))
             if value is not None]
    if given:
        raise ForgetkitError(f"{', '.join(given)}: a token run's report shows its sequences as "
                             "text (tokenizer=) and has no label issues, training run or class "
                             "names: next-token targets are not labels a person gave")
    refuse_overwrite({"the report": out},
                     [run.source] + ([tokenizer] if isinstance(tokenizer, (str, Path)) else []))
    decoder = tokens.load_decoder(tokenizer, run)
    report = tokens.build_tokens(run, sequences=sequences, **options)
    if fmt == "png":
        return _write_figures(report.figures, out)
    with atomic_write(out) as tmp:
        tmp.write_text(tokens.token_html(run, report, decoder, source=source), encoding="utf-8")
    return [out]
