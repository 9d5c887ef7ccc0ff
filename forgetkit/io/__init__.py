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

Modules: ``atomic`` (atomic writes), ``record`` (the metadata record, sidecars), ``npz``,
``npy``, ``parquet``, ``cartography``, ``summary`` (one per format), ``writer`` (`RunWriter`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .._validation import check_bool, check_option, check_path
from ..errors import ForgetkitError, InputTypeError, MissingFileError
from ..execution import loader as registered_loader
from ..run import Run
from .atomic import atomic_write
from .background import wait_for_writes
from .cartography import load_cartography
from .guard import refuse_overwrite
from .lock import RunLock
from .npy import load_npy, write_npy
from .npz import load_npz, write_npz
from .pair import commit_pair
from .parquet import LAYOUTS, load_parquet, staging_path, write_parquet
from .record import format_of, load_labels_file, record_of, with_checksums
from .summary import SummaryWriter, is_summary, load_summary, staged_summary, summarize
from .summary_parquet import is_summary_parquet, load_summary_parquet
from .topk import TopKWriter, is_topk, load_topk, save_topk, to_topk
from .topk_parquet import is_topk_parquet, load_topk_parquet
from .verification import verify_run
from .writer import RunWriter

__all__ = ["RunWriter", "SummaryWriter", "TopKWriter", "atomic_write", "convert", "load",
           "load_cartography", "save", "summarize", "to_topk", "verify"]


def load(path, labels=None, *, kind=None, chunks=None, verify=True):
    """Load a run from ``path`` (.npz, .npy, .parquet or a Dataset Cartography folder).

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
    fmt = format_of(path)
    if fmt == "parquet" and not path.exists() and staging_path(path).is_dir():
        fmt = "parquet"  # an unfinished RunWriter: load its completed epochs
    elif not path.exists():
        raise MissingFileError(f"no such run: {str(path)!r}")
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels_file(labels)
    wait_for_writes(path)  # epochs this process recorded to path and still writes
    if fmt == "npy" and kind in (None, "summary") and is_summary(path):
        return load_summary(path, labels=labels, verify=verify)
    if fmt == "parquet" and not path.exists() and staged_summary(path).exists():
        return load_summary(staged_summary(path), labels=labels, verify=verify)  # writing
    if fmt == "npy" and kind in (None, "topk") and is_topk(path):
        return load_topk(path, labels=labels, verify=verify)
    if fmt == "parquet" and kind in (None, "topk") and is_topk_parquet(path):
        return load_topk_parquet(path, labels=labels, verify=verify)
    if fmt == "parquet" and kind in (None, "summary") and is_summary_parquet(path):
        return load_summary_parquet(path, labels=labels, verify=bool(verify))
    if fmt in ("npy", "parquet"):
        loader = load_npy if fmt == "npy" else load_parquet
        return loader(path, labels=labels, kind=kind, verify=bool(verify))
    loader = {"npz": load_npz, "cartography": load_cartography}[fmt]
    return loader(path, labels=labels, kind=kind)


def save(run, path, *, layout="list", compress=True):
    """Write ``run`` to ``path``; the format follows the extension (.npz, .npy, .parquet).

    Streams epoch by epoch, so a memory-mapped or Parquet run converts with bounded memory.
    The write is atomic and durable (see `atomic_write`): on any error no file is left at
    ``path`` (an existing one is kept). It holds the run's writer lock, so it refuses a path
    that a `RunWriter` is writing, and it refuses the file ``run`` was loaded from.
    ``layout`` ("list" or "binary") applies to Parquet, ``compress`` to NPZ.
    """
    if not isinstance(run, Run):
        raise InputTypeError(f"run must be a forgetkit.Run; got {type(run).__name__}")
    path = Path(path)
    fmt = format_of(path)
    if fmt == "cartography":
        raise ForgetkitError("saving to Dataset Cartography folders is not supported")
    check_option("layout", layout, LAYOUTS)
    refuse_overwrite({"destination": path}, [run.source])
    if run.kind == "summary":  # written as what it is
        if fmt not in ("npy", "parquet"):
            raise ForgetkitError(f"a summary run is saved as .npy or .parquet; got "
                                 f"{str(path)!r}")
        summarize(run, path)
        return path
    if run.kind == "topk":  # written as what it is, with its token table
        return save_topk(run, path)
    epochs = ((int(run.epochs[e]), run.epoch_values(e)) for e in range(run.n_epochs))
    with RunLock(path):
        if fmt == "npy":  # the tensor and its sidecar, committed as one
            commit_pair(path, lambda tmp: write_npy(tmp, epochs, run.outputs.dtype, run.shape),
                        lambda crcs: with_checksums(record_of(run), crcs))
            return path
        with atomic_write(path) as tmp:
            if fmt == "npz":
                write_npz(tmp, run, compress=compress)
            else:
                write_parquet(tmp, epochs, run.n_classes, run.outputs.dtype, layout,
                              record_of(run))
    return path


def convert(src, dst, *, labels=None, layout="list"):
    """Load ``src`` and save it as ``dst`` (format from each extension), epoch by epoch.
    Refuses, before reading anything, a ``dst`` that is ``src``, the labels file or a file
    kept beside them (sidecar, staging folder)."""
    label_file = labels if isinstance(labels, (str, os.PathLike)) else None
    refuse_overwrite({"destination": dst}, [src, label_file])
    return save(load(src, labels=labels), dst, layout=layout)


def verify(path):
    """Check every stored epoch of the run at ``path`` against its checksums.

    Returns
    -------
    dict
        ``{"path", "verifiable", "epochs", "bad"}``: whether the run carries checksums (False
        for runs written before they existed, and formats without them: Dataset Cartography
        folders; an NPZ's members are checked by the zip's CRC-32), how many epochs were
        checked, and the epoch numbers that do not match (empty when every epoch holds).
        A file that cannot be read at all raises ForgetkitError.
    """
    return verify_run(check_path("path", path))
