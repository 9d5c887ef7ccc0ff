"""Verification by the forgetting pass itself: the kernel that takes the row argmax of
float16 outputs and, in the same loop, the CRC32C of what it reads (kernels/checked.py), the
CRC combination it needs, and `fk.load`, which keeps that pass's predictions."""

import os
import subprocess
import sys

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import forgetkit as fk
from forgetkit import kernels
from forgetkit.io import integrity
from forgetkit.kernels import checked

from .test_parallel_kernels import argmax_reference, f16_with_specials

SIZES = [0, 1, 3, 7, 8, 9, 15, 16, 17, 255, 4096, 65537]


def test_combine_gives_the_crc32c_of_the_concatenation():
    rng = np.random.default_rng(0)
    for len_a in SIZES:
        for len_b in SIZES:
            a = rng.integers(0, 256, len_a, dtype=np.uint8).tobytes()
            b = rng.integers(0, 256, len_b, dtype=np.uint8).tobytes()
            assert integrity.combine_lanes([[crc32c.crc32c(a), crc32c.crc32c(b)]],
                                           [len_a, len_b]).tolist() == \
                [crc32c.crc32c(a + b)], (len_a, len_b)
    data = rng.integers(0, 256, (3, 1000), dtype=np.uint8)  # rows cut into uneven pieces
    cuts = [0, 0, 1, 8, 9, 500, 1000]
    parts = [[crc32c.crc32c(row[i:j].tobytes()) for i, j in zip(cuts, cuts[1:], strict=False)]
             for row in data]
    got = integrity.combine_lanes(parts, np.diff(cuts))
    assert got.tolist() == [crc32c.crc32c(row.tobytes()) for row in data]


def test_the_table_steps_equal_the_crc32c_package():
    """The slicing-by-8 fallback (targets without SSE4.2), step by step in Python."""
    rng = np.random.default_rng(1)
    for n in SIZES[:-1]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        state, p = np.uint32(0xFFFFFFFF), 0
        while p + 8 <= n:
            state = checked.crc_u64_table(state, int.from_bytes(data[p: p + 8], "little"))
            p += 8
        for byte in data[p:]:
            state = checked.crc_u8_table(state, byte)
        assert int(~state) == crc32c.crc32c(data), n


def pass_of(values):
    out = np.full(values.shape[:2], -7, dtype=np.int32)
    parts, lengths = kernels.argmax_crc(values, out)
    return out, integrity.combine_lanes(parts, lengths).tolist()


@pytest.mark.parametrize("build", ["serial", "parallel"])
@pytest.mark.parametrize("n_classes", [2, 3, 5, 100, 256, 257, 1000])
def test_the_checksumming_pass_gives_argmax_and_the_crc32c_of_each_epoch(build, n_classes):
    # odd class counts make rows that are not a multiple of 8 bytes; sample counts below and
    # around the lanes (4) and blocks; ties, inf and nan
    with kernels.forced(build):
        for n_samples in (1, 3, 4, 5, 37, 301):
            values = f16_with_specials((3, n_samples, n_classes), n_classes + n_samples)
            out, crcs = pass_of(values)
            np.testing.assert_array_equal(out, argmax_reference(values, np.arange(n_samples)))
            assert crcs == [crc32c.crc32c(values[e].tobytes()) for e in range(3)]


def placed(values, offset):
    """A copy of float16 ``values`` whose data starts ``offset`` bytes past an 8-byte
    boundary (the kernels read 8-byte words at any address)."""
    buffer = np.zeros(values.nbytes + 16, dtype=np.uint8)
    start = (-buffer.ctypes.data) % 8 + offset
    out = buffer[start: start + values.nbytes].view(np.float16).reshape(values.shape)
    out[...] = values
    return out


@given(st.integers(1, 3), st.integers(0, 70), st.integers(1, 80), st.sampled_from([0, 2, 4, 6]),
       st.integers(1, 9), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_the_pass_equals_crc32c_and_numpy_for_any_shape_block_and_address(
        n_epochs, n_samples, n_classes, offset, n_blocks, seed):
    """Class counts on both sides of `checked.INLOOP_STEPS` (the CRC in the vector loop or
    after it), rows that end inside an 8-byte word, blocks and lanes of any size (including
    empty ones), data at every even address mod 8: the combined CRCs are crc32c's of each
    epoch, the predictions numpy's."""
    shape = (n_epochs, n_samples, n_classes)
    values = placed(f16_with_specials(shape, seed % 1000) if n_samples else
                    np.zeros(shape, np.float16), offset)
    rng = np.random.default_rng(seed)
    values.reshape(-1)[:] = np.where(rng.random(values.size) < 0.5, values.reshape(-1),
                                     rng.normal(size=values.size).astype(np.float16))
    out = np.full((n_epochs, n_samples), -7, dtype=np.int32)
    parts = np.empty((n_epochs, n_blocks, checked.LANES), dtype=np.uint32)
    checked.argmax_crc_f16(kernels.source(values), out, n_blocks, parts)
    got = integrity.combine_lanes(parts.reshape(n_epochs, -1),
                                  checked.lane_bytes(n_samples, n_classes, n_blocks))
    assert got.tolist() == [crc32c.crc32c(values[e].tobytes()) for e in range(n_epochs)]
    np.testing.assert_array_equal(out, argmax_reference(values, np.arange(n_samples)))
    flat = np.full(n_epochs * n_samples, -7, dtype=np.int32)  # the plain pass: the same
    kernels.argmax_rows(values.reshape(-1, n_classes), flat)
    np.testing.assert_array_equal(flat.reshape(out.shape), out)


@given(st.lists(st.binary(max_size=40), max_size=40), st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_combining_any_pieces_gives_the_crc32c_of_their_concatenation(pieces, n_rows):
    rows = [[p[::-1] if r % 2 else p for p in pieces] for r in range(n_rows)]
    got = integrity.combine_lanes([[crc32c.crc32c(p) for p in row] for row in rows],
                                  [len(p) for p in pieces])
    assert got.tolist() == [crc32c.crc32c(b"".join(row)) for row in rows]


def test_the_table_build_gives_the_same_pass(tmp_path):
    """The whole kernel with the slicing-by-8 table (FORGETKIT_CRC_SOFTWARE=1, a fresh numba
    cache so that the instruction's build is not loaded), serial build, in a subprocess."""
    code = (
        "import numpy as np, crc32c\n"
        "from forgetkit import kernels\n"
        "from forgetkit.io import integrity\n"
        "from forgetkit.kernels import checked\n"
        "assert not checked.HARDWARE\n"
        "rng = np.random.default_rng(0)\n"
        "for c in (3, 10, 100):\n"
        "    x = rng.normal(size=(2, 37, c)).astype(np.float16)\n"
        "    out = np.empty((2, 37), np.int32)\n"
        "    with kernels.forced('serial'):\n"
        "        parts, lengths = kernels.argmax_crc(x, out)\n"
        "    assert (out == np.argmax(x, axis=2)).all()\n"
        "    assert integrity.combine_lanes(parts, lengths).tolist() == "
        "[crc32c.crc32c(x[e].tobytes()) for e in range(2)]\n"
        "print('ok')\n")
    env = dict(os.environ, FORGETKIT_CRC_SOFTWARE="1", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def f16_run(seed=0, kind="logits", n_epochs=4, n_samples=50, n_classes=7):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n_epochs, n_samples, n_classes))
    if kind == "probs":
        values = np.exp(values) / np.exp(values).sum(axis=2, keepdims=True)
    return fk.Run(values.astype(np.float16), rng.integers(0, n_classes, n_samples),
                  kind=kind, epochs=list(range(2, 2 + n_epochs)))


def test_a_verified_load_keeps_the_predictions_of_the_pass_that_verified_it(tmp_path,
                                                                           monkeypatch):
    run = f16_run()
    path = tmp_path / "r.npy"
    fk.save(run, path)
    expected = run.predictions()
    plain = fk.load(path, verify=False).predictions()  # the pass of an unverified load
    np.testing.assert_array_equal(plain, expected)

    def no_second_read(*args, **kwargs):
        raise AssertionError("the forgetting pass read the run again")

    monkeypatch.setattr(kernels, "argmax_rows", no_second_read)
    monkeypatch.setattr(integrity, "bad_epochs", no_second_read)
    integrity.forget_verified(path)
    loaded = fk.load(path)
    np.testing.assert_array_equal(loaded.predictions(), expected)
    assert not loaded.predictions().flags.writeable
    np.testing.assert_array_equal(fk.forget_fraction(loaded), fk.forget_fraction(run))
    monkeypatch.undo()
    again = fk.load(path)  # unchanged, verified in this process: not read at load
    assert again.cache.predictions is None
    np.testing.assert_array_equal(again.predictions(), expected)


def test_a_flipped_byte_of_a_float16_run_is_refused_naming_the_epoch(tmp_path):
    run = f16_run(n_samples=33, n_classes=5)  # rows of 10 bytes: words cross rows
    path = tmp_path / "r.npy"
    fk.save(run, path)
    original = path.read_bytes()
    epoch_bytes = 33 * 5 * 2
    header = len(original) - 4 * epoch_bytes
    for e in range(4):
        for where in (0, 7, 8, 9, epoch_bytes // 2, epoch_bytes - 1):
            data = bytearray(original)
            data[header + e * epoch_bytes + where] ^= 0x04
            path.write_bytes(bytes(data))
            integrity.forget_verified(path)
            with pytest.raises(fk.errors.CorruptFileError,
                               match=rf"epoch {e + 2} \(index {e}\) does not match"):
                fk.load(path)
    path.write_bytes(original)
    np.testing.assert_array_equal(fk.load(path).predictions(), run.predictions())


def test_nan_in_a_run_checked_per_read_is_still_named_by_the_pass(tmp_path, monkeypatch):
    """A run large enough to be checked per read loads with a nan (as without
    verification); the forgetting pass then names the epoch instead of keeping -1."""
    run = f16_run()
    values = np.array(run.outputs)
    values[2, 5, 1] = np.nan
    path = tmp_path / "r.npy"
    fk.save(fk.Run(values, run.labels, epochs=run.epochs, validate=False), path)
    monkeypatch.setattr(fk.run, "EAGER_CHECK_VALUES", 0)
    loaded = fk.load(path)
    with pytest.raises(fk.ForgetkitError, match=r"NaN or inf at epoch index 2 \(epoch 4\)"):
        loaded.predictions()


def test_probabilities_are_verified_without_keeping_the_pass(tmp_path):
    run = f16_run(kind="probs")
    path = tmp_path / "p.npy"
    fk.save(run, path)
    loaded = fk.load(path)
    assert loaded.cache.predictions is None  # its rows are also checked as probabilities per read
    np.testing.assert_array_equal(loaded.predictions(), run.predictions())
