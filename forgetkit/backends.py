"""Outputs backends: where a run's outputs (n_epochs, n_samples, n_classes) are stored, behind
one small interface.

A `Run` holds what identifies the data (labels, epoch numbers, sample ids, class names,
metadata, selections) and one backend (`backend_of` its outputs): in memory or memory-mapped
(`ArrayBackend`), decoded on demand (`LazyBackend`: Parquet, lazy sample subsets), records
(`RecordBackend`: a summary, a top-k run, any kind stored as records), or a chunked
collection such as a dask array (`CollectionBackend`, whose passes the run's executor maps
over its chunks: `forgetkit.execution`). The run's methods
read only through the interface, so a new storage kind is one new backend class, registered
with `register_backend`, and no algorithm changes.

What a backend implements (`Backend`):

- ``outputs``: the stored array-like (what ``Run.outputs`` shows: ``shape``, ``dtype``,
  ``ndim``, indexing by epochs);
- ``read(epochs)``: the values of a block of epochs and every row, as an ndarray: (N, C)
  for an epoch index, (k, N, C) for a slice or indices;
- ``stored_rows()``: (values, rows): a C-contiguous in-memory or memory-mapped (E, M, C)
  array holding sample n at row rows[n], which kernels read in place; None otherwise;
- ``stored_order()``: the order in which to read those rows (ascending storage rows), or
  None;
- ``take(samples, *, lazy)``: the outputs of a sample subset (``lazy``: a view read epoch by
  epoch instead of a copy, where the storage allows);
- ``streamed`` (values read on demand: checked per read) and ``here`` (values read in this
  process; False for chunked collections, whose reads are mapped over their chunks).
"""

from __future__ import annotations

import numpy as np

from . import kernels
from ._validation import is_dask_array
from .errors import InputTypeError
from .kinds.base import RecordOutputs
from .kinds.summary import CHUNK_BYTES, epoch_chunks  # noqa: F401 (epoch_chunks: its old home)


def as_slice(idx):
    """A slice for consecutive indices (a view of a memmap), else the indices."""
    if len(idx) and np.all(np.diff(idx) == 1):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


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


class Backend:
    """Base of outputs backends (see the module docstring for what one implements)."""

    streamed = False
    here = True

    def __init__(self, outputs):
        self.outputs = outputs

    def read(self, epochs):
        return np.ascontiguousarray(self.outputs[epochs])

    def stored_rows(self):
        return None

    def stored_order(self):
        stored = self.stored_rows()
        return None if stored is None else kernels.read_order(stored[1])

    def take(self, samples, *, lazy):
        return self.outputs[:, samples]

    def epoch_parts(self):
        """The outputs (E, N, C) as parts (values (k, M, C), rows (N,), epochs slice) for
        the kernels that read every epoch of a row together: the stored array in place,
        once (`stored_rows`), or each epoch read in turn (one in memory at a time)."""
        stored = self.stored_rows()
        n_epochs, n_samples = self.outputs.shape[:2]
        if stored is not None:
            return [(stored[0], stored[1], slice(0, n_epochs))]
        return ((self.read(e)[None], np.arange(n_samples), slice(e, e + 1))
                for e in range(n_epochs))


class ArrayBackend(Backend):
    """An ndarray in memory or memory-mapped (read in place when C-contiguous)."""

    @property
    def streamed(self):
        return isinstance(self.outputs, np.memmap)

    def stored_rows(self):
        if self.outputs.flags.c_contiguous:
            return self.outputs, np.arange(self.outputs.shape[1])
        return None

    def take(self, samples, *, lazy):
        return SubsetOutputs(self.outputs, samples) if lazy else self.outputs[:, samples]


class LazyBackend(ArrayBackend):
    """`LazyOutputs`: decoded epoch by epoch (Parquet), or a lazy sample subset of stored
    outputs (read in place)."""

    streamed = True

    def stored_rows(self):
        return self.outputs.stored_rows()

    def stored_order(self):
        if isinstance(self.outputs, SubsetOutputs):
            return self.outputs.read_order()  # kept by the subset
        return super().stored_order()


class RecordBackend(Backend):
    """`forgetkit.kinds.base.RecordOutputs`: records per (epoch, sample) instead of every
    class's values; reading an epoch's per-class values raises the ValueError that says what
    the records hold. Records on a dask array are read on its workers (``here`` False)."""

    streamed = True

    @property
    def here(self):
        return not is_dask_array(self.outputs.stored)


class CollectionBackend(Backend):
    """A chunked collection along samples (a dask array): never read here as a whole; the
    run's executor maps its per-chunk reads over the chunks (`forgetkit.execution`)."""

    streamed = True
    here = False


_BACKENDS = [(is_dask_array, CollectionBackend),
             (lambda x: isinstance(x, RecordOutputs), RecordBackend),
             (lambda x: isinstance(x, LazyOutputs), LazyBackend),
             (lambda x: isinstance(x, np.ndarray), ArrayBackend)]


def register_backend(matches, backend):
    """Store outputs satisfying ``matches(outputs)`` in ``backend`` (a `Backend` subclass,
    built with the outputs); the latest registration is tried first."""
    if not callable(matches) or not (isinstance(backend, type) and issubclass(backend, Backend)):
        raise InputTypeError("register_backend(matches, backend) takes a callable and a "
                             f"Backend subclass; got {type(matches).__name__}, {backend!r}")
    _BACKENDS.insert(0, (matches, backend))


def backend_of(outputs):
    """The `Backend` of checked outputs (`forgetkit._validation.check_outputs`)."""
    for matches, backend in _BACKENDS:
        if matches(outputs):
            return backend(outputs)
    raise InputTypeError(f"no outputs backend stores {type(outputs).__name__}")


def stored_rows(outputs):
    """`Backend.stored_rows` of ``outputs``: (values, rows) read in place, or None."""
    return backend_of(outputs).stored_rows()


def stored_order(outputs):
    """`Backend.stored_order` of ``outputs``, or None for outputs not stored as an array."""
    return backend_of(outputs).stored_order()


def epoch_parts(outputs):
    """`Backend.epoch_parts` of ``outputs``."""
    return backend_of(outputs).epoch_parts()
