"""Kernels of greedy ensemble selection: the live rows of a round and their candidate
classes, per-epoch correct counts of total + softmax (logits not held as probabilities) or
of total + probabilities (held in memory), the largest probability of each class over the
epochs, and the running total."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import views
from .floats import to_f64
from .jit import kernel
from .schedule import claim, span, store
from .softmax import exp_row, exp_shifted, is_table_row
from .views import borrow


@njit(inline="always")
def _row_max(t):
    top = t[0]
    for c in range(t.shape[0]):
        top = t[c] if t[c] > top else top
    return top


@njit(inline="always")
def _first_argmax(t):
    best = 0
    for c in range(1, t.shape[0]):
        if t[c] > t[best]:
            best = c
    return best


@njit(inline="always")
def _is_candidate(t, b, c, top, slack):
    """Whether class c of row t can reach the row's max ``top`` when a vector whose class c
    is at most b[c] (or b[0] for one bound per row) is added."""
    return t[c] + b[c if b.shape[0] > 1 else 0] >= top - slack


@njit(inline="always")
def _classify_row(t, b, y, slack, top):
    """(number of candidates if the row is live else 0, whether it is right for every
    vector added) of a row t of the total with max ``top``, bounds b and label y; see
    `live_rows`."""
    count = 0
    for c in range(t.shape[0]):
        count += _is_candidate(t, b, c, top, slack)
    if _is_candidate(t, b, y, top, slack) and count > 1:
        return count, 0
    return 0, int(count == 1 and _first_argmax(t) == y)


@kernel
def live_candidates(total, bound, slack, rows, ptr, cand, n_blocks, counter):
    """cand[ptr[j]:ptr[j+1]] = the candidate classes (ascending) of row rows[j] of total
    (see `live_rows`), ptr (R+1,) from the rows' candidate counts."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, rows.shape[0], n_blocks)
        for j in range(lo, hi):
            r = rows[j]
            t, b = total[r], bound[r]
            top = _row_max(t)
            k = ptr[j]
            for c in range(t.shape[0]):
                if _is_candidate(t, b, c, top, slack):
                    cand[k] = c
                    k += 1
        blk = claim(counter)


@kernel
def live_rows(total, labels, bound, slack, order, n_cand, n_blocks, counter):
    """Which rows of a selection round need scoring: n_cand[i] for row r = order[i].

    Row r of ``total`` (N, C) has first argmax a; adding a probability vector p with
    p[c] <= bound[r, c] (bound (N, C), or (N, 1): one bound for every class) can make class
    c the argmax only if total[r, c] + bound[r, c] >= total[r, a] (``slack`` below that as
    rounding headroom): the candidates. A row is live when its label is a candidate and it
    has at least two: n_cand[i] is then their number, else 0; a row whose one candidate (a)
    is its label is right for every vector added, any other row wrong for every one.
    Returns the number of rows right for every vector. `live_candidates` lists the live
    rows' candidates.
    """
    n_right = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, order.shape[0], n_blocks)
        for i in range(lo, hi):
            r = order[i]
            t = total[r]
            n_cand[i], always = _classify_row(t, bound[r], labels[r], slack, _row_max(t))
            n_right += always
        blk = claim(counter)
    return n_right


@njit(inline="always")
def _rounds_settled(t, b, y, slack, top):
    """How many more vectors (each class c at most its bound b[c]) a row t that is not live
    can take before it may become live. If y leads alone, class c needs its gap
    t[a] - slack - t[c] - b[c] to close, by at most b[c] a vector; if y is no candidate, its
    gap to candidacy closes by at most b[y] a vector. Gaps less SETTLED_MARGIN (rounding);
    top: the max of t."""
    per_class = b.shape[0] > 1
    if _is_candidate(t, b, y, top, slack):  # y leads alone
        a = _first_argmax(t)
        rounds = 1e9
        for c in range(t.shape[0]):
            bc = b[c if per_class else 0]
            gap = top - slack - t[c] - bc - SETTLED_MARGIN
            if c != a:
                rounds = min(rounds, gap / bc if gap > 0.0 and bc > 0.0 else
                             (1e9 if gap > 0.0 else 0.0))
    else:  # y is no candidate
        by = b[y if per_class else 0]
        gap = top - slack - t[y] - by - SETTLED_MARGIN
        rounds = gap / by if gap > 0.0 and by > 0.0 else (1e9 if gap > 0.0 else 0.0)
    return int(rounds)


#: Rounding headroom of `_rounds_settled` (totals are sums of at most k probabilities).
SETTLED_MARGIN = 1e-9


@njit(inline="always")
def _add_table_probs(t, x, table, scale):
    """t += the softmax of a float16 row x whose exp comes from the table and whose 1/sum is
    ``scale`` (``exp_row``'s arithmetic); returns the new max of t (non-negative floats:
    the max of their bits, which vectorises)."""
    top = np.int64(0)
    for c in range(t.shape[0]):
        v = t[c] + 1.0 * (table[np.uint16(x[c])] * scale)
        t[c] = v
        top = max(top, np.float64(v).view(np.int64))
    return np.int64(top).view(np.float64)


@kernel
def add_softmax_live_rows(values, picks, src, total, labels, bound, slack, order, due, added,
                          right, shift, inv, table, n_cand, n_blocks, counter):
    """The next round of ensemble selection on stored outputs: total[r] += the softmax of
    values[e, src[r]] for each pick e not yet added to it (in order: the bits of ``total +=
    softmax_rows(...)`` pick by pick), then `live_rows` of the new totals (n_cand), in one
    pass.

    Rows are settled lazily: a row that is not live and cannot become live within s more
    picks (`_rounds_settled`) is not read again until round len(picks) + s + 1 (due[r]);
    meanwhile it counts as right (right[r]) or wrong for every vector, and its total waits
    (added[r]: picks already in it).
    values: stored outputs (E, M, C) (float16 as int16 bits); shift, inv (E, N): each
    softmax's m and inv from ``exp_row`` where known (inv > 0), so that a float16 row read
    from the table is added in one pass. Returns (the number of rows right for every vector,
    the number of rows holding inf or nan (their totals are then undefined)).
    """
    n_picks = picks.shape[0]
    tmp = np.empty(total.shape[1])
    n_right = 0
    n_bad = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, order.shape[0], n_blocks)
        for i in range(lo, hi):
            r = order[i]
            if due[r] > n_picks:  # settled: right or wrong for every vector
                n_cand[i] = 0
                n_right += right[r]
                continue
            t = total[r]
            top = -1.0  # set by the last pick added (totals are never negative)
            for p in range(added[r], n_picks):
                e, row = picks[p], src[r]
                if inv[e, r] > 0.0 and is_table_row(values[e, row], shift[e, r]):
                    top = _add_table_probs(t, values[e, row], table, inv[e, r])
                    continue
                status, _, scale = exp_row(views.row2(values, e, row), borrow(tmp),
                                           borrow(table))
                if status < 0:
                    n_bad += 1
                    break
                for c in range(t.shape[0]):
                    t[c] += 1.0 * (tmp[c] * scale)
                top = _row_max(t)
            if top < 0.0:
                top = _row_max(t)
            added[r] = n_picks
            n_cand[i], always = _classify_row(t, bound[r], labels[r], slack, top)
            right[r] = always
            n_right += always
            if n_cand[i] == 0:
                due[r] = n_picks + 1 + _rounds_settled(t, bound[r], labels[r], slack, top)
        blk = claim(counter)
    return n_right, n_bad


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


@kernel
def selection_correct_counts(values, src, total, rows, labels, table, shift, inv, top,
                             class_max, cand_ptr, cand, n_blocks, counter):
    """Per epoch e: the rows r = rows[i] whose argmax of total[r] + softmax(values[e, src[i]])
    is labels[r].

    values: stored outputs (E, M, C) (float16 as int16 bits); src (R,): the row of values
    holding each row; table: the ``f16_exp_table()``; shift, inv, top (E, N): per epoch and
    row of total, the m and inv of ``exp_row`` and the largest probability of that softmax
    (nan: not known yet; such rows are scored whole and the three kept). A row scored whole
    also raises class_max[r] (N, C; shape (0, 0): not kept, else ``top`` is not kept) to
    its probabilities.
    Rows of known inv with a candidate list (``live_rows``) of at most C/2 classes are
    scored on those only, each probability computed exactly as ``softmax_rows`` does; a
    row with an empty list is scored whole. A row of total is read once for all epochs.
    Returns counts (E,) and the number of rows holding inf or nan per epoch (E,).
    """
    n_epochs = values.shape[0]
    n_rows = rows.shape[0]
    n_classes = total.shape[1]
    keep_max = class_max.shape[0] > 0
    bad = np.zeros(n_epochs, dtype=np.int64)
    counts = np.zeros(n_epochs, dtype=np.int64)  # this thread's
    tmp = np.empty(n_classes)
    picked = np.empty(n_classes)
    blk = claim(counter)
    while blk < n_blocks:
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            t = total[r]
            first = cand_ptr[i]
            n = cand_ptr[i + 1] - first
            for e in range(n_epochs):
                x = values[e, src[i]]
                best = -1
                known = inv[e, r] > 0.0
                if not known or n == 0 or 2 * n > n_classes:  # the whole row
                    status, m, scale = exp_row(borrow(x), borrow(tmp), borrow(table))
                    if status < 0:
                        bad[e] += 1
                        continue
                    if status == 1 and not known:
                        shift[e, r] = m
                        inv[e, r] = scale
                        if not keep_max:
                            top[e, r] = _row_max(tmp) * scale
                    if keep_max:
                        b = class_max[r]
                        for c in range(n_classes):
                            b[c] = max(b[c], tmp[c] * scale)
                    best = _first_argmax_nonnegative(t, tmp, scale)
                else:  # the candidates' exp (table or vectorised exp), then their argmax
                    if is_table_row(x, shift[e, r]):
                        for j in range(n):
                            tmp[j] = table[np.uint16(x[cand[first + j]])]
                    else:
                        for j in range(n):
                            picked[j] = to_f64(x[cand[first + j]])
                        exp_shifted(borrow(picked)[:n], shift[e, r], borrow(tmp)[:n])
                    for j in range(n):
                        picked[j] = t[cand[first + j]]
                    best = cand[first + _first_argmax_nonnegative(picked[:n], tmp[:n],
                                                                  inv[e, r])]
                if best == labels[r]:
                    counts[e] += 1
        blk = claim(counter)
    return counts, bad


@njit(inline="always")
def _holds(cls, a, n, old_cls, oa, on):
    """Whether old_cls[oa:oa+on] holds every class of cls[a:a+n] (both ascending)."""
    k = 0
    for j in range(n):
        while k < on and old_cls[oa + k] < cls[a + j]:
            k += 1
        if k == on or old_cls[oa + k] != cls[a + j]:
            return False
    return True


@kernel
def entry_needs(rows, ptr, cand, offset, size, cls, need, n_blocks, counter):
    """For the live rows of a round (rows, their candidates cand[ptr[i]:ptr[i+1]]): need[i]
    = 0 if row r = rows[i] has an entry (cls[offset[r]:offset[r] + size[r]], offset -1:
    none) holding every candidate, else the number of its candidates (its new entry).
    n_blocks: the blocks of rows the threads claim (``schedule``)."""
    n_rows = rows.shape[0]
    blk = claim(counter)
    while blk < n_blocks:
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            a = ptr[i]
            n = ptr[i + 1] - a
            o = offset[r]
            need[i] = 0 if o >= 0 and _holds(cand, a, n, cls, o, size[r]) else n
        blk = claim(counter)


@kernel
def move_entries(rows, need, offset, size, cls, values, new_offset, new_cls, new_values,
                 at, n_epochs, n_blocks, counter):
    """Copy the kept entries (need[i] == 0, offset[r] >= 0) of rows r = rows[i] from (cls,
    values) to (new_cls, new_values) at new positions at[i], recorded in new_offset[r];
    n_blocks: the blocks of rows the threads claim (``schedule``)."""
    n_rows = rows.shape[0]
    blk = claim(counter)
    while blk < n_blocks:
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            if need[i] != 0 or offset[r] < 0:
                continue
            o, n, a = offset[r], size[r], at[i]
            store(new_cls[a: a + n], cls[o: o + n])
            store(new_values[n_epochs * a: n_epochs * (a + n)],
                  values[n_epochs * o: n_epochs * (o + n)])
            new_offset[r] = a
        blk = claim(counter)


@kernel
def fill_entries(values, src, rows, ptr, cand, need, at, old_offset, old_size, old_cls,
                 old_values, offset, size, cls, out, n_blocks, counter):
    """Write the new entries (need[i] > 0, from `entry_needs`) of rows r = rows[i] at
    positions at[i]: cls[at[i]:at[i] + need[i]] their candidates cand[ptr[i]:] and
    out[E*a + e*n + j] the stored value of class cls[a + j] at epoch e; offset[r] and
    size[r] record them. A value the row's previous entry (old_offset[r] >= 0 into old_cls,
    old_values; the same buffers as cls, out or not) holds is copied from it, the others are
    read from ``values`` (E, M, C) (row src[i]; float16 as int16 bits): candidates change a
    few classes at a time, so most of a row is not read again. n_blocks: the blocks of rows
    the threads claim (``schedule``)."""
    n_epochs = values.shape[0]
    n_rows = rows.shape[0]
    # each class's place in the old entry, or -1 (a row has at most C candidates)
    where = np.empty(values.shape[2], dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            n = need[i]
            if n == 0:
                continue
            r = rows[i]
            a = at[i]
            o, on = old_offset[r], old_size[r]
            on = on if o >= 0 else 0
            k = 0
            for j in range(n):
                c = cand[ptr[i] + j]
                cls[a + j] = c
                while k < on and old_cls[o + k] < c:
                    k += 1
                where[j] = k if k < on and old_cls[o + k] == c else -1
            for e in range(n_epochs):
                x = values[e, src[i]]
                for j in range(n):
                    out[n_epochs * a + e * n + j] = (
                        x[cls[a + j]] if where[j] < 0
                        else old_values[n_epochs * o + e * on + where[j]])
            offset[r] = a
            size[r] = n
        blk = claim(counter)


@kernel
def selection_gathered_counts(gathered, cls, offset, size, total, rows, labels, table, shift,
                              inv, ptr, cand, n_epochs, n_blocks, counter):
    """``selection_correct_counts`` of rows whose shift and inv are known at every epoch,
    from entries holding their candidates' stored values (`fill_entries`: row r's classes
    cls[offset[r]:offset[r] + size[r]], values gathered[E*offset[r]:]): per epoch e, the
    rows r = rows[i] whose argmax of total[r] + softmax is labels[r], over the candidates
    cand[ptr[i]:ptr[i+1]], each probability computed exactly as ``softmax_rows`` does.
    Returns counts (E,)."""
    n_rows = rows.shape[0]
    counts = np.zeros(n_epochs, dtype=np.int64)  # this thread's
    tmp = np.empty(total.shape[1])
    picked = np.empty(total.shape[1])
    x = np.empty(total.shape[1], dtype=gathered.dtype)
    pos = np.empty(total.shape[1], dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            a = ptr[i]
            n = ptr[i + 1] - a
            o, size_r = offset[r], size[r]
            t = total[r]
            k = 0  # pos[j]: candidate j's place in the entry (both ascending)
            for j in range(n):
                while cls[o + k] < cand[a + j]:
                    k += 1
                pos[j] = k
                picked[j] = t[cand[a + j]]
            for e in range(n_epochs):
                base = n_epochs * o + e * size_r
                for j in range(n):
                    x[j] = gathered[base + pos[j]]
                if is_table_row(x, shift[e, r]):
                    for j in range(n):
                        tmp[j] = table[np.uint16(x[j])]
                else:
                    exp_shifted(borrow(x)[:n], shift[e, r], borrow(tmp)[:n])
                best = cand[a + _first_argmax_nonnegative(picked[:n], tmp[:n], inv[e, r])]
                if best == labels[r]:
                    counts[e] += 1
        blk = claim(counter)
    return counts


@kernel
def class_max(probs, out, n_blocks, counter):
    """out[r, c] = the largest probs[e, r, c] over every epoch of probs (E, N, C)."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, probs.shape[1], n_blocks)
        for r in range(lo, hi):
            o = out[r]
            store(o, probs[0, r])
            for e in range(1, probs.shape[0]):
                p = probs[e, r]
                for c in range(probs.shape[2]):
                    o[c] = max(o[c], p[c])
        blk = claim(counter)


@kernel
def add_into(total, p, n_blocks, counter):
    """total += p (float64 (N, C)), numpy's arithmetic, rows in parallel."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, total.shape[0], n_blocks)
        for r in range(lo, hi):
            for c in range(total.shape[1]):
                total[r, c] += p[r, c]
        blk = claim(counter)


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


@kernel
def selection_cached_counts(probs, total, rows, labels, cand_ptr, cand, n_blocks, counter):
    """Per epoch e: the rows r = rows[i] whose first argmax of total[r] + probs[e, r] is
    labels[r], for float64 probabilities (E, N, C) held in memory.

    Only the candidate classes of each row (``live_rows``: no other class can win) are
    compared, in ascending order, unless they are more than C/2 or the list is empty (then
    the whole row). A row of total is read once for all epochs. Returns counts (E,).
    """
    n_epochs = probs.shape[0]
    n_rows = rows.shape[0]
    n_classes = total.shape[1]
    counts = np.zeros(n_epochs, dtype=np.int64)  # this thread's
    blk = claim(counter)
    while blk < n_blocks:
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            r = rows[i]
            t = total[r]
            y = labels[r]
            first = cand_ptr[i]
            n = cand_ptr[i + 1] - first
            whole = n == 0 or 2 * n > n_classes
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
                    counts[e] += 1
        blk = claim(counter)
    return counts
