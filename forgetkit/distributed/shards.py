"""Runs stored as shards: NPY or Parquet files that each hold a block of samples with the
same epochs, loaded as one Run on a dask array (concatenated along samples).

Each shard is a forgetkit run file: an NPY tensor (E, n_i, C) with its
``<name>.forgetkit.json`` sidecar, or a Parquet run (one row group per epoch), each with
the labels (and optionally sample ids) of its samples. Paths are local or fsspec URLs
(``s3://...``, ``gs://...``, ``file://...``); the client reads only headers, sidecars and
Parquet footers, the workers read the blocks of samples they compute on.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath

import dask
import dask.array as da
import numpy as np
from fsspec.core import url_to_fs

from .._validation import FLOAT_DTYPES, check_int, check_labels
from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from ..io.integrity import KEY as CRC_KEY
from ..io.integrity import combine_lanes, crc_array
from ..io.parquet import CRC_METADATA_KEY, PARQUET_KEY, column_to_numpy
from ..io.record import SIDECAR_SUFFIX, duplicate_id, load_labels_file
from ..io.topk import TOKENS_SUFFIX
from ..io.topk_parquet import TOKEN_COLUMNS, read_topk_parquet
from ..io.topk_record import FORMAT as TOPK_FORMAT
from ..io.topk_record import check_topk_record, record_dtype, table_crc
from ..kinds.topk import TOKEN_DTYPE, TopKOutputs, check_records
from ..run import Run

FORMATS = (".npy", ".parquet")


def shard_paths(source):
    """[(filesystem, path, name)] of the shards at ``source``: a path, glob pattern or fsspec
    URL (glob matches in sorted order), or a list of them (in its order). ``name`` is what
    messages call the shard (the URL, or the local path). MissingFileError when a path or
    pattern names no file."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not sources:
        raise ForgetkitError("source names no shard: got an empty list")
    shards = []
    for src in sources:
        src = os.fspath(src)
        fs, path = url_to_fs(src)
        if any(ch in path for ch in "*?["):
            # a top-k run's token table (<name>.tokens.npy) belongs to its shard
            paths = sorted(p for p in fs.glob(path) if not p.endswith(TOKENS_SUFFIX))
            if not paths:
                raise MissingFileError(f"no shard matches {src!r}")
        elif fs.isfile(path):
            paths = [path]
        else:
            raise MissingFileError(f"no such shard: {src!r}")
        local = "file" in np.atleast_1d(fs.protocol)
        shards += [(fs, p, p if local else fs.unstrip_protocol(p)) for p in paths]
    return shards


def corrupt_shard(name, err):
    return CorruptFileError(f"cannot read shard {name!r}: the file is truncated or corrupt "
                            f"({err})")


def missing_shard(name):
    return MissingFileError(f"shard {name!r} is missing (it was there when the run was "
                            "loaded)")


# --------------------------------------------------------------------------- NPY
def _npy_header(fs, path, name, records=None):
    """(shape, dtype, offset of the data) of an NPY file, checked against its size: a
    float tensor (E, N, C), or (E, N) of the structured dtype ``records`` if given."""
    try:
        with fs.open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except FileNotFoundError:
        raise missing_shard(name) from None
    except Exception as err:
        raise corrupt_shard(name, err) from None
    if records is not None:
        if len(shape) != 2 or fortran or dtype != records:
            raise CorruptFileError(f"shard {name!r} must hold C-ordered records (epochs, "
                                   f"tokens) of {records.descr}; got shape {shape}, dtype "
                                   f"{dtype}")
    elif len(shape) != 3 or fortran or dtype.type not in FLOAT_DTYPES:
        raise CorruptFileError(f"shard {name!r} must hold a C-ordered float16/32/64 tensor "
                               f"(epochs, samples, classes); got shape {shape}, dtype {dtype}"
                               f"{', Fortran order' if fortran else ''}")
    size = fs.size(path)
    if size < offset + int(np.prod(shape)) * dtype.itemsize:
        raise corrupt_shard(name, f"{size} bytes hold less than its header's shape {shape}")
    return shape, dtype.newbyteorder("="), dtype, offset


def _npy_shard(fs, path, name):
    shape, dtype, stored, offset = _npy_header(fs, path, name)
    p = PurePosixPath(path)
    sidecar = str(p.with_name(p.name[: -len(p.suffix)] + SIDECAR_SUFFIX))
    record = {}
    if fs.isfile(sidecar):
        try:
            with fs.open(sidecar, "rb") as f:
                record = json.loads(f.read())
        except Exception as err:
            raise corrupt_shard(f"{name} (its sidecar)", err) from None
        if record.get("epochs") is not None:  # a sidecar may list epochs not yet stored
            record["epochs"] = record["epochs"][: shape[0]]
    sums = (record.get(CRC_KEY) or {}).get("outputs") if isinstance(record.get(CRC_KEY),
                                                                      dict) else None
    crcs = list(sums[: shape[0]]) if isinstance(sums, list) else None
    reader = dict(fs=fs, path=path, name=name, shape=shape, dtype=stored, offset=offset,
                  crcs=crcs)
    return shape, dtype, record, reader


def _check_block(out, name, start, crcs, whole):
    """On the worker: refuse NaN or inf, and (a block holding whole epochs) values that do
    not match the shard's checksums, naming the shard and the epoch."""
    for e in range(len(out)):
        if whole and crcs is not None and e < len(crcs) and crc_array(out[e]) != crcs[e]:
            raise CorruptFileError(f"shard {name!r}: epoch index {e} does not match its "
                                   "checksum: the file is corrupt")
        if not np.isfinite(out[e]).all():
            bad = int(np.flatnonzero(~np.isfinite(out[e]).all(axis=-1))[0])
            raise ForgetkitError(f"shard {name!r}: outputs contain NaN or inf at epoch "
                                 f"index {e} (sample {start + bad} of the shard)")


def read_npy_block(start, stop, *, fs, path, name, shape, dtype, offset, crcs=None,
                   parts=False):
    """Samples start..stop of every epoch of an NPY shard: (E, stop - start, C), one read
    per epoch; checked by `_check_block` (a block of the whole shard is verified against
    its checksums). ``parts``: returns (block, the CRC32C of each epoch's rows of the
    block) instead, for `check_npy_parts` (a shard read in several blocks)."""
    n_epochs, n_samples, n_classes = shape
    row = n_classes * dtype.itemsize
    out = np.empty((n_epochs, stop - start, n_classes), dtype=dtype)
    try:
        with fs.open(path, "rb") as f:
            for e in range(n_epochs):
                f.seek(offset + (e * n_samples + start) * row)
                got = f.readinto(out[e].reshape(-1).view(np.uint8))
                if got != out[e].nbytes:
                    raise corrupt_shard(name, f"epoch index {e} ends after {got} of "
                                              f"{out[e].nbytes} bytes")
    except FileNotFoundError:
        raise missing_shard(name) from None
    _check_block(out, name, start, crcs, start == 0 and stop == n_samples)
    block = out.astype(dtype.newbyteorder("="), copy=False)
    return (block, [crc_array(out[e]) for e in range(n_epochs)]) if parts else block


def check_npy_parts(parts, lengths, crcs, name):
    """On a worker: the CRC32C of each epoch of an NPY shard read in several blocks, from
    the blocks' CRCs ``parts`` (one list per block, in order) and their bytes per epoch
    ``lengths``, against the stored ``crcs``; CorruptFileError naming the shard and the
    first bad epoch. Returns True."""
    got = combine_lanes(np.asarray(parts, dtype=np.uint64).T, lengths)
    for e in range(min(len(got), len(crcs))):
        if got[e] != crcs[e]:
            raise CorruptFileError(f"shard {name!r}: epoch index {e} does not match its "
                                   "checksum: the file is corrupt")
    return True


def _after(block, checked):
    """``block``, once the check it is given has passed."""
    return block


# ----------------------------------------------------------------------- Parquet
def _parquet_file(fs, path, name):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(fs.open(path, "rb"))
    except FileNotFoundError:
        raise missing_shard(name) from None
    except Exception as err:
        raise corrupt_shard(name, err) from None


def _parquet_shard(fs, path, name):
    pf = _parquet_file(fs, path, name)
    md = pf.schema_arrow.metadata or {}
    if PARQUET_KEY not in md:
        raise CorruptFileError(f"shard {name!r} has no forgetkit metadata (dtype, classes, "
                               "labels): write shards with forgetkit")
    record = json.loads(md[PARQUET_KEY])
    epochs = []
    for rg in range(pf.metadata.num_row_groups):
        col = pf.read_row_group(rg, columns=["epoch"]).column("epoch").to_numpy()
        if len(col) == 0 or (col != col[0]).any():
            raise CorruptFileError(f"row group {rg} of shard {name!r} mixes epochs; expected "
                                   "one row group per epoch")
        epochs.append(int(col[0]))
    record["epochs"] = epochs
    shape = (len(epochs), int(record["n_samples"]), int(record["n_classes"]))
    dtype = np.dtype(record.get("dtype", "float32"))
    sums = (pf.metadata.metadata or {}).get(CRC_METADATA_KEY)
    try:
        crcs = json.loads(sums)["outputs"] if sums is not None else None
    except (ValueError, TypeError, KeyError) as err:
        raise corrupt_shard(name, err) from None
    reader = dict(fs=fs, path=path, name=name, shape=shape, dtype=dtype, crcs=crcs)
    return shape, dtype, record, reader


def read_parquet_block(start, stop, *, fs, path, name, shape, dtype, crcs=None):
    """Samples start..stop of every epoch of a Parquet shard: (E, stop - start, C). Each
    epoch's row group is read whole, and verified against its checksum on the worker."""
    n_epochs, n_samples, n_classes = shape
    pf = _parquet_file(fs, path, name)
    out = np.empty((n_epochs, stop - start, n_classes), dtype=dtype)
    for e in range(n_epochs):
        where = f"epoch index {e} of shard {name!r}"
        try:
            table = pf.read_row_group(e, columns=["sample", "outputs"])
        except Exception as err:
            raise corrupt_shard(name, err) from None
        if table.num_rows != n_samples:
            raise CorruptFileError(f"{where} has {table.num_rows} rows; expected {n_samples}")
        values = column_to_numpy(table.column("outputs"), n_classes, dtype, where)
        sample = table.column("sample").to_numpy()
        order = np.argsort(sample, kind="stable")
        if not np.array_equal(sample[order], np.arange(n_samples)):
            raise CorruptFileError(f"{where}: column 'sample' is not a permutation of 0..N-1")
        values = np.ascontiguousarray(values[order], dtype=dtype)
        if crcs is not None and e < len(crcs) and crc_array(values) != crcs[e]:
            raise CorruptFileError(f"shard {name!r}: epoch index {e} does not match its "
                                   "checksum: the file is corrupt")
        out[e] = values[start:stop]
    _check_block(out, name, start, None, False)
    return out


# ------------------------------------------------------------------- top-k runs
def _topk_record(fs, path, name):
    """The top-k record of the shard at ``path`` (NPY sidecar or Parquet metadata), or None
    if the shard is not a top-k run."""
    p = PurePosixPath(path)
    try:
        if p.suffix.lower() == ".npy":
            sidecar = str(p.with_name(p.name[: -len(p.suffix)] + SIDECAR_SUFFIX))
            if not fs.isfile(sidecar):
                return None
            with fs.open(sidecar, "rb") as f:
                record = json.loads(f.read())
        else:
            md = _parquet_file(fs, path, name).schema_arrow.metadata or {}
            record = json.loads(md.get(PARQUET_KEY, b"{}"))
    except (OSError, ValueError):
        return None  # not ours to judge: the shard's own loader reports it
    return record if isinstance(record, dict) and record.get("format") == TOPK_FORMAT \
        else None


def _open_topk_shard(fs, path, name, verify):
    """(records shape (E, n), dtype, record, token table, reader kwargs, read_block) of a
    top-k shard; the client reads its sidecar (or footer) and token table only."""
    record = _topk_record(fs, path, name)
    where = f"shard {name!r}"
    if record is None:
        raise CorruptFileError(f"{where} is not a top-k run, as the first shard is: shards "
                               "must hold runs of one kind")
    try:
        n, vocab, k = check_topk_record(record, f"the record of {where}")
    except ForgetkitError as err:
        raise CorruptFileError(str(err)) from None
    dtype = record_dtype(record)
    p = PurePosixPath(path)
    if p.suffix.lower() == ".npy":
        shape, _, stored, offset = _npy_header(fs, path, name, records=dtype)
        tokens = str(p.with_name(p.name[: -len(p.suffix)] + ".tokens.npy"))
        try:
            with fs.open(tokens, "rb") as f:
                table = np.load(f, allow_pickle=False)
        except FileNotFoundError:
            raise missing_shard(f"{name} (its token table {tokens})") from None
        except Exception as err:
            raise corrupt_shard(f"{name} (its token table)", err) from None
        sums = record.get(CRC_KEY) if isinstance(record.get(CRC_KEY), dict) else {}
        crcs = sums.get("outputs")
        crcs = list(crcs[: shape[0]]) if isinstance(crcs, list) and verify else None
        record["epochs"] = record["epochs"][: shape[0]]
        reader = dict(fs=fs, path=path, name=name, shape=shape, dtype=stored, offset=offset,
                      crcs=crcs, vocab=vocab, targets=table["target"])
        read_block = read_topk_npy_block
    else:
        pf = _parquet_file(fs, path, name)
        try:
            part = pf.read_row_group(0, columns=["sample", *TOKEN_COLUMNS])
            order = np.argsort(part.column("sample").to_numpy(), kind="stable")
            table = np.empty(part.num_rows, dtype=TOKEN_DTYPE)
            for col, field in TOKEN_COLUMNS.items():
                table[field] = part.column(col).to_numpy()[order]
        except Exception as err:
            raise corrupt_shard(name, err) from None
        shape = (pf.metadata.num_row_groups, n)
        reader = dict(fs=fs, path=path, name=name, verify=verify)
        read_block = read_topk_parquet_block
    if table.dtype != TOKEN_DTYPE or table.shape != (n,) or shape[1] != n or shape[0] < 1 \
            or (verify and table_crc(table, vocab, k) != record["tokens"].get("crc32c")):
        raise CorruptFileError(f"{where}: its token table does not match its record (the "
                               "file is corrupt, or another run's)")
    return shape, dtype, record, table, reader, read_block


def read_topk_npy_block(start, stop, *, fs, path, name, shape, dtype, offset, crcs, vocab,
                        targets):
    """Tokens start..stop of every epoch of a top-k NPY shard: records (E, stop - start);
    a block of the whole shard is verified against its checksums on the worker, any other
    block's values are checked (`forgetkit.kinds.topk.check_records`)."""
    n_epochs, n = shape
    table_targets = targets[start:stop]
    out = np.empty((n_epochs, stop - start), dtype=dtype)
    try:
        with fs.open(path, "rb") as f:
            for e in range(n_epochs):
                f.seek(offset + (e * n + start) * dtype.itemsize)
                got = f.readinto(out[e].view(np.uint8))
                if got != out[e].nbytes:
                    raise corrupt_shard(name, f"epoch index {e} ends after {got} of "
                                              f"{out[e].nbytes} bytes")
    except FileNotFoundError:
        raise missing_shard(name) from None
    if crcs is None:  # unverified: the values are checked
        check_records(out, table_targets, vocab, where=f"shard {name!r}")
        return out
    whole = start == 0 and stop == n
    for e in range(n_epochs):
        if whole and crc_array(out[e]) != crcs[e]:
            raise CorruptFileError(f"shard {name!r}: epoch index {e} does not match its "
                                   "checksum: the file is corrupt")
    if not whole:  # a part of a shard cannot be checked against its checksums
        check_records(out, table_targets, vocab, where=f"shard {name!r}")
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


def load_topk_shards(shards, *, chunks, labels, verify):
    """The top-k Run of ``shards`` (`shard_paths`) on a dask array of records (E, N)."""
    blocks, tables, first = [], [], None
    for fs, path, name in shards:
        shape, dtype, record, table, reader, read_block = _open_topk_shard(fs, path, name,
                                                                           verify)
        if first is None:
            first = (name, shape, dtype, record)
        elif (shape[0], dtype, record["epochs"], record["vocab_size"]) != \
                (first[1][0], first[2], first[3]["epochs"], first[3]["vocab_size"]):
            raise CorruptFileError(f"shard {name!r} has {shape[0]} epochs {record['epochs']}, "
                                   f"vocabulary {record['vocab_size']} and k={record['k']}; "
                                   f"the first shard {first[0]!r} has {first[1][0]} epochs "
                                   f"{first[3]['epochs']}, vocabulary {first[3]['vocab_size']} "
                                   f"and k={first[3]['k']}: shards must hold the same epochs, "
                                   "vocabulary and k")
        tables.append(table)
        n = shape[1]
        step = n if chunks is None else chunks
        for a in range(0, n, step):
            b = min(a + step, n)
            task = dask.delayed(read_block, pure=True)(a, b, **reader)
            blocks.append(da.from_delayed(task, shape=(shape[0], b - a), dtype=dtype))
    name, shape, dtype, record = first
    table = np.concatenate(tables)
    outputs = TopKOutputs(da.concatenate(blocks, axis=1), record["vocab_size"],
                          table["sequence"], table["position"])
    return Run(outputs, table["target"] if labels is None else labels, kind="topk",
               epochs=record["epochs"], meta=record.get("meta"))


# ------------------------------------------------------------------------- load
def _open_shard(fs, path, name):
    suffix = PurePosixPath(path).suffix.lower()
    if suffix == ".npy":
        return (*_npy_shard(fs, path, name), read_npy_block)
    if suffix == ".parquet":
        return (*_parquet_shard(fs, path, name), read_parquet_block)
    raise ForgetkitError(f"shard {name!r} must be a .npy or .parquet file; got "
                         f"{suffix or 'no'} suffix")


def load_shards(source, *, chunks=None, labels=None, kind=None, verify=True):
    """A Run on a dask array of the shards at ``source``, concatenated along samples.

    Parameters
    ----------
    source : str, Path or list of them
        A path, glob pattern or fsspec URL of NPY or Parquet shards (files each holding a
        block of samples with the same epochs, classes and dtype), in sorted order, or a
        list of paths in its order.
    chunks : int, optional
        Samples per chunk: each shard is split into blocks of at most this many samples
        (default: one chunk per shard). A Parquet shard's row groups are read whole for each
        of its blocks.
    labels : array-like of shape (n_samples,) or path to a .npy/text file, optional
        Labels of all samples; default: those stored with each shard.
    kind : {"logits", "probs"}, optional
        Overrides the stored kind.
    verify : bool, default True
        Check each shard's stored checksums on the workers: a Parquet shard's every epoch
        as its row group is read; an NPY shard's when one chunk holds it, else from the
        CRC32C of each of its chunks, combined in one small task per shard that the
        shard's last chunk waits for (a pass over part of a shard is not verified); NaN or
        inf and mismatches name the shard.

    Returns
    -------
    Run whose outputs are a dask array (n_epochs, n_samples, n_classes) chunked along
    samples; nothing but headers and metadata is read until a pass computes on it.
    """
    if chunks is not None:
        chunks = check_int("chunks", chunks, minimum=1)
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels_file(labels)
    shards = shard_paths(source)
    if _topk_record(*shards[0]) is not None:  # top-k runs: records and token tables
        return load_topk_shards(shards, chunks=chunks, labels=labels, verify=verify)
    blocks, stored_labels, ids, first, names = [], [], [], None, []
    for fs, path, name in shards:
        shape, dtype, record, reader, read_block = _open_shard(fs, path, name)
        if first is None:
            first = (name, shape, dtype, record)
        _check_same(first, name, shape, dtype, record)
        if record.get("labels") is not None:
            try:
                check_labels(record["labels"], shape[1], shape[2])
            except ForgetkitError as err:
                raise type(err)(f"shard {name!r}: {err}") from None
        if not verify:
            reader["crcs"] = None
        stored_labels.append(record.get("labels"))
        ids.append(record.get("sample_ids"))
        names += [name] * shape[1]
        n = shape[1]
        step = n if chunks is None else chunks
        spans = [(a, min(a + step, n)) for a in range(0, n, step)]
        if read_block is read_npy_block and len(spans) > 1 and reader["crcs"] is not None:
            tasks = _checked_npy_blocks(spans, reader)  # each epoch's checksum from its parts
        else:
            tasks = [dask.delayed(read_block, pure=True)(a, b, **reader) for a, b in spans]
        for (a, b), task in zip(spans, tasks, strict=True):
            blocks.append(da.from_delayed(task, shape=(shape[0], b - a, shape[2]), dtype=dtype))
    name, shape, dtype, record = first
    if labels is None:
        missing = [i for i, lab in enumerate(stored_labels) if lab is None]
        if missing:
            raise ForgetkitError(f"shard {missing[0]} of {source!r} stores no labels: pass "
                                 "labels= (the labels of all samples, in shard order)")
        labels = np.concatenate([np.asarray(lab) for lab in stored_labels])
    sample_ids = None if any(i is None for i in ids) else np.concatenate(ids)
    if sample_ids is not None:
        _refuse_duplicate_ids(sample_ids, names)
    return Run(da.concatenate(blocks, axis=1), labels, kind=kind or record.get("kind", "logits"),
               epochs=record.get("epochs"), sample_ids=sample_ids,
               class_names=record.get("class_names"), meta=record.get("meta"))


def _checked_npy_blocks(spans, reader):
    """Delayed blocks of an NPY shard read in several ``spans`` (start, stop) of samples,
    verified on the workers: each block's task also gives the CRC32C of its rows of each
    epoch, one small task per shard combines them (`check_npy_parts`) and the shard's last
    block waits for it, so that a pass over the whole shard fails on a mismatch. Memory
    stays one block per task: the check holds only the CRCs."""
    row = reader["shape"][2] * reader["dtype"].itemsize
    read = [dask.delayed(read_npy_block, pure=True, nout=2)(a, b, parts=True, **reader)
            for a, b in spans]
    check = dask.delayed(check_npy_parts, pure=True)(
        [parts for _, parts in read], [(b - a) * row for a, b in spans], reader["crcs"],
        reader["name"])
    blocks = [block for block, _ in read]
    blocks[-1] = dask.delayed(_after, pure=True)(blocks[-1], check)
    return blocks


def _refuse_duplicate_ids(sample_ids, names):
    """Refuse a sample id that two samples share, naming the shards that hold them."""
    dup = duplicate_id(sample_ids)
    if dup is not None:
        value, a, b = dup
        where = f"shard {names[a]!r}" if names[a] == names[b] else \
            f"shards {names[a]!r} and {names[b]!r}"
        raise CorruptFileError(f"sample id {value!r} appears twice ({where}); sample ids must "
                               "be unique across shards")


def _check_same(first, name, shape, dtype, record):
    """Refuse a shard whose epochs, classes or dtype differ from the first shard's."""
    first_name, first_shape, first_dtype, first_record = first
    theirs = (first_shape[0], first_shape[2], first_dtype, first_record.get("epochs"),
              first_record.get("kind", "logits"))
    mine = (shape[0], shape[2], dtype, record.get("epochs"), record.get("kind", "logits"))
    for what, a, b in zip(("epochs", "classes", "dtype", "epoch numbers", "kind"), theirs, mine,
                          strict=True):
        if a != b:
            raise CorruptFileError(f"shard {name!r} has {what} {b}; the first shard "
                                   f"{first_name!r} has {a}: shards must hold the same "
                                   "epochs, classes and dtype")
