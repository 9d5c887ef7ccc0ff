"""Import of Dataset Cartography training-dynamics folders (``dynamics_epoch_*.jsonl``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from .._validation import check_path
from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from .record import make_run

_CARTO_FILE = re.compile(r"dynamics_epoch_(\d+)\.jsonl$")


def load_cartography(folder, *, labels=None, kind=None):
    """Import a Dataset Cartography training-dynamics folder (``dynamics_epoch_*.jsonl``).

    Each line holds ``guid``, ``logits_epoch_X`` and ``gold``; rows are aligned by guid on
    the first epoch's order, which becomes ``run.sample_ids``.
    """
    folder = Path(check_path("folder", folder))
    if not folder.is_dir():
        raise MissingFileError(f"{str(folder)!r} is not a folder (of dynamics_epoch_*.jsonl "
                               "files)")
    files = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                    if (m := _CARTO_FILE.search(p.name))), key=lambda t: t[0])
    if not files:
        raise ForgetkitError(f"{str(folder)!r} holds no dynamics_epoch_*.jsonl files")
    guids, gold, epochs, outputs = None, None, [], []
    for epoch, file in files:
        rows = _read_dynamics(file, epoch)
        if guids is None:
            guids = list(rows)
            gold = [rows[g][1] for g in guids]
        elif set(rows) != set(guids):
            raise ForgetkitError(f"{file.name} holds other guids than the first epoch's file")
        try:
            outputs.append(np.array([rows[g][0] for g in guids], dtype=np.float32))
        except (ValueError, TypeError):
            raise CorruptFileError(f"{str(file)!r}: the logits must be lists of numbers of one "
                                   "length") from None
        epochs.append(epoch)
    try:
        stacked = np.stack(outputs)
    except ValueError:
        raise ForgetkitError(
            "epochs of the cartography folder have different class counts") from None
    record = {"labels": gold, "epochs": epochs, "sample_ids": guids,
              "meta": {"source": "dataset-cartography", "folder": str(folder)}}
    return make_run(stacked, record, labels, kind, source=folder)


def _read_dynamics(file, epoch):
    """{guid: (logits, gold)} of one ``dynamics_epoch_*.jsonl`` file, each record checked."""
    rows = {}
    key = f"logits_epoch_{epoch}"
    with open(file, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                guid, logits, gold = rec["guid"], rec[key], rec["gold"]
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError,
                    TypeError) as err:
                raise CorruptFileError(
                    f"{str(file)!r} line {lineno}: not a training-dynamics record with guid, "
                    f"{key}, gold ({type(err).__name__}: {err})") from None
            if not isinstance(guid, (str, int)) or isinstance(guid, bool) \
                    or not isinstance(logits, list) \
                    or not isinstance(gold, int) or isinstance(gold, bool):
                raise CorruptFileError(
                    f"{str(file)!r} line {lineno}: guid must be a string or integer, {key} a "
                    f"list of numbers and gold an integer; got {line[:80]!r}")
            rows[guid] = (logits, gold)
    return rows
