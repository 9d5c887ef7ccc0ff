"""One writer per run: an exclusive advisory lock on ``<path>.lock`` held while writing.

The lock is ``flock`` on the lock file, which records its holder (pid, host, start time)
for the message a second writer gets. The kernel drops the lock of a process that dies, so
the lock file a killed writer left behind is simply taken over by the next writer. Readers
(`forgetkit.load`) take no lock: a run being written loads as its completed epochs.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from pathlib import Path

from ..errors import ForgetkitError, RunLockedError
from .atomic import HOST, naming

LOCK_SUFFIX = ".lock"
#: The holder record is a short JSON object; more than this is not one of ours.
_HOLDER_BYTES = 4096


def lock_path(path):
    """The lock file of the run at ``path``: ``<path>.lock``."""
    return Path(str(path) + LOCK_SUFFIX)


def _holder_text(fd):
    """Who holds the lock, as recorded in the lock file, in words."""
    try:
        holder = json.loads(os.pread(fd, _HOLDER_BYTES, 0))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
        return f"process {int(holder['pid'])} on {holder['host']}, since {since}"
    except (ValueError, TypeError, KeyError, OSError):
        return "a process that has not recorded itself yet"


class RunLock:
    """The exclusive lock of the run at ``path``, taken at construction, held until
    `release` (or until the object is garbage collected, or the process ends).

    Raises RunLockedError naming the holder when another writer (of this or another
    process) holds it.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.file = lock_path(self.path)
        self._handle = self._acquire()

    def _acquire(self):
        while True:
            try:  # never through a symbolic link, never anything but a regular file
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                             | getattr(os, "O_NONBLOCK", 0), 0o666)
            except OSError as err:  # e.g. a folder the user cannot write to: name the run
                if err.errno == errno.ELOOP or os.path.islink(self.file):
                    raise ForgetkitError(self._not_regular("a symbolic link")) from None
                if os.path.exists(self.file) and not os.path.isfile(self.file):
                    raise ForgetkitError(self._not_regular("not a regular file")) from None
                raise naming(err, self.path) from None
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a FIFO, a device, a folder...
                os.close(fd)
                raise ForgetkitError(self._not_regular("not a regular file"))
            if st.st_nlink != 1:  # a hard link to another file, which we would truncate
                os.close(fd)
                raise ForgetkitError(self._not_regular(
                    f"a hard link ({st.st_nlink} links: another file's contents)"))
            if st.st_uid != os.geteuid():  # planted by another user (a shared folder)
                os.close(fd)
                raise ForgetkitError(self._not_regular(
                    f"owned by another user (uid {st.st_uid}; this process runs as uid "
                    f"{os.geteuid()})"))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder_text(fd)
                os.close(fd)
                raise RunLockedError(
                    f"{str(self.path)!r} is being written by another writer ({holder}; lock "
                    f"file {str(self.file)!r}): one writer per run at a time. Wait for it to "
                    "close, or write to another path (under torch.distributed, record on one "
                    "rank only)") from None
            except BaseException:
                os.close(fd)
                raise
            # the holder before us may have released (removed the file) between our open
            # and flock: then the lock we hold is on a removed file, so take the new one
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(self.file))
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        handle = os.fdopen(fd, "r+b")  # closes (and so unlocks) when garbage collected
        handle.truncate(0)
        handle.write(json.dumps({"pid": os.getpid(), "host": HOST,
                                 "since": time.time()}).encode())
        handle.flush()
        return handle

    def _not_regular(self, what):
        return (f"the lock file {str(self.file)!r} of {str(self.path)!r} is {what}: refused, "
                "nothing was written. Remove it (forgetkit creates it as a regular file)")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()

    def release(self):
        """Remove the lock file and unlock (a no-op if already released)."""
        if self._handle is None:
            return
        # removed while still locked: a writer that opened it meanwhile sees it is not the
        # current lock file and retries on a new one
        self.file.unlink(missing_ok=True)
        self._handle.close()
        self._handle = None
