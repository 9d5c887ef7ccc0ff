"""Passes over a run whose outputs are a dask array, one chunk of samples at a time.

The outputs are taken chunked along samples only (every epoch and class of a block of
samples in one chunk; other chunkings are merged along epochs and classes). Each chunk
becomes an in-memory `Run` on its worker (`chunk_run`): labels, epoch numbers and sample
ids included, positions as ids when the run has none. A pass calls the in-memory code on
each chunk's Run and combines the results, so it computes exactly what the in-memory path
computes:

- `DaskExecutor.map_reduce`: ndarray results (counts) summed, DataFrames (per-sample rows)
  concatenated in sample order (`forgetkit.execution.combine`); computed at once on the
  active dask scheduler;
- `DaskExecutor.persist`: per-chunk results kept on the workers (`DaskParts`), for
  algorithms with a global step between passes (label issues, Knowledge Fusion's fit);
- `DaskExecutor.map_samples`: per-sample results (predictions, probabilities, fused
  probabilities) as a lazy dask array concatenated along samples.

`forgetkit.distributed` registers the executor when imported (`forgetkit.execution`).
"""

from __future__ import annotations

from collections.abc import Callable

import dask
import dask.array as da
import numpy as np

from .._progress import Progress
from .._validation import check_type, is_dask_array
from ..errors import ForgetkitError
from ..execution import Executor, combine, register_executor
from ..kinds import RecordOutputs, kind_of
from ..run import Run, check_run
from .parts import DaskParts, compute


def sample_chunks(run):
    """The run's outputs (E, N, C) chunked along samples only (a dask array); of a run
    stored as records (a top-k run), the records (E, N)."""
    x = getattr(run.outputs, "stored", run.outputs)
    if len(x.chunks[0]) > 1 or (x.ndim == 3 and len(x.chunks[2]) > 1):
        x = x.rechunk({0: -1, 2: -1} if x.ndim == 3 else {0: -1})
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
    kind = kind_of(run)
    validate = run.checked_per_read and not kind.softmax
    tasks = [dask.delayed(_on_chunk)(fn, block, run.labels[a:b], ids[a:b], kind=run.kind,
                                     epochs=run.epochs, validate=validate,
                                     build=None if kind.stores_values
                                     else run.outputs.builder(slice(a, b)))
             for block, a, b in zip(blocks, bounds[:-1], bounds[1:], strict=True)]
    return tasks, sizes


def chunk_run(block, labels, sample_ids, *, kind, epochs, validate, build=None):
    """The Run of one chunk: outputs (n_epochs, n, n_classes), labels and sample ids (n,);
    ``build`` makes the outputs of a block of records (a top-k run's)."""
    return Run(block if build is None else build(block), labels, kind=kind, epochs=epochs,
               sample_ids=sample_ids, validate=validate)


def _on_chunk(fn, block, labels, sample_ids, **spec):
    return fn(chunk_run(block, labels, sample_ids, **spec))


class DaskExecutor(Executor):
    """The executor of runs on dask arrays: the chunks of samples on the workers of the
    active dask scheduler (see the module docstring)."""

    lazy = True

    def whole(self, run):
        return False

    def compute(self, *results):
        return dask.compute(*results)

    def map_reduce(self, run, fn, *, progress=False, desc="chunks"):
        tasks, _ = chunk_tasks(run, fn)
        return combine(compute(tasks, Progress(len(tasks), desc, enabled=progress,
                                               unit="chunks")))

    def persist(self, run, fn, *, progress=False, desc="chunks"):
        tasks, _ = chunk_tasks(run, fn)
        parts = DaskParts(tasks)
        if progress:  # wait for the chunks, counting them
            bar = Progress(len(tasks), desc, enabled=True, unit="chunks")
            if parts.client is not None:
                from distributed import as_completed

                for _ in as_completed(list(parts.parts)):
                    bar.update()
            else:
                bar.update(len(tasks))
        return parts

    def certified_bounds(self, run):
        """The `forgetkit.distributed.topk.DaskTopK` of a top-k run on a dask array."""
        from .topk import DaskTopK  # here: .topk imports the fusers, which import this

        return DaskTopK(run)

    def map_samples(self, run, fn, shape, dtype, *, out=None):
        """Lazy dask array of ``fn(chunk Run)`` over the chunks, concatenated along samples.

        ``shape``: the shape of ``fn``'s result with None at the axis of samples, e.g.
        (n_epochs, None) for predictions; ``dtype``: its dtype."""
        if out is not None:
            raise ForgetkitError("out= needs a run held in memory; this run's outputs are a "
                                 "dask array (the result is a dask array)")
        axis = shape.index(None)
        tasks, sizes = chunk_tasks(run, fn)
        parts = [da.from_delayed(task, shape=shape[:axis] + (n,) + shape[axis + 1:],
                                 dtype=dtype)
                 for task, n in zip(tasks, sizes, strict=True)]
        return da.concatenate(parts, axis=axis)


EXECUTOR = DaskExecutor()
register_executor(is_dask_array, EXECUTOR)
register_executor(lambda x: isinstance(x, RecordOutputs) and is_dask_array(x.stored),
                  EXECUTOR)


def map_reduce(run, fn):
    """``executor_for(run).map_reduce(run, fn)`` of a run on a dask array: ``fn`` on each
    chunk's Run, on the workers of the active dask scheduler, results combined by
    `forgetkit.execution.combine`."""
    check_run("run", run)
    check_type("fn", fn, Callable, "a function of a chunk's Run")
    return EXECUTOR.map_reduce(run, fn)
