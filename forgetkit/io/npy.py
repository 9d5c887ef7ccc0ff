"""Memory-mapped NPY runs: the outputs tensor (E, N, C) plus the sidecar
``<name>.forgetkit.json`` (kind, epoch numbers, labels, ids, class names, metadata)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from .atomic import write_json_atomic
from .integrity import KEY as CRC_KEY
from .integrity import check_fields, crc_array, stored_checksums, verify_epochs
from .pair import commit_pair, open_pair, pending_path
from .record import (
    SIDECAR_SUFFIX,
    corrupt,
    make_run,
    needs_checksums,
    one_line,
    read_record,
    sidecar_path,
)

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


def open_memmap(path, n_epochs=None):
    """The NPY file at ``path`` memory-mapped read-only; header and data are read through
    one file handle, so both come from the same file even if it is replaced meanwhile.
    ``n_epochs``: map that many epochs (first axis) instead of the header's count: a
    CorruptFileError if the file does not hold them."""
    with open(path, "rb") as f:
        head = f.read(len(NPY_MAGIC))
        if head != NPY_MAGIC:
            raise CorruptFileError(f"{str(path)!r} is not an NPY file: it starts with {head!r}")
        try:
            f.seek(0)
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            if fortran or dtype.hasobject:
                raise ValueError("a Fortran-order or object array")
            offset = f.tell()
            if n_epochs is not None:
                shape = (int(n_epochs), *shape[1:])
            needed = offset + int(np.prod(shape, dtype=object)) * dtype.itemsize
            size = os.fstat(f.fileno()).st_size
            if size < needed:
                raise ValueError(f"the file holds {size} bytes; its header needs {needed}")
            if int(np.prod(shape, dtype=object)) == 0:
                return np.empty(shape, dtype=dtype)
            return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)
        except CorruptFileError:
            raise
        except Exception as err:
            raise corrupt(path, err) from None


def stores_no_epoch(path):
    """Whether ``path`` is an NPY file whose header counts no epoch: what a writer killed
    before its first epoch leaves, nothing to load or to continue."""
    try:
        return Path(path).suffix.lower() == ".npy" and open_memmap(path).shape[0] == 0
    except (OSError, ForgetkitError):
        return False


def open_records(path):
    """The NPY file of structured records (a summary's, a top-k run's) at ``path``,
    memory-mapped read-only (`open_memmap`); an unreadable one is an error naming it."""
    try:
        return open_memmap(path)
    except ForgetkitError as err:
        raise ForgetkitError(f"cannot read {str(path)!r}: the file is truncated or corrupt "
                             f"({one_line(err)})") from None


def read_sidecar(file):
    """The record in the sidecar ``file``, or None if there is none (or no longer)."""
    try:
        return read_record(file, "sidecar")
    except MissingFileError:
        return None


def verify_tensor(path, tensor, record, n_epochs=None, *, predict=False):
    """Verify the labels, epoch numbers and the first ``n_epochs`` (default all) epochs of
    the memory-mapped ``tensor`` against the checksums in ``record``. Returns (whether the
    record has checksums (False: written before checksums existed), the predictions of the
    forgetting pass that verified them or None; see `integrity.verify_epochs`'s
    ``predict``)."""
    sums = stored_checksums(record, f"the sidecar of {str(path)!r}")
    if sums is None:
        if needs_checksums(record):
            raise CorruptFileError(f"the sidecar of {str(path)!r} lacks its checksums "
                                   f"(field {CRC_KEY!r})")
        return False, None
    n = len(tensor) if n_epochs is None else n_epochs
    check_fields(record, sums, path)
    if len(sums["outputs"]) < n:
        raise CorruptFileError(f"the sidecar of {str(path)!r} has checksums of "
                               f"{len(sums['outputs'])} epochs; the file holds {n}")
    predictions = verify_epochs(path, tensor[:n], record.get("epochs") or list(range(n)),
                                sums["outputs"][:n], predict=predict)
    return True, predictions


def epochs_of_record(path, outputs, record):
    """``outputs`` (E, N, C), or records (E, N) of a summary or a top-k run, with every epoch
    its sidecar ``record`` names: a writer updates the
    sidecar before the header, so a header that counts fewer epochs than a checksummed
    sidecar (a kill between the two, or a changed header) hides epochs whose bytes the file
    holds; they are mapped (and verified like the others). CorruptFileError if the file
    does not hold them."""
    epochs = record.get("epochs")
    if not isinstance(epochs, list) or len(epochs) <= len(outputs) or outputs.ndim < 2 \
            or not needs_checksums(record):
        return outputs
    try:
        return open_memmap(path, n_epochs=len(epochs))
    except CorruptFileError:
        raise CorruptFileError(
            f"the sidecar of {str(path)!r} names {len(epochs)} epochs; the file holds "
            f"{len(outputs)} (its header) and not the bytes of the others: the file is "
            "truncated or corrupt") from None


def load_npy(path, *, labels=None, kind=None, verify=True):
    outputs, record, _ = open_pair(path, open_memmap, read_sidecar)
    record = record or {}
    check_sidecar_claims(path, outputs, record)
    outputs = epochs_of_record(path, outputs, record)
    predictions = None
    if isinstance(record.get("labels"), list):  # (checked as integers) converted once: for
        record["labels"] = np.asarray(record["labels"], dtype=np.int64)  # the CRC and the run
    if verify and record:
        # logits are verified by the forgetting pass, whose result the run keeps (a later
        # `predictions` reads nothing); probabilities are also checked as rows, per read
        predict = (kind or record.get("kind", "logits")) == "logits"
        predictions = verify_tensor(path, outputs, record, predict=predict)[1]
    run = make_run(outputs, record, labels, kind, source=path)
    if predictions is not None and predictions.size and predictions.min() >= 0:
        run._inherit_predictions(predictions)  # else `predictions` names the bad epoch
    return run


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
    """Write (epoch number, outputs (N, C)) pairs to ``path`` as one NPY tensor; returns
    the epochs' checksums."""
    crcs = []
    with open(path, "wb") as f:
        f.write(npy_header(dtype, shape))
        for _, values in epochs:
            values = np.ascontiguousarray(values, dtype=dtype)
            crcs.append(crc_array(values))
            f.write(_buffer(values))
    return crcs


def _buffer(values):
    """The bytes of a C-contiguous array, as a buffer (no copy)."""
    values = np.ascontiguousarray(values)
    return memoryview(values.reshape(-1).view(np.uint8))


class NpyAppender:
    """The NPY side of `RunWriter`: epochs are written after the last one, then the sidecar
    and the header are updated, so the file always loads as the epochs completed. Replacing
    epochs rewrites the file and its sidecar as one (`forgetkit.io.pair.commit_pair`)."""

    def __init__(self, path, dtype, n_samples, n_classes, *, durable=True):
        self.path, self.dtype = path, dtype
        self.n_samples, self.n_classes = n_samples, n_classes
        self.durable = durable
        self.sidecar = sidecar_path(path)

    def existing(self):
        """(record, stored epoch numbers, their checksums) of the run at ``path`` (resume);
        a run written before checksums existed is checksummed here."""
        if not self.sidecar.exists() and not pending_path(self.path).exists():
            raise ForgetkitError(f"{str(self.path)!r} exists but has no {SIDECAR_SUFFIX} "
                                 "sidecar: it was not written by forgetkit; use mode='w'")
        existing, record, _ = open_pair(self.path, open_memmap, read_sidecar)
        record = record or {}
        check_sidecar_claims(self.path, existing, record)
        if record.get("epochs") is None:
            raise CorruptFileError(f"the sidecar {str(self.sidecar)!r} lacks the field 'epochs'")
        if existing.dtype != self.dtype:
            raise ForgetkitError(f"the existing run at {str(self.path)!r} stores "
                                 f"{existing.dtype}; this writer has dtype={self.dtype}")
        existing = epochs_of_record(self.path, existing, record)  # as a load sees them
        n = existing.shape[0]
        if verify_tensor(self.path, existing, record)[0]:
            crcs = list(record[CRC_KEY]["outputs"][:n])
        else:
            crcs = [crc_array(existing[e]) for e in range(n)]
        return record, list(record["epochs"][:n]), crcs

    def open(self, record, resume):
        if resume:
            self._file = open(self.path, "r+b")
            # the header may count fewer epochs than the record (a kill between them): the
            # next append's header counts them
            write_json_atomic(self.sidecar, record, durable=self.durable)
        else:
            # the sidecar first: a writer killed before its tensor exists leaves no file that
            # loads as a run without labels (a sidecar alone is no run, and is rewritten)
            write_json_atomic(self.sidecar, record, durable=self.durable)
            self._file = open(self.path, "wb")
            self._write_header(0)
        pending_path(self.path).unlink(missing_ok=True)

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

    def rewrite(self, keep, values, record):
        """Replace the epochs from position ``keep`` on by ``values`` (one epoch): a new
        file and sidecar, committed as one."""
        old = open_memmap(self.path)

        def write_tensor(tmp):
            with open(tmp, "wb") as f:
                f.write(npy_header(self.dtype, (keep + 1, self.n_samples, self.n_classes)))
                for e in range(keep):
                    f.write(_buffer(old[e]))
                f.write(_buffer(values))

        self._file.close()
        try:
            commit_pair(self.path, write_tensor, lambda _: record)
        finally:
            self._file = open(self.path, "r+b")

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
