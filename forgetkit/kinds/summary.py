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

from functools import partial

import numpy as np

from ..errors import ForgetkitError

#: One summary record per (epoch, sample).
SUMMARY_DTYPE = np.dtype([("label", "<f4"), ("other", "<f4"), ("other_class", "<i4"),
                          ("lse", "<f4")])
#: Bytes a pass holds at a time: of stored outputs in the forgetting pass (`Run.predictions`,
#: epochs per chunk), of float64 logits in a summary pass (rows per chunk). The one value,
#: imported by `forgetkit.run`.
CHUNK_BYTES = 1 << 26
#: The kinds of runs stored as records (`RecordOutputs`) rather than every class's values.
RECORD_KINDS = ("summary", "topk")
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


class RecordOutputs:
    """Base of outputs stored as per-(epoch, sample) records instead of every class's values
    (a summary, a top-k run): ``records`` (n_epochs, n_samples) standing in for the
    (n_epochs, n_samples, n_classes) outputs.

    ``shape`` is that of the outputs; selecting epochs (``outputs[idx]``) or samples
    (``outputs[:, idx]``) gives outputs of the selection (`_select`); reading one epoch's
    values (``outputs[e]``) or converting to an array raises a ValueError naming what the
    records hold (``HOLDS``). Subclasses give the exact per-(epoch, sample) quantities:
    ``correct(labels)``, ``predictions(labels)``, ``label_probs()``,
    ``label_margins(labels)`` and ``summary(labels)`` (the `SUMMARY_DTYPE` records).
    """

    _forgetkit_lazy = True  # never converted to an array
    ndim = 3
    dtype = np.dtype(np.float32)
    itemsize = dtype.itemsize
    HOLDS = HOLDS

    def __init__(self, records, n_classes):
        self.records = records
        self.n_classes = int(n_classes)
        self.shape = (*records.shape, self.n_classes)
        self.size = int(np.prod(self.shape))

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if isinstance(key[0], (int, np.integer)) or len(key) > 2:
            raise ForgetkitError(f"reading per-class outputs: {self.HOLDS}")
        first = key[0]
        if isinstance(first, (list, np.ndarray)) and np.asarray(first).dtype.kind in "iu":
            idx = np.arange(len(self))[first]  # consecutive epochs: a view of a memmap
            if len(idx) and np.all(np.diff(idx) == 1):
                key = (slice(int(idx[0]), int(idx[-1]) + 1), *key[1:])
        return self._select(self.records[key], slice(None) if len(key) < 2 else key[1])

    def _select(self, records, samples):
        """Outputs of ``records``, the selection of these outputs' samples ``samples``."""
        return self.builder(samples)(records)

    def builder(self, samples):
        """A picklable callable: records (E, len(samples)) -> outputs of the same kind for
        these outputs' samples ``samples`` (a slice or indices; the chunks of a run on a
        dask array are built with it on the workers)."""
        return partial(type(self), n_classes=self.n_classes)

    def __array__(self, dtype=None, copy=None):
        raise ForgetkitError(f"converting the outputs to an array: {self.HOLDS}")

    def stored_rows(self):
        return None

    @property
    def stored(self):
        """The records as stored, unread (an ndarray, a memmap or a dask array)."""
        return self.records

    def _read(self):
        return np.asarray(self.records)


class SummaryOutputs(RecordOutputs):
    """The outputs of a summary run: summary records (n_epochs, n_samples) standing in for
    the (n_epochs, n_samples, n_classes) logits they summarise (see `RecordOutputs`)."""

    KIND = "summary"

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
        records = self._read()
        pred = np.where(summary_correct(records, labels), labels, records["other_class"])
        return pred.astype(np.int32)

    def label_probs(self):
        """exp(label - lse): float64 (n_epochs, n_samples)."""
        records = self._read()
        return np.exp(records["label"].astype(np.float64) - records["lse"])

    def label_margins(self, labels=None):
        """label - other: float64 (n_epochs, n_samples)."""
        records = self._read()
        return records["label"].astype(np.float64) - records["other"]

    def summary(self, labels=None):
        """The summary records themselves (n_epochs, n_samples)."""
        return self._read()


def check_kind(kind, outputs, kinds):
    """``kind`` of a Run: one of ``kinds`` for outputs, "summary" for SummaryOutputs, "topk"
    for top-k outputs (`forgetkit.kinds.topk.TopKOutputs`)."""
    record_kind = getattr(outputs, "KIND", None) if isinstance(outputs, RecordOutputs) else None
    if record_kind is not None or kind in RECORD_KINDS:
        if kind != record_kind:
            raise ForgetkitError(f'kind={kind!r} does not go with outputs of type '
                                 f"{type(outputs).__name__}: kind=\"summary\" goes with a "
                                 'summary (forgetkit.summarize), kind="topk" with top-k '
                                 "records (forgetkit.load of a top-k run)")
        return kind
    if kind not in kinds:
        valid = ", ".join(repr(k) for k in kinds)
        raise ForgetkitError(f"kind must be one of {valid}; got {kind!r} (or \"summary\" or "
                             '"topk" for the records of a summary or a top-k run)')
    return kind
