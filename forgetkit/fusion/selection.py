"""Greedy ensemble selection with replacement (Caruana et al. 2004) over a run's
checkpoints."""

from __future__ import annotations

import numpy as np

from .. import kernels
from .._validation import check_int
from ..run import DEFAULT_MEMORY_BUDGET, stored_rows
from .base import Fuser, as_run, check_validation_run
from .schema import WEIGHT_SUM_TOLERANCE, check_checkpoints, check_weights_present

#: Rounding headroom above a lead of 1 before ensemble selection calls a sample decided.
UNDECIDED_SLACK = 1e-9


class EnsembleSelection(Fuser):
    """Greedy forward selection with replacement (Caruana et al. 2004).

    ``max_checkpoints`` (k) rounds; each adds the checkpoint whose inclusion gives the best
    validation accuracy of the averaged probabilities (ties: the earlier epoch).
    ``selection_`` lists the picks, ``checkpoints_`` the distinct ones, ``weights_`` their
    share of the picks.

    Exact shortcut: in a round, a sample whose summed probabilities lead by more than 1
    cannot change its prediction whichever checkpoint is added, so candidates are scored on
    the undecided samples only (on large runs only those rows' probabilities are computed).
    """

    _state = ("selection",)

    def __init__(self, max_checkpoints=5, memory_budget=DEFAULT_MEMORY_BUDGET):
        self.max_checkpoints = max_checkpoints
        self.memory_budget = memory_budget

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        self._check_params()
        k = self.max_checkpoints
        check_validation_run(run)
        cached = run.cache_probs(self.memory_budget)
        scorer = _StreamedScorer(run) if cached is None else None
        y = run.labels
        total = np.zeros((run.n_samples, run.n_classes))
        # the largest probability any checkpoint gives each sample (known when cached)
        bound = np.ones(run.n_samples) if cached is None else kernels.row_max(cached)
        picks = []
        for _ in range(k):
            # this round adds one probability vector, which raises a sample's classes by at
            # most its bound: samples whose sum leads by more than that keep their prediction
            # for every candidate, so only the undecided ones need scoring
            rows, decided = kernels.undecided_rows(total, y, bound + UNDECIDED_SLACK)
            scores = [decided] * run.n_epochs
            if rows.size and cached is not None:  # cached: the rows' candidates in place
                ptr, cand = kernels.selection_candidates(total, rows, bound[rows],
                                                         UNDECIDED_SLACK)
                scores = (decided + kernels.selection_cached_counts(cached, total, rows, y, ptr,
                                                                    cand)).tolist()
            elif rows.size and run.kind == "logits":  # large run: from the stored logits
                scores = [decided + n for n in scorer.correct_counts(total, rows)]
            elif rows.size:  # large probabilities run: read those rows only
                sub = run.isel(samples=rows) if rows.size < run.n_samples else run
                total_rows, y_rows, all_rows = total[rows], y[rows], np.arange(rows.size)
                scores = [decided + kernels.sum_correct_count_rows(total_rows, sub.probs(e),
                                                                    y_rows, all_rows)
                          for e in range(run.n_epochs)]
            e = int(np.argmax(scores))  # ties: the earlier epoch
            picks.append(e)
            kernels.add_into(total, cached[e] if cached is not None else run.probs(e))
        self.selection_ = picks
        checkpoints = sorted(set(picks))
        self._fit_shape(run, checkpoints, [picks.count(e) / k for e in checkpoints])
        return self

    def _check_params(self):
        check_int("max_checkpoints", self.max_checkpoints, minimum=1)
        check_int("memory_budget", self.memory_budget, minimum=0)

    def _read_state(self, fields):
        k, n_epochs = self.max_checkpoints, len(self.epochs_)
        picks = fields.list(fields.get("selection"), "selection", length=k)
        picks = [fields.integer(e, f"selection[{i}]", 0, n_epochs - 1)
                 for i, e in enumerate(picks)]
        check_weights_present(self, fields, needed=True)
        check_checkpoints(self, fields, sorted(set(picks)), "the epochs of selection")
        shares = np.array([picks.count(e) / k for e in self.checkpoints_])
        if np.abs(self.weights_ - shares).max() > WEIGHT_SUM_TOLERANCE:
            fields.fail("weights", f"each checkpoint's share of selection {shares.tolist()}",
                        self.weights_.tolist())
        self.selection_ = picks


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
        ptr, cand = kernels.selection_candidates(total, rows, bound, UNDECIDED_SLACK)
        if stored is not None:  # one pass over the rows, all epochs of a row together
            parts = [(stored[0], stored[1], slice(0, run.n_epochs))]
        else:  # outputs decoded epoch by epoch (one in memory at a time)
            parts = ((np.asarray(run.outputs[e])[None], np.arange(run.n_samples),
                      slice(e, e + 1)) for e in range(run.n_epochs))
        counts = []
        for values, src, epochs in parts:  # shift/inv/top slices are views: filled in place
            n_correct, n_bad = kernels.selection_correct_counts(
                values, src[rows], total, rows, run.labels, self.shift[epochs],
                self.inv[epochs], self.top[epochs], ptr, cand)
            for e in np.flatnonzero(n_bad):
                run.probs(epochs.start + int(e))  # raises the error naming the epoch
            counts.extend(n_correct.tolist())
        return counts
