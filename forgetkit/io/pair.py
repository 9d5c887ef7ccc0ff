"""A tensor file and its sidecar, changed together.

A write of both (`commit_pair`) writes the new tensor and the new sidecar to temporary
files, renames the new sidecar to ``<sidecar>.next`` (pending), renames the tensor into
place, then renames the pending sidecar over the sidecar: that last rename is the commit.
A kill at any point leaves the old pair, or the new tensor beside the old sidecar and the
new pending one.

A reader (`open_pair`) notes the sidecar's identity, reads it, opens the tensor (one file
handle, so that the header and the data come from the same file), and then looks again:
if a pending sidecar exists or the sidecar changed meanwhile, a write was under way, and the
record that the tensor's checksums match is taken (the pending one, or the sidecar read
again). So a reader sees the old run or the new one, never one's tensor with the other's
labels or epochs.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CorruptFileError
from .atomic import atomic_write, fsync_path, write_json_atomic
from .integrity import bad_epochs, forget_verified, stored_checksums
from .record import sidecar_path

PENDING_SUFFIX = ".next"
#: Reads of a pair that a writer changes meanwhile are retried this many times.
READ_ATTEMPTS = 5


def pending_path(path):
    """The pending sidecar of the tensor at ``path``: ``<sidecar>.next``."""
    sidecar = sidecar_path(path)
    return sidecar.with_name(sidecar.name + PENDING_SUFFIX)


def commit_pair(path, write_tensor, record_for):
    """Write the tensor at ``path`` and its sidecar as one.

    ``write_tensor(tmp)`` writes the tensor to the temporary path ``tmp`` and returns what
    ``record_for`` takes to make the sidecar record (the epochs' checksums).
    """
    path = Path(path)
    pending = pending_path(path)
    with atomic_write(path) as tmp:
        record = record_for(write_tensor(tmp))
        write_json_atomic(pending, record)  # on disk before the tensor is renamed
    os.replace(pending, sidecar_path(path))  # the commit
    fsync_path(path.parent)
    forget_verified(path)


def file_identity(file):
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def open_pair(path, open_tensor, read_record, *, matches=None):
    """(tensor, record, settled) of the pair at ``path``: ``open_tensor(path)`` opens the
    tensor (an array of epochs), ``read_record(file)`` reads a sidecar file (None if absent).

    ``settled`` is False when a write was under way: the record returned is then the one whose
    checksums the tensor's epochs match (verified here, in full); ``matches(tensor, record)``
    says whether they do (default: a run's record, the CRC32C of every epoch)."""
    matches = matches or (lambda tensor, record: _matches(tensor, record, path))
    path = Path(path)
    sidecar, pending = sidecar_path(path), pending_path(path)
    for _ in range(READ_ATTEMPTS):
        before = file_identity(sidecar)
        record = read_record(sidecar) if before is not None else None
        tensor = open_tensor(path)
        if not pending.exists() and file_identity(sidecar) == before:
            return tensor, record, True
        candidates = [read_record(pending), read_record(sidecar)]
        for candidate in candidates:
            if candidate is not None and matches(tensor, candidate):
                return tensor, candidate, False
    raise CorruptFileError(f"{str(path)!r} does not match its sidecar or the pending one "
                           f"{str(pending)!r}: the run is being rewritten without pause, or "
                           "the files are corrupt")


def _matches(tensor, record, path):
    """Whether every epoch of ``tensor`` matches the checksums of ``record``."""
    sums = stored_checksums(record, f"the sidecar of {str(path)!r}")
    epochs = record.get("epochs") or []
    if sums is None or len(tensor) > len(sums["outputs"]) or len(tensor) > len(epochs):
        return False
    return not bad_epochs(tensor, sums["outputs"])
