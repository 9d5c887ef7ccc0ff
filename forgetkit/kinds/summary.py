"""The summary of a run's outputs: per (epoch, sample) four numbers instead of C.

For sample n with label y and logits z (C,) at one epoch, the summary holds

- ``label``: z[y];
- ``other``: max_{k != y} z[k], the largest other logit;
- ``other_class``: its class (the lowest index among equal values);
- ``lse``: log(sum_k exp(z[k])), the log-sum-exp over classes;

as float32, float32, int32 and float32: 16 bytes per (epoch, sample) against 2 * C for
float16 logits (0.8% at C = 1,000). From these, exactly as from the full logits:

- correct = label > other, or label == other and y < other_class (argmax, ties to the
  lowest index, is the label), hence predictions, accuracy, F_e, L_e and forgetting events;
- the label's probability p = exp(label - lse) (data maps);
- the AUM margin label - other.

Probabilities of every class, window means and fusion need the full outputs.
"""

from __future__ import annotations

import numpy as np

from ..errors import ForgetkitError
from .base import SUMMARY_DTYPE, RecordKind, RecordOutputs, register_kind

#: Bytes a pass holds at a time: of stored outputs in the forgetting pass (`Run.predictions`,
#: epochs per chunk), of float64 logits in a summary pass (rows per chunk). The one value.
CHUNK_BYTES = 1 << 26
#: What a summary cannot give, for the errors of the methods that need the full outputs.
HOLDS = ("this run is a summary (per epoch and sample: the label's logit, the largest other "
         "logit and its class, the log-sum-exp), which gives correctness, label probabilities "
         "and margins only; load the full run (recorders: summary=False)")


def label_and_other(z, labels):
    """(label logit, largest other logit, its class) of float64 rows ``z`` (n, C), which
    this function overwrites at the labels."""
    rows = np.arange(len(z))
    label = z[rows, labels].copy()
    z[rows, labels] = -np.inf
    other_class = np.argmax(z, axis=1)
    return label, z[rows, other_class], other_class


def epoch_chunks(n_epochs, bytes_per_epoch, chunk_bytes=CHUNK_BYTES):
    """(start, stop) ranges of epochs that take about ``chunk_bytes`` each."""
    step = max(1, chunk_bytes // max(bytes_per_epoch, 1))
    for start in range(0, n_epochs, step):
        yield start, min(start + step, n_epochs)


def _chunks(n_rows, n_classes):
    step = max(1, CHUNK_BYTES // (8 * n_classes))
    for start in range(0, n_rows, step):
        yield slice(start, min(start + step, n_rows))


def summarize_outputs(values, labels, out=None):
    """The summary of one epoch's logits.

    Parameters
    ----------
    values : ndarray of shape (n_samples, n_classes), float16, float32 or float64 logits
    labels : ndarray of int of shape (n_samples,)
    out : ndarray of SUMMARY_DTYPE of shape (n_samples,), optional

    Returns
    -------
    ndarray of SUMMARY_DTYPE, shape (n_samples,)
        Computed in float64 and stored as float32; where rounding to float32 would make a
        label logit equal to a different largest other logit, the label logit is moved by
        one float32 step so that correctness stays exact (float64 logits only: float16 and
        float32 values are stored exactly).
    """
    values = np.asarray(values)
    labels = np.asarray(labels, dtype=np.int64)
    n, c = values.shape
    if out is None:
        out = np.empty(n, dtype=SUMMARY_DTYPE)
    for rows in _chunks(n, c):
        z = values[rows].astype(np.float64)
        top = z.max(axis=1)
        with np.errstate(invalid="ignore", over="ignore"):
            lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        label, other, other_class = label_and_other(z, labels[rows])
        part = out[rows]
        part["label"] = _keep_order(label, other)
        part["other"] = other
        part["other_class"] = other_class
        part["lse"] = lse
        if not (np.isfinite(part["lse"]).all() and np.isfinite(part["label"]).all()
                and np.isfinite(part["other"]).all()):
            raise ForgetkitError("logits hold NaN or inf, or values beyond the float32 range; "
                                 "no summary written")
    return out


def _keep_order(label, other):
    """``label`` as float32, moved one step away from ``other`` where rounding made the two
    equal although they differ."""
    label32, other32 = label.astype(np.float32), other.astype(np.float32)
    tied = (label32 == other32) & (label != other)
    if tied.any():
        away = np.where(label[tied] > other[tied], np.inf, -np.inf).astype(np.float32)
        label32[tied] = np.nextafter(other32[tied], away)
    return label32


def label_margins_of(values, labels):
    """label logit minus the largest other logit of one epoch's outputs (n_samples,
    n_classes): float64 (n_samples,)."""
    values = np.asarray(values)
    labels = np.asarray(labels, dtype=np.int64)
    out = np.empty(len(values))
    for rows in _chunks(*values.shape):
        label, other, _ = label_and_other(values[rows].astype(np.float64), labels[rows])
        out[rows] = label - other
    return out


def summary_correct(summary, labels):
    """Correctness from summary records (..., n_samples): bool of the same shape."""
    label, other = summary["label"], summary["other"]
    return (label > other) | ((label == other) & (labels < summary["other_class"]))


class SummaryOutputs(RecordOutputs):
    """The outputs of a summary run: summary records (n_epochs, n_samples) standing in for
    the (n_epochs, n_samples, n_classes) logits they summarise (see `RecordOutputs`)."""

    HOLDS = HOLDS

    def __init__(self, records, n_classes):
        if getattr(records, "dtype", None) != SUMMARY_DTYPE or records.ndim != 2:
            raise ForgetkitError(f"summary records must be a (n_epochs, n_samples) array of "
                                 f"{SUMMARY_DTYPE.descr}; got {getattr(records, 'dtype', None)} "
                                 f"of shape {getattr(records, 'shape', None)}")
        super().__init__(records, n_classes)

    def correct(self, labels):
        """bool (n_epochs, n_samples)."""
        return summary_correct(self.records, labels)

    def predictions(self, labels):
        """The argmax class (ties to the lowest index): int32 (n_epochs, n_samples)."""
        records = self.read()
        pred = np.where(summary_correct(records, labels), labels, records["other_class"])
        return pred.astype(np.int32)

    def label_probs(self):
        """exp(label - lse): float64 (n_epochs, n_samples)."""
        records = self.read()
        return np.exp(records["label"].astype(np.float64) - records["lse"])

    def label_margins(self, labels=None):
        """label - other: float64 (n_epochs, n_samples)."""
        records = self.read()
        return records["label"].astype(np.float64) - records["other"]

    def summary(self, labels=None):
        """The summary records themselves (n_epochs, n_samples)."""
        return self.read()


SUMMARY = register_kind(RecordKind("summary", SummaryOutputs, HOLDS))
