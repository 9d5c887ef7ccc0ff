"""NPY files as shards of a run (`forgetkit.distributed.load_shards`): the client reads a
shard's NPY header and sidecar (`open_npy_shard`), the workers read blocks of its samples
(`read_npy_block`, `read_topk_npy_block`) through an fsspec filesystem, checked there."""

from __future__ import annotations

import functools
import json
from pathlib import PurePosixPath

import numpy as np

from ..._validation import FLOAT_DTYPES
from ...errors import CorruptFileError
from ...kinds.topk import check_records
from ..integrity import KEY as CRC_KEY
from ..integrity import crc_array
from ..record import SIDECAR_SUFFIX, TOKENS_SUFFIX
from ..registry import Shard
from ..topk_record import FORMAT as TOPK_FORMAT
from ..topk_record import check_shard_record, check_shard_table
from .blocks import check_block, check_shard_metadata, corrupt_shard, missing_shard


def _beside(path, suffix):
    """The file ``<name><suffix>`` beside ``<name>.npy`` (a sidecar, a token table)."""
    p = PurePosixPath(path)
    return str(p.with_name(p.name[: -len(p.suffix)] + suffix))


def npy_header(fs, path, name, records=None):
    """(shape, native dtype, stored dtype, offset of the data) of an NPY file, checked
    against its size: a float tensor (E, N, C), or (E, N) of the structured dtype
    ``records`` if given."""
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


def read_shard_sidecar(fs, path, name):
    """The record in the sidecar of the NPY shard at ``path`` ({} if it has none)."""
    sidecar = _beside(path, SIDECAR_SUFFIX)
    if not fs.isfile(sidecar):
        return {}
    try:
        with fs.open(sidecar, "rb") as f:
            record = json.loads(f.read())
    except Exception as err:
        raise corrupt_shard(f"{name} (its sidecar)", err) from None
    if not isinstance(record, dict):
        raise corrupt_shard(f"{name} (its sidecar)", "not a JSON object")
    return record


def open_npy_shard(fs, path, name, *, verify=True):
    """The `Shard` of the NPY file ``path`` (a full run's tensor, or a top-k run's records
    with their token table), from its header and sidecar."""
    record = read_shard_sidecar(fs, path, name)
    check_shard_metadata(record, record.get(CRC_KEY), name, verify=verify)
    if record.get("format") == TOPK_FORMAT:
        return _topk_shard(fs, path, name, record, verify)
    shape, dtype, stored, offset = npy_header(fs, path, name)
    if record.get("epochs") is not None:  # a sidecar may list epochs not yet stored
        record["epochs"] = record["epochs"][: shape[0]]
    sums = (record.get(CRC_KEY) or {}).get("outputs") if isinstance(record.get(CRC_KEY),
                                                                      dict) else None
    crcs = list(sums[: shape[0]]) if isinstance(sums, list) and verify else None
    reader = dict(fs=fs, path=path, name=name, shape=shape, dtype=stored, offset=offset,
                  crcs=crcs)
    return Shard(kind=record.get("kind", "logits"), shape=shape, dtype=dtype, record=record,
                 read_block=functools.partial(read_npy_block, **reader),
                 read_parts=functools.partial(read_npy_block, parts=True, **reader),
                 crcs=crcs)


def _topk_shard(fs, path, name, record, verify):
    _, vocab, dtype = check_shard_record(record, name)
    shape, _, stored, offset = npy_header(fs, path, name, records=dtype)
    tokens = _beside(path, TOKENS_SUFFIX)
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
    check_shard_table(record, table, shape, name, verify=verify)
    reader = dict(fs=fs, path=path, name=name, shape=shape, dtype=stored, offset=offset,
                  crcs=crcs, vocab=vocab, targets=table["target"])
    return Shard(kind="topk", shape=shape, dtype=dtype, record=record, table=table,
                 read_block=functools.partial(read_topk_npy_block, **reader),
                 read_epoch=functools.partial(read_topk_npy_epoch, **reader))


def read_npy_block(start, stop, *, fs, path, name, shape, dtype, offset, crcs=None,
                   parts=False):
    """Samples start..stop of every epoch of an NPY shard: (E, stop - start, C), one read
    per epoch; checked by `check_block` (a block of the whole shard is verified against
    its checksums). ``parts``: returns (block, the CRC32C of each epoch's rows of the
    block) instead (`Shard.read_parts`: a shard read in several blocks)."""
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
    check_block(out, name, start, crcs, start == 0 and stop == n_samples)
    block = out.astype(dtype.newbyteorder("="), copy=False)
    return (block, [crc_array(out[e]) for e in range(n_epochs)]) if parts else block


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


def read_topk_npy_epoch(epoch, start, stop, *, fs, path, name, shape, dtype, offset, crcs,
                        vocab, targets):
    """Tokens start..stop of epoch index ``epoch`` of a top-k NPY shard: records
    (1, stop - start), one read; verified against the epoch's checksum when they are the
    whole shard's tokens, else their values are checked."""
    n = shape[1]
    out = np.empty((1, stop - start), dtype=dtype)
    try:
        with fs.open(path, "rb") as f:
            f.seek(offset + (epoch * n + start) * dtype.itemsize)
            got = f.readinto(out.view(np.uint8))
    except FileNotFoundError:
        raise missing_shard(name) from None
    if got != out.nbytes:
        raise corrupt_shard(name, f"epoch index {epoch} ends after {got} of {out.nbytes} "
                                  "bytes")
    if crcs is not None and start == 0 and stop == n:
        if crc_array(out[0]) != crcs[epoch]:
            raise CorruptFileError(f"shard {name!r}: epoch index {epoch} does not match its "
                                   "checksum: the file is corrupt")
    else:  # a part of a shard cannot be checked against its checksums
        check_records(out, targets[start:stop], vocab,
                      where=f"shard {name!r}, epoch index {epoch}")
    return out
