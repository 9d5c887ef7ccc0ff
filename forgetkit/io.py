"""Loading and saving runs: NPZ, memory-mapped NPY, Parquet, Dataset Cartography folders.

Formats
-------
``.npz``
    ``logits`` or ``probs`` (E, N, C) + ``labels`` (N,), optional ``epochs``, ``sample_ids``,
    ``class_names`` and ``meta`` (a JSON string): the format of the shared sample runs.
``.npy``
    The outputs tensor, memory-mapped on load. Labels come from ``labels=`` or from the sidecar
    ``<name>.forgetkit.json`` that `save` and `RunWriter` write beside it (kind, epoch numbers,
    labels, ids, class names, metadata).
``.parquet``
    One row per (epoch, sample): columns ``epoch``, ``sample``, ``outputs``; one row group per
    epoch; labels and metadata as JSON under the schema metadata key ``forgetkit``. ``outputs``
    is FixedSizeList<float> of C values (``layout="list"``, the default, readable by any Parquet
    tool) or FixedSizeBinary of the raw little-endian bytes (``layout="binary"``, ~8x faster to
    decode). Loading is lazy: epochs (row groups) are read when a pass asks for them.

Writing is atomic (temporary file, then rename): an output file is complete or absent.
`RunWriter` appends epoch by epoch while a model trains; after a kill, the epochs completed
before it load normally.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ._validation import FLOAT_DTYPES, check_option
from .run import LazyOutputs, Run

SIDECAR_SUFFIX = ".forgetkit.json"
PARQUET_KEY = b"forgetkit"
PARTIAL_SUFFIX = ".partial"
NPY_HEADER_BYTES = 256
LAYOUTS = ("list", "binary")
#: Logits neither compress nor repeat: dictionary pages and min/max statistics only cost
#: time (they halve the float16 list decode speed).
PARQUET_WRITE_OPTIONS = dict(compression="none", use_dictionary=False, write_statistics=False)
_UMASK = os.umask(0)
os.umask(_UMASK)


# ------------------------------------------------------------------------- helpers
def _format_of(path):
    path = Path(path)
    if path.is_dir() and glob.glob(str(path / "dynamics_epoch_*.jsonl")):
        return "cartography"
    suffix = path.suffix.lower()
    if suffix in (".npz", ".npy", ".parquet"):
        return suffix[1:]
    raise ValueError(
        f"cannot tell the format of {str(path)!r}: expected a .npz, .npy or .parquet file "
        "or a Dataset Cartography folder (dynamics_epoch_*.jsonl)"
    )


def _jsonable(values):
    if values is None:
        return None
    return [v.item() if isinstance(v, np.generic) else v for v in np.asarray(values).tolist()]


def _run_record(run_or_fields):
    """The JSON metadata record of a run (everything but the outputs)."""
    r = run_or_fields
    return {
        "format": "forgetkit-run",
        "version": 1,
        "kind": r.kind,
        "dtype": np.dtype(r.outputs.dtype).name,
        "n_samples": int(r.n_samples),
        "n_classes": int(r.n_classes),
        "epochs": [int(e) for e in r.epochs],
        "labels": [int(v) for v in r.labels],
        "sample_ids": _jsonable(r.sample_ids),
        "class_names": r.class_names,
        "meta": r.meta,
    }


def _atomic_path(path):
    """A temporary path in the same folder as ``path`` (so that os.replace is atomic)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; keep the usual permissions
    return Path(tmp)


@contextmanager
def atomic_write(path):
    """Yield a temporary path beside ``path`` to write to; when the block ends without error
    it atomically replaces ``path``, otherwise it is removed and ``path`` is left as it was."""
    tmp = _atomic_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_json_atomic(path, record):
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(record))


def _corrupt(path, err):
    return ValueError(f"cannot read {str(path)!r}: the file is truncated or corrupt ({err})")


# --------------------------------------------------------------------------- load
def load(path, labels=None, *, kind=None):
    """Load a run from ``path`` (.npz, .npy, .parquet or a Dataset Cartography folder).

    Parameters
    ----------
    path : str or Path
    labels : array-like of shape (n_samples,) or path to a .npy file, optional
        Required for a bare .npy outputs file without its sidecar; overrides stored labels.
    kind : {"logits", "probs"}, optional
        Overrides the stored kind (a bare .npy is taken as logits by default).

    Returns
    -------
    Run
    """
    path = Path(path)
    fmt = _format_of(path)
    if fmt == "parquet" and not path.exists() and Path(str(path) + PARTIAL_SUFFIX).is_dir():
        fmt = "parquet"  # an unfinished RunWriter: load its completed epochs
    elif not path.exists():
        raise FileNotFoundError(f"no such run: {str(path)!r}")
    if isinstance(labels, (str, os.PathLike)):
        labels = _load_labels_file(labels)
    loader = {"npz": _load_npz, "npy": _load_npy, "parquet": _load_parquet,
              "cartography": load_cartography}[fmt]
    return loader(path, labels=labels, kind=kind)


def _load_labels_file(path):
    path = Path(path)
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such labels file: {str(path)!r}") from None
    except Exception as err:
        raise ValueError(f"cannot read labels from {str(path)!r}: {err}") from None


def _make_run(outputs, record, labels, kind):
    if labels is None:
        labels = record.get("labels")
    if labels is None:
        raise ValueError("this run stores no labels: pass labels= (an array or a .npy file)")
    n_epochs = outputs.shape[0] if outputs.ndim == 3 else None
    epochs = record.get("epochs")
    if epochs is not None and n_epochs is not None:
        epochs = np.asarray(epochs[:n_epochs], dtype=np.int64)
        if len(epochs) != n_epochs:
            epochs = None if len(epochs) == 0 else epochs
    return Run(
        outputs,
        labels,
        kind=kind or record.get("kind", "logits"),
        epochs=epochs,
        sample_ids=record.get("sample_ids"),
        class_names=record.get("class_names"),
        meta=record.get("meta"),
    )


def _load_npz(path, *, labels=None, kind=None):
    try:
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files)
            key = "logits" if "logits" in files else "probs" if "probs" in files else None
            if key is None:
                raise ValueError(
                    f"{str(path)!r} holds neither 'logits' nor 'probs'; keys: {sorted(files)}"
                )
            outputs = z[key]
            record = {"kind": key}
            if "labels" in files:
                record["labels"] = z["labels"]
            for name in ("epochs", "sample_ids", "class_names"):
                if name in files:
                    record[name] = z[name]
            if "meta" in files:
                text = str(z["meta"])
                try:
                    record["meta"] = json.loads(text) if text else {}
                except json.JSONDecodeError:
                    record["meta"] = {"text": text}
    except ValueError:
        raise
    except Exception as err:
        raise _corrupt(path, err) from None
    if record.get("class_names") is not None:
        record["class_names"] = [str(c) for c in record["class_names"]]
    if record.get("epochs") is not None:
        record["epochs"] = list(record["epochs"])
    return _make_run(outputs, record, labels, kind)


def _load_npy(path, *, labels=None, kind=None):
    try:
        outputs = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:
        raise _corrupt(path, err) from None
    sidecar = _sidecar(path)
    record = json.loads(sidecar.read_text()) if sidecar.exists() else {}
    return _make_run(outputs, record, labels, kind)


def _sidecar(path):
    path = Path(path)
    return path.with_name(path.name[: -len(path.suffix)] + SIDECAR_SUFFIX)


# --------------------------------------------------------------------------- save
def save(run, path, *, layout="list", compress=True):
    """Write ``run`` to ``path``; the format follows the extension (.npz, .npy, .parquet).

    Streams epoch by epoch, so a memory-mapped or Parquet run converts with bounded memory.
    The write is atomic: on any error no file is left at ``path`` (an existing one is kept).
    ``layout`` ("list" or "binary") applies to Parquet, ``compress`` to NPZ.
    """
    if not isinstance(run, Run):
        raise TypeError(f"run must be a forgetkit.Run; got {type(run).__name__}")
    path = Path(path)
    fmt = _format_of(path)
    if fmt == "cartography":
        raise ValueError("saving to Dataset Cartography folders is not supported")
    check_option("layout", layout, LAYOUTS)
    with atomic_write(path) as tmp:
        if fmt == "npz":
            arrays = {run.kind: np.asarray(run.outputs), "labels": run.labels,
                      "epochs": run.epochs, "meta": np.array(json.dumps(run.meta))}
            if run.sample_ids is not None:
                arrays["sample_ids"] = np.asarray(run.sample_ids).astype(str) \
                    if np.asarray(run.sample_ids).dtype == object else run.sample_ids
            if run.class_names is not None:
                arrays["class_names"] = np.array(run.class_names)
            with open(tmp, "wb") as f:
                (np.savez_compressed if compress else np.savez)(f, **arrays)
        elif fmt == "npy":
            _write_npy(tmp, run)
            _write_json_atomic(_sidecar(path), _run_record(run))
        else:
            _write_parquet(tmp, _checked_epochs(run), run.n_classes, run.outputs.dtype, layout,
                           _run_record(run))
    return path


def _remove(path):
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def convert(src, dst, *, labels=None, layout="list"):
    """Load ``src`` and save it as ``dst`` (format from each extension), epoch by epoch."""
    run = load(src, labels=labels)
    if Path(src).resolve() == Path(dst).resolve():
        raise ValueError(f"convert would overwrite its input {str(src)!r}")
    return save(run, dst, layout=layout)


# ---------------------------------------------------------------------- RunWriter
class RunWriter:
    """Append a run epoch by epoch while the model trains (NPY or Parquet).

    Parameters
    ----------
    path : str or Path
        ``.npy`` (memory-mappable tensor + sidecar JSON) or ``.parquet``.
    n_samples, n_classes : int
    labels : array-like of shape (n_samples,)
    kind : {"logits", "probs"}
    dtype : float16 (default), float32 or float64, the stored precision.
    mode : {"a", "w", "x"}
        "a" (default) appends to an existing run at ``path`` (a resumed training) or starts a
        new one; "w" starts over; "x" refuses an existing run.
    layout : {"list", "binary"}, Parquet only.

    Every `append` leaves a loadable run: the NPY header is updated only after the epoch's
    data is written, and Parquet epochs are staged as one atomic file each in
    ``<path>.partial/`` until `close` merges them into ``path``.
    """

    def __init__(self, path, n_samples, n_classes, *, labels, kind="logits",
                 dtype="float16", sample_ids=None, class_names=None, meta=None,
                 mode="a", format=None, layout="list"):
        self.path = Path(path)
        self.format = format or _format_of(self.path)
        check_option("format", self.format, ("npy", "parquet"))
        check_option("mode", mode, ("a", "w", "x"))
        self.layout = check_option("layout", layout, LAYOUTS)
        self.dtype = np.dtype(dtype)
        if self.dtype.type not in FLOAT_DTYPES:
            raise TypeError(f"dtype must be float16, float32 or float64; got {self.dtype}")
        # A Run validates labels, kind, ids and names with its usual messages.
        shape = (1, n_samples, n_classes)  # a zero-stride view: nothing is allocated
        probe = Run(np.broadcast_to(np.zeros(1, dtype=self.dtype), shape), labels,
                    kind="logits", sample_ids=sample_ids, class_names=class_names, meta=meta,
                    validate=False)
        probe.kind = check_option("kind", kind, ("logits", "probs"))
        self.n_samples, self.n_classes = int(n_samples), int(n_classes)
        self._fields = probe
        self.epochs = []
        self._closed = False
        exists = self.path.exists() or self._staging.exists()
        if exists and mode == "x":
            raise FileExistsError(f"a run already exists at {str(self.path)!r} (mode='x')")
        if exists and mode == "w":
            _remove(self.path)
            _remove(self._staging)
            _remove(_sidecar(self.path))
            exists = False
        if self.format == "npy":
            self._open_npy(resume=exists)
        else:
            self._open_parquet(resume=exists)

    # ------------------------------------------------------------- public API
    @property
    def n_epochs(self):
        return len(self.epochs)

    def append(self, epoch, outputs, *, replace=False):
        """Store the outputs (n_samples, n_classes) of epoch number ``epoch``.

        Epoch numbers must increase. With ``replace=True`` an epoch number already stored
        (a training resumed from an earlier checkpoint) drops it and every later one first.
        Non-finite outputs are refused with the epoch number; earlier epochs stay intact.
        """
        if self._closed:
            raise ValueError("this RunWriter is closed")
        epoch = int(epoch)
        values = np.asarray(outputs)
        if values.shape != (self.n_samples, self.n_classes):
            raise ValueError(
                f"outputs of epoch {epoch} must have shape ({self.n_samples}, "
                f"{self.n_classes}) (samples, classes); got shape {values.shape}"
            )
        with np.errstate(over="ignore"):  # overflow to inf is reported just below
            values = values.astype(self.dtype, copy=False)
        if not np.all(np.isfinite(values)):
            raise ValueError(
                f"outputs of epoch {epoch} contain NaN or inf (in {self.dtype}); not stored"
            )
        if self.epochs and epoch <= self.epochs[-1]:
            if not replace:
                raise ValueError(
                    f"epoch {epoch} is not after the last stored epoch {self.epochs[-1]}; "
                    "pass replace=True to drop it and the later epochs"
                )
            self._truncate(int(np.searchsorted(self.epochs, epoch)))
        if self.format == "npy":
            self._append_npy(epoch, np.ascontiguousarray(values))
        else:
            self._append_parquet(epoch, np.ascontiguousarray(values))

    def close(self):
        """Finish the run (Parquet: merge the staged epochs into ``path``)."""
        if self._closed:
            return
        if self.format == "npy":
            self._file.close()
        else:
            self._merge_parquet()
        self._closed = True

    def abort(self):
        """Close without merging (used on errors); completed epochs stay on disk."""
        if not self._closed and self.format == "npy":
            self._file.close()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -------------------------------------------------------------- checks
    def _check_same_run(self, record, where):
        for field, mine in (("n_samples", self.n_samples), ("n_classes", self.n_classes),
                            ("kind", self._fields.kind)):
            theirs = record.get(field)
            if theirs != mine:
                raise ValueError(
                    f"the existing run at {where!r} has {field}={theirs}; this writer has "
                    f"{field}={mine} (use mode='w' to start over, or another path)"
                )

    # --------------------------------------------------------------- NPY
    def _record(self):
        r = self._fields
        rec = _run_record(r)
        rec.update(dtype=self.dtype.name, epochs=list(self.epochs))
        return rec

    def _npy_header(self, n_epochs):
        return _npy_header(self.dtype, (n_epochs, self.n_samples, self.n_classes))

    def _open_npy(self, resume):
        if resume:
            sidecar = _sidecar(self.path)
            if not sidecar.exists():
                raise ValueError(f"{str(self.path)!r} exists but has no {SIDECAR_SUFFIX} "
                                 "sidecar: it was not written by forgetkit; use mode='w'")
            record = json.loads(sidecar.read_text())
            self._check_same_run(record, str(self.path))
            existing = np.load(self.path, mmap_mode="r")
            if existing.dtype != self.dtype:
                raise ValueError(f"the existing run at {str(self.path)!r} stores "
                                 f"{existing.dtype}; this writer has dtype={self.dtype}")
            self.epochs = list(record["epochs"][: existing.shape[0]])
            del existing
            self._file = open(self.path, "r+b")
        else:
            self._file = open(self.path, "wb")
            self._file.write(self._npy_header(0))
            self._file.flush()
            _write_json_atomic(_sidecar(self.path), self._record())

    def _append_npy(self, epoch, values):
        f = self._file
        f.seek(NPY_HEADER_BYTES + len(self.epochs) * values.nbytes)
        f.write(values.tobytes())
        f.flush()
        self.epochs.append(epoch)
        _write_json_atomic(_sidecar(self.path), self._record())
        f.seek(0)
        f.write(self._npy_header(len(self.epochs)))
        f.flush()

    # ------------------------------------------------------------ Parquet
    @property
    def _staging(self):
        return Path(str(self.path) + PARTIAL_SUFFIX)

    def _open_parquet(self, resume):
        self._base_epochs = []
        if resume:
            base = _open_parquet_run(self.path, self._staging)
            self._check_same_run(base.record, str(self.path))
            self.epochs = list(base.epochs)
            self._base_epochs = list(base.base_epochs)
        self._staging.mkdir(exist_ok=True)
        _write_json_atomic(self._staging / "run.json", self._record())

    def _epoch_file(self, epoch):
        return self._staging / f"epoch-{epoch:09d}.parquet"

    def _append_parquet(self, epoch, values):
        import pyarrow.parquet as pq

        table = _epoch_table(epoch, values, self.layout)
        with atomic_write(self._epoch_file(epoch)) as tmp:
            pq.write_table(table, tmp, **PARQUET_WRITE_OPTIONS)
        self.epochs.append(epoch)
        _write_json_atomic(self._staging / "run.json", self._record())

    def _merge_parquet(self):
        source = _open_parquet_run(self.path, self._staging)
        with atomic_write(self.path) as tmp:
            epochs = ((e, source.read_epoch(i)) for i, e in enumerate(source.epochs))
            _write_parquet(tmp, epochs, self.n_classes, self.dtype, self.layout, self._record())
        _remove(self._staging)

    def _truncate(self, keep):
        """Drop the stored epochs from position ``keep`` on."""
        dropped = self.epochs[keep:]
        if self.format == "parquet":
            if any(e in self._base_epochs for e in dropped):
                raise ValueError("replace=True cannot drop epochs of a closed Parquet run; "
                                 "convert it to .npy or rewrite it with mode='w'")
            for e in dropped:
                self._epoch_file(e).unlink(missing_ok=True)
        self.epochs = self.epochs[:keep]
        if self.format == "npy":
            _write_json_atomic(_sidecar(self.path), self._record())
            self._file.seek(0)
            self._file.write(self._npy_header(keep))
            self._file.flush()
        else:
            _write_json_atomic(self._staging / "run.json", self._record())


# ------------------------------------------------------------------ writing cores
def _npy_header(dtype, shape):
    """An NPY 1.0 header padded to NPY_HEADER_BYTES, so that it can be rewritten in place
    when epochs are appended."""
    d = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)}
    text = repr(d).encode("latin1")
    pad = NPY_HEADER_BYTES - 10 - len(text) - 1
    return b"\x93NUMPY\x01\x00" + np.uint16(NPY_HEADER_BYTES - 10).tobytes() + text \
        + b" " * pad + b"\n"


def _checked_epochs(run):
    """Yield (epoch number, outputs (N, C)) of every epoch, checking streamed ones."""
    for e in range(run.n_epochs):
        values = np.ascontiguousarray(run.outputs[e])
        if run._checked_per_read:
            run.check_epoch(e, values)
        yield int(run.epochs[e]), values


def _write_npy(path, run):
    with open(path, "wb") as f:
        f.write(_npy_header(run.outputs.dtype, run.shape))
        for _, values in _checked_epochs(run):
            f.write(values.tobytes())


def _write_parquet(path, epochs, n_classes, dtype, layout, record):
    """Write (epoch number, outputs (N, C)) pairs as one row group per epoch."""
    import pyarrow.parquet as pq

    schema = _parquet_schema(n_classes, dtype, layout, record)
    with pq.ParquetWriter(path, schema, **PARQUET_WRITE_OPTIONS) as writer:
        for epoch, values in epochs:
            writer.write_table(_epoch_table(epoch, values.astype(dtype, copy=False), layout),
                               row_group_size=len(values))


# ------------------------------------------------------------------- Parquet core
def _parquet_schema(n_classes, dtype, layout, record):
    import pyarrow as pa

    if layout == "list":
        outputs = pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), n_classes)
    else:
        outputs = pa.binary(n_classes * np.dtype(dtype).itemsize)
    rec = dict(record, layout=layout, dtype=np.dtype(dtype).name)
    return pa.schema(
        [("epoch", pa.int64()), ("sample", pa.int64()), ("outputs", outputs)],
        metadata={PARQUET_KEY: json.dumps(rec).encode()},
    )


def _epoch_table(epoch, values, layout):
    import pyarrow as pa

    n, c = values.shape
    values = np.ascontiguousarray(values)
    if layout == "list":
        flat = pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), n * c,
                                     [None, pa.py_buffer(values)])  # zero-copy, also float16
        outputs = pa.FixedSizeListArray.from_arrays(flat, c)
    else:
        raw = values.astype(values.dtype.newbyteorder("<"), copy=False)
        outputs = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(c * values.itemsize), n, [None, pa.py_buffer(raw)]
        )
    return pa.table({"epoch": pa.array(np.full(n, epoch, dtype=np.int64)),
                     "sample": pa.array(np.arange(n, dtype=np.int64)),
                     "outputs": outputs})


def _column_to_numpy(column, n_classes, dtype, where):
    """(n_rows, C) ndarray from an ``outputs`` column (list, fixed-size list or binary)."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    typ = arr.type
    if pa.types.is_fixed_size_binary(typ):
        width = typ.byte_width
        if width != n_classes * np.dtype(dtype).itemsize:
            raise ValueError(f"{where} has {width // np.dtype(dtype).itemsize} classes; "
                             f"expected {n_classes}")
        buf = arr.buffers()[1]
        flat = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"),
                             count=len(arr) * n_classes, offset=arr.offset * width)
        return flat.reshape(len(arr), n_classes)
    if pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ):
        if pa.types.is_fixed_size_list(typ):
            size = typ.list_size
            if size != n_classes:
                raise ValueError(f"{where} has {size} classes; expected {n_classes}")
        else:
            lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != n_classes).any():
                bad = int(lengths[lengths != n_classes][0])
                raise ValueError(f"{where} has rows of {bad} classes; expected {n_classes}")
        if arr.null_count:
            raise ValueError(f"{where} has missing (null) outputs")
        child = arr.flatten()
        if child.null_count:
            raise ValueError(f"{where} has missing (null) values")
        child_dtype = np.dtype(child.type.to_pandas_dtype())
        flat = np.frombuffer(child.buffers()[1], dtype=child_dtype, count=len(child),
                             offset=child.offset * child_dtype.itemsize)  # zero-copy
        return flat.reshape(len(arr), n_classes)
    raise TypeError(f"{where}: column 'outputs' must be a list or fixed-size binary; got {typ}")


class _ParquetSource:
    """The epochs of a Parquet run: row groups of a closed file plus staged epoch files."""

    def __init__(self, record, parts, base_epochs):
        self.record = record
        self.parts = parts  # per epoch: (ParquetFile, row group index)
        self.epochs = [int(e) for e in record["epochs"]]
        self.base_epochs = base_epochs
        self.dtype = np.dtype(record.get("dtype", "float32"))
        self.n_samples = int(record["n_samples"])
        self.n_classes = int(record["n_classes"])

    def read_epoch(self, i):
        pf, rg = self.parts[i]
        where = f"epoch {self.epochs[i]} of {pf.path!r}"
        try:
            table = pf.file.read_row_group(rg, columns=["epoch", "sample", "outputs"])
        except Exception as err:
            raise _corrupt(pf.path, err) from None
        if table.num_rows != self.n_samples:
            raise ValueError(f"{where} has {table.num_rows} rows; expected {self.n_samples}")
        values = _column_to_numpy(table.column("outputs"), self.n_classes, self.dtype, where)
        sample = table.column("sample").to_numpy()
        if not np.array_equal(sample, np.arange(self.n_samples)):
            order = np.argsort(sample, kind="stable")
            if not np.array_equal(sample[order], np.arange(self.n_samples)):
                raise ValueError(f"{where}: column 'sample' is not a permutation of 0..N-1")
            values = values[order]
        return values.astype(self.dtype, copy=False)


class _OpenParquet:
    def __init__(self, path):
        import pyarrow.parquet as pq

        self.path = str(path)
        try:
            self.file = pq.ParquetFile(path)
        except Exception as err:
            raise _corrupt(path, err) from None

    def record(self):
        md = self.file.schema_arrow.metadata or {}
        if PARQUET_KEY in md:
            return json.loads(md[PARQUET_KEY])
        return {}


def _open_parquet_run(path, staging):
    """Collect the epochs of ``path`` (closed file) and ``staging`` (unfinished writer)."""
    record, parts, base_epochs = None, [], []
    path = Path(path)
    if path.exists():
        pf = _OpenParquet(path)
        record = pf.record()
        md = pf.file.metadata
        epochs = []
        for rg in range(md.num_row_groups):
            col = pf.file.read_row_group(rg, columns=["epoch"]).column("epoch").to_numpy()
            if len(col) == 0 or (col != col[0]).any():
                raise ValueError(f"row group {rg} of {str(path)!r} mixes epochs; "
                                 "expected one row group per epoch")
            epochs.append(int(col[0]))
            parts.append((pf, rg))
        if not record:
            record = _infer_parquet_record(pf, epochs)
        record["epochs"] = epochs
        base_epochs = list(epochs)
    if staging.is_dir() and (staging / "run.json").exists():
        staged = json.loads((staging / "run.json").read_text())
        if record is None:
            record = dict(staged, epochs=[])
        for e in staged["epochs"]:
            if e in base_epochs:
                continue
            f = staging / f"epoch-{int(e):09d}.parquet"
            if not f.exists():
                break
            parts.append((_OpenParquet(f), 0))
            record["epochs"].append(int(e))
    if record is None:
        raise FileNotFoundError(f"no such run: {str(path)!r}")
    if np.any(np.diff(record["epochs"]) <= 0):
        raise ValueError(f"epochs of {str(path)!r} are not strictly increasing: "
                         f"{record['epochs']}")
    return _ParquetSource(record, parts, base_epochs)


def _infer_parquet_record(pf, epochs):
    """Record for a Parquet run written by another tool (labels must then be given)."""
    import pyarrow as pa

    typ = pf.file.schema_arrow.field("outputs").type
    first = pf.file.read_row_group(0, columns=["outputs"]).column("outputs").combine_chunks()
    if pa.types.is_fixed_size_binary(typ):
        raise ValueError(f"{pf.path!r}: binary outputs need the forgetkit metadata (dtype)")
    n_classes = typ.list_size if pa.types.is_fixed_size_list(typ) else len(first[0])
    return {"kind": "logits", "n_samples": len(first), "n_classes": n_classes,
            "dtype": np.dtype(typ.value_type.to_pandas_dtype()).name}


class ParquetOutputs(LazyOutputs):
    """Lazy (n_epochs, n_samples, n_classes) view of a Parquet run: reading an epoch reads
    its row group."""

    def __init__(self, source):
        super().__init__((len(source.epochs), source.n_samples, source.n_classes),
                         source.dtype)
        self._source = source

    def _read(self, e):
        return self._source.read_epoch(e)


def _load_parquet(path, *, labels=None, kind=None):
    source = _open_parquet_run(path, Path(str(path) + PARTIAL_SUFFIX))
    if not source.epochs:
        raise ValueError(f"{str(path)!r} is an empty run: no completed epoch")
    return _make_run(ParquetOutputs(source), source.record, labels, kind)


# ------------------------------------------------------------ Dataset Cartography
_CARTO_FILE = re.compile(r"dynamics_epoch_(\d+)\.jsonl$")


def load_cartography(folder, *, labels=None, kind=None):
    """Import a Dataset Cartography training-dynamics folder (``dynamics_epoch_*.jsonl``).

    Each line holds ``guid``, ``logits_epoch_X`` and ``gold``; rows are aligned by guid on
    the first epoch's order, which becomes ``run.sample_ids``.
    """
    folder = Path(folder)
    files = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                    if (m := _CARTO_FILE.search(p.name))), key=lambda t: t[0])
    if not files:
        raise ValueError(f"{str(folder)!r} holds no dynamics_epoch_*.jsonl files")
    guids, gold, epochs, outputs = None, None, [], []
    for epoch, file in files:
        rows = {}
        with open(file) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    rows[rec["guid"]] = (rec[f"logits_epoch_{epoch}"], rec["gold"])
                except (json.JSONDecodeError, KeyError) as err:
                    raise ValueError(f"{file.name} line {lineno}: not a training-dynamics "
                                     f"record with guid, logits_epoch_{epoch}, gold ({err})"
                                     ) from None
        if guids is None:
            guids = list(rows)
            gold = np.array([rows[g][1] for g in guids], dtype=np.int64)
        elif set(rows) != set(guids):
            raise ValueError(f"{file.name} holds other guids than the first epoch's file")
        outputs.append(np.array([rows[g][0] for g in guids], dtype=np.float32))
        epochs.append(epoch)
    try:
        stacked = np.stack(outputs)
    except ValueError:
        raise ValueError("epochs of the cartography folder have different class counts") from None
    return Run(stacked, gold if labels is None else labels, kind=kind or "logits",
               epochs=epochs, sample_ids=np.array(guids),
               meta={"source": "dataset-cartography", "folder": str(folder)})
