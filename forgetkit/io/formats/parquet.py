"""The Parquet format: one row per (epoch, sample) and one row group per epoch, the run's
record in the schema metadata, for full runs (`forgetkit.io.parquet`, lazy), summaries
(`forgetkit.io.summary_parquet`) and top-k runs (`forgetkit.io.topk_parquet`). The
record's ``"format"`` says which. An unfinished writer's epochs, staged in
``<name>.parquet.partial/``, load (and verify) as the run until it closes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq

from ..._validation import KINDS
from ...errors import CorruptFileError, MissingFileError
from ..atomic import atomic_write
from ..integrity import RECORD_KEY
from ..lock import RunLock
from ..parquet import CRC_METADATA_KEY, load_parquet, open_parquet_run, staging_path, write_parquet
from ..record import record_of
from ..registry import Format
from ..summary import load_summary, staged_summary, summarize
from ..summary_parquet import is_summary_parquet, load_summary_parquet, read_summary_parquet
from ..topk import save_topk
from ..topk_parquet import is_topk_parquet, load_topk_parquet, read_topk_parquet
from .npy import verify_npy
from .parquet_shards import open_parquet_shard


class RecordLayout(NamedTuple):
    """How the Parquet format stores one kind of record runs (loaded into memory, every
    epoch verified as it is read)."""

    holds: Callable  # path -> whether its metadata is this kind's
    load: Callable  # (path, *, labels, verify) -> Run
    save: Callable  # (run, path)
    read: Callable  # (path, *, bad) -> (records, record, ...): bad epochs' indices in bad


#: The record kinds' layouts, by kind; any other Parquet file is a full run.
RECORD_KINDS = {
    "topk": RecordLayout(is_topk_parquet, load_topk_parquet, save_topk, read_topk_parquet),
    "summary": RecordLayout(is_summary_parquet, load_summary_parquet, summarize,
                            read_summary_parquet),
}


def stored_kind(path):
    """The record kind ("summary", "topk") that the metadata of ``path`` names, or None."""
    return next((kind for kind, layout in RECORD_KINDS.items() if layout.holds(path)), None)


def save_full_parquet(run, path, layout):
    """Write the full run ``run`` (``layout``: "list" or "binary") atomically."""
    epochs = ((int(run.epochs[e]), run.epoch_values(e)) for e in range(run.n_epochs))
    with RunLock(path), atomic_write(path) as tmp:
        write_parquet(tmp, epochs, run.n_classes, run.outputs.dtype, layout, record_of(run))


def verify_full_parquet(path):
    """`forgetkit.verify` of a full Parquet run (or a `RunWriter`'s staged epochs)."""
    source = open_parquet_run(path, staging_path(path))
    if all(c is None for c in source.crcs):
        return {"verifiable": False, "epochs": 0, "bad": []}
    bad = []
    for i, e in enumerate(source.epochs):
        try:
            source.read_epoch(i)
        except CorruptFileError:
            bad.append(int(e))
    return {"verifiable": True, "metadata": covers_metadata(path),
            "epochs": len(source.epochs), "bad": bad}


def covers_metadata(path):
    """Whether the checksums of the finished Parquet run at ``path`` cover its metadata
    (False for files written before they did, and for a writer's staged epochs)."""
    if not Path(path).exists():
        return False
    stored = (pq.read_metadata(path).metadata or {}).get(CRC_METADATA_KEY)
    return stored is not None and RECORD_KEY in json.loads(stored)  # checked by the load


class ParquetFormat(Format):
    """``.parquet``: full runs (list or binary layout), summaries and top-k runs."""

    name = "parquet"
    suffixes = (".parquet",)
    kinds = (*KINDS, *RECORD_KINDS)
    description = "a .parquet file"

    shards = True

    def can_open(self, path):
        return self.has_suffix(path)

    def load(self, path, *, labels=None, kind=None, verify=True):
        path = Path(path)
        if not path.exists():  # an unfinished writer: its completed epochs
            if staged_summary(path).exists():
                return load_summary(staged_summary(path), labels=labels, verify=verify)
            if not staging_path(path).is_dir():
                raise MissingFileError(f"no such run: {str(path)!r}")
            return load_parquet(path, labels=labels, kind=kind, verify=verify)
        stored = stored_kind(path)
        if stored is not None and kind in (None, stored):
            return RECORD_KINDS[stored].load(path, labels=labels, verify=verify)
        return load_parquet(path, labels=labels, kind=kind, verify=verify)

    def save(self, run, path, *, layout="list", **options):
        if run.kind in RECORD_KINDS:  # written as what it is
            RECORD_KINDS[run.kind].save(run, path)
        else:
            save_full_parquet(run, path, layout)
        return path

    def verify(self, path):
        path = Path(path)
        if not path.exists() and staged_summary(path).exists():
            return verify_npy(staged_summary(path))  # a SummaryWriter's staged epochs
        if not path.exists() and not staging_path(path).is_dir():
            raise MissingFileError(f"no such run: {str(path)!r}")
        stored = stored_kind(path) if path.exists() else None
        if stored is not None:  # every epoch checked as it is read
            bad = []
            records, record, *_ = RECORD_KINDS[stored].read(path, bad=bad)
            return {"verifiable": True, "metadata": covers_metadata(path),
                    "epochs": len(records), "bad": [int(record["epochs"][e]) for e in bad]}
        return verify_full_parquet(path)

    def open_shard(self, fs, path, name, *, verify=True):
        return open_parquet_shard(fs, path, name, verify=verify)
