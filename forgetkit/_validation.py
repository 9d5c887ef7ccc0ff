"""Input checks shared by the whole package.

Every error names the argument, what was expected and what was seen.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

from .errors import ForgetkitError, InputTypeError

FLOAT_DTYPES = (np.float16, np.float32, np.float64)
KINDS = ("logits", "probs")


def check_option(name, value, choices):
    """Return ``value`` if it is one of ``choices``, else raise a ValueError listing them."""
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ForgetkitError(f"{name} must be one of {valid}; got {value!r}")
    return value


def check_int(name, value, *, minimum=None, maximum=None, allow_none=False):
    """Return ``value`` as an int, checking its type and bounds."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputTypeError(f"{name} must be an integer; got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ForgetkitError(f"{name} must be >= {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise ForgetkitError(f"{name} must be <= {maximum}; got {value}")
    return int(value)


def check_number(name, value, *, minimum=None, maximum=None, finite=True):
    """Return ``value`` as a float, checking its type and bounds (and, unless ``finite`` is
    False, that it is finite: False lets NaN and infinities through unbounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputTypeError(f"{name} must be a number; got {type(value).__name__} {value!r}")
    value = float(value)
    if not finite and minimum is None and maximum is None:
        return value
    if not math.isfinite(value) or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        lo = "-inf" if minimum is None else minimum
        hi = "inf" if maximum is None else maximum
        raise ForgetkitError(f"{name} must be a finite number in [{lo}, {hi}]; got {value}")
    return value


def check_path(name, value):
    """Return ``value`` if it is a path (str or os.PathLike), else raise InputTypeError."""
    if not isinstance(value, (str, os.PathLike)):
        raise InputTypeError(f"{name} must be a path (str or os.PathLike); got "
                             f"{type(value).__name__} {value!r}"[:200])
    return value


def check_bool(name, value):
    """Return ``value`` as a bool, refusing anything but True and False."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be True or False; got {type(value).__name__} "
                             f"{value!r}")
    return bool(value)


def is_dask_array(outputs):
    """True for a dask array (found by dask's collection protocol, without importing dask)."""
    return callable(getattr(outputs, "__dask_graph__", None)) and hasattr(outputs, "chunks")


def is_streamed(outputs):
    """True for outputs read on demand (memmap, lazy Parquet, dask array): checked per chunk
    as they are read, never as a whole."""
    return (isinstance(outputs, np.memmap) or getattr(outputs, "_forgetkit_lazy", False)
            or is_dask_array(outputs))


def check_outputs(outputs):
    """Check a model-output tensor of shape (n_epochs, n_samples, n_classes).

    ndarrays, memmaps and dask arrays keep their dtype (float16, float32 or float64) and are
    not copied (a dask array is not computed).
    """
    if not isinstance(outputs, np.ndarray) and not is_streamed(outputs):
        outputs = np.asarray(outputs)
    if outputs.ndim != 3:
        raise ForgetkitError(
            "outputs must have shape (epochs, samples, classes); "
            f"got shape {tuple(outputs.shape)}"
        )
    if outputs.dtype.type not in FLOAT_DTYPES:
        raise InputTypeError(
            f"outputs must be float16, float32 or float64; got dtype {outputs.dtype}")
    n_epochs, n_samples, n_classes = outputs.shape
    if n_epochs == 0 or n_samples == 0:
        raise ForgetkitError(f"outputs is an empty run: got shape {tuple(outputs.shape)}")
    if n_classes < 2:
        raise ForgetkitError(
            f"outputs must have at least 2 classes; got shape {tuple(outputs.shape)}")
    return outputs


def check_labels(labels, n_samples, n_classes, *, name="labels"):
    """Return labels as an int64 array of shape (n_samples,) with values in [0, n_classes)."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ForgetkitError(f"{name} must be one-dimensional; got shape {arr.shape}")
    if arr.shape[0] != n_samples:
        raise ForgetkitError(f"{name} must have length {n_samples} (samples); got {arr.shape[0]}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise InputTypeError(
                f"{name} must be integers; got non-integer values of dtype {arr.dtype}")
    elif arr.dtype.kind not in "iub":
        raise InputTypeError(f"{name} must be integers; got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= n_classes:
            bad = lo if lo < 0 else hi
            raise ForgetkitError(f"{name} must lie in [0, {n_classes}); got value {bad}")
    return arr


def check_epochs(epochs, n_epochs):
    """Return epoch numbers as a strictly increasing int64 array of shape (n_epochs,)."""
    if epochs is None:
        return np.arange(n_epochs, dtype=np.int64)
    arr = np.asarray(epochs)
    if arr.shape != (n_epochs,):
        raise ForgetkitError(f"epochs must have shape ({n_epochs},); got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InputTypeError(f"epochs must be integers; got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    steps = np.diff(arr)
    if np.any(steps <= 0):
        i = int(np.argmax(steps <= 0))
        raise ForgetkitError(
            "epochs must be strictly increasing (no duplicates); "
            f"got {arr[i]} followed by {arr[i + 1]} at position {i + 1}"
        )
    return arr


def check_indices(name, indices, size, *, what="index"):
    """Return integer (or boolean-mask) indices into an axis of length ``size`` as int64;
    ``what`` names one of them in the error for an empty selection."""
    arr = np.asarray(indices)
    if arr.dtype.kind == "b":
        if arr.shape != (size,):
            raise ForgetkitError(
                f"{name} as a boolean mask must have shape ({size},); got {arr.shape}")
        return np.flatnonzero(arr)
    if arr.ndim != 1:
        raise ForgetkitError(f"{name} must be one-dimensional; got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InputTypeError(f"{name} must be integers or a boolean mask; got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size == 0:
        raise ForgetkitError(f"{name} selects nothing: at least one {what} is needed")
    if arr.min() < -size or arr.max() >= size:
        bad = arr.min() if arr.min() < -size else arr.max()
        raise ForgetkitError(f"{name} must lie in [0, {size}); got {bad}")
    return np.where(arr < 0, arr + size, arr)


def check_sample_ids(sample_ids, n_samples):
    """Return sample ids as an array of shape (n_samples,), or None."""
    if sample_ids is None:
        return None
    sample_ids = np.asarray(sample_ids)
    if sample_ids.shape != (n_samples,):
        raise ForgetkitError(
            f"sample_ids must have shape ({n_samples},); got shape {sample_ids.shape}")
    dup = duplicate_id(sample_ids)
    if dup is not None:
        raise ForgetkitError(f"sample_ids must be unique: sample id {dup[0]!r} appears twice "
                             f"(samples {dup[1]} and {dup[2]})")
    return sample_ids


def check_class_names(class_names, n_classes):
    """Return class names as a list of n_classes str, or None."""
    if class_names is None:
        return None
    if isinstance(class_names, (str, bytes, dict)) or not hasattr(class_names, "__iter__"):
        raise InputTypeError(f"class_names must be a sequence of {n_classes} names; got "
                             f"{_seen(class_names)}")
    class_names = [str(c) for c in class_names]
    if len(class_names) != n_classes:
        raise ForgetkitError(f"class_names must have {n_classes} entries; got {len(class_names)}")
    return class_names


def check_meta(meta):
    """Return a copy of the metadata dict ({} for None)."""
    if meta is not None and not isinstance(meta, dict):
        raise InputTypeError(f"meta must be a dict; got {type(meta).__name__}")
    return dict(meta or {})


def _seen(value):
    """How an unexpected value reads in an error: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def check_array(name, value, *, ndim=None, kinds="biuf", shape=None):
    """Return ``value`` as an ndarray, checking its dimensions, dtype kind and shape.

    Parameters
    ----------
    name : str
        The argument's name, for the error.
    value : array-like
    ndim : int, optional
        Required number of dimensions.
    kinds : str, default "biuf"
        Accepted ``dtype.kind`` letters ("b" bool, "i"/"u" integers, "f" floats), checked
        when the array is not empty.
    shape : tuple, optional
        Required shape; None entries accept any length along that axis.
    """
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise InputTypeError(f"{name} must be an array; got {_seen(value)}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise InputTypeError(f"{name} must be an array; got {_seen(value)} ({err})") from None
    if ndim is not None and arr.ndim != ndim:
        raise ForgetkitError(f"{name} must be {ndim}-dimensional; got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in kinds:  # an empty list reads as float64
        names = {"b": "bool", "i": "int", "u": "uint", "f": "float"}
        wanted = ", ".join(names.get(k, k) for k in kinds)
        raise InputTypeError(f"{name} must have dtype {wanted}; got dtype {arr.dtype}")
    if shape is not None and (arr.ndim != len(shape) or any(
            want is not None and want != got
            for want, got in zip(shape, arr.shape, strict=True))):
        want = "(" + ", ".join("any" if s is None else str(s) for s in shape) + ")"
        raise ForgetkitError(f"{name} must have shape {want}; got shape {arr.shape}")
    return arr


def check_frame(name, value, columns):
    """Return ``value`` if it is a pandas DataFrame holding ``columns``, else raise."""
    import pandas as pd

    if not isinstance(value, pd.DataFrame):
        raise InputTypeError(f"{name} must be a pandas DataFrame; got {_seen(value)}")
    missing = [c for c in columns if c not in value.columns]
    if missing:
        raise ForgetkitError(f"{name} must have columns {list(columns)}; missing {missing} "
                             f"(has {list(value.columns)})")
    return value


def check_type(name, value, types, expected):
    """Return ``value`` if it is an instance of ``types``, else raise InputTypeError saying
    ``expected`` (e.g. "a dict")."""
    if not isinstance(value, types):
        raise InputTypeError(f"{name} must be {expected}; got {_seen(value)}")
    return value


def check_ints(name, values, *, minimum=None):
    """Return ``values`` (a sequence of integers, e.g. seeds) as a list of int, each checked
    by `check_int` under ``name[i]``."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise InputTypeError(f"{name} must be a sequence of integers; got {_seen(values)}")
    return [check_int(f"{name}[{i}]", v, minimum=minimum) for i, v in enumerate(values)]


def duplicate_id(sample_ids):
    """(id, first position, second position) of the first repeated sample id, or None."""
    ids = np.asarray(sample_ids)
    if ids.size < 2:
        return None
    try:
        order = np.argsort(ids, kind="stable")
    except TypeError:  # ids of mixed types: compare them as text
        ids = ids.astype(str)
        order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if not same.size:
        return None
    first, second = sorted((int(order[same[0]]), int(order[same[0] + 1])))
    value = ids[first]
    return (value.item() if isinstance(value, np.generic) else value), first, second
