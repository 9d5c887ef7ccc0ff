"""Passes over a run whose outputs are a dask array, one chunk of samples at a time.

The outputs are taken chunked along samples only (every epoch and class of a block of
samples in one chunk; other chunkings are merged along epochs and classes). Each chunk
becomes an in-memory `Run` on its worker (`chunk_run`): labels, epoch numbers and sample
ids included, positions as ids when the run has none. A pass calls the in-memory code on
each chunk's Run and combines the results, so it computes exactly what the in-memory path
computes:

- `map_reduce`: ndarray results (counts) summed, DataFrames (per-sample rows) concatenated
  in sample order; computed at once on the active dask scheduler;
- `persist_chunks`: per-chunk results kept on the workers, for passes that need a global
  step between them (label issues);
- `apply_samples` / `map_samples`: per-sample results (predictions, probabilities, fused
  probabilities) as a lazy dask array concatenated along samples.
"""

from __future__ import annotations

import functools
import operator

import dask
import dask.array as da
import numpy as np
import pandas as pd

from ..run import Run


def sample_chunks(run):
    """The run's outputs (E, N, C) chunked along samples only (a dask array)."""
    x = run.outputs
    if len(x.chunks[0]) > 1 or len(x.chunks[2]) > 1:
        x = x.rechunk({0: -1, 2: -1})
    return x


def chunk_tasks(run, fn):
    """One Delayed ``fn(chunk_run(...))`` per chunk of samples, in sample order, and the
    number of samples of each chunk."""
    x = sample_chunks(run)
    sizes = x.chunks[1]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    ids = run.sample_ids if run.sample_ids is not None else np.arange(run.n_samples)
    blocks = x.to_delayed(optimize_graph=True).ravel()
    # logits are checked by every kernel that reads them (inf or nan raises, naming the
    # epoch): a chunk checked again when built would cost more than the pass itself
    validate = run.checked_per_read and run.kind != "logits"
    tasks = [dask.delayed(_on_chunk)(fn, block, run.labels[a:b], ids[a:b], kind=run.kind,
                                     epochs=run.epochs, validate=validate)
             for block, a, b in zip(blocks, bounds[:-1], bounds[1:], strict=True)]
    return tasks, sizes


def chunk_run(block, labels, sample_ids, *, kind, epochs, validate):
    """The Run of one chunk: outputs (n_epochs, n, n_classes), labels and sample ids (n,)."""
    return Run(block, labels, kind=kind, epochs=epochs, sample_ids=sample_ids,
               validate=validate)


def _on_chunk(fn, block, labels, sample_ids, **spec):
    return fn(chunk_run(block, labels, sample_ids, **spec))


def combine(parts):
    """Per-chunk results combined: ndarrays (and numbers) summed, DataFrames concatenated in
    order, tuples element by element."""
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(combine(list(p)) for p in zip(*parts, strict=True))
    if isinstance(first, pd.DataFrame):
        return pd.concat(parts)
    return functools.reduce(operator.add, parts)


def map_reduce(run, fn):
    """`Run.map_reduce` of a run on a dask array: ``fn`` on each chunk's Run, on the workers
    of the active dask scheduler, results combined by `combine`."""
    tasks, _ = chunk_tasks(run, fn)
    return combine(dask.compute(*tasks))


def persist_chunks(run, fn):
    """``fn(chunk Run)`` of every chunk, computed on the active dask scheduler and kept
    there (on the workers of a dask.distributed Client): Delayed objects in sample order,
    for further passes over the results without reading the outputs again."""
    tasks, _ = chunk_tasks(run, fn)
    return list(dask.persist(*tasks))


def apply_samples(run, fn, shape, dtype):
    """Lazy dask array of ``fn(chunk Run)`` over the chunks, concatenated along samples.

    ``shape``: the shape of ``fn``'s result with None at the axis of samples, e.g.
    (n_epochs, None) for predictions; ``dtype``: its dtype.
    """
    axis = shape.index(None)
    tasks, sizes = chunk_tasks(run, fn)
    parts = [da.from_delayed(task, shape=shape[:axis] + (n,) + shape[axis + 1:], dtype=dtype)
             for task, n in zip(tasks, sizes, strict=True)]
    return da.concatenate(parts, axis=axis)


def _probs_shape(run, index, dtype=np.float64):
    lead = () if np.ndim(index) == 0 else (len(index),)
    return lead + (None, run.n_classes), dtype


#: Per Run method: the shape of its result with None at the axis of samples, and its dtype,
#: from the run and the call's arguments.
RESULTS = {
    "predictions": lambda run: ((run.n_epochs, None), np.int32),
    "probs": _probs_shape,
    "mean_probs": lambda run, indices: ((None, run.n_classes), np.float64),
    "weighted_probs": lambda run, indices, weights: ((None, run.n_classes), np.float64),
    "label_probs": lambda run: ((None, run.n_epochs), np.float64),
}


def map_samples(run, method, *args, **kwargs):
    """``run.<method>(*args, **kwargs)`` of a run on a dask array, as a lazy dask array: the
    method of each chunk's Run, concatenated along samples (methods of `RESULTS`)."""
    shape, dtype = RESULTS[method](run, *args, **kwargs)
    return apply_samples(run, operator.methodcaller(method, *args, **kwargs), shape, dtype)
