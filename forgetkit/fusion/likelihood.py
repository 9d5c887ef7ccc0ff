"""Likelihood fusion: mixture weights over checkpoints that maximise the validation
log-likelihood (beyond the paper)."""

from __future__ import annotations

import warnings

import numpy as np

from .. import kernels
from .._deprecation import keyword_options
from .._validation import check_int, check_number
from ..execution import executor_for
from ..kinds import kind_of
from ..probs import LOG_FLOOR
from . import topk
from .base import Fuser, as_run, check_validation_run
from .schema import check_weights_present

#: Validation sets of at least this many samples take one parallel pass per EM evaluation
#: (``kernels.em_pass``); smaller ones two BLAS matrix-vector products.
PARALLEL_EM_SAMPLES = 16384


def _evaluate(q, w):
    """(mean log-likelihood mean(log(q @ w)), EM step w * mean(q / (q @ w)) normalised) of
    mixture weights w (k,) over components q (N, k) > 0."""
    if q.shape[0] >= PARALLEL_EM_SAMPLES:
        mean_log, sums = kernels.em_pass(np.ascontiguousarray(q), w)
    else:
        s = q @ w
        mean_log, sums = float(np.mean(np.log(s))), q.T @ (1.0 / s)
    w = w * sums / q.shape[0]
    return mean_log, w / w.sum()


class LikelihoodFusion(Fuser):
    """Mixture weights over checkpoints that maximise the validation log-likelihood.

    maximise sum_n log(sum_e w_e P[e, n, y_n]) over the simplex (concave), by EM accelerated
    with SQUAREM (plain EM had not converged after 2,000 iterations on the sample runs).
    Weights below ``min_weight`` times the largest are dropped, or with ``max_checkpoints``
    only the k largest kept, and the rest refitted. Beyond the paper. It uses the labels'
    probabilities only, which a top-k token run holds exactly: the fit is the same there.

    Attributes
    ----------
    weights_ : ndarray (n_checkpoints,), checkpoints_ : list of epoch indices,
    log_likelihood_ : mean validation log-likelihood, n_iter_ : SQUAREM iterations of the
    last solve (3 EM steps each; a RuntimeWarning says when ``max_iter`` stopped it).
    """

    _state = ("log_likelihood", "n_iter")

    @keyword_options
    def __init__(self, *, max_checkpoints=None, max_iter=2000, tol=1e-10, min_weight=1e-6):
        self.max_checkpoints = max_checkpoints
        self.max_iter = max_iter
        self.tol = tol
        self.min_weight = min_weight

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        self._check_params()
        check_validation_run(run)
        # (N, E): on a dask run, computed on the workers; on a top-k run exact (with k equal
        # to the vocabulary, the softmax of the logits: the full run's bits)
        kind = kind_of(run)
        q = (topk.label_probs(kind.certified_bounds(run)) if kind.bounded
             else run.label_probs())
        # C order whatever the source (a transposed view of the softmax stats, a dask
        # result): the BLAS products' bits depend on the layout
        q = np.ascontiguousarray(np.maximum(executor_for(run).compute(q)[0], LOG_FLOOR))
        idx = np.arange(run.n_epochs)
        w, self.n_iter_ = self._em(q)
        keep = w > self.min_weight * w.max()
        if self.max_checkpoints is not None and keep.sum() > self.max_checkpoints:
            keep = np.zeros_like(keep)
            keep[np.argsort(-w, kind="stable")[: self.max_checkpoints]] = True
        if not keep.all():
            idx = idx[keep]
            w, self.n_iter_ = self._em(q[:, keep])
        self._fit_shape(run, idx, w)
        self.log_likelihood_ = _evaluate(q[:, keep], w)[0]
        return self

    def _check_params(self):
        check_int("max_checkpoints", self.max_checkpoints, minimum=1, allow_none=True)
        check_int("max_iter", self.max_iter, minimum=1)
        check_number("tol", self.tol, minimum=0.0)
        check_number("min_weight", self.min_weight, minimum=0.0, maximum=1.0)

    def _read_state(self, fields):
        check_weights_present(self, fields, needed=True)
        if self.max_checkpoints is not None and len(self.checkpoints_) > self.max_checkpoints:
            fields.fail("checkpoints", f"at most max_checkpoints={self.max_checkpoints} epochs",
                        self.checkpoints_)
        self.log_likelihood_ = fields.number(fields.get("log_likelihood"), "log_likelihood")
        self.n_iter_ = fields.integer(fields.get("n_iter"), "n_iter", 0, self.max_iter)

    def _em(self, q):
        """Mixture weights maximising mean(log(q @ w)) over the simplex, for q (N, k) > 0:
        EM accelerated by SQUAREM (Varadhan & Roland 2008, scheme S3). Each iteration takes
        two EM steps r and v apart and tries one point extrapolated along them,
        w + 2a r + a^2 v, with the step length a = |r| / |v| at most ``a_max`` (a = 1 is the
        second EM step); it keeps the point if it lies inside the simplex and raises the
        likelihood over the second EM step (else that step), then takes one more EM step:
        the likelihood never decreases. ``a_max`` (from 1) grows 4x after a kept step at
        the bound and shrinks 4x (to 1 at least) after a refused one, the step control of
        the authors' SQUAREM package: near the optimum |v| -> 0 makes an unbounded a huge,
        and halving it down to a point that is kept costs tens of passes over q.
        Stops when an iteration whose point was not refused gains less than ``tol``
        (a refused one can gain little far from the optimum). Each evaluation
        (`_evaluate`) gives a point's likelihood and its EM step together: at most four
        per iteration. Returns (w, iterations)."""
        if q.shape[0] >= PARALLEL_EM_SAMPLES:
            q = np.ascontiguousarray(q)  # once, for every pass
        k = q.shape[1]
        w = np.full(k, 1.0 / k)
        a_max = 1.0
        cur, w1 = _evaluate(q, w)
        for n_iter in range(1, self.max_iter + 1):
            _, w2 = _evaluate(q, w1)
            r, v = w1 - w, w2 - 2 * w1 + w
            a = min(np.sqrt((r @ r) / (v @ v)), a_max) if v @ v > 0 else 1.0
            best_ll, best_step = _evaluate(q, w2)
            refused = False
            if a > 1:
                point = w + 2 * a * r + a * a * v
                refused = not (point > 0).all()
                if not refused:
                    point /= point.sum()
                    point_ll, point_step = _evaluate(q, point)
                    refused = point_ll < best_ll
                    if not refused:
                        best_ll, best_step = point_ll, point_step
            if refused:
                a_max = max(1.0, a_max / 4)
            elif a == a_max:
                a_max *= 4
            w = best_step
            new, w1 = _evaluate(q, w)
            if new - cur < self.tol and not refused:
                return w, n_iter
            cur = new
        warnings.warn(f"likelihood fusion stopped at max_iter={self.max_iter} before its "
                      f"gain per iteration fell below tol={self.tol}", RuntimeWarning,
                      stacklevel=3)
        return w, n_iter
