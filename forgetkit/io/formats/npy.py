"""The NPY format: ``<name>.npy`` with its sidecar ``<name>.forgetkit.json``, for full runs
(an (E, N, C) float tensor, `forgetkit.io.npy`), summaries ((E, N) summary records,
`forgetkit.io.summary`) and top-k runs ((E, N) top-k records and the token table
``<name>.tokens.npy``, `forgetkit.io.topk`). The sidecar's ``"format"`` says which."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..._validation import KINDS
from ...errors import CorruptFileError, MissingFileError
from ..integrity import KEY as CRC_KEY
from ..integrity import RECORD_KEY, bad_epochs, check_fields, is_verified, stored_checksums
from ..lock import RunLock
from ..npy import epochs_of_record, load_npy, open_memmap, open_records, read_sidecar, write_npy
from ..pair import commit_pair, open_pair
from ..record import needs_checksums, record_of, with_checksums
from ..registry import Format
from ..summary import is_summary, load_summary, read_summary_sidecar, summarize
from ..topk import is_topk, load_topk, read_topk_sidecar, save_topk, topk_bad_epochs
from .npy_shards import open_npy_shard


def save_full_npy(run, path):
    """Write the full run ``run`` as the tensor and its sidecar, committed as one."""
    epochs = ((int(run.epochs[e]), run.epoch_values(e)) for e in range(run.n_epochs))
    with RunLock(path):
        commit_pair(path, lambda tmp: write_npy(tmp, epochs, run.outputs.dtype, run.shape),
                    lambda crcs: with_checksums(record_of(run), crcs))


class RecordLayout(NamedTuple):
    """How the NPY format stores one kind of record runs."""

    holds: Callable  # path -> whether its sidecar is this kind's
    load: Callable  # (path, *, labels, verify) -> Run
    save: Callable  # (run, path)
    read_sidecar: Callable  # sidecar file -> record or None
    bad_epochs: Callable | None = None  # (path, records, record, sums) -> more bad indices


#: The record kinds' layouts, by kind; any other NPY file is a full run.
RECORD_KINDS = {
    "summary": RecordLayout(is_summary, load_summary, summarize,
                            read_summary_sidecar),
    "topk": RecordLayout(is_topk, load_topk, save_topk, read_topk_sidecar, topk_bad_epochs),
}


def stored_kind(path):
    """The record kind ("summary", "topk") that the sidecar of ``path`` names, or None."""
    return next((kind for kind, layout in RECORD_KINDS.items() if layout.holds(path)), None)


def verify_npy(path):
    """`forgetkit.verify` of the NPY run at ``path``: every epoch against its checksum (and
    what its record kind's layout checks besides)."""
    result = {"verifiable": False, "epochs": 0, "bad": []}
    layout = RECORD_KINDS.get(stored_kind(path))
    tensor, record, _ = open_pair(path, open_records if layout else open_memmap,
                                  layout.read_sidecar if layout else read_sidecar)
    record = record or {}
    tensor = epochs_of_record(path, tensor, record)
    sums = stored_checksums(record, f"the sidecar of {str(path)!r}")
    if sums is None:
        if needs_checksums(record):
            raise CorruptFileError(f"the sidecar of {str(path)!r} lacks its checksums "
                                   f"(field {CRC_KEY!r})")
        return result
    check_fields(record, sums, path)
    more = layout.bad_epochs(path, tensor, record, sums) if layout and layout.bad_epochs \
        else set()
    if len(sums["outputs"]) < len(tensor):
        raise CorruptFileError(f"the sidecar of {str(path)!r} has checksums of "
                               f"{len(sums['outputs'])} epochs; the file holds {len(tensor)}")
    epochs = record.get("epochs") or []
    held = is_verified(path) and len(tensor) == len(sums["outputs"])  # by this process
    bad = sorted(set([] if held else bad_epochs(tensor, sums["outputs"][: len(tensor)]))
                 | more)
    return dict(result, verifiable=True, metadata=RECORD_KEY in sums, epochs=len(tensor),
                bad=[int(epochs[e]) for e in bad])


class NpyFormat(Format):
    """``.npy`` with its sidecar: full runs (memory-mapped), summaries and top-k runs."""

    name = "npy"
    suffixes = (".npy",)
    kinds = (*KINDS, *RECORD_KINDS)
    description = "a .npy file (with its .forgetkit.json sidecar)"

    shards = True

    def can_open(self, path):
        return self.has_suffix(path)

    def load(self, path, *, labels=None, kind=None, verify=True):
        path = Path(path)
        if not path.exists():
            raise MissingFileError(f"no such run: {str(path)!r}")
        stored = stored_kind(path)
        if stored is not None and kind in (None, stored):
            return RECORD_KINDS[stored].load(path, labels=labels, verify=verify)
        return load_npy(path, labels=labels, kind=kind, verify=verify)

    def save(self, run, path, **options):
        if run.kind in RECORD_KINDS:  # written as what it is
            RECORD_KINDS[run.kind].save(run, path)
        else:
            save_full_npy(run, path)
        return path

    def verify(self, path):
        if not Path(path).exists():
            raise MissingFileError(f"no such run: {str(path)!r}")
        return verify_npy(path)

    def open_shard(self, fs, path, name, *, verify=True):
        return open_npy_shard(fs, path, name, verify=verify)
