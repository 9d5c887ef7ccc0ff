"""The `Run` object: stored model outputs of one training run plus labels.

`Run` is the one place that reads outputs: the forgetting pass (predictions, correctness),
probabilities, window means and weighted sums of epochs, each streaming epoch by epoch where
the outputs are memory-mapped or lazy, with an explicit memory budget wherever something is
kept in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from . import kernels
from ._deprecation import keyword_options
from ._progress import Progress
from ._summary import CHUNK_BYTES, HOLDS, check_kind, label_margins_of
from ._validation import (
    KINDS,
    check_class_names,
    check_epochs,
    check_indices,
    check_int,
    check_labels,
    check_meta,
    check_number,
    check_outputs,
    check_sample_ids,
    is_dask_array,
    is_streamed,
)
from .errors import ForgetkitError, InputTypeError

#: Runs smaller than this many values are fully checked (finite, probabilities sum to 1) when
#: built; larger ones (memmaps, huge arrays) are checked chunk by chunk as they are read.
EAGER_CHECK_VALUES = 1 << 27
#: How far from 1 the row sums of a "probs" run may be.
PROBS_TOLERANCE = 1e-3
#: Smallest probability taken before a log (exp underflow can give 0), so logs stay finite.
LOG_FLOOR = 1e-300
#: Default memory budget, in bytes, for probabilities kept in memory (`Run.cache_probs`).
DEFAULT_MEMORY_BUDGET = 2 << 30


@keyword_options(renamed={"frac": "val_frac"})
def split_indices(n_samples, val_frac=0.5, *, seed=0):
    """Validation and test sample indices of the paper's split-half protocol.

    ``perm = numpy.random.default_rng(seed).permutation(n_samples)``; validation is
    ``perm[:int(n_samples * val_frac)]`` (``perm[:N//2]`` for 0.5), test the rest.

    Returns
    -------
    val, test : ndarray of int64
    """
    if not 0.0 < check_number("val_frac", val_frac) < 1.0:
        raise ForgetkitError(f"val_frac must lie strictly between 0 and 1; got {val_frac}")
    perm = np.random.default_rng(check_int("seed", seed, minimum=0)).permutation(n_samples)
    n_val = int(n_samples * val_frac)
    if n_val < 1 or n_val >= n_samples:
        raise ForgetkitError(f"val_frac={val_frac} leaves an empty half of {n_samples} samples")
    return perm[:n_val], perm[n_val:]


def epoch_chunks(n_epochs, bytes_per_epoch, chunk_bytes=CHUNK_BYTES):
    """(start, stop) ranges of epochs that take about ``chunk_bytes`` each."""
    step = max(1, chunk_bytes // max(bytes_per_epoch, 1))
    for start in range(0, n_epochs, step):
        yield start, min(start + step, n_epochs)


def softmax(values, out=None):
    """Softmax over the last axis of (n_samples, n_classes) values, in float64.

    exp(x - max) * (1 / sum(exp(x - max))) with forgetkit's vectorised exp (within 1 ulp of
    the correctly rounded one). float16 is read as raw bits (no float16 arithmetic), and a
    row within [-708, 600] needs no shift: exp(x) * (1 / sum(exp(x))) with exp(x) from a
    table of the 65,536 float16 values.
    Raises ValueError if a value is NaN or inf.
    """
    x = np.ascontiguousarray(values)
    if x.ndim != 2:
        raise ForgetkitError(f"softmax expects (samples, classes); got shape {x.shape}")
    if out is None:
        out = np.empty(x.shape, dtype=np.float64)
    n_bad = kernels.softmax_rows(x, out)
    if n_bad:
        raise ForgetkitError(f"{n_bad} rows hold NaN or inf")
    return out


def mean_softmax(stack, out=None):
    """Mean over the first axis of the softmax of logits ``stack`` (k, n_samples, n_classes):
    the arithmetic of ``total = softmax(s[0]); total += softmax(s[1]); ...; total /= k`` in
    one fused pass. Raises ValueError if a value is NaN or inf."""
    x = np.ascontiguousarray(stack)
    if out is None:
        out = np.empty(x.shape[1:], dtype=np.float64)
    n_bad = kernels.combine_softmax(x, np.arange(x.shape[0]), np.arange(x.shape[1]), out)
    if n_bad:
        raise ForgetkitError(f"{n_bad} rows hold NaN or inf")
    return out


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


class LazyOutputs:
    """Base of outputs read on demand, shaped (n_epochs, n_samples, n_classes).

    Indexing the first axis reads those epochs (subclasses implement ``_read(e)`` for one
    epoch index); further indices apply to the result; ``numpy.asarray`` reads everything.
    ``stored_rows()`` is None: the values are decoded, not stored as an array.
    """

    _forgetkit_lazy = True
    ndim = 3

    def __init__(self, shape, dtype):
        self.shape = tuple(int(x) for x in shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.size = int(np.prod(self.shape))

    def _read(self, e):
        raise NotImplementedError

    def stored_rows(self):
        return None

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        first, rest = key[0], key[1:]
        if isinstance(first, (int, np.integer)):
            if not -self.shape[0] <= first < self.shape[0]:
                raise IndexError(f"epoch index {first} out of range for {self.shape[0]} epochs")
            out = self._read(int(first) % self.shape[0])
        else:
            idx = np.arange(self.shape[0])[first]
            out = np.empty((len(idx),) + self.shape[1:], dtype=self.dtype)
            for i, e in enumerate(idx):
                out[i] = self._read(int(e))
            rest = (slice(None),) + rest if rest else rest
        return out[rest] if rest else out

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)


class SubsetOutputs(LazyOutputs):
    """Lazy sample subset of streamed outputs (memmap or another lazy view): each epoch is
    read from ``base`` and indexed by ``index`` on the fly, so a subset never copies the
    whole run."""

    def __init__(self, base, index):
        super().__init__((base.shape[0], len(index), base.shape[2]), base.dtype)
        self.base, self.index = base, index
        self._stored = self._order = None

    def _read(self, e):
        return np.asarray(self.base[e])[self.index]

    def stored_rows(self):
        if self._stored is None:
            base = stored_rows(self.base)
            self._stored = False if base is None else (base[0], base[1][self.index])
        return self._stored or None

    def read_order(self):
        """`kernels.read_order` of the stored rows (kept), or None if not stored."""
        stored = self.stored_rows()
        if stored is not None and self._order is None:
            self._order = kernels.read_order(stored[1])
        return self._order


def _on_chunks():
    """`forgetkit.distributed`'s passes over the chunks of a run on a dask array (imported
    only for such runs: dask is an optional dependency)."""
    from .distributed import chunks

    return chunks


def stored_rows(outputs):
    """(values, rows): ``outputs`` as a C-contiguous in-memory or memory-mapped (E, M, C)
    array that holds sample n at row rows[n], without reading or gathering anything; None
    for outputs decoded epoch by epoch (Parquet) or laid out otherwise."""
    if isinstance(outputs, LazyOutputs):
        return outputs.stored_rows()
    if isinstance(outputs, np.ndarray) and outputs.flags.c_contiguous:
        return outputs, np.arange(outputs.shape[1])
    return None


def stored_order(outputs):
    """The order in which to read the rows of `stored_rows` (ascending storage rows; kept
    by a lazy sample subset), or None for outputs not stored as an array."""
    if isinstance(outputs, SubsetOutputs):
        return outputs.read_order()
    stored = stored_rows(outputs)
    return None if stored is None else kernels.read_order(stored[1])


def epoch_parts(outputs):
    """``outputs`` (E, N, C) as parts (values (k, M, C), rows (N,), epochs slice) for the
    kernels that read every epoch of a row together: the stored array in place, once
    (`stored_rows`), or each epoch decoded in turn (one in memory at a time)."""
    stored = stored_rows(outputs)
    n_epochs, n_samples = outputs.shape[:2]
    if stored is not None:
        return [(stored[0], stored[1], slice(0, n_epochs))]
    return ((np.asarray(outputs[e])[None], np.arange(n_samples), slice(e, e + 1))
            for e in range(n_epochs))


def _as_slice(idx):
    """A slice for consecutive indices (a view of a memmap), else the indices."""
    if len(idx) and np.all(np.diff(idx) == 1):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


class Run:
    """Model outputs of one training run, as stored after every (few) epoch(s).

    Parameters
    ----------
    outputs : ndarray, memmap or dask array of shape (n_epochs, n_samples, n_classes)
        float16, float32 or float64 logits or probabilities. Not copied. A dask array (chunked
        along samples) stays distributed: see `is_distributed`.
    labels : array-like of shape (n_samples,)
        True class of each sample, integers in [0, n_classes).
    kind : {"logits", "probs", "summary"}
        "summary" goes with `forgetkit._summary.SummaryOutputs` (a run read from a summary,
        `forgetkit.summarize`): correctness, `label_probs` and `label_margins` come exactly
        from it; methods that need every class's outputs raise a ValueError.
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
        n_epochs, n_samples, n_classes = self.outputs.shape
        self.kind = check_kind(kind, self.outputs, KINDS)
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
        tensor is never gathered into this process."""
        return is_dask_array(self.outputs)

    @property
    def _large(self):
        return is_streamed(self.outputs) or self.outputs.size > EAGER_CHECK_VALUES

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
    def _where(self):
        """The start of a message about this run's values: its source file, if any."""
        return "" if self.source is None else f"{str(self.source)!r}: "

    def check_epoch(self, index, values):
        """Raise ValueError if epoch ``index``'s values (n_samples, n_classes) are not valid."""
        if not np.all(np.isfinite(values)):
            raise ForgetkitError(
                f"{self._where}outputs contain NaN or inf at epoch index {index} "
                f"(epoch {self.epochs[index]})"
            )
        if self.kind == "probs":
            sums = values.sum(axis=-1, dtype=np.float64)
            bad = np.abs(sums - 1.0) > PROBS_TOLERANCE
            neg = (values < 0).any(axis=-1)
            if bad.any() or neg.any():
                n = int(np.argmax(bad | neg))
                raise ForgetkitError(
                    f'{self._where}kind="probs" but sample {n} at epoch index {index} '
                    f"(epoch {self.epochs[index]}) is not a probability vector "
                    f"(sum {sums[n]:.6g}, tolerance {PROBS_TOLERANCE})"
                )

    def epoch_values(self, index):
        """The stored outputs of epoch ``index`` (n_samples, n_classes), checked if this run
        checks per read."""
        self._require_full("epoch_values()")
        values = np.ascontiguousarray(self.outputs[index])
        if self.checked_per_read:
            self.check_epoch(index, values)
        return values

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
        if self.is_distributed:
            return _on_chunks().map_samples(self, "predictions")
        if self._predictions is not None:
            return self._predictions
        if self.kind == "summary":  # exact from the label and the largest other logit
            self._inherit_predictions(self.outputs.predictions(self.labels))
            return self._predictions
        n_epochs, n_samples, n_classes = self.shape
        out = np.empty((n_epochs, n_samples), dtype=np.int32)
        bar = Progress(n_epochs, "forgetting pass", enabled=progress)
        # a lazy sample subset of a memmap is read in place by the parallel kernel, not
        # gathered epoch by epoch first (unless its values must be checked as probabilities)
        stored = self._subset_rows()
        if self.kind == "probs" and self.checked_per_read:
            stored = None
        for start, stop in epoch_chunks(n_epochs, n_samples * n_classes * self.outputs.itemsize):
            if stored is not None:
                kernels.argmax_rows_at(stored[0][start:stop], stored[1], out[start:stop],
                                       order=stored_order(self.outputs))
            else:
                chunk = np.ascontiguousarray(self.outputs[start:stop])
                kernels.argmax_rows(chunk.reshape(-1, n_classes), out[start:stop].reshape(-1))
            bad = (out[start:stop] < 0).any(axis=1)
            if bad.any():
                e = start + int(np.argmax(bad))
                raise ForgetkitError(
                    f"{self._where}outputs contain NaN or inf at epoch index {e} "
                    f"(epoch {self.epochs[e]})"
                )
            if self.kind == "probs" and self.checked_per_read:  # rows must sum to 1 too
                for i, values in enumerate(chunk):
                    self.check_epoch(start + i, values)
            bar.update(stop - start)
        out.setflags(write=False)
        self._predictions = out
        return out

    def correctness(self, *, progress=False):
        """Whether each sample is classified correctly at each epoch: bool (E, N)."""
        return self.predictions(progress=progress) == self.labels[None, :]

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
        if self.is_distributed:
            return _on_chunks().map_samples(self, "probs", index, dtype=dtype)
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
        if held is None and not self.is_distributed and size <= memory_budget:
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
        if self.kind == "probs" and type(out) is np.ndarray and out.dtype == np.float64 \
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
        if self.kind != "logits" or self.is_distributed:
            raise ForgetkitError("softmax_stats() needs logits held in memory or on disk; "
                                 f"this run holds {self.kind}"
                                 + (" on a dask array" if self.is_distributed else ""))
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
        for values, src, epochs in epoch_parts(self.outputs):
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
        if self.is_distributed:
            if out is not None:
                raise ForgetkitError("out= needs a run held in memory; this run's outputs are "
                                     "a dask array (the result is a dask array)")
            return _on_chunks().map_samples(self, "mean_probs", idx)
        cached = self.cached_probs
        if out is None:
            out = np.empty((self.n_samples, self.n_classes))
        if cached is not None:
            stack = cached[_as_slice(idx)]  # consecutive epochs: a view, no copy
            return kernels.mean_first_axis(stack, out)
        logits = self.logits_in_place()
        if logits is not None:
            if not kernels.combine_softmax(logits[0], idx, logits[1], out, order=logits[2]):
                return out
        elif self.kind == "logits":  # decoded: the epochs gathered first
            stack = np.ascontiguousarray(self.outputs[_as_slice(idx)])
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
        if self.is_distributed:
            return _on_chunks().map_samples(self, "weighted_probs", idx, weights)
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
        if self.kind != "logits" or self.cached_probs is not None or self.is_distributed:
            return None
        stored = stored_rows(self.outputs)
        return None if stored is None else (*stored, stored_order(self.outputs))

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
        storing any epoch's probabilities. A summary gives exp(label logit - log-sum-exp)."""
        if self.is_distributed:
            return _on_chunks().map_samples(self, "label_probs")
        if self.kind == "summary":
            return self.outputs.label_probs().T
        if self.cached_softmax_stats is not None:
            return self._stats.label_prob.T.copy()
        q = np.empty((self.n_epochs, self.n_samples))
        rows = np.arange(self.n_samples)
        stored = stored_rows(self.outputs)
        if self.cached_probs is not None or self.kind != "logits":
            tmp = np.empty((self.n_samples, self.n_classes))
            for e in range(self.n_epochs):
                q[e] = self._epoch_probs(e, tmp)[rows, self.labels]
            return q.T
        for e in range(self.n_epochs):
            if stored is not None:
                values, src = stored[0][e], stored[1]
            else:
                values, src = np.asarray(self.outputs[e]), rows
            if kernels.label_probs(values, src, self.labels, q[e]):
                self.probs(e)  # raises the error naming the epoch and its bad values
        return q.T

    def label_margins(self):
        """The label's margin at every epoch, z[y] - max_{k != y} z[k], on the stored outputs
        (logits: the margin whose mean over epochs is AUM): float64 (n_epochs, n_samples).
        Exact from a summary; otherwise read one epoch at a time."""
        if self.kind == "summary":
            return self.outputs.label_margins()
        out = np.empty((self.n_epochs, self.n_samples))
        for e in range(self.n_epochs):
            out[e] = label_margins_of(self.epoch_values(e), self.labels)
        return out

    def _require_full(self, what):
        """Raise a ValueError naming ``what`` if this run holds only a summary."""
        if self.kind == "summary":
            raise ForgetkitError(f"{what} needs every class's outputs; {HOLDS}")

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
        ``functools.partial`` of one).
        """
        if self.is_distributed:
            return _on_chunks().map_reduce(self, fn)
        return fn(self)

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

    def _subset_rows(self):
        """`stored_rows` of outputs that are a sample subset of a stored array (a lazy
        subset of a memmap), else None."""
        stored = stored_rows(self.outputs)
        return stored if stored is not None and stored[0] is not self.outputs else None

    def _epoch_probs(self, e, out):
        """Write the probabilities of epoch index ``e`` into ``out`` (n_samples, n_classes)."""
        if self._probs is not None:
            out[...] = self._probs[e]
            return out
        stored = self._subset_rows()
        if self.kind == "logits" and stored is not None and out.dtype == np.float64:
            # rows read in place (the same bits as softmax_rows); a bad row takes the path
            # below, which names the epoch
            if not kernels.combine_softmax(stored[0], [e], stored[1], out,
                                           order=stored_order(self.outputs)):
                return out
        values = np.asarray(self.outputs[e])
        if self.kind == "probs":
            if self.checked_per_read:
                self.check_epoch(e, values)
            out[...] = values
            return out
        target = out if out.dtype == np.float64 else np.empty(out.shape)
        try:
            softmax(values, out=target)
        except ValueError:
            self.check_epoch(e, values)  # names the epoch
            raise
        if target is not out:
            out[...] = target
        return out

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
        # a dask array and a summary select by themselves
        lazy = self._large and not self.is_distributed and self.kind != "summary"
        outputs = SubsetOutputs(self.outputs, idx) if lazy else self.outputs[:, idx]
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
