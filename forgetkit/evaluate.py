"""The paper's evaluation protocol: split-half fits, comparison tables, paired tests.

For seed s in ``seeds``: perm = numpy.random.default_rng(s).permutation(N), validation =
perm[:N//2], test = the rest; every method is fitted on validation and scored on test.
Baselines use the ensemble size k of KF(inf) on the same split (the paper's rule).
"""

from __future__ import annotations

import html
from collections.abc import Iterable

import numpy as np
import pandas as pd
from scipy.special import bdtr

from . import kernels
from ._deprecation import keyword_options, renamed
from ._validation import (
    check_array,
    check_bool,
    check_frame,
    check_int,
    check_ints,
    check_labels,
    check_number,
    check_option,
    check_type,
    is_streamed,
)
from .errors import ForgetkitError, InputTypeError
from .execution import executor_for
from .fusion import (
    CheckpointAverage,
    EarlyStopping,
    EnsembleSelection,
    Fuser,
    KnowledgeFusion,
    LikelihoodFusion,
)
from .fusion.base import check_fuser
from .kinds import kind_of
from .run import DEFAULT_MEMORY_BUDGET, check_run
from .splits import check_val_frac, split_indices

#: name -> label in tables
METHODS = {
    "single": "single network",
    "kf1": "KF(1)",
    "kf": "KF(inf)",
    "horizontal": "horizontal",
    "fixed_jumps": "fixed jumps",
    "early_stopping": "early stopping",
    "ensemble_selection": "ensemble selection",
    "likelihood": "likelihood fusion",
    "uniform": "uniform (all epochs)",
}
#: name -> factory(k, memory_budget) of an unfitted baseline with the ensemble budget k;
#: "kf" and "kf1" come from the split's one KF(inf) fit.
BASELINES = {
    "single": lambda k, mb: CheckpointAverage(select="single"),
    "horizontal": lambda k, mb: CheckpointAverage(select="horizontal", max_checkpoints=k),
    "fixed_jumps": lambda k, mb: CheckpointAverage(select="fixed_jumps", max_checkpoints=k),
    "early_stopping": lambda k, mb: EarlyStopping(),
    "ensemble_selection": lambda k, mb: EnsembleSelection(max_checkpoints=k, memory_budget=mb),
    "likelihood": lambda k, mb: LikelihoodFusion(max_checkpoints=k),
    "uniform": lambda k, mb: CheckpointAverage(select="uniform"),
}
DEFAULT_METHODS = ("single", "kf1", "kf", "horizontal", "fixed_jumps", "early_stopping",
                   "ensemble_selection", "likelihood")


# ----------------------------------------------------------------------- metrics
def _check_probs(probs, labels):
    """(probs, labels) of a set of predictions: probabilities (N, C) (a dask array is
    checked when computed) and labels (N,) in [0, C)."""
    if not is_streamed(probs):
        probs = check_array("probs", probs, ndim=2, kinds="f")
    return probs, check_labels(labels, probs.shape[0], probs.shape[1])


def _check_fusers(fusers):
    """``fusers`` as a list of fitted fusers, naming the first that is not one."""
    if isinstance(fusers, (Fuser, str, bytes)) or not hasattr(fusers, "__iter__"):
        raise InputTypeError(f"fusers must be a sequence of fitted fusers; got "
                             f"{type(fusers).__name__} {fusers!r}"[:200])
    return [check_fuser(f"fusers[{i}]", f) for i, f in enumerate(fusers)]


def nll(probs, labels):
    """Mean negative log-likelihood of the labels (probabilities clipped at 1e-12)."""
    probs, labels = _check_probs(probs, labels)
    return _nll(probs[np.arange(len(labels)), labels])


def _nll(at_label):
    """`nll` from each sample's probability of its label (N,)."""
    return float(-np.mean(np.log(np.clip(at_label, 1e-12, None))))


@keyword_options
def ece(probs, labels, *, n_bins=15):
    """Expected calibration error with ``n_bins`` equal-width confidence bins."""
    probs, labels = _check_probs(probs, labels)
    n_bins = check_int("n_bins", n_bins, minimum=1)
    return _ece(probs.max(axis=1), probs.argmax(axis=1) == labels, n_bins)


def prediction_metrics(probs, labels):
    """(hit (bool (N,)), NLL, ECE) of probabilities (N, C) from one parallel pass over them:
    the values of ``argmax == labels``, `nll` and `ece`."""
    probs, labels = _check_probs(probs, labels)
    pred, conf, at_label = kernels.row_top(probs, labels)
    hit = pred == labels
    return hit, _nll(at_label), _ece(conf, hit)


#: Deprecated: "scores" are the data scores (`forgetkit.data_scores`) and label-issue scores.
scores = renamed(prediction_metrics, "scores", where="forgetkit.evaluate")


def _ece(conf, hit, n_bins=15):
    """`ece` from each sample's largest probability and whether its argmax is the label."""
    bins = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        m = bins == b
        if m.any():
            total += m.mean() * abs(hit[m].mean() - conf[m].mean())
    return float(total)


def score_fusers(fusers, run):
    """`prediction_metrics` of each fitted fuser's ``predict_proba(run)``: a list of (hit,
    NLL, ECE).

    On logits read in place (a memory-mapped run or a sample subset of one, probabilities
    not held) every fuser's `Fuser.recipe` runs in one pass that computes each row's
    softmax of each needed epoch once and never stores the fused probabilities; the results
    are those of predict_proba (the same arithmetic). Otherwise each fuser predicts in turn.
    """
    fusers = _check_fusers(fusers)
    check_run("run", run)
    logits = run.logits_in_place()
    if logits is None or not fusers:
        return [prediction_metrics(f.predict_proba(run), run.labels) for f in fusers]
    pred, top, at_label, needed, bad = kernels.score_recipes(
        logits[0], logits[1], run.labels, [f.recipe(run) for f in fusers], order=logits[2])
    for e in needed[bad > 0]:
        run.probs(int(e))  # raises the error naming the epoch and its values
    out = []
    for m in range(len(fusers)):
        hit = pred[m] == run.labels
        out.append((hit, _nll(at_label[m]), _ece(top[m], hit)))
    return out


def score_certified(fusers, run):
    """On a top-k run: per fitted fuser, (certified correct (bool (N,)), NLL of the exact
    target probabilities, ECE (nan: the top class's probability is bounded, not known),
    not certified wrong (bool (N,))) from `Fuser.certified`'s certificates."""
    fusers = _check_fusers(fusers)
    check_run("run", run)
    out = []
    for f in fusers:
        _, _, state, label_prob = f._certificate(run, states_only=True)
        out.append((state == 1, _nll(label_prob), float("nan"), state != 0))
    return out


def mcnemar(correct_a, correct_b):
    """Exact McNemar test (two-sided binomial on the discordant pairs): p-value that two
    classifiers scored on the same samples have the same accuracy.

    Binomial(n, 1/2) is symmetric, so the two-sided p-value is min(1, 2 * P(X <= k)) with k
    the smaller discordant count (``scipy.stats.binomtest``'s value)."""
    correct_a = check_array("correct_a", correct_a, ndim=1, kinds="b")
    correct_b = check_array("correct_b", correct_b, kinds="b", shape=correct_a.shape)
    a_only = int(np.sum(correct_a & ~correct_b))
    b_only = int(np.sum(~correct_a & correct_b))
    n = a_only + b_only
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * bdtr(min(a_only, b_only), n, 0.5)))


# ---------------------------------------------------------------------- protocol
def _prepare(run, memory_budget):
    """A probabilities Run of ``run`` kept in memory when it fits ``memory_budget`` bytes,
    so that each split and method reuses one softmax pass."""
    if not kind_of(run).softmax \
            or run.n_epochs * run.n_samples * run.n_classes * 8 > memory_budget:
        return run
    # forgetkit's own softmax: finite and normalised, no need to check again
    return run.replace(outputs=run.probs(), kind="probs", validate=False)


def protocol_splits(run, *, seeds=(0, 1, 2), val_frac=0.5, val_run=None,
                    memory_budget=DEFAULT_MEMORY_BUDGET, softmax_stats=False, progress=False):
    """Yield (split, validation run, test run) of the paper's protocol, or the one pair
    ("val_run", val_run, run) when a separate validation run is given. A streamed logits
    run's forgetting pass (and, with ``softmax_stats``, its `Run.softmax_stats`) is
    computed once and shared by every split."""
    check_run("run", run)
    if val_run is not None:
        check_run("val_run", val_run)
    seeds = check_ints("seeds", seeds, minimum=0)
    check_val_frac(val_frac)
    check_int("memory_budget", memory_budget, minimum=0)
    softmax_stats = check_bool("softmax_stats", softmax_stats)
    check_bool("progress", progress)
    return _protocol_splits(run, seeds, val_frac, val_run, memory_budget, softmax_stats,
                            progress)


def _protocol_splits(run, seeds, val_frac, val_run, memory_budget, softmax_stats, progress):
    if val_run is not None:
        yield "val_run", _prepare(val_run, memory_budget), _prepare(run, memory_budget)
        return
    full = _prepare(run, memory_budget)
    if kind_of(full).softmax and not executor_for(full).lazy:  # streamed, read here
        if softmax_stats:  # first: on float16 logits, it also gives the predictions
            full.softmax_stats(memory_budget=memory_budget)
        full.predictions(progress=progress)
    for s in seeds:
        val, test = split_indices(run.n_samples, val_frac, seed=s)
        yield s, full.isel(samples=val), full.isel(samples=test)


def single_hit(test):
    """Whether the single network (the final epoch's probabilities, as the fusers compare
    them) classifies each test sample correctly: bool (n_samples,)."""
    check_run("test", test)
    if not kind_of(test).full:  # exact from the records
        return np.asarray(test.correctness()[-1])
    return kernels.row_top(test.probs(-1), test.labels)[0] == test.labels


def _check_kf_fits(kf_fits):
    if kf_fits is not None:
        check_type("kf_fits", kf_fits, dict, "a dict of fits by (split, window), or None")


def _fitted_kf(fits, split, val, window, progress=False):
    """KF(inf) of window ``window`` fitted on ``val``, taken from / stored in ``fits``."""
    key = (split, window)
    if fits is not None and key in fits:
        return fits[key]
    kf = KnowledgeFusion(window=window, progress=progress).fit(val)
    if fits is not None:
        fits[key] = kf
    return kf


@keyword_options
def compare_splits(run, *, methods=DEFAULT_METHODS, seeds=(0, 1, 2), val_frac=0.5,
                   val_run=None, window=1, kf_fits=None, memory_budget=DEFAULT_MEMORY_BUDGET,
                   progress=False):
    """One row per (split, method): test accuracy, NLL, ECE, ensemble size k, gain over the
    single network on the same split and the McNemar p-value of that difference.

    With ``val_run`` (e.g. held-out training data with the same epochs) every method is
    fitted on it and scored on all of ``run``; ``seeds`` are then ignored. ``kf_fits``, a
    dict, keeps the KF(inf) fits by (split, window) and reuses those already in it (pass
    the same dict to `ensemble_size_curve` and `window_curve` to fit each split once).
    ``memory_budget``: bytes of probabilities kept in memory (the run's, then each
    ensemble selection's); larger runs are streamed. ``progress``: show the forgetting
    pass's and each KF fit's progress on a terminal.

    On a top-k token run every method is scored by its certificates (`Fuser.certified`):
    accuracy, gain and p_value count the certified correct tokens (uncertain ones as
    wrong), columns accuracy_low and accuracy_high give the interval [certified correct,
    certified correct + uncertain] in percent, nll is exact (the target's fused
    probability is), ece is nan. Likelihood fusion uses only the targets' probabilities,
    exact on such runs.
    """
    check_run("run", run)
    if val_run is not None:
        check_run("val_run", val_run)
    _check_kf_fits(kf_fits)
    if isinstance(methods, str):  # its letters are no methods
        raise InputTypeError(f"methods must be a list of method names; got str {methods!r}")
    methods = list(check_type("methods", methods, Iterable, "a list of method names"))
    for m in methods:
        check_option("method", m, tuple(METHODS))
    if "ensemble_selection" in methods and any(r is not None and executor_for(r).lazy
                                               and not kind_of(r).bounded
                                               for r in (run, val_run)):
        raise ForgetkitError("ensemble selection needs a run held in memory or on disk (each "
                             "round reads its outputs): on a run on a dask array pass methods "
                             "without 'ensemble_selection', or run fk.sweep on its files")
    rows = []
    # ensemble selection's bounds and first round, likelihood fusion's label probabilities
    shared = bool({"ensemble_selection", "likelihood"} & set(methods))
    for seed, val, test in protocol_splits(run, seeds=seeds, val_frac=val_frac,
                                           val_run=val_run, memory_budget=memory_budget,
                                           softmax_stats=shared, progress=progress):
        kf = _fitted_kf(kf_fits, seed, val, window, progress)
        k = kf.ensemble_size_
        single = single_hit(test)
        fusers = []
        for m in methods:
            if m in ("kf", "kf1"):  # KF(1) is the prefix of KF(inf)'s plan: no second fit
                fusers.append(kf if m == "kf" else kf.with_windows(1))
            else:
                fusers.append(BASELINES[m](k, memory_budget).fit(val))
        bounded = kind_of(test).bounded
        scored = score_certified(fusers, test) if bounded else score_fusers(fusers, test)
        for m, fuser, (hit, nll_, ece_, *high) in zip(methods, fusers, scored, strict=True):
            row = {
                "split": seed, "method": m, "k": fuser.ensemble_size_,
                "accuracy": 100 * hit.mean(),
                "gain": 100 * (hit.mean() - single.mean()),
                "nll": nll_, "ece": ece_,
                "p_value": mcnemar(hit, single),
            }
            if bounded:  # the certified interval; accuracy (and gain, p) is its low end
                row.update(accuracy_low=row["accuracy"], accuracy_high=100 * high[0].mean())
            rows.append(row)
    return pd.DataFrame(rows)


@keyword_options
def compare(run, *, methods=DEFAULT_METHODS, seeds=(0, 1, 2), val_frac=0.5, val_run=None,
            window=1, kf_fits=None, memory_budget=DEFAULT_MEMORY_BUDGET, progress=False):
    """The paper's comparison table: one row per method.

    Columns: method (label), k (ensemble size, mean over splits), accuracy and accuracy_se
    (test accuracy in percent, mean and standard error = std(ddof=1) / sqrt(n_splits)),
    gain and gain_se (over the single network, percentage points), nll, ece, and p_max (the
    largest McNemar p-value over splits of the difference with the single network) with
    significant = p_max < 0.05 on every split. Options as in `compare_splits`.

    On a top-k token run, accuracy is the certified accuracy and columns accuracy_low and
    accuracy_high give the interval (see `compare_splits`).

    Returns
    -------
    pandas.DataFrame indexed by method name, in the order of ``methods``.
    """
    check_run("run", run)
    long = compare_splits(run, methods=methods, seeds=seeds, val_frac=val_frac,
                          val_run=val_run, window=window, kf_fits=kf_fits,
                          memory_budget=memory_budget, progress=progress)
    return table_of_splits(long)


def table_of_splits(long, *, method_labels=METHODS):
    """`compare`'s table from `compare_splits`' rows (one per split and method): means over
    the splits, standard errors, the largest p-value. ``method_labels``: method -> its label."""
    check_frame("long", long, SPLIT_COLUMNS)
    n = long["split"].nunique()

    def se(x):
        return float(np.std(x, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")

    rows = []
    for m, g in long.groupby("method", sort=False):
        rows.append({
            "method": m, "label": method_labels[m], "k": g["k"].mean(),
            "accuracy": g["accuracy"].mean(), "accuracy_se": se(g["accuracy"]),
            "gain": g["gain"].mean(), "gain_se": se(g["gain"]),
            "nll": g["nll"].mean(), "ece": g["ece"].mean(),
            "p_max": g["p_value"].max(),
            "significant": bool((g["p_value"] < 0.05).all()) and m != "single",
        })
        if "accuracy_low" in g:  # a top-k run: the certified interval
            rows[-1].update(accuracy_low=g["accuracy_low"].mean(),
                            accuracy_high=g["accuracy_high"].mean())
    return pd.DataFrame(rows).set_index("method")


#: The columns of `compare_splits`' rows that `table_of_splits` reads.
SPLIT_COLUMNS = ("split", "method", "k", "accuracy", "gain", "nll", "ece", "p_value")
#: The columns of `compare`'s table that `table_cells` reads.
TABLE_COLUMNS = ("label", "k", "accuracy", "accuracy_se", "gain", "gain_se", "nll", "ece",
                 "p_max", "significant")
TABLE_FORMATS = ("text", "markdown", "html")
TABLE_HEADER = ("method", "k", "test accuracy (%)", "gain (pp)", "NLL", "ECE", "McNemar p")
#: The column a top-k run's table adds: the certified accuracy interval.
INTERVAL_HEADER = "certified interval (%)"


def percent(x):
    """A fraction as a percentage with two decimals: 0.1234 -> "12.34%"."""
    return f"{100 * check_number('x', x, finite=False):.2f}%"


def _pm(mean, se):
    return f"{mean:.2f} ± {se:.2f}" if np.isfinite(se) else f"{mean:.2f}"


def table_cells(table):
    """The comparison table's rows as strings, in paper style (mean ± standard error, in
    percent; the single network has no p-value); a top-k run's rows end with the certified
    interval."""
    check_frame("table", table, TABLE_COLUMNS)
    rows = []
    for method, r in table.iterrows():
        p = "" if method == "single" else f"{r['p_max']:.3g}{' *' if r['significant'] else ''}"
        rows.append([r["label"], f"{r['k']:.1f}".rstrip("0").rstrip("."),
                     _pm(r["accuracy"], r["accuracy_se"]), _pm(r["gain"], r["gain_se"]),
                     f"{r['nll']:.4f}", f"{r['ece']:.4f}", p])
        if "accuracy_low" in table:
            rows[-1].append(f"[{r['accuracy_low']:.2f}, {r['accuracy_high']:.2f}]")
    return rows


@keyword_options
def format_table(table, *, fmt="text"):
    """The comparison table of `compare` as ``fmt``: "text" (aligned columns and a note),
    "markdown" or "html" (a ``<table>``, cells escaped)."""
    check_option("fmt", fmt, TABLE_FORMATS)
    header, rows = list(TABLE_HEADER), table_cells(table)
    if "accuracy_low" in table:
        header.append(INTERVAL_HEADER)
    if fmt == "markdown":
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    if fmt == "html":
        cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                        for row in rows)
        return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>" + cells
                + "</table>")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*header), line.format(*("-" * w for w in widths))]
    out += [line.format(*row) for row in rows]
    return "\n".join(out) + "\n(* significant at 0.05 on every split; p is the largest over splits)"


# ------------------------------------------------------------- ablation curves
def ensemble_size_curve(run, *, seeds=(0, 1, 2), val_frac=0.5, window=1, kf_fits=None,
                        progress=False):
    """Test gain of KF(i) over the single network against its ensemble size k.

    KF(i) (at most i windows with eps > 0) is the prefix of KF(inf)'s plan up to its i-th
    used window, so one fit per split gives every i. Returns a DataFrame with columns split,
    windows (i), k, accuracy and gain (percent / percentage points). ``kf_fits``: as in
    `compare_splits`.
    """
    check_run("run", run)
    _check_kf_fits(kf_fits)
    rows = []
    for s, val, test in protocol_splits(run, seeds=seeds, val_frac=val_frac, progress=progress):
        kf = _fitted_kf(kf_fits, s, val, window, progress)
        if kind_of(test).bounded:  # certified accuracies
            n_used = sum(eps > 0 for _, eps in kf.plan_)
            accs = [kf.with_windows(i).certified_accuracy(test)[0] for i in range(n_used + 1)]
            final = float(np.mean(single_hit(test)))
        else:
            accs = [np.mean(np.argmax(prob, axis=1) == test.labels)
                    for prob in kf.staged_predict_proba(test)]
            final = np.mean(np.argmax(test.probs(-1), axis=1) == test.labels)
        # lazy stages and single network (a run on dask) computed together on the workers
        *accs, single = executor_for(test).compute(*accs, final)
        for i, acc in enumerate(accs):
            rows.append({"split": s, "windows": i, "k": kf.with_windows(i).ensemble_size_,
                         "accuracy": 100 * float(acc), "gain": 100 * (float(acc) - single)})
    return pd.DataFrame(rows)


@keyword_options
def window_curve(run, *, windows=(0, 1, 2, 3, 4), seeds=(0, 1, 2), val_frac=0.5,
                 kf_fits=None, progress=False):
    """Test gain of KF(inf) over the single network for each window size w (the window
    ablation). Returns a DataFrame with columns split, window, k, accuracy, gain.
    ``kf_fits``: as in `compare_splits`."""
    check_run("run", run)
    windows = check_ints("windows", windows, minimum=0)
    _check_kf_fits(kf_fits)
    rows = []
    for s, val, test in protocol_splits(run, seeds=seeds, val_frac=val_frac, progress=progress):
        single = np.mean(single_hit(test))
        for w in windows:
            kf = _fitted_kf(kf_fits, s, val, w, progress)
            acc = kf.certified_accuracy(test)[0]  # on a top-k run: certified
            rows.append({"split": s, "window": w, "k": kf.ensemble_size_,
                         "accuracy": 100 * acc, "gain": 100 * (acc - single)})
    return pd.DataFrame(rows)
