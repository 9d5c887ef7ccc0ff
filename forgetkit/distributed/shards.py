"""Runs stored as shards: NPY or Parquet files that each hold a block of samples with the
same epochs, loaded as one Run on a dask array (concatenated along samples).

Each shard is a forgetkit run file: an NPY tensor (E, n_i, C) with its
``<name>.forgetkit.json`` sidecar, or a Parquet run (one row group per epoch), each with
the labels (and optionally sample ids) of its samples. Paths are local or fsspec URLs
(``s3://...``, ``gs://...``, ``file://...``); the client reads only headers, sidecars and
Parquet footers, the workers read the blocks of samples they compute on.
"""

from __future__ import annotations

import os

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from fsspec.core import url_to_fs

from .._validation import check_int, check_labels, check_path
from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from ..io.integrity import combine_lanes
from ..io.record import TOKENS_SUFFIX, duplicate_id, load_labels_file
from ..io.registry import shard_format
from ..kinds.topk import TopKOutputs
from ..run import Run


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


def open_shards(shards, verify):
    """[(name, `forgetkit.io.registry.Shard`)] of ``shards`` (`shard_paths`), each opened
    by the registered format that reads its file (`forgetkit.io.registry.shard_format`);
    shards must all carry a token table (top-k runs) or none."""
    opened = [(name, shard_format(path, name).open_shard(fs, path, name, verify=verify))
              for fs, path, name in shards]
    first_name, first = opened[0]
    for name, shard in opened[1:]:
        if (shard.table is None) != (first.table is None):
            raise CorruptFileError(f"shard {name!r} holds a {shard.kind} run; the first shard "
                                   f"{first_name!r} holds a {first.kind} run: shards must "
                                   "hold runs of one kind")
    return opened


def spans_of(n, chunks):
    """The (start, stop) blocks of ``n`` samples, ``chunks`` at most (None: one)."""
    step = n if chunks is None else chunks
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def load_topk_shards(opened, *, chunks, labels):
    """The top-k Run of ``opened`` (`open_shards`) on a dask array of records (E, N)."""
    first_name, first = opened[0]
    spans = []
    for name, shard in opened:
        shape, record = shard.shape, shard.record
        if (shape[0], shard.dtype, record["epochs"], record["vocab_size"]) != \
                (first.shape[0], first.dtype, first.record["epochs"],
                 first.record["vocab_size"]):
            raise CorruptFileError(f"shard {name!r} has {shape[0]} epochs {record['epochs']}, "
                                   f"vocabulary {record['vocab_size']} and k={record['k']}; "
                                   f"the first shard {first_name!r} has {first.shape[0]} "
                                   f"epochs {first.record['epochs']}, vocabulary "
                                   f"{first.record['vocab_size']} and k={first.record['k']}: "
                                   "shards must hold the same epochs, vocabulary and k")
        spans += [(shard, a, b) for a, b in spans_of(shape[1], chunks)]
    table = np.concatenate([shard.table for _, shard in opened])
    outputs = TopKOutputs(topk_records(spans, first.shape[0], first.dtype),
                          first.record["vocab_size"],
                          table["sequence"], table["position"])
    return Run(outputs, table["target"] if labels is None else labels, kind="topk",
               epochs=first.record["epochs"], meta=first.record.get("meta"))


def topk_records(spans, n_epochs, dtype):
    """The dask array (n_epochs, tokens) of the records of ``spans`` [(shard, start, stop)]
    concatenated along tokens, as one graph layer: a chunk per epoch and span where every
    shard reads an epoch alone (`Shard.read_epoch`: certified fusion's steps on the workers
    read only the epochs they need), else a chunk per span."""
    by_epoch = all(shard.read_epoch is not None for shard, _, _ in spans)
    name = "topk-records-" + tokenize([(shard.read_block, a, b) for shard, a, b in spans],
                                      by_epoch)
    graph = {}
    for j, (shard, a, b) in enumerate(spans):
        if by_epoch:
            graph.update({(name, e, j): (shard.read_epoch, e, a, b) for e in range(n_epochs)})
        else:
            graph[(name, 0, j)] = (shard.read_block, a, b)
    chunks = ((1,) * n_epochs if by_epoch else (n_epochs,), tuple(b - a for _, a, b in spans))
    return da.Array(HighLevelGraph.from_collections(name, graph, dependencies=()), name,
                    chunks, dtype=dtype)


def load_shards(source, *, chunks=None, labels=None, kind=None, verify=True):
    """A Run on a dask array of the shards at ``source``, concatenated along samples.

    Parameters
    ----------
    source : str, Path or list of them
        A path, glob pattern or fsspec URL of shards (files each holding a block of samples
        with the same epochs, classes and dtype, in a registered format that reads shards:
        NPY or Parquet), in sorted order, or a list of paths in its order.
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
    for i, item in enumerate(source if isinstance(source, (list, tuple)) else [source]):
        check_path("source" if item is source else f"source[{i}]", item)
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels_file(labels)
    opened = open_shards(shard_paths(source), verify)
    if opened[0][1].table is not None:  # token runs: records and token tables
        return load_topk_shards(opened, chunks=chunks, labels=labels)
    blocks, stored_labels, ids, names = [], [], [], []
    first_name, first = opened[0]
    for name, shard in opened:
        shape, record = shard.shape, shard.record
        _check_same((first_name, first.shape, first.dtype, first.record), name, shape,
                    shard.dtype, record)
        if record.get("labels") is not None:
            try:
                check_labels(record["labels"], shape[1], shape[2])
            except ForgetkitError as err:
                raise type(err)(f"shard {name!r}: {err}") from None
        stored_labels.append(record.get("labels"))
        ids.append(record.get("sample_ids"))
        names += [name] * shape[1]
        spans = spans_of(shape[1], chunks)
        if shard.read_parts is not None and len(spans) > 1 and shard.crcs is not None:
            tasks = _checked_blocks(spans, shard, name)  # each epoch's checksum from its parts
        else:
            tasks = [dask.delayed(shard.read_block, pure=True)(a, b) for a, b in spans]
        for (a, b), task in zip(spans, tasks, strict=True):
            blocks.append(da.from_delayed(task, shape=(shape[0], b - a, shape[2]),
                                          dtype=shard.dtype))
    if labels is None:
        missing = [i for i, lab in enumerate(stored_labels) if lab is None]
        if missing:
            raise ForgetkitError(f"shard {missing[0]} of {source!r} stores no labels: pass "
                                 "labels= (the labels of all samples, in shard order)")
        labels = np.concatenate([np.asarray(lab) for lab in stored_labels])
    sample_ids = None if any(i is None for i in ids) else np.concatenate(ids)
    if sample_ids is not None:
        _refuse_duplicate_ids(sample_ids, names)
    record = first.record
    return Run(da.concatenate(blocks, axis=1), labels, kind=kind or record.get("kind", "logits"),
               epochs=record.get("epochs"), sample_ids=sample_ids,
               class_names=record.get("class_names"), meta=record.get("meta"))


def check_parts(parts, lengths, crcs, name):
    """On a worker: the CRC32C of each epoch of a shard read in several blocks, from the
    blocks' CRCs ``parts`` (one list per block, in order) and their bytes per epoch
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


def _checked_blocks(spans, shard, name):
    """Delayed blocks of a shard read in several ``spans`` (start, stop) of samples,
    verified on the workers: each block's task also gives the CRC32C of its rows of each
    epoch (`Shard.read_parts`), one small task per shard combines them (`check_parts`) and
    the shard's last block waits for it, so that a pass over the whole shard fails on a
    mismatch. Memory stays one block per task: the check holds only the CRCs."""
    row = int(np.prod(shard.shape[2:], dtype=np.int64)) * shard.dtype.itemsize
    read = [dask.delayed(shard.read_parts, pure=True, nout=2)(a, b) for a, b in spans]
    check = dask.delayed(check_parts, pure=True)(
        [parts for _, parts in read], [(b - a) * row for a, b in spans], shard.crcs, name)
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
