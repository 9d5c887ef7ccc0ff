"""Float helpers shared by the kernels (numba only).

float16 data reaches the kernels as its raw int16 bits, because numba has no float16
arithmetic on the CPU: ``f16_key`` maps the bits to an integer key whose order is the order
of the float values (-0.0 and +0.0 share a key), ``f16_to_f64`` converts them exactly.
``key64`` does the same for float64, so that max/min reductions run as integer code (numba's
float reductions do not vectorise).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

F16_EXP_MASK = 0x7C00  # exponent bits all ones: inf or nan


@njit(inline="always")
def f16_key(bits):
    """Order-preserving int16 key of float16 bits, branch-free so the max loop vectorises:
    negatives get their 15 low bits flipped, plus one so that -0.0 and +0.0 share key 0."""
    m = np.int16((bits >> np.int16(15)) & np.int16(0x7FFF))
    return np.int16((bits ^ m) + (m & np.int16(1)))


# numba's float max/min reductions do not vectorise; these loops reduce order-preserving int64
# keys of the float64 bits instead (integer max/min vectorise), with the same results.
_TWO_1008 = 2.0**1008  # float16 exponent bias 15 -> float64 bias 1023
LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)


@njit(inline="always")
def key64(x):
    """Order-preserving int64 key of a float64 (an involution: it also maps keys back)."""
    b = np.float64(x).view(np.int64)
    return b ^ ((b >> np.int64(63)) & LOW63)


@njit(inline="always")
def float_of_key64(key):
    return np.int64(key ^ ((key >> np.int64(63)) & LOW63)).view(np.float64)


@njit(inline="always")
def f16_to_f64(bits):
    """float64 value of finite float16 bits (int16): the 15 low bits shifted into a float64
    whose exponent is off by 2**1008 (subnormals included), then rescaled exactly."""
    b = np.int64(bits)
    f = ((b & np.int64(0x7FFF)) << np.int64(42)) | ((b & np.int64(0x8000)) << np.int64(48))
    return np.int64(f).view(np.float64) * _TWO_1008


@njit(inline="always")
def f16_bits_of_key(key):
    """Inverse of ``f16_key`` (+0.0 for key 0)."""
    if key >= 0:
        return key
    return np.int16((key - np.int16(1)) ^ np.int16(0x7FFF))


def to_f64(value):
    """float64 of one stored value: float16 bits (int16) or a float32/64 (numba only)."""


@overload(to_f64, inline="always")
def _to_f64_impl(value):
    if isinstance(value, types.Integer):
        return lambda value: f16_to_f64(value)
    return lambda value: np.float64(value)


def is_f16(values):
    """Whether ``values`` holds float16 bits (int16), a compile-time constant (numba only)."""


@overload(is_f16, inline="always")
def _is_f16_impl(values):
    is_f16 = isinstance(values.dtype, types.Integer)
    return lambda values: is_f16
