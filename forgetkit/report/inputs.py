"""The samples behind a run's rows, for the sample explorer: images or texts, and class names.

Row ``i`` of an input belongs to sample id ``i`` of a run (``run.sample_ids``), or to row ``i``
of the run when it has no ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validation import check_type
from ..errors import ForgetkitError, InputTypeError, MissingFileError

#: Column names tried, in order, for the text of a Parquet or CSV input.
TEXT_COLUMNS = ("text", "sentence", "content", "review", "document")
#: Array names tried, in order, in an NPZ input with several arrays.
IMAGE_KEYS = ("images", "inputs", "x")


@dataclass
class SampleInputs:
    """The inputs of a run: ``kind`` "images" with ``data`` an ndarray of shape
    (n, height, width) or (n, height, width, 3), uint8 or float; or ``kind`` "texts" with
    ``data`` a list of n str. ``source`` names where they came from (for messages)."""

    kind: str
    data: object
    source: str = "inputs"

    def __len__(self):
        return len(self.data)


def _check_images(images, source):
    arr = np.asarray(images)
    if not (arr.ndim == 3 or (arr.ndim == 4 and arr.shape[-1] == 3)):
        raise ForgetkitError(f"{source}: images must have shape (n, height, width) or "
                             f"(n, height, width, 3); got shape {arr.shape}")
    if arr.dtype != np.uint8 and not np.issubdtype(arr.dtype, np.floating):
        raise ForgetkitError(f"{source}: images must be uint8 or float; got dtype {arr.dtype}")
    return SampleInputs("images", arr, source)


def _read_npz(path):
    with np.load(path, allow_pickle=False) as z:
        names = list(z.files)
        key = names[0] if len(names) == 1 else next((k for k in IMAGE_KEYS if k in names), None)
        if key is None:
            raise ForgetkitError(f"{str(path)!r} holds several arrays ({', '.join(names)}) and "
                                 f"none named {' or '.join(IMAGE_KEYS)}; which are the images?")
        return z[key]


def _read_table_column(path, column):
    import pandas as pd

    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(
        path, keep_default_na=False)
    if column is None:
        column = next((c for c in TEXT_COLUMNS if c in frame.columns), None)
        if column is None:
            if len(frame.columns) != 1:
                raise ForgetkitError(
                    f"{str(path)!r}: which column holds the texts? none is named "
                    f"{', '.join(TEXT_COLUMNS)}; columns: {', '.join(map(str, frame.columns))} "
                    "(name one: FILE:COLUMN)")
            column = frame.columns[0]
    elif column not in frame.columns:
        raise ForgetkitError(f"{str(path)!r} has no column {column!r}; columns: "
                             f"{', '.join(map(str, frame.columns))}")
    return [str(v) for v in frame[column].tolist()]


def load_inputs(inputs, *, name="inputs"):
    """The samples behind a run's rows.

    Parameters
    ----------
    inputs : SampleInputs, ndarray, list of str, str or Path
        An array of images of shape (n, height, width) or (n, height, width, 3), uint8 or
        float (values in [0, 1], or any range: scaled by its min and max); a list of texts;
        or a file: ``.npy``/``.npz`` images (an NPZ with one array, or an array named
        ``images``), ``.txt`` texts one per line, ``.parquet``/``.csv`` texts in a column
        (``text`` or the only column, or ``FILE:COLUMN``).
    name : str
        The argument's name, for messages.

    Returns
    -------
    SampleInputs
    """
    if inputs is None or isinstance(inputs, SampleInputs):
        return inputs
    if isinstance(inputs, np.ndarray):
        return _check_images(inputs, name)
    if isinstance(inputs, (list, tuple)):
        if not all(isinstance(t, str) for t in inputs):
            raise InputTypeError(f"{name} as a list must hold texts (str)")
        return SampleInputs("texts", list(inputs), name)
    if not isinstance(inputs, (str, Path)):
        raise InputTypeError(f"{name} must be an array of images, a list of texts or a file; "
                             f"got {type(inputs).__name__}")
    text = str(inputs)
    column = None
    path = Path(text)
    if not path.exists() and ":" in text:  # FILE:COLUMN of a table
        head, column = text.rsplit(":", 1)
        path = Path(head)
    if not path.exists():
        raise MissingFileError(f"{name}: {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    source = f"{name} {str(path)!r}"
    try:
        if suffix == ".npy":
            return _check_images(np.load(path, allow_pickle=False), source)
        if suffix == ".npz":
            return _check_images(_read_npz(path), source)
        if suffix in (".txt", ".text"):
            lines = path.read_text(encoding="utf-8").split("\n")
            if lines and lines[-1] == "":
                lines.pop()  # the newline that ends the last line
            return SampleInputs("texts", [ln.rstrip("\r") for ln in lines], source)
        if suffix in (".parquet", ".csv"):
            return SampleInputs("texts", _read_table_column(path, column), source)
    except (ForgetkitError, OSError):
        raise
    except Exception as err:  # a file numpy, pandas or pyarrow cannot read
        raise ForgetkitError(f"{source} cannot be read: {err}") from None
    raise ForgetkitError(f"{source}: cannot tell the kind of inputs from the suffix "
                         f"{suffix!r}; expected .npy or .npz (images), .txt, .parquet or .csv "
                         "(texts)")


def input_rows(run, inputs, *, name="inputs"):
    """The row of ``inputs`` behind each sample of ``run`` (int64, shape (n_samples,)):
    its sample id, or its position when the run has no ids. Raises, naming ``name``, when
    the ids are not integers or the inputs have fewer rows than the largest id needs."""
    if run.sample_ids is None:
        rows = np.arange(run.n_samples, dtype=np.int64)
        what = f"the run has {run.n_samples} samples and no sample ids (row i is sample i)"
    else:
        ids = np.asarray(run.sample_ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise ForgetkitError(f"{name}: the run's sample ids must be integers (row i of the "
                                 f"inputs is sample id i); got dtype {ids.dtype}")
        if ids.size and ids.min() < 0:
            raise ForgetkitError(f"{name}: the run has a negative sample id ({ids.min()})")
        rows = ids.astype(np.int64)
        what = f"the run's largest sample id is {int(rows.max()) if rows.size else -1}"
    need = int(rows.max()) + 1 if rows.size else 0
    if len(inputs) < need:
        raise ForgetkitError(f"{inputs.source} has {len(inputs)} rows; {what}, so it needs "
                             f"at least {need}")
    return rows


def parse_class_names(spec, n_classes, *, run_names=None, name="class_names"):
    """Class names from ``spec``: a sequence of str, a comma-separated string, a file with one
    name per line, or None for ``run_names`` (the run's own). Returns a list of ``n_classes``
    str or None; raises when the count is wrong."""
    if spec is None:
        return None if run_names is None else list(run_names)
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if path.is_file():
            names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
            while names and not names[-1]:
                names.pop()
            where = f"{name} file {str(path)!r}"
        elif "," in str(spec) or n_classes == 1:
            names = [s.strip() for s in str(spec).split(",")]
            where = name
        else:
            raise ForgetkitError(f"{name}: {str(spec)!r} is neither a file nor a "
                                 "comma-separated list of names")
    else:
        names = [str(s) for s in check_type(name, spec, Iterable, "a sequence of names, a "
                                            "comma-separated string or a file")]
        where = name
    if len(names) != n_classes:
        raise ForgetkitError(f"{where} must give {n_classes} class names (one per class); got "
                             f"{len(names)}")
    return names
