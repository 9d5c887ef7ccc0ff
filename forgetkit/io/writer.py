"""`RunWriter`: append a run epoch by epoch while the model trains (NPY or Parquet)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._validation import (
    FLOAT_DTYPES,
    KINDS,
    check_class_names,
    check_int,
    check_labels,
    check_meta,
    check_option,
    check_path,
    check_sample_ids,
)
from ..errors import ForgetkitError, InputTypeError, RunExistsError
from .atomic import remove, remove_stale_temps
from .integrity import crc_array
from .lock import RunLock
from .npy import NpyAppender
from .parquet import LAYOUTS, ParquetAppender, staging_path
from .record import format_of, record_encoder, run_record, sidecar_path


def check_run_fields(n_samples, n_classes, labels, sample_ids, class_names, meta):
    """The fields every writer stores beside the outputs, checked as `Run` checks them:
    (n_samples, n_classes, labels, sample_ids, class_names, meta)."""
    n_samples = check_int("n_samples", n_samples, minimum=1)
    n_classes = check_int("n_classes", n_classes, minimum=2)
    return (n_samples, n_classes, check_labels(labels, n_samples, n_classes),
            check_sample_ids(sample_ids, n_samples), check_class_names(class_names, n_classes),
            check_meta(meta))


class LockedWriter:
    """What `RunWriter` and `SummaryWriter` share: the run's lock from construction to
    `close`/`abort`, stale temporary files removed and the ``mode`` applied at open, and the
    context-manager protocol. Subclasses set ``path`` and implement ``_open(mode)``,
    ``close`` and ``abort``."""

    def _lock_and_open(self, mode):
        # the run's lock (of the file the writer leaves: ``target`` where it stages
        # elsewhere), taken before anything on disk is read or touched
        self._lock = RunLock(getattr(self, "target", self.path))
        try:
            self._open(mode)
        except BaseException:
            self._lock.release()
            raise

    def _claim(self, mode, existing):
        """Remove temporaries of killed writes, then apply ``mode`` to the files in
        ``existing`` (those that make a run exist at ``path``): refuse them ("x"), remove them
        and the sidecar ("w") or keep them ("a"). Returns whether a run is there to resume."""
        for written in (self.path, sidecar_path(self.path)):
            remove_stale_temps(written)  # left by killed writes
        exists = any(p.exists() for p in existing)
        if exists and mode == "x":
            raise RunExistsError(f"a run already exists at {str(self.path)!r} (mode='x')")
        if exists and mode == "w":
            for p in (*existing, sidecar_path(self.path)):
                remove(p)
            exists = False
        return exists

    def _use_meta(self, meta):
        """Make ``meta`` (checked, or None: keep) the metadata of the next record written;
        returns what to restore if that write fails."""
        before = (self.meta, self._encoder)
        if meta is not None:  # only the metadata is encoded again (none yet: made later)
            self.meta = meta
            self._encoder = self._encoder and self._encoder.with_meta(meta)
        return before

    @property
    def n_epochs(self):
        return len(self.epochs)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


class RunWriter(LockedWriter):
    """Append a run epoch by epoch while the model trains (NPY or Parquet).

    Parameters
    ----------
    path : str or Path
        ``.npy`` (memory-mappable tensor + sidecar JSON) or ``.parquet``.
    n_samples, n_classes : int
    labels : array-like of shape (n_samples,)
    kind : {"logits", "probs"}
    dtype : float16 (default), float32 or float64, the stored precision.
    mode : {"a", "w", "x"}
        "a" (default) appends to an existing run at ``path`` (a resumed training) or starts a
        new one; "w" starts over; "x" refuses an existing run.
    layout : {"list", "binary"}, Parquet only.
    durable : bool, default True
        Flush every epoch to disk (fsync) before `append` returns, so that it survives a
        crash or a power loss; False leaves that to the operating system (an epoch may be
        lost on power failure, never corrupted).

    Every `append` leaves a loadable run: the NPY header is updated only after the epoch's
    data is written, and Parquet epochs are staged as one atomic file each in
    ``<path>.partial/`` until `close` merges them into ``path``.

    A writer holds the run's lock (``<path>.lock``) from construction to `close`/`abort`:
    a second writer on the same path, in this process or another, gets RunLockedError
    naming the holder and touches nothing.
    """

    def __init__(self, path, n_samples, n_classes, *, labels, kind="logits",
                 dtype="float16", sample_ids=None, class_names=None, meta=None,
                 mode="a", format=None, layout="list", durable=True):
        self.path = Path(check_path("path", path))
        self.format = format or format_of(self.path)
        check_option("format", self.format, ("npy", "parquet"))
        check_option("mode", mode, ("a", "w", "x"))
        self.layout = check_option("layout", layout, LAYOUTS)
        self.dtype = np.dtype(dtype)
        if self.dtype.type not in FLOAT_DTYPES:
            raise InputTypeError(f"dtype must be float16, float32 or float64; got {self.dtype}")
        self.kind = check_option("kind", kind, KINDS)
        (self.n_samples, self.n_classes, self.labels, self.sample_ids, self.class_names,
         self.meta) = check_run_fields(n_samples, n_classes, labels, sample_ids, class_names,
                                       meta)
        self.epochs = []
        self.crcs = []  # the stored epochs' checksums (`forgetkit.io.integrity`)
        self._closed = False
        self._encoder = None  # the sidecar record's JSON, labels and ids encoded once
        if self.format == "npy":
            self._store = NpyAppender(self.path, self.dtype, self.n_samples, self.n_classes,
                                      durable=bool(durable))
        else:
            self._store = ParquetAppender(self.path, self.dtype, self.n_classes, self.layout,
                                          durable=bool(durable))
        self._lock_and_open(mode)

    def _open(self, mode):
        exists = self._claim(mode, (self.path, staging_path(self.path)))
        if exists:
            record, self.epochs, self.crcs = self._store.existing()
            self._check_same_run(record)
        self._store.open(self._record(), resume=exists)

    # ------------------------------------------------------------- public API
    def append(self, epoch, outputs, *, replace=False, meta=None):
        """Store the outputs (n_samples, n_classes) of epoch number ``epoch``.

        Epoch numbers must increase. With ``replace=True`` an epoch number already stored
        (a training resumed from an earlier checkpoint) drops it and every later one first.
        Non-finite outputs are refused with the epoch number; earlier epochs stay intact.
        ``meta`` (a dict), if given, replaces the run's metadata, written together with this
        epoch (a replay's per-checkpoint record).
        """
        if self._closed:
            raise ForgetkitError("this RunWriter is closed")
        epoch = check_int("epoch", epoch)
        meta = None if meta is None else check_meta(meta)
        values = np.asarray(outputs)
        if values.shape != (self.n_samples, self.n_classes):
            raise ForgetkitError(
                f"outputs of epoch {epoch} must have shape ({self.n_samples}, "
                f"{self.n_classes}) (samples, classes); got shape {values.shape}"
            )
        with np.errstate(over="ignore"):  # overflow to inf is reported just below
            values = values.astype(self.dtype, copy=False)
        if not np.all(np.isfinite(values)):
            raise ForgetkitError(
                f"outputs of epoch {epoch} contain NaN or inf (in {self.dtype}); not stored"
            )
        values = np.ascontiguousarray(values)
        crc = crc_array(values)
        if self.epochs and epoch <= self.epochs[-1]:
            if not replace:
                raise ForgetkitError(
                    f"epoch {epoch} is not after the last stored epoch {self.epochs[-1]}; "
                    "pass replace=True to drop it and the later epochs"
                )
            keep = int(np.searchsorted(self.epochs, epoch))
            if self.format == "npy":  # a new file and sidecar, committed as one
                epochs, crcs = self.epochs, self.crcs
                self.epochs, self.crcs = epochs[:keep] + [epoch], crcs[:keep] + [crc]
                before = self._use_meta(meta)
                try:
                    self._store.rewrite(keep, values, self._record())
                except BaseException:
                    self.epochs, self.crcs = epochs, crcs
                    self.meta, self._encoder = before
                    raise
                return
            self._truncate(keep)
        position = len(self.epochs)
        self.epochs.append(epoch)
        self.crcs.append(crc)
        before = self._use_meta(meta)
        try:
            self._store.append(values, position, self._record())
        except BaseException:
            self.epochs.pop()
            self.crcs.pop()
            self.meta, self._encoder = before
            raise

    def close(self):
        """Finish the run (Parquet: merge the staged epochs into ``path``) and release the
        lock."""
        if self._closed:
            return
        try:
            if self.format == "npy":
                self._store.close()
            else:
                self._store.close(self._record())
        finally:
            self._closed = True
            self._lock.release()

    def abort(self):
        """Close without merging (used on errors) and release the lock; completed epochs
        stay on disk."""
        if not self._closed:
            try:
                self._store.abort()
            finally:
                self._lock.release()
        self._closed = True

    # -------------------------------------------------------------- internals
    def _check_same_run(self, record):
        for field, mine in (("n_samples", self.n_samples), ("n_classes", self.n_classes),
                            ("kind", self.kind)):
            theirs = record.get(field)
            if theirs != mine:
                raise ForgetkitError(
                    f"the existing run at {str(self.path)!r} has {field}={theirs}; this writer "
                    f"has {field}={mine} (use mode='w' to start over, or another path)"
                )

    def _record(self):
        # every field but the epochs is fixed at construction: encoded once, not per epoch
        if self._encoder is None:
            self._encoder = record_encoder(run_record(
                kind=self.kind, dtype=self.dtype, n_samples=self.n_samples,
                n_classes=self.n_classes, epochs=[], labels=self.labels,
                sample_ids=self.sample_ids, class_names=self.class_names, meta=self.meta))
        return self._encoder(self.epochs, self.crcs)

    def _truncate(self, keep):
        """Drop the stored epochs from position ``keep`` on (Parquet)."""
        dropped, dropped_crcs = self.epochs[keep:], self.crcs[keep:]
        self.epochs, self.crcs = self.epochs[:keep], self.crcs[:keep]
        try:
            self._store.truncate(keep, self._record(), dropped)
        except ValueError:
            self.epochs += dropped
            self.crcs += dropped_crcs
            raise
