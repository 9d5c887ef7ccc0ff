"""Framework-free part of the replays: which checkpoint files, in which order and with which
epoch numbers, their content hashes, and the replay's record in the run's metadata (what
lets a replay resume, and notice checkpoints whose weights are identical).

Epoch numbers: given, else the checkpoint's own (Lightning's epoch, a
Trainer's global step), else the last integer of the file name; checkpoints are replayed in
the order of their epoch numbers. The run's ``meta["replay"]["checkpoints"]`` lists, per
stored epoch, ``{"epoch", "file", "step", "sha256"}``, written with the epoch.
"""

from __future__ import annotations

import glob
import hashlib
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .._validation import check_option
from ..errors import ForgetkitError

#: The choices of ``on_duplicate``.
ON_DUPLICATE = ("warn", "skip", "error")

#: The key of the replay's record in the run's metadata.
META_KEY = "replay"

_GLOB = re.compile(r"[*?\[]")


@dataclass
class Checkpoint:
    """One checkpoint to replay: its file (or folder), epoch number and training step."""

    file: str
    epoch: int
    step: int | None = None


def paths_of(source, what):
    """The paths of ``source`` (a path, a glob pattern, or a list of those) with the
    patterns expanded; nothing given, or a pattern that matches nothing, is an error naming
    ``what``."""
    items = [source] if isinstance(source, (str, Path)) else list(source)
    if not items:
        raise ForgetkitError(f"no {what} given: pass a glob pattern or a list of paths")
    paths = []
    for item in items:
        text = str(item)
        if _GLOB.search(text) and not Path(text).exists():
            matched = sorted(glob.glob(text))
            if not matched:
                raise ForgetkitError(f"no {what} matches {text!r}")
            paths += matched
        else:
            paths.append(text)
    return paths


def checkpoint_files(checkpoints, *, suffixes=None):
    """The checkpoint paths of ``checkpoints``: a glob pattern, a file, or a list of those
    (a folder: its files ending in one of ``suffixes``); a pattern that matches nothing is an
    error naming it."""
    files = []
    for text in paths_of(checkpoints, "checkpoint"):
        if Path(text).is_dir() and suffixes is not None:
            found = sorted(str(p) for p in Path(text).iterdir()
                           if p.is_file() and p.name.endswith(tuple(suffixes)))
            if not found:
                raise ForgetkitError(f"the folder {text!r} holds no checkpoint "
                                     f"({', '.join(suffixes)})")
            files += found
        elif not Path(text).exists():
            raise ForgetkitError(f"checkpoint {text!r} does not exist")
        else:
            files.append(text)
    return files


_SUFFIXES = re.compile(r"(\.(pt|pth|bin|ckpt|tar|safetensors|keras|weights|h5))+$")


def last_integer(name):
    """The last integer in a file name (without its checkpoint suffixes), or None."""
    numbers = re.findall(r"\d+", _SUFFIXES.sub("", Path(name).name))
    return int(numbers[-1]) if numbers else None


def ordered(files, *, epochs=None, own=None):
    """The `Checkpoint` list of ``files`` sorted by epoch number.

    ``epochs``: the epoch numbers given (one per file); else ``own(file) -> (epoch, step)``
    (either None where the checkpoint does not say), else the last integer of the name.
    """
    if epochs is not None:
        epochs = [int(e) for e in epochs]
        if len(epochs) != len(files):
            raise ForgetkitError(f"epochs has {len(epochs)} numbers for {len(files)} "
                                 "checkpoints")
    out = []
    for i, f in enumerate(files):
        epoch, step = own(f) if own is not None else (None, None)
        if epochs is not None:
            epoch = epochs[i]
        elif epoch is None:
            epoch = last_integer(f)
            if epoch is None:
                raise ForgetkitError(f"cannot tell the epoch of checkpoint {f!r}: its name "
                                     "holds no number and the file none of its own (pass "
                                     "epochs=...)")
        out.append(Checkpoint(f, int(epoch), None if step is None else int(step)))
    out.sort(key=lambda c: c.epoch)
    for a, b in zip(out, out[1:], strict=False):
        if a.epoch == b.epoch:
            raise ForgetkitError(f"checkpoints {a.file!r} and {b.file!r} both have epoch "
                                 f"number {a.epoch} (pass epochs=...)")
    return out


#: Buffers are hashed on the pool in groups of about this many bytes (a task per tensor
#: would cost more in handing out than the small ones take to hash).
HASH_GROUP = 4 << 20


def _digests(buffers):
    return [hashlib.sha256(b).digest() for b in buffers]


def _groups(buffers):
    """Consecutive runs of ``buffers`` of about `HASH_GROUP` bytes each."""
    groups, current, size = [], [], 0
    for b in buffers:
        current.append(b)
        size += memoryview(b).nbytes
        if size >= HASH_GROUP:
            groups.append(current)
            current, size = [], 0
    return groups + ([current] if current else [])


class PendingHash:
    """A `content_hash` being computed on a pool: `result` waits for it (once)."""

    def __init__(self, finish):
        self._finish, self._digest = finish, None

    def result(self):
        if self._digest is None:
            self._digest = self._finish()
        return self._digest


def resolved(digest):
    """A content hash: ``digest`` itself, or the result of a `PendingHash`."""
    return digest.result() if isinstance(digest, PendingHash) else digest


def content_hash(items, *, pool=None, wait=True):
    """The SHA-256 hex digest of named arrays: ``items`` is a list of (name, dtype name,
    shape, buffer) in a fixed order; each buffer is hashed (on ``pool`` in groups of
    consecutive buffers: hashlib releases the GIL), then the names, dtypes, shapes and
    digests together. ``wait=False`` (with a pool) returns a `PendingHash` at once."""
    buffers = [it[3] for it in items]
    futures = [pool.submit(_digests, g) for g in _groups(buffers)] if pool is not None \
        else None

    def finish():
        digests = [d for f in futures for d in f.result()] if futures is not None \
            else _digests(buffers)
        h = hashlib.sha256()
        for (name, dtype, shape, _), d in zip(items, digests, strict=True):
            h.update(f"{name}\0{dtype}\0{tuple(shape)}\0".encode())
            h.update(d)
        return h.hexdigest()

    return finish() if wait or pool is None else PendingHash(finish)


def lazy_map(pool, fn, items, ahead=4):
    """``fn`` over ``items`` in order, computed at most ``ahead`` items ahead on ``pool``
    (in this thread without one), so that a consumer that stops early reads no further."""
    if pool is None:
        yield from map(fn, items)
        return
    items = list(items)
    pending = [pool.submit(fn, x) for x in items[:ahead]]
    for i in range(len(items)):
        if i + ahead < len(items):
            pending.append(pool.submit(fn, items[i + ahead]))
        yield pending[i].result()
        pending[i] = None


def hash_pool():
    """A small thread pool for `content_hash`."""
    return ThreadPoolExecutor(8, thread_name_prefix="forgetkit-hash")


class ReplayLog:
    """The replay's record in a run: the checkpoints already stored (from an existing run at
    ``path``), what to skip, and the metadata to write with each new epoch.

    Parameters
    ----------
    existing : Run or None, the run already at the output path (mode "a").
    meta : dict or None, the user's metadata.
    on_duplicate : {"warn", "skip", "error"}
    """

    def __init__(self, existing, meta, on_duplicate, path):
        check_option("on_duplicate", on_duplicate, ON_DUPLICATE)
        self.on_duplicate = on_duplicate
        self.path = str(path)
        self.stored = []
        if existing is not None and existing.n_epochs:
            record = (existing.meta or {}).get(META_KEY) or {}
            stored = record.get("checkpoints") if isinstance(record, dict) else None
            if not isinstance(stored, list) or len(stored) != existing.n_epochs:
                raise ForgetkitError(
                    f"the run at {self.path!r} holds {existing.n_epochs} epochs that were not "
                    "replayed from checkpoints; mode='w' replaces it")
            self.stored = [self._checked_entry(i, entry, epoch) for i, (entry, epoch)
                           in enumerate(zip(stored, existing.epochs, strict=True))]
        self.user_meta = {k: v for k, v in (meta or {}).items() if k != META_KEY}
        self.entries = list(self.stored)
        self.seen = {e["sha256"]: e["file"] for e in self.stored}

    def _checked_entry(self, i, entry, epoch):
        """Stored entry ``i`` of the replay record, checked against the run's ``epoch``."""
        where = f"the run at {self.path!r}: meta[{META_KEY!r}]['checkpoints'][{i}]"
        if not isinstance(entry, dict):
            raise ForgetkitError(f"{where} is a {type(entry).__name__}, not a checkpoint's "
                                 "entry; mode='w' replaces the run")
        digest, file = entry.get("sha256"), entry.get("file")
        if not (isinstance(digest, str) and len(digest) == 64
                and all(c in "0123456789abcdef" for c in digest)):
            raise ForgetkitError(f"{where} has no sha256 content hash (got {digest!r}); "
                                 "mode='w' replaces the run")
        if not isinstance(file, str):
            raise ForgetkitError(f"{where} names no checkpoint file (got {file!r}); mode='w' "
                                 "replaces the run")
        stored_epoch = entry.get("epoch")
        if (isinstance(stored_epoch, bool) or not isinstance(stored_epoch, int)
                or stored_epoch != int(epoch)):
            raise ForgetkitError(f"{where} has epoch {stored_epoch!r}, not the run's epoch "
                                 f"{int(epoch)}; mode='w' replaces the run")
        return entry

    def resume(self, order, digest_of, *, pool=None):
        """How many of the checkpoints ``order`` the run already holds: they must begin with
        the stored ones (matched by content hash, ``digest_of(checkpoint)``; duplicates a
        replay with ``on_duplicate="skip"`` left out may lie between them), else the run is
        refused. Reads only as far as the stored checkpoints go (a few ahead on ``pool``)."""
        if not self.stored:
            return 0
        k = 0
        digests = lazy_map(pool, digest_of, order)
        for p, (checkpoint, digest) in enumerate(zip(order, digests, strict=False)):
            if digest == self.stored[k]["sha256"]:
                k += 1
            elif not (digest in self.seen and self.on_duplicate == "skip"):
                entry = self.stored[k]
                raise ForgetkitError(
                    f"the run at {self.path!r} holds epochs of other checkpoints: its epoch "
                    f"{entry['epoch']} came from {entry['file']!r}, whose weights differ "
                    f"from {checkpoint.file!r} (checkpoint {p + 1} here); mode='w' replaces it")
            if k == len(self.stored):
                return p + 1
        return len(order)

    def admit(self, checkpoint, digest):
        """Whether to store ``checkpoint`` with weights hash ``digest``: a duplicate of an
        earlier checkpoint is warned about (both files named) and kept, skipped, or refused,
        as ``on_duplicate`` says."""
        first = self.seen.get(digest)
        if first is not None:
            what = (f"checkpoint {checkpoint.file!r} has the same weights as {first!r}")
            if self.on_duplicate == "error":
                raise ForgetkitError(f"{what} (on_duplicate='error')")
            if self.on_duplicate == "skip":
                return False
            warnings.warn(f"{what}; replayed anyway (on_duplicate='skip' leaves such "
                          "checkpoints out)", stacklevel=4)
        else:
            self.seen[digest] = checkpoint.file
        return True

    def meta_with(self, checkpoint, digest):
        """The run's metadata once ``checkpoint`` is stored (to write with its epoch)."""
        self.entries.append({"epoch": checkpoint.epoch, "file": str(checkpoint.file),
                             "step": checkpoint.step, "sha256": digest})
        return {**self.user_meta, META_KEY: {"checkpoints": list(self.entries)}}


def existing_run(path, mode):
    """The run at ``path`` that a replay in ``mode`` continues, or None."""
    from ..io import load
    from ..io.npy import stores_no_epoch

    if mode != "a":
        return None
    try:
        return load(path)
    except FileNotFoundError:
        return None
    except ForgetkitError:
        if not Path(path).exists() or stores_no_epoch(path):  # (killed before an epoch)
            return None
        raise
