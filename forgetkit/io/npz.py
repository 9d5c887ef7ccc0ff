"""NPZ runs: ``logits`` or ``probs`` (E, N, C) + ``labels`` (N,), optional ``epochs``,
``sample_ids``, ``class_names`` and ``meta`` (a JSON string)."""

from __future__ import annotations

import json

import numpy as np

from .record import corrupt, make_run


def load_npz(path, *, labels=None, kind=None):
    try:
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files)
            key = "logits" if "logits" in files else "probs" if "probs" in files else None
            if key is None:
                raise ValueError(
                    f"{str(path)!r} holds neither 'logits' nor 'probs'; keys: {sorted(files)}"
                )
            outputs = z[key]
            record = {"kind": key}
            if "labels" in files:
                record["labels"] = z["labels"]
            for name in ("epochs", "sample_ids", "class_names"):
                if name in files:
                    record[name] = z[name]
            if "meta" in files:
                text = str(z["meta"])
                try:
                    record["meta"] = json.loads(text) if text else {}
                except json.JSONDecodeError:
                    record["meta"] = {"text": text}
    except ValueError:
        raise
    except Exception as err:
        raise corrupt(path, err) from None
    if record.get("class_names") is not None:
        record["class_names"] = [str(c) for c in record["class_names"]]
    if record.get("epochs") is not None:
        record["epochs"] = list(record["epochs"])
    return make_run(outputs, record, labels, kind)


def write_npz(path, run, *, compress=True):
    """Write ``run`` to the file ``path`` (already a temporary path) as NPZ."""
    arrays = {run.kind: np.asarray(run.outputs), "labels": run.labels,
              "epochs": run.epochs, "meta": np.array(json.dumps(run.meta))}
    if run.sample_ids is not None:
        arrays["sample_ids"] = np.asarray(run.sample_ids).astype(str) \
            if np.asarray(run.sample_ids).dtype == object else run.sample_ids
    if run.class_names is not None:
        arrays["class_names"] = np.array(run.class_names)
    with open(path, "wb") as f:
        (np.savez_compressed if compress else np.savez)(f, **arrays)
