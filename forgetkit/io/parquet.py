"""Parquet runs: one row per (epoch, sample), columns ``epoch``, ``sample``, ``outputs``; one
row group per epoch; labels and metadata as JSON under the schema metadata key
``forgetkit``. ``outputs`` is FixedSizeList<float> of C values (``layout="list"``, readable
by any Parquet tool) or FixedSizeBinary of the raw little-endian bytes (``layout="binary"``,
about 8x faster to decode). Loading is lazy: an epoch (row group) is read when a pass asks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..backends import LazyOutputs
from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from .atomic import atomic_write, fsync_path, remove, write_json_atomic
from .integrity import (
    KEY,
    RECORD_KEY,
    check_fields,
    checksums,
    crc_array,
    crc_ints,
    crc_record,
    mismatch,
    read_error,
    stored_checksums,
)
from .record import (
    check_record,
    corrupt,
    make_run,
    needs_checksums,
    parse_record,
    read_record,
)

PARQUET_KEY = b"forgetkit"
COLUMNS = ("epoch", "sample", "outputs")
#: An unfinished `RunWriter` stages its epochs in ``<path>.partial/``.
PARTIAL_SUFFIX = ".partial"
LAYOUTS = ("list", "binary")
#: Logits neither compress nor repeat: dictionary pages and min/max statistics only cost
#: time (they halve the float16 list decode speed).
#: Every data page carries a CRC (Parquet's page checksums), verified when read.
PARQUET_WRITE_OPTIONS = dict(compression="none", use_dictionary=False, write_statistics=False,
                             write_page_checksum=True)
#: The file metadata key of the epochs' checksums (known only once every epoch is written).
CRC_METADATA_KEY = b"forgetkit.crc32c"


def staging_path(path):
    """The staging folder of an unfinished Parquet `RunWriter` at ``path``."""
    return Path(str(path) + PARTIAL_SUFFIX)


def staged_epoch_file(staging, epoch, crc):
    """The staged file of epoch number ``epoch`` whose values have checksum ``crc`` (None:
    staged before checksums existed). Named by its checksum too, so that a replaced epoch is
    a new file and ``run.json`` switches from the old to the new in one rename."""
    if crc is None:
        return staging / f"epoch-{epoch:09d}.parquet"
    return staging / f"epoch-{epoch:09d}-{crc:08x}.parquet"


def write_parquet(path, epochs, n_classes, dtype, layout, record):
    """Write (epoch number, outputs (N, C)) pairs as one row group per epoch, and the
    checksums of the epochs (`forgetkit.io.integrity`) under CRC_METADATA_KEY."""
    schema = parquet_schema(n_classes, dtype, layout, record)
    numbers, crcs = [], []
    with pq.ParquetWriter(path, schema, **PARQUET_WRITE_OPTIONS) as writer:
        for epoch, values in epochs:
            values = np.ascontiguousarray(values, dtype=dtype)
            numbers.append(int(epoch))
            crcs.append(crc_array(values))
            writer.write_table(epoch_table(epoch, values, layout), row_group_size=len(values))
        rec = schema_record(record, layout, dtype)
        sums = checksums(record["labels"], numbers, crcs, rec) \
            if record.get("labels") is not None else \
            {"outputs": crcs, "labels": 0, "epochs": crc_ints(numbers), RECORD_KEY: crc_record(rec)}
        writer.add_key_value_metadata({CRC_METADATA_KEY: json.dumps(sums).encode()})
    return crcs


def schema_record(record, layout, dtype):
    """The record stored in a Parquet run's schema metadata (its checksums apart)."""
    rec = {k: v for k, v in record.items() if k != KEY}  # checksums: CRC_METADATA_KEY
    rec.update(layout=layout, dtype=np.dtype(dtype).name)
    return rec


def parquet_schema(n_classes, dtype, layout, record):
    if layout == "list":
        outputs = pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), n_classes)
    else:
        outputs = pa.binary(n_classes * np.dtype(dtype).itemsize)
    rec = schema_record(record, layout, dtype)
    return pa.schema(
        [("epoch", pa.int64()), ("sample", pa.int64()), ("outputs", outputs)],
        metadata={PARQUET_KEY: json.dumps(rec).encode()},
    )


def epoch_table(epoch, values, layout):
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


def column_to_numpy(column, n_classes, dtype, where):
    """(n_rows, C) ndarray from an ``outputs`` column (list, fixed-size list or binary)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    typ = arr.type
    if pa.types.is_fixed_size_binary(typ):
        width = typ.byte_width
        if width != n_classes * np.dtype(dtype).itemsize:
            raise ForgetkitError(f"{where} has {width // np.dtype(dtype).itemsize} classes; "
                                 f"expected {n_classes}")
        buf = arr.buffers()[1]
        flat = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"),
                             count=len(arr) * n_classes, offset=arr.offset * width)
        return flat.reshape(len(arr), n_classes)
    if pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ):
        if pa.types.is_fixed_size_list(typ):
            size = typ.list_size
            if size != n_classes:
                raise ForgetkitError(f"{where} has {size} classes; expected {n_classes}")
        else:
            lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != n_classes).any():
                bad = int(lengths[lengths != n_classes][0])
                raise ForgetkitError(f"{where} has rows of {bad} classes; expected {n_classes}")
        if arr.null_count:
            raise ForgetkitError(f"{where} has missing (null) outputs")
        child = arr.flatten()
        if child.null_count:
            raise ForgetkitError(f"{where} has missing (null) values")
        if not pa.types.is_floating(child.type):
            raise CorruptFileError(f"{where}: outputs must be floats; got {child.type}")
        child_dtype = np.dtype(child.type.to_pandas_dtype())
        flat = np.frombuffer(child.buffers()[1], dtype=child_dtype, count=len(child),
                             offset=child.offset * child_dtype.itemsize)  # zero-copy
        return flat.reshape(len(arr), n_classes)
    raise CorruptFileError(
        f"{where}: column 'outputs' must be a list or fixed-size binary; got {typ}")


class _ParquetSource:
    """The epochs of a Parquet run: row groups of a closed file plus staged epoch files.
    ``crcs`` are the epochs' checksums (None entries: not known), verified as each epoch is
    read unless ``verify`` is False."""

    def __init__(self, record, parts, base_epochs, crcs, verify=True):
        self.record = record
        self.parts = parts  # per epoch: (ParquetFile, row group index)
        self.crcs, self.verify = crcs, verify
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
            raise read_error(pf.path, self.epochs[i], i, err) from None
        if table.num_rows != self.n_samples:
            raise ForgetkitError(f"{where} has {table.num_rows} rows; expected {self.n_samples}")
        values = column_to_numpy(table.column("outputs"), self.n_classes, self.dtype, where)
        sample = _int_column(table, "sample", where)
        if not np.array_equal(sample, np.arange(self.n_samples)):
            order = np.argsort(sample, kind="stable")
            if not np.array_equal(sample[order], np.arange(self.n_samples)):
                raise ForgetkitError(f"{where}: column 'sample' is not a permutation of 0..N-1")
            values = values[order]
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if self.verify and self.crcs[i] is not None and crc_array(values) != self.crcs[i]:
            raise mismatch(pf.path, self.epochs[i], i)
        return values


def _int_column(table, name, where):
    """Column ``name`` of ``table`` as int64, refusing nulls."""
    column = table.column(name)
    if column.null_count:
        raise CorruptFileError(f"{where}: column {name!r} has missing (null) values")
    return column.to_numpy().astype(np.int64, copy=False)


def parquet_checksums(md, where, *, verify=True):
    """The epochs' checksums stored in the key-value metadata ``md``, or None; required
    when verifying."""
    sums = stored_checksums({KEY: parse_record(md[CRC_METADATA_KEY], where)}, where) \
        if CRC_METADATA_KEY in md else None
    if sums is None and verify:
        raise CorruptFileError(f"{where} lacks its checksums ({CRC_METADATA_KEY!r})")
    return sums


class _OpenParquet:
    """An open Parquet file of a run, its columns checked."""

    def __init__(self, path, verify=True):
        self.path = str(path)
        try:
            self.file = pq.ParquetFile(path, page_checksum_verification=bool(verify))
            schema = self.file.schema_arrow
        except Exception as err:
            raise corrupt(path, err) from None
        missing = [c for c in COLUMNS if c not in schema.names]
        if missing:
            raise CorruptFileError(f"{self.path!r} has no column {missing[0]!r}: a Parquet run "
                                   f"needs the columns {', '.join(COLUMNS)}")
        for name in ("epoch", "sample"):
            if not pa.types.is_integer(schema.field(name).type):
                raise CorruptFileError(f"{self.path!r}: column {name!r} must hold integers; "
                                       f"got {schema.field(name).type}")
        self.outputs_type = schema.field("outputs").type

    def record(self):
        """The forgetkit metadata record stored in the schema ({} if none), type-checked."""
        md = self.file.schema_arrow.metadata or {}
        if PARQUET_KEY not in md:
            return {}
        where = f"the forgetkit metadata of {self.path!r}"
        return check_record(parse_record(md[PARQUET_KEY], where), where)

    def checksums(self, where):
        """The checksums stored under CRC_METADATA_KEY (None if absent: an older file, or
        one another tool wrote)."""
        return parquet_checksums(self.file.metadata.metadata or {}, where, verify=False)

    def row_group_epoch(self, rg):
        """The epoch number of row group ``rg`` (all its rows must hold the same one)."""
        try:
            table = self.file.read_row_group(rg, columns=["epoch"])
        except Exception as err:
            raise corrupt(self.path, err) from None
        col = _int_column(table, "epoch", f"row group {rg} of {self.path!r}")
        if len(col) == 0 or (col != col[0]).any():
            raise CorruptFileError(f"row group {rg} of {self.path!r} mixes epochs; "
                                   "expected one row group per epoch")
        return int(col[0])

    def check_claims(self, record):
        """Refuse a record whose sizes disagree with this file, before anything is allocated
        from them: rows per row group (n_samples), width of ``outputs`` (n_classes, dtype)."""
        n_samples, n_classes = record["n_samples"], record["n_classes"]
        dtype = np.dtype(record["dtype"])
        typ, where = self.outputs_type, f"{self.path!r}"
        claim = f"its metadata says n_classes={n_classes} of {dtype}"
        if pa.types.is_fixed_size_binary(typ):
            if typ.byte_width != n_classes * dtype.itemsize:
                raise CorruptFileError(f"{where}: {claim}, but column 'outputs' holds "
                                       f"{typ.byte_width} bytes per row")
        elif pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) \
                or pa.types.is_large_list(typ):
            if not pa.types.is_floating(typ.value_type):
                raise CorruptFileError(f"{where}: column 'outputs' must hold floats; got {typ}")
            size = typ.list_size if pa.types.is_fixed_size_list(typ) else self._first_row_size()
            if size is not None and size != n_classes:
                raise CorruptFileError(f"{where}: {claim}, but column 'outputs' holds "
                                       f"{size} values per row")
        else:
            raise CorruptFileError(f"{where}: column 'outputs' must be a list or fixed-size "
                                   f"binary; got {typ}")
        md = self.file.metadata
        for rg in range(md.num_row_groups):
            rows = md.row_group(rg).num_rows
            if rows != n_samples:
                raise CorruptFileError(f"{where}: its metadata says n_samples={n_samples}, but "
                                       f"row group {rg} holds {rows} rows")

    def _first_row_size(self):
        """Values in the first row of a variable-length ``outputs`` column (None if empty)."""
        if self.file.metadata.num_row_groups == 0:
            return None
        try:
            first = self.file.read_row_group(0, columns=["outputs"]).column("outputs")
        except Exception as err:
            raise corrupt(self.path, err) from None
        return None if len(first) == 0 or not first[0].is_valid else len(first[0])


def open_parquet_run(path, staging, *, verify=True):
    """Collect the epochs of ``path`` (closed file) and ``staging`` (unfinished writer)."""
    record, parts, base_epochs, crcs = None, [], [], []
    path = Path(path)
    if path.exists():
        pf = _OpenParquet(path, verify)
        where = f"the forgetkit metadata of {str(path)!r}"
        base_epochs = [pf.row_group_epoch(rg) for rg in range(pf.file.metadata.num_row_groups)]
        parts = [(pf, rg) for rg in range(len(base_epochs))]
        stored = pf.record()
        record = {**_infer_parquet_record(pf), **stored, "epochs": list(base_epochs)}
        _require_sizes(record, where)
        pf.check_claims(record)
        sums = pf.checksums(where)
        if sums is None and needs_checksums(stored):
            raise CorruptFileError(f"{where} lacks its checksums ({CRC_METADATA_KEY!r})")
        if sums is not None and not stored:
            raise CorruptFileError(f"{str(path)!r} has checksums ({CRC_METADATA_KEY!r}) but "
                                   f"no metadata record ({PARQUET_KEY!r}): the metadata is "
                                   "corrupt")
        if sums is not None:
            if len(sums["outputs"]) != len(base_epochs):
                raise CorruptFileError(f"{where}: {len(sums['outputs'])} checksums for "
                                       f"{len(base_epochs)} epochs")
            if verify:
                check_fields({**stored, "epochs": base_epochs}, sums, path)
        crcs = list(sums["outputs"]) if sums is not None else [None] * len(base_epochs)
    if staging.is_dir() and (staging / "run.json").exists():
        staged = read_record(staging / "run.json", "staging record")
        _require_sizes(staged, f"the staging record {str(staging / 'run.json')!r}")
        sums = stored_checksums(staged, f"the staging record {str(staging / 'run.json')!r}")
        if sums is not None and verify:
            check_fields(staged, sums, staging / "run.json")
        staged_crcs = dict(zip(staged["epochs"], sums["outputs"], strict=False)) \
            if sums is not None else {}
        if record is None:
            record = dict(staged, epochs=[])
        for e in staged["epochs"]:
            if e in base_epochs:
                continue
            f = staged_epoch_file(staging, e, staged_crcs.get(e))
            if not f.exists():
                break
            staged_file = _OpenParquet(f, verify)
            staged_file.check_claims(record)
            parts.append((staged_file, 0))
            record["epochs"].append(e)
            crcs.append(staged_crcs.get(e))
    if record is None:
        raise MissingFileError(f"no such run: {str(path)!r}")
    if np.any(np.diff(record["epochs"]) <= 0):
        raise CorruptFileError(f"epochs of {str(path)!r} are not strictly increasing: "
                               f"{record['epochs']}")
    record.pop(KEY, None)
    return _ParquetSource(record, parts, base_epochs, crcs, verify)


def _require_sizes(record, where):
    for name in ("n_samples", "n_classes", "dtype", "epochs"):
        if record.get(name) is None:
            raise CorruptFileError(f"{where} lacks the field {name!r}")


def _infer_parquet_record(pf):
    """The sizes of a Parquet run written by another tool (labels must then be given),
    overridden by any forgetkit metadata it holds."""
    typ = pf.outputs_type
    if pa.types.is_fixed_size_binary(typ):
        return {"kind": "logits"}  # the forgetkit metadata must tell the dtype and sizes
    if not hasattr(typ, "value_type") or not pa.types.is_floating(typ.value_type):
        raise CorruptFileError(f"{pf.path!r}: column 'outputs' must be a list of floats or "
                               f"fixed-size binary; got {typ}")
    md = pf.file.metadata
    n_classes = typ.list_size if pa.types.is_fixed_size_list(typ) else pf._first_row_size()
    record = {"kind": "logits", "dtype": np.dtype(typ.value_type.to_pandas_dtype()).name}
    if md.num_row_groups:
        record["n_samples"] = md.row_group(0).num_rows
    if n_classes is not None:
        record["n_classes"] = n_classes
    return record


class ParquetOutputs(LazyOutputs):
    """Lazy (n_epochs, n_samples, n_classes) view of a Parquet run: reading an epoch reads
    its row group."""

    def __init__(self, source):
        super().__init__((len(source.epochs), source.n_samples, source.n_classes),
                         source.dtype)
        self._source = source

    def _read(self, e):
        return self._source.read_epoch(e)


def load_parquet(path, *, labels=None, kind=None, verify=True):
    source = open_parquet_run(path, staging_path(path), verify=verify)
    if not source.epochs:
        raise ForgetkitError(f"{str(path)!r} is an empty run: no completed epoch")
    return make_run(ParquetOutputs(source), source.record, labels, kind, source=path)


class ParquetAppender:
    """The Parquet side of `RunWriter`: each epoch is staged as one atomic file in
    ``<path>.partial/`` (with the run's record in ``run.json``) until `close` merges the
    staged epochs and those of an existing file into ``path``."""

    def __init__(self, path, dtype, n_classes, layout, *, durable=True):
        self.path, self.dtype, self.n_classes, self.layout = path, dtype, n_classes, layout
        self.durable = durable
        self.staging = staging_path(path)
        self.base_epochs = []  # epochs of an existing closed file

    def existing(self):
        base = open_parquet_run(self.path, self.staging)
        self.base_epochs = list(base.base_epochs)
        crcs = [c if c is not None else crc_array(base.read_epoch(i))
                for i, c in enumerate(base.crcs)]
        return base.record, list(base.epochs), crcs

    def open(self, record, resume):
        if not self.staging.is_dir():
            self.staging.mkdir()
            if self.durable:
                fsync_path(self.staging.parent)
        write_json_atomic(self.staging / "run.json", record, durable=self.durable)
        self._files = self._staged_files(record)
        self._drop = []  # files of replaced epochs, removed once run.json no longer names them

    def _staged_files(self, record):
        """{epoch number: staged file} of the epochs ``record`` names."""
        crcs = record[KEY]["outputs"]
        return {e: staged_epoch_file(self.staging, e, c)
                for e, c in zip(record["epochs"], crcs, strict=True)}

    def append(self, values, position, record):
        epoch = record["epochs"][position]
        staged = staged_epoch_file(self.staging, epoch, record[KEY]["outputs"][position])
        with atomic_write(staged, durable=self.durable) as tmp:
            pq.write_table(epoch_table(epoch, values, self.layout), tmp, **PARQUET_WRITE_OPTIONS)
        # run.json's stale temporaries were removed at open; the lock keeps others away.
        # Its rename is the commit: a replaced epoch's old file is removed only after it
        write_json_atomic(self.staging / "run.json", record, durable=self.durable, clean=False)
        self._files = self._staged_files(record)
        for old in self._drop:
            if old not in self._files.values():
                old.unlink(missing_ok=True)
        self._drop = []

    def truncate(self, keep, record, dropped):
        """Drop the epochs ``dropped`` (from position ``keep`` on): their files are removed
        after the next `append` commits the run without them (`close` removes them too)."""
        if any(e in self.base_epochs for e in dropped):
            raise ForgetkitError("replace=True cannot drop epochs of a closed Parquet run; "
                                 "convert it to .npy or rewrite it with mode='w'")
        self._drop += [self._files[e] for e in dropped if e in self._files]

    def close(self, record):
        source = open_parquet_run(self.path, self.staging)
        with atomic_write(self.path, durable=self.durable) as tmp:
            epochs = ((e, source.read_epoch(i)) for i, e in enumerate(source.epochs))
            write_parquet(tmp, epochs, self.n_classes, self.dtype, self.layout, record)
        remove(self.staging)

    def abort(self):
        pass  # staged epochs stay: the run loads, and a later writer resumes them
