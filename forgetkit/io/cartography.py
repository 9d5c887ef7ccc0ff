"""Import of Dataset Cartography training-dynamics folders (``dynamics_epoch_*.jsonl``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..run import Run

_CARTO_FILE = re.compile(r"dynamics_epoch_(\d+)\.jsonl$")


def load_cartography(folder, *, labels=None, kind=None):
    """Import a Dataset Cartography training-dynamics folder (``dynamics_epoch_*.jsonl``).

    Each line holds ``guid``, ``logits_epoch_X`` and ``gold``; rows are aligned by guid on
    the first epoch's order, which becomes ``run.sample_ids``.
    """
    folder = Path(folder)
    files = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                    if (m := _CARTO_FILE.search(p.name))), key=lambda t: t[0])
    if not files:
        raise ValueError(f"{str(folder)!r} holds no dynamics_epoch_*.jsonl files")
    guids, gold, epochs, outputs = None, None, [], []
    for epoch, file in files:
        rows = {}
        with open(file) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    rows[rec["guid"]] = (rec[f"logits_epoch_{epoch}"], rec["gold"])
                except (json.JSONDecodeError, KeyError) as err:
                    raise ValueError(f"{file.name} line {lineno}: not a training-dynamics "
                                     f"record with guid, logits_epoch_{epoch}, gold ({err})"
                                     ) from None
        if guids is None:
            guids = list(rows)
            gold = np.array([rows[g][1] for g in guids], dtype=np.int64)
        elif set(rows) != set(guids):
            raise ValueError(f"{file.name} holds other guids than the first epoch's file")
        outputs.append(np.array([rows[g][0] for g in guids], dtype=np.float32))
        epochs.append(epoch)
    try:
        stacked = np.stack(outputs)
    except ValueError:
        raise ValueError("epochs of the cartography folder have different class counts") from None
    return Run(stacked, gold if labels is None else labels, kind=kind or "logits",
               epochs=epochs, sample_ids=np.array(guids),
               meta={"source": "dataset-cartography", "folder": str(folder)})
