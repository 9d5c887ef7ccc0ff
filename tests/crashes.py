"""Crashes and concurrent writers injected into forgetkit's writes, for the tests of
crash consistency (a kill at any rename, a reader while a writer saves)."""

import os
import threading
from contextlib import contextmanager

import forgetkit as fk


class Killed(BaseException):
    """A kill of the writing process at an injected point."""


def kill_at_rename(monkeypatch, k):
    """Make the k-th os.replace (0-based) of forgetkit's writes raise Killed first; returns
    the call count ({"n": calls so far})."""
    calls = {"n": 0}
    real = os.replace

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] - 1 == k:
            raise Killed
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls


@contextmanager
def saving_in_turn(runs, path):
    """Within the block a thread saves ``runs`` over ``path`` in turn (runs[1], runs[0],
    ...), over and over; ``path`` holds runs[0] when the block starts."""
    fk.save(runs[0], path)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            fk.save(runs[i % len(runs)], path)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
