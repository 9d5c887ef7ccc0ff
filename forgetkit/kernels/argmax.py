"""Row-wise argmax kernels: the forgetting pass (float16 bits and float32/64) and the
correct counts of a mixture or a sum of two probability tables. Ties go to the lowest class
index (numpy's rule)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .floats import F16_EXP_MASK, f16_key
from .jit import kernel
from .schedule import claim, span
from .simd import WIDTH, finish_row, rows_max_f16


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
        best0 = max(best0, (np.int32(f16_key(row0[c])) << np.int32(16)) | low)
        best1 = max(best1, (np.int32(f16_key(row1[c])) << np.int32(16)) | low)
        magnitude0 = max(magnitude0, np.int16(row0[c] & np.int16(0x7FFF)))
        magnitude1 = max(magnitude1, np.int16(row1[c] & np.int16(0x7FFF)))
    i0 = np.int32(0xFFFF) - (best0 & np.int32(0xFFFF))
    i1 = np.int32(0xFFFF) - (best1 & np.int32(0xFFFF))
    return (np.int32(-1) if magnitude0 >= F16_EXP_MASK else i0,
            np.int32(-1) if magnitude1 >= F16_EXP_MASK else i1)


@kernel
def argmax_f16(bits, out, n_blocks, counter):
    """Row-wise argmax of float16 values given as int16 bits.

    bits: int16 (rows, C) C-contiguous; out: int32 (rows,). A row holding inf or nan gets -1.
    Rows of at most 0xFFFF classes are taken four at a time by explicit vectors
    (`simd.rows_max_f16`: 8 classes of each row per step, int32 keys; 1.6-2.5x faster than
    the loop numba vectorises from ``_argmax_pair_f16``, with the same keys), the classes
    past the last full step one by one. Rows of more than 0xFFFF classes take two passes
    (max key, then the first index holding it).
    """
    rows, n_classes = bits.shape
    groups = (rows + 3) // 4
    steps = n_classes // WIDTH
    blk = claim(counter)
    while blk < n_blocks:
        if n_classes <= 0xFFFF:
            lo, hi = span(blk, groups, n_blocks)
            for group in range(lo, hi):
                r0 = 4 * group
                r1, r2, r3 = min(r0 + 1, rows - 1), min(r0 + 2, rows - 1), min(r0 + 3, rows - 1)
                # a short last group repeats its last row
                best, most = rows_max_f16(bits[r0], bits[r1], bits[r2], bits[r3], steps)
                out[r0] = finish_row(bits[r0], best[0], most[0], steps * WIDTH)
                out[r1] = finish_row(bits[r1], best[1], most[1], steps * WIDTH)
                out[r2] = finish_row(bits[r2], best[2], most[2], steps * WIDTH)
                out[r3] = finish_row(bits[r3], best[3], most[3], steps * WIDTH)
        else:
            lo, hi = span(blk, rows, n_blocks)
            for r in range(lo, hi):
                row = bits[r]
                magnitude = np.int16(0)
                best_key = np.int16(-32768)
                for c in range(n_classes):
                    best_key = max(best_key, f16_key(row[c]))
                    magnitude = max(magnitude, np.int16(row[c] & np.int16(0x7FFF)))
                for c in range(n_classes):
                    if f16_key(row[c]) == best_key:
                        out[r] = c
                        break
                if magnitude >= F16_EXP_MASK:  # inf or nan somewhere in the row
                    out[r] = -1
        blk = claim(counter)


@kernel
def argmax_float(values, out, n_blocks, counter):
    """Row-wise argmax of float32/float64 values (rows, C) into int32 ``out``; -1 if not finite."""
    rows, n_classes = values.shape
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, rows, n_blocks)
        for r in range(lo, hi):
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
        blk = claim(counter)


# The forgetting pass's argmax, one call over every epoch's rows: as regions (numba's
# threads in one parallel region, `jit.Kernel.on_threads`) where they are compiled.
_argmax_f16, _argmax_float = argmax_f16.build, argmax_float.build


@argmax_f16.on_threads
def argmax_f16_region(bits, out, n_blocks, counter, n_threads):
    """``argmax_f16`` on ``n_threads`` of numba's threads."""
    for _ in prange(n_threads):
        _argmax_f16(bits, out, n_blocks, counter)


@argmax_float.on_threads
def argmax_float_region(values, out, n_blocks, counter, n_threads):
    """``argmax_float`` on ``n_threads`` of numba's threads."""
    for _ in prange(n_threads):
        _argmax_float(values, out, n_blocks, counter)


@njit(inline="always")
def first_argmax_mix(a, b, wa, wb):
    """First argmax over classes of wa*a + wb*b for rows a, b (C,) of finite floats, with
    numpy's arithmetic; wa = wb = 1.0 gives the argmax of a + b (the products are exact)."""
    best = 0
    best_v = wa * a[0] + wb * b[0]
    for c in range(1, a.shape[0]):
        v = wa * a[c] + wb * b[c]
        if v > best_v:
            best = c
            best_v = v
    return best


@kernel
def mixture_correct_count(a, b, labels, eps, n_blocks, counter):
    """Number of samples that eps*a + (1-eps)*b classifies correctly. a, b: float64 (N, C)."""
    count = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, a.shape[0], n_blocks)
        for n in range(lo, hi):
            if first_argmax_mix(a[n], b[n], eps, 1.0 - eps) == labels[n]:
                count += 1
        blk = claim(counter)
    return count


@kernel
def sum_correct_count_rows(s, p, labels, rows, n_blocks, counter):
    """Number of ``rows`` whose argmax of s[r] + p[r] is labels[r]. s, p: float64 (N, C)."""
    count = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, rows.shape[0], n_blocks)
        for i in range(lo, hi):
            r = rows[i]
            if first_argmax_mix(s[r], p[r], 1.0, 1.0) == labels[r]:
                count += 1
        blk = claim(counter)
    return count


@kernel
def argmax_f16_at(bits, src, order, out, n_blocks, counter):
    """out[e, i] = first argmax of the float16 row bits[e, src[i]] (int16 bits, at most
    0xFFFF classes), read in place (a sample subset of a memmap is not gathered first); -1
    for a row holding inf or nan. bits: int16 (E, M, C); src: int64 (R,); order (R,): the
    order in which rows are read (ascending src: neighbouring reads); out: int32 (E, R).
    Rows of up to 256 classes are taken two at a time by ``_argmax_pair_f16``: the same
    keys, so the same argmax, as ``argmax_f16``'s explicit vectors (not used here)."""
    n_epochs, n_rows = out.shape
    step = 2 if bits.shape[2] <= 256 else 1
    per_epoch = (n_rows + step - 1) // step
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_epochs * per_epoch, n_blocks)
        for j in range(lo, hi):
            e = j // per_epoch
            k0 = (j - e * per_epoch) * step
            i0 = order[k0]
            i1 = order[min(k0 + step - 1, n_rows - 1)]  # i0 itself for wide rows or the last
            out[e, i0], out[e, i1] = _argmax_pair_f16(bits[e, src[i0]], bits[e, src[i1]])
        blk = claim(counter)


@kernel
def argmax_float_at(values, src, order, out, n_blocks, counter):
    """``argmax_f16_at`` for float32/float64 values (E, M, C)."""
    n_epochs, n_rows = out.shape
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_epochs * n_rows, n_blocks)
        for j in range(lo, hi):
            e = j // n_rows
            i = order[j - e * n_rows]
            row = values[e, src[i]]
            best = 0
            best_v = row[0]
            for c in range(1, row.shape[0]):
                if row[c] > best_v:
                    best = c
                    best_v = row[c]
            finite = True
            for c in range(row.shape[0]):
                finite &= np.isfinite(row[c])
            out[e, i] = best if finite else -1
        blk = claim(counter)


@kernel
def row_top(p, labels, pred, top, at_label, n_blocks, counter):
    """Per row of finite p (N, C): pred = first argmax (numpy's rule), top = the max and
    at_label = p[label] (what accuracy, NLL and ECE need, in one parallel pass)."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, p.shape[0], n_blocks)
        for r in range(lo, hi):
            best = 0
            best_v = p[r, 0]
            for c in range(1, p.shape[1]):
                if p[r, c] > best_v:
                    best = c
                    best_v = p[r, c]
            pred[r] = best
            top[r] = best_v
            at_label[r] = p[r, labels[r]]
        blk = claim(counter)
