"""Label issues from training dynamics: a score per sample (higher = more likely mislabelled)
and a flagged set, from the whole trajectory of a training-set run rather than its last epoch.

- Noise model: the calibrated confident joint (confident learning, Northcutt et al. 2021) of
  the given labels and the trajectory-averaged probabilities estimates how many samples of
  each true class carry each given label; its off-diagonal cells, shrunk towards their mean
  (a Dirichlet prior), give the noise transition T[given | true].
- Score: the log odds that a sample's label is wrong, with the trajectory's mean
  log-probabilities as the evidence for each true class (the margin that AUM averages,
  against every class at once) and T as the prior.
- Flagged set: the highest scores, as many as the joint's off-diagonal estimates.

A summary run gives the same from exact label probabilities and lower bounds for the other
classes (`label_issues`, `summary_statistics`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from .._deprecation import renamed
from .._progress import Progress
from .._validation import check_array, check_bool, check_int, check_labels, check_option
from ..errors import ForgetkitError
from ..execution import combine, executor_for
from ..kinds import kind_of
from ..run import check_run
from .dynamics import sample_index, trajectory

#: Rows per chunk of the confident-joint count and the scores (bounds their temporaries).
CHUNK_ROWS = 1 << 16


def pred_probs(run, *, how="mean"):
    """Probabilities of every sample from a run, for cleanlab and the like.

    Parameters
    ----------
    run : Run
    how : {"mean", "final"}
        "mean": the mean over epochs of the probabilities (the trajectory average);
        "final": the final epoch's.

    Returns
    -------
    ndarray of float64, shape (n_samples, n_classes)
        A dask array, computed per chunk of samples when asked, for a run on a dask array.
    """
    check_run("run", run)
    check_option("how", how, ("mean", "final"))
    if how == "final":
        return run.probs(run.n_epochs - 1)
    return run.mean_probs(range(run.n_epochs))


def confident_joint(labels, probs):
    """The calibrated confident joint of given labels and predicted probabilities
    (confident learning, Northcutt et al. 2021).

    Per class j the threshold t_j is the mean of probs[:, j] over the samples labelled j. A
    sample counts in cell (given label, j) for the class j of largest probability among
    those with probs[n, j] >= t_j (none: it is not counted). Each row is then scaled to
    the number of samples with that given label.

    Parameters
    ----------
    labels : array-like of int, shape (n_samples,)
    probs : ndarray of shape (n_samples, n_classes)

    Returns
    -------
    ndarray of float64, shape (n_classes, n_classes)
        Rows: given label; columns: estimated true label. Its off-diagonal sum is the
        estimated number of label issues.
    """
    probs = np.asarray(probs)
    if probs.ndim != 2:
        raise ForgetkitError(f"probs must have shape (samples, classes); got shape "
                             f"{probs.shape}")
    n_samples, n_classes = probs.shape
    labels = check_labels(labels, n_samples, n_classes)
    counts, thresholds = class_thresholds(labels, probs[np.arange(n_samples), labels],
                                          n_classes)
    return calibrate(confident_counts(labels, probs, thresholds), counts)


def class_thresholds(labels, label_probs, n_classes):
    """Samples per given class and the confident-joint thresholds: int64 (n_classes,) and
    float64 (n_classes,), the mean of ``label_probs`` (n_samples,), each sample's
    probability of its label, over the samples of each class (inf for an empty class).
    Summed in sample order, so a run's thresholds take its whole column."""
    counts = np.bincount(labels, minlength=n_classes)
    sums = np.bincount(labels, weights=label_probs, minlength=n_classes)
    thresholds = np.full(n_classes, np.inf)
    np.divide(sums, counts, out=thresholds, where=counts > 0)
    return counts, thresholds


def confident_counts(labels, probs, thresholds):
    """The uncalibrated confident joint of samples (n_samples,) and probs (n_samples,
    n_classes) given the class thresholds: float64 (n_classes, n_classes) counts, so the
    counts of blocks of samples add up to the whole's."""
    n_classes = probs.shape[1]
    raw = np.zeros((n_classes, n_classes))
    for start in range(0, len(probs), CHUNK_ROWS):
        block = probs[start:start + CHUNK_ROWS]
        above = block >= thresholds
        guess = np.argmax(np.where(above, block, -np.inf), axis=1)
        confident = above.any(axis=1)
        np.add.at(raw, (labels[start:start + CHUNK_ROWS][confident], guess[confident]), 1)
    return raw


def calibrate(raw, counts):
    """The confident joint: counts ``raw`` (n_classes, n_classes) with each row scaled to
    the class's number of samples ``counts`` (rows without counts stay 0)."""
    row = raw.sum(axis=1, keepdims=True)
    return np.divide(raw * counts[:, None], row, out=np.zeros_like(raw), where=row > 0)


#: Pseudo-counts added to each off-diagonal cell of the confident joint, in units of the mean
#: off-diagonal cell (at least 1): the Dirichlet prior of the noise transition.
PRIOR_CELLS = 2.0


def noise_transition(joint):
    """The noise transition T[given, true] = P(given label | true class) of a confident joint
    (n_classes, n_classes), each off-diagonal cell raised by PRIOR_CELLS times the mean
    off-diagonal cell (at least 1) before the columns are normalised."""
    joint = np.asarray(joint, dtype=np.float64)
    off = ~np.eye(len(joint), dtype=bool)
    smoothed = joint + off * (PRIOR_CELLS * max(joint[off].mean(), 1.0))
    return smoothed / smoothed.sum(axis=0, keepdims=True)


def label_issues(run, *, n_issues=None, progress=False):
    """Samples whose label is likely wrong, from a run of training-set outputs.

    One streaming pass over the epochs gives the trajectory-averaged probabilities P and
    log-probabilities L (n_samples, n_classes). With T = `noise_transition` of
    `confident_joint`(labels, P), sample n of label y has posterior weights
    ``w[j] = exp(L[n, j]) * T[y, j]`` over its true class j, and

    - ``score = log(sum_{j != y} w[j]) - log(w[y])``, the log odds that the label is wrong;
    - ``suggested_label = argmax_j w[j]`` (lowest class on ties), the most likely true class;
    - the flagged set is the ``n_issues`` highest scores (ties: run order), by default the
      number of issues confident learning estimates (the joint's off-diagonal sum).

    A summary run (kind "summary": per epoch e the label's probability p_y, the largest
    other class k_e and its probability p_k, exactly) is read in one streaming pass too,
    keeping per sample a few numbers and `SUMMARY_SLOTS` classes (`summary_statistics`); a
    top-k run (k >= 2) is read through its exact summary, so it gives what the summary of
    the same logits gives:

    - exact: P[n, y] and L[n, y]; Lo[n] = mean_e log p_k(e), the mean log-probability of
      the largest other class of each epoch;
    - lower bounds: for a class j != y, B[n, j] = (1 / E) sum of p_k(e) over the epochs
      where k_e = j, <= P[n, j] (a class never largest has 0, and one that loses its slot
      to a newer class when a sample has met more than `SUMMARY_SLOTS` restarts from 0);
    - the confident joint is `confident_joint`'s with B[n, j] in place of P[n, j] for
      j != y (thresholds exact, as they use P[n, y] only);
    - the other classes' weight is pooled: ``w_other = exp(Lo) * Tbar``, Tbar the mean of
      T[y, j] over the tracked classes weighted by B[n, j], so ``score = log(w_other) -
      log(w[y])``; ``suggested_label`` is the argmax of w[y] and the shares ``exp(Lo) * B[n, j] *
      T[y, j] / sum_j B[n, j]`` of the tracked classes (lowest class on ties).

    When the largest other class is the same class k at every epoch, B[n, k] = P[n, k] and
    Lo = L[n, k] are exact, and the summary's results equal the full run's but for the
    classes that were never largest: their weights are left out of the score, and they are
    never counted in the joint (the full run may count one whose mean probability reaches
    its threshold).

    A top-k run of a language model's tokens (targets at positions > 0 of their sequences)
    is refused: its labels are next-token targets (`check_given_labels`).

    Parameters
    ----------
    run : Run
        A run of the outputs on the training samples, with the labels they were trained on
        (logits, probabilities, or a summary of logits: see above).
    n_issues : int, optional
        Flag this many samples instead of the estimated number.
    progress : bool, default False

    Returns
    -------
    pandas.DataFrame
        One row per sample in run order (index: sample ids, or positions), columns
        ``label`` (given), ``suggested_label``, ``score`` (float, higher = more likely
        mislabelled) and ``is_issue`` (bool). ``attrs["summary"]`` is a dict of plain Python
        values (so that pandas carries it through its operations):

        - ``n_issues``: samples flagged; ``estimated_issues``: confident learning's
          estimate (float); ``noise_rate``: estimated_issues / n_samples;
        - ``per_class``: ``{"n_samples": {class: int}, "estimated_issues": {class: float},
          "noise_rate": {class: float}}`` per given class (class names when the run has
          them): ``pandas.DataFrame(summary["per_class"])`` is the table;
        - ``joint``: the calibrated confident joint, a list of n_classes rows (given label)
          of n_classes floats (estimated true label);
        - ``n_epochs``: epochs used.
    """
    check_run("run", run)
    check_bool("progress", progress)
    check_given_labels(run)
    if not kind_of(run).full:  # a summary, or a top-k run through its summary
        joint, score, suggested, n_epochs = _summary_scores(run, progress)
    else:
        joint, score, suggested, n_epochs = _full_scores(run, progress)
    labels, n_classes = run.labels, run.n_classes
    off = joint.sum(axis=1) - np.diag(joint)
    estimated = float(off.sum())
    if n_issues is None:
        n_issues = int(round(estimated))
    else:
        n_issues = check_int("n_issues", n_issues, minimum=0)
        if n_issues > run.n_samples:
            raise ForgetkitError(f"n_issues must lie in [0, {run.n_samples}] (the run's "
                                 f"samples); got {n_issues}")
    flagged = np.zeros(run.n_samples, dtype=bool)
    flagged[np.argsort(-score, kind="stable")[:n_issues]] = True
    names = run.class_names or list(range(n_classes))
    counts = np.bincount(labels, minlength=n_classes)
    rates = np.divide(off, counts, out=np.zeros(n_classes), where=counts > 0)
    per_class = {"n_samples": dict(zip(names, counts.tolist(), strict=True)),
                 "estimated_issues": dict(zip(names, off.tolist(), strict=True)),
                 "noise_rate": dict(zip(names, rates.tolist(), strict=True))}
    df = pd.DataFrame({"label": labels, "suggested_label": suggested, "score": score,
                       "is_issue": flagged}, index=sample_index(run))
    df.attrs["summary"] = {
        "n_issues": n_issues,
        "estimated_issues": estimated,
        "noise_rate": estimated / run.n_samples,
        "per_class": per_class,
        "joint": joint.tolist(),
        "n_epochs": n_epochs,
    }
    return df


def check_given_labels(run):
    """Raise ForgetkitError where ``run``'s labels are next-token targets: a top-k run whose
    token table places some target after the start of its sequence (position > 0, as
    `forgetkit.TokenRecorder` records a language model's tokens). A classifier's top-k run
    (`forgetkit.to_topk` without positions: every sample its own sequence at position 0)
    has labels a person gave."""
    positions = run.positions
    if positions is not None and len(positions) and int(np.max(positions)) > 0:
        raise ForgetkitError("label_issues audits labels a person gave; this run's labels are "
                             "next-token targets (its token table has positions up to "
                             f"{int(np.max(positions))}), which no one labelled")


def _full_scores(run, progress):
    """(joint, score, suggested, n_epochs) of a run of every class's outputs, in steps over
    its chunks of samples on the run's executor (`forgetkit.execution`): one pass over each
    chunk keeps its labels and trajectory means where they were computed, then

    1. each sample's mean probability of its label, gathered in sample order (N floats):
       the class thresholds, summed in sample order (per-chunk sums would round
       differently);
    2. each chunk's confident counts under those thresholds (C, C), summed: integer counts,
       exact; the joint and the noise transition T follow;
    3. each chunk's scores and suggested labels under log T, concatenated.

    Only N-long columns and (C, C) tables leave the chunks; the results are the same on
    every executor."""
    means = executor_for(run).persist(run, _chunk_means, progress=progress,
                                      desc="training dynamics")
    counts, thresholds = class_thresholds(run.labels, np.concatenate(means.map(_label_probs)),
                                          run.n_classes)
    joint = calibrate(combine(means.map(_chunk_counts, thresholds)), counts)
    log_t = np.log(noise_transition(joint))
    score, suggested = (np.concatenate(part) for part in zip(*means.map(_chunk_scores, log_t),
                                                               strict=True))
    return joint, score, suggested, run.n_epochs


def _chunk_means(run, progress=False):
    """(labels (n,), mean probabilities (n, C), mean log-probabilities (n, C)) of a chunk."""
    t = trajectory(run, mean_probs=True, mean_log_probs=True, progress=progress)
    return run.labels, t.mean_probs, t.mean_log_probs


def _label_probs(means):
    labels, probs, _ = means
    return probs[np.arange(len(labels)), labels]


def _chunk_counts(means, thresholds):
    labels, probs, _ = means
    return confident_counts(labels, probs, thresholds)


def _chunk_scores(means, log_t):
    """`issue_scores` of a chunk's means, CHUNK_ROWS rows at a time on a copy (the kept means
    stay as they are: a step may run twice)."""
    labels, _, log_probs = means
    parts = [issue_scores(labels[i:i + CHUNK_ROWS], log_probs[i:i + CHUNK_ROWS].copy(), log_t)
             for i in range(0, max(len(labels), 1), CHUNK_ROWS)]
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))


def issue_scores(labels, mean_log_probs, log_t):
    """(score float64, suggested int64), each (n_samples,), of samples of given ``labels``
    with trajectory-averaged log-probabilities ``mean_log_probs`` (n_samples, n_classes,
    overwritten) under the log noise transition ``log_t`` (n_classes, n_classes); row by
    row, so blocks of samples give the whole's values."""
    n = len(labels)
    score, suggested = np.empty(n), np.empty(n, dtype=np.int64)
    for start in range(0, n, CHUNK_ROWS):
        part = slice(start, start + CHUNK_ROWS)
        y = labels[part]
        rows = np.arange(len(y))
        log_w = mean_log_probs[part]  # becomes log w in place: the pass's buffer
        log_w += log_t[y]
        suggested[part] = np.argmax(log_w, axis=1)
        own = log_w[rows, y].copy()
        log_w[rows, y] = -np.inf
        score[part] = logsumexp(log_w, axis=1) - own
    return score, suggested


scores = renamed(issue_scores, "scores", where="forgetkit.analysis.label_issues")


#: Classes a summary pass tracks per sample among those that were its largest other class.
SUMMARY_SLOTS = 4


def summary_statistics(run, *, progress=False):
    """One streaming pass over the epochs of a summary run: per sample, the exact means of
    the label's probability and log-probability and of the largest other class's
    log-probability, and the lower bounds of the mean probabilities of the classes that
    were its largest other class (`SUMMARY_SLOTS` per sample).

    Returns
    -------
    dict
        ``mean_p`` and ``mean_log_p`` of the label, ``mean_log_other`` (n_samples,)
        float64; ``classes`` (n_samples, SUMMARY_SLOTS) int64 (-1: empty slot) and
        ``bounds`` (n_samples, SUMMARY_SLOTS) float64: (1 / E) times the sum of p_k over
        the epochs where k was the largest other class (since it last took its slot: a
        class meeting a full sample's slots replaces the one of least sum, so each bound
        stays a lower bound).
    """
    n, n_epochs, kind = run.n_samples, run.n_epochs, kind_of(run)
    rows = np.arange(n)
    total_p, total_log, total_other = np.zeros(n), np.zeros(n), np.zeros(n)
    classes = np.full((n, SUMMARY_SLOTS), -1, dtype=np.int64)
    sums = np.zeros((n, SUMMARY_SLOTS))
    bar = Progress(n_epochs, "label issues (summary)", enabled=progress)
    for e in range(n_epochs):
        records = kind.summary(run, slice(e, e + 1))[0]
        lse = records["lse"].astype(np.float64)
        log_p = records["label"] - lse
        total_log += log_p
        total_p += np.exp(log_p)
        log_other = records["other"] - lse
        total_other += log_other
        k = records["other_class"].astype(np.int64)
        match = classes == k[:, None]
        hit = match.any(axis=1)
        slot = np.where(hit, match.argmax(axis=1), sums.argmin(axis=1))
        sums[rows, slot] = np.where(hit, sums[rows, slot], 0.0) + np.exp(log_other)
        classes[rows, slot] = k
        bar.update()
    return {"mean_p": total_p / n_epochs, "mean_log_p": total_log / n_epochs,
            "mean_log_other": total_other / n_epochs, "classes": classes,
            "bounds": sums / n_epochs}


def _summary_scores(run, progress):
    """(joint, score, suggested, n_epochs) of a summary run (see `label_issues`)."""
    s = summary_statistics(run, progress=progress)
    labels, n_classes, n = run.labels, run.n_classes, run.n_samples
    # confident joint: the label's mean probability exact, the others' lower bounds
    counts, thresholds = class_thresholds(labels, s["mean_p"], n_classes)
    classes = np.column_stack([labels, s["classes"]])
    values = np.column_stack([s["mean_p"], s["bounds"]])
    tracked = classes >= 0
    above = tracked & (values >= thresholds[np.where(tracked, classes, 0)])
    best = np.where(above, values, -np.inf)
    top = best.max(axis=1, keepdims=True)
    # the largest value above its threshold, ties to the lowest class (as argmax on columns)
    guess = np.where(above & (best == top), classes, n_classes).min(axis=1)
    confident = above.any(axis=1)
    raw = np.bincount(labels[confident] * n_classes + guess[confident],
                      minlength=n_classes * n_classes).reshape(n_classes, n_classes)
    joint = calibrate(raw.astype(np.float64), counts)
    # score: the label's evidence exact; the others' pooled as the largest other class's
    # mean log-probability, with the noise prior mixed by their bounds
    t = noise_transition(joint)
    others = s["classes"]
    bounds = np.where(others >= 0, s["bounds"], 0.0)
    t_others = t[labels[:, None], np.where(others >= 0, others, 0)]
    mass = bounds.sum(axis=1)
    prior_other = np.divide((bounds * t_others).sum(axis=1), mass, out=np.zeros(n),
                            where=mass > 0)
    with np.errstate(divide="ignore"):  # a label never confidently kept: -inf evidence
        own = s["mean_log_p"] + np.log(t[labels, labels])
        score = s["mean_log_other"] + np.log(prior_other) - own
    # suggested: the label unless another class's share of the pooled weight beats it
    share = np.divide(bounds * t_others, mass[:, None], out=np.zeros_like(bounds),
                      where=mass[:, None] > 0)
    with np.errstate(divide="ignore"):
        log_share = s["mean_log_other"][:, None] + np.log(share)
    log_share = np.where(others >= 0, log_share, -np.inf)
    top = log_share.max(axis=1)
    best_other = np.where((log_share == top[:, None]) & (others >= 0), others,
                          n_classes).min(axis=1)
    mine = own > top
    suggested = np.where(mine | ((own == top) & (labels < best_other)), labels, best_other)
    return joint, score, suggested.astype(np.int64), run.n_epochs


def _check_mask(mask, n_samples, name="noise_mask"):
    mask = np.asarray(mask)
    if mask.dtype != bool or mask.shape != (n_samples,):
        raise ForgetkitError(f"{name} must be a boolean array of shape ({n_samples},); got "
                             f"{mask.dtype} of shape {mask.shape}")
    return mask


def ranking_metrics(score, noise_mask):
    """How well a score ranks the mislabelled samples first.

    Parameters
    ----------
    score : array-like of shape (n_samples,)
        Higher = more likely mislabelled.
    noise_mask : bool ndarray of shape (n_samples,)
        True where the label is known to be wrong.

    Returns
    -------
    dict
        ``auroc`` (area under the ROC curve, ties counted half) and ``ap`` (average
        precision: sum over distinct score thresholds of the recall gained times the
        precision there), the definitions of scikit-learn's ``roc_auc_score`` and
        ``average_precision_score``; NaN when the mask is all True or all False.
    """
    from scipy.stats import rankdata

    score = check_array("score", score, ndim=1, kinds="biuf").astype(np.float64)
    mask = _check_mask(noise_mask, len(score))
    n_pos = int(mask.sum())
    n_neg = len(mask) - n_pos
    if n_pos == 0 or n_neg == 0:
        return {"auroc": np.nan, "ap": np.nan}
    auroc = (rankdata(score)[mask].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    order = np.argsort(-score, kind="stable")
    ranked = score[order]
    hits = np.cumsum(mask[order])
    last = np.r_[ranked[1:] != ranked[:-1], True]  # the end of each group of equal scores
    tp, seen = hits[last], np.flatnonzero(last) + 1
    recall_gain = np.diff(np.r_[0, tp]) / n_pos
    return {"auroc": float(auroc), "ap": float(np.sum(recall_gain * tp / seen))}


def set_metrics(flagged, noise_mask):
    """Precision, recall and F1 of a flagged set against the known noise mask.

    Parameters
    ----------
    flagged, noise_mask : bool ndarray of shape (n_samples,)

    Returns
    -------
    dict
        ``n_flagged``, ``precision``, ``recall``, ``f1`` (0 where undefined).
    """
    mask = check_array("noise_mask", noise_mask, ndim=1)
    flagged = _check_mask(flagged, len(mask), "flagged")
    mask = _check_mask(mask, len(flagged))
    tp = int((flagged & mask).sum())
    n_flagged, n_noisy = int(flagged.sum()), int(mask.sum())
    precision = tp / n_flagged if n_flagged else 0.0
    recall = tp / n_noisy if n_noisy else 0.0
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return {"n_flagged": n_flagged, "precision": precision, "recall": recall, "f1": f1}
