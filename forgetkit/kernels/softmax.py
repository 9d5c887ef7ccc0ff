"""Softmax kernels: rows of stored values (float16 as int16 bits, float32, float64) to
float64 probabilities, window means and weighted sums of softmaxes, label probabilities.

Every kernel computes a row's softmax with the same arithmetic (``exp_row``), so results of
different kernels agree bit for bit. float16 rows take exp from ``f16_exp_table()``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from . import views
from .floats import F16_EXP_MASK, f16_bits_of_key, f16_key, f16_to_f64, is_f16, to_f64
from .jit import kernel
from .schedule import claim, span
from .views import borrow

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
                key = f16_key(row[c])
                hi = max(hi, key)
                lo = min(lo, key)
                magnitude = max(magnitude, np.int16(row[c] & np.int16(0x7FFF)))
            return (f16_to_f64(f16_bits_of_key(hi)), f16_to_f64(f16_bits_of_key(lo)),
                    magnitude < F16_EXP_MASK)

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


@njit(fastmath={"contract"}, cache=True)
def exp_shifted(row, m, out):
    """out[c] = exp(x[c] - m) for a row of stored values with every x[c] - m >= EXP_MIN."""
    for c in range(row.shape[0]):
        out[c] = _exp_nonpositive(to_f64(row[c]) - m)


@njit(fastmath={"reassoc"}, cache=True)
def lane_sum(x):
    """Sum of x (C,), in vector lanes (not the order of numpy's pairwise sum): the row sum
    of every softmax (``twins`` calls it for theirs)."""
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
            return lane_sum(borrow(out))

        return impl
    return lambda row, table, out: np.nan


@njit(inline="always")
def is_table_row(row, m):
    """Whether a row that ``exp_row`` gave status 1 and shift m took the table: float16
    rows with m == 0. A float16 row on the shifted path has a value above F16_TABLE_MAX or
    below EXP_MIN with a spread of at most -EXP_MIN, so its max is > 0."""
    return is_f16(row) and m == 0.0


# exp_row and combine_row are compiled once (per argument types) and called by the kernels,
# not inlined into each: every softmax kernel compiled its own copy of them, seconds of a
# first run; a call per row costs little beside the row's exps.
@njit(cache=True)
def exp_row(row, out, table):
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
        exp_shifted(borrow(row), hi, borrow(out))
    else:  # some exp underflows to a subnormal or zero
        status = 0
        for c in range(row.shape[0]):
            out[c] = math.exp(to_f64(row[c]) - hi)
    return status, hi, 1.0 / lane_sum(borrow(out))


@njit(inline="always")
def _softmax_row(row, out, table):
    """out = softmax of one row of stored values (C,) in float64; returns ``exp_row``'s
    (status, m, inv)."""
    status, m, inv = exp_row(borrow(row), borrow(out), borrow(table))
    for c in range(out.shape[0]):
        out[c] *= inv
    return status, m, inv


@kernel
def softmax_rows(values, table, out, n_blocks, counter):
    """Row-wise softmax of ``values`` (rows, C), float16 given as int16 bits or float32/64,
    into float64 ``out``: out[c] * inv as ``exp_row`` gives them (table: the
    ``f16_exp_table()``). Returns the number of rows holding inf or nan."""
    n_bad = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, values.shape[0], n_blocks)
        for r in range(lo, hi):
            if _softmax_row(views.row(values, r), views.row(out, r), table)[0] < 0:
                n_bad += 1
        blk = claim(counter)
    return n_bad


@njit(inline="always")
def _exp_rows(values, epochs, g, m, at, table, tmp, inv):
    """tmp[j] = exp of the row values[epochs[g + j], at] and inv[j] its 1/sum, as
    ``exp_row`` gives them, for j < m <= 3. float16 rows read the table for all epochs in
    one loop, which keeps more loads in flight. Returns the number of rows holding inf or
    nan."""
    n_bad = 0
    if is_f16(values):
        x0 = views.row2(values, epochs[g], at)
        x1 = views.row2(values, epochs[g + min(1, m - 1)], at)
        x2 = views.row2(values, epochs[g + m - 1], at)
        for c in range(x0.shape[0]):
            tmp[0, c] = table[np.uint16(x0[c])]
            if m > 1:
                tmp[1, c] = table[np.uint16(x1[c])]
            if m > 2:
                tmp[2, c] = table[np.uint16(x2[c])]
    for j in range(m):
        total = lane_sum(views.row(tmp, j)) if is_f16(values) else np.nan
        if total == total:  # every value was in the table
            inv[j] = 1.0 / total
        else:
            status, _, inv[j] = exp_row(views.row2(values, epochs[g + j], at), views.row(tmp, j),
                                        borrow(table))
            n_bad += status < 0
    return n_bad


@kernel
def combine_softmax(values, epochs, weights, src, order, table, out, accumulate, n_blocks,
                    counter):
    """out[i] = the softmax of values[e, src[i]] combined over e in ``epochs``, each softmax
    as ``softmax_rows`` computes it, added in the order of ``epochs``:

    - ``weights`` empty: the mean, with numpy's arithmetic (``total = p0; total += p1; ...;
      total /= k``);
    - ``weights`` (k,) float64: the weighted sum (``total = zeros; total += w * p ...``),
      added to the values already in ``out`` when ``accumulate`` (``out += w * p ...``).

    values: stored outputs (E, M, C) (float16 as int16 bits), read in place; epochs (k,),
    src (R,): int64; order (R,): the order in which rows are read (ascending src:
    neighbouring reads); table: the ``f16_exp_table()``; out: float64 (R, C).
    Epochs are taken 3 at a time, each group added in one pass (a mean's weights are 1.0,
    an exact factor). Returns the number of (epoch, row) pairs holding inf or nan.
    """
    n_rows, n_classes = out.shape
    tmp, inv, w, _ = combine_scratch(n_classes)
    n_bad = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_rows, n_blocks)
        for j in range(lo, hi):
            r = order[j]
            n_bad += combine_row(borrow(values), borrow(epochs), borrow(weights), src[r],
                                 borrow(table), borrow(tmp), borrow(inv), borrow(w),
                                 views.row(out, r), accumulate)
        blk = claim(counter)
    return n_bad


@njit(inline="always")
def combine_scratch(n_classes):
    """One thread's scratch of `combine_row`: tmp (3, C), inv (3,), w (3,), and the empty
    weights of a mean (0,)."""
    return np.empty((3, n_classes)), np.empty(3), np.ones(3), np.empty(0)


@njit(inline="always")
def window_mean_row(values, epochs, at, table, scratch, out):
    """out (C,) = the mean softmax of values[epochs, at] as `combine_softmax` makes it;
    scratch from `combine_scratch`. Returns the number of epochs whose row holds inf or
    nan."""
    tmp, inv, w, mean = scratch
    # a computed False: a literal one would compile combine_row a second time, typed
    # Literal[bool], beside the build combine_softmax compiles
    accumulate = epochs.shape[0] < 0
    return combine_row(borrow(values), borrow(epochs), borrow(mean), at, borrow(table),
                       borrow(tmp), borrow(inv), borrow(w), borrow(out), accumulate)


@njit(cache=True)
def combine_row(values, epochs, weights, at, table, tmp, inv, w, total, accumulate):
    """One row of ``combine_softmax``: total (C,) = the softmaxes of values[e, at] for e in
    epochs combined (mean if ``weights`` is empty, else weighted, added to total when
    ``accumulate``); tmp (3, C), inv (3,), w (3,) are scratch. Returns the number of epochs
    whose row holds inf or nan."""
    k = epochs.shape[0]
    mean = weights.shape[0] == 0
    n_bad = 0
    for j in range(3):
        w[j] = 1.0
    for g in range(0, k, 3):
        m = min(3, k - g)
        n_bad += _exp_rows(values, epochs, g, m, at, table, tmp, inv)
        if not mean:
            for j in range(m):
                w[j] = weights[g + j]
        p0, p1, p2 = views.row(tmp, 0), views.row(tmp, 1), views.row(tmp, 2)
        i0, i1, i2 = inv[0], inv[1], inv[2]
        w0, w1, w2 = w[0], w[1], w[2]
        first = g == 0 and not accumulate
        divide = mean and g + m == k
        for c in range(total.shape[0]):
            v = (0.0 if first else total[c]) + w0 * (p0[c] * i0)
            if m > 1:
                v += w1 * (p1[c] * i1)
            if m > 2:
                v += w2 * (p2[c] * i2)
            total[c] = v / k if divide else v
    return n_bad


@kernel
def label_probs(values, src, labels, table, out, n_blocks, counter):
    """out[i] = softmax(values[src[i]])[labels[i]], as ``softmax_rows`` computes it, without
    storing the rows. values: (M, C) stored outputs (float16 as int16 bits); table: the
    ``f16_exp_table()``; out: float64 (R,). Returns the number of rows holding inf or nan."""
    tmp = np.empty(values.shape[1])
    n_bad = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        for i in range(lo, hi):
            if _softmax_row(values[src[i]], tmp, table)[0] < 0:
                n_bad += 1
            out[i] = tmp[labels[i]]
        blk = claim(counter)
    return n_bad


@kernel
def mean_first_axis(stack, out, n_blocks, counter):
    """out = mean of stack (k, rows, C) over its first axis: summed in order, then divided
    by k (the arithmetic of ``total = s[0].copy(); total += s[1] ...; total /= k``)."""
    k, rows, n_classes = stack.shape
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, rows, n_blocks)
        for r in range(lo, hi):
            for c in range(n_classes):
                s = stack[0, r, c]
                for i in range(1, k):
                    s += stack[i, r, c]
                out[r, c] = s / k
        blk = claim(counter)


@kernel
def softmax_stats(values, src, labels, table, shift, inv, pred, label_prob, class_max,
                  n_blocks, counter):
    """Per epoch e and row i of stored outputs values[e, src[i]] (E, M, C) (float16 as int16
    bits), each softmax computed as ``softmax_rows`` does:

    - shift[e, i], inv[e, i]: the m and inv of ``exp_row`` (left as they are where some
      exp underflowed: such rows take math.exp);
    - pred[e, i]: the first argmax of the probabilities (-1: the row holds inf or nan);
    - label_prob[e, i]: the probability of labels[i];
    - class_max[i, c] (shape (0, 0): not kept): raised to the probability of class c.

    Returns the number of rows holding inf or nan per epoch (E,).
    """
    n_epochs = values.shape[0]
    keep_max = class_max.shape[0] > 0
    bad = np.zeros(n_epochs, dtype=np.int64)
    tmp = np.empty(values.shape[2])
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        for i in range(lo, hi):
            for e in range(n_epochs):
                status, m, scale = exp_row(views.row2(values, e, src[i]), borrow(tmp),
                                           borrow(table))
                if status < 0:
                    bad[e] += 1
                    pred[e, i] = -1
                    continue
                if status == 1:
                    shift[e, i] = m
                    inv[e, i] = scale
                top = np.int64(0)  # non-negative floats order as their bits
                for c in range(tmp.shape[0]):
                    tmp[c] *= scale
                    top = max(top, np.float64(tmp[c]).view(np.int64))
                if keep_max:
                    b = class_max[i]
                    for c in range(tmp.shape[0]):
                        b[c] = max(b[c], tmp[c])
                for c in range(tmp.shape[0]):
                    if np.float64(tmp[c]).view(np.int64) == top:
                        pred[e, i] = c
                        break
                label_prob[e, i] = tmp[labels[i]]
        blk = claim(counter)
    return bad


@kernel
def take_samples(shift, inv, pred, label_prob, class_max, idx, out_shift, out_inv, out_pred,
                 out_label_prob, out_class_max, n_blocks, counter):
    """The ``softmax_stats`` of samples idx (R,): out_x[:, i] = x[:, idx[i]] for the (E, N)
    arrays and out_class_max[i] = class_max[idx[i]] (skipped for shape (0, 0))."""
    keep_max = class_max.shape[0] > 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, idx.shape[0], n_blocks)
        for i in range(lo, hi):
            n = idx[i]
            for e in range(shift.shape[0]):
                out_shift[e, i] = shift[e, n]
                out_inv[e, i] = inv[e, n]
                out_pred[e, i] = pred[e, n]
                out_label_prob[e, i] = label_prob[e, n]
            if keep_max:
                for c in range(class_max.shape[1]):
                    out_class_max[i, c] = class_max[n, c]
        blk = claim(counter)
