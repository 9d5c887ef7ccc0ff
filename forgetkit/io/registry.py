"""The registry of file formats: the `Format` interface and `register_format`.

A format is how a run's bytes sit on disk (NPY + sidecar, NPZ, Parquet, Dataset Cartography
folders, a user's own). `forgetkit.load`, `save`, `verify`, `convert` and the shard readers of
`forgetkit.distributed` ask the registered formats, newest registration first, so that a
format registered by a user can claim a path before the built-ins. A new format is one class
and one `register_format` call (xarray's backends and their ``guess_can_open`` are the model).

The interface, per format:

- ``name``: a short name ("npy"); ``suffixes``: the endings of the paths it writes;
  ``kinds``: the run kinds it stores ("logits", "probs", "summary", "topk");
- ``can_open(path)``: whether it reads ``path``: cheap sniffing (the extension, a folder's
  file names, a sidecar's format), never a full read, never an error;
- ``load(path, *, labels=None, kind=None, verify=True)``: the Run at ``path``; a missing
  run is MissingFileError;
- ``can_save(path)``: whether ``save`` writes ``path`` (default: it ends with a suffix);
- ``save(run, path, **options)``: write ``run`` (a kind it stores) atomically; ``options``
  are `forgetkit.save`'s (``layout``, ``compress``), each format taking those it knows;
- ``verify(path)``: check every stored epoch against its checksums:
  ``{"verifiable": bool, "epochs": int, "bad": [epoch numbers]}``;
- ``open_shard(fs, path, name, *, verify)`` (optional): a `Shard`, the description of one
  file of a sharded run that dask workers read block by block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ForgetkitError, InputTypeError


class Format:
    """A file format of runs (see the module docstring); subclass it and register an
    instance with `register_format`."""

    #: A short name, unique among the registered formats.
    name = None
    #: The endings of the paths `save` writes (".npy"); none for a read-only format.
    suffixes = ()
    #: The run kinds it stores ("logits", "probs", "summary", "topk").
    kinds = ()
    #: What messages call it ("a .npy file with its sidecar").
    description = None
    #: Whether `open_shard` reads its files as shards of a run (by their suffix).
    shards = False

    def can_open(self, path):
        """Whether this format reads the run at ``path`` (cheap; never raises)."""
        raise NotImplementedError

    def load(self, path, *, labels=None, kind=None, verify=True):
        """The Run stored at ``path``; ``labels`` (N,) and ``kind`` override the stored
        ones; ``verify`` checks the stored checksums."""
        raise NotImplementedError

    def has_suffix(self, path):
        """Whether ``path`` ends with one of ``suffixes`` (any case)."""
        return bool(self.suffixes) and str(path).lower().endswith(
            tuple(s.lower() for s in self.suffixes))

    def can_save(self, path):
        """Whether `save` writes ``path``: by default, it ends with one of ``suffixes``."""
        return self.has_suffix(path)

    def save(self, run, path, **options):
        """Write ``run`` (of a kind in ``kinds``) to ``path`` atomically; returns ``path``."""
        raise ForgetkitError(f"the {self.name} format cannot write runs")

    def verify(self, path):
        """Check every stored epoch of the run at ``path`` against its checksums: a dict
        ``{"verifiable", "epochs", "bad"}`` (`forgetkit.verify`)."""
        raise NotImplementedError

    def open_shard(self, fs, path, name, *, verify=True):
        """The `Shard` of the file ``path`` on the fsspec filesystem ``fs`` (``name``: what
        messages call it), reading only its header and metadata (formats whose ``shards``
        is True)."""
        raise ForgetkitError(f"shard {name!r}: the {self.name} format cannot be read as "
                             "shards")

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"


@dataclass
class Shard:
    """One file of a sharded run: a block of its samples with every epoch, as a format
    opens it on the client (headers, sidecars and footers only).

    ``shape``: (n_epochs, n_samples, n_classes) of outputs, or (n_epochs, n_samples) of
    structured records (summary, top-k); ``dtype``: the blocks' dtype; ``record``: its
    metadata record (kind, epochs, labels, sample ids, class names, meta, and for top-k runs
    vocab_size and k); ``read_block(start, stop)``: samples start..stop of every epoch, read
    and checked on a worker (a picklable callable); ``table``: a top-k run's token table;
    ``read_parts(start, stop)`` (optional): the block and the CRC32C of each epoch's rows of
    it, whose combination over the blocks is checked against ``crcs`` (the stored per-epoch
    checksums) when a shard is read in several blocks; ``read_epoch(epoch, start, stop)``
    (optional, top-k shards): the block of one epoch (1, stop - start), read alone."""

    kind: str
    shape: tuple
    dtype: np.dtype
    record: dict
    read_block: Callable
    table: np.ndarray | None = None
    read_parts: Callable | None = None
    crcs: list | None = None
    read_epoch: Callable | None = None


_FORMATS = []  # newest registration first


def register_format(fmt, *, replace=False):
    """Register the format ``fmt`` (a `Format` instance); it is asked before those
    registered earlier. ``replace`` lets it take the place of a format of the same name.
    Returns ``fmt``."""
    if not isinstance(fmt, Format):
        raise InputTypeError(f"fmt must be a forgetkit.io.registry.Format instance; got "
                             f"{type(fmt).__name__}")
    if not isinstance(fmt.name, str) or not fmt.name:
        raise ForgetkitError(f"fmt.name must be a non-empty string; got {fmt.name!r}")
    taken = [f for f in _FORMATS if f.name == fmt.name]
    if taken and not replace:
        raise ForgetkitError(f"a format named {fmt.name!r} is registered already "
                             f"({taken[0]!r}); pass replace=True to replace it")
    for old in taken:
        _FORMATS.remove(old)
    _FORMATS.insert(0, fmt)
    return fmt


def unregister_format(name):
    """Remove the format named ``name`` from the registry; returns it."""
    for fmt in _FORMATS:
        if fmt.name == name:
            _FORMATS.remove(fmt)
            return fmt
    raise ForgetkitError(f"no format named {name!r} is registered; registered: "
                         f"{', '.join(f.name for f in _FORMATS)}")


def registered_formats():
    """The registered formats, in the order they are asked (newest first)."""
    return tuple(_FORMATS)


def _expected():
    """The registered formats' descriptions: "a, b or c"."""
    names = [f.description or f.name for f in reversed(_FORMATS)]
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]])) if names else \
        "a registered format (none is)"


def format_to_open(path):
    """The first registered format that reads ``path``; ForgetkitError if none does."""
    for fmt in _FORMATS:
        if fmt.can_open(path):
            return fmt
    raise ForgetkitError(f"cannot tell the format of {str(path)!r}: expected {_expected()}")


def format_to_save(path, kind):
    """The first registered format that writes ``path`` and stores runs of ``kind``."""
    claims = [fmt for fmt in _FORMATS if fmt.can_save(path)]
    for fmt in claims:
        if kind in fmt.kinds:
            return fmt
    if claims:
        takes = [s for fmt in reversed(_FORMATS) if kind in fmt.kinds for s in fmt.suffixes]
        if not takes:
            raise ForgetkitError(f"no registered format stores {kind} runs (formats: "
                                 f"{_expected()}); got {str(path)!r}")
        raise ForgetkitError(f"a {kind} run is saved as {' or '.join(dict.fromkeys(takes))}; "
                             f"got {str(path)!r}")
    readers = [fmt for fmt in _FORMATS if fmt.can_open(path)]
    if readers:
        raise ForgetkitError(f"saving to {readers[0].description or readers[0].name} is not "
                             f"supported; got {str(path)!r}")
    raise ForgetkitError(f"cannot tell the format of {str(path)!r}: expected "
                         f"{', '.join(s for f in reversed(_FORMATS) for s in f.suffixes)}")


def shard_format(path, name):
    """The first registered format that reads shards and whose suffix ``path`` has (a
    shard may be remote: its contents are not sniffed here)."""
    readers = [fmt for fmt in _FORMATS if fmt.shards]
    for fmt in readers:
        if fmt.has_suffix(path):
            return fmt
    suffixes = [s for fmt in reversed(readers) for s in fmt.suffixes]
    raise ForgetkitError(f"shard {name!r} must be a {' or '.join(suffixes)} file; got "
                         f"{Path(path).suffix or 'no'} suffix")
