"""Summary runs: per (epoch, sample) the label's logit, the largest other logit and its class,
and the log-sum-exp over classes (16 bytes instead of C outputs; see `forgetkit.kinds.summary`).

On disk: ``<name>.npy`` holds a structured array of shape (n_epochs, n_samples) with fields
``label``, ``other`` (float32), ``other_class`` (int32) and ``lse`` (float32), memory-mapped
on load; the sidecar ``<name>.forgetkit.json`` has ``"kind": "summary"``, the class count,
labels, epoch numbers, sample ids, class names and metadata. `SummaryWriter` appends epoch by
epoch as `RunWriter` does: each epoch's records are written and flushed, then the sidecar,
then the header, so the file always loads as the epochs completed. A `SummaryWriter` of a
``.parquet`` summary stages its epochs so, as ``summary.npy`` in the staging folder
``<name>.parquet.partial``, and writes the Parquet file on `close` (atomically), then
removes the staging; until then `forgetkit.load` reads the staged epochs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .._progress import Progress
from .._validation import (
    check_bool,
    check_int,
    check_meta,
    check_option,
    check_path,
)
from ..errors import ForgetkitError, InputTypeError
from ..kinds import kind_of
from ..kinds.summary import SUMMARY_DTYPE, SummaryOutputs, summarize_outputs
from ..run import Run
from .atomic import atomic_write, remove, write_json_atomic
from .guard import refuse_overwrite
from .integrity import KEY as CRC_KEY
from .integrity import crc_array
from .lock import RunLock
from .npy import epochs_of_record, open_records, verify_tensor
from .pair import commit_pair, open_pair, pending_path
from .parquet import staging_path
from .record import read_sidecar_of, record_encoder, sidecar_path, with_checksums
from .summary_parquet import load_summary_parquet, write_summary_parquet
from .summary_record import FORMAT, summary_record, summary_run
from .writer import LockedWriter, check_run_fields

#: Room for the NPY header, rewritten in place as epochs are appended.
HEADER_BYTES = 256


def staged_summary(path):
    """Where a `SummaryWriter` of the Parquet summary ``path`` appends its epochs (the
    staging folder's ``summary.npy``, with its sidecar)."""
    return staging_path(path) / "summary.npy"


def summary_header(n_epochs, n_samples, dtype=SUMMARY_DTYPE):
    """An NPY 1.0 header of (n_epochs, n_samples) records of ``dtype`` (summary records by
    default), padded to HEADER_BYTES."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
         "shape": (int(n_epochs), int(n_samples))}
    text = repr(d).encode("latin1")
    pad = HEADER_BYTES - 10 - len(text) - 1
    return b"\x93NUMPY\x01\x00" + np.uint16(HEADER_BYTES - 10).tobytes() + text \
        + b" " * pad + b"\n"


def read_summary_record(path):
    """The sidecar record of the summary at ``path``, or None if ``path`` is not one."""
    sidecar = sidecar_path(path)
    if Path(path).suffix.lower() != ".npy" or not sidecar.exists():
        return None
    try:
        record = json.loads(sidecar.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None  # not ours to judge: the NPY loader reports it
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def is_summary(path):
    """Whether ``path`` is a summary run (a .npy whose sidecar says so)."""
    return read_summary_record(path) is not None


def read_summary_sidecar(file):
    """The summary record in the sidecar ``file`` (None if absent or not a summary's)."""
    return read_sidecar_of(file, FORMAT)


def load_summary(path, *, labels=None, verify=True):
    """A summary run (kind "summary") from ``path``, memory-mapped; ``verify`` checks the
    stored checksums (`forgetkit.load`)."""
    if read_summary_record(path) is None:
        raise ForgetkitError(f"{str(path)!r} is not a forgetkit summary (no {FORMAT} sidecar)")
    records, record, _ = open_pair(path, open_records, read_summary_sidecar)
    if record is None:
        raise ForgetkitError(f"{str(path)!r} is not a forgetkit summary (no {FORMAT} sidecar)")
    records = epochs_of_record(path, records, record)
    return summary_run(path, records, record, labels,
                       f"the sidecar {str(sidecar_path(path))!r}",
                       verify=(lambda: verify_tensor(path, records, record)) if verify else None)


def summarize(run, path=None, *, progress=False):
    """The summary of a logits run, in memory or written to ``path``.

    Parameters
    ----------
    run : Run or str or Path
        Logits of shape (n_epochs, n_samples, n_classes) (a Run, or a run file to load);
        read one epoch at a time. A summary run is copied; a top-k run (k >= 2) gives
        its exact summary.
    path : str or Path, optional
        ``.npy`` file to write (atomically, with its sidecar); None keeps it in memory.
    progress : bool, default False

    Returns
    -------
    Run of kind "summary", shape (n_epochs, n_samples, n_classes)
        Memory-mapped from ``path`` when given. Correctness (hence accuracy, F_e, L_e,
        forgetting events), `Run.label_probs` and `Run.label_margins` equal those of the
        full run; methods that need every class's outputs (probabilities, fusion) raise.
    """
    from . import load  # the package's loader, which imports this module

    if path is not None:
        check_path("path", path)
    check_bool("progress", progress)
    if not isinstance(run, Run):
        if not isinstance(run, (str, os.PathLike)):
            raise InputTypeError(f"run must be a forgetkit.Run or the path of a run file; got "
                                 f"{type(run).__name__} {run!r}"[:200])
        run = load(run)
    kind = kind_of(run)  # a summary is copied; logits or a top-k run give theirs (exact)
    records = np.empty((run.n_epochs, run.n_samples), dtype=SUMMARY_DTYPE)
    bar = Progress(run.n_epochs, "summary", enabled=progress)
    for e in range(run.n_epochs):
        records[e] = kind.summary(run, slice(e, e + 1))[0]
        bar.update()
    if path is None:
        return Run(SummaryOutputs(records, run.n_classes), run.labels, kind="summary",
                   epochs=run.epochs, sample_ids=run.sample_ids, class_names=run.class_names,
                   meta=run.meta)
    path = Path(path)
    if path.suffix.lower() not in (".npy", ".parquet"):
        raise ForgetkitError(f"summaries are written as .npy (with a sidecar) or .parquet; got "
                             f"{str(path)!r}")
    refuse_overwrite({"the summary": path}, [run.source])
    record = summary_record(
        n_samples=run.n_samples, n_classes=run.n_classes, epochs=run.epochs,
        labels=run.labels, sample_ids=run.sample_ids, class_names=run.class_names,
        meta=run.meta)
    if path.suffix.lower() == ".parquet":
        with RunLock(path), atomic_write(path) as tmp:
            write_summary_parquet(tmp, records, record)
        return load_summary_parquet(path)

    def write_tensor(tmp):
        with open(tmp, "wb") as f:
            f.write(summary_header(*records.shape))
            f.write(records.tobytes())
        return [crc_array(records[e]) for e in range(len(records))]

    with RunLock(path):  # the records and the sidecar, committed as one
        commit_pair(path, write_tensor, lambda crcs: with_checksums(record, crcs))
    return load_summary(path)


class SummaryWriter(LockedWriter):
    """Append a summary run epoch by epoch while the model trains (the `RunWriter` of
    summaries; same options).

    Parameters
    ----------
    path : str or Path, ``.npy`` or ``.parquet``
        A ``.parquet`` summary's epochs are staged as ``summary.npy`` in the staging folder
        ``<name>.parquet.partial`` (loaded by `forgetkit.load` meanwhile), and the Parquet
        file is written on `close`; mode "a" resumes a finished file or the staging.
    n_samples, n_classes : int
    labels : array-like of shape (n_samples,)
    sample_ids, class_names, meta : optional, stored in the sidecar
    mode : {"a", "w", "x"}
        "a" (default) appends to an existing summary at ``path`` or starts one; "w" starts
        over; "x" refuses an existing file.

    durable : bool, default True
        Flush every epoch to disk (fsync) before `append` returns, as `RunWriter` does;
        False leaves that to the operating system (an epoch may be lost on power failure,
        never corrupted: the records are still written before the header counts them).

    Like `RunWriter`, it holds the run's lock (``<path>.lock``) until `close`, and (durable)
    an epoch is on disk (fsync) when `append` returns.
    """

    def __init__(self, path, n_samples, n_classes, *, labels, sample_ids=None,
                 class_names=None, meta=None, mode="a", durable=True):
        self.target = Path(check_path("path", path))  # the file `close` leaves
        if self.target.suffix.lower() not in (".npy", ".parquet"):
            raise ForgetkitError(f"summaries are written as .npy (with a sidecar) or .parquet; "
                                 f"got {str(self.target)!r}")
        self.parquet = self.target.suffix.lower() == ".parquet"
        # where the epochs are appended: the file itself, or a Parquet summary's staging
        self.path = staged_summary(self.target) if self.parquet else self.target
        check_option("mode", mode, ("a", "w", "x"))
        (self.n_samples, self.n_classes, self.labels, self.sample_ids, self.class_names,
         self.meta) = check_run_fields(n_samples, n_classes, labels, sample_ids, class_names,
                                       meta)
        self.epochs = []
        self.crcs = []  # the stored epochs' checksums (`forgetkit.io.integrity`)
        self._closed = False
        self.durable = bool(durable)
        self._encoder = None  # the sidecar record's JSON, labels and ids encoded once
        self._lock_and_open(mode)

    #: The records this writer stores (`SUMMARY_DTYPE`; a subclass may store others).
    dtype = SUMMARY_DTYPE

    def _open(self, mode):
        if self.parquet:
            exists = self._claim(mode, (self.path, self.target))
            if mode == "w":
                remove(self.target)
            self.path.parent.mkdir(exist_ok=True)
            if exists and not self.path.exists():  # a finished Parquet summary: resumed
                self._stage(self.target)
        else:
            exists = self._claim(mode, self._files())
        if exists:
            self.epochs, self.crcs = self._existing_epochs()
            self._file = open(self.path, "r+b")
            write_json_atomic(sidecar_path(self.path), self._record(), durable=self.durable)
        else:
            self._start()
            self._file = open(self.path, "wb")
            self._file.write(summary_header(0, self.n_samples, self.dtype))
            self._file.flush()
            write_json_atomic(sidecar_path(self.path), self._record(), durable=self.durable)

    def _files(self):
        """The files that make a run exist at ``path`` (`LockedWriter._claim`)."""
        return (self.path,)

    def _start(self):
        """Write what a new run holds besides its records and sidecar (nothing here)."""

    def append(self, epoch, values, *, replace=False, meta=None):
        """Store epoch number ``epoch``: logits (n_samples, n_classes), summarised here, or
        its summary records (n_samples,) of `SUMMARY_DTYPE`. Epoch numbers must increase;
        ``replace=True`` drops a stored epoch number and the later ones first. ``meta`` (a
        dict), if given, replaces the run's metadata, written with this epoch's record."""
        if self._closed:
            raise ForgetkitError(f"this {type(self).__name__} is closed")
        epoch = check_int("epoch", epoch)
        meta = None if meta is None else check_meta(meta)
        records = self._records_of(epoch, np.asarray(values))
        if self.epochs and epoch <= self.epochs[-1]:
            if not replace:
                raise ForgetkitError(f"epoch {epoch} is not after the last stored epoch "
                                     f"{self.epochs[-1]}; pass replace=True to drop it and the "
                                     "later epochs")
            self._rewrite(int(np.searchsorted(self.epochs, epoch)), epoch, records, meta)
            return
        position = len(self.epochs)
        f = self._file
        f.seek(HEADER_BYTES + position * self.n_samples * self.dtype.itemsize)
        f.write(memoryview(np.ascontiguousarray(records).reshape(-1).view(np.uint8)))
        self._flush()  # the records are on disk before the header counts them
        self.epochs.append(epoch)
        self.crcs.append(self._crc(records))
        before = self._use_meta(meta)
        # stale temporaries were removed at open; the run's lock keeps other writers away
        try:
            write_json_atomic(sidecar_path(self.path), self._record(), durable=self.durable,
                              clean=False)
        except BaseException:
            self.meta, self._encoder = before
            self.epochs.pop()
            self.crcs.pop()
            raise
        f.seek(0)
        f.write(summary_header(len(self.epochs), self.n_samples, self.dtype))
        self._flush()  # the epoch counted on disk before append returns

    def _crc(self, records):
        """What `crcs` keeps of an epoch's records: their CRC32C."""
        return crc_array(records)

    def _records_of(self, epoch, values):
        """The records of epoch number ``epoch`` from what `append` got, checked."""
        if values.dtype == SUMMARY_DTYPE and values.shape == (self.n_samples,):
            records = values
            finite = all(np.isfinite(records[f]).all() for f in ("label", "other", "lse"))
            if not finite:
                raise ForgetkitError(f"the summary of epoch {epoch} holds NaN or inf; not stored")
        elif values.shape == (self.n_samples, self.n_classes):
            try:
                records = summarize_outputs(values, self.labels)
            except ForgetkitError as err:
                raise ForgetkitError(f"outputs of epoch {epoch}: {err}") from None
        else:
            raise ForgetkitError(f"epoch {epoch} must be outputs of shape ({self.n_samples}, "
                                 f"{self.n_classes}) or {self.n_samples} summary records; got "
                                 f"{values.dtype} of shape {values.shape}")
        return records

    def _rewrite(self, keep, epoch, records, meta):
        """Replace the epochs from position ``keep`` on by ``records`` (one epoch; ``meta``:
        the run's new metadata or None): a new file and sidecar, committed as one, so that a
        kill leaves the old run or the new."""
        old = open_records(self.path)
        epochs, crcs = self.epochs, self.crcs
        self.epochs, self.crcs = epochs[:keep] + [epoch], crcs[:keep] + [self._crc(records)]
        before = self._use_meta(meta)

        def write_tensor(tmp):
            with open(tmp, "wb") as f:
                f.write(summary_header(keep + 1, self.n_samples, self.dtype))
                f.write(np.ascontiguousarray(old[:keep]).tobytes())
                f.write(np.ascontiguousarray(records).tobytes())

        self._file.close()
        try:
            commit_pair(self.path, write_tensor, lambda _: self._record())
        except BaseException:
            self.epochs, self.crcs = epochs, crcs
            self.meta, self._encoder = before
            raise
        finally:
            self._file = open(self.path, "r+b")

    def _flush(self):
        self._file.flush()
        if self.durable:
            os.fsync(self._file.fileno())

    def close(self):
        """Finish the file (a ``.parquet`` summary: written from the staged epochs, the
        staging then removed) and release the lock (idempotent)."""
        if not self._closed:
            try:
                self._file.close()
                if self.parquet:
                    self._finish_parquet()
            finally:
                self._lock.release()
        self._closed = True

    def abort(self):
        """Close without writing a ``.parquet`` summary (used on errors) and release the
        lock; the staged epochs stay on disk, and a writer in mode "a" resumes them."""
        if not self._closed:
            try:
                self._file.close()
            finally:
                self._lock.release()
        self._closed = True

    def _stage(self, source):
        """Stage the epochs of the finished Parquet summary ``source`` (verified) to resume
        it: the records and the sidecar, committed as one."""
        run = load_summary_parquet(source)
        if run.n_samples != self.n_samples or run.n_classes != self.n_classes:
            raise ForgetkitError(f"the existing summary at {str(source)!r} has n_samples="
                                 f"{run.n_samples}, n_classes={run.n_classes}; this writer has "
                                 f"{self.n_samples}, {self.n_classes} (use mode='w' to start "
                                 "over, or another path)")
        records = kind_of(run).read_records(run)
        crcs = [crc_array(records[e]) for e in range(len(records))]

        def write_tensor(tmp):
            with open(tmp, "wb") as f:
                f.write(summary_header(*records.shape))
                f.write(np.ascontiguousarray(records).tobytes())

        record = with_checksums(summary_record(
            n_samples=run.n_samples, n_classes=run.n_classes, epochs=run.epochs,
            labels=run.labels, sample_ids=run.sample_ids, class_names=run.class_names,
            meta=run.meta), crcs)
        commit_pair(self.path, write_tensor, lambda _: record)

    def _finish_parquet(self):
        """Write the staged epochs to the Parquet file (atomically), then remove the
        staging: a kill before the rename leaves the staging (loaded, and resumed), after it
        the finished file."""
        records = open_records(self.path)[: len(self.epochs)]
        with atomic_write(self.target) as tmp:
            write_summary_parquet(tmp, records, self._record())
        for staged in (self.path, sidecar_path(self.path), pending_path(self.path)):
            remove(staged)
        try:
            self.path.parent.rmdir()
        except OSError:
            pass  # another file there (a killed write's temporary): left

    def _record(self):
        if self._encoder is None:  # every field but the epochs is fixed: encoded once
            self._encoder = record_encoder(summary_record(
                n_samples=self.n_samples, n_classes=self.n_classes, epochs=[],
                labels=self.labels, sample_ids=self.sample_ids,
                class_names=self.class_names, meta=self.meta))
        return self._encoder(self.epochs, self.crcs)

    def _existing_epochs(self):
        record = read_summary_record(self.path)
        if record is None:
            raise ForgetkitError(f"{str(self.path)!r} exists but is not a forgetkit summary (a "
                                 "full run, or another file); use mode='w' or another path")
        for field, mine in (("n_samples", self.n_samples), ("n_classes", self.n_classes)):
            if record.get(field) != mine:
                raise ForgetkitError(f"the existing summary at {str(self.path)!r} has "
                                     f"{field}={record.get(field)}; this writer has {field}={mine} "
                                     "(use mode='w' to start over, or another path)")
        stored, record, _ = open_pair(self.path, open_records, read_summary_sidecar)
        stored = epochs_of_record(self.path, stored, record)  # as a load sees them
        n = stored.shape[0]
        if verify_tensor(self.path, stored, record)[0]:
            crcs = list(record[CRC_KEY]["outputs"][:n])
        else:  # written before checksums existed
            crcs = [crc_array(stored[e]) for e in range(n)]
        return list(record["epochs"][:n]), crcs
