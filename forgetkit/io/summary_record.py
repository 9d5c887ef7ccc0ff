"""What a summary run's NPY and Parquet layouts share: its metadata record and the Run of
loaded summary records (`summary_run`), their fields range-checked. The records themselves
are `forgetkit.kinds.summary`'s."""

from __future__ import annotations

import numpy as np

from ..errors import CorruptFileError, ForgetkitError
from ..kinds.summary import SUMMARY_DTYPE, SummaryOutputs
from ..run import Run
from .record import (
    RECORD_VERSION,
    check_record,
    identity_fields,
    refuse_duplicate_ids,
    stored_epochs,
)

FORMAT = "forgetkit-summary"


FORMAT = "forgetkit-summary"


def summary_record(*, n_samples, n_classes, epochs, labels, sample_ids=None,
                   class_names=None, meta=None):
    """The sidecar record of a summary run."""
    return {"format": FORMAT, "version": RECORD_VERSION, "kind": "summary",
            "fields": list(SUMMARY_DTYPE.names),
            **identity_fields(n_samples=n_samples, n_classes=n_classes, epochs=epochs,
                              labels=labels, sample_ids=sample_ids, class_names=class_names,
                              meta=meta)}


def summary_run(path, records, record, labels, where, *, verify=None):
    """The summary Run of ``records`` (E, N) of SUMMARY_DTYPE and their metadata
    ``record`` (``where`` names it), fields range-checked; ``labels`` override; ``verify``
    (a callable) checks the checksums once the sizes are known to agree."""
    check_record({k: v for k, v in record.items() if k != "kind"}, where)  # kind: summary
    for name in ("n_samples", "n_classes", "epochs", "labels"):
        if record.get(name) is None and not (name == "labels" and labels is not None):
            raise CorruptFileError(f"{where} lacks the field {name!r}")
    epochs = stored_epochs(path, records, SUMMARY_DTYPE, record["n_samples"], record,
                           "summary")
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
