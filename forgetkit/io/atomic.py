"""Atomic writes: an output file is complete or absent, and an existing one is replaced
only by a complete new one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

# mkstemp makes 0600 files; written files get the usual permissions (0666 less the umask)
_UMASK = os.umask(0)
os.umask(_UMASK)


def _atomic_path(path):
    """A temporary path in the same folder as ``path`` (so that os.replace is atomic)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)
    return Path(tmp)


@contextmanager
def atomic_write(path):
    """Yield a temporary path beside ``path`` to write to; when the block ends without error
    it atomically replaces ``path``, otherwise it is removed and ``path`` is left as it was."""
    tmp = _atomic_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path, record, **dumps_options):
    """Write ``record`` as JSON to ``path`` atomically."""
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(record, **dumps_options))


def remove(path):
    """Remove a file or a folder tree if it exists."""
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
