"""Self-distillation targets: the fused predictions of a run's own checkpoints on the
training set, written as soft labels keyed by sample id (see the README for the loss)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ForgetkitError
from ..io.atomic import atomic_write, write_json_atomic
from ..io.guard import refuse_overwrite
from ..io.record import sidecar_path
from ..probs import LOG_FLOOR


def soft_targets(fuser, train_run, *, temperature=1.0):
    """Fused probabilities of ``train_run`` (N, C), sharpened or softened by ``temperature``:
    softmax(log(p) / T). ``fuser`` is any fitted forgetkit fuser (e.g. a KnowledgeFusion plan
    fitted on validation data); ``train_run`` must hold the epochs the fuser uses."""
    if not temperature > 0:
        raise ForgetkitError(f"temperature must be > 0; got {temperature}")
    p = fuser.predict_proba(train_run)
    if temperature == 1.0:
        return p
    logp = np.log(np.clip(p, LOG_FLOOR, None)) / temperature
    logp -= logp.max(axis=1, keepdims=True)
    q = np.exp(logp)
    return q / q.sum(axis=1, keepdims=True)


def write_soft_targets(path, fuser, train_run, *, temperature=1.0):
    """Write soft targets keyed by sample id, atomically.

    ``.parquet``: columns ``sample_id``, ``label``, ``targets`` (list of float32).
    ``.npy``: targets float32 (N, C), with ``sample_id`` and ``label`` in the sidecar
    ``<name>.forgetkit.json``. Refuses a ``path`` (or sidecar) that is the file
    ``train_run`` was loaded from or a file kept beside it.
    """
    path = Path(path)
    if path.suffix not in (".parquet", ".npy"):
        raise ForgetkitError(f"soft targets are written as .parquet or .npy; got {str(path)!r}")
    refuse_overwrite({"the soft targets file": path}, [train_run.source])
    q = soft_targets(fuser, train_run, temperature=temperature).astype(np.float32)
    ids = train_run.sample_ids if train_run.sample_ids is not None else \
        np.arange(train_run.n_samples)
    with atomic_write(path) as tmp:
        if path.suffix == ".parquet":
            table = pa.table({
                "sample_id": pa.array(np.asarray(ids).tolist()),
                "label": pa.array(train_run.labels),
                "targets": pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)),
                                                             q.shape[1]),
            }, metadata={b"forgetkit": json.dumps({"temperature": temperature}).encode()})
            pq.write_table(table, tmp)
        else:
            with open(tmp, "wb") as f:
                np.save(f, q)
            write_json_atomic(sidecar_path(path), {
                "format": "forgetkit-soft-targets", "temperature": temperature,
                "sample_id": np.asarray(ids).tolist(), "label": train_run.labels.tolist()})
    return path

