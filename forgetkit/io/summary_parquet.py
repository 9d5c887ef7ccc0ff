"""Summary runs in Parquet: one row per (epoch, sample), columns ``epoch``, ``sample``,
``label``, ``other`` (float32), ``other_class`` (int32), ``lse`` (float32); one row group per
epoch; the summary's record (labels, epoch numbers, classes...) as JSON under the schema
metadata key ``forgetkit`` and the epochs' checksums under ``forgetkit.crc32c``, as for a
full Parquet run. Loaded into memory (16 bytes per sample and epoch), every epoch verified.
The opening and epoch-by-epoch reading are shared with top-k runs (`open_record_parquet`,
`read_epoch_groups`).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CorruptFileError
from ..kinds.summary import SUMMARY_DTYPE
from .integrity import KEY, check_fields, checksums, crc_array, mismatch
from .parquet import CRC_METADATA_KEY, PARQUET_KEY, PARQUET_WRITE_OPTIONS, parquet_checksums
from .record import corrupt, parse_record
from .summary_record import FORMAT, summary_run

FIELDS = ("label", "other", "other_class", "lse")


def write_summary_parquet(path, records, record):
    """Write summary ``records`` (E, N) with their ``record`` (`summary_record`)."""
    n_epochs, n_samples = records.shape
    rec = {k: v for k, v in record.items() if k != KEY}
    schema = pa.schema([("epoch", pa.int64()), ("sample", pa.int64()),
                        ("label", pa.float32()), ("other", pa.float32()),
                        ("other_class", pa.int32()), ("lse", pa.float32())],
                       metadata={PARQUET_KEY: json.dumps(rec).encode()})
    crcs = []
    with pq.ParquetWriter(path, schema, **PARQUET_WRITE_OPTIONS) as writer:
        for e, epoch in enumerate(rec["epochs"]):
            rows = np.ascontiguousarray(records[e])
            crcs.append(crc_array(rows))
            columns = {"epoch": np.full(n_samples, epoch, np.int64),
                       "sample": np.arange(n_samples, dtype=np.int64),
                       **{f: rows[f] for f in FIELDS}}
            writer.write_table(pa.table(columns, schema=schema), row_group_size=n_samples)
        sums = checksums(rec["labels"], rec["epochs"], crcs)
        writer.add_key_value_metadata({CRC_METADATA_KEY: json.dumps(sums).encode()})


def has_format(path, fmt):
    """Whether the Parquet file ``path`` holds a forgetkit run of format ``fmt`` (a
    summary's, a top-k run's)."""
    try:
        md = pq.read_schema(path).metadata or {}
        return json.loads(md.get(PARQUET_KEY, b"{}")).get("format") == fmt
    except Exception:
        return False  # not ours to judge: the Parquet loader reports it


def is_summary_parquet(path):
    """Whether the Parquet file ``path`` holds a forgetkit summary."""
    return has_format(path, FORMAT)


def load_summary_parquet(path, *, labels=None, verify=True):
    """A summary run from the Parquet file ``path`` (see the module docstring)."""
    pf, md, record, where = open_record_parquet(path, FORMAT, "summary", verify=verify)
    n = record.get("n_samples")
    if not isinstance(n, int) or n < 1 or not isinstance(record.get("epochs"), list):
        raise CorruptFileError(f"{where} lacks valid n_samples and epochs")
    sums = parquet_checksums(md, where, verify=verify)
    if verify:
        check_fields(record, sums, path)

    def fill(out, e, part, order):
        for f in FIELDS:
            out[f] = part.column(f).to_numpy()[order]

    records = read_epoch_groups(pf, str(path), record, sums, n, SUMMARY_DTYPE, fill,
                                verify=verify)
    return summary_run(path, records, record, labels, where)


def open_record_parquet(path, fmt, what, *, name=None, verify=True):
    """(ParquetFile, key-value metadata, record, ``where``) of the forgetkit Parquet file
    ``path`` of format ``fmt`` (a summary's, a top-k run's; ``what`` names the kind and
    ``name`` the file in errors; ``where`` names its metadata)."""
    name = str(path) if name is None else name
    where = f"the forgetkit metadata of {name!r}"
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=bool(verify))
        md = pf.metadata.metadata or {}
    except Exception as err:
        raise corrupt(name, err) from None
    record = parse_record(md.get(PARQUET_KEY, b"{}"), where)
    if not isinstance(record, dict) or record.get("format") != fmt:
        raise CorruptFileError(f"{name!r} is not a forgetkit {what}")
    return pf, md, record, where


def read_epoch_groups(pf, name, record, sums, n, dtype, fill, *, columns=None, verify=True):
    """Records (E, n) of ``dtype`` from the row groups of ``pf``, one per epoch.

    ``fill(out, e, part, order)`` stores row group ``e`` (a pyarrow Table of the columns
    ``columns(e)``, every column if ``columns`` is None) in ``out`` (n,), rows taken at
    ``order`` (the sample order of its ``sample`` column); each epoch is checked against its
    stored checksum when verifying. Errors name the file ``name``."""
    n_groups = pf.metadata.num_row_groups
    if n_groups != len(record["epochs"]) or (sums and len(sums["outputs"]) != n_groups):
        raise CorruptFileError(f"{name!r} holds {n_groups} epochs; its metadata names "
                               f"{len(record['epochs'])}")
    records = np.empty((n_groups, n), dtype=dtype)
    for e in range(n_groups):
        if pf.metadata.row_group(e).num_rows != n:
            raise CorruptFileError(f"{name!r}: epoch index {e} holds "
                                   f"{pf.metadata.row_group(e).num_rows} rows; expected {n}")
        try:
            part = pf.read_row_group(e, columns=None if columns is None else columns(e))
            sample = part.column("sample").to_numpy()
            order = np.argsort(sample, kind="stable")
            if not np.array_equal(sample[order], np.arange(n)):
                raise ValueError("column 'sample' is not a permutation of 0..N-1")
            fill(records[e], e, part, order)
        except Exception as err:
            raise CorruptFileError(f"cannot read epoch index {e} of {name!r}: the file "
                                   f"is truncated or corrupt ({err})") from None
        if verify and crc_array(records[e]) != sums["outputs"][e]:
            raise mismatch(name, record["epochs"][e], e)
    return records
