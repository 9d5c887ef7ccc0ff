"""Kernels of fusion on top-k token runs (certified fusion): the per-token layout of the
classes a mixture can hold, each checkpoint's lower and upper bounds in that layout, and the
certificate of a mixture's bounds.

Layout of a token n (row n of ``cls``, ascending class ids): every class that some checkpoint
of the mixture stored among its top k, and the target; then, when these are fewer than the
vocabulary, one *unstored slot* standing for every other class (their common upper bound),
placed at the smallest such id that can reach that bound (ties with it follow the rule of
the lowest id): above each checkpoint's k-th stored id where its bound is its k-th
probability, since equal logits are stored by ascending id (the *tie floor*, the lowest
such id over the checkpoints, or -1: `token_scan`); then padding (id = vocabulary + 1,
value 0) up to the width.

The kernels read the records' fields in place (logits, ids (E, N, k), target, lse (E, N),
any strides), at the checkpoints ``epochs`` and tokens ``src`` (int64 indices): each
token's candidate classes are gathered once per layout (a small hash set), and a window's
mean of bounds is made row by row (`window_bounds`; `window_grid_counts` feeds each row to
the eps search at once).

See docs/definitions.md ("Certified fusion on top-k runs").
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .argmax import first_argmax_mix
from .eps_search import _grid_row
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


#: The slack of the unstored mass, relative to max(|lse|, |largest logit|, 1): the records'
#: probabilities exp(z - lse) sum over the vocabulary to 1 only up to the float32 rounding of
#: lse and of the logits (half a float32 step each, 2**-24 relative); four times that.
MASS_SLACK = 2.0 ** -21


@njit(inline="always")
def _record_probs(logits, ids, target, lse, e, s, y, probs):
    """The probabilities of record (e, s) of a token of target y: probs[:k] = the stored
    ones exp(z - lse); returns (p_y, u) with u the bound of the classes it did not store
    (see ``_unstored_bound``, whose arithmetic this is)."""
    k = logits.shape[2]
    top = np.float64(lse[e, s])
    total = 0.0
    stored_y = False
    p = 0.0
    for j in range(k):
        p = np.exp(np.float64(logits[e, s, j]) - top)
        probs[j] = p
        total += p
        stored_y = stored_y or ids[e, s, j] == y
    p_y = np.exp(np.float64(target[e, s]) - top)
    if not stored_y:
        total += p_y
    slack = MASS_SLACK * max(abs(top), abs(np.float64(logits[e, s, 0])), 1.0)
    return p_y, min(p, max(0.0, 1.0 - total) + slack)  # p: the k-th stored probability


@njit(inline="always")
def _hash_insert(keys, stamps, stamp, c):
    """Insert class c into the open-addressing set (keys, stamps) of the entries marked
    ``stamp``; returns whether it was new."""
    mask = keys.shape[0] - 1
    h = (c * np.int64(0x9E3779B1)) & mask
    while stamps[h] == stamp:
        if keys[h] == c:
            return False
        h = (h + 1) & mask
    stamps[h] = stamp
    keys[h] = c
    return True


@njit(inline="always")
def _hash_find(keys, stamps, stamp, c):
    """The slot of class c in the set (keys, stamps) of the entries marked ``stamp`` (c
    must be in it)."""
    mask = keys.shape[0] - 1
    h = (c * np.int64(0x9E3779B1)) & mask
    while keys[h] != c or stamps[h] != stamp:
        h = (h + 1) & mask
    return h


@njit(inline="always")
def _hash_size(n_epochs, k):
    """Slots of a set of up to n_epochs * k + 1 classes: a power of two, at most half full."""
    size = 16
    while size < 2 * (n_epochs * k + 1):
        size *= 2
    return size


@njit(inline="always")
def _row_end(cls_row, vocab):
    """Columns of a layout row before its padding (ids > vocab)."""
    end = cls_row.shape[0]
    while end > 0 and cls_row[end - 1] > vocab:
        end -= 1
    return end


#: Relative margin by which a class's bound must beat the target's probability at every
#: checkpoint for a token to be *settled* (wrong under every mixture the fit can make):
#: the rounding of a mixture's sums and mixing steps is some 2**-45 at most.
SETTLE_MARGIN = 2.0 ** -20
#: Smallest bound a settling class may take at a checkpoint: a mixture of such values
#: stays far above the underflow of its products with any eps.
SETTLE_FLOOR = 2.0 ** -900


@kernel
def token_scan(logits, ids, target, lse, epochs, src, targets, vocab, rival, floor, width,
               settled, n_blocks, counter):
    """Per token n (records at token src[n] of ``epochs``): floor[n] = min(vocab, each
    checkpoint's tie floor: its k-th stored id where its unstored bound is its k-th
    probability, else -1); width[n] = its layout's columns (the distinct classes of the
    epochs and the target, plus the unstored slot when they are fewer than ``vocab``);
    settled[n] = some column beats the target's probability at every checkpoint by
    `SETTLE_MARGIN` (relative) and is at least `SETTLE_FLOOR`: the unstored slot (bound u),
    or class rival[n] (its probability where stored, else u; rival[n] < 0: not settled).

    logits, ids (E, N, k), target, lse (E, N): the records' fields, any strides; epochs,
    src: int64 indices."""
    k = logits.shape[2]
    size = _hash_size(epochs.shape[0], k)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        keys = np.empty(size, dtype=np.int64)
        stamps = np.zeros(size, dtype=np.int64)
        probs = np.empty(k)
        for n in range(lo, hi):
            s, y, c = src[n], targets[n], rival[n]
            stamp = n + 1
            _hash_insert(keys, stamps, stamp, y)
            count = 1
            low = np.int64(vocab)
            slot_beats, rival_beats = c >= 0, c >= 0
            for i in range(epochs.shape[0]):
                e = epochs[i]
                p_y, u = _record_probs(logits, ids, target, lse, e, s, y, probs)
                t = np.int64(ids[e, s, k - 1]) if u == probs[k - 1] else np.int64(-1)
                low = min(low, t)
                bar = p_y * (1.0 + SETTLE_MARGIN)
                slot_beats = slot_beats and u > bar and u >= SETTLE_FLOOR
                up = u
                for j in range(k):
                    cj = np.int64(ids[e, s, j])
                    if cj == c:
                        up = probs[j]
                    if _hash_insert(keys, stamps, stamp, cj):
                        count += 1
                rival_beats = rival_beats and up > bar and up >= SETTLE_FLOOR
            floor[n] = low
            width[n] = count + (1 if count < vocab else 0)
            settled[n] = (slot_beats and count < vocab) or rival_beats
        blk = claim(counter)


@kernel
def layout_fill(ids, epochs, src, targets, vocab, floor, cls, label_col, unstored_col, cols,
                n_blocks, counter):
    """Fill the layout of tokens src (see the module): cls (n, M) int32 or int64 (the
    unstored slot's id is the smallest class no checkpoint stored above floor[n], or
    ``vocab`` if none; padding ``vocab + 1``), label_col[n] = the target's column,
    unstored_col[n] = the unstored slot's column (-1: none), cols[i, n, j] = the column of
    the j-th id stored at epochs[i] (cols (W, n, k)). ids (E, N, k), any strides."""
    k = ids.shape[2]
    width = cls.shape[1]
    size = _hash_size(epochs.shape[0], k)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        keys = np.empty(size, dtype=np.int64)
        stamps = np.zeros(size, dtype=np.int64)
        where = np.empty(size, dtype=np.int64)  # the column of each class in the set
        buf = np.empty(epochs.shape[0] * k + 1, dtype=np.int64)
        for n in range(lo, hi):
            s, y = src[n], targets[n]
            stamp = n + 1
            _hash_insert(keys, stamps, stamp, y)
            buf[0] = y
            count = 1
            for i in range(epochs.shape[0]):
                e = epochs[i]
                for j in range(k):
                    c = np.int64(ids[e, s, j])
                    if _hash_insert(keys, stamps, stamp, c):
                        buf[count] = c
                        count += 1
            for i in range(1, count):  # insertion sort: a few dozen classes
                c = buf[i]
                m = i
                while m > 0 and buf[m - 1] > c:
                    buf[m] = buf[m - 1]
                    m -= 1
                buf[m] = c
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
                if buf[i] == y:
                    label_col[n] = col
                cls[n, col] = buf[i]
                col += 1
            if slot >= 0 and unstored_col[n] < 0:
                unstored_col[n] = col
                cls[n, col] = min(slot, vocab)
                col += 1
            for c in range(col, width):
                cls[n, c] = vocab + 1
            for c in range(col):
                if c != unstored_col[n]:
                    where[_hash_find(keys, stamps, stamp, np.int64(cls[n, c]))] = c
            for i in range(epochs.shape[0]):
                for j in range(k):
                    c = np.int64(ids[epochs[i], s, j])
                    cols[i, n, j] = where[_hash_find(keys, stamps, stamp, c)]
        blk = claim(counter)


@kernel
def layout_columns(ids, epochs, src, cls, vocab, cols, n_blocks, counter):
    """cols[i, n, j] = the column in the layout row cls[n] of the j-th id stored at
    epochs[i] by token src[n] (-1: not in the row)."""
    k = ids.shape[2]
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        for n in range(lo, hi):
            end = _row_end(cls[n], vocab)
            for i in range(epochs.shape[0]):
                for j in range(k):
                    cols[i, n, j] = _column(cls[n], np.int64(ids[epochs[i], src[n], j]), end)
        blk = claim(counter)


@njit(inline="always")
def _column(row, c, end):
    """Column of class c in row[:end] (ascending), or -1."""
    lo = _lower_bound(row, c, end)
    return lo if lo < end and row[lo] == c else -1


@njit(inline="always")
def _window_row(logits, ids, target, lse, cols, epochs, pos, s, n, y, y_col, end, upper,
                lower, both, probs, bounds, touched, vals, mark):
    """The mean over ``epochs`` of each one's bounds of token n (records at token s) in its
    layout row up to ``end``: for the classes a checkpoint stored and the target, the exact
    p (upper = lower); for every other column upper = u (see ``_record_probs``), lower = 0.
    Each column's values are summed in epoch order, then divided by their number where
    it is above 1 (numpy's ``out += tmp``, ``out /= W``): a column no epoch stored holds
    the same sum of the u's, so only the stored columns are summed one by one.

    cols[pos[i], n, j]: the column of the j-th id stored at epochs[i]; scratch: probs (k,),
    bounds (2, W), touched (W * k,), vals (W * k, W), mark (M,) all -1 (left so)."""
    n_epochs, k = epochs.shape[0], logits.shape[2]
    n_touched = 0
    for i in range(n_epochs):
        p_y, u = _record_probs(logits, ids, target, lse, epochs[i], s, y, probs)
        bounds[0, i], bounds[1, i] = u, p_y
        for j in range(k):
            col = np.int64(cols[pos[i], n, j])
            if col == y_col or col < 0:  # the target's column holds p_y
                continue
            t = mark[col]
            if t < 0:
                t = n_touched
                mark[col] = t
                touched[t] = col
                for m in range(n_epochs):
                    vals[t, m] = -1.0  # not stored at epoch m
                n_touched += 1
            vals[t, i] = probs[j]
    u_sum, y_sum = bounds[0, 0], bounds[1, 0]
    for i in range(1, n_epochs):
        u_sum += bounds[0, i]
        y_sum += bounds[1, i]
    if n_epochs > 1:
        u_sum /= n_epochs
        y_sum /= n_epochs
    for c in range(end):
        upper[c] = u_sum
        if both:
            lower[c] = 0.0
    upper[y_col] = y_sum
    if both:
        lower[y_col] = y_sum
    for t in range(n_touched):
        col = touched[t]
        mark[col] = -1
        v = vals[t, 0]
        up = v if v >= 0.0 else bounds[0, 0]
        low = max(v, 0.0)
        for i in range(1, n_epochs):
            v = vals[t, i]
            up += v if v >= 0.0 else bounds[0, i]
            low += max(v, 0.0)
        if n_epochs > 1:
            up /= n_epochs
            low /= n_epochs
        upper[col] = up
        if both:
            lower[col] = low


@njit(inline="always")
def _window_scratch(n_epochs, k, width):
    """(probs, bounds, touched, vals, mark) of `_window_row`, for one block of rows."""
    return (np.empty(k), np.empty((2, n_epochs)), np.empty(n_epochs * k, dtype=np.int64),
            np.empty((n_epochs * k, n_epochs)), np.full(width, -1, dtype=np.int64))


@kernel
def window_bounds(logits, ids, target, lse, cols, epochs, pos, src, targets, vocab, cls,
                  label_col, upper, lower, n_blocks, counter):
    """The mean over ``epochs`` of each checkpoint's bounds in the layout (see
    `_window_row`; padding 0) of tokens src: upper, lower float64 (n, M) (lower (0, 0):
    upper only). logits, ids (E, N, k), target, lse (E, N): the records' fields; cols
    (layout epochs, n, k) the stored ids' columns, at positions ``pos`` for ``epochs``."""
    k, width = logits.shape[2], cls.shape[1]
    both = lower.shape[0] > 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        probs, bounds, touched, vals, mark = _window_scratch(epochs.shape[0], k, width)
        spare = np.empty(width)
        for n in range(lo, hi):
            end = _row_end(cls[n], vocab)
            low = lower[n] if both else spare
            _window_row(logits, ids, target, lse, cols, epochs, pos, src[n], n, targets[n],
                        label_col[n], end, upper[n], low, both, probs, bounds, touched, vals,
                        mark)
            for c in range(end, width):
                upper[n, c] = 0.0
                if both:
                    lower[n, c] = 0.0
        blk = claim(counter)


def _window_counts(diff, *args):
    """The grid counts of the threads' summed difference array (G+1,): int64 (G,)."""
    return np.cumsum(diff[:-1])


@kernel(finish=_window_counts)
def window_grid_counts(logits, ids, target, lse, cols, epochs, pos, src, targets, vocab, cls,
                       label_col, mean, prob, b_lead, b_magnitude, b_top, grid, rel_band,
                       n_blocks, counter):
    """``eps_search.grid_correct_counts`` of a = the window mean of the upper bounds of
    ``epochs`` (`window_bounds`, written to ``mean``) mixed into prob, each row read up to
    its padding (which holds 0 in both: it never changes which column is the first argmax,
    so the counts are the padded rows'). Returns int64 (G,)."""
    k, width = logits.shape[2], cls.shape[1]
    diff = np.zeros(grid.shape[0] + 1, dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        probs, bounds, touched, vals, mark = _window_scratch(epochs.shape[0], k, width)
        for n in range(lo, hi):
            end = _row_end(cls[n], vocab)
            a = mean[n]
            _window_row(logits, ids, target, lse, cols, epochs, pos, src[n], n, targets[n],
                        label_col[n], end, a, a, False, probs, bounds, touched, vals, mark)
            for c in range(end, width):
                a[c] = 0.0
            m = end if end >= 2 else width
            _grid_row(a[:m], prob[n, :m], label_col[n], b_lead[n], b_magnitude[n], b_top[n],
                      grid, rel_band, diff)
        blk = claim(counter)
    return diff


@kernel
def selection_counts(logits, ids, target, lse, cols, epochs, src, targets, vocab, cls,
                     label_col, total, n_blocks, counter):
    """For each epochs[i], the tokens whose argmax of total[n] + that checkpoint's upper
    bounds (`window_bounds` of one epoch) is their target's column (the first argmax,
    numpy's rule: ``argmax.sum_correct_count_rows``), each row read up to its padding
    (which holds 0 in both: never the first argmax). cols: the layout's, whose epochs are
    ``epochs``. Returns int64 (W,)."""
    n_epochs, k, width = epochs.shape[0], logits.shape[2], cls.shape[1]
    counts = np.zeros(n_epochs, dtype=np.int64)
    one = np.zeros(1, dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        probs, bounds, touched, vals, mark = _window_scratch(1, k, width)
        row = np.empty(width)
        for n in range(lo, hi):
            end = _row_end(cls[n], vocab)
            m = end if end >= 1 else width
            for i in range(n_epochs):
                one[0] = i
                _window_row(logits, ids, target, lse, cols, epochs[i:i + 1], one, src[n], n,
                            targets[n], label_col[n], end, row, row, False, probs, bounds,
                            touched, vals, mark)
                for c in range(end, width):
                    row[c] = 0.0
                if first_argmax_mix(total[n, :m], row[:m], 1.0, 1.0) == label_col[n]:
                    counts[i] += 1
        blk = claim(counter)
    return counts


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
