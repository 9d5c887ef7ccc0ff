"""One algorithm, any executor: the protocol that runs an algorithm over a run's chunks.

A run split along samples is a list of *chunks*: the `Run` of a block of samples (every epoch
and class of those samples, their labels and sample ids, positions as ids when the run has
none). Every per-sample statistic is local to a chunk and every per-epoch count is a sum
over chunks, so each algorithm (forgetting, data maps, label issues, Knowledge Fusion's fit)
is written once, as steps ``fn(chunk Run)`` plus a `combine`, and an *executor* runs them:

- `LocalExecutor`: here, the run as one chunk (the default: ``fn(run)``) or as blocks of
  samples (``LocalExecutor(chunks=...)``, with `use_executor`; results are equal bit for bit);
- the dask executor, which `forgetkit.distributed` registers (`register_executor`) for
  outputs that are dask arrays: the chunks' steps run on the workers of the active dask
  scheduler and the tensor is never gathered into this process.

The executor of a run is chosen by the type of its outputs (`executor_for`). The core never
imports an executor's package: `PROVIDERS` names, per top-level module of an array type
(``"dask"``), the module that registers its executor, imported on first use (xarray's chunk
managers and dask's collection/scheduler split are the models).

What an executor implements (`Executor`):

- ``whole(run)``: whether ``run`` is one chunk held in this process;
- ``map_reduce(run, fn, *, progress, desc)``: ``fn`` on every chunk, results `combine`\\ d;
- ``persist(run, fn, *, progress, desc)``: ``fn`` of every chunk kept where it was computed,
  as `Parts`, for algorithms with a global step between passes;
- ``map_samples(run, fn, shape, dtype, *, out=None)``: per-sample results (``fn`` of every
  chunk) concatenated along the axis of samples (None in ``shape``): an ndarray here, a
  lazy dask array on dask (``lazy`` True); ``out``: the array ``fn`` writes into, if
  any (refused where results are lazy);
- ``compute(*results)``: the values of such results (lazy ones computed together);
- ``certified_bounds(run)`` (lazy executors): what certified fusion reads of a bounded run
  (a top-k run) whose records this executor holds, in place of the in-memory
  `forgetkit.kinds.topk.TopKData`: ``fit_state(grid)``, ``certify(recipe)``,
  ``label_probs()`` and ``exact_probs(recipe)``, each one task per chunk of tokens.

`Parts` implements ``map(fn, *args)`` (results here, in chunk order), ``update(fn, *args)``
(each part replaced where it is by ``fn(part, *args)``, which may change it in place) and
``single`` (the one part held here, or None).

Progress: with ``progress=True`` a run read as one chunk passes ``progress=True`` to ``fn``
(the step's own bar, epoch by epoch); otherwise the executor shows chunks done.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import operator
import sys

import numpy as np
import pandas as pd

from ._progress import Progress
from ._validation import check_int
from .errors import ForgetkitError, InputTypeError

#: Top-level module of an outputs array type -> the module that registers its executor,
#: imported the first time a run on such outputs needs one.
PROVIDERS = {"dask": "forgetkit.distributed"}
#: Loaders of runs that live on an executor (``forgetkit.load`` of shards) -> the module
#: that registers them.
LOADER_PROVIDERS = {"shards": "forgetkit.distributed"}

_REGISTRY = []  # (matches(outputs) -> bool, executor), latest first
_LOADERS = {}
_ACTIVE = contextvars.ContextVar("forgetkit_local_executor", default=None)


def combine(parts):
    """Per-chunk results combined: ndarrays (and numbers) summed, DataFrames concatenated
    in chunk (sample) order, tuples element by element."""
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(combine(list(p)) for p in zip(*parts, strict=True))
    if isinstance(first, pd.DataFrame):
        return pd.concat(parts)
    return functools.reduce(operator.add, parts)


class Parts:
    """Per-chunk results kept where they were computed (see the module docstring)."""

    single = None

    def map(self, fn, *args):
        raise NotImplementedError

    def update(self, fn, *args):
        raise NotImplementedError


class Executor:
    """Base of executors: runs an algorithm's per-chunk steps (see the module docstring)."""

    lazy = False  # map_samples gives lazy results (see compute)

    def whole(self, run):
        raise NotImplementedError

    def map_reduce(self, run, fn, *, progress=False, desc="chunks"):
        raise NotImplementedError

    def persist(self, run, fn, *, progress=False, desc="chunks"):
        raise NotImplementedError

    def map_samples(self, run, fn, shape, dtype, *, out=None):
        raise NotImplementedError

    def compute(self, *results):
        return results

    def certified_bounds(self, run):
        raise NotImplementedError


class LocalParts(Parts):
    """`Parts` held in this process: a list in chunk order."""

    def __init__(self, parts):
        self.parts = list(parts)

    @property
    def single(self):
        return self.parts[0] if len(self.parts) == 1 else None

    def map(self, fn, *args):
        return [fn(part, *args) for part in self.parts]

    def update(self, fn, *args):
        self.parts = [fn(part, *args) for part in self.parts]


class LocalExecutor(Executor):
    """Runs the steps here: on the run as one chunk (``chunks=None``, the default), or on
    blocks of samples: ``chunks`` an int (samples per block) or a sequence of block sizes
    that add up to the run's samples. Each block is ``run.isel(samples=...)`` (a lazy view
    of a streamed run)."""

    def __init__(self, chunks=None):
        if chunks is not None and not isinstance(chunks, (int, np.integer)):
            sizes = [check_int("chunks", c, minimum=1) for c in chunks]
            if not sizes:
                raise ForgetkitError("chunks must name at least one block; got none")
            chunks = tuple(sizes)
        elif chunks is not None:
            chunks = check_int("chunks", chunks, minimum=1)
        self.chunks = chunks

    def __repr__(self):
        return f"LocalExecutor(chunks={self.chunks!r})"

    def bounds(self, run):
        """Starts and ends (n_blocks + 1,) of the blocks of samples of ``run``."""
        n_samples = run.n_samples
        if self.chunks is None:
            return np.array([0, n_samples])
        if isinstance(self.chunks, int):
            return np.unique(np.r_[np.arange(0, n_samples, self.chunks), n_samples])
        if sum(self.chunks) != n_samples:
            raise ForgetkitError(f"chunks must add up to the run's {n_samples} samples; got "
                                 f"{sum(self.chunks)}")
        return np.r_[0, np.cumsum(self.chunks)]

    def whole(self, run):
        return len(self.bounds(run)) == 2

    def _map(self, run, fn, progress, desc):
        if self.whole(run):
            return [fn(run, progress=True) if progress else fn(run)]
        bounds = self.bounds(run)
        bar = Progress(len(bounds) - 1, desc, enabled=progress, unit="chunks")
        out = []
        with use_executor(None):  # a block's own passes read it as one chunk
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                out.append(fn(run.isel(samples=np.arange(a, b))))
                bar.update()
        return out

    def map_reduce(self, run, fn, *, progress=False, desc="chunks"):
        parts = self._map(run, fn, progress, desc)
        return parts[0] if len(parts) == 1 else combine(parts)

    def persist(self, run, fn, *, progress=False, desc="chunks"):
        return LocalParts(self._map(run, fn, progress, desc))

    def map_samples(self, run, fn, shape, dtype, *, out=None):
        # per-sample reads (predictions, probabilities) read the run as a whole here; fn
        # writes into out itself
        return fn(run)


#: The executor of runs held in memory or on disk unless `use_executor` says otherwise.
LOCAL = LocalExecutor()


def register_executor(matches, executor):
    """Run the algorithms of runs whose outputs satisfy ``matches(outputs)`` on
    ``executor`` (an `Executor`); the latest registration is tried first."""
    if not callable(matches) or not isinstance(executor, Executor):
        raise InputTypeError("register_executor(matches, executor) takes a callable and an "
                             f"Executor; got {type(matches).__name__}, "
                             f"{type(executor).__name__}")
    _REGISTRY.insert(0, (matches, executor))


def register_loader(name, load):
    """Register ``load`` as the loader ``name`` (see `LOADER_PROVIDERS`)."""
    _LOADERS[name] = load


def loader(name):
    """The loader ``name``, importing the module that registers it on first use
    (ImportError naming the missing optional dependency)."""
    if name not in _LOADERS:
        importlib.import_module(LOADER_PROVIDERS[name])
    return _LOADERS[name]


def _provide(outputs):
    """Import the module that registers the executor of ``outputs``' array type (of their
    ``records``, for records such as a top-k run's), if any."""
    stored = getattr(outputs, "stored", outputs)
    module = PROVIDERS.get(type(stored).__module__.partition(".")[0])
    if module is not None and module not in sys.modules:
        importlib.import_module(module)


def executor_for(run):
    """The `Executor` of ``run``, by the type of its outputs: a registered one (dask
    arrays), else the local executor in use (`use_executor`; by default `LOCAL`)."""
    outputs = run.outputs
    _provide(outputs)
    for matches, executor in _REGISTRY:
        if matches(outputs):
            return executor
    return _ACTIVE.get() or LOCAL


@contextlib.contextmanager
def use_executor(executor):
    """Within this context, runs held in memory or on disk run on ``executor`` (a
    `LocalExecutor`, e.g. ``LocalExecutor(chunks=1000)``; None: the default)."""
    if executor is not None and not isinstance(executor, LocalExecutor):
        raise InputTypeError(f"use_executor takes a LocalExecutor or None; got "
                             f"{type(executor).__name__}")
    token = _ACTIVE.set(executor)
    try:
        yield executor
    finally:
        _ACTIVE.reset(token)
