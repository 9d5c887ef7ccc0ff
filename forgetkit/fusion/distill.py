"""Self-distillation targets: the fused predictions of a run's own checkpoints on the
training set, written as soft labels keyed by sample id (see the README for the loss)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._validation import check_number, check_path
from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from ..io.atomic import atomic_write
from ..io.guard import refuse_overwrite
from ..io.integrity import crc_array
from ..io.pair import commit_pair, open_pair
from ..io.record import parse_record, sidecar_path
from ..probs import LOG_FLOOR
from ..run import check_run
from .base import check_fuser

#: The ``format`` of the sidecar of .npy soft targets.
FORMAT = "forgetkit-soft-targets"


def soft_targets(fuser, train_run, *, temperature=1.0):
    """Fused probabilities of ``train_run`` (N, C), sharpened or softened by ``temperature``:
    softmax(log(p) / T). ``fuser`` is any fitted forgetkit fuser (e.g. a KnowledgeFusion plan
    fitted on validation data); ``train_run`` must hold the epochs the fuser uses."""
    check_fuser("fuser", fuser)
    check_run("train_run", train_run)
    if not check_number("temperature", temperature) > 0:
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
    ``.npy``: targets float32 (N, C), with ``sample_id``, ``label`` and the targets' CRC32C
    (``crc32c``) in the sidecar ``<name>.forgetkit.json``; the two files change together
    (`forgetkit.io.pair.commit_pair`: a reader that finds ``<name>.forgetkit.json.next``
    takes the sidecar whose ``crc32c`` the targets match, as `read_soft_targets` does).
    Refuses a ``path`` (or sidecar) that is the file ``train_run`` was loaded from or a file
    kept beside it.
    """
    path = Path(check_path("path", path))
    check_fuser("fuser", fuser)
    check_run("train_run", train_run)
    if path.suffix not in (".parquet", ".npy"):
        raise ForgetkitError(f"soft targets are written as .parquet or .npy; got {str(path)!r}")
    refuse_overwrite({"the soft targets file": path}, [train_run.source])
    q = soft_targets(fuser, train_run, temperature=temperature).astype(np.float32)
    ids = train_run.sample_ids if train_run.sample_ids is not None else \
        np.arange(train_run.n_samples)
    if path.suffix == ".parquet":
        with atomic_write(path) as tmp:
            table = pa.table({
                "sample_id": pa.array(np.asarray(ids).tolist()),
                "label": pa.array(train_run.labels),
                "targets": pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)),
                                                             q.shape[1]),
            }, metadata={b"forgetkit": json.dumps({"temperature": temperature}).encode()})
            pq.write_table(table, tmp)
        return path

    def write_tensor(tmp):
        with open(tmp, "wb") as f:
            np.save(f, q)
        return crc_array(q)

    commit_pair(path, write_tensor, lambda crc: {
        "format": FORMAT, "temperature": temperature, "sample_id": np.asarray(ids).tolist(),
        "label": train_run.labels.tolist(), "crc32c": crc})
    return path


def read_soft_targets(path):
    """(sample_id, label, targets float32 (N, C)) of the soft targets at ``path`` written by
    `write_soft_targets`. For ``.npy``, the targets are checked against the sidecar's CRC32C
    (CorruptFileError if they differ), and a pair being rewritten gives the old targets or the
    new ones with their own ids and labels, never a mix."""
    path = Path(check_path("path", path))
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        targets = np.stack(table.column("targets").to_numpy(zero_copy_only=False))
        return (table.column("sample_id").to_pylist(),
                np.asarray(table.column("label").to_numpy()),
                targets.astype(np.float32, copy=False))
    if not path.exists():
        raise MissingFileError(f"no such soft targets file: {str(path)!r}")

    def read_record(file):
        try:
            record = parse_record(Path(file).read_bytes(), f"the sidecar {str(file)!r}")
        except FileNotFoundError:
            return None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise CorruptFileError(f"the sidecar {str(file)!r} is not that of soft targets "
                                   f"(format {FORMAT!r})")
        return record

    def matches(targets, record):
        return record.get("crc32c") == crc_array(targets)

    targets, record, settled = open_pair(path, lambda p: np.load(p, allow_pickle=False),
                                         read_record, matches=matches)
    if record is None:
        raise MissingFileError(f"the soft targets {str(path)!r} have no sidecar "
                               f"{str(sidecar_path(path))!r}")
    if settled and "crc32c" in record and not matches(targets, record):
        raise CorruptFileError(f"{str(path)!r} does not match the checksum in its sidecar: "
                               "the targets are corrupt")
    ids, labels = record.get("sample_id"), record.get("label")
    if not (isinstance(ids, list) and isinstance(labels, list)
            and len(ids) == len(labels) == len(targets)):
        raise CorruptFileError(f"the sidecar of {str(path)!r} must hold 'sample_id' and "
                               f"'label' for each of the {len(targets)} rows")
    return ids, np.asarray(labels, dtype=np.int64), targets
