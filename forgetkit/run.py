"""The `Run` object: stored model outputs of one training run plus labels.

`Run` is the one place that reads outputs: the forgetting pass (predictions, correctness),
probabilities, window means and weighted sums of epochs, each streaming epoch by epoch where
the outputs are memory-mapped or lazy, with an explicit memory budget wherever something is
kept in memory.

A Run holds what identifies the data (labels, epoch numbers, sample ids, class names,
metadata, selections) and reads its outputs only through their backend
(`forgetkit.backends`: in memory or memory-mapped, decoded on demand, a summary, a chunked
collection); its per-sample reads and `map_reduce` go through the run's executor
(`forgetkit.execution`), which for a dask array maps them over the chunks on the workers.
The softmax helpers live in `forgetkit.probs`, `split_indices` in `forgetkit.splits`.
"""

from __future__ import annotations

from operator import methodcaller
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from . import kernels
from ._deprecation import keyword_options, warn
from ._validation import (
    check_class_names,
    check_epochs,
    check_indices,
    check_int,
    check_labels,
    check_meta,
    check_outputs,
    check_sample_ids,
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
from .probs import LOG_FLOOR, mean_softmax, softmax  # noqa: F401 (their old home)
from .splits import split_indices

#: Runs smaller than this many values are fully checked (finite, probabilities sum to 1) when
#: built; larger ones (memmaps, huge arrays) are checked chunk by chunk as they are read.
EAGER_CHECK_VALUES = 1 << 27
#: Default memory budget, in bytes, for probabilities kept in memory (`Run.cache_probs`).
DEFAULT_MEMORY_BUDGET = 2 << 30


class SoftmaxStats(NamedTuple):
    """What one pass over every epoch's softmax of a logits run keeps (`Run.softmax_stats`),
    each as forgetkit's softmax computes it."""

    shift: np.ndarray  #: (E, N) float64: the shift of each row's exp (nan: some exp underflowed)
    inv: np.ndarray  #: (E, N) float64: 1 / the sum of each row's exp (nan likewise)
    pred: np.ndarray  #: (E, N) int32: first argmax of each row's probabilities
    label_prob: np.ndarray  #: (E, N) float64: probability of each sample's label
    class_max: np.ndarray | None  #: (N, C) float64: largest probability of each class, or None

    def take(self, idx):
        """The statistics of samples ``idx`` (gathered in parallel)."""
        return SoftmaxStats(*kernels.take_samples(self, idx))


class Run:
    """Model outputs of one training run, as stored after every (few) epoch(s).

    Parameters
    ----------
    outputs : ndarray, memmap or dask array of shape (n_epochs, n_samples, n_classes)
        float16, float32 or float64 logits or probabilities. Not copied. A dask array (chunked
        along samples) stays distributed: see `is_distributed`.
    labels : array-like of shape (n_samples,)
        True class of each sample, integers in [0, n_classes).
    kind : {"logits", "probs", "summary", "topk"}
        "summary" goes with `forgetkit.kinds.summary.SummaryOutputs` (a run read from a summary,
        `forgetkit.summarize`), "topk" with `forgetkit.kinds.topk.TopKOutputs` (a top-k run of a
        language model's tokens, `forgetkit.load` of one): correctness, `label_probs` and
        `label_margins` come exactly from their records; methods that need every class's
        outputs raise a ValueError saying what the run holds (`forgetkit.kinds`).
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

    def __init__(
        self,
        outputs,
        labels,
        *,
        kind="logits",
        epochs=None,
        sample_ids=None,
        class_names=None,
        meta=None,
        validate=True,
        source=None,
    ):
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
        self._predictions = None  # the forgetting pass, (E, N) int32, read-only
        self._probs = None  # float64 probabilities of every epoch, kept by cache_probs
        self._stats = None  # the SoftmaxStats of softmax_stats
        self._stats_of = None  # (run, sample indices) whose stats are this subset's, if any
        self._validate = bool(validate)
        if validate and not self.checked_per_read:
            for e in range(n_epochs):
                self.check_epoch(e, self.outputs[e])

    @property
    def is_distributed(self):
        """Whether the outputs are a dask array. Passes over such a run go chunk by chunk to
        the workers of the active dask scheduler (`map_reduce`); `predictions`, `probs`,
        `mean_probs`, `weighted_probs` and `label_probs` then return dask arrays, and the
        tensor is never gathered into this process (the backend is not read here:
        `forgetkit.backends.CollectionBackend`)."""
        return not self.backend.here

    @property
    def holds_every_class(self):
        """Deprecated: ``forgetkit.kinds.kind_of(run).full`` (whether every class's
        probability is known exactly; False for a summary or a top-k run)."""
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

    # ----------------------------------------------------------------- shape
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
        return (
            f"Run(epochs={e}, samples={n}, classes={c}, kind={self.kind!r}, "
            f"dtype={self.outputs.dtype}, epoch numbers {self.epochs[0]}..{self.epochs[-1]})"
        )

    # ----------------------------------------------------------------- checks
    @property
    def where(self):
        """The start of a message about this run's values: its source file, if any."""
        return "" if self.source is None else f"{str(self.source)!r}: "

    def check_epoch(self, index, values):
        """Raise ValueError if epoch ``index``'s values (n_samples, n_classes) are not valid."""
        kind_of(self).check_values(self, index, values)

    def epoch_values(self, index):
        """The stored outputs of epoch ``index`` (n_samples, n_classes), checked if this run
        checks per read."""
        return kind_of(self).stored_values(self, index)

    # ---------------------------------------------------------- forgetting pass
    def predictions(self, *, progress=False):
        """Predicted class (argmax over classes, ties to the lowest index) at every epoch.

        Streams the outputs in chunks of epochs; peak memory does not grow with n_epochs
        beyond the result. Computed once per run (and inherited by sample subsets).

        Returns
        -------
        ndarray of int32, shape (n_epochs, n_samples), read-only (a dask array, computed per
        chunk when asked, for a run on a dask array)
        """
        return self._per_sample("_read_predictions", ((self.n_epochs, None), np.int32),
                                progress=progress)

    def _per_sample(self, method, result, *args, out=None, **kwargs):
        """``self.<method>(*args, **kwargs)`` on this run's executor: here for a run held in
        memory or on disk, else that method of every chunk concatenated along samples (a
        lazy dask array); ``result`` is (shape, dtype) of the result, None in the shape at
        the axis of samples."""
        if out is not None:
            kwargs["out"] = out
        return executor_for(self).map_samples(self, methodcaller(method, *args, **kwargs),
                                              *result, out=out)

    def _read_predictions(self, *, progress=False):
        if self._predictions is None:
            self._inherit_predictions(kind_of(self).predictions(self, progress=progress))
        return self._predictions

    def correctness(self, *, progress=False):
        """Whether each sample is classified correctly at each epoch: bool (E, N)."""
        pred = self.predictions(progress=progress)
        # labels as the predictions' int32 (classes fit it): no int64 cast per element
        return pred == self.labels.astype(pred.dtype)[None, :]

    # ------------------------------------------------------------ probabilities
    def probs(self, index=None, *, dtype=np.float64):
        """Probabilities of one or several epochs (softmax of logits, float64 by default).

        Parameters
        ----------
        index : int, sequence of int or None
            Epoch index (returns shape (n_samples, n_classes)) or indices (returns shape
            (len(index), n_samples, n_classes)); None means all epochs.
        """
        self._require_full("probs()")
        if index is None:
            index = range(self.n_epochs)
        lead = () if np.ndim(index) == 0 else (len(index),)
        return self._per_sample("_read_probs", (lead + (None, self.n_classes), dtype), index,
                                dtype=dtype)

    def _read_probs(self, index, *, dtype=np.float64):
        if np.ndim(index) == 0:
            e = self._epoch_index(index)
            if self._probs is not None and dtype == np.float64:
                return self._probs[e].copy()
            return self._epoch_probs(e, np.empty((self.n_samples, self.n_classes), dtype))
        idx = [self._epoch_index(e) for e in index]
        out = np.empty((len(idx), self.n_samples, self.n_classes), dtype=dtype)
        for i, e in enumerate(idx):
            self._epoch_probs(e, out[i])
        return out

    @keyword_options
    def cache_probs(self, *, memory_budget=DEFAULT_MEMORY_BUDGET):
        """Compute the float64 probabilities of every epoch once and keep them on this run,
        if they take at most ``memory_budget`` bytes (methods that revisit every epoch, such
        as ensemble selection). Returns them (n_epochs, n_samples, n_classes), read-only,
        or None when they do not fit; `clear_cache` frees them."""
        self._require_full("cache_probs()")
        held = self.cached_probs
        size = self.n_epochs * self.n_samples * self.n_classes * 8
        if held is None and self.backend.here and size <= memory_budget:
            held = self._probs = self.probs()
            held.setflags(write=False)
        return held

    @property
    def cached_probs(self):
        """All epochs' float64 probabilities if held in memory (kept by `cache_probs`, or the
        outputs themselves for float64 "probs" held in memory), else None."""
        if self._probs is not None:
            return self._probs
        out = self.outputs
        if not kind_of(self).softmax and type(out) is np.ndarray and out.dtype == np.float64 \
                and not self.checked_per_read:
            return out
        return None

    def clear_cache(self):
        """Free the probabilities kept by `cache_probs`, the forgetting pass and the
        `softmax_stats`."""
        self._probs = None
        self._predictions = None
        self._stats = self._stats_of = None

    @keyword_options
    def softmax_stats(self, *, memory_budget=DEFAULT_MEMORY_BUDGET):
        """One pass over the softmax of every epoch of a logits run, kept on the run and
        inherited by its sample subsets (`isel`), so that methods fitted on several
        subsets (the protocol's splits) share it: `SoftmaxStats` with each row's softmax
        shift and 1/sum, first argmax and label probability (E, N), and, when (N, C)
        float64 takes at most ``memory_budget`` bytes, each class's largest probability over
        the epochs. `label_probs` and ensemble selection read them instead of the outputs;
        float16 logits whose every exp comes from the table also get their `predictions`.
        """
        self._require_full("softmax_stats()")
        if not kind_of(self).softmax or not self.backend.here:
            raise ForgetkitError("softmax_stats() needs logits held in memory or on disk; "
                                 f"this run holds {self.kind}"
                                 + ("" if self.backend.here else " on a dask array"))
        n_epochs, n_samples, n_classes = self.shape
        want_max = n_samples * n_classes * 8 <= memory_budget
        held = self.cached_softmax_stats
        if held is not None and (held.class_max is not None or not want_max):
            return held
        stats = SoftmaxStats(np.full((n_epochs, n_samples), np.nan),
                             np.full((n_epochs, n_samples), np.nan),
                             np.empty((n_epochs, n_samples), dtype=np.int32),
                             np.empty((n_epochs, n_samples)),
                             np.zeros((n_samples, n_classes)) if want_max else None)
        for values, src, epochs in self.backend.epoch_parts():
            bad = kernels.softmax_stats(values, src, self.labels, stats.shift[epochs],
                                        stats.inv[epochs], stats.pred[epochs],
                                        stats.label_prob[epochs], stats.class_max)
            for e in np.flatnonzero(bad):
                self.probs(epochs.start + int(e))  # raises the error naming the epoch
        self._stats = stats
        if self._predictions is None and self.outputs.dtype == np.float16 \
                and (stats.shift == 0).all():
            # every row's exp came from the table: distinct float16 values keep their order
            # through it (gaps of at least 6e-8 relative), so the first argmax of the
            # probabilities is the forgetting pass's
            self._inherit_predictions(stats.pred)
        return stats

    @property
    def cached_softmax_stats(self):
        """The `softmax_stats` if computed (here or on the run this is a sample subset of,
        then taken for these samples on first use), else None."""
        if self._stats is None and self._stats_of is not None:
            run, idx = self._stats_of
            stats = run.cached_softmax_stats
            self._stats = None if stats is None else stats.take(idx)
            self._stats_of = None
        return self._stats

    def mean_probs(self, indices, *, out=None):
        """Mean of the probabilities of epoch ``indices`` (summed in index order, then
        divided): float64 (n_samples, n_classes), written into ``out`` if given. Logits are
        read in place (no copy of a memmap or lazy subset); one epoch at a time otherwise."""
        self._require_full("mean_probs()")
        idx = np.asarray(list(indices), dtype=np.int64)
        if idx.size == 0:
            raise ForgetkitError("mean_probs needs at least one epoch index; got none")
        return self._per_sample("_read_mean_probs", ((None, self.n_classes), np.float64), idx,
                                out=out)

    def _read_mean_probs(self, idx, *, out=None):
        cached = self.cached_probs
        if out is None:
            out = np.empty((self.n_samples, self.n_classes))
        if cached is not None:
            stack = cached[as_slice(idx)]  # consecutive epochs: a view, no copy
            return kernels.mean_first_axis(stack, out)
        logits = self.logits_in_place()
        if logits is not None:
            if not kernels.combine_softmax(logits[0], idx, logits[1], out, order=logits[2]):
                return out
        elif kind_of(self).softmax:  # decoded: the epochs gathered first
            stack = self.backend.read(as_slice(idx))
            if not kernels.combine_softmax(stack, np.arange(len(idx)),
                                           np.arange(self.n_samples), out):
                return out
        # epoch by epoch: one epoch in memory besides the total; names a bad epoch
        self._epoch_probs(int(idx[0]), out)
        if len(idx) > 1:
            tmp = np.empty_like(out)
            for e in idx[1:]:
                out += self._epoch_probs(int(e), tmp)
            out /= len(idx)
        return out

    def weighted_probs(self, indices, weights):
        """sum_i weights[i] * P[indices[i]]: float64 (n_samples, n_classes), added in order
        to zeros; logits are read in place."""
        self._require_full("weighted_probs()")
        idx = np.asarray(indices, dtype=np.int64)
        return self._per_sample("_read_weighted_probs", ((None, self.n_classes), np.float64),
                                idx, weights)

    def _read_weighted_probs(self, idx, weights):
        out = np.empty((self.n_samples, self.n_classes))
        logits = self.logits_in_place()
        if logits is not None:
            if not kernels.combine_softmax(logits[0], idx, logits[1], out, weights,
                                           order=logits[2]):
                return out
        out[...] = 0.0
        tmp = np.empty_like(out)
        for e, w in zip(idx, weights, strict=True):
            out += w * self._epoch_probs(int(e), tmp)
        return out

    def logits_in_place(self):
        """(values, rows, order) of logits the kernels read in place: an in-memory or
        memory-mapped (E, M, C) array holding sample n at row rows[n], read in ``order``
        (`stored_order`); None for probabilities, probabilities held (`cache_probs`),
        decoded (Parquet) or dask outputs."""
        if not kind_of(self).softmax or self.cached_probs is not None:
            return None
        stored = self.backend.stored_rows()
        return None if stored is None else (*stored, self.backend.stored_order())

    def add_probs(self, index, total):
        """total += the probabilities of epoch ``index`` (float64 (n_samples, n_classes), in
        place, the bits of ``total += run.probs(index)``); logits are read in place, without
        storing the epoch's probabilities."""
        self._require_full("add_probs()")
        e = self._epoch_index(index)
        cached = self.cached_probs
        logits = self.logits_in_place()
        if cached is not None:
            kernels.add_into(total, cached[e])
        elif logits is None or kernels.combine_softmax(
                logits[0], [e], logits[1], total, weights=[1.0], accumulate=True,
                order=logits[2]):
            kernels.add_into(total, self.probs(e))  # decoded, or names the bad epoch
        return total

    def label_probs(self):
        """Probability of each sample's label at every epoch: float64 (n_samples, n_epochs).
        Logits not held as probabilities are read in place, one epoch at a time, without
        storing any epoch's probabilities. A summary or a
        top-k run gives exp(label logit - log-sum-exp)."""
        return self._per_sample("_read_label_probs", ((None, self.n_epochs), np.float64))

    def _read_label_probs(self):
        if self.cached_softmax_stats is not None:
            return self._stats.label_prob.T.copy()
        if self.cached_probs is not None:
            rows, q = np.arange(self.n_samples), np.empty((self.n_epochs, self.n_samples))
            tmp = np.empty((self.n_samples, self.n_classes))
            for e in range(self.n_epochs):
                q[e] = self._epoch_probs(e, tmp)[rows, self.labels]
            return q.T
        return kind_of(self).label_probs(self).T

    def label_margins(self):
        """The label's margin at every epoch, z[y] - max_{k != y} z[k], on the stored outputs
        (logits: the margin whose mean over epochs is AUM): float64 (n_epochs, n_samples).
        Exact from a summary or a top-k run (k >= 2); otherwise read one epoch at a time."""
        return kind_of(self).label_margins(self)

    def _require_full(self, what):
        """Raise the error of ``what`` needing every class's outputs, unless this run's kind
        gives them."""
        kind_of(self).require_full(self, what)

    def map_reduce(self, fn):
        """``fn(run)`` over blocks of samples, combined: the plug-in point of passes that
        must also run on a cluster.

        ``fn`` takes a Run and returns per-epoch (or other) counts as an ndarray, per-sample
        rows as a pandas DataFrame, or a tuple of those. On a run held in memory or on disk
        this is ``fn(self)``. On a run on a dask array (`is_distributed`), ``fn`` runs on the
        Run of each chunk of samples (every epoch and class of a block of samples, labels,
        epoch numbers and sample ids included; positions as ids when the run has none) on
        the workers of the active dask scheduler; ndarrays are summed and DataFrames
        concatenated in sample order, so counts and per-sample rows equal the in-memory
        result exactly. ``fn`` must be picklable (a module-level function or a
        ``functools.partial`` of one). The executor (`forgetkit.execution.executor_for`) is
        chosen by the type of the outputs.
        """
        return executor_for(self).map_reduce(self, fn)

    def epoch_positions(self, epoch_numbers):
        """Indices (int64) of the given stored epoch *numbers*; ValueError naming any that
        this run does not hold."""
        wanted = np.asarray(epoch_numbers, dtype=np.int64).reshape(-1)
        pos = np.minimum(np.searchsorted(self.epochs, wanted), self.n_epochs - 1)
        missing = wanted[self.epochs[pos] != wanted]
        if missing.size:
            raise ForgetkitError(
                f"the run lacks epochs {missing.tolist()} (it holds epochs {self.epochs[0]}.."
                f"{self.epochs[-1]}, {self.n_epochs} stored)"
            )
        return pos

    def sample_positions(self, sample_ids):
        """Positions (int64) of the given sample ids (``run.sample_ids``, or positions when
        the run has none); ValueError naming any id this run does not hold."""
        ids = self.sample_ids if self.sample_ids is not None else np.arange(self.n_samples)
        wanted = np.asarray(sample_ids).reshape(-1)
        pos = pd.Index(ids).get_indexer(wanted)
        if (pos < 0).any():
            raise ForgetkitError(f"the run lacks sample ids {wanted[pos < 0][:10].tolist()}")
        return pos.astype(np.int64)

    def _epoch_index(self, e):
        e = check_int("epoch index", e)
        if not -self.n_epochs <= e < self.n_epochs:
            raise ForgetkitError(f"epoch index must lie in [0, {self.n_epochs}); got {e}")
        return e % self.n_epochs

    def _epoch_probs(self, e, out):
        """Write the probabilities of epoch index ``e`` into ``out`` (n_samples, n_classes)."""
        if self._probs is not None:
            out[...] = self._probs[e]
            return out
        return kind_of(self).epoch_probs(self, e, out)

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
            if self._predictions is not None:
                run._inherit_predictions(self._predictions[idx])
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
        if self._predictions is not None:  # the forgetting pass is not read again
            sub._inherit_predictions(self._predictions[:, idx])
        if self._stats is not None or self._stats_of is not None:
            sub._stats_of = (self, idx)  # taken when first used
        return sub

    def _inherit_predictions(self, predictions):
        predictions.setflags(write=False)
        self._predictions = predictions

    def _derive(self, outputs, labels, **changes):
        # values of an eagerly checked run are known to be valid; streamed or large ones
        # were not all read yet and stay checked per read
        return self.replace(outputs=outputs, labels=labels, validate=self.checked_per_read,
                            **changes)

    def _repr_html_(self):
        """Jupyter's view of a run: shape, kind, epochs, final accuracy."""
        from .report.readable import run_html

        return run_html(self)
