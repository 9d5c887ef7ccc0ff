"""Loading and saving runs: NPZ, memory-mapped NPY, Parquet, Dataset Cartography folders.

Formats
-------
``.npz``
    ``logits`` or ``probs`` (E, N, C) + ``labels`` (N,), optional ``epochs``, ``sample_ids``,
    ``class_names`` and ``meta`` (a JSON string): the format of the shared sample runs.
``.npy``
    The outputs tensor, memory-mapped on load. Labels come from ``labels=`` or from the sidecar
    ``<name>.forgetkit.json`` that `save` and `RunWriter` write beside it (kind, epoch numbers,
    labels, ids, class names, metadata). A summary run (``"kind": "summary"`` in the sidecar)
    is a structured (E, N) array of label logit, largest other logit, its class, log-sum-exp.
``.parquet``
    One row per (epoch, sample): columns ``epoch``, ``sample``, ``outputs``; one row group per
    epoch; labels and metadata as JSON under the schema metadata key ``forgetkit``. ``outputs``
    is FixedSizeList<float> of C values (``layout="list"``, the default, readable by any Parquet
    tool) or FixedSizeBinary of the raw little-endian bytes (``layout="binary"``, ~8x faster to
    decode). Loading is lazy: epochs (row groups) are read when a pass asks for them.

Writing is atomic (temporary file, then rename): an output file is complete or absent.
`RunWriter` appends epoch by epoch while a model trains; after a kill, the epochs completed
before it load normally.

Which format reads or writes a path is asked of one registry (`registry`): `load`, `save`,
`verify`, `convert` and the shard readers of `forgetkit.distributed` loop over it, and
`register_format` adds a format (a `Format`: can_open, load, save, verify, open_shard).

Modules: ``registry`` (the `Format` interface and the registry); ``formats/`` (one module
per format: ``npy``, ``npz``, ``parquet``, ``cartography``, and the NPY and Parquet shard
readers); the layouts of each kind: ``npy``, ``npz``, ``parquet``, ``cartography`` (full
runs), ``summary``, ``summary_parquet``, ``summary_record`` (summaries, `SummaryWriter`),
``topk``, ``topk_parquet``, ``topk_record`` (top-k runs, `TopKWriter`); the mechanics:
``record`` (the metadata record, sidecars), ``writer`` (`RunWriter`), ``atomic``, ``pair``,
``lock``, ``guard``, ``integrity``, ``background``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._validation import check_bool, check_option, check_path
from ..errors import CorruptFileError, InputTypeError
from ..execution import loader as registered_loader
from ..run import Run
from .atomic import atomic_write
from .background import wait_for_writes
from .cartography import load_cartography
from .formats.cartography import CartographyFormat
from .formats.npy import NpyFormat
from .formats.npz import NpzFormat
from .formats.parquet import ParquetFormat
from .guard import refuse_overwrite
from .parquet import LAYOUTS, staging_path  # noqa: F401 (forgetkit.io.staging_path)
from .record import load_labels_file
from .registry import (
    Format,
    format_to_open,
    format_to_save,
    register_format,
    registered_formats,
    unregister_format,
)
from .summary import SummaryWriter, summarize
from .topk import TopKWriter, to_topk
from .writer import RunWriter

__all__ = ["Format", "RunWriter", "SummaryWriter", "TopKWriter", "atomic_write", "convert",
           "load", "load_cartography", "register_format", "registered_formats", "save",
           "summarize", "to_topk", "unregister_format", "verify"]

for _builtin in (NpzFormat(), NpyFormat(), ParquetFormat(), CartographyFormat()):
    register_format(_builtin)  # asked newest first: a user's format before these


def load(path, labels=None, *, kind=None, chunks=None, verify=True):
    """Load a run from ``path`` (.npz, .npy, .parquet, a Dataset Cartography folder or a
    registered format's path: the first registered format whose ``can_open`` claims it).

    A glob pattern (``"run/shard-*.npy"``), an fsspec URL (``"s3://..."``) or ``chunks``
    loads NPY/Parquet shards as one Run on a dask array, kept distributed (see
    `forgetkit.distributed.load_shards`; needs the ``dask`` extra).

    Parameters
    ----------
    path : str or Path
    labels : array-like of shape (n_samples,) or path to a .npy file, optional
        Required for a bare .npy outputs file without its sidecar; overrides stored labels.
    kind : {"logits", "probs"}, optional
        Overrides the stored kind (a bare .npy is taken as logits by default).
    chunks : int, optional
        Samples per chunk of a run loaded as a dask array.
    verify : bool, default True
        Check the stored checksums (`forgetkit.io.integrity`): labels and epoch numbers when
        loaded, each epoch's values on its first full read (a memory-mapped .npy or summary:
        every epoch when loaded, once per process while the file is unchanged; Parquet: each
        epoch as it is read). A mismatch is a CorruptFileError naming the file and the epoch.

    Returns
    -------
    Run
    """
    verify = check_bool("verify", verify)
    if not isinstance(path, (list, tuple)):  # a list of shards goes to load_shards
        check_path("path", path)
    if chunks is not None or any(mark in str(path) for mark in ("*", "?", "[", "://")):
        return registered_loader("shards")(path, chunks=chunks, labels=labels, kind=kind,
                                         verify=verify)
    path = Path(path)
    fmt = format_to_open(path)
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels_file(labels)
    wait_for_writes(path)  # epochs this process recorded to path and still writes
    return fmt.load(path, labels=labels, kind=kind, verify=verify)


def save(run, path, *, layout="list", compress=True):
    """Write ``run`` to ``path`` in the first registered format that writes that path (by
    its extension: .npz, .npy, .parquet) and stores the run's kind.

    Streams epoch by epoch, so a memory-mapped or Parquet run converts with bounded memory.
    The write is atomic and durable (see `atomic_write`): on any error no file is left at
    ``path`` (an existing one is kept). It holds the run's writer lock, so it refuses a path
    that a `RunWriter` is writing, and it refuses the file ``run`` was loaded from.
    ``layout`` ("list" or "binary") applies to Parquet, ``compress`` to NPZ.
    """
    if not isinstance(run, Run):
        raise InputTypeError(f"run must be a forgetkit.Run; got {type(run).__name__}")
    path = Path(path)
    fmt = format_to_save(path, run.kind)
    check_option("layout", layout, LAYOUTS)
    refuse_overwrite({"destination": path}, [run.source])
    fmt.save(run, path, layout=layout, compress=compress)
    return path


def convert(src, dst, *, labels=None, layout="list"):
    """Load ``src`` and save it as ``dst`` (format from each extension), epoch by epoch.
    Refuses, before reading anything, a ``dst`` that is ``src``, the labels file or a file
    kept beside them (sidecar, staging folder)."""
    check_path("src", src)
    check_path("dst", dst)
    label_file = labels if isinstance(labels, (str, os.PathLike)) else None
    refuse_overwrite({"destination": dst}, [src, label_file])
    return save(load(src, labels=labels), dst, layout=layout)


def verify(path):
    """Check every stored epoch of the run at ``path`` against its checksums.

    It refuses what `load` refuses, through the same code: the run is loaded first, then
    every epoch that loading leaves to the first read is checked.

    Returns
    -------
    dict
        ``{"path", "verifiable", "metadata", "epochs", "bad"}``: whether the run carries
        checksums (False for runs written before they existed, and formats without them:
        Dataset Cartography folders; an NPZ's members are checked by the zip's CRC-32),
        whether they cover its metadata (sample ids, class names, sizes, meta; False for
        runs written before they did), how many epochs were checked, and the epoch numbers
        that do not match (empty when every epoch holds). A run that `load` refuses, or whose
        metadata does not match its checksum, raises ForgetkitError.
    """
    path = Path(check_path("path", path))
    fmt = format_to_open(path)
    try:
        fmt.load(path, verify=True)  # what load refuses, verify refuses
    except CorruptFileError as refused:
        try:  # every epoch that does not match, where load named one
            result = fmt.verify(path)
        except Exception:  # refused for another reason: load's words
            raise refused from None
        if not result["bad"]:
            raise
    else:
        result = fmt.verify(path)  # and every epoch that load reads lazily
    return {"path": str(path), "metadata": result["verifiable"], **result}
