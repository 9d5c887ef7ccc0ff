"""Exact numpy twins of kernels, for calls too small to pay a compile.

A first run compiles every kernel it calls (0.3 to 6 s of CPU each, see ``jit``), where the
work of a call on a sample-sized run takes milliseconds. So the kernels of the Knowledge
Fusion fit, of `compare` and of the training dynamics' pass (label probabilities and
margins) have numpy twins here that give the same bits, by construction:

- they run the kernel's arithmetic operation by operation (numpy's elementwise float
  operations round as the kernels' do: none of these kernels contracts to fused
  multiply-adds; a log is the C library's, as the kernels call it), and the reductions
  they take are exact (max, argmax, integer keys);
- the one order-dependent reduction, the float16 softmax's row sum (``softmax.lane_sum``, in
  vector lanes), is that same compiled function, called from `row_sums` (a few tenths of a
  second to compile);
- the eps search counts, on the rows whose result is not decided at once, the brute-force
  arithmetic at every grid point, which is what the kernel's counts equal (tested).

A twin returns None where it does not apply (float32/64 softmaxes, whose exp the kernels
compute with fused multiply-adds; float16 rows outside the exp table; a grid too large to
check by brute force), and the caller then runs the kernel. `jit.use_twin` says when a
call takes its twin: calls below ``jit.TWIN_WORK`` whose kernel build is not compiled yet.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .floats import LOW63
from .softmax import lane_sum
from .views import row

#: Most float64 entries the eps search's twin evaluates at once (grid points x undecided
#: rows x classes); beyond ``GRID_WORK`` in all it leaves the call to the kernel.
_GRID_CHUNK = 1 << 20
GRID_WORK = 1 << 23


@njit(cache=True)
def row_sums(x, out):
    """out[r] = ``softmax.lane_sum(x[r])`` for x (R, C) float64: the row sums of the float16
    softmax, in the kernels' order."""
    for r in range(x.shape[0]):
        out[r] = lane_sum(row(x, r))


def _table_exp(bits, table):
    """(exp (R, C) of float16 bits (R, C) from the exp table, the row sums (R,)), or None
    if a row holds a value outside the table (the kernels take their shifted exp there)."""
    e = table[bits.view(np.uint16)]
    s = np.empty(e.shape[0])
    row_sums(e, s)
    return None if np.isnan(s).any() else (e, s)


def softmax_rows(values, table, out):
    """``softmax.softmax_rows`` of stored values (R, C) into out, in place; 0 (rows with
    inf or nan are outside the table), or None unless every row is float16 within the
    table (out then undefined, as the kernel leaves it for such rows)."""
    if values.dtype != np.int16:
        return None
    np.take(table, values.view(np.uint16), out=out)
    s = np.empty(out.shape[0])
    row_sums(out, s)
    if np.isnan(s).any():
        return None
    out *= (1.0 / s)[:, None]
    return 0


def label_probs(values, src, labels, table, out, n_blocks):
    """``softmax.label_probs``: out[i] = softmax(values[src[i]])[labels[i]]; 0, or None
    unless every row is float16 within the table."""
    if values.dtype != np.int16:
        return None
    exp = _table_exp(values[src], table)
    if exp is None:
        return None
    out[...] = exp[0][np.arange(len(src)), labels] * (1.0 / exp[1])
    return 0


def label_margins(values, labels, table, softmax, p, margin, correct, total, total_log,
                  n_blocks):
    """``dynamics.label_margins`` of epochs of float16 logits (E, N, C) within the exp table
    (shift 0: the log-probabilities are x + log(inv), with the C library's log as the
    kernels call it), totals added epoch after epoch; 0, or None (nothing written) for
    probabilities, float32/64 and rows outside the table."""
    if values.dtype != np.int16 or not softmax:
        return None
    exps = [_table_exp(epoch, table) for epoch in values]
    if any(exp is None for exp in exps):
        return None
    rows = np.arange(values.shape[1])
    for e, exp in enumerate(exps):
        inv = 1.0 / exp[1]
        x = values[e].view(np.float16).astype(np.float64)
        others = x.copy()
        others[rows, labels] = -np.inf
        other = others.argmax(axis=1)  # the lowest index among equals, as the kernel's
        best, zy = others[rows, other], x[rows, labels]
        correct[e] = (zy > best) | ((zy == best) & (labels < other))
        p[e] = exp[0][rows, labels] * inv
        margin[e] = zy - best
        if total.shape[0]:
            total += exp[0] * inv[:, None]
        if total_log.shape[0]:
            log_inv = np.array([math.log(v) for v in inv.tolist()])
            total_log += (x - 0.0) + log_inv[:, None]
    return 0


def combine_softmax(values, epochs, weights, rows, order, table, out, accumulate, n_blocks):
    """``softmax.combine_softmax`` (mean or weighted sum of the epochs' softmaxes of rows of
    values (E, M, C), added in epoch order) into out; 0, or None unless float16 within the
    table (out then untouched). The order of reading rows does not change a result."""
    if values.dtype != np.int16:
        return None
    mean = weights.shape[0] == 0
    total = None
    for j, e in enumerate(epochs):
        exp = _table_exp(values[e][rows], table)
        if exp is None:
            return None
        term = exp[0] * (1.0 / exp[1])[:, None]
        if not mean:
            term = weights[j] * term
        if total is None:
            total = (out + term) if accumulate else (0.0 + term)
        else:
            total += term
    if mean:
        total /= len(epochs)
    out[...] = total
    return 0


def _keys(p):
    """Order-preserving int64 keys of float64 p (``floats.key64``)."""
    bits = p.view(np.int64)
    return bits ^ ((bits >> np.int64(63)) & LOW63)


def label_leads(p, labels, lead, magnitude, top, correct):
    """``eps_search.label_leads`` of finite float64 p (N, C) into the (N,) arrays."""
    if p.shape[0] == 0:  # no row (a top-k chunk whose every token settled: (0, 0))
        return correct
    rows = np.arange(p.shape[0])
    keys = _keys(p)
    keys[rows, labels] = _keys(np.array([-np.inf]))[0]
    other = _keys(keys.max(axis=1)).view(np.float64)  # key64 is its own inverse
    lead[...] = p[rows, labels] - other
    magnitude[...] = (p.view(np.int64) & LOW63).max(axis=1).view(np.float64)
    tie = p == other[:, None]
    tie[rows, labels] = False
    top[...] = np.where((lead <= 0.0) & tie.any(axis=1), tie.argmax(axis=1), -1)
    correct[...] = (lead > 0.0) | ((lead == 0.0) & (top > labels))
    return correct


def mix_into(a, b, eps, labels, lead, magnitude, top, correct):
    """``eps_search.mix_into``: `mix`, then `label_leads` of the new b."""
    mix(a, b, eps)
    return label_leads(b, labels, lead, magnitude, top, correct)


def mix(a, b, eps):
    """b <- eps*a + (1-eps)*b in place (``eps_search.mix``)."""
    one_minus = 1.0 - eps
    t = a * eps
    b *= one_minus
    b += t
    return b


def grid_correct_counts(a, b, labels, b_lead, b_magnitude, b_top, grid, rel_band, n_blocks):
    """``eps_search.grid_correct_counts``: the samples decided at once as the kernel decides
    them, the others by the brute-force arithmetic at every grid point. None where that is
    more than ``GRID_WORK`` entries."""
    n, n_classes = a.shape
    a_lead, a_magnitude = np.empty(n), np.empty(n)
    label_leads(a, labels, a_lead, a_magnitude, np.empty(n, np.int64), np.empty(n, bool))
    band = rel_band * np.maximum(a_magnitude, b_magnitude)
    rows = np.arange(n)
    wins = (a_lead > band) & (b_lead > band)
    loses = (b_lead < -band) & (a_lead < -band) & (a[rows, b_top] - a[rows, labels] > band)
    undecided = np.flatnonzero(~wins & ~loses)
    if undecided.size * grid.shape[0] * n_classes > GRID_WORK:
        return None
    counts = np.full(grid.shape[0], np.count_nonzero(wins), dtype=np.int64)
    ua, ub, uy = a[undecided], b[undecided], labels[undecided]
    step = max(1, _GRID_CHUNK // max(1, undecided.size * n_classes))
    for g0 in range(0, grid.shape[0], step):
        eps = grid[g0: g0 + step, None, None]
        mixed = eps * ua + (1.0 - eps) * ub
        counts[g0: g0 + step] += (mixed.argmax(axis=2) == uy).sum(axis=1)
    return counts


def row_top(p, labels, pred, top, at_label):
    """``argmax.row_top``: first argmax, max and label value of each row of finite p."""
    rows = np.arange(p.shape[0])
    pred[...] = p.argmax(axis=1)
    top[...] = p[rows, pred]
    at_label[...] = p[rows, labels]
    return pred


def mean_first_axis(stack, out):
    """``softmax.mean_first_axis``: summed in order, then divided by k."""
    total = stack[0].copy()
    for i in range(1, stack.shape[0]):
        total += stack[i]
    return np.divide(total, stack.shape[0], out=out)


def add_into(total, p):
    """``selection.add_into``: total += p."""
    total += p
    return total


def class_max(probs, out):
    """``selection.class_max``: each class's largest probability over the epochs (finite,
    non-negative values: the max has one set of bits)."""
    return np.max(probs, axis=0, out=out)


def live_rows(total, labels, bound, slack, order):
    """``selection.live_rows``: (live rows in the order of ``order``, cand_ptr, cand, the
    number of rows right for every vector added)."""
    t = total[order]
    y = labels[order]
    top = t.max(axis=1)
    candidate = t + bound[order] >= (top - slack)[:, None]
    count = candidate.sum(axis=1)
    at = np.arange(order.shape[0])
    live = candidate[at, y] & (count > 1)
    always = ~live & (count == 1) & (t.argmax(axis=1) == y)
    ptr = np.zeros(np.count_nonzero(live) + 1, dtype=np.int64)
    np.cumsum(count[live], out=ptr[1:])
    cand = np.nonzero(candidate[live])[1].astype(np.int64)  # ascending within each row
    return order[live], ptr, cand, np.int64(np.count_nonzero(always))


def selection_cached_counts(probs, total, rows, labels, cand_ptr, cand, n_blocks):
    """``selection.selection_cached_counts``: per epoch, the rows whose first argmax of
    total + probs[e] (over the row's candidates, unless none or more than C/2) is the
    label. int64 (E,)."""
    n_classes = total.shape[1]
    n = np.diff(cand_ptr)
    keep = np.ones((rows.shape[0], n_classes), dtype=bool)
    listed = (n > 0) & (2 * n <= n_classes)
    keep[listed] = False
    keep[np.repeat(np.arange(rows.shape[0]), n)[np.repeat(listed, n)],
         cand[np.repeat(listed, n)]] = True
    sums = np.where(keep, total[rows] + probs[:, rows], -np.inf)  # (E, R, C)
    return np.count_nonzero(sums.argmax(axis=2) == labels[rows], axis=1).astype(np.int64)


def mixture_correct_count(a, b, labels, eps):
    """``argmax.mixture_correct_count``: rows whose first argmax of eps*a + (1-eps)*b is
    the label."""
    return int(np.count_nonzero((eps * a + (1.0 - eps) * b).argmax(axis=1) == labels))
