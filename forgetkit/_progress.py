"""Progress lines on a terminal for long passes (epochs, or runs, done / total)."""

from __future__ import annotations

import sys
import time


class Progress:
    """Writes ``desc: done/total unit`` to stderr, at most 10 times a second.

    Silent unless ``enabled`` and stderr is a terminal.
    """

    def __init__(self, total, desc, *, enabled=True, stream=None, unit="epochs"):
        self.stream, self.unit = stream or sys.stderr, unit
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.total, self.desc, self.done, self._last = total, desc, 0, 0.0

    def update(self, n=1):
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self.stream.write(f"\r{self.desc}: {self.done}/{self.total} {self.unit}")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
