"""The baselines KF is compared with (paper section 5 and App. C).

Fixed averages are plain functions returning fused probabilities (n_samples, n_classes);
every baseline is also a fuser (fit on validation data, predict_proba on any run with the
same epochs) so that `forgetkit.compare` treats all methods alike.
"""

from __future__ import annotations

import numba
import numpy as np

from . import _kernels
from ._validation import check_int, check_option
from .fusion import EpochProbs, Fuser, as_run, check_validation_run
from .run import Run, _kernel_view, stored_rows

FIXED = ("single", "horizontal", "fixed_jumps", "uniform")
#: Rounding headroom above a lead of 1 before ensemble selection calls a sample decided.
UNDECIDED_SLACK = 1e-9


def fixed_epochs(n_epochs, select, k=1):
    """Epoch indices of a fixed average.

    "single": [E-1]; "horizontal": the last k epochs; "fixed_jumps": k epochs spaced
    E // k apart, ending at E-1; "uniform": all epochs.
    """
    check_option("select", select, FIXED)
    k = check_int("k", k, minimum=1)
    if select in ("horizontal", "fixed_jumps") and k > n_epochs:
        raise ValueError(f"k={k} exceeds the {n_epochs} stored epochs")
    if select == "single":
        return [n_epochs - 1]
    if select == "horizontal":
        return list(range(n_epochs - k, n_epochs))
    if select == "fixed_jumps":
        step = max(1, n_epochs // k)
        return sorted(n_epochs - 1 - step * j for j in range(k))
    return list(range(n_epochs))


def single(run):
    """Probabilities of the final epoch (the single network)."""
    return EpochProbs(run).mean(fixed_epochs(run.n_epochs, "single"))


def horizontal(run, k):
    """Mean probabilities of the last k epochs (horizontal ensemble)."""
    return EpochProbs(run).mean(fixed_epochs(run.n_epochs, "horizontal", k))


def fixed_jumps(run, k):
    """Mean probabilities of k epochs equally spaced over training, ending at the last."""
    return EpochProbs(run).mean(fixed_epochs(run.n_epochs, "fixed_jumps", k))


def uniform(run):
    """Mean probabilities of all stored epochs."""
    return EpochProbs(run).mean(range(run.n_epochs))


def snapshot(run, cycle_ends):
    """Mean probabilities at the cycle-end epochs (epoch *numbers*) of a cyclic schedule."""
    ends = np.asarray(cycle_ends, dtype=np.int64).reshape(-1)
    if ends.size == 0:
        raise ValueError("cycle_ends must list at least one stored epoch number")
    return EpochProbs(run).mean(run.epoch_positions(ends))


def multi_run(runs):
    """Mean final-epoch probabilities of independently trained runs on the same samples."""
    runs = list(runs)
    if not runs:
        raise ValueError("multi_run needs at least one run")
    _check_same_samples(runs)
    total = single(runs[0])
    for r in runs[1:]:
        total += single(r)
    return total / len(runs)


def average_runs(runs):
    """Test-time augmentation: a probabilities Run averaging, epoch by epoch, runs that hold
    the same samples and epochs under different augmentations. Fit KF on it as on any run."""
    runs = list(runs)
    if not runs:
        raise ValueError("average_runs needs at least one run")
    _check_same_samples(runs)
    first = runs[0]
    for r in runs[1:]:
        if not np.array_equal(r.epochs, first.epochs):
            raise ValueError("runs to average must hold the same epochs")
    out = np.empty(first.shape, dtype=np.float64)
    for e in range(first.n_epochs):
        out[e] = first.probs(e)
        for r in runs[1:]:
            out[e] += r.probs(e)
        out[e] /= len(runs)
    return Run(out, first.labels, kind="probs", epochs=first.epochs,
               sample_ids=first.sample_ids, class_names=first.class_names,
               meta=dict(first.meta, averaged_runs=len(runs)))


def _check_same_samples(runs):
    first = runs[0]
    for i, r in enumerate(runs[1:], 1):
        if r.n_samples != first.n_samples or r.n_classes != first.n_classes:
            raise ValueError(f"run {i} has shape {r.shape[1:]} (samples, classes); run 0 has "
                             f"{first.shape[1:]}")
        if not np.array_equal(r.labels, first.labels):
            raise ValueError(f"run {i} has other labels than run 0: not the same samples")


# ------------------------------------------------------------------------ fusers
class CheckpointAverage(Fuser):
    """A fixed average of epochs as a fuser: ``select`` in "single", "horizontal",
    "fixed_jumps", "uniform" (k used by horizontal and fixed_jumps)."""

    def __init__(self, select="single", k=1):
        self.select = select
        self.k = k

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        self.checkpoints_ = fixed_epochs(run.n_epochs, self.select, self.k)
        self._fit_shape(run)
        return self

    def predict_proba(self, run):
        return EpochProbs(run).mean(self._positions(run, self.checkpoints_))


class EarlyStopping(Fuser):
    """The epoch of best validation accuracy (ties: the earliest)."""

    def fit(self, run, labels=None):
        from .forgetting import accuracy

        run = as_run(run, labels)
        check_validation_run(run)
        self.best_epoch_index_ = int(np.argmax(accuracy(run)))
        self.checkpoints_ = [self.best_epoch_index_]
        self._fit_shape(run)
        return self

    def predict_proba(self, run):
        return EpochProbs(run).mean(self._positions(run, self.checkpoints_))


class EnsembleSelection(Fuser):
    """Greedy forward selection with replacement (Caruana et al. 2004).

    ``k`` rounds; each adds the checkpoint whose inclusion gives the best validation accuracy
    of the averaged probabilities (ties: the earlier epoch). ``selection_`` lists the picks,
    ``checkpoints_`` the distinct ones, ``weights_`` their share of the picks.

    Exact shortcut: in a round, a sample whose summed probabilities lead by more than 1
    cannot change its prediction whichever checkpoint is added, so candidates are scored on
    the undecided samples only (on large runs only those rows' probabilities are computed).
    """

    def __init__(self, k=5):
        self.k = k

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        k = check_int("k", self.k, minimum=1)
        check_validation_run(run)
        probs = EpochProbs(run, cache=True)
        scorer = _StreamedScorer(run) if probs.cached is None else None
        y = run.labels
        total = np.zeros((run.n_samples, run.n_classes))
        picks = []
        for _ in range(k):
            # this round adds one probability vector, which moves any class difference by
            # at most 1: samples whose sum leads by more than 1 keep their prediction for
            # every candidate, so only the undecided ones need scoring
            top2 = np.partition(total, -2, axis=1)[:, -2:]
            open_ = top2[:, 1] - top2[:, 0] <= 1.0 + UNDECIDED_SLACK
            rows = np.flatnonzero(open_)
            decided = int(np.sum(np.argmax(total[~open_], axis=1) == y[~open_]))
            scores = [decided] * run.n_epochs
            if rows.size and probs.cached is not None:  # cached: score the rows in place
                scores = [decided + _kernels.sum_correct_count_rows(total, probs.cached[e], y, rows)
                          for e in range(run.n_epochs)]
            elif rows.size and run.kind == "logits":  # large run: from the stored logits
                scores = [decided + n for n in scorer.correct_counts(total, rows)]
            elif rows.size:  # large probabilities run: read those rows only
                sub = run.subset(rows) if rows.size < run.n_samples else run
                total_rows, y_rows, all_rows = total[rows], y[rows], np.arange(rows.size)
                scores = [decided + _kernels.sum_correct_count_rows(total_rows, sub.probs(e),
                                                                    y_rows, all_rows)
                          for e in range(run.n_epochs)]
            e = int(np.argmax(scores))  # ties: the earlier epoch
            picks.append(e)
            total += probs[e]
        self.selection_ = picks
        self.checkpoints_ = sorted(set(picks))
        self.weights_ = np.array([picks.count(e) / k for e in self.checkpoints_])
        self._fit_shape(run)
        return self

    def predict_proba(self, run):
        pos = self._positions(run, self.checkpoints_)
        return EpochProbs(run).weighted(pos, self.weights_)


class _StreamedScorer:
    """Ensemble-selection scores on a logits run whose probabilities are not held in memory.

    Each epoch's stored outputs are read in place (no copy of a lazy subset) and a row's
    softmax is never materialised. The first time a row is scored whole, its shift, 1/sum and
    largest probability are kept (3 floats per epoch and sample); since no probability
    exceeds the largest, later rounds compute only the classes that can still win
    (``selection_candidates``), with the arithmetic of the full softmax, so every score is
    exact.
    """

    def __init__(self, run):
        self.run = run
        self.shift = np.full((run.n_epochs, run.n_samples), np.nan)
        self.inv = np.full((run.n_epochs, run.n_samples), np.nan)
        self.top = np.full((run.n_epochs, run.n_samples), np.nan)

    def correct_counts(self, total, rows):
        """Per epoch e: the number of ``rows`` whose argmax of total + P[e] is the label."""
        run = self.run
        stored = stored_rows(run.outputs)
        if stored is not None:  # rows in storage order: neighbouring reads in every epoch
            rows = rows[np.argsort(stored[1][rows], kind="stable")]
        known = self.top[:, rows]
        bound = np.where(np.isnan(known).any(axis=0), 1.0, np.max(known, axis=0))
        ptr, cand = _kernels.selection_candidates(total, rows, bound, UNDECIDED_SLACK)
        n_blocks = 8 * numba.get_num_threads()
        if stored is not None:  # one pass over the rows, all epochs of a row together
            parts = [(stored[0], stored[1], slice(0, run.n_epochs))]
        else:  # outputs decoded epoch by epoch (one in memory at a time)
            parts = ((np.asarray(run.outputs[e])[None], np.arange(run.n_samples),
                      slice(e, e + 1)) for e in range(run.n_epochs))
        counts = []
        for values, src, epochs in parts:  # shift/inv/top slices are views: filled in place
            n_correct, n_bad = _kernels.selection_correct_counts(
                _kernel_view(values), src[rows], total, rows, run.labels,
                _kernels.f16_exp_table(), self.shift[epochs], self.inv[epochs],
                self.top[epochs], ptr, cand, n_blocks)
            for e in np.flatnonzero(n_bad):
                run.probs(epochs.start + int(e))  # raises the error naming the epoch
            counts.extend(n_correct.tolist())
        return counts
