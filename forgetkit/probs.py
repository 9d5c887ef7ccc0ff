"""Probabilities from logits, in float64, with forgetkit's kernels (the arithmetic every
pass over a run uses)."""

from __future__ import annotations

import numpy as np

from . import kernels
from .errors import ForgetkitError

#: Smallest probability taken before a log (exp underflow can give 0), so logs stay finite.
LOG_FLOOR = 1e-300


def softmax(values, out=None):
    """Softmax over the last axis of (n_samples, n_classes) values, in float64.

    exp(x - max) * (1 / sum(exp(x - max))) with forgetkit's vectorised exp (within 1 ulp of
    the correctly rounded one). float16 is read as raw bits (no float16 arithmetic), and a
    row within [-708, 600] needs no shift: exp(x) * (1 / sum(exp(x))) with exp(x) from a
    table of the 65,536 float16 values.
    Raises ValueError if a value is NaN or inf.
    """
    x = np.ascontiguousarray(values)
    if x.ndim != 2:
        raise ForgetkitError(f"softmax expects (samples, classes); got shape {x.shape}")
    if out is None:
        out = np.empty(x.shape, dtype=np.float64)
    n_bad = kernels.softmax_rows(x, out)
    if n_bad:
        raise ForgetkitError(f"{n_bad} rows hold NaN or inf")
    return out


def mean_softmax(stack, out=None):
    """Mean over the first axis of the softmax of logits ``stack`` (k, n_samples, n_classes):
    the arithmetic of ``total = softmax(s[0]); total += softmax(s[1]); ...; total /= k`` in
    one fused pass. Raises ValueError if a value is NaN or inf."""
    x = np.ascontiguousarray(stack)
    if out is None:
        out = np.empty(x.shape[1:], dtype=np.float64)
    n_bad = kernels.combine_softmax(x, np.arange(x.shape[0]), np.arange(x.shape[1]), out)
    if n_bad:
        raise ForgetkitError(f"{n_bad} rows hold NaN or inf")
    return out
