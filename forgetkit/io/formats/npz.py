"""The NPZ format: ``logits`` or ``probs`` (E, N, C) + ``labels`` (N,) and the optional
``epochs``, ``sample_ids``, ``class_names`` and ``meta`` in one zip (`forgetkit.io.npz`);
full runs only, loaded into memory. Its members' zip CRC-32 are checked as they are read."""

from __future__ import annotations

from pathlib import Path

from ..._validation import KINDS
from ...errors import MissingFileError
from ..atomic import atomic_write
from ..lock import RunLock
from ..npz import load_npz, write_npz
from ..registry import Format


class NpzFormat(Format):
    """``.npz``: a full run in one zip of arrays."""

    name = "npz"
    suffixes = (".npz",)
    kinds = KINDS
    description = "a .npz file"

    def can_open(self, path):
        return self.has_suffix(path)

    def load(self, path, *, labels=None, kind=None, verify=True):
        if not Path(path).exists():
            raise MissingFileError(f"no such run: {str(path)!r}")
        return load_npz(path, labels=labels, kind=kind, verify=verify)

    def save(self, run, path, *, compress=True, **options):
        with RunLock(path), atomic_write(path) as tmp:
            write_npz(tmp, run, compress=compress)
        return path

    def verify(self, path):
        run = self.load(path)  # every member's zip CRC-32 is checked as it is read
        return {"verifiable": True, "epochs": run.n_epochs, "bad": []}
