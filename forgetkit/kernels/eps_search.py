"""The exact epsilon search of Knowledge Fusion: for each sample, the interval of eps on
which eps*a + (1-eps)*b ranks the label first; counts over an eps grid; the fusion update.

See docs/definitions.md ("The exact epsilon search") for why the band re-check is needed.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .argmax import first_argmax_mix
from .floats import LOW63, float_of_key64, key64
from .jit import kernel
from .schedule import claim, span, store
from .softmax import combine_scratch, window_mean_row
from .views import borrow, row


# Grid searches start at x * (G - 1), the index on KnowledgeFusion's uniform grids, and walk
# to the exact one (correct for any ascending grid); a binary search mispredicts its branches.
@njit(inline="always")
def _grid_guess(grid, x):
    g = x * (grid.shape[0] - 1)
    return 0 if not g >= 0.0 else (grid.shape[0] if g >= grid.shape[0] else int(g))


@njit(inline="always")
def _first_above(grid, x):
    """Index of the first grid point > x (grid ascending)."""
    i = _grid_guess(grid, x)
    while i > 0 and grid[i - 1] > x:
        i -= 1
    while i < grid.shape[0] and grid[i] <= x:
        i += 1
    return i


@njit(inline="always")
def _first_at_least(grid, x):
    """Index of the first grid point >= x (grid ascending)."""
    i = _grid_guess(grid, x)
    while i > 0 and grid[i - 1] >= x:
        i -= 1
    while i < grid.shape[0] and grid[i] < x:
        i += 1
    return i


@njit(cache=True)
def _lead(row, y):
    """(row[y] - max of row[c != y], that max, max |row|) for a row (C,) of finite float64
    values, C >= 2. Class y is masked with integer ops (a select on c != y would not
    vectorise)."""
    neg_inf = key64(-np.inf)
    key = neg_inf
    magnitude = np.int64(0)
    for c in range(row.shape[0]):
        keep = -np.int64(c != y)  # all ones, or zero at c == y
        key = max(key, (key64(row[c]) & keep) | (neg_inf & ~keep))
        magnitude = max(magnitude, np.float64(row[c]).view(np.int64) & LOW63)
    other = float_of_key64(key)
    return row[y] - other, other, np.int64(magnitude).view(np.float64)


@kernel
def label_leads(p, labels, lead, magnitude, top, correct, n_blocks, counter):
    """Per row n of p (N, C) finite float64: lead[n] = p[n, y] - max of p[n, c != y],
    magnitude[n] = max |p[n]|, top[n] = the first class c != y holding that max when the
    lead is <= 0 (else -1) and correct[n] = whether y is the first argmax (numpy's rule).
    These describe the current fusion for ``grid_correct_counts``."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, p.shape[0], n_blocks)
        for n in range(lo, hi):
            label_lead_into(row(p, n), labels[n], n, lead, magnitude, top, correct)
        blk = claim(counter)


@njit(inline="always")
def label_lead_into(values, y, n, lead, magnitude, top, correct):
    """Row n's entries of ``label_leads`` for its fused row (C,) and label y: the label's
    lead over the largest other value, its magnitude, the first other class holding the
    largest value where the label does not lead (else -1), and whether the argmax (ties to
    the lowest index) is y."""
    # made in locals, stored last: a store into an array the row may alias would make
    # the compiler read the row again
    lead_n, other, magnitude_n = _lead(values, y)
    top_n = -1
    correct_n = lead_n > 0.0
    if lead_n <= 0.0:  # y ties or trails: the first other class holding the max
        for c in range(values.shape[0]):
            if c != y and values[c] == other:
                top_n = c
                break
        correct_n = lead_n == 0.0 and top_n > y
    lead[n], magnitude[n], top[n], correct[n] = lead_n, magnitude_n, top_n, correct_n


@njit(cache=True)
def _win_bounds(a, b, y, band):
    """Where eps*a + (1-eps)*b ranks class y first, for rows a, b (C,) of finite values.

    Returns lw, hw (the open interval where every margin > band: the win is certain), lp, hp
    (the closed interval where every margin >= -band: the win is possible) and whether no eps
    can win. Branch-free so that it vectorises.
    """
    ay = a[y]
    by = b[y]
    neg_inf = key64(-np.inf)
    pos_inf = key64(np.inf)
    lw, lp, hw, hp = neg_inf, neg_inf, pos_inf, pos_inf
    never = 0
    empty = 0
    for c in range(a.shape[0]):
        icpt = by - b[c]
        slope = (ay - a[c]) - icpt
        safe = slope if slope != 0.0 else 1.0
        k_win = key64((band - icpt) / safe)
        k_possible = key64((-band - icpt) / safe)
        up = slope > 0.0
        down = slope < 0.0
        lw = max(lw, k_win if up else neg_inf)
        lp = max(lp, k_possible if up else neg_inf)
        hw = min(hw, k_win if down else pos_inf)
        hp = min(hp, k_possible if down else pos_inf)
        flat = (slope == 0.0) & (c != y)  # at c == y both are 0 by construction
        never = max(never, np.int64(flat & (icpt <= band)))
        empty = max(empty, np.int64(flat & (icpt < -band)))
    high_win = -np.inf if never else float_of_key64(hw)
    return (float_of_key64(lw), high_win, float_of_key64(lp), float_of_key64(hp),
            empty > 0)


def grid_counts(diff, *args):
    """The grid counts of a difference array (G+1,) summed over the threads: int64 (G,)
    (the ``finish`` of the grid kernels)."""
    return np.cumsum(diff[:-1])


def _window_counts(total, *args):
    """(`grid_counts` of the summed difference array, the other sums as they are)."""
    return grid_counts(total[0]), *total[1:]


@kernel(finish=grid_counts)
def grid_correct_counts(a, b, labels, b_lead, b_magnitude, b_top, grid, rel_band, n_blocks,
                        counter):
    """Number of samples that eps*a + (1-eps)*b classifies correctly, for every eps in ``grid``.

    a, b: float64 (N, C); labels: int64 (N,); b_lead, b_magnitude, b_top: ``label_leads``
    of b; grid: float64 (G,) ascending; n_blocks: number of sample blocks. Returns int64
    (G,): each thread adds its samples to a difference array of its own, summed over the
    threads and accumulated by the kernel's ``finish``.

    For one sample the true class wins on an interval of eps (its margins are linear in
    eps). With band = rel_band * max|value| of the sample: a label that leads both rows by
    more than band wins at every eps, and one that trails b's top class by more than band
    in both rows wins at none. For the other samples the kernel computes the eps where the
    win is certain (every margin > band) and where it is possible (every margin >= -band).
    Grid points in the certain part count through a difference array; grid points between
    the two are re-checked with the brute-force arithmetic, so the counts equal the
    brute-force grid's exactly, ties included.
    """
    diff = np.zeros(grid.shape[0] + 1, dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, a.shape[0], n_blocks)
        for n in range(lo, hi):
            grid_row(row(a, n), row(b, n), labels[n], b_lead[n], b_magnitude[n], b_top[n],
                     borrow(grid), rel_band, borrow(diff))
        blk = claim(counter)
    return diff


@njit(cache=True)  # compiled once for both grid kernels (see softmax.exp_row)
def grid_row(a, b, y, lead_b, magnitude_b, top_b, grid, rel_band, diff):
    """One sample of ``grid_correct_counts``: adds to the difference array diff (G+1,) the
    grid points where eps*a + (1-eps)*b (rows (C,)) ranks y first. Returns (p0, w0, w1,
    p1): y wins at every grid point of [w0, w1), may win (the brute-force arithmetic
    decided) at those of [p0, w0) and [w1, p1), and wins at no other."""
    n_grid = grid.shape[0]
    lead_a, _, magnitude = _lead(a, y)
    band = rel_band * max(magnitude, magnitude_b)
    if lead_a > band and lead_b > band:  # y wins at both ends, so at every eps
        diff[0] += 1
        diff[n_grid] -= 1
        return 0, 0, n_grid, n_grid
    if lead_b < -band and lead_a < -band and a[top_b] - a[y] > band:
        return 0, 0, 0, 0  # b's top class beats y at both ends, so at every eps
    lw, hw, lp, hp, empty = _win_bounds(a, b, y, band)
    if empty:
        return 0, 0, 0, 0
    p0 = _first_at_least(grid, lp)
    p1 = _first_above(grid, hp)  # possible grid points: [p0, p1)
    if p0 >= p1:
        return 0, 0, 0, 0
    w0, w1 = p1, p1  # certain grid points: [w0, w1)
    if lw < hw:
        w0 = max(_first_above(grid, lw), p0)
        w1 = min(_first_at_least(grid, hw), p1)
        if w0 < w1:
            diff[w0] += 1
            diff[w1] -= 1
        else:
            w0, w1 = p1, p1
    # the others possible, [p0, w0) and [w1, p1), with the brute-force arithmetic
    for g in range(p0, w0):
        if first_argmax_mix(a, b, grid[g], 1.0 - grid[g]) == y:
            diff[g] += 1
            diff[g + 1] -= 1
    for g in range(w1, p1):
        if first_argmax_mix(a, b, grid[g], 1.0 - grid[g]) == y:
            diff[g] += 1
            diff[g + 1] -= 1
    return p0, w0, w1, p1


@kernel(finish=_window_counts)
def window_grid_counts(values, epochs, src, order, table, b, labels, b_lead, b_magnitude,
                       b_top, correct, mean, mix_in, eps, grid, rel_band, spans, n_blocks,
                       counter):
    """``grid_correct_counts`` of a = the mean softmax of the stored outputs values[epochs]
    (E, M, C) at rows src (N,) (each row as ``combine_softmax`` computes it), made row by
    row into ``mean`` (N, C) float64 and used at once. Rows are read in ``order``.

    First, where ``mix_in``, each row mixes the mean that ``mean`` held (the previous
    window's) into b by ``eps`` (`mix_into`'s update of b, its label leads and ``correct``):
    a mix the fit chose after the previous counts, made in this pass rather than in one of
    its own. spans (4, N) int32 receives each row's `grid_row` spans (p0, w0, w1, p1), from
    which the caller knows each row's correctness at the eps it will choose. Returns
    (counts int64 (G,), the number of (epoch, row) pairs holding inf or nan, the number of
    rows whose ``correct`` the mix changed)."""
    scratch = combine_scratch(b.shape[1])
    diff = np.zeros(grid.shape[0] + 1, dtype=np.int64)
    n_bad = 0
    n_changed = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, b.shape[0], n_blocks)
        for j in range(lo, hi):
            n = order[j]
            a, b_n = row(mean, n), row(b, n)
            if mix_in:
                was = correct[n]
                mix_row(a, b_n, eps)
                label_lead_into(b_n, labels[n], n, b_lead, b_magnitude, b_top, correct)
                n_changed += correct[n] != was
            row_bad = window_mean_row(values, epochs, src[n], table, scratch, a)
            if row_bad:
                n_bad += row_bad
                continue
            p0, w0, w1, p1 = grid_row(a, b_n, labels[n], b_lead[n], b_magnitude[n], b_top[n],
                                      borrow(grid), rel_band, borrow(diff))
            spans[0, n], spans[1, n], spans[2, n], spans[3, n] = p0, w0, w1, p1
        blk = claim(counter)
    return diff, n_bad, n_changed


_window_grid_counts = window_grid_counts.build  # the serial build, for its region


@window_grid_counts.on_threads
def window_grid_counts_region(values, epochs, src, order, table, b, labels, b_lead,
                              b_magnitude, b_top, correct, mean, mix_in, eps, grid, rel_band,
                              spans, n_blocks, counter, n_threads):
    """``window_grid_counts`` on ``n_threads`` of numba's threads, one parallel region:
    each runs the serial build, claiming blocks from ``counter``. Returns the threads'
    summed (counts, n_bad, n_changed)."""
    sums = _thread_sums(n_threads, grid.shape[0] + 3)  # row t: thread t's diff, bad, changed
    for t in prange(n_threads):
        diff, bad, changed = _window_grid_counts(
            values, epochs, src, order, table, b, labels, b_lead, b_magnitude, b_top,
            correct, mean, mix_in, eps, grid, rel_band, spans, n_blocks, counter)
        store(sums[t, :-2], diff)
        sums[t, -2], sums[t, -1] = bad, changed
    total = _add_rows(sums)
    return total[:-2], total[-2], total[-1]


# Serial helpers of a region: in its own body numba would make an allocation or a sum a
# parallel loop of its own.
@njit(cache=True)
def _thread_sums(n_threads, length):
    """Zeros int64 (n_threads, length): each thread's sums in a row of its own."""
    return np.zeros((n_threads, length), dtype=np.int64)


@njit(cache=True)
def _add_rows(rows):
    """rows (T, L) int64 summed over T."""
    total = np.zeros(rows.shape[1], dtype=np.int64)
    for t in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            total[j] += rows[t, j]
    return total


@kernel
def win_intervals(a, b, labels, lo, hi, lo_open, hi_open, valid, n_blocks, counter):
    """Per sample, the interval of eps in [0, 1] where eps*a + (1-eps)*b ranks the label first:
    lo, hi (float64 (N,)), lo_open, hi_open, valid (bool (N,)), written in place; a class
    below the label must be beaten strictly, one above it only matched (argmax ties go to
    the lowest index).
    """
    n_classes = a.shape[1]
    blk = claim(counter)
    while blk < n_blocks:
        first, end = span(blk, a.shape[0], n_blocks)
        for n in range(first, end):
            _win_interval(a, b, labels, n_classes, n, lo, hi, lo_open, hi_open, valid)
        blk = claim(counter)


@njit(inline="always")
def _win_interval(a, b, labels, n_classes, n, lo, hi, lo_open, hi_open, valid):
    """One sample of `win_intervals`."""
    y = labels[n]
    ay = a[n, y]
    by = b[n, y]
    low, high = 0.0, 1.0
    lopen, hopen = False, False
    ok = True
    for c in range(n_classes):
        if c == y:
            continue
        strict = c < y
        icpt = by - b[n, c]
        slope = (ay - a[n, c]) - icpt
        if slope == 0.0:
            if icpt < 0.0 or (strict and icpt == 0.0):
                ok = False
                break
            continue
        t = -icpt / slope
        if slope > 0.0:
            if t > low or (t == low and strict):
                low = t
                lopen = strict
        else:
            if t < high or (t == high and strict):
                high = t
                hopen = strict
    if ok and (low > high or (low == high and (lopen or hopen))):
        ok = False
    lo[n] = low
    hi[n] = high
    lo_open[n] = lopen
    hi_open[n] = hopen
    valid[n] = ok


@njit(inline="always")
def mix_row(a, b, eps):
    """b <- eps*a + (1-eps)*b for rows (C,), numpy's arithmetic: the fit (``mix_into``) and
    the apply (``mix``) must give the same bits."""
    one_minus = 1.0 - eps
    for c in range(a.shape[0]):
        b[c] = eps * a[c] + one_minus * b[c]


@kernel
def mix(a, b, eps, n_blocks, counter):
    """b <- eps*a + (1-eps)*b in place (numpy's arithmetic). a, b: float64 (N, C)."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, a.shape[0], n_blocks)
        for n in range(lo, hi):
            mix_row(row(a, n), row(b, n), eps)
        blk = claim(counter)


@kernel
def mix_into(a, b, eps, labels, lead, magnitude, top, correct, n_blocks, counter):
    """b <- eps*a + (1-eps)*b in place (numpy's arithmetic), then ``label_leads`` of b into
    lead, magnitude, top and correct. a, b: float64 (N, C); labels: int64 (N,)."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, a.shape[0], n_blocks)
        for n in range(lo, hi):
            b_n = row(b, n)
            mix_row(row(a, n), b_n, eps)
            label_lead_into(b_n, labels[n], n, lead, magnitude, top, correct)
        blk = claim(counter)
