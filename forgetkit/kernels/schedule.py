"""Dynamic scheduling of the kernels over blocks of rows.

Every kernel splits its rows into ``n_blocks`` blocks and runs on several threads at once
(``jit.run``: the caller's and the pool's), each thread claiming blocks one at a time from
the call's shared counter (one atomic increment)::

    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_rows, n_blocks)
        for i in range(lo, hi):
            ...
        blk = claim(counter)

A fixed, equal share per thread would let the slowest thread set the call's time: one on a
busy core or on a virtual CPU that its host pauses, or one whose rows cost more. So a thread
that starts late or runs slowly claims fewer blocks. Which thread runs a block never changes
a result: per-row results are written in place, and what a thread adds up over its blocks
is integer counts, summed over the threads (exactly, in any order); the one float sum (the
EM pass) is kept per block and added in block order. A thread's sums are made in its own
buffer: rows of one shared array updated row by row would bounce their cache lines between
cores (the EM pass ran 4x slower so). ``python -m bench.bench_schedule`` measures claimed
blocks against fixed shares on loops of equal and of uneven iterations.

numba's cache checks only each kernel's own source file: after editing this module, clear
the kernels' caches (``forgetkit/kernels/__pycache__/*.nbi``, ``*.nbc``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload


@intrinsic
def _fetch_increment(typingctx, counter):
    """counter[0] += 1 as one atomic operation; returns the value before."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        array = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, array_type, array,
                                       [context.get_constant(types.intp, 0)])
        one = context.get_constant(types.int64, 1)
        return builder.atomic_rmw("add", ptr, one, "monotonic")

    return types.int64(counter), codegen


@njit(inline="always")
def new_counter():
    """A block counter (int64 (1,), starting at 0): each call gets a new one from
    ``jit.run``; the tests make their own."""
    return np.zeros(1, dtype=np.int64)


@njit(inline="always")
def span(blk, n, n_blocks):
    """(first, end) of the rows of block ``blk`` of ``n`` rows in ``n_blocks`` blocks."""
    return blk * n // n_blocks, (blk + 1) * n // n_blocks


def claim(counter):
    """The next unclaimed block index (>= the number of blocks when none is left). In
    compiled kernels one atomic increment; this plain version runs them under
    NUMBA_DISABLE_JIT (one thread at a time: the GIL is held)."""
    value = int(counter[0])
    counter[0] += 1
    return value


@overload(claim, inline="always")
def _claim_compiled(counter):
    return lambda counter: _fetch_increment(counter)



# Copying as plain loops: numba's array-to-array slice assignment compiles the text of its
# shape-mismatch error, seconds per kernel. Compiled once per process, shared.
@njit(cache=True)
def store(dst, src):
    """dst[:] = src for 1-D arrays of one length."""
    for j in range(dst.shape[0]):
        dst[j] = src[j]
