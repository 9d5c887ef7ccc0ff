"""Per-chunk results kept on the workers (`DaskParts`), and dask tasks computed with a
progress bar (`compute`), for the passes over runs held as dask arrays
(`forgetkit.distributed.chunks`, `forgetkit.distributed.topk`)."""

from __future__ import annotations

import dask

from ..execution import Parts


def active_client():
    """The active dask.distributed Client, or None (no client, or distributed not
    installed: dask's own schedulers then run the tasks)."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:
        return None


def compute(tasks, bar):
    """``dask.compute(*tasks)``, counting finished tasks on ``bar`` (a Progress) when it
    is shown."""
    if not bar.enabled:
        return dask.compute(*tasks)
    client = active_client()
    if client is not None:
        from distributed import as_completed

        futures = client.compute(list(tasks))
        for _ in as_completed(futures):
            bar.update()
        return tuple(client.gather(futures))
    from dask.callbacks import Callback

    keys = {task.key for task in tasks}

    class Tick(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if key in keys:
                bar.update()

    with Tick():
        return dask.compute(*tasks)


class DaskParts(Parts):
    """Per-chunk results kept on the workers: futures of the active dask.distributed
    Client (a chain of futures per chunk, recomputed by the scheduler if a worker is lost),
    or persisted Delayed objects on dask's own schedulers."""

    def __init__(self, tasks):
        self.client = active_client()
        if self.client is not None:
            self.parts = self.client.compute(list(tasks))
        else:
            self.parts = list(dask.persist(*tasks))

    def __len__(self):
        return len(self.parts)

    def map(self, fn, *args):
        if self.client is not None:
            return self.client.gather([self.client.submit(fn, part, *args)
                                       for part in self.parts])
        return list(dask.compute(*[dask.delayed(fn)(part, *args) for part in self.parts]))

    def update(self, fn, *args):
        if self.client is not None:
            self.parts = [self.client.submit(fn, part, *args) for part in self.parts]
        else:
            self.parts = list(dask.persist(*[dask.delayed(fn)(part, *args)
                                             for part in self.parts]))
