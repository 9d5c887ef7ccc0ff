"""Every fuser's prediction of a row from one softmax of each epoch it needs, scored at once.

A fuser's prediction is a recipe of steps over epoch probabilities, each with the
arithmetic of the kernel that `Fuser.predict_proba` runs for it:

- MEAN (epochs): total = (p[e0] + p[e1] + ...) / k, added in order (``combine_softmax``);
- WEIGHTED (epochs, weights): total = ((0 + w0 * p[e0]) + w1 * p[e1]) + ...;
- MIX (epochs, eps): total = eps * mean(epochs) + (1 - eps) * total (``eps_search.mix``).

``score_recipes`` computes each row's softmax of every needed epoch once, runs every
recipe on it and keeps what the scores need (first argmax, max, the label's probability),
so the fused probabilities are never stored.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import kernel
from .schedule import claim, span, store
from .softmax import exp_row
from .views import borrow, row2

MEAN, WEIGHTED, MIX = 0, 1, 2


@njit(inline="always")
def _mean_into(buf, slots, acc):
    """acc = mean of buf[slots] (k, C), added in order then divided."""
    store(acc, buf[slots[0]])
    for j in range(1, slots.shape[0]):
        row = buf[slots[j]]
        for c in range(acc.shape[0]):
            acc[c] += row[c]
    k = slots.shape[0]
    for c in range(acc.shape[0]):
        acc[c] = acc[c] / k


@kernel
def score_recipes(values, src, order, labels, table, needed, method_ptr, step_kind, step_ptr,
                  step_slot, step_value, pred, top, at_label, n_blocks, counter):
    """Per row i of stored outputs values[e, src[i]] (E, M, C) (float16 as int16 bits) and
    recipe m: pred[m, i] (first argmax), top[m, i] (max) and at_label[m, i] (probability of
    labels[i]) of the recipe's fused probabilities.

    needed (U,): the epochs any recipe reads; recipe m's steps are method_ptr[m] ..
    method_ptr[m+1]-1, step s of kind step_kind[s] over the epochs needed[step_slot[j]] for
    j in step_ptr[s] .. step_ptr[s+1]-1, with the weights step_value[j] (WEIGHTED) or eps =
    step_value[step_ptr[s]] (MIX). Rows are read in the order ``order`` (R,). Returns the
    number of (epoch, row) pairs holding inf or nan per needed epoch (U,).
    """
    n_rows = src.shape[0]
    n_classes = values.shape[2]
    bad = np.zeros(needed.shape[0], dtype=np.int64)
    buf = np.empty((needed.shape[0], n_classes))
    total = np.empty(n_classes)
    mean = np.empty(n_classes)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_rows, n_blocks)
        for k in range(lo, hi):
            i = order[k]
            ok = True
            for u in range(needed.shape[0]):  # each needed epoch's softmax, once
                p = buf[u]
                status, _, inv = exp_row(row2(values, needed[u], src[i]), borrow(p),
                                         borrow(table))
                if status < 0:
                    bad[u] += 1
                    ok = False
                    continue
                for c in range(n_classes):
                    p[c] *= inv
            if not ok:
                continue
            for m in range(method_ptr.shape[0] - 1):
                for s in range(method_ptr[m], method_ptr[m + 1]):
                    slots = step_slot[step_ptr[s]: step_ptr[s + 1]]
                    if step_kind[s] == MEAN:
                        _mean_into(buf, slots, total)
                    elif step_kind[s] == WEIGHTED:
                        weights = step_value[step_ptr[s]: step_ptr[s + 1]]
                        total[:] = 0.0
                        for j in range(slots.shape[0]):
                            row = buf[slots[j]]
                            w = weights[j]
                            for c in range(n_classes):
                                total[c] += w * row[c]
                    else:
                        _mean_into(buf, slots, mean)
                        eps = step_value[step_ptr[s]]
                        one_minus = 1.0 - eps
                        for c in range(n_classes):
                            total[c] = eps * mean[c] + one_minus * total[c]
                best = 0
                for c in range(1, n_classes):
                    if total[c] > total[best]:
                        best = c
                pred[m, i] = best
                top[m, i] = total[best]
                at_label[m, i] = total[labels[i]]
        blk = claim(counter)
    return bad
