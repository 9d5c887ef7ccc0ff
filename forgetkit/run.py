"""The `Run` object: stored model outputs of one training run plus labels."""

from __future__ import annotations

import numba
import numpy as np

from . import _kernels
from ._validation import (
    KINDS,
    check_epochs,
    check_indices,
    check_int,
    check_labels,
    check_option,
    check_outputs,
    is_streamed,
)

#: Runs smaller than this many values are fully checked (finite, probabilities sum to 1) when
#: built; larger ones (memmaps, huge arrays) are checked chunk by chunk as they are read.
EAGER_CHECK_VALUES = 1 << 27
PROBS_TOLERANCE = 1e-3


def split_indices(n_samples, frac=0.5, seed=0):
    """Validation and test sample indices of the paper's split-half protocol.

    ``perm = numpy.random.default_rng(seed).permutation(n_samples)``; validation is
    ``perm[:int(n_samples * frac)]`` (``perm[:N//2]`` for frac 0.5), test the rest.

    Returns
    -------
    val, test : ndarray of int64
    """
    if not 0.0 < frac < 1.0:
        raise ValueError(f"frac must lie strictly between 0 and 1; got {frac}")
    perm = np.random.default_rng(seed).permutation(n_samples)
    n_val = int(n_samples * frac)
    if n_val < 1 or n_val >= n_samples:
        raise ValueError(f"frac={frac} leaves an empty half of {n_samples} samples")
    return perm[:n_val], perm[n_val:]


def _kernel_view(values):
    """The array the kernels take: float16 as its raw int16 bits, other floats as they are."""
    return values.view(np.int16) if values.dtype == np.float16 else values


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
        raise ValueError(f"softmax expects (samples, classes); got shape {x.shape}")
    if out is None:
        out = np.empty(x.shape, dtype=np.float64)
    n_bad = _kernels.softmax_rows(_kernel_view(x), _kernels.f16_exp_table(), out)
    if n_bad:
        raise ValueError(f"{n_bad} rows hold NaN or inf")
    return out


def mean_softmax(stack, out=None):
    """Mean over the first axis of the softmax of logits ``stack`` (k, n_samples, n_classes):
    the arithmetic of ``total = softmax(s[0]); total += softmax(s[1]); ...; total /= k`` in
    one fused pass. Raises ValueError if a value is NaN or inf."""
    x = np.ascontiguousarray(stack)
    return mean_softmax_rows(x, np.arange(x.shape[0]), np.arange(x.shape[1]), out)


def mean_softmax_rows(values, epochs, rows, out=None):
    """``mean_softmax`` of values[epochs][:, rows], read in place (no gathered copy).

    values: C-contiguous (E, M, C) logits (ndarray or memmap); epochs, rows: indices.
    Returns float64 (len(rows), C).
    """
    epochs = np.asarray(epochs, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    if out is None:
        out = np.empty((len(rows), values.shape[2]), dtype=np.float64)
    n_bad = _kernels.combine_softmax(_kernel_view(values), epochs, np.empty(0), rows,
                                     _kernels.f16_exp_table(), out,
                                     8 * numba.get_num_threads())
    if n_bad:
        raise ValueError(f"{n_bad} rows hold NaN or inf")
    return out


class LazyOutputs:
    """Base of outputs read on demand, shaped (n_epochs, n_samples, n_classes).

    Indexing the first axis reads those epochs (subclasses implement ``_read(e)`` for one
    epoch index); further indices apply to the result; ``numpy.asarray`` reads everything.
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
    read from the base and indexed on the fly, so a subset never copies the whole run."""

    def __init__(self, base, index):
        super().__init__((base.shape[0], len(index), base.shape[2]), base.dtype)
        self._base, self._index = base, index

    def _read(self, e):
        return np.asarray(self._base[e])[self._index]


def stored_rows(outputs):
    """(values, rows): ``outputs`` as a C-contiguous in-memory or memory-mapped (E, M, C)
    array that holds sample n at row rows[n], without reading or gathering anything; None
    for outputs decoded epoch by epoch (Parquet) or laid out otherwise."""
    if isinstance(outputs, SubsetOutputs):
        base = stored_rows(outputs._base)
        return None if base is None else (base[0], base[1][outputs._index])
    if isinstance(outputs, np.ndarray) and outputs.flags.c_contiguous:
        return outputs, np.arange(outputs.shape[1])
    return None


class Run:
    """Model outputs of one training run, as stored after every (few) epoch(s).

    Parameters
    ----------
    outputs : ndarray or memmap of shape (n_epochs, n_samples, n_classes)
        float16, float32 or float64 logits or probabilities. Not copied.
    labels : array-like of shape (n_samples,)
        True class of each sample, integers in [0, n_classes).
    kind : {"logits", "probs"}
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

    Epochs are addressed by *index* (0..n_epochs-1) everywhere in forgetkit; ``run.epochs``
    maps indices to the stored epoch numbers.
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
    ):
        self.outputs = check_outputs(outputs)
        n_epochs, n_samples, n_classes = self.outputs.shape
        self.kind = check_option("kind", kind, KINDS)
        self.labels = check_labels(labels, n_samples, n_classes)
        self.epochs = check_epochs(epochs, n_epochs)
        if sample_ids is not None:
            sample_ids = np.asarray(sample_ids)
            if sample_ids.shape != (n_samples,):
                raise ValueError(
                    f"sample_ids must have shape ({n_samples},); got shape {sample_ids.shape}"
                )
        self.sample_ids = sample_ids
        if class_names is not None:
            class_names = [str(c) for c in class_names]
            if len(class_names) != n_classes:
                raise ValueError(
                    f"class_names must have {n_classes} entries; got {len(class_names)}"
                )
        self.class_names = class_names
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict; got {type(meta).__name__}")
        self.meta = dict(meta or {})
        self._cache = {}
        self._validate = bool(validate)
        if validate and not self._checked_per_read:
            for e in range(n_epochs):
                self.check_epoch(e, self.outputs[e])

    @property
    def _large(self):
        return is_streamed(self.outputs) or self.outputs.size > EAGER_CHECK_VALUES

    @property
    def _checked_per_read(self):
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
    def check_epoch(self, index, values):
        """Raise ValueError if epoch ``index``'s values (n_samples, n_classes) are not valid."""
        if not np.all(np.isfinite(values)):
            raise ValueError(
                f"outputs contain NaN or inf at epoch index {index} (epoch {self.epochs[index]})"
            )
        if self.kind == "probs":
            sums = values.sum(axis=-1, dtype=np.float64)
            bad = np.abs(sums - 1.0) > PROBS_TOLERANCE
            neg = (values < 0).any(axis=-1)
            if bad.any() or neg.any():
                n = int(np.argmax(bad | neg))
                raise ValueError(
                    f'kind="probs" but sample {n} at epoch index {index} '
                    f"(epoch {self.epochs[index]}) is not a probability vector "
                    f"(sum {sums[n]:.6g}, tolerance {PROBS_TOLERANCE})"
                )

    # ------------------------------------------------------------ conversion
    def probs(self, epochs=None, *, dtype=np.float64):
        """Probabilities of one or several epochs (softmax of logits, float64 by default).

        Parameters
        ----------
        epochs : int, sequence of int or None
            Epoch index (returns shape (n_samples, n_classes)) or indices (returns shape
            (len(epochs), n_samples, n_classes)); None means all epochs.
        """
        if epochs is None:
            epochs = range(self.n_epochs)
        if np.ndim(epochs) == 0:
            out = np.empty((self.n_samples, self.n_classes), dtype=dtype)
            return self._epoch_probs(self._epoch_index(epochs), out)
        idx = [self._epoch_index(e) for e in epochs]
        out = np.empty((len(idx), self.n_samples, self.n_classes), dtype=dtype)
        for i, e in enumerate(idx):
            self._epoch_probs(e, out[i])
        return out

    def epoch_positions(self, epoch_numbers):
        """Indices (int64) of the given stored epoch *numbers*; ValueError naming any that
        this run does not hold."""
        wanted = np.asarray(epoch_numbers, dtype=np.int64).reshape(-1)
        pos = np.minimum(np.searchsorted(self.epochs, wanted), self.n_epochs - 1)
        missing = wanted[self.epochs[pos] != wanted]
        if missing.size:
            raise ValueError(
                f"the run lacks epochs {missing.tolist()} (it holds epochs {self.epochs[0]}.."
                f"{self.epochs[-1]}, {self.n_epochs} stored)"
            )
        return pos

    def _epoch_index(self, e):
        e = check_int("epoch index", e)
        if not -self.n_epochs <= e < self.n_epochs:
            raise ValueError(f"epoch index must lie in [0, {self.n_epochs}); got {e}")
        return e % self.n_epochs

    def _epoch_probs(self, e, out):
        """Write the probabilities of epoch index ``e`` into ``out`` (n_samples, n_classes)."""
        values = np.asarray(self.outputs[e])
        if self.kind == "probs":
            if self._checked_per_read:
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
    def subset(self, indices):
        """A new Run holding only the samples ``indices`` (ints or a boolean mask).

        Sample ids are kept; without ids, the new Run records the original positions as ids.
        Small in-memory outputs are copied; streamed (memmap, Parquet) or large ones stay
        where they are behind a lazy view that reads epoch by epoch. Predictions already
        computed on this run (the forgetting pass) carry over.
        """
        idx = check_indices("indices", indices, self.n_samples)
        ids = self.sample_ids if self.sample_ids is not None else np.arange(self.n_samples)
        outputs = SubsetOutputs(self.outputs, idx) if self._large else self.outputs[:, idx]
        sub = self._derive(outputs, self.labels[idx], sample_ids=ids[idx])
        if "predictions" in self._cache:  # the forgetting pass is not read again
            predictions = self._cache["predictions"][:, idx]
            predictions.setflags(write=False)
            sub._cache["predictions"] = predictions
        return sub

    def epochs_subset(self, indices):
        """A new Run holding only the epochs at ``indices`` (ints or a boolean mask)."""
        idx = check_indices("indices", indices, self.n_epochs)
        if np.any(np.diff(idx) <= 0):
            raise ValueError("epoch indices must be strictly increasing")
        return self._derive(self.outputs[idx], self.labels, epochs=self.epochs[idx])

    def split(self, frac=0.5, seed=0):
        """(validation, test) Runs of the paper's split-half protocol; see `split_indices`."""
        val, test = split_indices(self.n_samples, frac, seed)
        return self.subset(val), self.subset(test)

    def _derive(self, outputs, labels, **changes):
        fields = dict(
            kind=self.kind,
            epochs=self.epochs,
            sample_ids=self.sample_ids,
            class_names=self.class_names,
            meta=self.meta,
            # values of an eagerly checked run are known to be valid; streamed or large ones
            # were not all read yet and stay checked per read
            validate=self._checked_per_read,
        )
        fields.update(changes)
        return Run(outputs, labels, **fields)
