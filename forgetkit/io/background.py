"""`BackgroundWriter`: a run writer's appends on their own thread, off the training loop."""

from __future__ import annotations

import queue
import threading
import weakref
from pathlib import Path

from ..errors import ForgetkitError

#: How often (seconds) the idle writer thread checks that the main thread still runs.
POLL_SECONDS = 0.2
_STOP = object()
#: The BackgroundWriters with a running thread, for `wait_for_writes`.
_ACTIVE = weakref.WeakSet()


def wait_for_writes(path):
    """Wait until this process's background writers to ``path`` have written what they
    queued, so that a run read while it is being recorded here holds every recorded epoch
    (`forgetkit.load` calls it). Their errors stay for their owners to raise."""
    target = Path(path).resolve()
    for bg in list(_ACTIVE):
        if Path(getattr(bg.writer, "path", "")).resolve() == target:
            bg._queue.join()


class BackgroundWriter:
    """Append epochs to ``writer`` (a `RunWriter` or `SummaryWriter`) on one background thread.

    `submit` queues an epoch and returns at once, unless ``max_pending`` epochs already wait
    (then it waits: memory stays bounded when the disk is slower than training). The values
    may be a callable, run on the thread: the device-to-host copy, reordering by sample id
    and summarising happen there too.

    An error on the thread is raised by the next `submit`, `flush` or `close` (the original
    exception, with a note naming the epoch); epochs queued behind the failed one are
    dropped, and later submissions are written again. When the main thread ends without
    `close` (an exception in the training loop), the thread still writes what was queued,
    then stops, so that completed epochs reach the disk. `forgetkit.load` of the same path
    in this process waits for the queued epochs first.
    """

    def __init__(self, writer, *, max_pending=2):
        self.writer = writer
        self._queue = queue.Queue(maxsize=max(1, int(max_pending)))
        self._error = None  # (exception, epoch, dropped epochs), reported once
        self._lock = threading.Lock()
        self._thread = None
        self._closed = False

    @property
    def closed(self):
        return self._closed

    def submit(self, epoch, values, *, meta=None):
        """Queue epoch number ``epoch``: an (n_samples, ...) array, or a callable returning
        one; ``meta``, if given, is the run's metadata from this epoch on (stored with it)."""
        self.raise_error()
        if self._closed:
            raise ForgetkitError("this BackgroundWriter is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="forgetkit-writer")
            self._thread.start()
            _ACTIVE.add(self)
        self._queue.put((int(epoch), values, meta))

    def flush(self):
        """Wait until every queued epoch is written; raise a pending error."""
        if self._thread is not None:
            self._queue.join()
        self.raise_error()

    def close(self):
        """Write what is queued, stop the thread and close the writer; raise a pending
        error (the writer is closed either way)."""
        self._finish(self.writer.close)

    def abort(self):
        """Write what is queued, stop the thread and abort the writer (after an error in the
        training loop); a pending error is dropped, the loop's error being the one raised."""
        self._finish(self.writer.abort)
        self._error = None

    def raise_error(self):
        """Raise the error of a failed epoch, once."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            err, epoch, dropped = error
            if hasattr(err, "add_note"):
                lost = f"; epochs {dropped} queued after it were not written" if dropped else ""
                err.add_note(f"(forgetkit: writing epoch {epoch} to "
                             f"{str(getattr(self.writer, 'path', ''))!r} failed{lost})")
            raise err

    # -------------------------------------------------------------- internals
    def _finish(self, end):
        if self._closed:
            return
        self._closed = True
        try:
            if self._thread is not None:
                self._queue.put((None, _STOP, None))
                self._thread.join()
                _ACTIVE.discard(self)
        finally:
            end()
        self.raise_error()

    def _work(self):
        main = threading.main_thread()
        while True:
            try:
                epoch, values, meta = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not main.is_alive():
                    return  # the program ended without close(): everything queued is written
                continue
            try:
                if values is _STOP:
                    return
                with self._lock:
                    if self._error is not None:  # not yet reported: drop what follows it
                        self._error[2].append(epoch)
                        continue
                try:
                    values = values() if callable(values) else values
                    if meta is None:
                        self.writer.append(epoch, values)
                    else:
                        self.writer.append(epoch, values, meta=meta)
                except BaseException as err:  # reported to the training thread
                    with self._lock:
                        self._error = (err, epoch, [])
            finally:
                self._queue.task_done()
