"""Kernels of greedy ensemble selection: the undecided rows of a round, candidate classes of
those rows, per-epoch correct counts of total + softmax (logits not held as probabilities)
or of total + probabilities (held in memory), and the running total."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .floats import to_f64
from .softmax import exp_row, exp_shifted, is_table_row


@njit(inline="always")
def _row_max(t):
    top = t[0]
    for c in range(t.shape[0]):
        top = t[c] if t[c] > top else top
    return top


@njit(parallel=True, cache=True)
def selection_candidates(total, rows, bound, slack):
    """Classes that can still win row r = rows[i] of ``total`` (N, C) when one probability
    vector whose entries are at most bound[i] is added: those within bound[i] + slack of
    the row's max. Returns cand_ptr (R+1,) and cand (ascending classes per row, CSR)."""
    n_rows = rows.shape[0]
    counts = np.zeros(n_rows + 1, dtype=np.int64)
    for i in prange(n_rows):
        t = total[rows[i]]
        threshold = _row_max(t) - bound[i] - slack
        n = 0
        for c in range(t.shape[0]):
            n += t[c] >= threshold
        counts[i + 1] = n
    ptr = np.cumsum(counts)
    cand = np.empty(ptr[-1], dtype=np.int64)
    for i in prange(n_rows):
        t = total[rows[i]]
        threshold = _row_max(t) - bound[i] - slack
        j = ptr[i]
        for c in range(t.shape[0]):
            if t[c] >= threshold:
                cand[j] = c
                j += 1
    return ptr, cand


@njit(inline="always")
def _first_argmax_nonnegative(t, e, scale):
    """First index of the max of t + e * scale (rows (C,) of non-negative floats; e is
    overwritten with the sums). Non-negative float64 order is the order of their bits, so
    both passes vectorise as integer code."""
    top = np.int64(0)
    for c in range(t.shape[0]):
        e[c] = t[c] + e[c] * scale
        top = max(top, np.float64(e[c]).view(np.int64))
    for c in range(t.shape[0]):
        if np.float64(e[c]).view(np.int64) == top:
            return c
    return -1


@njit(parallel=True, cache=True)
def selection_correct_counts(values, src, total, rows, labels, table, shift, inv, top,
                             cand_ptr, cand, n_blocks):
    """Per epoch e: the rows r = rows[i] whose argmax of total[r] + softmax(values[e, src[i]])
    is labels[r].

    values: stored outputs (E, M, C) (float16 as int16 bits); src (R,): the row of values
    holding each row; table: the ``f16_exp_table()``; shift, inv, top (E, N): per epoch and
    row of total, the m and inv of ``exp_row`` and the largest probability of that softmax
    (nan: not known yet; such rows are scored whole and the three kept). Rows of known inv
    with at most C/2 candidate classes (``selection_candidates``) are scored on those only,
    each probability computed exactly as ``softmax_rows`` does.
    A row of total is read once for all epochs.
    Returns counts (E,) and the number of rows holding inf or nan per epoch (E,).
    """
    n_epochs = values.shape[0]
    n_rows = rows.shape[0]
    n_classes = total.shape[1]
    n_blocks = max(1, min(n_blocks, n_rows))
    counts = np.zeros((n_blocks, n_epochs), dtype=np.int64)
    bad = np.zeros((n_blocks, n_epochs), dtype=np.int64)
    for blk in prange(n_blocks):
        tmp = np.empty(n_classes)
        picked = np.empty(n_classes)
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            t = total[r]
            for e in range(n_epochs):
                x = values[e, src[i]]
                best = -1
                first = cand_ptr[i]
                n = cand_ptr[i + 1] - first
                known = inv[e, r] > 0.0
                if not known or 2 * n > n_classes:  # the whole row is cheaper
                    status, m, scale = exp_row(x, tmp, table)
                    if status < 0:
                        bad[blk, e] += 1
                        continue
                    if status == 1 and not known:
                        shift[e, r] = m
                        inv[e, r] = scale
                        top[e, r] = _row_max(tmp) * scale
                    best = _first_argmax_nonnegative(t, tmp, scale)
                else:  # the candidates' exp (table or vectorised exp), then their argmax
                    if is_table_row(x, shift[e, r]):
                        for j in range(n):
                            tmp[j] = table[np.uint16(x[cand[first + j]])]
                    else:
                        for j in range(n):
                            picked[j] = to_f64(x[cand[first + j]])
                        exp_shifted(picked[:n], shift[e, r], tmp[:n])
                    for j in range(n):
                        picked[j] = t[cand[first + j]]
                    best = cand[first + _first_argmax_nonnegative(picked[:n], tmp[:n],
                                                                  inv[e, r])]
                if best == labels[r]:
                    counts[blk, e] += 1
    return counts.sum(axis=0), bad.sum(axis=0)


@njit(parallel=True, cache=True)
def undecided_rows(total, labels, threshold, open_):
    """Rows of ``total`` (N, C) whose largest value leads the second largest (itself when
    the max is shared) by at most threshold[r]: open_[r] (bool (N,)). Returns how many of
    the other rows have the label as their first argmax."""
    n_correct = 0
    for r in prange(total.shape[0]):
        t = total[r]
        first, second, best = t[0], -np.inf, 0
        for c in range(1, t.shape[0]):
            v = t[c]
            if v > first:
                first, second, best = v, first, c
            elif v > second:
                second = v
        open_[r] = first - second <= threshold[r]
        if not open_[r] and best == labels[r]:
            n_correct += 1
    return n_correct


@njit(parallel=True, cache=True)
def row_max(probs, out):
    """out[r] = the largest value of row r over every epoch of probs (E, N, C)."""
    for r in prange(probs.shape[1]):
        top = probs[0, r, 0]
        for e in range(probs.shape[0]):
            for c in range(probs.shape[2]):
                top = max(top, probs[e, r, c])
        out[r] = top


@njit(parallel=True, cache=True)
def add_into(total, p):
    """total += p (float64 (N, C)), numpy's arithmetic, rows in parallel."""
    for r in prange(total.shape[0]):
        for c in range(total.shape[1]):
            total[r, c] += p[r, c]


@njit(inline="always")
def _first_argmax_sum(t, p):
    """First index of the max of t + p, rows (C,) of non-negative floats, without writing:
    the max of the sums' bits (their order) vectorises, then the first index holding it."""
    top = np.int64(0)
    for c in range(t.shape[0]):
        top = max(top, np.float64(t[c] + p[c]).view(np.int64))
    for c in range(t.shape[0]):
        if np.float64(t[c] + p[c]).view(np.int64) == top:
            return c
    return -1


@njit(parallel=True, cache=True)
def selection_cached_counts(probs, total, rows, labels, cand_ptr, cand, n_blocks):
    """Per epoch e: the rows r = rows[i] whose first argmax of total[r] + probs[e, r] is
    labels[r], for float64 probabilities (E, N, C) held in memory.

    Only the candidate classes of each row (``selection_candidates``: no other class can
    win) are compared, in ascending order, unless they are more than C/2 (then the whole
    row); a row whose label is not a candidate is never right. A row of total is read once
    for all epochs. Returns counts (E,).
    """
    n_epochs = probs.shape[0]
    n_rows = rows.shape[0]
    n_classes = total.shape[1]
    n_blocks = max(1, min(n_blocks, n_rows))
    counts = np.zeros((n_blocks, n_epochs), dtype=np.int64)
    for blk in prange(n_blocks):
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            t = total[r]
            y = labels[r]
            first = cand_ptr[i]
            n = cand_ptr[i + 1] - first
            hopeless = True
            for j in range(n):
                hopeless &= cand[first + j] != y
            if hopeless:
                continue
            whole = 2 * n > n_classes
            for e in range(n_epochs):
                p = probs[e, r]
                if whole:
                    best = _first_argmax_sum(t, p)
                else:
                    best = cand[first]
                    best_v = t[best] + p[best]
                    for j in range(1, n):
                        c = cand[first + j]
                        v = t[c] + p[c]
                        if v > best_v:
                            best = c
                            best_v = v
                if best == y:
                    counts[blk, e] += 1
    return counts.sum(axis=0)
