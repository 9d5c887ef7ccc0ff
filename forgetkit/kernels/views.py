"""Rows of arrays for the kernels' inner loops, as views that hold no reference.

``x[n]`` in compiled code makes a view that holds a reference to x's buffer: an atomic
increment when it is made and a decrement when it is dropped. Made once per row, these are
a large part of a cheap row's cost, and with several threads on one array every one of them
moves the buffer's reference count between the cores' caches. ``row(x, n)`` and
``row2(x, e, n)`` give the same views (data, shape and strides) with no reference: valid
while ``x`` is, which within a kernel call it is (its arguments outlive its loops). They are
for reading and writing rows inside a kernel, never for returning or keeping them.

numba's cache checks only a kernel's own source file: after editing this module, clear
the kernels' caches (``forgetkit/kernels/__pycache__/*.nbi``, ``*.nbc``).
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array


def _view(context, builder, sig, args, n_index):
    """The codegen of `row` and `row2`: the sub-array at the leading ``n_index`` indices,
    with no meminfo and no parent."""
    array_type = sig.args[0]
    array = make_array(array_type)(context, builder, args[0])
    shapes = cgutils.unpack_tuple(builder, array.shape)
    strides = cgutils.unpack_tuple(builder, array.strides)
    offset = context.get_constant(types.intp, 0)
    for d in range(n_index):
        index = context.cast(builder, args[1 + d], sig.args[1 + d], types.intp)
        offset = builder.add(offset, builder.mul(index, strides[d]))
    base = builder.ptrtoint(array.data, cgutils.intp_t)
    data = builder.inttoptr(builder.add(base, offset), array.data.type)
    out = make_array(sig.return_type)(context, builder)
    populate_array(out, data=data, shape=cgutils.pack_array(builder, shapes[n_index:]),
                   strides=cgutils.pack_array(builder, strides[n_index:]),
                   itemsize=array.itemsize, meminfo=None)
    return out._getvalue()


def _view_type(array, n_index):
    """The type of ``array``'s sub-array at ``n_index`` leading indices."""
    layout = "C" if array.layout == "C" else "A"
    return types.Array(array.dtype, array.ndim - n_index, layout, readonly=not array.mutable,
                       aligned=array.aligned)


@intrinsic
def row(typingctx, array, n):
    """array[n] (array of 2 or more dimensions, n an integer in range: not checked) as a
    view that holds no reference."""
    if not (isinstance(array, types.Array) and array.ndim >= 2
            and isinstance(n, types.Integer)):
        return None
    return _view_type(array, 1)(array, n), lambda c, b, s, a: _view(c, b, s, a, 1)


@intrinsic
def row2(typingctx, array, e, n):
    """array[e, n] (array of 3 or more dimensions, e and n integers in range: not checked)
    as a view that holds no reference."""
    if not (isinstance(array, types.Array) and array.ndim >= 3
            and isinstance(e, types.Integer) and isinstance(n, types.Integer)):
        return None
    return _view_type(array, 2)(array, e, n), lambda c, b, s, a: _view(c, b, s, a, 2)


def _whole(context, builder, sig, args):
    """The codegen of `borrow`."""
    array_type = sig.args[0]
    array = make_array(array_type)(context, builder, args[0])
    out = make_array(sig.return_type)(context, builder)
    populate_array(out, data=array.data, shape=array.shape, strides=array.strides,
                   itemsize=array.itemsize, meminfo=None)
    return out._getvalue()


@intrinsic
def borrow(typingctx, array):
    """``array`` itself as a view that holds no reference: passing it to a function that
    is not inlined costs no reference counts (numba counts a reference to each array
    argument for the call's length)."""
    if not isinstance(array, types.Array):
        return None
    return array(array), _whole
