"""Knowledge Fusion (paper section 5, Algorithm 1) and likelihood-weighted fusion.

Fusers follow scikit-learn: ``__init__`` stores options, ``fit(run)`` on validation data
returns self and sets attributes ending in ``_``, ``predict_proba(run)`` / ``predict(run)``
apply the fitted fusion to any run with the same epochs.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numba
import numpy as np

from . import _kernels
from ._progress import Progress
from ._validation import check_int, check_option
from .forgetting import correctness
from .run import Run, _kernel_view, mean_softmax, mean_softmax_rows, stored_rows

#: Half-width of the band (relative to the largest |value| of a sample) around interval ends
#: where the exact epsilon search re-checks grid points with the brute-force arithmetic.
REL_BAND = 1e-12
#: Probabilities of all epochs are kept in memory when they take at most this many bytes.
PROBS_CACHE_BYTES = 2 << 30
RULES = ("best", "paper")


# --------------------------------------------------------------------------- helpers
def as_run(run, labels=None, *, kind="logits"):
    """Accept a Run, or an outputs array (E, N, C) with labels."""
    if isinstance(run, Run):
        if labels is not None:
            raise TypeError("labels are taken from the Run; pass either a Run or (outputs, labels)")
        return run
    if labels is None:
        raise TypeError("fit(outputs, labels): labels are required with a bare outputs array")
    return Run(run, labels, kind=kind)


class EpochProbs:
    """Float64 probabilities of a run's epochs, computed per request.

    With ``cache=True`` all epochs are computed once and kept on the run when they take at
    most ``PROBS_CACHE_BYTES`` (methods that revisit every epoch, such as ensemble
    selection); a cache already on the run is always used.
    """

    def __init__(self, run, *, cache=False):
        self.run = run
        self._all = run._cache.get("probs64")
        out = run.outputs
        if self._all is None and run.kind == "probs" and isinstance(out, np.ndarray) \
                and not isinstance(out, np.memmap) and out.dtype == np.float64:
            self._all = out  # already float64 probabilities in memory: no copy
        size = run.n_epochs * run.n_samples * run.n_classes * 8
        if self._all is None and cache and size <= PROBS_CACHE_BYTES:
            self._all = run._cache["probs64"] = run.probs()

    @property
    def cached(self):
        """All epochs' probabilities (n_epochs, n_samples, n_classes) if held, else None."""
        return self._all

    def __getitem__(self, e):
        return self._all[e] if self._all is not None else self.run.probs(e)

    def mean(self, indices, out=None):
        """Mean of the probabilities of epochs ``indices`` (summed in order, then divided);
        written into ``out`` (n_samples, n_classes) if given (repeated calls then reuse
        its memory)."""
        idx = np.asarray(list(indices), dtype=np.int64)
        if self._all is None and self.run.kind == "logits":
            stored = stored_rows(self.run.outputs)
            try:
                if stored is not None:  # read in place, rows of a lazy subset included
                    return mean_softmax_rows(stored[0], idx, stored[1], out)
                return mean_softmax(self.run.outputs[_as_slice(idx)], out)
            except ValueError:
                pass  # epoch by epoch below, for an error message naming the epoch
        if out is not None:
            out[...] = self.mean(idx)
            return out
        if self._all is None:  # stream: one epoch in memory besides the total
            total = self.run.probs(int(idx[0]))
            if len(idx) > 1:
                tmp = np.empty_like(total)
                for e in idx[1:]:
                    total += self.run._epoch_probs(int(e), tmp)
                total /= len(idx)
            return total
        if np.all(np.diff(idx) == 1):
            stack = self._all[idx[0]: idx[-1] + 1]  # a view, no copy
        else:
            stack = self._all[idx]
        out = np.empty(stack.shape[1:])
        _kernels.mean_first_axis(stack, out)  # same arithmetic, parallel
        return out

    def weighted(self, indices, weights):
        """sum_i weights[i] * P[indices[i]] (N, C), added in order to zeros."""
        stored = stored_rows(self.run.outputs) if self._all is None else None
        if stored is not None and self.run.kind == "logits":  # read in place
            out = np.empty((self.run.n_samples, self.run.n_classes))
            n_bad = _kernels.combine_softmax(
                _kernel_view(stored[0]), np.asarray(indices, dtype=np.int64),
                np.asarray(weights, dtype=np.float64), stored[1], _kernels.f16_exp_table(),
                out, 8 * numba.get_num_threads())
            if not n_bad:
                return out  # else epoch by epoch below, for an error naming the epoch
        total = np.zeros((self.run.n_samples, self.run.n_classes))
        for e, w in zip(indices, weights, strict=True):
            total += w * self[e]
        return total


def label_probabilities(run):
    """Probability of each sample's label at every epoch: float64 (n_samples, n_epochs).

    Logits not held in memory are read in place, one epoch at a time, and the rows'
    probabilities are never stored whole."""
    probs = EpochProbs(run, cache=True)
    if probs.cached is not None or run.kind != "logits":
        rows = np.arange(run.n_samples)
        return np.stack([probs[e][rows, run.labels] for e in range(run.n_epochs)], axis=1)
    stored = stored_rows(run.outputs)
    q = np.empty((run.n_epochs, run.n_samples))
    for e in range(run.n_epochs):
        if stored is not None:
            values, rows = stored[0][e], stored[1]
        else:
            values, rows = np.asarray(run.outputs[e]), np.arange(run.n_samples)
        if _kernels.label_probs(_kernel_view(values), rows, run.labels,
                               _kernels.f16_exp_table(), q[e]):
            run.probs(e)  # raises the error naming the epoch and its bad values
    return q.T


def _as_slice(idx):
    """A slice for consecutive indices (a view of a memmap), else the indices."""
    if len(idx) and np.all(np.diff(idx) == 1):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def check_validation_run(run):
    if run.n_samples < 2:
        raise ValueError(f"the validation set needs at least 2 samples; got {run.n_samples}")
    if np.unique(run.labels).size < 2:
        raise ValueError("the validation set holds a single class; fusion needs at least two")
    if run.n_epochs < 2:
        raise ValueError(f"fusion needs a run with at least 2 epochs; got {run.n_epochs}")


class Fuser:
    """Base of every fuser: fitted-state check, epoch mapping and ``predict``."""

    def _check_fitted(self):
        if not hasattr(self, "epochs_"):
            raise ValueError(
                f"this {type(self).__name__} is not fitted yet: call fit(validation_run) first"
            )

    def _fit_shape(self, run):
        self.epochs_ = run.epochs.copy()
        self.n_classes_ = run.n_classes

    def _positions(self, run, indices):
        """Positions in ``run`` of fitted epoch indices, matched by epoch number."""
        self._check_fitted()
        if run.n_classes != self.n_classes_:
            raise ValueError(f"the run has {run.n_classes} classes; the fusion was fitted on "
                             f"{self.n_classes_}")
        return run.epoch_positions(self.epochs_[np.asarray(indices, dtype=np.int64)])

    def predict(self, run):
        """Fused class predictions: int64 (n_samples,)."""
        return np.argmax(self.predict_proba(run), axis=1)

    @property
    def ensemble_size_(self):
        """Number of checkpoints needed at inference (k)."""
        return len(self.checkpoints_)


# --------------------------------------------------------------------- KF itself
class KnowledgeFusion(Fuser):
    """Knowledge Fusion: mix forgotten-knowledge checkpoints into the final model.

    Parameters
    ----------
    window : int, default 1
        Each step averages epochs a-window..a+window (clipped) around the chosen epoch a.
    grid : int or None, default 101
        Number of eps points in numpy.arange(grid) / (grid - 1); None searches the exact best
        eps over the continuous interval [0, 1].
    rule : {"best", "paper"}
        "best": eps of highest validation accuracy (ties: the smallest eps); "paper": the
        largest eps whose accuracy is >= the current accuracy.
    max_windows : int or None
        Budget of windows with eps > 0 (KF(i) is max_windows=1; None is KF(inf)).
    stop_when_no_gain : bool
        Stop at the first step whose best accuracy does not exceed the current one (that step
        is not added to the plan).

    Attributes
    ----------
    plan_ : list of (epoch_index, eps)
    checkpoints_ : list of int, sorted epoch indices needed at inference
    val_accuracy_ : list of float, validation accuracy after each step
    initial_accuracy_ : float, validation accuracy of the final epoch alone
    epochs_ : ndarray, the epoch numbers of the fitted run
    """

    def __init__(self, window=1, grid=101, rule="best", max_windows=None,
                 stop_when_no_gain=False, progress=False):
        self.window = window
        self.grid = grid
        self.rule = rule
        self.max_windows = max_windows
        self.stop_when_no_gain = stop_when_no_gain
        self.progress = progress

    def _grid_points(self):
        if self.grid is None:
            return None
        n = check_int("grid", self.grid, minimum=2)
        return np.arange(n) / (n - 1)

    def _window(self, a, n_epochs):
        return range(max(a - self.window, 0), min(a + self.window, n_epochs - 1) + 1)

    def fit(self, run, labels=None):
        """Fit the plan on validation data: a Run, or outputs (E, N, C) and labels (N,)."""
        run = as_run(run, labels)
        check_int("window", self.window, minimum=0)
        check_option("rule", self.rule, RULES)
        check_int("max_windows", self.max_windows, minimum=1, allow_none=True)
        grid = self._grid_points()
        check_validation_run(run)
        n_epochs, y = run.n_epochs, run.labels
        probs = EpochProbs(run)
        correct = correctness(run)
        prob = probs[n_epochs - 1]
        if probs.cached is not None:
            prob = prob.copy()  # updated in place below
        # the current fusion's lead of the label, magnitude, top class and correctness
        lead, magnitude = np.empty(len(y)), np.empty(len(y))
        top, cur = np.empty(len(y), dtype=np.int64), np.empty(len(y), dtype=bool)
        _kernels.label_leads(prob, y, lead, magnitude, top, cur)
        stats = (lead, magnitude, top)
        mean = np.empty_like(prob)
        explore = np.ones(n_epochs, dtype=bool)
        missed = correct[:, ~cur].sum(axis=1)  # F'_e * n_samples, updated as cur changes
        n_correct, left = int(cur.sum()), n_epochs
        plan, accs, used = [], [], 0
        bar = Progress(n_epochs, "knowledge fusion", enabled=self.progress)
        while left and (self.max_windows is None or used < self.max_windows):
            a = int(np.argmax(np.where(explore, missed, -1)))  # ties: the earliest epoch
            window = self._window(a, n_epochs)
            explore[window.start: window.stop] = False
            before, left = left, int(explore.sum())
            bar.update(before - left)
            probs.mean(window, out=mean)
            eps, count = self._choose_eps(mean, prob, stats, y, grid, n_correct)
            if self.stop_when_no_gain and count <= n_correct:
                break
            plan.append((a, float(eps)))
            if eps > 0:
                was_correct = cur.copy()
                _kernels.mix_into(mean, prob, eps, y, *stats, cur)  # prob <- eps*mean + ...
                flipped = np.flatnonzero(was_correct != cur)
                missed += (correct[:, flipped[was_correct[flipped]]].sum(axis=1)
                           - correct[:, flipped[cur[flipped]]].sum(axis=1))
                used += 1
            n_correct = count  # the eps search's counts are exact: cur.sum() == count
            accs.append(n_correct / len(y))
        self._fit_shape(run)
        self.plan_ = plan
        self.val_accuracy_ = accs
        self.initial_accuracy_ = float(correct[-1].mean())
        self.checkpoints_ = self._checkpoints(plan)
        return self

    def _checkpoints(self, plan):
        """Epoch indices needed to apply ``plan``: the final one and every used window."""
        n_epochs = len(self.epochs_)
        needed = {n_epochs - 1}
        for a, eps in plan:
            if eps > 0:
                needed.update(self._window(a, n_epochs))
        return sorted(needed)

    def with_windows(self, n_windows):
        """The fitted KF(n_windows): this plan cut after its n-th window with eps > 0.

        KnowledgeFusion(max_windows=n) fitted on the same data gives exactly this plan, so
        one KF(inf) fit yields every KF(i) (the ensemble-size curve).
        """
        self._check_fitted()
        check_int("n_windows", n_windows, minimum=0)
        used = [i for i, (_, eps) in enumerate(self.plan_) if eps > 0]
        cut = 0 if n_windows == 0 else (used[n_windows - 1] + 1 if n_windows <= len(used)
                                        else len(self.plan_))
        new = KnowledgeFusion(window=self.window, grid=self.grid, rule=self.rule,
                              max_windows=n_windows or None,
                              stop_when_no_gain=self.stop_when_no_gain)
        new.epochs_, new.n_classes_ = self.epochs_, self.n_classes_
        new.initial_accuracy_ = self.initial_accuracy_
        new.plan_, new.val_accuracy_ = self.plan_[:cut], self.val_accuracy_[:cut]
        new.checkpoints_ = new._checkpoints(new.plan_)
        return new

    def _choose_eps(self, mean, prob, stats, y, grid, base):
        """(eps, number correct) chosen by the rule; ``stats``: ``label_leads`` of prob;
        ``base`` = number correct at eps=0."""
        if grid is not None:
            counts = _kernels.grid_correct_counts(mean, prob, y, *stats, grid, REL_BAND,
                                                  4 * numba.get_num_threads())
            if self.rule == "best":
                i = int(np.argmax(counts))
            else:
                i = int(np.flatnonzero(counts >= base).max())
            return grid[i], int(counts[i])
        return best_continuous_eps(mean, prob, y, rule=self.rule, base=base)

    def predict_proba(self, run):
        """Fused probabilities (n_samples, n_classes) of any run holding the fitted epochs
        (all of them, or only ``checkpoints_``)."""
        *_, prob = self.staged_predict_proba(run)  # every stage is the same array
        return prob

    def staged_predict_proba(self, run):
        """Yield the fused probabilities (n_samples, n_classes) of KF(0) (the final epoch
        alone), KF(1), KF(2), ...: one stage after each window with eps > 0, in one pass.

        The same array is updated in place between yields: copy it to keep a stage.
        """
        self._check_fitted()
        n_epochs = len(self.epochs_)
        pos = dict(zip(self.checkpoints_, self._positions(run, self.checkpoints_), strict=True))
        probs = EpochProbs(run)
        prob = probs[pos[n_epochs - 1]]
        if probs.cached is not None:
            prob = prob.copy()  # updated in place below
        mean = np.empty_like(prob)
        yield prob
        for a, eps in self.plan_:
            if eps > 0:
                probs.mean((pos[e] for e in self._window(a, n_epochs)), out=mean)
                _kernels.mix(mean, prob, eps)
                yield prob

    # -------------------------------------------------------------- persistence
    def to_json(self, path=None):
        """The fitted plan as JSON (epoch numbers included); written to ``path`` if given."""
        self._check_fitted()
        record = {
            "format": "forgetkit-knowledge-fusion",
            "version": 1,
            "params": {"window": self.window, "grid": self.grid, "rule": self.rule,
                       "max_windows": self.max_windows,
                       "stop_when_no_gain": self.stop_when_no_gain},
            "epochs": [int(e) for e in self.epochs_],
            "n_classes": int(self.n_classes_),
            "plan": [{"epoch_index": a, "epoch": int(self.epochs_[a]), "eps": eps}
                     for a, eps in self.plan_],
            "checkpoints": [{"epoch_index": e, "epoch": int(self.epochs_[e])}
                            for e in self.checkpoints_],
            "val_accuracy": self.val_accuracy_,
            "initial_accuracy": self.initial_accuracy_,
        }
        text = json.dumps(record, indent=1)
        if path is not None:
            from .io import _write_json_atomic

            _write_json_atomic(Path(path), record)
        return text

    @classmethod
    def from_json(cls, source):
        """A fitted KnowledgeFusion from a JSON string or a path to a JSON file."""
        text = source
        if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip()
                                        .startswith("{")):
            try:
                text = Path(source).read_text()
            except FileNotFoundError:
                raise FileNotFoundError(f"no such plan file: {str(source)!r}") from None
        try:
            rec = json.loads(text)
            if rec.get("format") != "forgetkit-knowledge-fusion":
                raise ValueError(f"not a forgetkit Knowledge Fusion plan "
                                 f"(format={rec.get('format')!r})")
            kf = cls(**rec["params"])
            kf.epochs_ = np.asarray(rec["epochs"], dtype=np.int64)
            kf.n_classes_ = int(rec["n_classes"])
            kf.plan_ = [(int(s["epoch_index"]), float(s["eps"])) for s in rec["plan"]]
            kf.checkpoints_ = [int(c["epoch_index"]) for c in rec["checkpoints"]]
            kf.val_accuracy_ = list(rec["val_accuracy"])
            kf.initial_accuracy_ = float(rec["initial_accuracy"])
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"cannot read the Knowledge Fusion plan: {err}") from None
        return kf


def best_continuous_eps(a, b, labels, *, rule="best", base=None):
    """Exact best eps over [0, 1] for eps*a + (1-eps)*b, by a sweep over per-sample intervals.

    Returns (eps, number correct at eps, computed with the brute-force arithmetic). With rule
    "best" ties go to the smallest eps; with "paper" the largest eps whose count is >= base.
    """
    lo, hi, lo_open, hi_open, valid = _kernels.win_intervals(a, b, labels)
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
        base = _kernels.mixture_correct_count(a, b, labels, 0.0)
    if rule == "best":
        order = np.flatnonzero(cover == cover.max())
    else:
        order = np.flatnonzero(cover >= base)[::-1]
    best_eps, best_count = 0.0, base
    for i in order[:16]:  # verify candidates with the brute-force arithmetic
        count = _kernels.mixture_correct_count(a, b, labels, float(cand[i]))
        better = count > best_count if rule == "best" else count >= base
        if better:
            best_eps, best_count = float(cand[i]), count
            if rule == "paper":
                break
    return best_eps, int(best_count)


# ------------------------------------------------------------- likelihood fusion
def _mean_log(x):
    return float(np.mean(np.log(x)))


def _em_step(q, w):
    """One EM step for mixture weights w (k,) of components q (N, k): w * mean(q / (q @ w)),
    the mean over samples taken as a matrix-vector product."""
    w = w * (q.T @ (1.0 / (q @ w))) / q.shape[0]
    return w / w.sum()


class LikelihoodFusion(Fuser):
    """Mixture weights over checkpoints that maximise the validation log-likelihood.

    maximise sum_n log(sum_e w_e P[e, n, y_n]) over the simplex (concave), by EM accelerated
    with SQUAREM (plain EM had not converged after 2,000 iterations on the sample runs).
    Weights below ``min_weight`` times the largest are dropped, or with ``max_checkpoints``
    only the k largest kept, and the rest refitted. Beyond the paper.

    Attributes
    ----------
    weights_ : ndarray (n_checkpoints,), checkpoints_ : list of epoch indices,
    log_likelihood_ : mean validation log-likelihood, n_iter_ : SQUAREM iterations of the
    last solve (3 EM steps each; a RuntimeWarning says when ``max_iter`` stopped it).
    """

    def __init__(self, max_checkpoints=None, max_iter=2000, tol=1e-10, min_weight=1e-6):
        self.max_checkpoints = max_checkpoints
        self.max_iter = max_iter
        self.tol = tol
        self.min_weight = min_weight

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        check_int("max_checkpoints", self.max_checkpoints, minimum=1, allow_none=True)
        check_validation_run(run)
        q = np.maximum(label_probabilities(run), 1e-300)
        idx = np.arange(run.n_epochs)
        w, self.n_iter_ = self._em(q)
        keep = w > self.min_weight * w.max()
        if self.max_checkpoints is not None and keep.sum() > self.max_checkpoints:
            keep = np.zeros_like(keep)
            keep[np.argsort(-w, kind="stable")[: self.max_checkpoints]] = True
        if not keep.all():
            idx = idx[keep]
            w, self.n_iter_ = self._em(q[:, keep])
        self._fit_shape(run)
        self.checkpoints_ = idx.tolist()
        self.weights_ = w
        self.log_likelihood_ = _mean_log(q[:, keep] @ w)
        return self

    def _em(self, q):
        """Mixture weights maximising mean(log(q @ w)) over the simplex, for q (N, k) > 0:
        EM accelerated by SQUAREM (Varadhan & Roland 2008, scheme S3). Each iteration takes
        two EM steps, extrapolates along them, keeps the extrapolated point when it stays
        inside the simplex and raises the likelihood (else halves the step toward the
        second EM step), then takes one more EM step: the likelihood never decreases.
        Stops when an iteration gains less than ``tol``. Returns (w, iterations)."""
        n, k = q.shape
        w = np.full(k, 1.0 / k)
        cur = _mean_log(q @ w)
        for n_iter in range(1, self.max_iter + 1):
            w1 = _em_step(q, w)
            w2 = _em_step(q, w1)
            r, v = w1 - w, w2 - 2 * w1 + w
            alpha = -np.sqrt((r @ r) / (v @ v)) if v @ v > 0 else -1.0
            best, best_ll = w2, _mean_log(q @ w2)
            while alpha < -1:  # alpha = -1 is the second EM step itself
                point = w - 2 * alpha * r + alpha * alpha * v
                if (point > 0).all():
                    point /= point.sum()
                    point_ll = _mean_log(q @ point)
                    if point_ll >= best_ll:
                        best, best_ll = point, point_ll
                        break
                alpha = (alpha - 1) / 2
            w = _em_step(q, best)
            new = _mean_log(q @ w)
            if new - cur < self.tol:
                return w, n_iter
            cur = new
        warnings.warn(f"likelihood fusion stopped at max_iter={self.max_iter} before its "
                      f"gain per iteration fell below tol={self.tol}", RuntimeWarning,
                      stacklevel=3)
        return w, n_iter

    def predict_proba(self, run):
        pos = self._positions(run, self.checkpoints_)
        return EpochProbs(run).weighted(pos, self.weights_)
