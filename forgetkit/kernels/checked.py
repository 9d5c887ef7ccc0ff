"""The forgetting pass that checksums what it reads: row-wise argmax of float16 outputs (as
``argmax.argmax_f16``) and, in the same loop, the CRC32C of the bytes of the rows just read,
so that verifying a stored run costs no second read of it.

CRC32C runs on the SSE4.2 ``crc32`` instruction (LLVM's ``llvm.x86.sse42.crc32.64.64``)
where the compiling target has it, else on a slicing-by-8 table (same values, several times
slower). A CRC is a chain (each step needs the previous one: 3 cycles per 8 bytes), so each
block of rows is split into four lanes whose chains run side by side; the caller combines
the lanes' CRCs in order (`forgetkit.io.integrity.combine`).
"""

from __future__ import annotations

import os
import platform
import sys

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils, config
from numba.extending import intrinsic

from .argmax import _argmax_pair_f16
from .jit import kernel

#: Row lanes of a block, each with its own CRC chain.
LANES = 4
#: The reflected CRC32C (Castagnoli) polynomial.
POLY = 0x82F63B78


def _table():
    """Slicing-by-8 tables of CRC32C: uint32 (8, 256)."""
    t = np.zeros((8, 256), dtype=np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        t[0, n] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


TABLE = _table()


def hardware_crc():
    """Whether numba compiles for a target with SSE4.2's crc32 instruction (the host CPU
    unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise; FORGETKIT_CRC_SOFTWARE=1
    forces the table, for the tests)."""
    if os.environ.get("FORGETKIT_CRC_SOFTWARE") == "1" or sys.byteorder != "little":
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if config.CPU_FEATURES is not None:
        return "+sse4.2" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME not in (None, "host"):
        return False
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get("sse4.2", False))


HARDWARE = hardware_crc()


def _byte_pointer(context, builder, signature, args):
    """LLVM: the address of byte ``args[1]`` of the data of the array ``args[0]``."""
    data = context.make_array(signature.args[0])(context, builder, args[0]).data
    return builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [args[1]])


@intrinsic
def _load_u64(typingctx, array, offset):
    """The 8 bytes at byte ``offset`` of ``array``'s data as a uint64 (unaligned load)."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        ptr = _byte_pointer(context, builder, signature, args)
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(array, types.intp), codegen


@intrinsic
def _load_u8(typingctx, array, offset):
    """The byte at byte ``offset`` of ``array``'s data."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(_byte_pointer(context, builder, signature, args))

    return types.uint8(array, types.intp), codegen


@intrinsic
def _crc_u64_sse42(typingctx, crc, word):
    sig = types.uint32(types.uint32, types.uint64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i64]),
                                            "llvm.x86.sse42.crc32.64.64")
        out = builder.call(fn, [builder.zext(args[0], i64), args[1]])
        return builder.trunc(out, ir.IntType(32))

    return sig, codegen


@intrinsic
def _crc_u8_sse42(typingctx, crc, byte):
    sig = types.uint32(types.uint32, types.uint8)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [i32, ir.IntType(8)]),
            "llvm.x86.sse42.crc32.32.8")
        return builder.call(fn, args)

    return sig, codegen


def crc_u64_table(crc, word):
    """One 8-byte little-endian word into the (pre-inverted) CRC32C state ``crc``
    (slicing-by-8); what the crc32 instruction computes."""
    x = np.uint64(crc) ^ np.uint64(word)
    out = np.uint32(0)
    for k in range(8):
        out ^= TABLE[7 - k, (x >> np.uint64(8 * k)) & np.uint64(0xFF)]
    return out


def crc_u8_table(crc, byte):
    """One byte into the CRC32C state ``crc``."""
    return np.uint32((np.uint32(crc) >> np.uint32(8)) ^
                     TABLE[0, (np.uint32(crc) ^ np.uint32(byte)) & np.uint32(0xFF)])


if HARDWARE:
    _crc_u64, _crc_u8 = _crc_u64_sse42, _crc_u8_sse42
else:
    _crc_u64 = njit(inline="always")(crc_u64_table)
    _crc_u8 = njit(inline="always")(crc_u8_table)


@njit
def _crc_bytes(crc, data, start, stop):
    """The CRC state ``crc`` continued over the bytes [start, stop) of ``data`` (not
    inlined: it ends a lane, and one compiled copy keeps the kernel quick to compile)."""
    p = start
    while p + 8 <= stop:
        crc = _crc_u64(crc, _load_u64(data, p))
        p += 8
    while p < stop:
        crc = _crc_u8(crc, _load_u8(data, p))
        p += 1
    return crc


@njit
def _argmax_row(row):
    """First argmax of one float16 row (not inlined: a call costs little beside a row of
    more than 256 classes, and one compiled copy keeps the kernel quick to compile)."""
    return _argmax_pair_f16(row, row)[0]


@kernel
def argmax_crc_f16(bits, out, n_blocks, crcs):
    """``argmax.argmax_f16`` of every row of every epoch, and the CRC32C of each lane's bytes.

    bits: int16 (E, N, C) C-contiguous, float16 bits, at most 0xFFFF classes; out: int32
    (E, N), -1 for a row holding inf or nan; crcs: uint32 (E, n_blocks, LANES), the CRC32C
    (standard: initial and final value inverted) of the bytes of each lane. Block b of an
    epoch holds rows [b*N // n_blocks, (b+1)*N // n_blocks); lane j < LANES-1 of a block of
    n rows the q = n // LANES rows from j*q, the last lane the rest. The bytes of an epoch
    are its lanes in order (`lane_bytes`). Rows of up to 256 classes are taken two at a
    time (one from each of two lanes), wider ones one by one, as in ``argmax_f16``.
    """
    n_epochs, n_rows, n_classes = bits.shape
    row = 2 * n_classes
    paired = n_classes <= 256
    for task in prange(n_epochs * n_blocks):
        e = task // n_blocks
        blk = task - e * n_blocks
        lo = blk * n_rows // n_blocks
        hi = (blk + 1) * n_rows // n_blocks
        q = (hi - lo) // LANES
        step = q * row  # bytes between the lanes
        base = (e * n_rows + lo) * row  # the block's first byte
        c0 = c1 = c2 = c3 = np.uint32(0xFFFFFFFF)
        p = base  # lane 0's next byte; lane j's is p + j * step
        for k in range(q):  # rows lo+k, lo+q+k, ... of the lanes
            r = lo + k
            if paired:
                out[e, r], out[e, r + q] = _argmax_pair_f16(bits[e, r], bits[e, r + q])
                out[e, r + 2 * q], out[e, r + 3 * q] = _argmax_pair_f16(bits[e, r + 2 * q],
                                                                        bits[e, r + 3 * q])
            else:
                for j in range(LANES):
                    out[e, r + j * q] = _argmax_row(bits[e, r + j * q])
            stop = base + (k + 1) * row
            while p + 8 <= stop:
                c0 = _crc_u64(c0, _load_u64(bits, p))
                c1 = _crc_u64(c1, _load_u64(bits, p + step))
                c2 = _crc_u64(c2, _load_u64(bits, p + 2 * step))
                c3 = _crc_u64(c3, _load_u64(bits, p + 3 * step))
                p += 8
        for r in range(lo + LANES * q, hi):  # the last lane's rest (fewer than LANES rows)
            out[e, r] = _argmax_row(bits[e, r])
        end = base + step  # lane 0's end
        c0 = _crc_bytes(c0, bits, p, end)
        c1 = _crc_bytes(c1, bits, p + step, end + step)
        c2 = _crc_bytes(c2, bits, p + 2 * step, end + 2 * step)
        c3 = _crc_bytes(c3, bits, p + 3 * step, base + (hi - lo) * row)
        crcs[e, blk, 0] = ~c0
        crcs[e, blk, 1] = ~c1
        crcs[e, blk, 2] = ~c2
        crcs[e, blk, 3] = ~c3


def lane_bytes(n_rows, n_classes, n_blocks):
    """Bytes of each lane of `argmax_crc_f16`'s blocks: int64 (n_blocks, LANES)."""
    out = np.zeros((n_blocks, LANES), dtype=np.int64)
    for blk in range(n_blocks):
        n = (blk + 1) * n_rows // n_blocks - blk * n_rows // n_blocks
        q = n // LANES
        out[blk, :LANES - 1] = q
        out[blk, LANES - 1] = n - (LANES - 1) * q
    return out * 2 * n_classes
