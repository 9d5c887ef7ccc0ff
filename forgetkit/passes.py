"""The passes over a run: predictions, probabilities, window means, weighted sums, label
probabilities and margins, softmax statistics, and the results kept on a run (`Cache`).

Each is a function of a `forgetkit.Run`, reached one way: through the run's executor
(`forgetkit.execution.executor_for`), which reads a run held in memory or on disk here and
maps a run on a dask array over its chunks on the workers (the per-chunk functions are
module-level, hence picklable). Each chunk asks the run's kind (`forgetkit.kinds`) what it
stores; logits stored as an array are read in place by the kernels, never gathered whole,
and every pass streams epoch by epoch where the outputs are memory-mapped or lazy, with an
explicit memory budget wherever something is kept in memory. The `Run` methods of the same
names call these.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

from . import kernels
from ._validation import check_array, check_indices, check_int, check_type
from .backends import as_slice
from .errors import ForgetkitError
from .execution import executor_for
from .kinds import kind_of

#: Default memory budget, in bytes, for probabilities kept in memory (`cache_probs`).
DEFAULT_MEMORY_BUDGET = 2 << 30


class SoftmaxStats(NamedTuple):
    """What one pass over every epoch's softmax of a logits run keeps (`softmax_stats`),
    each as forgetkit's softmax computes it."""

    shift: np.ndarray  #: (E, N) float64: the shift of each row's exp (nan: some exp underflowed)
    inv: np.ndarray  #: (E, N) float64: 1 / the sum of each row's exp (nan likewise)
    pred: np.ndarray  #: (E, N) int32: first argmax of each row's probabilities
    label_prob: np.ndarray  #: (E, N) float64: probability of each sample's label
    class_max: np.ndarray | None  #: (N, C) float64: largest probability of each class, or None

    def take(self, idx):
        """The statistics of samples ``idx`` (gathered in parallel)."""
        return SoftmaxStats(*kernels.take_samples(self, idx))


class Cache:
    """The passes' results kept on a run (``Run.cache``), carried over to its selections:
    ``predictions`` (E, N) int32 read-only (the forgetting pass), ``probs`` (E, N, C) float64
    read-only (`cache_probs`), ``stats`` (`softmax_stats`) and ``stats_of`` ((run, sample
    indices) whose stats are these samples', taken on first use)."""

    def __init__(self):
        self.predictions = self.probs = self.stats = self.stats_of = None

    def keep_predictions(self, predictions):
        """Keep ``predictions`` (made read-only)."""
        predictions.setflags(write=False)
        self.predictions = predictions

    def of_epochs(self, idx):
        """The cache of the epochs ``idx`` of its run: the predictions carry over."""
        cache = Cache()
        if self.predictions is not None:
            cache.keep_predictions(self.predictions[idx])
        return cache

    def of_samples(self, run, idx):
        """The cache of the samples ``idx`` of ``run`` (whose cache this is): the
        predictions carry over, the softmax stats when first used."""
        cache = Cache()
        if self.predictions is not None:
            cache.keep_predictions(self.predictions[:, idx])
        if self.stats is not None or self.stats_of is not None:
            cache.stats_of = (run, idx)
        return cache


def epoch_index(run, e):
    """Epoch index ``e`` of ``run`` (negative from the end), checked: int in [0, E)."""
    e = check_int("epoch index", e)
    if not -run.n_epochs <= e < run.n_epochs:
        raise ForgetkitError(f"epoch index must lie in [0, {run.n_epochs}); got {e}")
    return e % run.n_epochs


def _per_sample(run, fn, shape, dtype, out=None):
    """``fn(run)`` on the run's executor: here for a run held in memory or on disk, else
    ``fn`` of every chunk concatenated along samples (a lazy dask array); ``shape`` has None
    at the axis of samples."""
    return executor_for(run).map_samples(run, fn, shape, dtype, out=out)


# ------------------------------------------------------------------ forgetting pass
def predictions(run, *, progress=False):
    """Predicted class (argmax over classes, ties to the lowest index) at every epoch: int32
    (E, N), read-only, computed once per run (and inherited by sample subsets)."""
    return _per_sample(run, partial(_predictions, progress=progress), (run.n_epochs, None),
                       np.int32)


def _predictions(run, *, progress=False):
    if run.cache.predictions is None:
        run.cache.keep_predictions(kind_of(run).predictions(run, progress=progress))
    return run.cache.predictions


def correctness(run, *, progress=False):
    """Whether each sample is classified correctly at each epoch: bool (E, N)."""
    pred = predictions(run, progress=progress)
    # labels as the predictions' int32 (classes fit it): no int64 cast per element
    return pred == run.labels.astype(pred.dtype)[None, :]


# ------------------------------------------------------------------ probabilities
def epoch_probs(run, e, out):
    """Write the probabilities of epoch index ``e`` into ``out`` (N, C)."""
    if run.cache.probs is not None:
        out[...] = run.cache.probs[e]
        return out
    return kind_of(run).epoch_probs(run, e, out)


def probs(run, index=None, *, dtype=np.float64):
    """Probabilities of epoch ``index`` (N, C), of indices (len(index), N, C), or of every
    epoch (None)."""
    kind_of(run).require_full(run, "probs()")
    if index is None:
        index = range(run.n_epochs)
    lead = () if np.ndim(index) == 0 else (len(index),)
    return _per_sample(run, partial(_probs, index=index, dtype=dtype),
                       lead + (None, run.n_classes), dtype)


def _probs(run, *, index, dtype):
    if np.ndim(index) == 0:
        e = epoch_index(run, index)
        if run.cache.probs is not None and dtype == np.float64:
            return run.cache.probs[e].copy()
        return epoch_probs(run, e, np.empty((run.n_samples, run.n_classes), dtype))
    idx = [epoch_index(run, e) for e in index]
    out = np.empty((len(idx), run.n_samples, run.n_classes), dtype=dtype)
    for i, e in enumerate(idx):
        epoch_probs(run, e, out[i])
    return out


def cache_probs(run, *, memory_budget=DEFAULT_MEMORY_BUDGET):
    """Keep every epoch's float64 probabilities on ``run`` if they take at most
    ``memory_budget`` bytes; returns them (read-only) or None."""
    kind_of(run).require_full(run, "cache_probs()")
    held = cached_probs(run)
    size = run.n_epochs * run.n_samples * run.n_classes * 8
    if held is None and run.backend.here and size <= memory_budget:
        held = run.cache.probs = probs(run)
        held.setflags(write=False)
    return held


def cached_probs(run):
    """Every epoch's float64 probabilities if held in memory (kept by `cache_probs`, or the
    outputs themselves for float64 probabilities held in memory), else None."""
    if run.cache.probs is not None:
        return run.cache.probs
    out = run.outputs
    kind = kind_of(run)
    if kind.stores_values and not kind.softmax and type(out) is np.ndarray \
            and out.dtype == np.float64 and not run.checked_per_read:
        return out
    return None


def logits_in_place(run):
    """(values, rows, order) of logits the kernels read in place (an in-memory or
    memory-mapped (E, M, C) array holding sample n at row rows[n], read in ``order``), else
    None (probabilities, probabilities held, decoded or dask outputs, records)."""
    if not kind_of(run).softmax or cached_probs(run) is not None:
        return None
    stored = run.backend.stored_rows()
    return None if stored is None else (*stored, run.backend.stored_order())


def mean_probs(run, indices, *, out=None):
    """Mean of the probabilities of epoch ``indices`` (summed in index order, then divided):
    float64 (N, C), written into ``out`` if given."""
    kind_of(run).require_full(run, "mean_probs()")
    idx = check_indices("indices", indices, run.n_epochs, what="epoch")
    return _per_sample(run, partial(_mean_probs, idx=idx, out=out), (None, run.n_classes),
                       np.float64, out=out)


def _mean_probs(run, *, idx, out=None):
    cached = cached_probs(run)
    if out is None:
        out = np.empty((run.n_samples, run.n_classes))
    if cached is not None:
        stack = cached[as_slice(idx)]  # consecutive epochs: a view, no copy
        return kernels.mean_first_axis(stack, out)
    logits = logits_in_place(run)
    if logits is not None:
        if not kernels.combine_softmax(logits[0], idx, logits[1], out, order=logits[2]):
            return out
    elif kind_of(run).softmax:  # decoded: the epochs gathered first
        stack = run.backend.read(as_slice(idx))
        if not kernels.combine_softmax(stack, np.arange(len(idx)), np.arange(run.n_samples),
                                       out):
            return out
    # epoch by epoch: one epoch in memory besides the total; names a bad epoch
    epoch_probs(run, int(idx[0]), out)
    if len(idx) > 1:
        tmp = np.empty_like(out)
        for e in idx[1:]:
            out += epoch_probs(run, int(e), tmp)
        out /= len(idx)
    return out


def weighted_probs(run, indices, weights):
    """sum_i weights[i] * P[indices[i]]: float64 (N, C), added in order to zeros."""
    kind_of(run).require_full(run, "weighted_probs()")
    idx = check_indices("indices", indices, run.n_epochs)
    check_array("weights", weights, kinds="iuf", shape=idx.shape)
    return _per_sample(run, partial(_weighted_probs, idx=idx, weights=weights),
                       (None, run.n_classes), np.float64)


def _weighted_probs(run, *, idx, weights):
    out = np.empty((run.n_samples, run.n_classes))
    logits = logits_in_place(run)
    if logits is not None:
        if not kernels.combine_softmax(logits[0], idx, logits[1], out, weights,
                                       order=logits[2]):
            return out
    out[...] = 0.0
    tmp = np.empty_like(out)
    for e, w in zip(idx, weights, strict=True):
        out += w * epoch_probs(run, int(e), tmp)
    return out


def add_probs(run, index, total):
    """total += the probabilities of epoch ``index`` (float64 (N, C), in place, the bits of
    ``total += probs(run, index)``), without storing the epoch's probabilities."""
    kind_of(run).require_full(run, "add_probs()")
    check_type("total", total, np.ndarray, "a float64 ndarray (n_samples, n_classes)")
    check_array("total", total, kinds="f", shape=(run.n_samples, run.n_classes))
    e = epoch_index(run, index)
    cached = cached_probs(run)
    logits = logits_in_place(run)
    if cached is not None:
        kernels.add_into(total, cached[e])
    elif logits is None or kernels.combine_softmax(
            logits[0], [e], logits[1], total, weights=[1.0], accumulate=True,
            order=logits[2]):
        kernels.add_into(total, probs(run, e))  # decoded, or names the bad epoch
    return total


def label_probs(run):
    """Probability of each sample's label at every epoch: float64 (N, E)."""
    return _per_sample(run, _label_probs, (None, run.n_epochs), np.float64)


def _label_probs(run):
    if cached_softmax_stats(run) is not None:
        return run.cache.stats.label_prob.T.copy()
    if cached_probs(run) is not None:
        rows, q = np.arange(run.n_samples), np.empty((run.n_epochs, run.n_samples))
        tmp = np.empty((run.n_samples, run.n_classes))
        for e in range(run.n_epochs):
            q[e] = epoch_probs(run, e, tmp)[rows, run.labels]
        return q.T
    return kind_of(run).label_probs(run).T


def label_margins(run):
    """The label's margin at every epoch on the stored values (logits: AUM's margin):
    float64 (E, N)."""
    return kind_of(run).label_margins(run)


# ------------------------------------------------------------------ softmax statistics
def softmax_stats(run, *, memory_budget=DEFAULT_MEMORY_BUDGET):
    """One pass over the softmax of every epoch of a logits run, kept on the run and
    inherited by its sample subsets: `SoftmaxStats` (each class's largest probability when
    (N, C) float64 takes at most ``memory_budget`` bytes); float16 logits whose every exp
    comes from the table also get their predictions."""
    kind = kind_of(run)
    kind.require_full(run, "softmax_stats()")
    if not kind.softmax or not run.backend.here:
        raise ForgetkitError("softmax_stats() needs logits held in memory or on disk; "
                             f"this run holds {run.kind}"
                             + ("" if run.backend.here else " on a dask array"))
    n_epochs, n_samples, n_classes = run.shape
    want_max = n_samples * n_classes * 8 <= memory_budget
    held = cached_softmax_stats(run)
    if held is not None and (held.class_max is not None or not want_max):
        return held
    stats = SoftmaxStats(np.full((n_epochs, n_samples), np.nan),
                         np.full((n_epochs, n_samples), np.nan),
                         np.empty((n_epochs, n_samples), dtype=np.int32),
                         np.empty((n_epochs, n_samples)),
                         np.zeros((n_samples, n_classes)) if want_max else None)
    for values, src, epochs in run.backend.epoch_parts():
        bad = kernels.softmax_stats(values, src, run.labels, stats.shift[epochs],
                                    stats.inv[epochs], stats.pred[epochs],
                                    stats.label_prob[epochs], stats.class_max)
        for e in np.flatnonzero(bad):
            probs(run, epochs.start + int(e))  # raises the error naming the epoch
    run.cache.stats = stats
    if run.cache.predictions is None and run.outputs.dtype == np.float16 \
            and (stats.shift == 0).all():
        # every row's exp came from the table: distinct float16 values keep their order
        # through it (gaps of at least 6e-8 relative), so the first argmax of the
        # probabilities is the forgetting pass's
        run.cache.keep_predictions(stats.pred)
    return stats


def cached_softmax_stats(run):
    """The `softmax_stats` if computed (on ``run`` or on the run it is a sample subset of,
    then taken for these samples on first use), else None."""
    cache = run.cache
    if cache.stats is None and cache.stats_of is not None:
        parent, idx = cache.stats_of
        stats = cached_softmax_stats(parent)
        cache.stats = None if stats is None else stats.take(idx)
        cache.stats_of = None
    return cache.stats
