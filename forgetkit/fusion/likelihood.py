"""Likelihood fusion: mixture weights over checkpoints that maximise the validation
log-likelihood (beyond the paper)."""

from __future__ import annotations

import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from .. import kernels
from .._deprecation import keyword_options
from .._validation import check_int, check_number
from ..execution import executor_for
from ..kinds import kind_of
from ..probs import LOG_FLOOR
from . import topk
from .base import Fuser, as_run, check_validation_run
from .schema import check_weights_present

#: Validation sets of at least this many samples take one parallel pass per evaluation of
#: the likelihood and its gradient (``kernels.em_pass``); smaller ones two BLAS
#: matrix-vector products.
PARALLEL_EM_SAMPLES = 16384
#: Rows of q per block of the Hessian's products (bounds its temporary to 4 x k x this).
HESSIAN_ROWS = 1 << 16


def _blas_on_one_thread():
    """A context in which numpy's matrix products (BLAS) run on one thread. The fit's
    products are skinny (N x k against k, and a k x k Gram matrix of N rows): on 16 cores
    of a lent host, BLAS threads beside numba's gained no time and spun (the real GPT-2
    run's fit: 5.46 s of CPU at 0.51 s of wall, against 0.64 s at 0.50 s on one BLAS
    thread). One thread also gives the same Hessian whatever the number of cores."""
    return threadpool_limits(limits=1, user_api="blas")


def _value_and_gradient(q, x):
    """(mean(log(q @ x)), its gradient q.T @ (1 / (q @ x)) / N (k,)) at x (k,) >= 0 with
    q @ x > 0, for components q (N, k) > 0."""
    if q.shape[0] >= PARALLEL_EM_SAMPLES:
        mean_log, sums = kernels.em_pass(q, x)
    else:
        s = q @ x
        mean_log, sums = float(np.mean(np.log(s))), q.T @ (1.0 / s)
    return mean_log, sums / q.shape[0]


def _hessian(q, q32, x):
    """The negated Hessian of mean(log(q @ x)): (q / s).T @ (q / s) / N with s = q @ x,
    (k, k), summed over blocks of `HESSIAN_ROWS` rows; the products in float32 (``q32``:
    q as float32), which halves their time: the Hessian only steers the Newton steps, whose
    gradient and line search stay in float64, so the optimum reached is the same."""
    n, k = q.shape
    h = np.zeros((k, k))
    for start in range(0, n, HESSIAN_ROWS):
        rows = slice(start, start + HESSIAN_ROWS)
        a = q32[rows] * (1.0 / (q[rows] @ x)).astype(np.float32)[:, None]
        h += a.T @ a  # numpy's product of a matrix with its own transpose: BLAS syrk
    return h / n


def _nonnegative_qp(h, c):
    """argmin over y >= 0 of y @ h @ y / 2 + c @ y, for h (k, k) positive definite: the
    primal active-set method (Nocedal & Wright, Numerical Optimization, 16.5) from y = 0,
    freeing the bound with the most negative multiplier and stepping back to the first
    bound the free solution crosses."""
    k = c.shape[0]
    y, bound = np.zeros(k), np.ones(k, dtype=bool)
    tiny = 1e-14 * max(1.0, float(np.abs(c).max()))
    for _ in range(10 * k + 10):
        free = ~bound
        z = np.zeros(k)
        if free.any():
            z[free] = np.linalg.solve(h[np.ix_(free, free)], -c[free])
        crossing = free & (z < 0)
        if not crossing.any():
            y = z
            multipliers = np.where(bound, h @ y + c, np.inf)
            j = int(np.argmin(multipliers))
            if multipliers[j] >= -tiny:
                break
            bound[j] = False
        else:
            ratios = y[crossing] / (y[crossing] - z[crossing])
            step = ratios.min()
            y = y + step * (z - y)
            hit = np.flatnonzero(crossing)[ratios <= step]
            y[hit] = 0.0
            bound[hit] = True
    return y


class LikelihoodFusion(Fuser):
    """Mixture weights over checkpoints that maximise the validation log-likelihood.

    maximise sum_n log(sum_e w_e P[e, n, y_n]) over the simplex (concave), by sequential
    quadratic programming with an active set (mix-SQP, Kim, Carbonetto, Stephens & Anitescu
    2020): Newton steps that converge in a handful of iterations where EM took hundreds.
    Weights below ``min_weight`` times the largest are dropped, or with ``max_checkpoints``
    only the k largest kept, and the rest refitted. Beyond the paper. It uses the labels'
    probabilities only, which a top-k token run holds exactly: the fit is the same there.

    Attributes
    ----------
    weights_ : ndarray (n_checkpoints,), checkpoints_ : list of epoch indices,
    log_likelihood_ : mean validation log-likelihood, n_iter_ : iterations of the last
    solve (a RuntimeWarning says when ``max_iter`` stopped it).
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
        with _blas_on_one_thread():
            w, self.n_iter_ = self._solve(q)
            keep = w > self.min_weight * w.max()
            if self.max_checkpoints is not None and keep.sum() > self.max_checkpoints:
                keep = np.zeros_like(keep)
                keep[np.argsort(-w, kind="stable")[: self.max_checkpoints]] = True
            if not keep.all():
                idx = idx[keep]  # from the kept weights: often the optimum already (dropped = 0)
                w, self.n_iter_ = self._solve(q[:, keep], w[keep] / w[keep].sum())
            self.log_likelihood_ = _value_and_gradient(q[:, keep], w)[0]
        self._fit_shape(run, idx, w)
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

    def _solve(self, q, start=None):
        """Mixture weights maximising mean(log(q @ w)) over the simplex, for q (N, k) > 0,
        from ``start`` (k,) on the simplex (default uniform).

        As mix-SQP: minimise f(x) = -mean(log(q @ x)) + sum(x) over x >= 0, whose minimum
        lies on the simplex (sum(x) = 1 there). Each iteration takes the quadratic model of
        f at x (gradient g, Hessian h: `_value_and_gradient`, `_hessian`, with a ridge of
        1e-12 of its mean diagonal against checkpoints whose columns are nearly equal),
        minimises it over y >= 0 (`_nonnegative_qp`), and steps to x + a (y - x), halving a
        from 1 until f falls by at least 1% of a g @ (y - x) (Armijo). Stops when
        an iteration gains less than ``tol`` or finds no descent. Returns (w, iterations)."""
        if q.shape[0] >= PARALLEL_EM_SAMPLES:
            q = np.ascontiguousarray(q)  # once, for every pass
        k = q.shape[1]
        q32 = q.astype(np.float32)
        x = np.full(k, 1.0 / k) if start is None else start
        mean_log, grad = _value_and_gradient(q, x)
        f = x.sum() - mean_log
        for n_iter in range(1, self.max_iter + 1):
            g = 1.0 - grad
            h = _hessian(q, q32, x)
            h[np.diag_indices(k)] += 1e-12 * np.trace(h) / k
            step = _nonnegative_qp(h, g - h @ x) - x
            slope = g @ step
            if not slope < 0:  # no descent direction left: the optimum, to rounding
                return x / x.sum(), n_iter
            a = 1.0
            while True:
                new_x = x + a * step
                new_log, new_grad = _value_and_gradient(q, new_x)
                new_f = new_x.sum() - new_log
                if new_f <= f + 0.01 * a * slope:
                    break
                a /= 2
                if a < 1e-12:  # rounding, not the model, decides f here
                    return x / x.sum(), n_iter
            gain, x, grad, f = f - new_f, new_x, new_grad, new_f
            if gain < self.tol:
                return x / x.sum(), n_iter
        warnings.warn(f"likelihood fusion stopped at max_iter={self.max_iter} before its "
                      f"gain per iteration fell below tol={self.tol}", RuntimeWarning,
                      stacklevel=3)
        return x / x.sum(), n_iter
