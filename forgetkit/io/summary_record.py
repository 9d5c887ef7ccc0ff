"""What a summary run's NPY and Parquet layouts share: its metadata record and the Run of
loaded summary records (`summary_run`), their fields range-checked. The records themselves
are `forgetkit.kinds.summary`'s."""

from __future__ import annotations

import numpy as np

from ..errors import CorruptFileError, ForgetkitError
from ..kinds.summary import SUMMARY_DTYPE, SummaryOutputs
from ..run import Run
from .record import RECORD_VERSION, check_record, jsonable, refuse_duplicate_ids

FORMAT = "forgetkit-summary"


FORMAT = "forgetkit-summary"


def summary_record(*, n_samples, n_classes, epochs, labels, sample_ids=None,
                   class_names=None, meta=None):
    """The sidecar record of a summary run."""
    return {
        "format": FORMAT,
        "version": RECORD_VERSION,
        "kind": "summary",
        "fields": [name for name in SUMMARY_DTYPE.names],
        "n_samples": int(n_samples),
        "n_classes": int(n_classes),
        "epochs": [int(e) for e in epochs],
        "labels": [int(v) for v in labels],
        "sample_ids": jsonable(sample_ids),
        "class_names": class_names,
        "meta": meta,
    }


def summary_run(path, records, record, labels, where, *, verify=None):
    """The summary Run of ``records`` (E, N) of SUMMARY_DTYPE and their metadata
    ``record`` (``where`` names it), fields range-checked; ``labels`` override; ``verify``
    (a callable) checks the checksums once the sizes are known to agree."""
    check_record({k: v for k, v in record.items() if k != "kind"}, where)  # kind: summary
    for name in ("n_samples", "n_classes", "epochs", "labels"):
        if record.get(name) is None and not (name == "labels" and labels is not None):
            raise CorruptFileError(f"{where} lacks the field {name!r}")
    if records.dtype != SUMMARY_DTYPE or records.ndim != 2 \
            or records.shape[1] != record["n_samples"]:
        raise ForgetkitError(f"{str(path)!r} must hold summary records of shape (epochs, "
                             f"{record['n_samples']}) and dtype {SUMMARY_DTYPE.descr}; got "
                             f"{records.dtype} of shape {records.shape}")
    epochs = record["epochs"][: records.shape[0]]
    if records.shape[0] == 0 or len(epochs) != records.shape[0]:
        raise ForgetkitError(f"{str(path)!r} holds {records.shape[0]} epochs and its metadata "
                             f"names {len(record['epochs'])}; a summary needs at least one epoch")
    if verify is not None:
        verify()
    for field in ("label", "other", "lse"):
        if not np.isfinite(records[field]).all():
            raise ForgetkitError(f"{str(path)!r}: field {field!r} holds NaN or inf")
    other = records["other_class"]
    if other.size and (int(other.min()) < 0 or int(other.max()) >= record["n_classes"]):
        raise CorruptFileError(f"{str(path)!r}: field 'other_class' holds classes outside "
                               f"[0, {record['n_classes']}): the file is corrupt")
    refuse_duplicate_ids(record.get("sample_ids"), path)
    try:
        return Run(SummaryOutputs(records, record["n_classes"]),
                   record["labels"] if labels is None else labels, kind="summary",
                   epochs=epochs, sample_ids=record.get("sample_ids"),
                   class_names=record.get("class_names"), meta=record.get("meta"), source=path)
    except ForgetkitError as err:
        raise type(err)(f"{str(path)!r}: {err}") from None
