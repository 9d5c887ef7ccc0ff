"""The forgetting pass that checksums what it reads: row-wise argmax of float16 outputs (as
``argmax.argmax_f16``) and, in the same loop, the CRC32C of the bytes of the rows just read,
so that verifying a stored run costs no second read of it.

CRC32C runs on the SSE4.2 ``crc32`` instruction (LLVM's ``llvm.x86.sse42.crc32.*``) where
the compiling target has it, else on a slicing-by-8 table (same values, several times
slower). A CRC is a chain (each step needs the previous one: 3 cycles per 8 bytes, one
instruction per cycle), so each block of rows is split into four lanes whose chains run side
by side; rows of at least ``INLOOP_STEPS`` vector steps feed them inside the argmax's vector
loop (`simd.rows_max_crc_f16`), where their scalar work overlaps the vector work; the caller
combines the lanes' CRCs in order (`forgetkit.io.integrity.combine_lanes`).
"""

from __future__ import annotations

import os
import platform
import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, config
from numba.extending import intrinsic

from .jit import kernel
from .schedule import claim, span
from .simd import WIDTH, finish_row, rows_max_crc_f16, rows_max_f16

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


def _loader(bits):
    """An intrinsic: the ``bits``-bit word at byte ``offset`` of ``array``'s data, unsigned
    (an unaligned load)."""
    out = getattr(types, f"uint{bits}")

    def typer(typingctx, array, offset):
        if not isinstance(array, types.Array):
            return None

        def codegen(context, builder, signature, args):
            ptr = _byte_pointer(context, builder, signature, args)
            return builder.load(builder.bitcast(ptr, ir.IntType(bits).as_pointer()), align=1)

        return out(array, types.intp), codegen

    return intrinsic(typer)


_load_u64, _load_u32, _load_u16 = (_loader(n) for n in (64, 32, 16))


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


def _crc_narrow_sse42(bits):
    """An intrinsic: ``crc`` continued over a ``bits``-bit word (SSE4.2 crc32, 32 or 16)."""
    def typer(typingctx, crc, word):
        sig = types.uint32(types.uint32, getattr(types, f"uint{bits}"))

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(i32, [i32, ir.IntType(bits)]),
                f"llvm.x86.sse42.crc32.32.{bits}")
            return builder.call(fn, args)

        return sig, codegen

    return intrinsic(typer)


_crc_u32_sse42, _crc_u16_sse42 = _crc_narrow_sse42(32), _crc_narrow_sse42(16)


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


def crc_u32_table(crc, word):
    """A 4-byte little-endian word into the CRC32C state ``crc``."""
    for k in range(4):
        crc = _crc_u8(crc, (np.uint32(word) >> np.uint32(8 * k)) & np.uint32(0xFF))
    return crc


def crc_u16_table(crc, word):
    """A 2-byte little-endian word into the CRC32C state ``crc``."""
    for k in range(2):
        crc = _crc_u8(crc, (np.uint32(word) >> np.uint32(8 * k)) & np.uint32(0xFF))
    return crc


_crc_u8 = njit(inline="always")(crc_u8_table)  # (the 4- and 2-byte table steps use it)
if HARDWARE:
    _crc_u64, _crc_u32, _crc_u16 = _crc_u64_sse42, _crc_u32_sse42, _crc_u16_sse42
else:
    _crc_u64, _crc_u32, _crc_u16 = (njit(inline="always")(f) for f in (
        crc_u64_table, crc_u32_table, crc_u16_table))


@njit(inline="always")
def _crc_tail(crc, data, start, stop):
    """The CRC state ``crc`` continued over the bytes [start, stop) of ``data``, fewer than
    8 and an even number: at most one 4-byte and one 2-byte word."""
    if start + 4 <= stop:
        crc = _crc_u32(crc, _load_u32(data, start))
        start += 4
    if start + 2 <= stop:
        crc = _crc_u16(crc, _load_u16(data, start))
    return crc


#: Vector steps (8 classes each) from which a row's CRC runs in the vector loop itself (64
#: classes). Shorter rows pay more for finishing each row's chain after the loop than the
#: overlap saves (C = 10: 0.79 against 0.52 s/GB CPU, one thread; C = 100: 0.145 against
#: 0.156; C = 1,000: 0.117 against 0.141).
INLOOP_STEPS = 8


@njit(inline="always")
def _crc_words(crc, data, start, stop):
    """The CRC state ``crc`` continued over the whole 8-byte words of ``data`` from byte
    ``start`` while they end by ``stop``. Returns (state, the byte after the last word)."""
    while start + 8 <= stop:
        crc = _crc_u64(crc, _load_u64(data, start))
        start += 8
    return crc, start


@njit(inline="always")
def _crc_row_rest(crc, row, start):
    """The CRC state ``crc`` continued over the bytes of the int16 ``row`` from byte
    ``start`` on."""
    stop = 2 * row.shape[0]
    crc, start = _crc_words(crc, row, start, stop)
    return _crc_tail(crc, row, start, stop)


if HARDWARE:
    _rows_max_crc = rows_max_crc_f16
else:
    @njit(inline="always")
    def _rows_max_crc(row0, row1, row2, row3, steps, crcs):
        """`simd.rows_max_crc_f16` with the table: the max, then each row's CRC."""
        best, most = rows_max_f16(row0, row1, row2, row3, steps)
        n = 2 * WIDTH * steps
        return best, most, (_crc_words(crcs[0], row0, 0, n)[0],
                            _crc_words(crcs[1], row1, 0, n)[0],
                            _crc_words(crcs[2], row2, 0, n)[0],
                            _crc_words(crcs[3], row3, 0, n)[0])


@kernel
def argmax_crc_f16(bits, out, crc_blocks, crcs, n_blocks, counter):
    """``argmax.argmax_f16`` of every row of every epoch, and the CRC32C of each lane's bytes.

    bits: int16 (E, N, C) C-contiguous, float16 bits, at most 0xFFFF classes; out: int32
    (E, N), -1 for a row holding inf or nan; crcs: uint32 (E, crc_blocks, LANES), the CRC32C
    (standard: initial and final value inverted) of the bytes of each lane. Block b of an
    epoch holds rows [b*N // crc_blocks, (b+1)*N // crc_blocks); lane j < LANES-1 of a block of
    n rows the q = n // LANES rows from j*q, the last lane the rest. The bytes of an epoch
    are its lanes in order (`lane_bytes`). Row k of each of the four lanes is taken together
    by `simd.rows_max_f16` (the argmax of ``argmax_f16``); each lane has its own crc32 chain
    (four independent chains: their latency overlaps). Rows of at least ``INLOOP_STEPS``
    vector steps feed their chains in the vector loop itself (`simd.rows_max_crc_f16`: the
    scalar crc32 work runs beside the vector work; without SSE4.2, the table after the
    loop), the bytes past the last step after it; shorter rows continue each chain after
    the rows over the whole 8-byte words read so far (words cross rows: no per-row rest).
    The threads claim the E * crc_blocks (epoch, block) pairs in ``n_blocks`` groups.
    """
    n_epochs, n_rows, n_classes = bits.shape
    row = 2 * n_classes
    steps = n_classes // WIDTH
    start = steps * WIDTH  # the first class past the vector steps
    inloop = steps >= INLOOP_STEPS
    claimed = claim(counter)
    while claimed < n_blocks:
        first, end_task = span(claimed, n_epochs * crc_blocks, n_blocks)
        for task in range(first, end_task):
            e = task // crc_blocks
            blk = task - e * crc_blocks
            lo = blk * n_rows // crc_blocks
            hi = (blk + 1) * n_rows // crc_blocks
            q = (hi - lo) // LANES
            step = q * row  # bytes between the lanes
            base = (e * n_rows + lo) * row  # the block's first byte
            c0 = c1 = c2 = c3 = np.uint32(0xFFFFFFFF)
            p = base  # lane 0's next byte to checksum; lane j's is p + j * step
            for k in range(q):  # row k of each lane
                r = lo + k
                row0, row1, row2, row3 = (bits[e, r], bits[e, r + q], bits[e, r + 2 * q],
                                          bits[e, r + 3 * q])
                if inloop:
                    best, most, chains = _rows_max_crc(row0, row1, row2, row3, steps,
                                                       (c0, c1, c2, c3))
                    c0 = _crc_row_rest(chains[0], row0, 2 * start)
                    c1 = _crc_row_rest(chains[1], row1, 2 * start)
                    c2 = _crc_row_rest(chains[2], row2, 2 * start)
                    c3 = _crc_row_rest(chains[3], row3, 2 * start)
                    p += row
                else:
                    best, most = rows_max_f16(row0, row1, row2, row3, steps)
                    stop = base + (k + 1) * row
                    while p + 8 <= stop:
                        c0 = _crc_u64(c0, _load_u64(bits, p))
                        c1 = _crc_u64(c1, _load_u64(bits, p + step))
                        c2 = _crc_u64(c2, _load_u64(bits, p + 2 * step))
                        c3 = _crc_u64(c3, _load_u64(bits, p + 3 * step))
                        p += 8
                out[e, r] = finish_row(row0, best[0], most[0], start)
                out[e, r + q] = finish_row(row1, best[1], most[1], start)
                out[e, r + 2 * q] = finish_row(row2, best[2], most[2], start)
                out[e, r + 3 * q] = finish_row(row3, best[3], most[3], start)
            end = base + step  # lane 0's end
            c0 = _crc_tail(c0, bits, p, end)
            c1 = _crc_tail(c1, bits, p + step, end + step)
            c2 = _crc_tail(c2, bits, p + 2 * step, end + 2 * step)
            p += 3 * step  # the last lane: its remainder, then its rest (fewer than LANES rows)
            for r in range(lo + LANES * q, hi):
                out[e, r] = finish_row(bits[e, r], np.int32(-2147483648), np.int16(0), 0)
            end = base + (hi - lo) * row
            c3, p = _crc_words(c3, bits, p, end)
            c3 = _crc_tail(c3, bits, p, end)
            crcs[e, blk, 0] = ~c0
            crcs[e, blk, 1] = ~c1
            crcs[e, blk, 2] = ~c2
            crcs[e, blk, 3] = ~c3
        claimed = claim(counter)


def lane_bytes(n_rows, n_classes, n_blocks):
    """Bytes of each lane of `argmax_crc_f16`'s blocks: int64 (n_blocks, LANES)."""
    out = np.zeros((n_blocks, LANES), dtype=np.int64)
    for blk in range(n_blocks):
        n = (blk + 1) * n_rows // n_blocks - blk * n_rows // n_blocks
        q = n // LANES
        out[blk, :LANES - 1] = q
        out[blk, LANES - 1] = n - (LANES - 1) * q
    return out * 2 * n_classes
