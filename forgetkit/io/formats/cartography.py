"""Dataset Cartography folders (``dynamics_epoch_*.jsonl``, `forgetkit.io.cartography`):
read only, and without checksums."""

from __future__ import annotations

import glob
from pathlib import Path

from ...errors import MissingFileError
from ..cartography import load_cartography
from ..registry import Format


class CartographyFormat(Format):
    """A folder of ``dynamics_epoch_<e>.jsonl`` files: logits, read only."""

    name = "cartography"
    kinds = ("logits",)
    description = "a Dataset Cartography folder (dynamics_epoch_*.jsonl)"

    def can_open(self, path):
        path = Path(path)
        return path.is_dir() and bool(glob.glob(glob.escape(str(path)) +
                                                "/dynamics_epoch_*.jsonl"))

    def load(self, path, *, labels=None, kind=None, verify=True):
        if not Path(path).is_dir():
            raise MissingFileError(f"no such run: {str(path)!r}")
        return load_cartography(path, labels=labels, kind=kind)

    def verify(self, path):
        return {"verifiable": False, "epochs": 0, "bad": []}  # it stores no checksums
