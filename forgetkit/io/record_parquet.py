"""What the Parquet layouts of record runs (summaries, top-k runs) share: telling their
files apart by the ``"format"`` of their record (`has_format`), opening one
(`open_record_parquet`) and reading its row groups, one per epoch, into records, each epoch
verified as it is read (`read_epoch_groups`)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from ..errors import CorruptFileError
from .integrity import PAGE_CHECKSUM_ERROR, crc_array, mismatch, read_error
from .parquet import PARQUET_KEY
from .record import corrupt, parse_record


def has_format(path, fmt):
    """Whether the Parquet file ``path`` holds a forgetkit run of format ``fmt`` (a
    summary's, a top-k run's)."""
    try:
        md = pq.read_schema(path).metadata or {}
        return json.loads(md.get(PARQUET_KEY, b"{}")).get("format") == fmt
    except Exception:
        return False  # not ours to judge: the Parquet loader reports it


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


def read_epoch_groups(pf, name, record, sums, n, dtype, fill, *, columns=None, verify=True,
                      bad=None):
    """Records (E, n) of ``dtype`` from the row groups of ``pf``, one per epoch.

    ``fill(out, e, part, order)`` stores row group ``e`` (a pyarrow Table of the columns
    ``columns(e)``, every column if ``columns`` is None) in ``out`` (n,), rows taken at
    ``order`` (the sample order of its ``sample`` column); each epoch is checked against its
    stored checksum when verifying. Errors name the file ``name``. ``bad``: a list that
    collects the indices of the epochs that do not match their checksums (`forgetkit.verify`)
    instead of raising for the first."""
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
            error = read_error(name, record["epochs"][e], e, err)
            if bad is None or PAGE_CHECKSUM_ERROR not in str(err):
                raise error from None
            bad.append(e)
            continue
        if verify and crc_array(records[e]) != sums["outputs"][e]:
            if bad is None:
                raise mismatch(name, record["epochs"][e], e)
            bad.append(e)
    return records
