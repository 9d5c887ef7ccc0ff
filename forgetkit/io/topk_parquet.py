"""Top-k runs in Parquet: one row per (checkpoint, token), one row group per checkpoint.

Columns: ``epoch``, ``sample`` (int64: the token's index in the run), the token table
``sequence`` (int64), ``position`` (int32) and ``target_id`` (int32: the target token id,
the run's label), and the record ``target`` (float32: the target's logit), ``lse``
(float32), ``logits`` (FixedSizeList<float32, k>) and ``ids`` (FixedSizeList<uint16 or
uint32, k>: a Parquet column keeps uint32 ids for vocabularies above 65,536 ids, whose NPY
records store them in 24 bits; Parquet's encodings and compression apply). Each row names
its token, so any Parquet tool can filter by sequence. The
run's record (vocabulary, k, epoch numbers, the token table's checksum, metadata) is JSON
under the schema metadata key ``forgetkit``; the epochs' checksums (the CRC32C of each
epoch's records in the NPY layout, the same numbers) under ``forgetkit.crc32c``, as for a
full Parquet run. Loaded into memory, every epoch verified as it is read.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CorruptFileError
from ..kinds.topk import TOKEN_DTYPE, convert_records, ids_of, set_token_ids, token_ids
from .integrity import KEY, checksums, crc_array
from .parquet import CRC_METADATA_KEY, PARQUET_KEY, PARQUET_WRITE_OPTIONS, parquet_checksums
from .record_parquet import has_format, open_record_parquet, read_epoch_groups
from .topk_record import (
    ARGMAX_KEY,
    FORMAT,
    argmax_crc,
    check_topk_record,
    record_dtype,
    table_crc,
    topk_run,
)

TOKEN_COLUMNS = {"sequence": "sequence", "position": "position", "target_id": "target"}


def _schema(k, ids_type, record):
    return pa.schema([("epoch", pa.int64()), ("sample", pa.int64()),
                      ("sequence", pa.int64()), ("position", pa.int32()),
                      ("target_id", pa.int32()), ("target", pa.float32()),
                      ("lse", pa.float32()), ("logits", pa.list_(pa.float32(), k)),
                      ("ids", pa.list_(ids_type, k))],
                     metadata={PARQUET_KEY: json.dumps(record).encode()})


def write_topk_parquet(path, epoch_records, record, table):
    """Write the top-k records of every epoch of ``record`` (`topk_record`),
    ``epoch_records(e)`` (N,) those of epoch index ``e``, and the token ``table`` to
    ``path``; the checksums are those of the records in the record's id encoding (the NPY
    layout)."""
    n = len(table)
    k = record["k"]
    rec = {key: v for key, v in record.items() if key != KEY}
    dtype = record_dtype(rec)
    ids_type = pa.uint16() if ids_of(dtype) == "uint16" else pa.uint32()
    schema = _schema(k, ids_type, rec)
    tokens = {col: table[field] for col, field in TOKEN_COLUMNS.items()}
    crcs, argmax = [], []
    with pq.ParquetWriter(path, schema, **PARQUET_WRITE_OPTIONS) as writer:
        for e, epoch in enumerate(rec["epochs"]):
            rows = convert_records(np.ascontiguousarray(epoch_records(e)), dtype)
            crcs.append(crc_array(rows))
            argmax.append(argmax_crc(rows))
            columns = [pa.array(np.full(n, epoch, np.int64)), pa.array(np.arange(n)),
                       *(pa.array(tokens[c]) for c in TOKEN_COLUMNS),
                       pa.array(rows["target"]), pa.array(rows["lse"]),
                       pa.FixedSizeListArray.from_arrays(
                           pa.array(np.ascontiguousarray(rows["logits"]).reshape(-1)), k),
                       pa.FixedSizeListArray.from_arrays(
                           pa.array(np.ascontiguousarray(token_ids(rows), dtype=np.dtype(
                               ids_type.to_pandas_dtype())).reshape(-1)), k)]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema),
                               row_group_size=n)
        sums = checksums(table["target"], rec["epochs"], crcs, rec)
        sums[ARGMAX_KEY] = argmax
        writer.add_key_value_metadata({CRC_METADATA_KEY: json.dumps(sums).encode()})


def is_topk_parquet(path):
    """Whether the Parquet file ``path`` holds a forgetkit top-k run."""
    return has_format(path, FORMAT)


def _list_column(table, name, k, dtype, where):
    arr = table.column(name).combine_chunks()
    if not pa.types.is_fixed_size_list(arr.type) or arr.type.list_size != k \
            or arr.null_count or arr.flatten().null_count:
        raise ValueError(f"column {name!r} must be FixedSizeList<{k}> without nulls; got "
                         f"{arr.type}")
    return arr.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(-1, k)


def load_topk_parquet(path, *, labels=None, verify=True):
    """A top-k run from the Parquet file ``path`` (see the module docstring)."""
    records, record, table = read_topk_parquet(path, verify=verify)
    # every epoch was verified as it was read; unverified, the Run checks the values
    return topk_run(path, records, record, table, labels,
                    f"the forgetkit metadata of {str(path)!r}", verify=verify, verified=True)


def read_topk_parquet(path, *, name=None, verify=True, bad=None):
    """(records (E, N), record, token table) of the top-k Parquet file ``path`` (a path
    or an open file, which messages call ``name``), every epoch verified as it is read
    (``bad``: see `read_epoch_groups`)."""
    name = str(path) if name is None else name
    pf, md, record, where = open_record_parquet(path, FORMAT, "top-k run", name=name,
                                                verify=verify)
    n, vocab, k = check_topk_record(record, where)
    if not isinstance(n, int) or n < 1:
        raise CorruptFileError(f"{where} lacks a valid n_samples")
    sums = parquet_checksums(md, where, verify=verify)
    table = np.empty(n, dtype=TOKEN_DTYPE)

    def fill(out, e, part, order):
        for f in ("target", "lse"):
            out[f] = part.column(f).to_numpy()[order]
        out["logits"] = _list_column(part, "logits", k, np.float32, where)[order]
        set_token_ids(out, _list_column(part, "ids", k, np.int64, where)[order])
        if e == 0:
            for col, field in TOKEN_COLUMNS.items():
                table[field] = part.column(col).to_numpy()[order]

    columns = ["sample", "target", "lse", "logits", "ids"]
    # record_dtype: uint32 ids in a file written before 24-bit ones
    records = read_epoch_groups(pf, name, record, sums, n, record_dtype(record), fill,
                                columns=lambda e: columns + (list(TOKEN_COLUMNS) if e == 0
                                                             else []),
                                verify=verify, bad=bad)
    if verify and table_crc(table, vocab, k) != record["tokens"].get("crc32c"):
        raise CorruptFileError(f"{name!r}: the token table does not match its checksum")
    return records, dict(record, **({KEY: sums} if sums else {})), table
