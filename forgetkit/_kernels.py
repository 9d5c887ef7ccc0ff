"""numba kernels over plain contiguous arrays. Private: callers validate inputs.

Conventions: rows are samples (or epoch*sample pairs), columns are classes; argmax ties go to
the lowest class index (numpy's rule). float16 data is passed as its raw int16 bits, because
numba has no float16 arithmetic on the CPU; ``_f16_key`` maps the bits to an integer key whose
order is the order of the float values (-0.0 and +0.0 share a key).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_F16_EXP_MASK = 0x7C00  # exponent bits all ones: inf or nan


@njit(inline="always")
def _f16_key(bits):
    """Order-preserving int16 key of float16 bits, branch-free so the max loop vectorises:
    negatives get their 15 low bits flipped, plus one so that -0.0 and +0.0 share key 0."""
    m = np.int16((bits >> np.int16(15)) & np.int16(0x7FFF))
    return np.int16((bits ^ m) + (m & np.int16(1)))


@njit(parallel=True, cache=True)
def argmax_f16(bits, out):
    """Row-wise argmax of float16 values given as int16 bits.

    bits: int16 (rows, C); out: int32 (rows,). A row holding inf or nan gets -1.
    Two passes over each (cache-resident) row: the max key and the largest magnitude bits
    (vectorised), then the first index holding the max key.
    """
    rows, n_classes = bits.shape
    for r in prange(rows):
        row = bits[r]
        best_key = np.int16(-32768)
        magnitude = np.int16(0)
        for c in range(n_classes):
            best_key = max(best_key, _f16_key(row[c]))
            magnitude = max(magnitude, np.int16(row[c] & np.int16(0x7FFF)))
        out[r] = -1
        if magnitude >= _F16_EXP_MASK:  # inf or nan somewhere in the row
            continue
        for c in range(n_classes):
            if _f16_key(row[c]) == best_key:
                out[r] = c
                break


@njit(parallel=True, cache=True)
def argmax_float(values, out):
    """Row-wise argmax of float32/float64 values (rows, C) into int32 ``out``; -1 if not finite."""
    rows, n_classes = values.shape
    for r in prange(rows):
        best = 0
        best_v = values[r, 0]
        if not np.isfinite(best_v):
            out[r] = -1
            continue
        for c in range(1, n_classes):
            v = values[r, c]
            if not np.isfinite(v):
                best = -1
                break
            if v > best_v:
                best = c
                best_v = v
        out[r] = best


@njit(inline="always")
def _mixture_argmax(a, b, n, eps):
    """argmax over classes of eps*a[n] + (1-eps)*b[n], computed exactly as numpy would."""
    one_minus = 1.0 - eps
    best = 0
    best_v = eps * a[n, 0] + one_minus * b[n, 0]
    for c in range(1, a.shape[1]):
        v = eps * a[n, c] + one_minus * b[n, c]
        if v > best_v:
            best = c
            best_v = v
    return best


@njit(cache=True)
def _first_above(grid, x):
    """Index of the first grid point > x (grid ascending)."""
    lo, hi = 0, grid.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if grid[mid] > x:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def _first_at_least(grid, x):
    """Index of the first grid point >= x (grid ascending)."""
    lo, hi = 0, grid.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if grid[mid] >= x:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(parallel=True, cache=True)
def grid_correct_counts(a, b, labels, grid, rel_band, n_blocks):
    """Number of samples that eps*a + (1-eps)*b classifies correctly, for every eps in ``grid``.

    a, b: float64 (N, C); labels: int64 (N,); grid: float64 (G,) ascending; n_blocks: number
    of sample blocks (one counts row each, merged at the end). Returns int64 (G,).

    For one sample the true class wins on an interval of eps. The kernel computes, per sample,
    the eps where the win is certain (every margin > band) and where it is possible (every
    margin >= -band), with band = rel_band * max|value|. Grid points in the certain part count
    through a difference array; grid points between the two are re-checked with the
    brute-force arithmetic, so the counts equal the brute-force grid's exactly, ties included.
    """
    n_samples, n_classes = a.shape
    n_grid = grid.shape[0]
    n_blocks = max(1, min(n_blocks, n_samples))
    diff = np.zeros((n_blocks, n_grid + 1), dtype=np.int64)
    for blk in prange(n_blocks):
        start = blk * n_samples // n_blocks
        stop = (blk + 1) * n_samples // n_blocks
        for n in range(start, stop):
            y = labels[n]
            ay = a[n, y]
            by = b[n, y]
            scale = 0.0
            for c in range(n_classes):
                scale = max(scale, abs(a[n, c]), abs(b[n, c]))
            band = rel_band * scale
            # certain-win interval (lw, hw) open; possible-win interval [lp, hp] closed
            lw, hw, lp, hp = -np.inf, np.inf, -np.inf, np.inf
            empty = False
            for c in range(n_classes):
                if c == y:
                    continue
                icpt = by - b[n, c]
                slope = (ay - a[n, c]) - icpt
                if slope > 0.0:
                    lw = max(lw, (band - icpt) / slope)
                    lp = max(lp, (-band - icpt) / slope)
                elif slope < 0.0:
                    hw = min(hw, (band - icpt) / slope)
                    hp = min(hp, (-band - icpt) / slope)
                else:
                    if icpt <= band:
                        hw = -np.inf  # never certain
                    if icpt < -band:
                        empty = True
                        break
            if empty:
                continue
            p0 = _first_at_least(grid, lp)
            p1 = _first_above(grid, hp)  # possible grid points: [p0, p1)
            if p0 >= p1:
                continue
            w0, w1 = p1, p1  # certain grid points: [w0, w1)
            if lw < hw:
                w0 = max(_first_above(grid, lw), p0)
                w1 = min(_first_at_least(grid, hw), p1)
                if w0 < w1:
                    diff[blk, w0] += 1
                    diff[blk, w1] -= 1
            for g in range(p0, p1):
                if w0 <= g < w1:
                    continue
                if _mixture_argmax(a, b, n, grid[g]) == y:
                    diff[blk, g] += 1
                    diff[blk, g + 1] -= 1
    total = diff.sum(axis=0)
    return np.cumsum(total[:n_grid])


@njit(parallel=True, cache=True)
def win_intervals(a, b, labels):
    """Per sample, the interval of eps in [0, 1] where eps*a + (1-eps)*b ranks the label first.

    Returns lo, hi (float64 (N,)), lo_open, hi_open, valid (bool (N,)); a class below the label
    must be beaten strictly, one above it only matched (argmax ties go to the lowest index).
    """
    n_samples, n_classes = a.shape
    lo = np.zeros(n_samples)
    hi = np.ones(n_samples)
    lo_open = np.zeros(n_samples, dtype=np.bool_)
    hi_open = np.zeros(n_samples, dtype=np.bool_)
    valid = np.ones(n_samples, dtype=np.bool_)
    for n in prange(n_samples):
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
    return lo, hi, lo_open, hi_open, valid


@njit(parallel=True, cache=True)
def mixture_correct_count(a, b, labels, eps):
    """Number of samples that eps*a + (1-eps)*b classifies correctly. a, b: float64 (N, C)."""
    count = 0
    for n in prange(a.shape[0]):
        if _mixture_argmax(a, b, n, eps) == labels[n]:
            count += 1
    return count


# ------------------------------------------------------------------------- softmax
#: float64 value of every float16 bit pattern (index: the bits as uint16).
F16_TO_F64 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)


@njit(parallel=True, cache=True)
def shift_by_row_max_f16(bits, table, out):
    """out[r, c] = x[r, c] - max_c x[r, c] in float64, x float16 given as int16 bits.

    bits: int16 (rows, C); table: F16_TO_F64; out: float64 (rows, C).
    Returns the number of rows holding inf or nan (their output is undefined).
    """
    rows, n_classes = bits.shape
    n_bad = 0
    for r in prange(rows):
        m = -np.inf
        magnitude = np.int16(0)
        for c in range(n_classes):
            m = max(m, table[np.uint16(bits[r, c])])
            magnitude = max(magnitude, np.int16(bits[r, c] & np.int16(0x7FFF)))
        if magnitude >= _F16_EXP_MASK:
            n_bad += 1
        for c in range(n_classes):
            out[r, c] = table[np.uint16(bits[r, c])] - m
    return n_bad


@njit(parallel=True, cache=True)
def shift_by_row_max(values, out):
    """out[r, c] = values[r, c] - max_c values[r, c] in float64 (values float32/64).

    Returns the number of rows holding inf or nan (their output is undefined).
    """
    rows, n_classes = values.shape
    n_bad = 0
    for r in prange(rows):
        m = -np.inf
        finite = True
        for c in range(n_classes):
            v = np.float64(values[r, c])
            finite &= np.isfinite(v)
            m = max(m, v)
        if not finite:
            n_bad += 1
        for c in range(n_classes):
            out[r, c] = np.float64(values[r, c]) - m
    return n_bad


@njit(parallel=True, cache=True)
def normalize_rows(x):
    """x[r] /= sum(x[r]) in place, summing classes in order. x: float64 (rows, C)."""
    rows, n_classes = x.shape
    for r in prange(rows):
        s = 0.0
        for c in range(n_classes):
            s += x[r, c]
        for c in range(n_classes):
            x[r, c] /= s


# -------------------------------------------------------------- fusion step helpers
@njit(parallel=True, cache=True)
def mean_first_axis(stack, out):
    """out = mean of stack (k, rows, C) over its first axis: summed in order, then divided
    by k (the arithmetic of ``total = s[0].copy(); total += s[1] ...; total /= k``)."""
    k, rows, n_classes = stack.shape
    for r in prange(rows):
        for c in range(n_classes):
            s = stack[0, r, c]
            for i in range(1, k):
                s += stack[i, r, c]
            out[r, c] = s / k


@njit(parallel=True, cache=True)
def mix_into(a, b, eps, labels, correct):
    """b <- eps*a + (1-eps)*b in place (numpy's arithmetic); correct[n] <- argmax b[n] == y.

    a, b: float64 (N, C); labels: int64 (N,); correct: bool (N,).
    """
    one_minus = 1.0 - eps
    for n in prange(a.shape[0]):
        best = 0
        best_v = 0.0
        for c in range(a.shape[1]):
            v = eps * a[n, c] + one_minus * b[n, c]
            b[n, c] = v
            if c == 0 or v > best_v:
                best = c
                best_v = v
        correct[n] = best == labels[n]


@njit(parallel=True, cache=True)
def sum_correct_count_rows(s, p, labels, rows):
    """Number of ``rows`` whose argmax of s[r] + p[r] is labels[r]. s, p: float64 (N, C)."""
    count = 0
    for i in prange(rows.shape[0]):
        r = rows[i]
        best = 0
        best_v = s[r, 0] + p[r, 0]
        for c in range(1, s.shape[1]):
            v = s[r, c] + p[r, c]
            if v > best_v:
                best = c
                best_v = v
        if best == labels[r]:
            count += 1
    return count
