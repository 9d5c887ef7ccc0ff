"""Framework-free part of the recorders: the writer they feed (on a background thread), the
label checks, resuming by sample id."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from .._validation import check_labels
from ..errors import ForgetkitError
from ..io import RunWriter, SummaryWriter, load
from ..io.background import BackgroundWriter
from ..kinds import kind_named


@dataclass(frozen=True)
class RecorderOptions:
    """The options every recorder takes (torch, JAX, Keras, the Hugging Face callback, and
    the replays), as keyword arguments.

    Parameters
    ----------
    dtype : "float16" (default), "float32" or "float64", the stored precision.
    summary : bool, default False
        Store the summary of each sample's logits (`forgetkit.summarize`: label logit,
        largest other logit and its class, log-sum-exp; 16 bytes per sample), computed
        from the logits rounded to ``dtype`` (on the model's device where it can).
    sample_ids : array-like, optional
        The id of each dataset index (of each position, for data other than a DataLoader
        over a map-style dataset), stored as the run's sample ids. By default the run's
        samples are the dataset indices (stored as ids only when they are not 0..N-1).
    max_pending : int, default 2
        Epochs that may wait for the background writer before `record` waits.
    kind : {"logits", "probs"}, default "logits".
    format : {"npy", "parquet"}, optional (default: from the path's suffix).
    layout : {"list", "binary"}, Parquet only.
    meta : dict, optional, stored as the run's metadata.
    class_names : list of str, optional.
    mode : {"a", "w", "x"}, default "a"
        "a" appends to an existing run at the path (a resumed training), as long as it
        holds the same samples (matched by sample id) and classes; "w" starts over; "x"
        refuses an existing run.
    durable : bool, default True
        Flush every epoch to disk (fsync) before the writer thread takes the next one, so
        that a recorded epoch survives a crash or power loss; False leaves that to the
        operating system (an epoch may then be lost on power failure, never corrupted).

    The run is written by `forgetkit.RunWriter` (`forgetkit.SummaryWriter` with
    ``summary=True``) on a background thread.
    """

    dtype: object = "float16"
    summary: bool = False
    sample_ids: object = None
    max_pending: int = 2
    kind: str = "logits"
    format: object = None
    layout: str = "list"
    meta: object = None
    class_names: object = None
    mode: str = "a"
    durable: bool = True

    @classmethod
    def of(cls, options):
        """The options in the dict ``options`` (a TypeError names an unknown one)."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown recorder option {unknown[0]!r}; the options are "
                            f"{[f.name for f in fields(cls)]}")
        return cls(**options)


class RecorderBase:
    """What every recorder shares: the writer of the run (full outputs, or a summary), fed on
    a background thread, opened on the first epoch (when N and C are known), and the checks
    that later epochs see the same samples.

    Rows are stored in the order the recorder gives them (its data's order; dataset order
    under torch.distributed). Resuming an existing run (mode "a") matches rows by sample id,
    so a run recorded with one world size continues with another.
    """

    def __init__(self, path, **options):
        self.options = o = RecorderOptions.of(options)
        self.path = Path(path)
        self.dtype = np.dtype(o.dtype)
        self.summary = bool(o.summary)
        if self.summary:
            if not kind_named(o.kind).softmax:
                raise ForgetkitError(f"summary=True records logits; got kind={o.kind!r}")
            if self.path.suffix.lower() != ".npy" or o.format not in (None, "npy"):
                raise ForgetkitError(f"summary=True writes a .npy summary; got path "
                                     f"{str(self.path)!r} and format={o.format!r}")
        self.sample_ids = None if o.sample_ids is None else np.asarray(o.sample_ids)
        self.max_pending = o.max_pending
        self.durable = bool(o.durable)
        self._writer_options = dict(kind=o.kind, dtype=self.dtype, format=o.format,
                                    layout=o.layout, meta=o.meta, class_names=o.class_names,
                                    mode=o.mode)
        self._writer = None  # a BackgroundWriter, on the process that writes
        self._labels = None
        self._order = None  # rows of a recorded epoch in the order of a resumed run
        self._last_epoch = None

    def _commit(self, epoch, values, labels, n_classes, *, ids=None, meta=None):
        """Queue epoch ``epoch`` for writing after the checks that need no values.

        ``values``: outputs (N, C) in the stored dtype, or (summary=True) N summary records,
        or a callable returning either (run on the writer thread: a device-to-host copy);
        ``labels`` (N,) and ``ids`` (N,), the dataset index of each row (None: positions);
        ``meta``: the run's metadata from this epoch on (written with it), or None.
        """
        epoch = int(epoch)
        labels = np.asarray(labels).reshape(-1)
        if labels.dtype.kind not in "iu":  # refused as forgetkit.Run refuses them
            labels = check_labels(labels, len(labels), max(int(n_classes or 0), 2),
                                  name=f"labels of epoch {epoch}")
        labels = labels.astype(np.int64)
        if self._writer is None or self._writer.closed:
            if self._writer is not None:  # used again after close (a second fit): append
                self._writer_options["mode"] = "a"
            self._open(labels, n_classes, ids)
        else:
            self._writer.raise_error()
            if labels.shape != self._labels.shape or not np.array_equal(labels, self._labels):
                raise ForgetkitError(
                    f"epoch {epoch}: the data yielded other labels than at the first recorded "
                    "epoch; the evaluation data must come in the same order every epoch "
                    "(shuffle=False)"
                )
        if self._last_epoch is not None and epoch <= self._last_epoch:
            raise ForgetkitError(f"epoch {epoch} is not after the last recorded epoch "
                                 f"{self._last_epoch} of {str(self.path)!r} (epoch numbers must "
                                 "increase; mode='w' starts over)")
        self._last_epoch = epoch
        order = self._order
        if order is not None:
            values = _reordered(values, order)
        self._writer.submit(epoch, values, meta=meta)

    def _open(self, labels, n_classes, ids):
        """Open the writer for rows with these labels and dataset indices."""
        n = len(labels)
        ids = np.arange(n) if ids is None else np.asarray(ids)
        stored_ids = None
        if self.sample_ids is not None:
            if len(self.sample_ids) <= ids.max():
                raise ForgetkitError(f"sample_ids has {len(self.sample_ids)} entries; the data "
                                     f"holds dataset index {int(ids.max())}")
            stored_ids = self.sample_ids[ids]
        elif not np.array_equal(ids, np.arange(n)):
            stored_ids = ids
        self._order = None
        stored_labels, stored_ids = self._match_existing(labels, stored_ids)
        options = dict(self._writer_options)
        if self.summary:
            writer = SummaryWriter(self.path, n, n_classes, labels=stored_labels,
                                   sample_ids=stored_ids, class_names=options["class_names"],
                                   meta=options["meta"], mode=options["mode"],
                                   durable=self.durable)
        else:
            writer = RunWriter(self.path, n, n_classes, labels=stored_labels,
                               sample_ids=stored_ids, durable=self.durable, **options)
        self._writer = BackgroundWriter(writer, max_pending=self.max_pending)
        self._labels = labels
        self._last_epoch = writer.epochs[-1] if writer.epochs else None

    def _match_existing(self, labels, stored_ids):
        """(labels, ids) to write when appending to an existing run at ``path``: the stored
        run's, after checking that it holds the same samples with the same labels; the rows
        of each new epoch are put in its order (``_order``)."""
        if self._writer_options["mode"] != "a":
            return labels, stored_ids
        try:
            old = load(self.path)
        except Exception:  # no run there, or not one we can read: the writer reports it
            return labels, stored_ids
        n = len(labels)
        if old.n_samples != n:
            return labels, stored_ids  # the writer names the mismatch
        mine = np.arange(n) if stored_ids is None else stored_ids
        theirs = np.arange(n) if old.sample_ids is None else np.asarray(old.sample_ids)
        if not np.array_equal(mine, theirs):
            pos = pd.Index(mine).get_indexer(theirs)
            if (pos < 0).any() or len(np.unique(pos)) != n:
                lacking = theirs[pos < 0][:5].tolist()
                raise ForgetkitError(
                    f"the existing run at {str(self.path)!r} holds other samples than this "
                    f"recording (e.g. sample ids {lacking} are not in the data); resume with "
                    "the same evaluation data, or mode='w' to start over")
            self._order = pos
            labels, stored_ids = labels[pos], old.sample_ids
        if not np.array_equal(labels, old.labels):
            bad = int(np.argmax(labels != old.labels))
            raise ForgetkitError(
                f"the existing run at {str(self.path)!r} has label {int(old.labels[bad])} for "
                f"sample {theirs[bad]!r}; the data gives {int(labels[bad])} (resume with the "
                "same evaluation data, or mode='w' to start over)")
        return labels, stored_ids

    @property
    def epochs(self):
        """Epoch numbers written so far (waits for the queued ones)."""
        if self._writer is None:
            return []
        self._writer.flush()
        return list(self._writer.writer.epochs)

    def flush(self):
        """Wait until every recorded epoch is on disk; raise a writing error."""
        if self._writer is not None:
            self._writer.flush()

    def close(self):
        """Write the queued epochs and finish the run file (Parquet: merge the staged
        epochs); raises an error of the background writer."""
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            self._writer.abort()


def _reordered(values, order):
    """``values`` (or what the callable returns) with its rows taken in ``order``."""
    def rows():
        return np.asarray(values() if callable(values) else values)[order]

    return rows


def check_class_counts(shapes, epoch):
    """Raise if the output shapes of one epoch's batches are not (batch, n_classes) with
    one n_classes."""
    counts = sorted({int(s[-1]) for s in shapes})
    if len(counts) > 1:
        raise ForgetkitError(f"epoch {epoch}: the model returned {counts} classes in different "
                             "batches; every batch must give (batch, n_classes) outputs")
    if shapes and len(shapes[0]) != 2:
        raise ForgetkitError(f"epoch {epoch}: model outputs must have shape (batch, n_classes); "
                             f"got {tuple(shapes[0])} (use output_fn to pick the logits)")
