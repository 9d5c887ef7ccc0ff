"""Deep linear networks and PCA (paper section 4): where forgetting comes from.

Conventions: data matrices hold samples as rows, X (n, d); targets Y (n, k) one-hot (or
labels (n,)). The L2 objective (the paper's eq. 2) is L(W) = ||X W^T - Y||_F^2 / (2n) with
the end-to-end map W = W_L ... W_1 (k, d) of a depth-L linear network. Every function that
produces outputs over time returns a `Run`, so F_e, forget times and plots apply unchanged.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._deprecation import keyword_options
from .._validation import check_array, check_int
from ..analysis.forgetting import correctness
from ..errors import ForgetkitError
from ..run import Run, check_run


def _targets(Y, n):
    Y = check_array("Y", Y, kinds="biuf")
    if Y.ndim == 1:
        labels = Y.astype(np.int64)
        onehot = np.zeros((n, labels.max() + 1))
        onehot[np.arange(n), labels] = 1.0
        return onehot, labels
    if Y.shape[0] != n:
        raise ForgetkitError(f"Y must have {n} rows (samples); got shape {Y.shape}")
    return Y.astype(np.float64), np.argmax(Y, axis=1)


def _check_X(X, name="X"):
    X = check_array(name, X, kinds="biuf").astype(np.float64)
    if X.ndim != 2:
        raise ForgetkitError(f"{name} must have shape (samples, features); got shape {X.shape}")
    return X


def _product(mats):
    """mats[-1] @ ... @ mats[0] (identity-free; mats non-empty)."""
    out = mats[0]
    for m in mats[1:]:
        out = m @ out
    return out


@keyword_options
def simulate_deep_linear(X, Y, *, depth=3, width=100, lr=0.05, steps=2000, record_every=20,
                         seed=0, X_eval=None, y_eval=None, init_scale=1e-2):
    """Gradient descent on a deep linear network with the L2 objective; outputs over time.

    Parameters
    ----------
    X : ndarray (n, d) training inputs; Y : one-hot (n, k) or labels (n,)
    depth : number of weight matrices L (>= 1); width : hidden width
    lr, steps : full-batch gradient descent step size and number of steps
    record_every : record the evaluation outputs every this many steps (and at the end)
    seed, init_scale : weights start i.i.d. normal with standard deviation init_scale
    X_eval, y_eval : data to record (default: the training data and its labels)

    Returns
    -------
    Run of kind "logits" with outputs X_eval W(t)^T at the recorded steps (float32), the
    step numbers as ``epochs``, and the final end-to-end matrix in ``meta["W"]``.

    The gradient uses the second moments C_xx = X^T X / n and C_yx = Y^T X / n, so a step costs
    O(depth * width * d + k * d^2) whatever n is.
    """
    X = _check_X(X)
    n, d = X.shape
    Yh, labels = _targets(Y, n)
    k = Yh.shape[1]
    depth = check_int("depth", depth, minimum=1)
    width = check_int("width", width, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    record_every = check_int("record_every", record_every, minimum=1)
    if X_eval is None:
        X_eval, y_eval = X, labels
    else:
        X_eval = _check_X(X_eval, "X_eval")
        if y_eval is None:
            raise ForgetkitError("y_eval is required with X_eval")
    rng = np.random.default_rng(seed)
    dims = [d] + [width] * (depth - 1) + [k]
    Ws = [rng.normal(0, init_scale, (dims[i + 1], dims[i])) for i in range(depth)]
    cxx = X.T @ X / n
    cyx = Yh.T @ X / n
    record_steps = sorted(set(range(0, steps + 1, record_every)) | {steps})
    outputs = np.empty((len(record_steps), X_eval.shape[0], k), dtype=np.float32)
    r = 0
    for t in range(steps + 1):
        W = _product(Ws)
        if t == record_steps[r]:
            outputs[r] = X_eval @ W.T
            r += 1
        if t == steps:
            break
        G = W @ cxx - cyx  # dL/dW, (k, d)
        grads = []
        for j in range(depth):  # dL/dW_j = (W_L..W_j+1)^T G (W_j-1..W_1)^T
            g = G if j + 1 == depth else _product(Ws[j + 1:]).T @ G
            grads.append(g if j == 0 else g @ _product(Ws[:j]).T)
        for j in range(depth):
            Ws[j] = Ws[j] - lr * grads[j]
    return Run(outputs, y_eval, kind="logits", epochs=record_steps,
               meta={"model": f"deep linear, depth {depth}, width {width}", "lr": lr,
                     "steps": steps, "W": _product(Ws).tolist()})


# ------------------------------------------------------------- closed form (PCA)
def pca(X):
    """Principal components of the second-moment matrix X^T X / n (centre X first for the
    covariance). Returns eigenvalues (d,) descending and eigenvectors (d, d) as columns."""
    X = _check_X(X)
    vals, vecs = np.linalg.eigh(X.T @ X / X.shape[0])
    order = np.argsort(vals)[::-1]
    return vals[order], vecs[:, order]


def optimal_separator(X, Y):
    """W_opt (k, d): the least-squares solution of min ||X W^T - Y||_F (minimum norm),
    the limit of gradient descent on the L2 objective from a small initialisation."""
    X = _check_X(X)
    Yh, _ = _targets(Y, X.shape[0])
    sol, *_ = np.linalg.lstsq(X, Yh, rcond=None)
    return sol.T


@keyword_options
def pca_path(X, Y, X_eval, y_eval, *, ks=None):
    """Outputs of W(k) = W_opt U_k U_k^T, W_opt projected on the first k principal components,
    for each k in ``ks`` (default 1..d): the order in which a deep linear network learns.

    Returns a Run whose ``epochs`` are the k values; its last entry should be k = rank (W_opt)
    for S(k) to be defined against W_opt.
    """
    X, X_eval = _check_X(X), _check_X(X_eval, "X_eval")
    y_eval = check_array("y_eval", y_eval, ndim=1, kinds="iu")
    _, U = pca(X)
    w_opt = optimal_separator(X, Y)
    ks = np.arange(1, X.shape[1] + 1) if ks is None else np.asarray(ks, dtype=np.int64)
    Z = X_eval @ U  # eval data in the PCA basis (n_eval, d)
    B = U.T @ w_opt.T  # separator in the PCA basis (d, k)
    out = np.empty((len(ks), X_eval.shape[0], B.shape[1]), dtype=np.float32)
    for i, k in enumerate(ks):
        out[i] = Z[:, :k] @ B[:k]
    return Run(out, y_eval, kind="logits", epochs=ks,
               meta={"model": "W_opt projected on the first k principal components"})


# --------------------------------------------------------- forgotten sets, overlap
def forgotten_after(run, index):
    """bool (n_samples,): correct at some stored epoch after epoch *index* ``index`` and
    wrong at the final one. S(k) of the paper's Definition 2 for a `pca_path` run, M(n) for
    a deep model's run."""
    check_run("run", run)
    index = check_int("index", index, minimum=0, maximum=run.n_epochs - 1)
    correct = correctness(run)
    later = correct[index + 1:].any(axis=0) if index + 1 < run.n_epochs else \
        np.zeros(run.n_samples, dtype=bool)
    return later & ~correct[-1]


def overlap(S, M):
    """(|S ∩ M| / |S|, |S ∩ M| / |M|) of two boolean masks over the same samples (nan for an
    empty set)."""
    S = check_array("S", S, ndim=1, kinds="biu").astype(bool)
    M = check_array("M", M, ndim=1, kinds="biu").astype(bool)
    if S.shape != M.shape:
        raise ForgetkitError(f"S and M must cover the same samples; got {S.shape} and {M.shape}")
    both = np.sum(S & M)
    return (both / S.sum() if S.any() else np.nan, both / M.sum() if M.any() else np.nan)


def align_indices(linear_run, deep_run):
    """Fit n = alpha * k + beta matching the two time scales by forgotten-set size: for each
    stored k, the deep-run epoch index n whose |M(n)| is closest to |S(k)|, then a
    least-squares line. Returns (alpha, beta) in *indices* of the two runs."""
    check_run("linear_run", linear_run)
    check_run("deep_run", deep_run)
    s_sizes = np.array([forgotten_after(linear_run, i).sum() for i in range(linear_run.n_epochs)])
    m_sizes = np.array([forgotten_after(deep_run, n).sum() for n in range(deep_run.n_epochs)])
    use = np.flatnonzero(s_sizes > 0)
    if use.size < 2:
        raise ForgetkitError("the linear run forgets too little to align the time scales")
    best_n = np.array([int(np.argmin(np.abs(m_sizes - s_sizes[i]))) for i in use])
    alpha, beta = np.polyfit(use, best_n, 1)
    return float(alpha), float(beta)


def overlap_table(linear_run, deep_run, *, alpha=None, beta=None):
    """Overlap of S(k) (linear model) and M(n) (deep model) along the aligned time axis.

    Returns a DataFrame, one row per stored k with a non-empty S(k): k, the aligned deep
    epoch n, |S|, |M|, |S∩M|, the two ratios, and ``chance`` = |M| / N, the expected
    |S∩M| / |S| were S a random set of the same size.
    """
    check_run("linear_run", linear_run)
    check_run("deep_run", deep_run)
    if linear_run.n_samples != deep_run.n_samples or \
            not np.array_equal(linear_run.labels, deep_run.labels):
        raise ForgetkitError("the linear and deep runs must hold the same samples (same labels)")
    if alpha is None or beta is None:
        alpha, beta = align_indices(linear_run, deep_run)
    rows = []
    for i in range(linear_run.n_epochs):
        S = forgotten_after(linear_run, i)
        if not S.any():
            continue
        n = int(np.clip(round(alpha * i + beta), 0, deep_run.n_epochs - 1))
        M = forgotten_after(deep_run, n)
        s_in_m, m_in_s = overlap(S, M)
        rows.append({"k": int(linear_run.epochs[i]), "deep_epoch": int(deep_run.epochs[n]),
                     "S": int(S.sum()), "M": int(M.sum()), "both": int(np.sum(S & M)),
                     "S_in_M": s_in_m, "M_in_S": m_in_s, "chance": M.mean()})
    return pd.DataFrame(rows)
