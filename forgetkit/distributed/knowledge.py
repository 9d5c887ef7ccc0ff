"""Knowledge Fusion's fit on a run on a dask array, on the workers of a dask.distributed
Client.

Each chunk of samples keeps its `FitState` (the in-memory fit state of its Run: outputs,
correctness, the current fusion) on a worker. A step is map (each chunk: F'_e counts against
the current fusion, then the eps search's grid counts of the chosen window) -> reduce (sums in
the client) -> broadcast (the window and eps), after which each chunk mixes the window into
its fusion in place (``kernels.mix_into``). Counts are integers and each chunk runs the
in-memory kernels on its rows, so the plan equals the in-memory fit's exactly. The client
holds only counts.

A chunk's state is a chain of futures, one per mix. If a worker is lost mid-fit, the
scheduler recomputes its states from that chain (the same kernels give the same bits); a mix
that finds its state already mixed (a task run twice) leaves it as it is.
"""

from __future__ import annotations

from ..errors import ForgetkitError
from ..fusion.knowledge import FitState
from .chunks import chunk_tasks


def active_client():
    """The active dask.distributed Client; a ForgetkitError saying how to start one if none."""
    from distributed import get_client

    try:
        return get_client()
    except ValueError:
        raise ForgetkitError("Knowledge Fusion on a run on a dask array runs on a "
                             "dask.distributed cluster: start a Client first "
                             "(distributed.Client(...) or distributed.LocalCluster)") from None


def _counts(state):
    return state.missed, state.n_correct, state.n_final_correct


def _missed(state):
    return state.missed


def _grid_counts(state, window, grid):
    return state.grid_counts(window, grid)


def _mix(state, n_mixed, window, eps):
    if state.n_mixed == n_mixed:  # not mixed yet (a task run twice finds it mixed)
        state.mix(window, eps)
    return state


class ChunkedFitState:
    """`FitState`'s interface over the chunks of a run on a dask array: one FitState per
    chunk on the workers of the active Client, the counts summed here."""

    def __init__(self, run):
        self.client = active_client()
        tasks, _ = chunk_tasks(run, FitState)
        self.states = self.client.compute(tasks)
        parts = self._gather(_counts)
        self.missed = sum(p[0] for p in parts)
        self.n_correct = sum(p[1] for p in parts)
        self.n_final_correct = sum(p[2] for p in parts)
        self.n_mixed = 0

    def _gather(self, fn, *args):
        """``fn(state, *args)`` of every chunk's state, in chunk order."""
        return self.client.gather([self.client.submit(fn, state, *args)
                                   for state in self.states])

    def grid_counts(self, window, grid):
        return sum(self._gather(_grid_counts, window, grid))

    def mix(self, window, eps):
        self.states = [self.client.submit(_mix, state, self.n_mixed, window, eps)
                       for state in self.states]
        self.n_mixed += 1
        self.missed = sum(self._gather(_missed))
