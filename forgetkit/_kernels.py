"""numba kernels over plain contiguous arrays. Private: callers validate inputs.

Conventions: rows are samples (or epoch*sample pairs), columns are classes; argmax ties go to
the lowest class index (numpy's rule). float16 data is passed as its raw int16 bits, because
numba has no float16 arithmetic on the CPU; ``_f16_key`` maps the bits to an integer key whose
order is the order of the float values (-0.0 and +0.0 share a key). Softmax kernels take
``table``, the ``f16_exp_table()`` (exp of every float16 value), as an argument.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

_F16_EXP_MASK = 0x7C00  # exponent bits all ones: inf or nan


@njit(inline="always")
def _f16_key(bits):
    """Order-preserving int16 key of float16 bits, branch-free so the max loop vectorises:
    negatives get their 15 low bits flipped, plus one so that -0.0 and +0.0 share key 0."""
    m = np.int16((bits >> np.int16(15)) & np.int16(0x7FFF))
    return np.int16((bits ^ m) + (m & np.int16(1)))


@njit(inline="always")
def _argmax_pair_f16(row0, row1):
    """First argmax of two float16 rows (int16 bits, at most 0xFFFF classes) in one loop (two
    independent reductions keep more work in flight); -1 for a row holding inf or nan.
    The max of key << 16 | (0xFFFF - c) names, in its low half, the first class holding the
    max key."""
    best0 = best1 = np.int32(-2147483648)
    magnitude0 = magnitude1 = np.int16(0)
    for c in range(row0.shape[0]):
        low = np.int32(0xFFFF - c)
        best0 = max(best0, (np.int32(_f16_key(row0[c])) << np.int32(16)) | low)
        best1 = max(best1, (np.int32(_f16_key(row1[c])) << np.int32(16)) | low)
        magnitude0 = max(magnitude0, np.int16(row0[c] & np.int16(0x7FFF)))
        magnitude1 = max(magnitude1, np.int16(row1[c] & np.int16(0x7FFF)))
    i0 = np.int32(0xFFFF) - (best0 & np.int32(0xFFFF))
    i1 = np.int32(0xFFFF) - (best1 & np.int32(0xFFFF))
    return (np.int32(-1) if magnitude0 >= _F16_EXP_MASK else i0,
            np.int32(-1) if magnitude1 >= _F16_EXP_MASK else i1)


@njit(parallel=True, cache=True)
def argmax_f16(bits, out):
    """Row-wise argmax of float16 values given as int16 bits.

    bits: int16 (rows, C); out: int32 (rows,). A row holding inf or nan gets -1.
    One vectorised pass per row (``_argmax_pair_f16``). Rows of up to 256 classes are taken
    two at a time, where the per-row overhead dominates (13% faster at C=100 and 200; 60%
    slower at C=1,000). Wider rows are paired with themselves (the compiler merges the two
    identical reductions). Rows of more than 0xFFFF classes take two passes (max key, then
    the first index holding it).
    """
    rows, n_classes = bits.shape
    if n_classes <= 256:
        for pair in prange((rows + 1) // 2):
            r0 = 2 * pair
            r1 = min(r0 + 1, rows - 1)  # an odd last row is paired with itself
            out[r0], out[r1] = _argmax_pair_f16(bits[r0], bits[r1])
        return
    if n_classes <= 0xFFFF:
        for r in prange(rows):
            out[r] = _argmax_pair_f16(bits[r], bits[r])[0]
        return
    for r in prange(rows):
        row = bits[r]
        magnitude = np.int16(0)
        best_key = np.int16(-32768)
        for c in range(n_classes):
            best_key = max(best_key, _f16_key(row[c]))
            magnitude = max(magnitude, np.int16(row[c] & np.int16(0x7FFF)))
        for c in range(n_classes):
            if _f16_key(row[c]) == best_key:
                out[r] = c
                break
        if magnitude >= _F16_EXP_MASK:  # inf or nan somewhere in the row
            out[r] = -1


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


# numba's float max/min reductions do not vectorise; these loops reduce order-preserving int64
# keys of the float64 bits instead (integer max/min vectorise), with the same results.
_LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)


@njit(inline="always")
def _key64(x):
    """Order-preserving int64 key of a float64 (an involution: it also maps keys back)."""
    b = np.float64(x).view(np.int64)
    return b ^ ((b >> np.int64(63)) & _LOW63)


@njit(inline="always")
def _float_of_key64(key):
    return np.int64(key ^ ((key >> np.int64(63)) & _LOW63)).view(np.float64)


@njit
def _lead(row, y):
    """(row[y] - max of row[c != y], that max, max |row|) for a row (C,) of finite float64
    values, C >= 2. Class y is masked with integer ops (a select on c != y would not
    vectorise)."""
    neg_inf = _key64(-np.inf)
    key = neg_inf
    magnitude = np.int64(0)
    for c in range(row.shape[0]):
        keep = -np.int64(c != y)  # all ones, or zero at c == y
        key = max(key, (_key64(row[c]) & keep) | (neg_inf & ~keep))
        magnitude = max(magnitude, np.float64(row[c]).view(np.int64) & _LOW63)
    other = _float_of_key64(key)
    return row[y] - other, other, np.int64(magnitude).view(np.float64)


@njit(parallel=True, cache=True)
def label_leads(p, labels, lead, magnitude, top, correct):
    """Per row n of p (N, C) finite float64: lead[n] = p[n, y] - max of p[n, c != y],
    magnitude[n] = max |p[n]|, top[n] = the first class c != y holding that max when the
    lead is <= 0 (else -1) and correct[n] = whether y is the first argmax (numpy's rule).
    These describe the current fusion for ``grid_correct_counts``."""
    for n in prange(p.shape[0]):
        _label_lead_into(p[n], labels[n], n, lead, magnitude, top, correct)


@njit(inline="always")
def _label_lead_into(row, y, n, lead, magnitude, top, correct):
    lead[n], other, magnitude[n] = _lead(row, y)
    top[n] = -1
    correct[n] = lead[n] > 0.0
    if lead[n] <= 0.0:  # y ties or trails: the first other class holding the max
        for c in range(row.shape[0]):
            if c != y and row[c] == other:
                top[n] = c
                break
        correct[n] = lead[n] == 0.0 and top[n] > y


@njit
def _win_bounds(a, b, y, band):
    """Where eps*a + (1-eps)*b ranks class y first, for rows a, b (C,) of finite values.

    Returns lw, hw (the open interval where every margin > band: the win is certain), lp, hp
    (the closed interval where every margin >= -band: the win is possible) and whether no eps
    can win. Branch-free so that it vectorises.
    """
    ay = a[y]
    by = b[y]
    neg_inf = _key64(-np.inf)
    pos_inf = _key64(np.inf)
    lw, lp, hw, hp = neg_inf, neg_inf, pos_inf, pos_inf
    never = 0
    empty = 0
    for c in range(a.shape[0]):
        icpt = by - b[c]
        slope = (ay - a[c]) - icpt
        safe = slope if slope != 0.0 else 1.0
        k_win = _key64((band - icpt) / safe)
        k_possible = _key64((-band - icpt) / safe)
        up = slope > 0.0
        down = slope < 0.0
        lw = max(lw, k_win if up else neg_inf)
        lp = max(lp, k_possible if up else neg_inf)
        hw = min(hw, k_win if down else pos_inf)
        hp = min(hp, k_possible if down else pos_inf)
        flat = (slope == 0.0) & (c != y)  # at c == y both are 0 by construction
        never = max(never, np.int64(flat & (icpt <= band)))
        empty = max(empty, np.int64(flat & (icpt < -band)))
    high_win = -np.inf if never else _float_of_key64(hw)
    return (_float_of_key64(lw), high_win, _float_of_key64(lp), _float_of_key64(hp),
            empty > 0)


@njit(parallel=True, cache=True)
def grid_correct_counts(a, b, labels, b_lead, b_magnitude, b_top, grid, rel_band, n_blocks):
    """Number of samples that eps*a + (1-eps)*b classifies correctly, for every eps in ``grid``.

    a, b: float64 (N, C); labels: int64 (N,); b_lead, b_magnitude, b_top: ``label_leads``
    of b; grid: float64 (G,) ascending; n_blocks: number of sample blocks (one counts row
    each, merged at the end). Returns int64 (G,).

    For one sample the true class wins on an interval of eps (its margins are linear in
    eps). With band = rel_band * max|value| of the sample: a label that leads both rows by
    more than band wins at every eps, and one that trails b's top class by more than band
    in both rows wins at none. For the other samples the kernel computes the eps where the
    win is certain (every margin > band) and where it is possible (every margin >= -band).
    Grid points in the certain part count through a difference array; grid points between
    the two are re-checked with the brute-force arithmetic, so the counts equal the
    brute-force grid's exactly, ties included.
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
            lead_a, _, magnitude = _lead(a[n], y)
            band = rel_band * max(magnitude, b_magnitude[n])
            lead_b = b_lead[n]
            if lead_a > band and lead_b > band:  # y wins at both ends, so at every eps
                diff[blk, 0] += 1
                diff[blk, n_grid] -= 1
                continue
            if lead_b < -band and lead_a < -band and a[n, b_top[n]] - a[n, y] > band:
                continue  # b's top class beats y at both ends, so at every eps
            lw, hw, lp, hp, empty = _win_bounds(a[n], b[n], y, band)
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
# exp(x) for -708 <= x <= 0 in straight-line arithmetic that vectorises (numba has no
# vectorised exp on this platform): x = k*ln2 + r with |r| <= ln2/2 (Cody-Waite), a degree-13
# Taylor polynomial for exp(r), and 2**k built from the bits of k. At most 1 ulp from the
# correctly rounded exp (numpy's exp is too; the two differ by 1 ulp on ~10% of inputs).
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # trailing zeros: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0  # 1.5 * 2**52: x + _ROUND - _ROUND rounds x to an integer
_ROUND_BITS = 0x4338000000000000  # the bits of _ROUND
#: Below this shifted logit the fast exp would leave the normal range: such rows take math.exp.
EXP_MIN = -708.0
_TWO_1008 = 2.0**1008  # float16 exponent bias 15 -> float64 bias 1023


@njit(inline="always")
def _exp_nonpositive(x):
    """exp(x) for EXP_MIN <= x <= 0, branch-free."""
    t = x * _LOG2E + _ROUND
    k = t - _ROUND
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    scale = (np.float64(t).view(np.int64) - np.int64(_ROUND_BITS - 1023)) << np.int64(52)
    return (1.0 + (r + r * r * p)) * np.int64(scale).view(np.float64)


@njit(inline="always")
def _f16_to_f64(bits):
    """float64 value of finite float16 bits (int16): the 15 low bits shifted into a float64
    whose exponent is off by 2**1008 (subnormals included), then rescaled exactly."""
    b = np.int64(bits)
    f = ((b & np.int64(0x7FFF)) << np.int64(42)) | ((b & np.int64(0x8000)) << np.int64(48))
    return np.int64(f).view(np.float64) * _TWO_1008


@njit(inline="always")
def _f16_bits_of_key(key):
    """Inverse of ``_f16_key`` (+0.0 for key 0)."""
    if key >= 0:
        return key
    return np.int16((key - np.int16(1)) ^ np.int16(0x7FFF))


def _to_f64(value):
    """float64 of one stored value: float16 bits (int16) or a float32/64 (numba only)."""


@overload(_to_f64, inline="always")
def _to_f64_impl(value):
    if isinstance(value, types.Integer):
        return lambda value: _f16_to_f64(value)
    return lambda value: np.float64(value)


def _row_range(row):
    """(max, min, finite) of one row of stored values (numba only)."""


@overload(_row_range, inline="always")
def _row_range_impl(row):
    if isinstance(row.dtype, types.Integer):  # float16 bits: vectorised int16 keys

        def impl(row):
            hi = np.int16(-32768)
            lo = np.int16(32767)
            magnitude = np.int16(0)
            for c in range(row.shape[0]):
                key = _f16_key(row[c])
                hi = max(hi, key)
                lo = min(lo, key)
                magnitude = max(magnitude, np.int16(row[c] & np.int16(0x7FFF)))
            return (_f16_to_f64(_f16_bits_of_key(hi)), _f16_to_f64(_f16_bits_of_key(lo)),
                    magnitude < _F16_EXP_MASK)

        return impl

    def impl(row):
        hi = -np.inf
        lo = np.inf
        for c in range(row.shape[0]):
            v = np.float64(row[c])
            if not np.isfinite(v):
                return hi, lo, False
            hi = max(hi, v)
            lo = min(lo, v)
        return hi, lo, True

    return impl


@njit(fastmath={"contract"})
def _exp_shifted(row, m, out):
    """out[c] = exp(x[c] - m) for a row of stored values with every x[c] - m >= EXP_MIN."""
    for c in range(row.shape[0]):
        out[c] = _exp_nonpositive(_to_f64(row[c]) - m)


@njit(fastmath={"reassoc"})
def _sum(x):
    """Sum of x (C,), in vector lanes (not the order of numpy's pairwise sum)."""
    s = 0.0
    for c in range(x.shape[0]):
        s += x[c]
    return s


# float16 rows need no shift: exp of each of the 65,536 bit patterns comes from a table and
# the softmax is table[x] * (1 / sum(table[x])). Entries outside [EXP_MIN, F16_TABLE_MAX]
# are nan, so a row holding one (or inf/nan) sums to nan and takes the shifted path.
#: Largest float16 value read from the table (C * exp(600) cannot overflow).
F16_TABLE_MAX = 600.0


@functools.cache
def f16_exp_table():
    """float64 (65536,): exp of each float16 bit pattern (index: the bits as uint16) by
    ``math.exp`` (< 1 ulp); nan outside [EXP_MIN, F16_TABLE_MAX] and for inf/nan. Read-only."""
    values = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    table = np.full(65536, np.nan)
    inside = np.flatnonzero((values >= EXP_MIN) & (values <= F16_TABLE_MAX))
    table[inside] = [math.exp(v) for v in values[inside].tolist()]
    table.flags.writeable = False
    return table


def _exp_table(row, table, out):
    """out[c] = table[bits of x[c]] for float16 rows, returning sum(out) (nan if a value is
    outside the table); nan at once for float32/64 rows (numba only)."""


@overload(_exp_table, inline="always")
def _exp_table_impl(row, table, out):
    if isinstance(row.dtype, types.Integer):

        def impl(row, table, out):
            for c in range(row.shape[0]):
                out[c] = table[np.uint16(row[c])]
            return _sum(out)

        return impl
    return lambda row, table, out: np.nan


def _is_f16(values):
    """Whether ``values`` holds float16 bits (int16), a compile-time constant (numba only)."""


@overload(_is_f16, inline="always")
def _is_f16_impl(values):
    is_f16 = isinstance(values.dtype, types.Integer)
    return lambda values: is_f16


@njit(inline="always")
def _is_table_row(row, m):
    """Whether a row that ``_exp_row`` gave status 1 and shift m took the table: float16
    rows with m == 0. A float16 row on the shifted path has a value above F16_TABLE_MAX or
    below EXP_MIN with a spread of at most -EXP_MIN, so its max is > 0."""
    return _is_f16(row) and m == 0.0


@njit(inline="always")
def _exp_row(row, out, table):
    """out = exp(x - m) of one row of stored values (C,), unnormalised; table: the
    ``f16_exp_table()``.

    Returns (status, m, inv): the softmax is out * inv, computed as ``out[c] * inv``.
    m is 0 for float16 rows within the table (exp read from it), else the row's max.
    status 1: exp from the table or the fast exp; 0: some exp underflowed and math.exp was
    used; -1: the row holds inf or nan (out is undefined).
    """
    total = _exp_table(row, table, out)
    if total == total:  # not nan: every value was in the table
        return 1, 0.0, 1.0 / total
    hi, lo, finite = _row_range(row)
    if not finite:
        return -1, hi, np.nan
    status = 1
    if lo - hi >= EXP_MIN:
        _exp_shifted(row, hi, out)
    else:  # some exp underflows to a subnormal or zero
        status = 0
        for c in range(row.shape[0]):
            out[c] = math.exp(_to_f64(row[c]) - hi)
    return status, hi, 1.0 / _sum(out)


@njit(inline="always")
def _softmax_row(row, out, table):
    """out = softmax of one row of stored values (C,) in float64; returns ``_exp_row``'s
    (status, m, inv)."""
    status, m, inv = _exp_row(row, out, table)
    for c in range(out.shape[0]):
        out[c] *= inv
    return status, m, inv


@njit(parallel=True, cache=True)
def softmax_rows(values, table, out):
    """Row-wise softmax of ``values`` (rows, C), float16 given as int16 bits or float32/64,
    into float64 ``out``: out[c] * inv as ``_exp_row`` gives them (table: the
    ``f16_exp_table()``). Returns the number of rows holding inf or nan."""
    n_bad = 0
    for r in prange(values.shape[0]):
        if _softmax_row(values[r], out[r], table)[0] < 0:
            n_bad += 1
    return n_bad


@njit(inline="always")
def _exp_rows(values, epochs, row, table, tmp, inv):
    """tmp[j] = exp of the row values[epochs[j], row] and inv[j] its 1/sum, as ``_exp_row``
    gives them, for up to 3 epochs. float16 rows read the table for all epochs in one loop,
    which keeps more loads in flight. Returns the number of rows holding inf or nan."""
    m = epochs.shape[0]
    n_bad = 0
    if _is_f16(values):
        x0, x1, x2 = (values[epochs[0], row], values[epochs[min(1, m - 1)], row],
                      values[epochs[m - 1], row])
        for c in range(x0.shape[0]):
            tmp[0, c] = table[np.uint16(x0[c])]
            if m > 1:
                tmp[1, c] = table[np.uint16(x1[c])]
            if m > 2:
                tmp[2, c] = table[np.uint16(x2[c])]
    for j in range(m):
        total = _sum(tmp[j]) if _is_f16(values) else np.nan
        if total == total:  # every value was in the table
            inv[j] = 1.0 / total
        else:
            status, _, inv[j] = _exp_row(values[epochs[j], row], tmp[j], table)
            n_bad += status < 0
    return n_bad


@njit(parallel=True, cache=True)
def combine_softmax(values, epochs, weights, src, table, out, n_blocks):
    """out[i] = the softmax of values[e, src[i]] combined over e in ``epochs``, each softmax
    as ``softmax_rows`` computes it, added in the order of ``epochs``:

    - ``weights`` empty: the mean, with numpy's arithmetic (``total = p0; total += p1; ...;
      total /= k``);
    - ``weights`` (k,) float64: the weighted sum (``total = zeros; total += w * p ...``).

    values: stored outputs (E, M, C) (float16 as int16 bits), read in place; epochs (k,),
    src (R,): int64; table: the ``f16_exp_table()``; out: float64 (R, C).
    Epochs are taken 3 at a time, each group added in one pass (a mean's weights are 1.0,
    an exact factor). Returns the number of (epoch, row) pairs holding inf or nan.
    """
    k = epochs.shape[0]
    mean = weights.shape[0] == 0
    n_rows, n_classes = out.shape
    n_blocks = max(1, min(n_blocks, n_rows))
    n_bad = 0
    for blk in prange(n_blocks):
        tmp = np.empty((3, n_classes))
        inv = np.empty(3)
        w = np.ones(3)
        for r in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            total = out[r]
            for g in range(0, k, 3):
                m = min(3, k - g)
                n_bad += _exp_rows(values, epochs[g: g + m], src[r], table, tmp, inv)
                if not mean:
                    w[:m] = weights[g: g + m]
                p0, p1, p2 = tmp[0], tmp[1], tmp[2]
                i0, i1, i2 = inv[0], inv[1], inv[2]
                w0, w1, w2 = w[0], w[1], w[2]
                first = g == 0
                divide = mean and g + m == k
                for c in range(n_classes):
                    v = (0.0 if first else total[c]) + w0 * (p0[c] * i0)
                    if m > 1:
                        v += w1 * (p1[c] * i1)
                    if m > 2:
                        v += w2 * (p2[c] * i2)
                    total[c] = v / k if divide else v
    return n_bad


@njit(parallel=True, cache=True)
def label_probs(values, src, labels, table, out):
    """out[i] = softmax(values[src[i]])[labels[i]], as ``softmax_rows`` computes it, without
    storing the rows. values: (M, C) stored outputs (float16 as int16 bits); table: the
    ``f16_exp_table()``; out: float64 (R,). Returns the number of rows holding inf or nan."""
    n_rows = src.shape[0]
    n_blocks = max(1, min(64, n_rows))
    n_bad = 0
    for blk in prange(n_blocks):
        tmp = np.empty(values.shape[1])
        for i in range(blk * n_rows // n_blocks, (blk + 1) * n_rows // n_blocks):
            if _softmax_row(values[src[i]], tmp, table)[0] < 0:
                n_bad += 1
            out[i] = tmp[labels[i]]
    return n_bad


# ------------------------------------------------------------ ensemble selection
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
    row of total, the m and inv of ``_exp_row`` and the largest probability of that softmax
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
                    status, m, scale = _exp_row(x, tmp, table)
                    if status < 0:
                        bad[blk, e] += 1
                        continue
                    if status == 1 and not known:
                        shift[e, r] = m
                        inv[e, r] = scale
                        top[e, r] = _row_max(tmp) * scale
                    best = _first_argmax_nonnegative(t, tmp, scale)
                else:  # the candidates' exp (table or vectorised exp), then their argmax
                    if _is_table_row(x, shift[e, r]):
                        for j in range(n):
                            tmp[j] = table[np.uint16(x[cand[first + j]])]
                    else:
                        for j in range(n):
                            picked[j] = _to_f64(x[cand[first + j]])
                        _exp_shifted(picked[:n], shift[e, r], tmp[:n])
                    for j in range(n):
                        picked[j] = t[cand[first + j]]
                    best = cand[first + _first_argmax_nonnegative(picked[:n], tmp[:n],
                                                                  inv[e, r])]
                if best == labels[r]:
                    counts[blk, e] += 1
    return counts.sum(axis=0), bad.sum(axis=0)


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


@njit(inline="always")
def _mix_row(a, b, eps):
    """b <- eps*a + (1-eps)*b for rows (C,), numpy's arithmetic: the fit (``mix_into``) and
    the apply (``mix``) must give the same bits."""
    one_minus = 1.0 - eps
    for c in range(a.shape[0]):
        b[c] = eps * a[c] + one_minus * b[c]


@njit(parallel=True, cache=True)
def mix(a, b, eps):
    """b <- eps*a + (1-eps)*b in place (numpy's arithmetic). a, b: float64 (N, C)."""
    for n in prange(a.shape[0]):
        _mix_row(a[n], b[n], eps)


@njit(parallel=True, cache=True)
def mix_into(a, b, eps, labels, lead, magnitude, top, correct):
    """b <- eps*a + (1-eps)*b in place (numpy's arithmetic), then ``label_leads`` of b into
    lead, magnitude, top and correct. a, b: float64 (N, C); labels: int64 (N,)."""
    for n in prange(a.shape[0]):
        _mix_row(a[n], b[n], eps)
        _label_lead_into(b[n], labels[n], n, lead, magnitude, top, correct)


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
