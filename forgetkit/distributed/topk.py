"""Certified fusion on a top-k run whose records are a dask array: each chunk of tokens on
a worker, the client holding only counts and per-token results.

Every certified quantity of a token (its layout of classes, its bounds under a mixture,
its certificate) depends on that token's records alone, and the fit's counts are sums over
tokens. So each step runs the in-memory code (`forgetkit.fusion.topk`) on a worker, on the
`TopKData` of one chunk of tokens, and only integers or per-token rows come back: the
results equal the in-memory path's bit for bit.

A chunk's records are read there epoch by epoch (`ChunkRecords`): Knowledge Fusion's fit
keeps each chunk's state (the current fusion's bounds: two float64 per token and class its
checkpoints stored, 13 to 67 classes on the runs measured) on its worker for the whole fit,
and each step reads only the epochs of its window, never the chunk's every epoch again.
Records loaded from NPY shards (`forgetkit.distributed.load_shards`) are chunked by epoch,
so such a read is one read of the file; other dask arrays read a chunk's every epoch to
give one.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np

from ..errors import ForgetkitError
from ..execution import LocalParts
from ..fusion import topk
from ..fusion.fitstate import ChunkedFitState
from ..kinds.topk import CHUNK_TOKENS, TopKData, top_k_of
from .parts import DaskParts


class ChunkRecords:
    """The records (E, n) of one chunk of tokens of a top-k run on dask, read on a worker
    epoch by epoch and kept until `forget` (or every epoch at once, `hold`): the
    ``records`` of a `TopKData`.

    Parameters
    ----------
    x : dask array (E, n) of a `topk_dtype`, one chunk of tokens
    """

    ndim = 2

    def __init__(self, x):
        (self.x,) = dask.optimize(x)  # culled: the chunk's own tasks only
        self.shape, self.dtype = x.shape, x.dtype
        self.block, self.epochs = None, {}

    def __getstate__(self):  # what was read stays where it was read
        return {"x": self.x, "shape": self.shape, "dtype": self.dtype, "block": None,
                "epochs": {}}

    def __getitem__(self, key):
        e, rows = key
        if self.block is not None:
            return self.block[e, rows]
        if isinstance(e, slice):  # every epoch at these tokens (`TopKData.fields`)
            return np.asarray(self.x[e, rows].compute(scheduler="sync"))
        if np.ndim(e):  # these epochs at these tokens (a window's `TopKData.fields`)
            return np.stack([self._epoch(int(i))[rows] for i in e])
        return self._epoch(int(e))[rows]

    def _epoch(self, e):
        if e not in self.epochs:
            self.epochs[e] = self.x[e].compute(scheduler="sync")
        return self.epochs[e]

    def hold(self):
        """Read every epoch at once (one compute of the chunk) and keep them: (E, n)."""
        self.block = np.asarray(self.x.compute(scheduler="sync"))
        return self.block

    def forget(self):
        """Drop what was read."""
        self.block, self.epochs = None, {}


class ChunkFit(ChunkedFitState):
    """Knowledge Fusion's fit state of one chunk of tokens on its worker: the
    `forgetkit.fusion.topk.TopKFitChunk` of each `CHUNK_TOKENS` of its tokens (as the
    in-memory fit makes them), their counts summed; the epochs each step reads are dropped
    after it."""

    def __init__(self, data):
        self.records = data.records
        self.records.hold()  # the layouts read every epoch: one read of the chunk
        parts = [topk.TopKFitChunk(data, rows, settle=True)  # always an eps grid here
                 for rows in data.chunks(CHUNK_TOKENS)]
        self.records.forget()
        super().__init__(LocalParts(parts))

    def grid_counts(self, window, grid):
        try:
            return super().grid_counts(window, grid)
        finally:
            self.records.forget()

    def mix(self, window, eps):
        try:
            super().mix(window, eps)
        finally:
            self.records.forget()


class ChunkSelection:
    """Greedy ensemble selection's state on one chunk of tokens on its worker (the rounds of
    `forgetkit.fusion.topk.topk_selection`): per `CHUNK_TOKENS` of its tokens, the layout
    of every epoch and the running sum of the picks' upper bounds."""

    def __init__(self, data):
        self.data, self.n_picked = data, 0
        data.records.hold()  # the layouts read every epoch: one read of the chunk
        self.parts = []
        for rows in data.chunks(CHUNK_TOKENS):
            layout = topk.Layout(data, range(data.n_epochs), rows, settle=True)
            self.parts.append((layout, np.zeros(layout.shape)))
        data.records.forget()

    def scores(self):
        """Tokens certified correct by the sum of the picks and each epoch: int64 (E,)."""
        scores = np.zeros(self.data.n_epochs, dtype=np.int64)
        self.data.records.hold()
        for layout, total in self.parts:
            scores += topk.selection_scores(self.data, layout, total)
        self.data.records.forget()
        return scores

    def add(self, e, n_picked):
        """Add epoch index ``e``'s upper bounds to the sum, unless this state has
        ``n_picked`` picks already (a task run twice)."""
        if self.n_picked == n_picked:
            for layout, total in self.parts:
                topk.add_pick(self.data, layout, e, total)
            self.data.records.forget()
            self.n_picked += 1
        return self


def _scores(state):
    return state.scores()


def _add(state, e, n_picked):
    return state.add(e, n_picked)


def _select_chunk(records, targets, vocab_size):
    return ChunkSelection(TopKData(records, targets, vocab_size))


def _fit_chunk(records, targets, vocab_size):
    return ChunkFit(TopKData(records, targets, vocab_size))


def _certify(records, targets, vocab_size, recipe, states_only):
    return topk.certify(TopKData(records, targets, vocab_size), recipe,
                        states_only=states_only)


def _label_probs(records, targets, vocab_size):
    return topk.label_probs(TopKData(records, targets, vocab_size))


def _exact_probs(records, targets, vocab_size, recipe):
    return topk.exact_probs(TopKData(records, targets, vocab_size), recipe)


class DaskTopK:
    """What certified fusion reads of a top-k run on a dask array (`TopKKind.certified_bounds`
    on the dask executor): the in-memory steps of `forgetkit.fusion.topk`, one task per
    chunk of tokens of the records.

    Parameters
    ----------
    run : Run of the top-k kind whose records are a dask array (E, N)
    """

    def __init__(self, run):
        self.records = run.outputs.stored
        self.targets = np.asarray(run.labels, dtype=np.int64)
        self.vocab_size = int(run.n_classes)
        self.top_k = top_k_of(self.records.dtype)
        self.n_epochs, self.n_tokens = self.records.shape
        sizes = self.records.chunks[1]
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    @property
    def exact(self):
        """Whether every class is stored (k == the vocabulary)."""
        return self.top_k >= self.vocab_size

    def _tasks(self, fn, *args):
        """One Delayed ``fn(records, targets, vocab_size, *args)`` per chunk of tokens."""
        return [dask.delayed(fn, pure=False)(ChunkRecords(self.records[:, a:b]),
                                            self.targets[a:b], self.vocab_size, *args)
                for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]

    def _samples(self, tasks, shape, dtype):
        """The per-token results of ``tasks`` as one lazy dask array concatenated along
        tokens (None in ``shape``)."""
        axis = shape.index(None)
        sizes = np.diff(self.bounds)
        return da.concatenate([da.from_delayed(t, shape=shape[:axis] + (int(n),)
                                               + shape[axis + 1:], dtype=dtype)
                               for t, n in zip(tasks, sizes, strict=True)], axis=axis)

    def fit_state(self, grid):
        """Knowledge Fusion's `ChunkedFitState` of the run: a `ChunkFit` per chunk, kept on
        the workers; ``grid`` the eps grid (None, the continuous search, is refused: it
        needs every token's intervals in one place)."""
        if grid is None:
            raise ForgetkitError("grid=None (the continuous eps search) needs a run held in "
                                 "memory or on disk, read as one chunk; on a run on a dask "
                                 "array pass an eps grid (e.g. grid=101)")
        return ChunkedFitState(DaskParts(self._tasks(_fit_chunk)))

    def selection(self, k):
        """Greedy ensemble selection's ``k`` picks (epoch indices): those of
        `forgetkit.fusion.topk.topk_selection`, each round's counts summed here over the
        chunks' `ChunkSelection` on the workers."""
        parts = DaskParts(self._tasks(_select_chunk))
        picks = []
        for i in range(k):
            scores = np.sum(parts.map(_scores), axis=0, dtype=np.int64)
            picks.append(int(np.argmax(scores)))  # ties: the earlier epoch
            if i + 1 < k:
                parts.update(_add, picks[-1], i)
        return picks

    def certify(self, recipe, *, states_only=False):
        """`forgetkit.fusion.topk.certify` of the run, computed on the workers: (prediction
        int64 (N,), certified bool (N,), state int8 (N,), label_prob float64 (N,)); with
        ``states_only``, predictions only where the states needed them (as there)."""
        parts = dask.compute(*self._tasks(_certify, recipe, states_only))
        if not parts:
            return topk.certify(TopKData(np.empty((self.n_epochs, 0), self.records.dtype),
                                         self.targets, self.vocab_size), recipe,
                                states_only=states_only)
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))

    def label_probs(self):
        """The targets' probabilities at every epoch: a lazy dask array (N, E) of float64."""
        return self._samples(self._tasks(_label_probs), (None, self.n_epochs), np.float64)

    def exact_probs(self, recipe):
        """The fused probabilities of a run whose records hold every class: a lazy dask array
        (N, V) of float64 (ForgetkitError where k is below the vocabulary)."""
        if not self.exact:  # the in-memory error, raised here rather than on a worker
            topk.exact_probs(TopKData(np.empty((self.n_epochs, 0), self.records.dtype),
                                      self.targets[:0], self.vocab_size), recipe)
        return self._samples(self._tasks(_exact_probs, recipe), (None, self.vocab_size),
                             np.float64)
