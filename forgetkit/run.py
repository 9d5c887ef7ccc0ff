"""The `Run` object: stored model outputs of one training run plus labels.

A Run holds what identifies the data (labels, epoch numbers, sample ids, class names,
metadata, selections), its kind (`forgetkit.kinds`: what it stores per epoch and sample)
and the backend its outputs are read through (`forgetkit.backends`: in memory or
memory-mapped, decoded on demand, records, a chunked collection). The passes over a run
(predictions, probabilities, window means, label probabilities and margins, softmax
statistics) are functions of a run in `forgetkit.passes`, reached through the run's executor
(`forgetkit.execution`); the methods of the same names here call them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from . import passes
from ._deprecation import keyword_options, warn
from ._validation import (
    check_array,
    check_class_names,
    check_epochs,
    check_indices,
    check_labels,
    check_meta,
    check_outputs,
    check_sample_ids,
    check_type,
)
from .backends import (  # noqa: F401 (stored_rows, stored_order, epoch_parts: their old home)
    CHUNK_BYTES,
    LazyOutputs,
    SubsetOutputs,
    as_slice,
    backend_of,
    epoch_chunks,
    epoch_parts,
    stored_order,
    stored_rows,
)
from .errors import ForgetkitError, InputTypeError
from .execution import executor_for
from .kinds import check_kind, kind_of
from .passes import DEFAULT_MEMORY_BUDGET, SoftmaxStats  # noqa: F401 (their old home)
from .probs import LOG_FLOOR, mean_softmax, softmax  # noqa: F401 (their old home)
from .splits import split_indices

#: Runs smaller than this many values are fully checked (finite, probabilities sum to 1) when
#: built; larger ones (memmaps, huge arrays) are checked chunk by chunk as they are read.
EAGER_CHECK_VALUES = 1 << 27


def check_run(name, value):
    """Return ``value`` if it is a `Run`, else raise InputTypeError (a path names
    `forgetkit.load`)."""
    if not isinstance(value, Run):
        hint = " (load a file with forgetkit.load)" if isinstance(value, (str, os.PathLike)) \
            else ""
        raise InputTypeError(f"{name} must be a forgetkit.Run; got {type(value).__name__} "
                             f"{value!r}"[:200] + hint)
    return value


def check_runs(name, value):
    """Return ``value`` as a non-empty list of `Run`, naming the first entry that is not one."""
    if isinstance(value, (Run, str, bytes, os.PathLike)) or not isinstance(value, Iterable):
        raise InputTypeError(f"{name} must be a sequence of forgetkit.Run; got "
                             f"{type(value).__name__} {value!r}"[:200])
    runs = list(value)
    if not runs:
        raise ForgetkitError(f"{name} must hold at least one run; got none")
    for i, run in enumerate(runs):
        check_run(f"{name}[{i}]", run)
    return runs


class Run:
    """Model outputs of one training run, as stored after every (few) epoch(s).

    Parameters
    ----------
    outputs : ndarray, memmap or dask array of shape (n_epochs, n_samples, n_classes)
        float16, float32 or float64 logits or probabilities. Not copied. A dask array (chunked
        along samples) stays distributed: see `is_distributed`.
    labels : array-like of shape (n_samples,)
        True class of each sample, integers in [0, n_classes).
    kind : {"logits", "probs", "summary", "topk"} or another registered kind
        What the run stores per epoch and sample (`forgetkit.kinds`; ``kind_of(run)`` says
        what it answers). A record kind goes with its outputs (a summary's, a top-k run's
        `RecordOutputs`); what it cannot answer raises an error saying what it holds.
    epochs : array-like of shape (n_epochs,), optional
        Epoch numbers, strictly increasing; default 0..n_epochs-1.
    sample_ids : array-like of shape (n_samples,), optional
    class_names : sequence of str of length n_classes, optional
    meta : dict, optional
        Free metadata (model, seed, hyper-parameters...), kept through save/load.
    validate : bool, default True
        Check that the outputs are finite (and rows of "probs" sum to 1): when built for
        in-memory runs up to EAGER_CHECK_VALUES values, else as each epoch is read. False
        skips the value checks (shapes and labels are always checked), for outputs that are
        already known to be valid, such as probabilities forgetkit computed itself.
    source : str or Path, optional
        The file or folder the run was loaded from (`forgetkit.load` sets it); writers
        refuse it as a destination, and errors about the values name it. Kept by `isel`,
        `sel`, `split` and `replace`.

    Epochs are addressed two ways, named apart everywhere: an epoch *index* is a position
    0..n_epochs-1 (``isel``, ``probs``, a fuser's ``checkpoints_``); an epoch *number* is the
    stored label in ``run.epochs`` (``sel``, ``epoch_positions``, a fuser's ``epochs_``).
    """

    def __init__(self, outputs, labels, *, kind="logits", epochs=None, sample_ids=None,
                 class_names=None, meta=None, validate=True, source=None):
        self.outputs = check_outputs(outputs)
        self.backend = backend_of(self.outputs)  # how the outputs are read
        n_epochs, n_samples, n_classes = self.outputs.shape
        self.kind = check_kind(kind, self.outputs)
        self.labels = check_labels(labels, n_samples, n_classes)
        self.epochs = check_epochs(epochs, n_epochs)
        self.sample_ids = check_sample_ids(sample_ids, n_samples)
        self.class_names = check_class_names(class_names, n_classes)
        self.meta = check_meta(meta)
        self.source = None if source is None else Path(source)
        self.cache = passes.Cache()  # what the passes keep (`forgetkit.passes.Cache`)
        self._validate = bool(validate)
        if validate and not self.checked_per_read:
            kind = kind_of(self)
            for e in range(n_epochs):
                kind.check_values(self, e, self.outputs[e])

    @property
    def is_distributed(self):
        """Whether the outputs are a dask array. Passes over such a run go chunk by chunk to
        the workers of the active dask scheduler (`forgetkit.execution`); `predictions`,
        `probs`, `mean_probs`, `weighted_probs` and `label_probs` then return dask arrays,
        and the tensor is never gathered into this process."""
        return not self.backend.here

    @property
    def holds_every_class(self):
        """Deprecated: ``forgetkit.kinds.kind_of(run).full``."""
        warn("Run.holds_every_class is deprecated; use forgetkit.kinds.kind_of(run).full")
        return kind_of(self).full

    @property
    def top_k(self):
        """k of a top-k run (the largest logits stored per epoch and token), else None."""
        return getattr(self.outputs, "top_k", None)

    @property
    def sequence_ids(self):
        """The sequence id of each token of a top-k run: int64 (n_samples,), else None."""
        return getattr(self.outputs, "sequence_ids", None)

    @property
    def positions(self):
        """The position of each target token in its sequence (top-k runs): int32
        (n_samples,), else None."""
        return getattr(self.outputs, "positions", None)

    @property
    def _large(self):
        return self.backend.streamed or self.outputs.size > EAGER_CHECK_VALUES

    @property
    def checked_per_read(self):
        """Whether the values are checked as each epoch is read (streamed or large runs
        built with validate=True) rather than once when the run was built."""
        return self._validate and self._large

    @property
    def n_epochs(self):
        return self.outputs.shape[0]

    @property
    def n_samples(self):
        return self.outputs.shape[1]

    @property
    def n_classes(self):
        return self.outputs.shape[2]

    @property
    def shape(self):
        return self.outputs.shape

    def __repr__(self):
        e, n, c = self.shape
        return (f"Run(epochs={e}, samples={n}, classes={c}, kind={self.kind!r}, "
                f"dtype={self.outputs.dtype}, epoch numbers {self.epochs[0]}..{self.epochs[-1]})")

    @property
    def where(self):
        """The start of a message about this run's values: its source file, if any."""
        return "" if self.source is None else f"{str(self.source)!r}: "

    def check_epoch(self, index, values):
        """Raise ValueError if epoch ``index``'s values (n_samples, n_classes) are not valid."""
        index = passes.epoch_index(self, index)
        values = check_array("values", values, kinds="f", shape=(None, self.n_classes))
        kind_of(self).check_values(self, index, values)

    def epoch_values(self, index):
        """The stored outputs of epoch ``index`` (n_samples, n_classes), checked if this run
        checks per read."""
        return kind_of(self).stored_values(self, passes.epoch_index(self, index))

    # ------------------------------------------------------ passes (forgetkit.passes)
    def predictions(self, *, progress=False):
        """`forgetkit.passes.predictions`: the argmax class of every epoch, int32 (E, N)
        read-only (a dask array on a distributed run), computed once and inherited."""
        return passes.predictions(self, progress=progress)

    def correctness(self, *, progress=False):
        """Whether each sample is classified correctly at each epoch: bool (E, N)."""
        return passes.correctness(self, progress=progress)

    def probs(self, index=None, *, dtype=np.float64):
        """Probabilities (softmax of logits) of epoch ``index`` (N, C), of indices
        (len(index), N, C) or of every epoch (None): `forgetkit.passes.probs`."""
        return passes.probs(self, index, dtype=dtype)

    @keyword_options
    def cache_probs(self, *, memory_budget=DEFAULT_MEMORY_BUDGET):
        """`forgetkit.passes.cache_probs`; `clear_cache` frees them."""
        return passes.cache_probs(self, memory_budget=memory_budget)

    @property
    def cached_probs(self):
        """`forgetkit.passes.cached_probs`: float64 (E, N, C) held in memory, or None."""
        return passes.cached_probs(self)

    def clear_cache(self):
        """Free what the passes keep on this run (probabilities, predictions, softmax
        statistics)."""
        self.cache = passes.Cache()

    @keyword_options
    def softmax_stats(self, *, memory_budget=DEFAULT_MEMORY_BUDGET):
        """`forgetkit.passes.softmax_stats`: one softmax pass kept on the run and inherited
        by its sample subsets."""
        return passes.softmax_stats(self, memory_budget=memory_budget)

    @property
    def cached_softmax_stats(self):
        """The `softmax_stats` if computed, else None."""
        return passes.cached_softmax_stats(self)

    def mean_probs(self, indices, *, out=None):
        """Mean of the probabilities of epoch ``indices``: float64 (N, C), into ``out`` if
        given (`forgetkit.passes.mean_probs`)."""
        return passes.mean_probs(self, indices, out=out)

    def weighted_probs(self, indices, weights):
        """sum_i weights[i] * P[indices[i]]: float64 (N, C)."""
        return passes.weighted_probs(self, indices, weights)

    def logits_in_place(self):
        """`forgetkit.passes.logits_in_place`: (values, rows, order) or None."""
        return passes.logits_in_place(self)

    def add_probs(self, index, total):
        """total += the probabilities of epoch ``index``, in place."""
        return passes.add_probs(self, index, total)

    def label_probs(self):
        """Probability of each sample's label at every epoch: float64 (N, E)."""
        return passes.label_probs(self)

    def label_margins(self):
        """The label's margin at every epoch (logits: AUM's): float64 (E, N)."""
        return passes.label_margins(self)

    def map_reduce(self, fn):
        """Deprecated: ``forgetkit.execution.executor_for(run).map_reduce(run, fn)``."""
        warn("Run.map_reduce is deprecated; use "
             "forgetkit.execution.executor_for(run).map_reduce(run, fn)")
        check_type("fn", fn, Callable, "a function of a chunk's Run")
        return executor_for(self).map_reduce(self, fn)

    def epoch_positions(self, epoch_numbers):
        """Indices (int64) of the given stored epoch *numbers*; ValueError naming any that
        this run does not hold."""
        wanted = check_array("epoch_numbers", epoch_numbers, kinds="iu").reshape(-1)
        pos = np.minimum(np.searchsorted(self.epochs, wanted), self.n_epochs - 1)
        missing = wanted[self.epochs[pos] != wanted]
        if missing.size:
            raise ForgetkitError(f"epoch_numbers: the run lacks epochs {missing.tolist()} (it "
                                 f"holds epochs {self.epochs[0]}..{self.epochs[-1]}, "
                                 f"{self.n_epochs} stored)")
        return pos

    def sample_positions(self, sample_ids):
        """Positions (int64) of the given sample ids (``run.sample_ids``, or positions when
        the run has none); ValueError naming any id this run does not hold."""
        ids = self.sample_ids if self.sample_ids is not None else np.arange(self.n_samples)
        wanted = np.asarray(sample_ids).reshape(-1)
        pos = pd.Index(ids).get_indexer(wanted)
        if (pos < 0).any():
            raise ForgetkitError("sample_ids: the run lacks sample ids "
                                 f"{wanted[pos < 0][:10].tolist()}")
        return pos.astype(np.int64)

    # ------------------------------------------------------------- selection
    def isel(self, *, epochs=None, samples=None):
        """A new Run of the epochs and samples at these *positions* (ints or boolean masks).

        Sample ids are kept; without ids, the new Run records the original positions as ids.
        Small in-memory outputs are copied; streamed (memmap, Parquet) or large ones stay
        where they are behind a lazy view that reads epoch by epoch. The forgetting pass
        already computed on this run carries over.
        """
        run = self
        if epochs is not None:
            idx = check_indices("epochs", epochs, self.n_epochs)
            if np.any(np.diff(idx) <= 0):
                raise ForgetkitError("epoch indices must be strictly increasing")
            run = self._derive(self.outputs[idx], self.labels, epochs=self.epochs[idx])
            run.cache = self.cache.of_epochs(idx)
        if samples is not None:
            run = run._sample_subset(samples)
        return run

    def sel(self, *, epochs=None, samples=None):
        """A new Run of the stored epoch *numbers* ``epochs`` and the ``samples`` given by
        sample id (``run.sample_ids``); see `isel`."""
        return self.isel(
            epochs=None if epochs is None else self.epoch_positions(epochs),
            samples=None if samples is None else self.sample_positions(samples),
        )

    @keyword_options(renamed={"frac": "val_frac"})
    def split(self, val_frac=0.5, *, seed=0):
        """(validation, test) Runs of the paper's split-half protocol; see `split_indices`."""
        val, test = split_indices(self.n_samples, val_frac, seed=seed)
        return self.isel(samples=val), self.isel(samples=test)

    def replace(self, **changes):
        """A new Run with these constructor arguments changed (``outputs``, ``labels``,
        ``kind``, ``epochs``, ``sample_ids``, ``class_names``, ``meta``, ``validate``)."""
        fields = dict(outputs=self.outputs, labels=self.labels, kind=self.kind,
                      epochs=self.epochs, sample_ids=self.sample_ids,
                      class_names=self.class_names, meta=self.meta, validate=self._validate,
                      source=self.source)
        unknown = set(changes) - set(fields)
        if unknown:
            raise InputTypeError(f"replace() got unknown fields {sorted(unknown)}; valid: "
                                 f"{', '.join(fields)}")
        fields.update(changes)
        return Run(fields.pop("outputs"), fields.pop("labels"), **fields)

    def _sample_subset(self, samples):
        idx = check_indices("samples", samples, self.n_samples)
        ids = self.sample_ids if self.sample_ids is not None else np.arange(self.n_samples)
        # streamed or large outputs as a lazy view where their backend allows
        outputs = self.backend.take(idx, lazy=self._large)
        sub = self._derive(outputs, self.labels[idx], sample_ids=ids[idx])
        sub.cache = self.cache.of_samples(self, idx)  # the forgetting pass is not read again
        return sub

    def _inherit_predictions(self, predictions):
        # forgetkit.io's loaders keep predictions they verified (Cache.keep_predictions)
        self.cache.keep_predictions(predictions)

    def _derive(self, outputs, labels, **changes):
        # values of an eagerly checked run are known to be valid; streamed or large ones
        # were not all read yet and stay checked per read
        return self.replace(outputs=outputs, labels=labels, validate=self.checked_per_read,
                            **changes)

    def _repr_html_(self):
        """Jupyter's view of a run: shape, kind, epochs, final accuracy."""
        from .report.readable import run_html

        return run_html(self)
