"""The JSON metadata record of a run (everything but the outputs), sidecar files, and the
pieces every loader shares."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from ..run import Run

SIDECAR_SUFFIX = ".forgetkit.json"
FORMATS = ("npz", "npy", "parquet", "cartography")


def format_of(path):
    """The format of ``path`` from its extension (or a Dataset Cartography folder)."""
    path = Path(path)
    if path.is_dir() and glob.glob(str(path / "dynamics_epoch_*.jsonl")):
        return "cartography"
    suffix = path.suffix.lower()
    if suffix in (".npz", ".npy", ".parquet"):
        return suffix[1:]
    raise ValueError(
        f"cannot tell the format of {str(path)!r}: expected a .npz, .npy or .parquet file "
        "or a Dataset Cartography folder (dynamics_epoch_*.jsonl)"
    )


def jsonable(values):
    """A list of plain Python values of an array-like, or None."""
    if values is None:
        return None
    return [v.item() if isinstance(v, np.generic) else v for v in np.asarray(values).tolist()]


def run_record(*, kind, dtype, n_samples, n_classes, epochs, labels, sample_ids=None,
               class_names=None, meta=None):
    """The JSON metadata record of a run."""
    return {
        "format": "forgetkit-run",
        "version": 1,
        "kind": kind,
        "dtype": np.dtype(dtype).name,
        "n_samples": int(n_samples),
        "n_classes": int(n_classes),
        "epochs": [int(e) for e in epochs],
        "labels": [int(v) for v in labels],
        "sample_ids": jsonable(sample_ids),
        "class_names": class_names,
        "meta": meta,
    }


def record_of(run):
    """`run_record` of a Run."""
    return run_record(kind=run.kind, dtype=run.outputs.dtype, n_samples=run.n_samples,
                      n_classes=run.n_classes, epochs=run.epochs, labels=run.labels,
                      sample_ids=run.sample_ids, class_names=run.class_names, meta=run.meta)


def sidecar_path(path):
    """``<name>.forgetkit.json`` beside ``<name>.npy``."""
    path = Path(path)
    return path.with_name(path.name[: -len(path.suffix)] + SIDECAR_SUFFIX)


def corrupt(path, err):
    """The error for a file that cannot be decoded."""
    return ValueError(f"cannot read {str(path)!r}: the file is truncated or corrupt ({err})")


def load_labels_file(path):
    """Labels from a .npy file or a text file of integers."""
    path = Path(path)
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such labels file: {str(path)!r}") from None
    except Exception as err:
        raise ValueError(f"cannot read labels from {str(path)!r}: {err}") from None


def make_run(outputs, record, labels, kind):
    """A Run of loaded outputs and their metadata record; ``labels``/``kind`` override."""
    if labels is None:
        labels = record.get("labels")
    if labels is None:
        raise ValueError("this run stores no labels: pass labels= (an array or a .npy file)")
    n_epochs = outputs.shape[0] if outputs.ndim == 3 else None
    epochs = record.get("epochs")
    if epochs is not None and n_epochs is not None:
        epochs = np.asarray(epochs[:n_epochs], dtype=np.int64)
        if len(epochs) != n_epochs:
            epochs = None if len(epochs) == 0 else epochs
    return Run(
        outputs,
        labels,
        kind=kind or record.get("kind", "logits"),
        epochs=epochs,
        sample_ids=record.get("sample_ids"),
        class_names=record.get("class_names"),
        meta=record.get("meta"),
    )
