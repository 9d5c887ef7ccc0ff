"""Parquet files as shards of a run (`forgetkit.distributed.load_shards`): the client reads
a shard's footer (`open_parquet_shard`), the workers read its row groups (one per epoch)
through an fsspec filesystem and keep the block of samples they compute on
(`read_parquet_block`, `read_topk_parquet_block`), verified there."""

from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow.parquet as pq

from ...errors import CorruptFileError
from ...kinds.topk import TOKEN_DTYPE, check_records
from ..integrity import crc_array, mismatch, read_error
from ..parquet import CRC_METADATA_KEY, PARQUET_KEY, column_to_numpy
from ..registry import Shard
from ..topk_parquet import TOKEN_COLUMNS, read_topk_parquet
from ..topk_record import FORMAT as TOPK_FORMAT
from ..topk_record import check_shard_record, check_shard_table
from .blocks import check_block, check_shard_metadata, corrupt_shard, missing_shard


def parquet_file(fs, path, name):
    """The ParquetFile of the shard at ``path`` on ``fs`` (errors name the shard)."""
    try:
        return pq.ParquetFile(fs.open(path, "rb"))
    except FileNotFoundError:
        raise missing_shard(name) from None
    except Exception as err:
        raise corrupt_shard(name, err) from None


def open_parquet_shard(fs, path, name, *, verify=True):
    """The `Shard` of the Parquet file ``path`` (a full run, or a top-k run), from its
    footer (and, for a top-k run, the token columns of its first row group)."""
    pf = parquet_file(fs, path, name)
    md = pf.schema_arrow.metadata or {}
    if PARQUET_KEY not in md:
        raise CorruptFileError(f"shard {name!r} has no forgetkit metadata (dtype, classes, "
                               "labels): write shards with forgetkit")
    try:
        record = json.loads(md[PARQUET_KEY])
    except ValueError as err:
        raise corrupt_shard(name, err) from None
    if not isinstance(record, dict):
        raise corrupt_shard(name, "its forgetkit metadata is not a JSON object")
    sums = (pf.metadata.metadata or {}).get(CRC_METADATA_KEY)
    try:
        sums = json.loads(sums) if sums is not None else None
    except ValueError as err:
        raise corrupt_shard(name, err) from None
    if record.get("format") == TOPK_FORMAT:
        check_shard_metadata(record, sums, name, verify=verify)
        return _topk_shard(pf, fs, path, name, record, verify)
    epochs = []
    for rg in range(pf.metadata.num_row_groups):
        col = pf.read_row_group(rg, columns=["epoch"]).column("epoch").to_numpy()
        if len(col) == 0 or (col != col[0]).any():
            raise CorruptFileError(f"row group {rg} of shard {name!r} mixes epochs; expected "
                                   "one row group per epoch")
        epochs.append(int(col[0]))
    record["epochs"] = epochs
    check_shard_metadata(record, sums, name, verify=verify)
    shape = (len(epochs), int(record["n_samples"]), int(record["n_classes"]))
    dtype = np.dtype(record.get("dtype", "float32"))
    crcs = sums["outputs"] if sums is not None and verify else None
    reader = dict(fs=fs, path=path, name=name, shape=shape, dtype=dtype, crcs=crcs,
                  epochs=epochs)
    return Shard(kind=record.get("kind", "logits"), shape=shape, dtype=dtype, record=record,
                 read_block=functools.partial(read_parquet_block, **reader))


def _topk_shard(pf, fs, path, name, record, verify):
    n, _, dtype = check_shard_record(record, name)
    try:
        part = pf.read_row_group(0, columns=["sample", *TOKEN_COLUMNS])
        order = np.argsort(part.column("sample").to_numpy(), kind="stable")
        table = np.empty(part.num_rows, dtype=TOKEN_DTYPE)
        for col, field in TOKEN_COLUMNS.items():
            table[field] = part.column(col).to_numpy()[order]
    except Exception as err:
        raise corrupt_shard(name, err) from None
    shape = (pf.metadata.num_row_groups, n)
    check_shard_table(record, table, shape, name, verify=verify)
    return Shard(kind="topk", shape=shape, dtype=dtype, record=record, table=table,
                 read_block=functools.partial(read_topk_parquet_block, fs=fs, path=path,
                                              name=name, verify=verify))


def read_parquet_block(start, stop, *, fs, path, name, shape, dtype, crcs=None, epochs=None):
    """Samples start..stop of every epoch of a Parquet shard: (E, stop - start, C). Each
    epoch's row group is read whole, and verified against its checksum on the worker;
    ``epochs``: the epoch numbers, which errors name."""
    n_epochs, n_samples, n_classes = shape
    epochs = list(range(n_epochs)) if epochs is None else epochs
    pf = parquet_file(fs, path, name)
    out = np.empty((n_epochs, stop - start, n_classes), dtype=dtype)
    for e in range(n_epochs):
        where = f"epoch {epochs[e]} (index {e}) of shard {name!r}"
        try:
            table = pf.read_row_group(e, columns=["sample", "outputs"])
        except Exception as err:
            raise read_error(f"shard {name}", epochs[e], e, err) from None
        if table.num_rows != n_samples:
            raise CorruptFileError(f"{where} has {table.num_rows} rows; expected {n_samples}")
        values = column_to_numpy(table.column("outputs"), n_classes, dtype, where)
        sample = table.column("sample").to_numpy()
        order = np.argsort(sample, kind="stable")
        if not np.array_equal(sample[order], np.arange(n_samples)):
            raise CorruptFileError(f"{where}: column 'sample' is not a permutation of 0..N-1")
        values = np.ascontiguousarray(values[order], dtype=dtype)
        if crcs is not None and e < len(crcs) and crc_array(values) != crcs[e]:
            raise mismatch(f"shard {name}", epochs[e], e)
        out[e] = values[start:stop]
    check_block(out, name, start)
    return out


def read_topk_parquet_block(start, stop, *, fs, path, name, verify):
    """Tokens start..stop of every epoch of a top-k Parquet shard, read and verified whole
    on the worker (`forgetkit.io.topk_parquet.read_topk_parquet`; unverified, the block's
    values are checked)."""
    try:
        with fs.open(path, "rb") as f:
            records, record, table = read_topk_parquet(f, name=f"shard {name}", verify=verify)
        out = np.ascontiguousarray(records[:, start:stop])
        if not verify:
            check_records(out, table["target"][start:stop], record["vocab_size"],
                          where=f"shard {name!r}")
    except FileNotFoundError:
        raise missing_shard(name) from None
    return out
