"""Greedy ensemble selection with replacement (Caruana et al. 2004) over a run's
checkpoints."""

from __future__ import annotations

import numpy as np

from .. import kernels
from .._deprecation import keyword_options
from .._validation import check_int
from ..backends import epoch_parts, stored_order, stored_rows
from ..errors import ForgetkitError
from ..execution import executor_for
from ..kinds import kind_of
from ..run import DEFAULT_MEMORY_BUDGET
from . import topk
from .base import Fuser, as_run, check_validation_run
from .schema import WEIGHT_SUM_TOLERANCE, check_checkpoints, check_weights_present

#: Rounding headroom of the candidate test (``kernels.live_rows``): a class within this of
#: being able to reach the leading one is scored.
UNDECIDED_SLACK = 1e-9


class EnsembleSelection(Fuser):
    """Greedy forward selection with replacement (Caruana et al. 2004).

    ``max_checkpoints`` (k) rounds; each adds the checkpoint whose inclusion gives the best
    validation accuracy of the averaged probabilities (ties: the earlier epoch).
    ``selection_`` lists the picks, ``checkpoints_`` the distinct ones, ``weights_`` their
    share of the picks.

    Exact shortcut: adding a checkpoint raises class c of a sample by at most that class's
    largest probability over the epochs, so in each round only the classes that can still
    overtake the sample's leading class are compared, and a sample with one such class (or
    whose label is not among them) is scored once for every candidate (on large runs only
    those rows' and classes' probabilities are computed).

    On a top-k token run each round counts the tokens certified correct by the average
    (docs/definitions.md, "Certified fusion on top-k runs"); uncertain ones count as wrong.
    """

    _state = ("selection",)

    @keyword_options
    def __init__(self, *, max_checkpoints=5, memory_budget=DEFAULT_MEMORY_BUDGET):
        self.max_checkpoints = max_checkpoints
        self.memory_budget = memory_budget

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        self._check_params()
        k = self.max_checkpoints
        check_validation_run(run)
        kind = kind_of(run)
        if executor_for(run).lazy and not kind.bounded:  # read on workers, not here
            raise ForgetkitError("ensemble selection needs a run held in memory or on disk "
                                 "(each round reads its outputs); load the run from its "
                                 "files without chunks=, or run fk.sweep on a cluster")
        if kind.bounded:  # certified counts of the bounds (see fusion.topk), on workers too
            return self._fit_picks(run, topk.topk_selection(kind.certified_bounds(run), k))
        cached = run.cache_probs(memory_budget=self.memory_budget)
        if cached is not None:
            scorer = _CachedScorer(run, cached)
        elif kind.softmax:
            scorer = _StreamedScorer(run, self.memory_budget)
        else:
            scorer = _ProbsScorer(run, self.memory_budget)
        total = np.zeros((run.n_samples, run.n_classes))
        # the first round scores every row whole (and teaches the scorer its bound); later
        # rounds only the rows that one more vector can make right or wrong, on their
        # candidate classes
        rows, ptr, cand, n_right = scorer.order, np.zeros(run.n_samples + 1, np.int64), \
            np.empty(0, np.int64), 0
        picks = []
        for i in range(k):
            scores = n_right + np.asarray(scorer.correct_counts(total, rows, ptr, cand)
                                          if rows.size else 0)
            e = int(np.argmax(np.broadcast_to(scores, run.n_epochs)))  # ties: the earlier
            picks.append(e)
            if i + 1 < k:
                rows, ptr, cand, n_right = scorer.add(total, picks)
        return self._fit_picks(run, picks)

    def _fit_picks(self, run, picks):
        k = self.max_checkpoints
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


def _bound_fits(run, memory_budget):
    """Whether one bound per class and row, float64 (N, C), fits ``memory_budget``."""
    return run.n_samples * run.n_classes * 8 <= memory_budget


def _add_then_live_rows(scorer, total, picks):
    """total += P[the last pick], then the next round's ``live_rows`` (rows, ptr, cand,
    n_right)."""
    scorer.run.add_probs(picks[-1], total)
    return kernels.live_rows(total, scorer.run.labels, scorer.bound, UNDECIDED_SLACK,
                             scorer.order)


class _CachedScorer:
    """Ensemble-selection scores on probabilities held in memory (E, N, C); each class is
    bounded by its largest probability over the epochs."""

    def __init__(self, run, cached):
        self.run, self.cached, self.labels = run, cached, run.labels
        self.order = np.arange(run.n_samples)
        self.bound = kernels.class_max(cached)

    add = _add_then_live_rows

    def correct_counts(self, total, rows, ptr, cand):
        return kernels.selection_cached_counts(self.cached, total, rows, self.labels, ptr,
                                               cand)


class _ProbsScorer:
    """Ensemble-selection scores on a probabilities run too large to hold: each round reads
    the live rows of every epoch. Bound: each class's largest probability over the epochs
    (each row's, when (N, C) does not fit the memory budget), learnt in the first round."""

    def __init__(self, run, memory_budget):
        self.run, self.order = run, np.arange(run.n_samples)
        shape = (run.n_samples, run.n_classes if _bound_fits(run, memory_budget) else 1)
        self.bound = np.zeros(shape)
        self.learnt = False  # the bound, in the first round

    add = _add_then_live_rows

    def correct_counts(self, total, rows, ptr, cand):
        run = self.run
        first, self.learnt = not self.learnt, True
        sub = run.isel(samples=rows) if rows.size < run.n_samples else run
        total_rows, y_rows, all_rows = total[rows], run.labels[rows], np.arange(rows.size)
        counts = []
        for e in range(run.n_epochs):
            p = sub.probs(e)
            if first:
                top = p if self.bound.shape[1] > 1 else p.max(axis=1, keepdims=True)
                np.maximum(self.bound, top, out=self.bound)
            counts.append(kernels.sum_correct_count_rows(total_rows, p, y_rows, all_rows))
        return counts


def _csr_rows(rows, ptr, cand, mask):
    """The rows[mask] of a candidate list (rows, ptr, cand) and their candidates."""
    lens = np.diff(ptr)
    new_ptr = np.zeros(int(mask.sum()) + 1, dtype=np.int64)
    np.cumsum(lens[mask], out=new_ptr[1:])
    return rows[mask], new_ptr, cand[np.repeat(mask, lens)]


class _Entries:
    """The stored values of the live rows' candidate classes at every epoch, gathered from
    the run once per row and kept between the rounds of ensemble selection while they hold
    the row's candidates (scoring on a superset of them is exact).

    Row r's entry: classes cls[offset[r]:offset[r] + size[r]] (ascending; offset -1: none)
    and their values at epoch e, values[E*offset[r] + e*size[r]:][:size[r]]. New entries
    are appended, copying the values a row's previous entry holds; when the buffers are
    full, the entries this round keeps move to new ones of up to twice what they need,
    within ``budget`` bytes.
    """

    def __init__(self, run, budget):
        self.n_epochs = run.n_epochs
        self.offset = np.full(run.n_samples, -1, np.int64)
        self.size = np.zeros(run.n_samples, np.int64)
        dtype = np.dtype(run.outputs.dtype)
        self.limit = budget // (run.n_epochs * dtype.itemsize + 8)  # classes that fit
        self.cls, self.values, self.used = np.empty(0, np.int64), np.empty(0, dtype), 0

    def update(self, stored, rows, ptr, cand):
        """Give every row of rows (R,) an entry holding its candidates cand[ptr[i]:ptr[i+1]]
        (see ``live_rows``) where its entry does not hold them: the classes the old entry
        holds are copied from it, the others read from the stored outputs (values, src).
        False (and every entry dropped) if they do not fit the budget."""
        need = kernels.entry_needs(rows, ptr, cand, self.offset, self.size, self.cls)
        fresh = int(need.sum())
        old = (self.offset, self.size, self.cls, self.values)  # new entries copy from these
        if self.used + fresh > self.cls.size:
            kept = np.where((need == 0) & (self.offset[rows] >= 0), self.size[rows], 0)
            required = int(kept.sum()) + fresh
            if required > self.limit:
                self.offset[:] = -1
                self.cls, self.values = np.empty(0, np.int64), np.empty(0, self.values.dtype)
                self.used = 0
                return False
            capacity = min(self.limit, 2 * required)
            offset = np.full(self.offset.size, -1, np.int64)
            size = self.size.copy()
            cls = np.empty(capacity, np.int64)
            values = np.empty(capacity * self.n_epochs, self.values.dtype)
            kernels.move_entries(rows, need, self.offset, self.size, self.cls, self.values,
                                 offset, cls, values, np.cumsum(kept) - kept, self.n_epochs)
            self.offset, self.size, self.cls, self.values = offset, size, cls, values
            self.used = required - fresh
        at = self.used + np.cumsum(need) - need
        kernels.fill_entries(stored[0], stored[1][rows], rows, ptr, cand, need, at, old,
                             self.offset, self.size, self.cls, self.values)
        self.used += fresh
        return True


class _StreamedScorer:
    """Ensemble-selection scores on a logits run whose probabilities are not held in memory.

    Each epoch's stored outputs are read in place (no copy of a lazy subset) and a row's
    softmax is never materialised. The first round scores every row whole and keeps its
    shift and 1/sum (2 floats per epoch and sample), and each class's largest probability
    over the epochs (the bound, when (N, C) fits the memory budget; else each row's largest,
    a third float per epoch and sample); a run's `softmax_stats`, if computed, give all
    of these (and the first round's scores) without reading. Later rounds compute only the
    classes that can still win (``live_rows``), with the arithmetic of the full softmax, so
    every score is exact; the stored values of those classes are gathered once per row
    (`_Entries`) and kept from round to round while they hold its candidates.
    """

    def __init__(self, run, memory_budget):
        self.run = run
        fits = _bound_fits(run, memory_budget)
        stats = run.cached_softmax_stats
        self.first_counts = None  # the first round's, when known from the softmax stats
        if fits and stats is not None and stats.class_max is not None:
            # rows scored whole raise class_max to values it already holds: left unchanged
            self.shift, self.inv, self.class_max = stats.shift, stats.inv, stats.class_max
            self.first_counts = (stats.pred == run.labels).sum(axis=1)
        else:
            self.shift = np.full((run.n_epochs, run.n_samples), np.nan)
            self.inv = np.full((run.n_epochs, run.n_samples), np.nan)
            self.class_max = np.zeros((run.n_samples, run.n_classes)) if fits else None
        # each row's largest probability, for the bound when class_max is not kept
        self.top = (np.empty((0, 0)) if self.class_max is not None
                    else np.full((run.n_epochs, run.n_samples), np.nan))
        # the candidates' gathered values; two buffers are held while entries move
        self.entries = _Entries(run, (memory_budget - (self.class_max.nbytes if fits else 0))
                                // 2)
        self.settle = None  # rows settled lazily (see add)
        self.known = None  # rows whose shift and inv are known at every epoch
        # rows in storage order: neighbouring reads in every epoch
        order = stored_order(run.outputs)
        self.order = np.arange(run.n_samples) if order is None else order

    @property
    def bound(self):
        if self.class_max is not None:
            return self.class_max
        known = self.top  # a row that underflowed is never known: bounded by 1
        return np.where(np.isnan(known).any(axis=0), 1.0, np.max(known, axis=0))[:, None]

    def add(self, total, picks):
        """The next round's ``live_rows`` with P[the last pick] added, read from the logits
        in place in one pass over the rows; rows that cannot become live for some rounds
        are settled: not read, their totals brought up to date when next needed."""
        run = self.run
        stored = stored_rows(run.outputs)
        if stored is None:
            return _add_then_live_rows(self, total, picks)
        bound = self.bound  # final after the first round
        if self.settle is None:  # (due, added, right) per row
            self.settle = tuple(np.zeros(run.n_samples, np.int64) for _ in range(3))
        *live, n_bad = kernels.add_softmax_live_rows(
            stored[0], picks, stored[1], total, run.labels, bound, UNDECIDED_SLACK,
            self.order, self.settle, self.shift, self.inv)
        if n_bad:
            for e in picks:
                run.probs(int(e))  # raises the error naming the epoch
        return tuple(live)

    def correct_counts(self, total, rows, ptr, cand):
        """Per epoch e: the number of ``rows`` whose argmax of total + P[e] is the label,
        comparing the candidate classes cand[ptr[i]:ptr[i+1]] of row i (all if none)."""
        run = self.run
        stored = stored_rows(run.outputs)
        if self.known is None or stored is None:
            counts = self.first_counts if self.known is None and self.first_counts is not None \
                else self._read_counts(total, rows, ptr, cand)
            self.known = (self.inv > 0).all(axis=0)
            return counts
        fast = self.known[rows]
        counts = np.zeros(run.n_epochs, dtype=np.int64)
        if not fast.all():  # rows with an underflowing epoch: scored whole
            counts += self._read_counts(total, *_csr_rows(rows, ptr, cand, ~fast))
        rows, ptr, cand = _csr_rows(rows, ptr, cand, fast)
        entries = self.entries
        if not entries.update(stored, rows, ptr, cand):
            return counts + self._read_counts(total, rows, ptr, cand)
        return counts + kernels.selection_gathered_counts(
            entries.values, entries.cls, entries.offset, entries.size, total, rows,
            run.labels, self.shift, self.inv, ptr, cand)

    def _read_counts(self, total, rows, ptr, cand):
        """`correct_counts` reading the stored outputs of every epoch."""
        run = self.run
        counts = []
        # shift/inv/top slices are views: filled in place
        for values, src, epochs in epoch_parts(run.outputs):
            n_correct, n_bad = kernels.selection_correct_counts(
                values, src[rows], total, rows, run.labels, self.shift[epochs],
                self.inv[epochs], self.top[epochs], ptr, cand, self.class_max)
            for e in np.flatnonzero(n_bad):
                run.probs(epochs.start + int(e))  # raises the error naming the epoch
            counts.extend(n_correct.tolist())
        return np.array(counts, dtype=np.int64)
