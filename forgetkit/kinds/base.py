"""What a record kind is: the `Kind` interface, records as outputs, and the registry.

A *kind* is what a run stores per (epoch, sample): every class's values (`forgetkit.kinds.full`:
logits or probabilities), per-sample statistics (`forgetkit.kinds.summary`), or the target,
log-sum-exp and top-k logits of a token (`forgetkit.kinds.topk`). Each is one `Kind` object,
registered under its name (`register_kind`); ``Run.kind`` is that name and `kind_of` (run)
the object. Analyses, fusion, evaluate, the report, the CLI and io ask the kind; none
compares a run's kind by name or reads its stored records.

What a kind answers (attributes are capabilities; methods take a `forgetkit.Run`, any
selection of one being a block of epochs and samples, and ``epochs``, a slice of its epoch
indices, default all):

- ``name``; ``holds``: what a run of this kind holds, for the one error of what it cannot
  give (`require_full`);
- ``full``: every class's probability is known exactly at every epoch (``Run.probs``, window
  means, ``predict_proba``); ``softmax``: the stored values are logits (probabilities are
  their softmax; kernels read them in place); ``logit_margins``: label margins are on logits
  (AUM is defined); ``bounded``: fusion works from certified bounds (`certified_bounds`);
  ``stores_values``: stored as an (E, N, C) array of values (read by the run's backend),
  not as records (an ``outputs_type``, a `RecordOutputs`);
- ``accepts(outputs)``: whether outputs go with this kind; ``check_values(run, index,
  values)``: raise if one epoch's stored values are not valid (kinds storing values);
- ``predictions(run)`` int32 (E, N); ``correctness(run, epochs)`` bool (E, N);
  ``label_probs(run, epochs)`` and ``label_margins(run, epochs)`` float64 (E, N);
  ``summary(run, epochs)``: the `SUMMARY_DTYPE` records (E, N);
- ``epoch_probs(run, e, out)``: every class's probabilities of epoch index ``e`` into
  ``out`` (N, C) (``full`` kinds; the others raise `require_full`'s error);
- ``stored_values(run, e)``: epoch ``e``'s stored values (N, C) (kinds storing values);
- ``certified_bounds(run)``: what certified fusion reads (``bounded`` kinds: a top-k run's
  `forgetkit.kinds.topk.TopKData`, exact where k is the vocabulary).

How io asks a run's kind: ``kind_of(run).name`` keys a format's writer table (a run is
saved as what it is); ``kind_of(run).stores_values`` says whether it is stored as an
(E, N, C) array of values or as records; ``stored_records(run)`` gives the records as
stored (unread, unverified: a memmap, an ndarray or a dask array) and ``read_records(run,
epochs)`` reads them (verified where the file has checksums) as an ndarray;
``kind_of(run).summary(run, slice(e, e + 1))`` gives the summary records of an epoch,
whatever the kind (exact, or an error saying what the run holds); ``full`` and ``softmax``
whether it holds every class's values and whether they are logits.

A new kind is one module defining its `Kind` (and its `RecordOutputs`, if stored as
records) plus one ``register_kind(...)`` call (tests/test_kinds.py registers two).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..errors import ForgetkitError, InputTypeError

#: One summary record per (epoch, sample) (`forgetkit.kinds.summary`).
SUMMARY_DTYPE = np.dtype([("label", "<f4"), ("other", "<f4"), ("other_class", "<i4"),
                          ("lse", "<f4")])

_KINDS = {}  # name -> Kind, in registration order


class Kind:
    """Base of record kinds (see the module docstring for what one answers)."""

    name = None
    holds = ""
    full = False
    softmax = False
    logit_margins = False
    bounded = False
    stores_values = True
    outputs_type = None

    def __repr__(self):
        return f"<kind {self.name!r}>"

    def accepts(self, outputs):
        """Whether ``outputs`` (checked, (E, N, C)-shaped) go with this kind."""
        if self.outputs_type is None:
            return not isinstance(outputs, RecordOutputs)
        return isinstance(outputs, self.outputs_type)

    def require_full(self, run, what):
        """Raise the ForgetkitError of ``what`` (a method or an analysis) needing every
        class's probabilities, unless this kind gives them."""
        if not self.full:
            raise ForgetkitError(f"{what} needs every class's outputs; {self.holds}")

    def check_values(self, run, index, values):
        """Raise ForgetkitError if epoch ``index``'s stored values (N, C) are not valid."""

    def stored_values(self, run, index):
        """The stored values (N, C) of epoch ``index`` (kinds that store every class's)."""
        raise ForgetkitError(f"epoch_values() needs every class's outputs; {self.holds}")

    def predictions(self, run, *, progress=False):
        """The argmax class (ties to the lowest index) of every epoch: int32 (E, N)."""
        raise NotImplementedError

    def correctness(self, run, epochs=None):
        """Whether the label is the argmax: bool (E, N) of ``epochs`` (a slice)."""
        pred = self.predictions(run)
        pred = pred if epochs is None else pred[epochs]
        return pred == run.labels.astype(pred.dtype)[None, :]

    def label_probs(self, run, epochs=None):
        """The label's probability: float64 (E, N) of ``epochs``."""
        raise NotImplementedError

    def label_margins(self, run, epochs=None):
        """The label's margin (label's value minus the largest other): float64 (E, N)."""
        raise NotImplementedError

    def summary(self, run, epochs=None):
        """The `SUMMARY_DTYPE` records (E, N) of ``epochs``."""
        raise ForgetkitError(f"a summary needs the label's logit, the largest other logit and "
                             f"the log-sum-exp; {self.holds}")

    def epoch_probs(self, run, e, out):
        """Every class's probabilities of epoch index ``e``, written into ``out`` (N, C)."""
        self.require_full(run, "every class's probability")
        raise NotImplementedError

    def certified_bounds(self, run):
        """What certified fusion reads of ``run`` (``bounded`` kinds)."""
        raise ForgetkitError(f"{self.name} runs have no certified bounds: their "
                             "probabilities are exact" if self.full else self.holds)

    def stored_records(self, run):
        """The records of a run stored as records, as stored (unread, unverified)."""
        self._require_records()
        return run.outputs.stored

    def read_records(self, run, epochs=None):
        """The records (E, N) of ``epochs`` (a slice; default all) as an ndarray, verified
        where their file has checksums."""
        self._require_records()
        return run.outputs.read(epochs)

    def _require_records(self):
        if self.stores_values:
            raise ForgetkitError(f"a {self.name} run is not stored as records: it stores "
                                 "every class's values")


class RecordOutputs:
    """Base of outputs stored as per-(epoch, sample) records instead of every class's values
    (a summary, a top-k run): ``records`` (n_epochs, n_samples) standing in for the
    (n_epochs, n_samples, n_classes) outputs.

    ``shape`` is that of the outputs; selecting epochs (``outputs[idx]``) or samples
    (``outputs[:, idx]``) gives outputs of the selection (`_select`); reading one epoch's
    values (``outputs[e]``) or converting to an array raises a ValueError naming what the
    records hold (``HOLDS``). Subclasses give the exact per-(epoch, sample) quantities that
    their `RecordKind` answers with: ``correct(labels)``, ``predictions(labels)``,
    ``label_probs()``, ``label_margins(labels)`` and ``summary(labels)``.
    """

    _forgetkit_lazy = True  # never converted to an array
    ndim = 3
    dtype = np.dtype(np.float32)
    itemsize = dtype.itemsize
    HOLDS = "this run holds records, not every class's outputs"

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

    def read(self, epochs=None):
        """The records of ``epochs`` (a slice; default all) as an ndarray."""
        records = self.records
        return np.asarray(records if epochs is None else records[epochs])


class RecordKind(Kind):
    """A kind stored as records (`RecordOutputs` of ``outputs_type``): its answers are those
    of the records (``outputs.correct``, ``predictions``, ``label_probs``,
    ``label_margins``, ``summary``), exact; per-class probabilities are not held."""

    stores_values = False
    logit_margins = True

    def __init__(self, name, outputs_type, holds):
        self.name, self.outputs_type, self.holds = name, outputs_type, holds

    @staticmethod
    def _part(run, epochs):
        return run.outputs if epochs is None else run.outputs[epochs]

    def predictions(self, run, *, progress=False):
        return run.outputs.predictions(run.labels)

    def correctness(self, run, epochs=None):
        return self._part(run, epochs).correct(run.labels)

    def label_probs(self, run, epochs=None):
        return self._part(run, epochs).label_probs()

    def label_margins(self, run, epochs=None):
        return self._part(run, epochs).label_margins(run.labels)

    def summary(self, run, epochs=None):
        return self._part(run, epochs).summary(run.labels)


def register_kind(kind):
    """Register ``kind`` (a `Kind` with a ``name``) so that ``Run(..., kind=kind.name)``
    takes it; a name registered again is replaced. Returns ``kind``."""
    if not isinstance(kind, Kind) or not isinstance(kind.name, str) or not kind.name:
        raise InputTypeError(f"register_kind takes a Kind with a name; got {kind!r}")
    _KINDS[kind.name] = kind
    return kind


def kinds():
    """The registered kinds' names, in registration order."""
    return tuple(_KINDS)


def kind_named(name):
    """The registered `Kind` called ``name``; ForgetkitError listing the kinds otherwise
    (first those of stored values, then those of records)."""
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        values = ", ".join(repr(k.name) for k in _KINDS.values() if k.stores_values)
        records = " or ".join(f'"{k.name}"' for k in _KINDS.values() if not k.stores_values)
        raise ForgetkitError(f"kind must be one of {values}; got {name!r}"
                             + (f" (or {records} for the records of such a run)"
                                if records else "")) from None


def kind_of(run):
    """The `Kind` of ``run`` (a `forgetkit.Run`)."""
    return _KINDS[run.kind]


def check_kind(name, outputs):
    """``name`` if it is a registered kind that goes with ``outputs``, else ForgetkitError
    naming the kind that does."""
    kind = kind_named(name)
    if kind.accepts(outputs):
        return name
    fits = [k.name for k in _KINDS.values() if k.accepts(outputs)]
    raise ForgetkitError(f"kind={name!r} does not go with outputs of type "
                         f"{type(outputs).__name__}; they go with kind="
                         + " or ".join(repr(k) for k in fits))
