"""Refuse, before any work, a destination that would overwrite one of the inputs."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OverwriteError
from .lock import lock_path
from .pair import pending_path
from .parquet import staging_path
from .record import pending_tokens_path, sidecar_path, tokens_path


def companions(path):
    """``path`` and the files forgetkit keeps beside it: an .npy run's sidecar, token table
    (a top-k run's) and their pending versions, a Parquet run's staging folder, and the
    run's lock file."""
    path = Path(path)
    suffix = path.suffix.lower()
    files = [path]
    if suffix == ".npy":
        sidecar = sidecar_path(path)
        files += [sidecar, pending_path(path), tokens_path(path), pending_tokens_path(path)]
    elif suffix == ".parquet":
        files.append(staging_path(path))
    return [*files, lock_path(path)]


def same_file(a, b):
    """Whether paths ``a`` and ``b`` name the same file: the same device and inode when both
    exist (symbolic and hard links), else the same absolute path once links are resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return Path(os.path.abspath(a)).resolve() == Path(os.path.abspath(b)).resolve()


def inside(path, folder):
    """Whether ``path`` lies inside the existing folder ``folder`` (a staging folder)."""
    if not os.path.isdir(folder):
        return False
    try:
        Path(os.path.abspath(path)).resolve().relative_to(Path(folder).resolve())
    except ValueError:
        return False
    return True


def refuse_overwrite(destinations, inputs):
    """Raise OverwriteError if a destination, or a file written beside it, is one of the
    inputs or a file kept beside one.

    Parameters
    ----------
    destinations : dict of {description: path or None}
        e.g. ``{"--out": "targets.npy"}``; None entries are skipped.
    inputs : iterable of path or None
        The input files (runs, plans, labels...); None entries are skipped.
    """
    inputs = [Path(p) for p in inputs if p is not None]
    for what, dst in destinations.items():
        if dst is None:
            continue
        for written in companions(dst):
            for given in inputs:
                for kept in companions(given):
                    if not (same_file(written, kept) or inside(written, kept)):
                        continue
                    which = f"the input {str(kept)!r}" if kept == given else \
                        f"{str(kept)!r}, kept beside the input {str(given)!r}"
                    raise OverwriteError(
                        f"{what} {str(dst)!r} would overwrite {which}; the output must not be "
                        "one of the inputs: choose another path")
