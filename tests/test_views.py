"""kernels.views: rows and arrays without reference counts are the same views as numpy's
indexing (data, shape, strides), on C, Fortran, strided and read-only arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from forgetkit.kernels.views import borrow, row, row2


@njit(cache=True)
def _row_copy(x, n):
    return row(x, n).copy()


@njit(cache=True)
def _row2_copy(x, e, n):
    return row2(x, e, n).copy()


@njit(cache=True)
def _borrow_copy(x):
    return borrow(x).copy()


@njit(cache=True)
def _write_row(x, n):
    r = row(x, n)
    for c in range(r.shape[0]):
        r[c] = -c


def _layouts(x):
    """x as C, Fortran, strided (every other row and column), read-only."""
    read_only = x.copy()
    read_only.flags.writeable = False
    return [x, np.asfortranarray(x), x[::2, ..., ::2], read_only]


@settings(max_examples=30, deadline=None)
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(1, 7)),
       seed=st.integers(0, 2**31))
def test_views_equal_numpys_indexing(shape, seed):
    rng = np.random.default_rng(seed)
    cube = rng.normal(size=shape)
    for x in _layouts(cube):
        for e in range(x.shape[0]):
            assert np.array_equal(_row_copy(x, e), x[e])
            for n in range(x.shape[1]):
                assert np.array_equal(_row2_copy(x, e, n), x[e, n])
        assert np.array_equal(_borrow_copy(x), x)
    for x in _layouts(cube[0]):
        for n in range(x.shape[0]):
            assert np.array_equal(_row_copy(x, n), x[n])


def test_a_row_writes_into_its_array():
    x = np.zeros((3, 4))
    _write_row(x, 1)
    assert x.tolist() == [[0.0] * 4, [0.0, -1.0, -2.0, -3.0], [0.0] * 4]
    strided = np.zeros((4, 6))[:, ::2]
    _write_row(strided, 2)
    assert strided[2].tolist() == [0.0, -1.0, -2.0] and strided[[0, 1, 3]].sum() == 0.0
