"""Knowledge Fusion's fit state: one interface, one implementation per kind of values.

The fit (`forgetkit.fusion.knowledge.KnowledgeFusion.fit`) holds the current fusion of every
sample and the forget counts against it, in chunks of samples, and asks the state three
things per step: the grid counts of mixing a window's mean in (or the exact best eps), then
the mix itself. `FitChunk` is one chunk's state; it computes the mixture and keeps the
counts in step, whatever gives its values:

- `FullFitChunk`: a run that holds every class's probabilities (logits read in place where
  they are stored so);
- `forgetkit.fusion.topk.TopKFitChunk`: a top-k run's certified bounds (the target's column
  exact), so that a token counts as correct exactly when it is certified correct.

`ChunkedFitState` sums the chunks' counts on the executor that holds them
(`forgetkit.execution`: here, or the workers of a dask cluster): map (each chunk's counts)
-> reduce (sums here) -> broadcast (the window and eps), after which each chunk mixes the
window into its fusion in place (or, `FullFitChunk`, updates its correctness and defers the
mix to its next counts' pass). Counts are integers and each chunk runs the same kernels
on its rows, so the plan is the same on every executor; only counts leave the chunks.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from .._validation import check_array, check_labels, check_option
from ..execution import combine

#: Half-width of the band (relative to the largest |value| of a sample) around interval ends
#: where the exact epsilon search re-checks grid points with the brute-force arithmetic.
REL_BAND = 1e-12
#: Candidates of the continuous eps search (``grid=None``) checked with the brute-force
#: arithmetic, best interval cover first: the cover counts of ties can be off by the
#: samples whose interval ends at the candidate, and a handful of candidates settles them.
N_VERIFIED = 16


class FitChunk:
    """Knowledge Fusion's fit state on a chunk of samples: the current fusion ``prob``
    (float64 (n, M), updated in place; M the classes, or a top-k layout's columns), its
    label leads and correctness, and the forget counts against it. Implementations give
    `window_mean`, and may read a window's values in place (`_window_counts`,
    `_mix_window`) and defer a mix's update of ``prob`` (`_settle` makes it).

    Parameters
    ----------
    correct : bool (n_epochs, n)
        Whether each sample is correct at each epoch.
    prob : float64 (n, M)
        The first fusion: the final epoch's probabilities (upper bounds on a top-k run).
    labels : int (n,)
        The label's column of each row of ``prob``.

    Attributes
    ----------
    missed : int64 (n_epochs,)
        F'_e * n: samples correct at epoch e and wrong under the current fusion.
    n_correct : int, samples the first fusion gets right
    n_final_correct : int, samples the final epoch gets right (argmax)
    n_mixed : int, windows mixed in so far
    """

    def __init__(self, correct, prob, labels):
        self.correct, self.prob, self.labels = correct, prob, labels
        # the current fusion's lead of the label, magnitude, top class; its correctness
        self.stats, self.cur = kernels.label_leads(self.prob, self.labels)
        self.mean, self.window = np.empty_like(self.prob), None  # a window's mean
        self.missed = self.correct[:, ~self.cur].sum(axis=1)  # updated as cur changes
        self.n_correct = int(self.cur.sum())
        self.n_final_correct = int(self.correct[-1].sum())
        self.n_mixed = 0

    def window_mean(self, window):
        """The mean of the epochs ``window`` (a range) into ``self.mean``, kept until
        another window is asked for (a deferred mix, which reads ``self.mean``, is made
        first)."""
        raise NotImplementedError

    def _window_counts(self, window, grid):
        """`grid_counts` read from the window's values in place, or None."""
        return None

    def _mix_window(self, window, eps):
        """`mix`'s update of prob and cur read from the window's values in place (or
        deferred, `_settle`); False where it does not (the mean is then made and mixed)."""
        return False

    def _settle(self):
        """Make ``prob`` and its label leads the current fusion, where an implementation
        has deferred a mix (``cur`` and the counts are always current)."""

    def grid_counts(self, window, grid):
        """Samples that eps * mean(window) + (1 - eps) * prob classifies correctly, for each
        eps of ``grid``: int64 (G,)."""
        counts = None if self.window == window else self._window_counts(window, grid)
        if counts is not None:
            return counts
        self._settle()
        return kernels.grid_correct_counts(self.window_mean(window), self.prob, self.labels,
                                           self.stats, grid, REL_BAND)

    def continuous_eps(self, window, rule, base):
        """`best_continuous_eps` of mixing mean(window) into prob."""
        self._settle()
        return best_continuous_eps(self.window_mean(window), self.prob, self.labels, rule=rule,
                                   base=base)

    def mix(self, window, eps):
        """prob <- eps * mean(window) + (1 - eps) * prob; the forget counts follow."""
        was_correct = self.cur.copy()
        if not self._mix_window(window, eps):
            self._settle()
            kernels.mix_into(self.window_mean(window), self.prob, eps, self.labels, self.stats,
                             self.cur)
        flipped = np.flatnonzero(was_correct != self.cur)
        self.missed += (self.correct[:, flipped[was_correct[flipped]]].sum(axis=1)
                        - self.correct[:, flipped[self.cur[flipped]]].sum(axis=1))
        self.n_mixed += 1


class FullFitChunk(FitChunk):
    """`FitChunk` of a run (or a chunk of samples of one) holding every class's
    probabilities; window means of logits stored in place are made row by row, in the pass
    that counts the window's grid.

    With logits in place, a mix after grid counts of its window is deferred: each row's
    correctness at the chosen eps is read from the spans the counts' pass left (`grid_row`:
    certain, impossible, or decided by the brute-force arithmetic, repeated by `mix_into`
    for the few rows between), so the forget counts follow at once, and ``prob`` is updated
    in the next counts' pass (``pending``): one pass over the rows per step."""

    def __init__(self, run):
        self.run = run
        self.logits = run.logits_in_place()
        super().__init__(run.correctness(), run.probs(run.n_epochs - 1), run.labels)
        self.spans = np.empty((4, len(self.labels)), dtype=np.int32)
        self.spans_of = None  # (window, grid) of the counts that wrote spans
        self.pending = None  # eps of the window in ``mean``, mixed into cur, not yet into prob

    def window_mean(self, window):
        if self.window != window:
            self._settle()
            self.run.mean_probs(window, out=self.mean)
            self.window, self.spans_of = window, None
        return self.mean

    def _window_counts(self, window, grid):
        if self.logits is None:
            return None
        values, rows, order = self.logits
        eps, self.pending, self.spans_of, self.window = self.pending, None, None, None
        counts, bad, changed = kernels.window_grid_counts(
            values, window, rows, self.prob, self.labels, self.stats, self.cur, grid, REL_BAND,
            self.mean, self.spans, order=order, mix_eps=eps)
        _check_deferred(changed)
        if bad:
            return None  # the mean is not whole: `window_mean` raises the error
        self.window, self.spans_of = window, (window, grid)
        return counts

    def _mix_window(self, window, eps):
        """`_defer` the mix where the spans can say; else (False) the mix is made at once,
        and the spans no longer describe the fusion."""
        if self._defer(window, eps):
            return True
        self.spans_of = None
        return False

    def _defer(self, window, eps):
        """Set ``cur`` to each row's correctness after mixing ``window`` in by ``eps``, from
        the spans of that window's grid counts, and leave the mix ``pending``; False where
        the spans cannot say (no counts of this window, or eps not on their grid)."""
        if self.spans_of is None or self.spans_of[0] != window:
            return False
        at = np.flatnonzero(self.spans_of[1] == eps)
        if at.size == 0:
            return False
        g = at[0]
        p0, w0, w1, p1 = self.spans
        certain = (w0 <= g) & (g < w1)
        between = np.flatnonzero((p0 <= g) & (g < p1) & ~certain)
        if between.size:  # the brute-force arithmetic decides: mix copies of those rows
            correct = np.empty(between.size, dtype=bool)
            kernels.mix_into(self.mean[between], self.prob[between], eps, self.labels[between],
                             tuple(s[between] for s in self.stats), correct)
            certain[between] = correct
        self.cur[:] = certain
        self.pending, self.spans_of = eps, None
        return True

    def _settle(self):
        if self.pending is not None:  # ``mean`` holds its window (see `_window_counts`)
            was = self.cur.copy()
            kernels.mix_into(self.mean, self.prob, self.pending, self.labels, self.stats,
                             self.cur)
            self.pending = None
            _check_deferred(np.count_nonzero(was != self.cur))


def _check_deferred(changed):
    """Raise where a deferred mix changed ``changed`` samples' correctness: `_defer` set it
    from the spans of the mix's own grid, which the mix must reproduce."""
    if changed:
        raise RuntimeError(f"Knowledge Fusion's fit: the correctness of {changed} sample(s) "
                           "after a mix differs from its eps search's; please report this")


def _counts(state):
    return state.missed, state.n_correct, state.n_final_correct


def _missed(state):
    return state.missed


def _grid_counts(state, window, grid):
    return state.grid_counts(window, grid)


def _mix(state, n_mixed, window, eps):
    if state.n_mixed == n_mixed:  # not mixed yet (a task run twice finds it mixed)
        state.mix(window, eps)
    return state


class ChunkedFitState:
    """Knowledge Fusion's fit state over the chunks of samples of a run: one `FitChunk`
    per chunk, kept where its executor keeps them (``parts``, an `execution.Parts`), their
    counts summed here. On dask a chunk's state is a chain of futures, one per mix: if a
    worker is lost mid-fit, the scheduler recomputes its states from that chain (the same
    kernels give the same bits), and a mix that finds its state already mixed (a task run
    twice) leaves it as it is.

    Attributes as `FitChunk`'s, summed: ``missed``, ``n_correct``, ``n_final_correct``;
    ``n_mixed``.
    """

    def __init__(self, parts):
        self.parts = parts
        self.missed, self.n_correct, self.n_final_correct = combine(self.parts.map(_counts))
        self.n_mixed = 0

    def grid_counts(self, window, grid):
        return combine(self.parts.map(_grid_counts, window, grid))

    def continuous_eps(self, window, rule, base):
        """`FitChunk.continuous_eps` of the run held as one chunk."""
        return self.parts.single.continuous_eps(window, rule, base)

    def mix(self, window, eps):
        self.parts.update(_mix, self.n_mixed, window, eps)
        self.n_mixed += 1
        self.missed = combine(self.parts.map(_missed))


def best_continuous_eps(a, b, labels, *, rule="best", base=None):
    """Exact best eps over [0, 1] for eps*a + (1-eps)*b, by a sweep over per-sample intervals.

    Returns (eps, number correct at eps, computed with the brute-force arithmetic). With rule
    "best" ties go to the smallest eps; with "paper" the largest eps whose count is >= base.
    """
    a = check_array("a", a, ndim=2, kinds="f")
    b = check_array("b", b, kinds="f", shape=a.shape)
    check_labels(labels, a.shape[0], a.shape[1])
    check_option("rule", rule, ("best", "paper"))
    lo, hi, lo_open, hi_open, valid = kernels.win_intervals(a, b, labels)
    lo, hi, lo_open, hi_open = lo[valid], hi[valid], lo_open[valid], hi_open[valid]
    ends = np.unique(np.concatenate([[0.0, 1.0], lo, hi]))
    ends = ends[(ends >= 0) & (ends <= 1)]
    mids = (ends[:-1] + ends[1:]) / 2
    cand = np.sort(np.concatenate([ends, mids]))
    lo_closed_s, lo_open_s = np.sort(lo[~lo_open]), np.sort(lo[lo_open])
    hi_closed_s, hi_open_s = np.sort(hi[~hi_open]), np.sort(hi[hi_open])
    started = np.searchsorted(lo_closed_s, cand, "right") + np.searchsorted(lo_open_s, cand, "left")
    ended = np.searchsorted(hi_closed_s, cand, "left") + np.searchsorted(hi_open_s, cand, "right")
    cover = started - ended
    if base is None:
        base = kernels.mixture_correct_count(a, b, labels, 0.0)
    if rule == "best":
        order = np.flatnonzero(cover == cover.max())
    else:
        order = np.flatnonzero(cover >= base)[::-1]
    best_eps, best_count = 0.0, base
    for i in order[:N_VERIFIED]:  # verify candidates with the brute-force arithmetic
        count = kernels.mixture_correct_count(a, b, labels, float(cand[i]))
        better = count > best_count if rule == "best" else count >= base
        if better:
            best_eps, best_count = float(cand[i]), count
            if rule == "paper":
                break
    return best_eps, int(best_count)
