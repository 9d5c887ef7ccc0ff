"""Atomic, durable writes: an output file is complete or absent, an existing one is replaced
only by a complete new one, and once a write returns it survives a crash or power loss.

A write goes to a temporary file beside the destination, named
``.<name>.<host>-<pid>.<random>.tmp``, which is flushed to disk (fsync) and renamed over the
destination; the folder is then flushed too, so that the rename itself is on disk. The
temporary files of killed writes are removed by the next write to the same destination:
those of a dead process of this host at once, any other once untouched for
STALE_TMP_SECONDS (a live writer keeps touching its own).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from .._validation import check_path

# mkstemp makes 0600 files; written files get the usual permissions (0666 less the umask)
_UMASK = os.umask(0)
os.umask(_UMASK)
#: This host's name as it appears in temporary file names (letters, digits and "_").
HOST = re.sub(r"\W", "_", socket.gethostname()) or "host"
#: A temporary file untouched this long is left over from a dead write, whoever made it.
STALE_TMP_SECONDS = 3600
_TMP_SUFFIX = ".tmp"
#: The middle of our temporary names, ``<host>-<pid>.<random>``; ``<random>`` alone
#: (8 characters) is tempfile's name without the host and pid.
_TMP_OWNER = re.compile(r"^(?:(?P<host>\w+)-(?P<pid>\d+)\.)?\w{8}$")
#: Errors that only writing raises (a write to the temporary file, when no file is named).
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def fsync_path(path):
    """Flush a file's data, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid):
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def _is_stale(path, host, pid, now):
    """Whether the temporary file ``path`` of writer ``host``/``pid`` (None when its name
    does not say) belongs to a write that can no longer finish."""
    try:
        age = now - os.lstat(path).st_mtime
    except FileNotFoundError:
        return False  # already gone
    if age > STALE_TMP_SECONDS:
        return True
    return host == HOST and pid is not None and not pid_alive(int(pid))


def remove_stale_temps(path):
    """Remove the temporary files that killed writes to ``path`` left (see the module
    docstring); a live writer's temporary file is kept. Returns the removed paths."""
    path = Path(path)
    prefix = f".{path.name}."
    removed = []
    now = time.time()
    try:
        names = os.listdir(path.parent)
    except OSError:  # no folder (yet), or not readable: nothing of ours to clean
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(_TMP_SUFFIX)):
            continue
        owner = _TMP_OWNER.match(name[len(prefix): -len(_TMP_SUFFIX)])
        if owner is None:
            continue  # another file's temporary (a longer name that starts with ours)
        tmp = path.parent / name
        if _is_stale(tmp, owner["host"], owner["pid"], now):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _atomic_path(path):
    """A temporary path in the same folder as ``path`` (so that os.replace is atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{HOST}-{os.getpid()}.",
                               suffix=_TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)
    return Path(tmp)


def naming(err, path):
    """``err``, an OSError about a temporary file, as the same error about ``path`` (the
    destination the user named)."""
    if err.errno is None:
        return err
    return type(err)(err.errno, err.strerror, str(path))


def atomic_write(path, *, durable=True, clean=True):
    """A context manager yielding a temporary path beside ``path`` to write to; when the block
    ends without error it atomically replaces ``path``, otherwise it is removed and ``path``
    is left as it was.

    ``durable`` (default) flushes the file and the rename to disk before returning. Stale
    temporary files of earlier killed writes to ``path`` are removed first. An OSError about
    the temporary file names ``path`` instead. ``clean=False`` skips the stale-file scan (a
    folder listing): for a writer that holds the run's lock and scanned when it opened, so
    that no other write to ``path`` can have left one since.
    """
    return _atomic_write(Path(check_path("path", path)), durable=durable, clean=clean)


@contextmanager
def _atomic_write(path, *, durable, clean):
    """`atomic_write`'s context manager, ``path`` a checked Path."""
    if clean:
        remove_stale_temps(path)
    try:
        tmp = _atomic_path(path)
    except OSError as err:
        raise naming(err, path) from None
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, path)
        if durable:
            fsync_path(path.parent)
    except OSError as err:
        about_tmp = Path(err.filename) == tmp if err.filename is not None \
            else err.errno in _WRITE_ERRNOS
        if not about_tmp:
            raise  # about another file, such as an input read inside the block
        raise naming(err, path) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path, record, *, durable=True, clean=True, **dumps_options):
    """Write ``record`` as JSON to ``path`` atomically (see `atomic_write`). A record that
    carries its encoding (``json_text``, `forgetkit.io.record.record_encoder`) is written as
    that text unless dumps options are given."""
    text = getattr(record, "json_text", None)
    if text is None or dumps_options:
        text = json.dumps(record, **dumps_options)
    with atomic_write(path, durable=durable, clean=clean) as tmp:
        tmp.write_text(text)


def remove(path):
    """Remove a file or a folder tree if it exists."""
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
