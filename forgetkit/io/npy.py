"""Memory-mapped NPY runs: the outputs tensor (E, N, C) plus the sidecar
``<name>.forgetkit.json`` (kind, epoch numbers, labels, ids, class names, metadata)."""

from __future__ import annotations

import os

import numpy as np

from ..errors import CorruptFileError, ForgetkitError
from .atomic import write_json_atomic
from .record import SIDECAR_SUFFIX, corrupt, make_run, read_record, sidecar_path

NPY_MAGIC = b"\x93NUMPY"
#: Room for the NPY header, so that it can be rewritten in place as epochs are appended.
NPY_HEADER_BYTES = 256


def npy_header(dtype, shape):
    """An NPY 1.0 header padded to NPY_HEADER_BYTES."""
    d = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)}
    text = repr(d).encode("latin1")
    pad = NPY_HEADER_BYTES - 10 - len(text) - 1
    return b"\x93NUMPY\x01\x00" + np.uint16(NPY_HEADER_BYTES - 10).tobytes() + text \
        + b" " * pad + b"\n"


def _open_memmap(path):
    with open(path, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if head != NPY_MAGIC:
        raise CorruptFileError(f"{str(path)!r} is not an NPY file: it starts with {head!r}")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:
        raise corrupt(path, err) from None


def load_npy(path, *, labels=None, kind=None):
    outputs = _open_memmap(path)
    sidecar = sidecar_path(path)
    record = read_record(sidecar, "sidecar") if sidecar.exists() else {}
    check_sidecar_claims(path, outputs, record)
    return make_run(outputs, record, labels, kind, source=path)


def check_sidecar_claims(path, outputs, record):
    """Refuse a sidecar whose sizes or dtype disagree with the NPY header's."""
    shape = outputs.shape
    for name, theirs, mine in (("n_samples", record.get("n_samples"), shape[1:2]),
                               ("n_classes", record.get("n_classes"), shape[2:3]),
                               ("dtype", record.get("dtype"), [outputs.dtype.name])):
        if theirs is not None and [theirs] != list(mine):
            raise CorruptFileError(
                f"the sidecar of {str(path)!r} says {name}={theirs!r}, but the file holds "
                f"shape {shape} of {outputs.dtype}")


def write_npy(path, epochs, dtype, shape):
    """Write (epoch number, outputs (N, C)) pairs to ``path`` as one NPY tensor."""
    with open(path, "wb") as f:
        f.write(npy_header(dtype, shape))
        for _, values in epochs:
            f.write(values.tobytes())


def _buffer(values):
    """The bytes of a C-contiguous array, as a buffer (no copy)."""
    values = np.ascontiguousarray(values)
    return memoryview(values.reshape(-1).view(np.uint8))


class NpyAppender:
    """The NPY side of `RunWriter`: epochs are written after the last one, then the sidecar
    and the header are updated, so the file always loads as the epochs completed."""

    def __init__(self, path, dtype, n_samples, n_classes, *, durable=True):
        self.path, self.dtype = path, dtype
        self.n_samples, self.n_classes = n_samples, n_classes
        self.durable = durable
        self.sidecar = sidecar_path(path)

    def existing(self):
        """The record of the run at ``path`` and its stored epochs (resume)."""
        if not self.sidecar.exists():
            raise ForgetkitError(f"{str(self.path)!r} exists but has no {SIDECAR_SUFFIX} "
                                 "sidecar: it was not written by forgetkit; use mode='w'")
        record = read_record(self.sidecar, "sidecar")
        existing = _open_memmap(self.path)
        check_sidecar_claims(self.path, existing, record)
        if record.get("epochs") is None:
            raise CorruptFileError(f"the sidecar {str(self.sidecar)!r} lacks the field 'epochs'")
        if existing.dtype != self.dtype:
            raise ForgetkitError(f"the existing run at {str(self.path)!r} stores "
                                 f"{existing.dtype}; this writer has dtype={self.dtype}")
        return record, list(record["epochs"][: existing.shape[0]])

    def open(self, record, resume):
        if resume:
            self._file = open(self.path, "r+b")
        else:
            self._file = open(self.path, "wb")
            self._write_header(0)
            write_json_atomic(self.sidecar, record, durable=self.durable)

    def append(self, values, position, record):
        # data, then the sidecar naming the epoch, then the header counting it: each on disk
        # before the next, so that after a crash the header never counts a lost epoch
        f = self._file
        # (written from the array's buffer: no copy; the stale-temp scan was done at open,
        # and the run's lock keeps other writers of the sidecar away since)
        f.seek(NPY_HEADER_BYTES + position * values.nbytes)
        f.write(_buffer(values))
        self._flush()
        write_json_atomic(self.sidecar, record, durable=self.durable, clean=False)
        self._write_header(position + 1)

    def truncate(self, keep, record):
        write_json_atomic(self.sidecar, record, durable=self.durable, clean=False)
        self._write_header(keep)

    def close(self):
        self._file.close()

    abort = close

    def _write_header(self, n_epochs):
        self._file.seek(0)
        self._file.write(npy_header(self.dtype, (n_epochs, self.n_samples, self.n_classes)))
        self._flush()

    def _flush(self):
        self._file.flush()
        if self.durable:
            os.fsync(self._file.fileno())
