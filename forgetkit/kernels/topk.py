"""Kernels of fusion on top-k token runs (certified fusion): the per-token layout of the
classes a mixture can hold, each checkpoint's lower and upper bounds in that layout, and the
certificate of a mixture's bounds.

Layout of a token n (row n of ``cls``, ascending class ids): every class that some checkpoint
of the mixture stored among its top k, and the target; then, when these are fewer than the
vocabulary, one *unstored slot* standing for every other class (their common upper bound),
placed at the smallest such id that can reach that bound (ties with it follow the rule of
the lowest id): above each checkpoint's k-th stored id where its bound is its k-th
probability, since equal logits are stored by ascending id (`tie_floor`, the lowest such id
over the checkpoints, or -1); then padding (id = vocabulary + 1, value 0) up to the width.

See docs/definitions.md ("Certified fusion on top-k runs").
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .jit import kernel
from .schedule import claim, span


@njit(cache=True, nogil=True)
def exp_into(x, out):
    """out[i] = exp(x[i]) for float64 x (n,), with the C library's exp: the one every
    kernel here calls, so that probabilities computed outside the kernels agree with theirs
    bit for bit."""
    for i in range(x.size):
        out[i] = math.exp(x[i])


@njit(inline="always")
def _lower_bound(row, c, end):
    """The first index i of row[:end] (ascending) with row[i] >= c (end if none)."""
    lo, hi = 0, end
    while lo < hi:
        mid = (lo + hi) // 2
        if row[mid] < c:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _row_classes(ids, targets, n, buf):
    """Sorted distinct classes of token n: ids[e, n, :] over every e, and targets[n]; written
    to buf's start (insertion into the sorted prefix: checkpoints store mostly the same
    ids); returns their count."""
    n_epochs, _, k = ids.shape
    buf[0] = targets[n]
    count = 1
    for e in range(n_epochs):
        for j in range(k):
            c = np.int64(ids[e, n, j])
            if e > 0 and ids[e - 1, n, j] == ids[e, n, j]:
                continue  # inserted already (consecutive checkpoints often agree)
            lo = _lower_bound(buf, c, count)
            if lo < count and buf[lo] == c:
                continue
            for i in range(count, lo, -1):
                buf[i] = buf[i - 1]
            buf[lo] = c
            count += 1
    return count


@kernel
def layout_widths(ids, targets, vocab, width, n_blocks, counter):
    """width[n] = number of layout slots of token n (its distinct classes, plus the unstored
    slot when they are fewer than ``vocab``). ids: (E, N, k) stored ids; targets: int64 (N,)."""
    n_epochs, n_tokens, k = ids.shape
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_tokens, n_blocks)
        for n in range(lo, hi):
            buf = np.empty(n_epochs * k + 1, dtype=np.int64)
            count = _row_classes(ids, targets, n, buf)
            width[n] = count + (1 if count < vocab else 0)
        blk = claim(counter)


#: The slack of the unstored mass, relative to max(|lse|, |largest logit|, 1): the records'
#: probabilities exp(z - lse) sum over the vocabulary to 1 only up to the float32 rounding of
#: lse and of the logits (half a float32 step each, 2**-24 relative); four times that.
MASS_SLACK = 2.0 ** -21


@njit(inline="always")
def _unstored_bound(logits, ids, target, lse, y, n):
    """(p_y, u, p_k) of one record: the target's exact probability, the bound of the classes
    it did not store, min(p_k, max(0, 1 - the sum of the stored probabilities) + slack)
    (slack: MASS_SLACK * max(|lse|, |largest logit|, 1)), and its k-th probability."""
    k = logits.shape[1]
    top = np.float64(lse[n])
    p_y = np.exp(np.float64(target[n]) - top)
    total = 0.0
    stored_y = False
    for j in range(k):
        total += np.exp(np.float64(logits[n, j]) - top)
        stored_y = stored_y or ids[n, j] == y
    if not stored_y:
        total += p_y
    p_k = np.exp(np.float64(logits[n, k - 1]) - top)
    slack = MASS_SLACK * max(abs(top), abs(np.float64(logits[n, 0])), 1.0)
    return p_y, min(p_k, max(0.0, 1.0 - total) + slack), p_k


@kernel
def tie_floor(logits, ids, target, lse, targets, floor, n_blocks, counter):
    """floor[n] = min(floor[n], t) with t the k-th stored id where this checkpoint's
    unstored bound is its k-th probability (no unstored class below that id reaches the
    bound: equal logits are stored by ascending id), else -1."""
    k = logits.shape[1]
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, logits.shape[0], n_blocks)
        for n in range(lo, hi):
            _, u, p_k = _unstored_bound(logits, ids, target, lse, targets[n], n)
            t = np.int64(ids[n, k - 1]) if u == p_k else np.int64(-1)
            floor[n] = min(floor[n], t)
        blk = claim(counter)


@kernel
def layout_fill(ids, targets, vocab, floor, cls, label_col, unstored_col, n_blocks, counter):
    """Fill the layout: cls (N, M) int32 or int64 (see the module; the unstored slot's id is the
    smallest class no checkpoint stored above floor[n], or ``vocab`` if none; padding
    ``vocab + 1``), label_col[n] = the target's column, unstored_col[n] = the unstored
    slot's column (-1: none)."""
    n_epochs, n_tokens, k = ids.shape
    width = cls.shape[1]
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_tokens, n_blocks)
        for n in range(lo, hi):
            buf = np.empty(n_epochs * k + 1, dtype=np.int64)
            count = _row_classes(ids, targets, n, buf)
            slot = np.int64(-1)
            if count < vocab:  # the smallest class above floor[n] not in buf
                slot = max(floor[n] + 1, 0)
                for i in range(count):
                    if buf[i] == slot:
                        slot += 1
                    elif buf[i] > slot:
                        break
            unstored_col[n] = -1
            col = 0
            for i in range(count):
                if slot >= 0 and unstored_col[n] < 0 and buf[i] > slot:
                    unstored_col[n] = col
                    cls[n, col] = slot
                    col += 1
                if buf[i] == targets[n]:
                    label_col[n] = col
                cls[n, col] = buf[i]
                col += 1
            if slot >= 0 and unstored_col[n] < 0:
                unstored_col[n] = col
                cls[n, col] = min(slot, vocab)
                col += 1
            for c in range(col, width):
                cls[n, c] = vocab + 1
        blk = claim(counter)


@njit(inline="always")
def _column(row, c, end):
    """Column of class c in row[:end] (ascending), or -1."""
    lo = _lower_bound(row, c, end)
    return lo if lo < end and row[lo] == c else -1


@kernel
def bound_values(logits, ids, target, lse, targets, vocab, cls, label_col, unstored_col,
                 upper, lower, n_blocks, counter):
    """One checkpoint's bounds in the layout: for the classes it stored and the target, the
    exact p = exp(z - lse) (upper = lower); for every other class of the layout and the
    unstored slot, upper = u = min(p of its k-th stored class, max(0, 1 - the sum of its
    stored probabilities) + slack) (see ``_unstored_bound``) and lower = 0; padding 0.

    The stored probabilities are the k top ones (summed in order) and the target's when it
    is not among them. logits (N, k) float32, ids (N, k), target (N,) float32, lse (N,)
    float32: one checkpoint's records; upper, lower: float64 (N, M) (lower (0, 0): upper
    only)."""
    n_tokens, k = logits.shape
    width = cls.shape[1]
    both = lower.shape[0] > 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_tokens, n_blocks)
        for n in range(lo, hi):
            # the arithmetic of _unstored_bound, each probability computed once
            y, top = targets[n], np.float64(lse[n])
            end = width
            while end > 0 and cls[n, end - 1] > vocab:
                end -= 1
            for c in range(width):
                upper[n, c] = -1.0 if c < end else 0.0  # -1: not stored, set to u below
                if both:
                    lower[n, c] = 0.0
            total = 0.0
            stored_y = False
            p = 0.0
            for j in range(k):
                p = np.exp(np.float64(logits[n, j]) - top)
                total += p
                stored_y = stored_y or ids[n, j] == y
                col = _column(cls[n], np.int64(ids[n, j]), end)
                if col >= 0:
                    upper[n, col] = p
                    if both:
                        lower[n, col] = p
            p_y = np.exp(np.float64(target[n]) - top)
            if not stored_y:
                total += p_y
            slack = MASS_SLACK * max(abs(top), abs(np.float64(logits[n, 0])), 1.0)
            u = min(p, max(0.0, 1.0 - total) + slack)  # p: the k-th stored probability
            upper[n, label_col[n]] = p_y
            if both:
                lower[n, label_col[n]] = p_y
            for c in range(end):
                if upper[n, c] < 0.0:
                    upper[n, c] = u
        blk = claim(counter)


@kernel
def certify_rows(upper, lower, cls, label_col, unstored_col, vocab, pred, certified, state,
                 n_blocks, counter):
    """The certificate of a mixture's bounds, row by row (upper, lower float64 (N, M) in the
    layout): pred[n] = the class of largest lower bound (ties: the lowest id); certified[n]
    = its lower bound beats every other column's upper bound (>= a higher id, > a lower
    one); state[n] = 1 certified correct (the target beats every upper bound), 0 certified
    wrong (some class's lower bound beats the target's exact value), -1 uncertain."""
    n_tokens, width = upper.shape
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_tokens, n_blocks)
        for n in range(lo, hi):
            row_cls = cls[n]
            best = -1
            for c in range(width):
                if row_cls[c] > vocab or c == unstored_col[n]:
                    continue
                if best < 0 or lower[n, c] > lower[n, best]:
                    best = c
            pred[n] = row_cls[best]
            sure = True
            for c in range(width):
                if c == best or row_cls[c] > vocab:
                    continue
                if row_cls[c] < row_cls[best]:
                    sure = sure and lower[n, best] > upper[n, c]
                else:
                    sure = sure and lower[n, best] >= upper[n, c]
            certified[n] = sure
            y_col = label_col[n]
            q = upper[n, y_col]
            wrong = False
            for c in range(width):
                if c == y_col or row_cls[c] > vocab:
                    continue
                if row_cls[c] < row_cls[y_col]:
                    wrong = wrong or lower[n, c] >= q
                else:
                    wrong = wrong or lower[n, c] > q
            if sure and best == y_col:
                state[n] = 1
            elif wrong:
                state[n] = 0
            else:
                state[n] = -1
        blk = claim(counter)
