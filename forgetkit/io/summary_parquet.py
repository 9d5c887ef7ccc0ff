"""Summary runs in Parquet: one row per (epoch, sample), columns ``epoch``, ``sample``,
``label``, ``other`` (float32), ``other_class`` (int32), ``lse`` (float32); one row group per
epoch; the summary's record (labels, epoch numbers, classes...) as JSON under the schema
metadata key ``forgetkit`` and the epochs' checksums under ``forgetkit.crc32c``, as for a
full Parquet run. Loaded into memory (16 bytes per sample and epoch), every epoch verified.
Opened and read epoch by epoch as top-k runs are (`forgetkit.io.record_parquet`).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CorruptFileError
from ..kinds.summary import SUMMARY_DTYPE
from .integrity import KEY, check_fields, checksums, crc_array
from .parquet import CRC_METADATA_KEY, PARQUET_KEY, PARQUET_WRITE_OPTIONS, parquet_checksums
from .record_parquet import has_format, open_record_parquet, read_epoch_groups
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
        sums = checksums(rec["labels"], rec["epochs"], crcs, rec)
        writer.add_key_value_metadata({CRC_METADATA_KEY: json.dumps(sums).encode()})


def is_summary_parquet(path):
    """Whether the Parquet file ``path`` holds a forgetkit summary."""
    return has_format(path, FORMAT)


def load_summary_parquet(path, *, labels=None, verify=True):
    """A summary run from the Parquet file ``path`` (see the module docstring)."""
    records, record, where = read_summary_parquet(path, verify=verify)
    return summary_run(path, records, record, labels, where)


def read_summary_parquet(path, *, verify=True, bad=None):
    """(records (E, N), record, ``where``) of the summary Parquet file ``path``, every epoch
    verified as it is read (``bad``: see `read_epoch_groups`)."""
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
                                verify=verify, bad=bad)
    return records, record, where


