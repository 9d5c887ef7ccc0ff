"""Data scores for pruning and coreset selection, from a run's training dynamics, and the
coreset selection itself.

`data_scores` gives, per training sample, the scores of the pruning literature (EL2N,
forgetting events, AUM, Data-IQ's variability and aleatoric uncertainty, dynamic
uncertainty, second-split forgetting time) from one stored run, through `Run`'s public
methods (`label_probs`, `correctness`, `label_margins`, `probs`). `select_coreset` keeps a
fraction of the samples by one score: the hardest, the easiest, at random, or by
coverage-centric selection (CCS, Zheng et al. 2023). The definitions are in
docs/definitions.md ("Data scores").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from .._validation import check_int, check_number, check_option, check_type
from ..errors import ForgetkitError, InputTypeError
from ..execution import executor_for
from ..kinds import kind_of
from ..run import check_run
from .dynamics import sample_index

#: Every score `data_scores` can give, in its column order (the last one only with a
#: second-split run).
SCORES = ("el2n", "forgetting", "aum", "variability", "aleatoric", "dynamic_uncertainty",
          "second_split_forgetting")
#: Scores for which a higher value means an easier sample; `select_coreset` negates these
#: columns when they are chosen by name.
EASIER_WHEN_HIGHER = ("aum", "second_split_forgetting")
#: The methods of `select_coreset`.
METHODS = ("ccs", "hardest", "easiest", "random")
#: Dynamic uncertainty's window J (He et al. 2023).
DEFAULT_WINDOW = 10
#: Share of the epochs EL2N averages, from the first one: ceil(EL2N_SHARE * E) epochs.
EL2N_SHARE = 0.1
#: Strata of CCS (Zheng et al. 2023 use 50).
DEFAULT_STRATA = 50
#: The largest hard cutoff of ``hard_cutoff="auto"`` (Zheng et al.'s at 90% pruning).
AUTO_CUTOFF_MAX = 0.3


def auto_hard_cutoff(keep):
    """CCS's hard cutoff for ``hard_cutoff="auto"``: min(0.3, max(0, 0.4 - keep)).

    No cutoff while half or more is kept, then growing with the pruning rate: 0.1 at keep
    0.3, 0.2 at keep 0.2, 0.3 at keep 0.1 and below (the cutoffs Zheng et al. 2023 publish
    with their code: 0.3 at 90% pruning of CIFAR-10 and ImageNet, 0.2 at 80% of ImageNet;
    docs/definitions.md).
    """
    keep = _check_fraction("keep", keep, lower_open=True)
    return round(min(AUTO_CUTOFF_MAX, max(0.0, 0.4 - keep)), 12)


def gentle_hard_cutoff(keep):
    """CCS's hard cutoff for ``hard_cutoff="gentle"``: min(auto, max(0, 0.6 - 2 keep)).

    The same published points as `auto_hard_cutoff` (0.2 at keep 0.2, 0.3 at keep 0.1 and
    below), but no cutoff while 30% or more is kept (0 at keep 0.3 where "auto" cuts 0.1;
    0.1 at keep 0.25). For data with few wrong labels: there the hardest samples are hard
    but correct, and worth keeping as long as the budget can still cover the easier ones
    (on Fashion-MNIST the 0.1 cutoff at keep 0.3 cost about a point of test accuracy
    against random; README "Choosing the data to keep").
    """
    keep = _check_fraction("keep", keep, lower_open=True)
    return round(min(auto_hard_cutoff(keep), max(0.0, 0.6 - 2 * keep)), 12)


#: The named cutoff schedules of `select_coreset`'s ``hard_cutoff``: name -> cutoff(keep).
HARD_CUTOFF_SCHEDULES = {"auto": auto_hard_cutoff, "gentle": gentle_hard_cutoff}


def data_scores(run, *, scores=None, epochs=None, window=DEFAULT_WINDOW, el2n_epochs=None,
                second_split=None):
    """Per-sample pruning scores of a (training-set) run: one row per sample.

    With p[e, n] the probability of sample n's label at epoch e and E the epochs used:

    - ``el2n``: mean over the first ``el2n_epochs`` epochs (default ceil(0.1 E)) of
      ||softmax(z[e, n]) - onehot(y_n)||_2 (Paul et al. 2021);
    - ``forgetting``: number of forgetting events (correct at an epoch, wrong at the
      next); inf for a sample never classified correctly (Toneva et al. 2019);
    - ``aum``: mean_e (z[e, n, y] - max_{k != y} z[e, n, k]) on logits (Pleiss et al.
      2020); on a probabilities run the same on log-probabilities;
    - ``variability``: std_e p (ddof 0); ``aleatoric``: mean_e p (1 - p) (Data-IQ, Seedat
      et al. 2022);
    - ``dynamic_uncertainty``: mean over k = 0 .. E - J of std(p[k:k+J]) (ddof 0), J =
      ``window`` (He et al. 2023);
    - ``second_split_forgetting`` (with ``second_split``): the epoch number from which on
      the sample is misclassified at every stored epoch of the second-split run; one more
      than its last epoch number if it is correct there (Maini et al. 2022).

    Higher means harder for every score but ``aum`` and ``second_split_forgetting``
    (higher = easier; `select_coreset` negates them when chosen by name).

    Parameters
    ----------
    run : Run
        Outputs of shape (n_epochs, n_samples, n_classes): logits, probabilities, or a
        summary (kind "summary", `forgetkit.summarize`) or a top-k run (kind "topk", k >= 2),
        which give every score but ``el2n`` exactly (EL2N needs every class's probability).
    scores : sequence of str, optional
        The columns to compute, from `SCORES`. Default: every score the run can give;
        those it cannot (``el2n`` of a summary, ``dynamic_uncertainty`` with fewer than
        ``window`` epochs, ``second_split_forgetting`` without ``second_split``) are left
        out and named, with the reason, in ``attrs["left_out"]``. Asking for one of those
        by name raises a ValueError that says why.
    epochs : sequence of int, optional
        The stored epoch *numbers* to use (``run.sel(epochs=...)``); default all.
    window : int, default 10
        Dynamic uncertainty's window J, 1 <= J <= E.
    el2n_epochs : int, optional
        EL2N's number of first epochs, 1 .. E; default ceil(0.1 E).
    second_split : Run, optional
        Outputs on the same samples as ``run`` (the first split) recorded after every
        epoch of training on the second split only. Samples are matched by sample id
        (positions when a run has none); a run over other samples, or giving other labels,
        raises a ValueError.

    Returns
    -------
    pandas.DataFrame
        One row per sample (index: ``run``'s sample ids, or positions), float64 columns
        in `SCORES` order. ``attrs``: ``n_epochs`` and ``epochs`` (numbers) used,
        ``window``, ``el2n_epochs`` and ``left_out`` ({column: reason}).
    """
    check_run("run", run)
    requested = _check_scores(scores)
    if epochs is not None:
        run = run.sel(epochs=epochs)
    n_epochs = run.n_epochs
    window = check_int("window", window, minimum=1)
    if el2n_epochs is None:
        el2n_epochs = math.ceil(EL2N_SHARE * n_epochs)
    el2n_epochs = check_int("el2n_epochs", el2n_epochs, minimum=1)
    if el2n_epochs > n_epochs:
        raise ForgetkitError(f"el2n_epochs must lie in [1, {n_epochs}] (the epochs used); "
                             f"got {el2n_epochs}")
    cannot = {}
    if not kind_of(run).full:
        cannot["el2n"] = f"el2n needs every class's probability; {kind_of(run).holds}"
    if window > n_epochs:
        cannot["dynamic_uncertainty"] = (f"dynamic_uncertainty needs at least window={window} "
                                         f"epochs; {n_epochs} are used")
    if second_split is None:
        cannot["second_split_forgetting"] = "second_split_forgetting needs a second_split run"
    if requested is None:
        columns = [s for s in SCORES if s not in cannot]
        left_out = {s: cannot[s] for s in SCORES if s in cannot}
    else:
        for s in requested:
            if s in cannot:
                raise ForgetkitError(cannot[s])
        columns, left_out = requested, {}
    second = _align_second_split(run, second_split) if second_split is not None else None
    # every score but SSFT is local to a sample: one pass per block of samples (on a run on
    # a dask array, per chunk on the workers), rows concatenated in sample order
    local = [c for c in columns if c != "second_split_forgetting"]
    df = executor_for(run).map_reduce(run, partial(_score_table, columns=tuple(local),
                                                   el2n_epochs=el2n_epochs, window=window))
    if second is not None and "second_split_forgetting" in columns:
        df["second_split_forgetting"] = second_split_forgetting(
            np.asarray(second.correctness()), second.epochs)
    df = df[columns]
    df.attrs.update(n_epochs=n_epochs, epochs=run.epochs.tolist(), window=window,
                    el2n_epochs=el2n_epochs, left_out=left_out)
    return df


def _score_table(run, *, columns, el2n_epochs, window):
    """The per-sample ``columns`` of `data_scores` (all but second_split_forgetting) of a
    run or a block of its samples: float64, index the sample ids (or positions)."""
    out = {}
    p = None
    if {"variability", "aleatoric", "dynamic_uncertainty"} & set(columns):
        p = np.asarray(run.label_probs(), dtype=np.float64)  # (N, E)
    for name in columns:
        if name == "el2n":
            out[name] = el2n(run, el2n_epochs)
        elif name == "forgetting":
            out[name] = forgetting_events(np.asarray(run.correctness()))
        elif name == "aum":
            out[name] = _aum(run)
        elif name == "variability":
            out[name] = p.std(axis=1)
        elif name == "aleatoric":
            out[name] = (p * (1.0 - p)).mean(axis=1)
        else:
            out[name] = dynamic_uncertainty(p, window)
    return pd.DataFrame({name: out[name] for name in columns}, index=sample_index(run),
                        dtype=np.float64)


def el2n(run, n_first):
    """EL2N: mean over the first ``n_first`` epochs of ||softmax(z) - onehot(y)||_2,
    float64 (n_samples,). Reads one epoch's probabilities at a time."""
    rows = np.arange(run.n_samples)
    total = np.zeros(run.n_samples)
    for e in range(n_first):
        err = run.probs(e)
        err[rows, run.labels] -= 1.0
        total += np.sqrt(np.einsum("nc,nc->n", err, err))
    return total / n_first


def forgetting_events(correct):
    """Forgetting events per sample of correctness (n_epochs, n_samples): the number of e
    with correct[e] and not correct[e + 1]; inf for a sample never correct."""
    correct = np.asarray(correct, dtype=bool)
    events = (correct[:-1] & ~correct[1:]).sum(axis=0).astype(np.float64)
    events[~correct.any(axis=0)] = np.inf
    return events


def dynamic_uncertainty(p, window):
    """Dynamic uncertainty of label probabilities p (n_samples, n_epochs): the mean over
    the n_epochs - window + 1 windows of ``window`` consecutive epochs of the population
    standard deviation of p in the window, float64 (n_samples,)."""
    p = np.asarray(p, dtype=np.float64)
    n_windows = p.shape[1] - window + 1
    if n_windows < 1:
        raise ForgetkitError(f"dynamic_uncertainty needs at least window={window} epochs; "
                             f"got {p.shape[1]}")
    total = np.zeros(p.shape[0])
    for k in range(n_windows):
        total += p[:, k:k + window].std(axis=1)
    return total / n_windows


def second_split_forgetting(correct, epochs):
    """Second-split forgetting time from the correctness (n_epochs, n_samples) of a run
    recorded while training on the second split: the epoch number (``epochs``) from which
    on a sample is wrong at every stored epoch; ``epochs[-1] + 1`` for a sample correct at
    the last epoch (not forgotten within the run). Float64 (n_samples,)."""
    correct = np.asarray(correct, dtype=bool)
    epochs = np.asarray(epochs)
    n_epochs = correct.shape[0]
    # the last epoch index at which the sample is correct (-1: never)
    last = n_epochs - 1 - np.argmax(correct[::-1], axis=0)
    last[~correct.any(axis=0)] = -1
    out = np.empty(correct.shape[1])
    forgotten = last < n_epochs - 1
    out[forgotten] = epochs[last[forgotten] + 1]
    out[~forgotten] = epochs[-1] + 1
    return out


def _aum(run):
    """Mean label margin over the run's epochs: on logits (and summaries) z_y minus the
    largest other logit, on probabilities log p_y minus the log of the largest other."""
    if kind_of(run).logit_margins:
        return np.asarray(run.label_margins(), dtype=np.float64).mean(axis=0)
    rows = np.arange(run.n_samples)
    tiny = np.finfo(np.float64).tiny
    total = np.zeros(run.n_samples)
    for e in range(run.n_epochs):
        probs = run.probs(e)
        label = probs[rows, run.labels].copy()
        probs[rows, run.labels] = -np.inf
        total += np.log(np.maximum(label, tiny)) - np.log(np.maximum(probs.max(axis=1), tiny))
    return total / run.n_epochs


def _check_scores(scores):
    """The requested score names as a list (None: all the run can give)."""
    if scores is None:
        return None
    if isinstance(scores, str):
        scores = [scores]
    scores = list(check_type("scores", scores, Iterable, "a score name or a list of them"))
    if not scores:
        raise ForgetkitError("scores must name at least one score; got none")
    for s in scores:
        check_option("scores", s, SCORES)
    if len(set(scores)) != len(scores):
        raise ForgetkitError(f"scores must not repeat a name; got {scores}")
    return [s for s in SCORES if s in scores]


def _ids(run):
    return run.sample_ids if run.sample_ids is not None else np.arange(run.n_samples)


def _align_second_split(run, second):
    """``second`` with its samples in ``run``'s order; ValueError if it holds other
    samples or gives them other labels."""
    if not hasattr(second, "correctness") or not hasattr(second, "sample_positions"):
        raise InputTypeError(f"second_split must be a Run; got {type(second).__name__}")
    ids, other = pd.Index(_ids(run)), pd.Index(_ids(second))
    missing, extra = ids.difference(other), other.difference(ids)
    if len(missing) or len(extra) or len(ids) != len(other):
        raise ForgetkitError(
            "second_split must hold the same samples as run (the first split); "
            f"it has {len(other)} samples and run {len(ids)}: "
            f"{len(missing)} of run's sample ids are missing from it"
            + (f" (e.g. {missing[:5].tolist()})" if len(missing) else "")
            + f", {len(extra)} of its ids are not in run"
            + (f" (e.g. {extra[:5].tolist()})" if len(extra) else ""))
    pos = other.get_indexer(ids)
    if not np.array_equal(pos, np.arange(len(pos))):
        second = second.isel(samples=pos)
    if not np.array_equal(second.labels, run.labels):
        n = int(np.argmax(second.labels != run.labels))
        raise ForgetkitError(
            f"second_split gives other labels than run for the same samples: sample "
            f"{ids[n]!r} has label {int(second.labels[n])} there and {int(run.labels[n])} "
            "in run")
    return second


# ------------------------------------------------------------------- coreset selection
def select_coreset(scores, keep, *, score=None, method="ccs", hard_cutoff=0.0,
                   strata=DEFAULT_STRATA, seed=0, labels=None):
    """Sample ids of a coreset: the fraction ``keep`` of the samples, chosen by a score.

    The score is a *hardness*: higher = harder. Methods, with N samples and m =
    round(keep N):

    - "hardest": the m highest scores (ties: the earlier row first);
    - "easiest": the m lowest scores (ties likewise);
    - "random": m samples uniformly at random, without replacement (the score is unused);
    - "ccs": coverage-centric selection (Zheng et al. 2023): remove the round(hard_cutoff
      N) hardest samples; split the range [min, max] of the rest's scores into ``strata``
      equal-width bins (the maximum in the last; inf in the last, -inf in the first, the
      range taken over finite scores); give the budget m to the non-empty bins from the
      smallest up (ties: lower bin first), each min(its size, remaining budget // bins
      left); draw each bin's share uniformly at random.

    With ``labels`` the selection is class-balanced: each class keeps its share of m
    (round(keep n_c), by largest remainders so that the shares sum to m, ties to the
    first class in sorted order) chosen by the method among that class's samples alone,
    with CCS's cutoff round(hard_cutoff n_c) per class (at most n_c - its share).

    Parameters
    ----------
    scores : pandas.DataFrame, pandas.Series or array-like of shape (n_samples,)
        A DataFrame (e.g. `data_scores`' result) with ``score`` naming the column; a
        column chosen by name is turned into hardness: ``aum`` and
        ``second_split_forgetting`` (higher = easier) are negated, the others are taken
        as they are. A Series or an array is taken as hardness as it is (pass ``-aum``).
        Sample ids: the index (positions for an array). NaN is refused; +-inf is kept.
    keep : float in (0, 1]
        Fraction of the samples to keep.
    score : str, optional
        The column of a DataFrame; optional for a one-column DataFrame.
    method : {"ccs", "hardest", "easiest", "random"}, default "ccs"
    hard_cutoff : float in [0, 1), "auto" or "gentle", default 0.0
        CCS's share of hardest samples removed first (only with method "ccs");
        keep + hard_cutoff must not exceed 1. "auto": `auto_hard_cutoff` (keep), which
        grows with the pruning rate as Zheng et al.'s published cutoffs do (0 for keep
        >= 0.4, 0.3 for keep <= 0.1); "gentle": `gentle_hard_cutoff` (keep), the same
        but 0 down to keep 0.3 (for data with few wrong labels). With the other methods
        both mean no cutoff.
    strata : int, default 50
        CCS's number of bins.
    seed : int, default 0
        Seed of numpy's default_rng for "random" and "ccs".
    labels : array-like of shape (n_samples,), pandas.Series or str, optional
        Class of each sample, for a class-balanced selection: in row order, a Series
        aligned on the scores' sample ids, or the name of a DataFrame column.

    Returns
    -------
    ndarray of shape (m,)
        The kept samples' ids, in the order of the scores' rows.

    Notes
    -----
    The recommended default, measured by retraining on Fashion-MNIST (above random at
    every fraction from 70% to 10% kept; README, "Choosing the data to keep"):
    ``select_coreset(data_scores(run), keep, score="aleatoric", method="ccs",
    labels=run.labels)``.
    """
    keep, hard_cutoff, strata, seed = check_coreset_options(
        keep, method=method, hard_cutoff=hard_cutoff, strata=strata, seed=seed)
    values, ids = _hardness(scores, score)
    n = len(values)
    m = int(round(keep * n))
    rng = np.random.default_rng(seed)
    if labels is None:
        chosen = _select(values, m, method, min(int(round(hard_cutoff * n)), n - m), strata,
                         rng)
    else:
        classes = _class_codes(labels, scores, ids)
        sizes = np.bincount(classes)
        shares = class_shares(sizes, m)
        chosen = []
        for c in np.flatnonzero(sizes):
            where = np.flatnonzero(classes == c)
            cut = min(int(round(hard_cutoff * sizes[c])), int(sizes[c] - shares[c]))
            chosen.append(where[_select(values[where], int(shares[c]), method, cut, strata,
                                        rng)])
        chosen = np.concatenate(chosen)
    return ids[np.sort(chosen)]


def _select(values, m, method, n_cut, strata, rng):
    """Positions of the ``m`` samples ``method`` keeps among ``values``."""
    if method == "random":
        return rng.choice(len(values), size=m, replace=False)
    if method in ("hardest", "easiest"):
        order = np.argsort(-values if method == "hardest" else values, kind="stable")
        return order[:m]
    return _ccs(values, m, n_cut, strata, rng)


def class_shares(sizes, m):
    """Each class's share of ``m`` kept samples, proportional to its size ``sizes``: the
    floors of m n_c / N, then one more for the largest remainders (ties: lower class)
    until they sum to m. int64 array like ``sizes``."""
    sizes = np.asarray(sizes, dtype=np.int64)
    exact = m * sizes / sizes.sum()
    shares = np.floor(exact).astype(np.int64)
    extra = m - int(shares.sum())
    if extra > 0:
        order = np.argsort(-(exact - shares), kind="stable")
        shares[order[:extra]] += 1
    return shares


def _class_codes(labels, scores, ids):
    """Class index 0 .. K - 1 (sorted classes) of every row, from `select_coreset`'s
    ``labels``."""
    if isinstance(labels, str):
        if not isinstance(scores, pd.DataFrame) or labels not in scores.columns:
            have = list(scores.columns) if isinstance(scores, pd.DataFrame) else "none"
            raise ForgetkitError(f"labels {labels!r} is not a column of scores; the columns "
                                 f"are {have}")
        labels = scores[labels].to_numpy()
    elif isinstance(labels, pd.Series):
        missing = pd.Index(ids).difference(labels.index)
        if len(missing):
            raise ForgetkitError(f"labels has no label for {len(missing)} of the {len(ids)} "
                                 f"samples (first: {missing[0]!r})")
        labels = labels.reindex(ids).to_numpy()
    labels = np.asarray(labels)
    if labels.shape != (len(ids),):
        raise ForgetkitError(f"labels must have shape ({len(ids)},), one per sample of "
                             f"scores; got shape {labels.shape}")
    if labels.dtype.kind == "f" and np.isnan(labels).any():
        raise ForgetkitError(f"labels must not contain NaN; {int(np.isnan(labels).sum())} "
                             f"of {len(labels)} are NaN")
    if labels.dtype.kind == "f" and not np.all(labels == np.round(labels)):
        raise InputTypeError(f"labels must be integers or strings; got non-integer values of "
                             f"dtype {labels.dtype}")
    if labels.dtype.kind not in "iufbUS" and not all(
            isinstance(v, (str, numbers.Integral)) for v in labels):
        raise InputTypeError(f"labels must be integers or strings; got dtype {labels.dtype}")
    return np.unique(labels, return_inverse=True)[1].reshape(-1)


def check_coreset_options(keep, *, method, hard_cutoff, strata, seed):
    """`select_coreset`'s options, checked: (keep, hard_cutoff, strata, seed)."""
    check_option("method", method, METHODS)
    keep = _check_fraction("keep", keep, lower_open=True)
    if isinstance(hard_cutoff, str):
        check_option("hard_cutoff", hard_cutoff, tuple(HARD_CUTOFF_SCHEDULES))
        hard_cutoff = HARD_CUTOFF_SCHEDULES[hard_cutoff](keep) if method == "ccs" else 0.0
    hard_cutoff = _check_fraction("hard_cutoff", hard_cutoff, lower_open=False)
    strata = check_int("strata", strata, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    if hard_cutoff > 0 and method != "ccs":
        raise ForgetkitError(f"hard_cutoff applies to method='ccs' only; got "
                             f"hard_cutoff={hard_cutoff} with method={method!r}")
    if keep + hard_cutoff > 1:
        raise ForgetkitError(f"keep + hard_cutoff must not exceed 1; got keep={keep} and "
                             f"hard_cutoff={hard_cutoff}")
    return keep, hard_cutoff, strata, seed


def read_scores_csv(path):
    """A scores table written by ``data_scores(...).to_csv`` (``forgetkit scores``): the
    first column is the sample ids (the index)."""
    from ..errors import MissingFileError

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no such scores file: {str(path)!r}")
    try:
        table = pd.read_csv(path, index_col=0)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ForgetkitError(f"{str(path)!r} is not a scores CSV: {err}") from None
    if table.empty or table.shape[1] == 0:
        raise ForgetkitError(f"{str(path)!r} holds no scores (a CSV with the sample ids "
                             "first, then one column per score)")
    return table


def ccs_strata(values, strata):
    """CCS's bin (0 .. strata - 1) of each score: equal-width bins over [min, max] of the
    finite scores, the maximum in the last bin, inf in the last and -inf in the first."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    bins = np.where(values == -np.inf, 0, strata - 1)
    if finite.size:
        lo, hi = finite.min(), finite.max()
        width = (hi - lo) / strata
        if not np.isfinite(width):  # a range beyond the largest float
            width = hi / strata - lo / strata
        if width > 0:
            where = np.isfinite(values)
            k = np.floor((values[where] - lo) / width)
            bins[where] = np.clip(k, 0, strata - 1).astype(np.int64)
    return bins


def ccs_budgets(sizes, m):
    """CCS's share of the budget ``m`` for bins of these sizes: the non-empty bins from
    the smallest up (ties: the lower bin first) each get min(size, remaining // bins
    left). int64 array like ``sizes``; it sums to min(m, sum(sizes))."""
    sizes = np.asarray(sizes, dtype=np.int64)
    budgets = np.zeros_like(sizes)
    order = [b for b in np.argsort(sizes, kind="stable") if sizes[b] > 0]
    remaining = m
    for i, b in enumerate(order):
        take = min(int(sizes[b]), remaining // (len(order) - i))
        budgets[b] = take
        remaining -= take
    return budgets


def _ccs(values, m, n_cut, strata, rng):
    """Positions CCS keeps (see `select_coreset`)."""
    order = np.argsort(-values, kind="stable")
    rest = np.sort(order[n_cut:])
    bins = ccs_strata(values[rest], strata)
    budgets = ccs_budgets(np.bincount(bins, minlength=strata), m)
    chosen = [rng.choice(rest[bins == b], size=budgets[b], replace=False)
              for b in range(strata) if budgets[b] > 0]
    return np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)


def _check_fraction(name, value, *, lower_open):
    """A number in (0, 1] (lower_open) or [0, 1)."""
    value = check_number(name, value)
    ok = 0 < value <= 1 if lower_open else 0 <= value < 1
    if not ok:
        raise ForgetkitError(f"{name} must lie in {'(0, 1]' if lower_open else '[0, 1)'}; "
                             f"got {value}")
    return value


def _hardness(scores, score):
    """(hardness values float64 (N,), sample ids (N,)) of `select_coreset`'s input."""
    if isinstance(scores, pd.DataFrame):
        if score is None:
            if scores.shape[1] != 1:
                raise ForgetkitError("score must name the column of scores to use; the "
                                     f"columns are {list(scores.columns)}")
            score = scores.columns[0]
        if score not in scores.columns:
            raise ForgetkitError(f"score {score!r} is not a column of scores; the columns "
                                 f"are {list(scores.columns)}")
        column = scores[score]
        if isinstance(column, pd.DataFrame):
            raise ForgetkitError(f"scores has several columns named {score!r}")
        values = _as_float("scores", column.to_numpy())
        if score in EASIER_WHEN_HIGHER:
            values = -values
        ids = scores.index.to_numpy()
    else:
        if score is not None:
            raise ForgetkitError("score names a column of a DataFrame; scores is a "
                                 f"{type(scores).__name__}")
        if isinstance(scores, pd.Series):
            values, ids = _as_float("scores", scores.to_numpy()), scores.index.to_numpy()
        else:
            values = _as_float("scores", scores)
            ids = np.arange(len(values))
    if values.ndim != 1:
        raise ForgetkitError(f"scores must be one-dimensional; got shape {values.shape}")
    if values.size == 0:
        raise ForgetkitError("scores holds no samples")
    nan = np.isnan(values)
    if nan.any():
        raise ForgetkitError(f"scores must not contain NaN; {int(nan.sum())} of {len(values)} "
                             f"are NaN (first at sample {ids[int(np.argmax(nan))]!r})")
    repeated = pd.Index(ids).duplicated()
    if repeated.any():
        first = ids[int(np.argmax(repeated))]
        first = first.item() if isinstance(first, np.generic) else first
        raise ForgetkitError(f"scores must have one row per sample; sample id {first!r} "
                             "appears more than once")
    return values, ids


def _as_float(name, values):
    arr = np.asarray(values)
    if arr.dtype == object:
        if not all(isinstance(v, numbers.Real) for v in arr.ravel()):
            raise InputTypeError(f"{name} must be numbers; got dtype object")
        arr = arr.astype(np.float64)
    if arr.dtype.kind not in "iufb":
        raise InputTypeError(f"{name} must be numbers; got dtype {arr.dtype}")
    return arr.astype(np.float64)
