"""Likelihood fusion's EM pass for large validation sets: the log-likelihood of mixture
weights and the EM update's sums in one parallel pass over the components."""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import kernel
from .schedule import claim, store
from .views import borrow, row

#: Rows per block of the EM pass: sums are taken per block, then over the blocks in order,
#: so the result does not depend on the number of threads.
EM_BLOCK = 128


@njit(fastmath={"reassoc"}, cache=True)
def _dot(a, b):
    """a @ b for rows (k,), in vector lanes (not in index order)."""
    s = 0.0
    for j in range(a.shape[0]):
        s += a[j] * b[j]
    return s


@kernel
def em_pass(q, w, parts, logs, n_blocks, counter):
    """For mixture weights w (k,) of components q (N, k) > 0: the sums of block b of
    EM_BLOCK rows (b < n_blocks = ceil(N / EM_BLOCK)): parts[b] = sum_n q[n] / (q[n] @ w)
    (k,) and logs[b] = sum_n log(q[n] @ w) (`merge_blocks` adds them in block order)."""
    n, k = q.shape
    g = np.empty(k)  # a block's sums, stored at its end (see schedule)
    b = claim(counter)
    while b < n_blocks:
        g[:] = 0.0
        total = 0.0
        for r in range(b * EM_BLOCK, min(n, (b + 1) * EM_BLOCK)):
            s = _dot(row(q, r), borrow(w))
            total += np.log(s)
            inv = 1.0 / s
            for j in range(k):
                g[j] += q[r, j] * inv
        store(parts[b], g)
        logs[b] = total
        b = claim(counter)


@njit(cache=True)
def merge_blocks(parts, logs, grad):
    """grad = the sum of parts (B, k) over the blocks, in block order; returns the sum of
    logs (B,), in block order."""
    grad[:] = 0.0
    total = 0.0
    for b in range(parts.shape[0]):
        for j in range(parts.shape[1]):
            grad[j] += parts[b, j]
        total += logs[b]
    return total
