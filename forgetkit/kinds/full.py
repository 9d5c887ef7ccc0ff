"""Full outputs: every class's value per (epoch, sample), as logits or as probabilities.

A run of kind "logits" or "probs" stores an (E, N, C) float16, float32 or float64 array
(in memory, memory-mapped, decoded on demand or chunked on dask; its backend reads it). It
answers everything exactly: predictions (the argmax, ties to the lowest index),
correctness, every class's probability (the softmax of logits, forgetkit's kernels), the
label's probability and margin, and (logits) its summary.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..errors import ForgetkitError
from ..probs import softmax
from .base import SUMMARY_DTYPE, Kind, register_kind
from .summary import epoch_chunks, label_margins_of, summarize_outputs

#: How far from 1 the row sums of a "probs" run may be.
PROBS_TOLERANCE = 1e-3


def subset_rows(run):
    """`Backend.stored_rows` of a run whose outputs are a sample subset of a stored array (a
    lazy subset of a memmap), else None."""
    stored = run.backend.stored_rows()
    return stored if stored is not None and stored[0] is not run.outputs else None


class FullKind(Kind):
    """Every class's value per (epoch, sample): logits (``softmax`` True) or probabilities.

    Parameters
    ----------
    name : str
    softmax : bool
        Whether the values are logits (probabilities are their softmax).
    """

    full = True

    def __init__(self, name, *, softmax):
        self.name, self.softmax, self.logit_margins = name, softmax, softmax
        self.holds = f"this run holds every class's {'logits' if softmax else 'probabilities'}"

    def check_values(self, run, index, values):
        if not np.all(np.isfinite(values)):
            raise ForgetkitError(f"{run.where}outputs contain NaN or inf at epoch index {index} "
                                 f"(epoch {run.epochs[index]})")
        if not self.softmax:
            sums = values.sum(axis=-1, dtype=np.float64)
            bad = np.abs(sums - 1.0) > PROBS_TOLERANCE
            neg = (values < 0).any(axis=-1)
            if bad.any() or neg.any():
                n = int(np.argmax(bad | neg))
                raise ForgetkitError(
                    f'{run.where}kind="probs" but sample {n} at epoch index {index} '
                    f"(epoch {run.epochs[index]}) is not a probability vector "
                    f"(sum {sums[n]:.6g}, tolerance {PROBS_TOLERANCE})")

    def stored_values(self, run, index):
        """The stored values of epoch ``index`` (N, C), checked if ``run`` checks per
        read."""
        values = run.backend.read(index)
        if run.checked_per_read:
            self.check_values(run, index, values)
        return values

    def predictions(self, run, *, progress=False):
        """The argmax over classes of every epoch, streamed in chunks of epochs (a lazy
        sample subset of a memmap read in place by the parallel kernel): int32 (E, N)."""
        from .._progress import Progress

        n_epochs, n_samples, n_classes = run.shape
        out = np.empty((n_epochs, n_samples), dtype=np.int32)
        bar = Progress(n_epochs, "forgetting pass", enabled=progress)
        checked = not self.softmax and run.checked_per_read  # rows must sum to 1 too
        stored = None if checked else subset_rows(run)
        # values read in place take no memory per chunk: one call, unless a bar shows chunks
        in_place = not checked and run.backend.stored_rows() is not None
        chunks = ([(0, n_epochs)] if in_place and not progress
                  else epoch_chunks(n_epochs, n_samples * n_classes * run.outputs.itemsize))
        for start, stop in chunks:
            if stored is not None:
                kernels.argmax_rows_at(stored[0][start:stop], stored[1], out[start:stop],
                                       order=run.backend.stored_order())
            else:
                chunk = run.backend.read(slice(start, stop))
                kernels.argmax_rows(chunk.reshape(-1, n_classes), out[start:stop].reshape(-1))
            bad = (out[start:stop] < 0).any(axis=1)
            if bad.any():
                e = start + int(np.argmax(bad))
                raise ForgetkitError(f"{run.where}outputs contain NaN or inf at epoch index "
                                     f"{e} (epoch {run.epochs[e]})")
            if checked:
                for i, values in enumerate(chunk):
                    self.check_values(run, start + i, values)
            bar.update(stop - start)
        return out

    def label_probs(self, run, epochs=None):
        """The label's probability of every epoch, one epoch at a time; logits read in place
        without storing any epoch's probabilities: float64 (E, N)."""
        idx = range(run.n_epochs)[epochs or slice(None)]
        q = np.empty((len(idx), run.n_samples))
        rows = np.arange(run.n_samples)
        if not self.softmax:
            tmp = np.empty((run.n_samples, run.n_classes))
            for i, e in enumerate(idx):
                q[i] = self.epoch_probs(run, e, tmp)[rows, run.labels]
            return q
        stored = run.backend.stored_rows()
        for i, e in enumerate(idx):
            if stored is not None:
                values, src = stored[0][e], stored[1]
            else:
                values, src = run.backend.read(e), rows
            if kernels.label_probs(values, src, run.labels, q[i]):
                self.epoch_probs(run, e, np.empty((run.n_samples, run.n_classes)))  # names it
        return q

    def label_margins(self, run, epochs=None):
        """label value minus the largest other, one epoch at a time: float64 (E, N)."""
        idx = range(run.n_epochs)[epochs or slice(None)]
        out = np.empty((len(idx), run.n_samples))
        for i, e in enumerate(idx):
            out[i] = label_margins_of(self.stored_values(run, e), run.labels)
        return out

    def summary(self, run, epochs=None):
        if not self.softmax:
            raise ForgetkitError("summarize needs logits (the summary holds logits and their "
                                 "log-sum-exp); got a run of probabilities")
        idx = range(run.n_epochs)[epochs or slice(None)]
        out = np.empty((len(idx), run.n_samples), dtype=SUMMARY_DTYPE)
        for i, e in enumerate(idx):
            summarize_outputs(self.stored_values(run, e), run.labels, out=out[i])
        return out

    def epoch_probs(self, run, e, out):
        """The probabilities of epoch index ``e`` into ``out`` (N, C): the softmax of logits
        (rows of a lazy subset read in place) or the stored probabilities."""
        stored = subset_rows(run)
        if self.softmax and stored is not None and out.dtype == np.float64:
            # rows read in place (the same bits as softmax_rows); a bad row takes the path
            # below, which names the epoch
            if not kernels.combine_softmax(stored[0], [e], stored[1], out,
                                           order=run.backend.stored_order()):
                return out
        values = run.backend.read(e)
        if not self.softmax:
            if run.checked_per_read:
                self.check_values(run, e, values)
            out[...] = values
            return out
        target = out if out.dtype == np.float64 else np.empty(out.shape)
        try:
            softmax(values, out=target)
        except ValueError:
            self.check_values(run, e, values)  # names the epoch
            raise
        if target is not out:
            out[...] = target
        return out


LOGITS = register_kind(FullKind("logits", softmax=True))
PROBS = register_kind(FullKind("probs", softmax=False))
