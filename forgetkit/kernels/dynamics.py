"""Training-dynamics kernel: epochs of stored outputs to the per-sample quantities of data
maps, AUM and label issues (the label's probability, the label's margin over the largest other
class, correctness), optionally adding the epochs' probabilities and log-probabilities to
running totals."""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from .floats import F16_EXP_MASK, to_f64
from .jit import kernel
from .schedule import claim, span
from .softmax import exp_row
from .views import borrow

#: Probabilities below this are taken as this before a log (the smallest normal float64).
TINY = 2.2250738585072014e-308


def _finite(value):
    """Whether one stored value (float16 bits or a float32/64) is finite (numba only)."""


@overload(_finite, inline="always")
def _finite_impl(value):
    if isinstance(value, types.Integer):
        return lambda value: (value & np.int16(0x7FFF)) < F16_EXP_MASK
    return lambda value: np.isfinite(value)


@kernel
def label_margins(values, labels, table, softmax, p, margin, correct, total, total_log,
                  n_blocks, counter):
    """Per epoch e and row r of stored outputs ``values`` (E, N, C) (float16 as int16
    bits), with y = labels[r] and o the largest other class (the lowest index among equals):

    - p[e, r]: the label's probability, ``softmax(values[e, r])[y]`` with the arithmetic of
      ``softmax_rows`` when ``softmax`` (logits), else ``values[e, r, y]`` (probabilities);
    - margin[e, r]: ``values[e, r, y] - values[e, r, o]`` for logits (the AUM margin); for
      probabilities the log-probability margin ``log(p_y) - log(p_o)``, each probability
      raised to at least TINY;
    - correct[e, r]: ``values[e, r, y] > values[e, r, o]``, or equal and ``y < o`` (argmax,
      ties to the lowest index, is the label);
    - total (N, C) float64, unless empty: ``total[r] += `` the row's probabilities, epoch
      after epoch (the arithmetic of ``combine_softmax``'s mean, before its division);
    - total_log (N, C) float64, unless empty: ``total_log[r] += `` the row's
      log-probabilities: ``x - m + log(inv)`` with ``exp_row``'s shift m and 1/sum inv for
      logits, ``log(max(x, TINY))`` for probabilities.

    A block of rows is read epoch after epoch, so each row's totals are summed in epoch
    order: one call over E epochs gives the bits of E calls over one. table: the
    ``f16_exp_table()``. Rows holding inf or nan get p = margin = nan and correct = False
    and are counted; returns their number over all epochs.
    """
    n_epochs, n_rows, n_classes = values.shape
    accumulate = total.shape[0] > 0
    accumulate_log = total_log.shape[0] > 0
    tmp = np.empty(n_classes)
    n_bad = 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_rows, n_blocks)
        for e in range(n_epochs):
            for r in range(lo, hi):
                row = values[e, r]
                y = labels[r]
                other = -1
                best = -np.inf
                finite = True
                for c in range(n_classes):
                    finite = finite and _finite(row[c])
                    v = to_f64(row[c])
                    if c != y and (other < 0 or v > best):
                        best = v
                        other = c
                if not finite:
                    n_bad += 1
                    p[e, r] = np.nan
                    margin[e, r] = np.nan
                    correct[e, r] = False
                    continue
                zy = to_f64(row[y])
                correct[e, r] = zy > best or (zy == best and y < other)
                if softmax:
                    _, shift, inv = exp_row(borrow(row), borrow(tmp), borrow(table))
                    p[e, r] = tmp[y] * inv
                    margin[e, r] = zy - best
                    if accumulate:
                        for c in range(n_classes):
                            total[r, c] += tmp[c] * inv
                    if accumulate_log:
                        log_inv = math.log(inv)
                        for c in range(n_classes):
                            total_log[r, c] += (to_f64(row[c]) - shift) + log_inv
                else:
                    p[e, r] = zy
                    margin[e, r] = math.log(max(zy, TINY)) - math.log(max(best, TINY))
                    if accumulate:
                        for c in range(n_classes):
                            total[r, c] += to_f64(row[c])
                    if accumulate_log:
                        for c in range(n_classes):
                            total_log[r, c] += math.log(max(to_f64(row[c]), TINY))
        blk = claim(counter)
    return n_bad
