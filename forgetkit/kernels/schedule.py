"""Dynamic scheduling of the block-parallel kernels.

numba's ``prange`` gives each thread one fixed, equal share of the iterations, so the
slowest thread sets the loop's time: one on a busy core or on a virtual CPU that its host
pauses, or one whose rows cost more. So the kernels split their rows into blocks and let
threads claim the blocks one at a time from a shared counter::

    counter = new_counter()
    for _ in prange(n_blocks):          # worker slots: numba gives each thread a share
        ...                             # scratch
        blk = claim(counter)
        while blk < n_blocks:           # a thread's first slot claims blocks until none is
            for i in range(blk * n // n_blocks, (blk + 1) * n // n_blocks):   # left; its
                ...                     # other slots find none
            blk = claim(counter)

Every kernel that takes ``n_blocks`` (and the EM pass, over its fixed blocks) runs so. A
thread that starts late or runs slowly claims fewer blocks. Which thread runs a block
never changes a result: blocks keep their own partial sums, merged in block order. A
block's sums are made in its worker's own buffer and stored once at the block's end:
neighbouring blocks run on different threads, and rows of one shared array updated row by
row would bounce their cache lines between cores (the EM pass ran 4x slower so).
``python -m bench.bench_schedule`` measures both schedules on loops of equal and of uneven
iterations.

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
    """The shared block counter of one parallel loop (int64 (1,), starting at 0)."""
    return np.zeros(1, dtype=np.int64)


def claim(counter):
    """The next unclaimed block index (>= the number of blocks when none is left). In
    compiled kernels one atomic increment; this plain version runs them under
    NUMBA_DISABLE_JIT, where prange is a serial range."""
    value = int(counter[0])
    counter[0] += 1
    return value


@overload(claim, inline="always")
def _claim_compiled(counter):
    return lambda counter: _fetch_increment(counter)



# Merging and copying as plain loops: numba's ``sum(axis=...)`` and array-to-array slice
# assignment (which compiles the text of its shape-mismatch error) each take seconds to
# compile, and every kernel merged its blocks so. Compiled once per process, shared.
@njit(cache=True)
def column_sums(parts):
    """parts.sum(axis=0) of integer (B, K): the blocks' rows added in block order."""
    out = np.zeros(parts.shape[1], dtype=parts.dtype)
    for b in range(parts.shape[0]):
        for j in range(parts.shape[1]):
            out[j] += parts[b, j]
    return out


@njit(cache=True)
def cumulative(x):
    """np.cumsum of integer x (K,)."""
    out = np.empty(x.shape[0], dtype=x.dtype)
    s = 0
    for j in range(x.shape[0]):
        s += x[j]
        out[j] = s
    return out


@njit(cache=True)
def store(dst, src):
    """dst[:] = src for 1-D arrays of one length."""
    for j in range(dst.shape[0]):
        dst[j] = src[j]
