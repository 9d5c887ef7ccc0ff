"""Forgetting analysis (paper section 3): F_e, L_e, per-sample dynamics, double descent.

All functions take a `Run`. The one pass over the outputs (`Run.predictions`) is a numba
kernel that reads float16/32/64 directly, streams the run in chunks of epochs and is kept on
the Run, so calling several functions on one run reads the data once. Every function is a
map-reduce over the run's chunks of samples on its executor
(``forgetkit.execution.executor_for(run).map_reduce``: per-epoch counts summed, per-sample
rows concatenated), with the same results on every executor.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
import pandas as pd

from .._validation import check_bool, check_int, check_number
from ..errors import ForgetkitError
from ..execution import executor_for
from ..run import check_run

#: Predictions (epochs x samples) from which the F_e/L_e counts are taken in threads.
THREADED_COUNTS = 1 << 24


def predictions(run, *, progress=False):
    """Predicted class (argmax over classes, ties to the lowest index) at every epoch:
    int32 (n_epochs, n_samples), computed once per run by `Run.predictions`."""
    check_run("run", run)
    check_bool("progress", progress)
    return run.predictions(progress=progress)


def correctness(run, *, progress=False):
    """Whether each sample is classified correctly at each epoch: bool (n_epochs, n_samples)."""
    check_run("run", run)
    check_bool("progress", progress)
    return run.correctness(progress=progress)


def _epoch_counts(run, progress=False):
    """Counts of one run (or chunk of samples): int64 (3, n_epochs) of the samples correct at
    e, forgotten (correct at e, wrong at the final epoch) and learned (wrong at e, correct at
    the final epoch); and the number of samples ever correct but wrong at the final epoch.
    Counted epoch by epoch from the predictions (`correctness` row by row, into two rows
    of scratch: no (E, N) array beside the predictions), in threads over the epochs of a
    large run (the comparisons release the GIL)."""
    pred = predictions(run, progress=progress)
    labels = run.labels.astype(pred.dtype)  # as Run.correctness compares
    final = pred[-1] == labels
    counts = np.empty((3, pred.shape[0]), dtype=np.int64)

    def part(epochs):
        ever, correct, scratch = final.copy(), np.empty_like(final), np.empty_like(final)
        for e in epochs:
            np.equal(pred[e], labels, out=correct)
            counts[0, e] = np.count_nonzero(correct)
            counts[1, e] = np.count_nonzero(np.greater(correct, final, out=scratch))  # & ~final
            counts[2, e] = np.count_nonzero(np.less(correct, final, out=scratch))  # ~correct &
            np.logical_or(ever, correct, out=ever)
        return ever

    n = 1 if pred.size < THREADED_COUNTS else max(1, min(os.cpu_count() or 1, len(pred)))
    if n == 1:
        ever = part(range(len(pred)))
    else:
        with ThreadPoolExecutor(n) as pool:
            ever = np.logical_or.reduce(list(pool.map(part, np.array_split(range(len(pred)),
                                                                            n))))
    return counts, int(np.count_nonzero(ever & ~final))


def epoch_counts(run, *, progress=False):
    """Per-epoch counts (correct, forgotten, learned): int64 (3, n_epochs), and the number of
    samples ever correct but wrong at the final epoch; summed over the chunks of a run on a
    dask array. Each fraction below is one of these counts divided by n_samples (the same
    bits as the mean of the boolean matrix). ``progress``: show the forgetting pass's
    progress on a terminal (the pass is kept on the run; later calls do not read again)."""
    check_run("run", run)
    check_bool("progress", progress)
    # the one pass (kept on a run held here), with progress on every executor
    return executor_for(run).map_reduce(run, _epoch_counts, progress=progress,
                                        desc="forgetting pass")


def accuracy(run, *, progress=False):
    """Accuracy a_e at every epoch: float64 (n_epochs,)."""
    return epoch_counts(run, progress=progress)[0][0] / run.n_samples


def forget_fraction(run, *, progress=False):
    """Forget fraction F_e: share of samples correct at e but wrong at the final epoch. (E,)"""
    check_run("run", run)
    check_bool("progress", progress)
    return epoch_counts(run, progress=progress)[0][1] / run.n_samples


def learn_fraction(run, *, progress=False):
    """Learn fraction L_e: share of samples wrong at e but correct at the final epoch. (E,)"""
    check_run("run", run)
    check_bool("progress", progress)
    return epoch_counts(run, progress=progress)[0][2] / run.n_samples


def sample_dynamics(run, *, progress=False):
    """Per-sample learning/forgetting statistics.

    Returns
    -------
    pandas.DataFrame, one row per sample (index: sample ids, or positions), columns:
        label, correct_final, first_correct / last_correct (epoch numbers, <NA> if never
        correct), epochs_correct, forgetting_events (correct at one stored epoch, wrong at the
        next), forgotten (ever correct but wrong at the final epoch) and forget_epoch (the
        first stored epoch after the last correct one, for forgotten samples).
    """
    check_run("run", run)
    check_bool("progress", progress)
    return executor_for(run).map_reduce(run, _sample_dynamics, progress=progress,
                                        desc="forgetting pass")


def _sample_dynamics(run, progress=False):
    correct = correctness(run, progress=progress)
    n_epochs = correct.shape[0]
    ever = correct.any(axis=0)
    first = np.argmax(correct, axis=0)
    last = n_epochs - 1 - np.argmax(correct[::-1], axis=0)
    forgotten = ever & ~correct[-1]
    events = (correct[:-1] & ~correct[1:]).sum(axis=0)
    epochs = run.epochs

    def epoch_numbers(index, known):
        values = epochs[np.clip(index, 0, n_epochs - 1)]
        return pd.arrays.IntegerArray(values.astype(np.int64), ~known)

    index = run.sample_ids if run.sample_ids is not None else np.arange(run.n_samples)
    return pd.DataFrame(
        {
            "label": run.labels,
            "correct_final": correct[-1],
            "first_correct": epoch_numbers(first, ever),
            "last_correct": epoch_numbers(last, ever),
            "epochs_correct": correct.sum(axis=0),
            "forgetting_events": events,
            "forgotten": forgotten,
            "forget_epoch": epoch_numbers(last + 1, forgotten),
        },
        index=pd.Index(index, name="sample"),
    )


@dataclass
class DoubleDescent:
    """Epoch-wise double descent of test accuracy (paper Fig. 2a-b).

    Epoch fields are epoch *numbers*; None when the phase does not exist. Fractions are over
    all samples: ``learned_first_ascent`` correct at the peak; ``forgotten_in_dip`` correct at
    the peak and wrong at the dip; ``never_relearned`` of those, wrong at every epoch from the
    dip to the end; ``forgotten_at_end`` correct at the peak and wrong at the final epoch.
    """

    found: bool
    peak_epoch: int | None = None
    dip_epoch: int | None = None
    second_peak_epoch: int | None = None
    peak_accuracy: float | None = None
    dip_accuracy: float | None = None
    second_peak_accuracy: float | None = None
    learned_first_ascent: float | None = None
    forgotten_in_dip: float | None = None
    never_relearned: float | None = None
    forgotten_at_end: float | None = None

    def as_dict(self):
        return asdict(self)


def _moving_average(x, width):
    """Centred moving average of odd ``width`` with edge padding."""
    if width % 2 == 0:
        raise ForgetkitError(f"smooth must be odd (a centred window); got {width}")
    if width <= 1:
        return x.astype(np.float64)
    pad = width // 2
    padded = np.pad(x.astype(np.float64), pad, mode="edge")
    return np.convolve(padded, np.ones(width) / width, mode="valid")[: len(x)]


def double_descent(run, *, min_drop=0.01, smooth=None, progress=False):
    """Find the first peak, the dip and the second ascent of the accuracy curve.

    On the accuracy curve smoothed by a centred moving average of ``smooth`` stored epochs
    (default: max(3, n_epochs // 10), made odd so the average stays centred; this keeps
    epoch-to-epoch SGD noise from being taken for a dip):
    the peak is the running maximum at the first epoch where the curve has fallen at least
    ``min_drop`` below it; the dip is the minimum after the peak; the second ascent exists when
    the curve later climbs at least ``min_drop`` above the dip (its peak: the maximum after the
    dip). Fractions use the raw (unsmoothed) correctness at those epochs.

    Returns
    -------
    DoubleDescent
    """
    check_run("run", run)
    check_bool("progress", progress)
    check_int("smooth", smooth, minimum=1, allow_none=True)
    if check_number("min_drop", min_drop) <= 0:
        raise ForgetkitError(f"min_drop must be > 0; got {min_drop}")
    return _double_descent(run, accuracy(run, progress=progress), min_drop=min_drop,
                           smooth=smooth)


def _descent_counts(run, *, peak, dip):
    """Samples correct at ``peak``, of those wrong at ``dip``, of those wrong at every epoch
    from ``dip`` to the end, and correct at ``peak`` but wrong at the end: int64 (4,)."""
    correct = correctness(run)
    at_peak = correct[peak]
    lost = at_peak & ~correct[dip]
    return np.array([at_peak.sum(), lost.sum(), (lost & ~correct[dip:].any(axis=0)).sum(),
                     (at_peak & ~correct[-1]).sum()], dtype=np.int64)


def _double_descent(run, acc, *, min_drop=0.01, smooth=None):
    """`double_descent` of a run whose accuracy curve ``acc`` (n_epochs,) is known."""
    smooth = (max(3, run.n_epochs // 10) | 1) if smooth is None else int(smooth)
    curve = _moving_average(acc, smooth)
    running_max = np.maximum.accumulate(curve)
    fallen = np.flatnonzero(curve <= running_max - min_drop)
    if fallen.size == 0:
        return DoubleDescent(found=False)
    peak = int(np.argmax(curve[: fallen[0] + 1]))
    dip = peak + int(np.argmin(curve[peak:]))
    after = curve[dip:]
    if dip == len(curve) - 1 or after.max() < curve[dip] + min_drop:
        return DoubleDescent(found=False, peak_epoch=int(run.epochs[peak]),
                             peak_accuracy=float(acc[peak]))
    second = dip + int(np.argmax(after))
    shares = executor_for(run).map_reduce(run, partial(_descent_counts, peak=peak, dip=dip)) \
        / run.n_samples
    return DoubleDescent(
        found=True,
        peak_epoch=int(run.epochs[peak]),
        dip_epoch=int(run.epochs[dip]),
        second_peak_epoch=int(run.epochs[second]),
        peak_accuracy=float(acc[peak]),
        dip_accuracy=float(acc[dip]),
        second_peak_accuracy=float(acc[second]),
        learned_first_ascent=float(shares[0]),
        forgotten_in_dip=float(shares[1]),
        never_relearned=float(shares[2]),
        forgotten_at_end=float(shares[3]),
    )


def summary(run, *, progress=False):
    """The headline numbers of the forgetting analysis as a dict (what `forgetkit analyze`
    prints): final accuracy, max F_e and its epoch, share of samples ever forgotten, double
    descent phases."""
    counts, ever_forgotten = epoch_counts(run, progress=progress)
    acc, f = counts[0] / run.n_samples, counts[1] / run.n_samples
    e_max = int(np.argmax(f))
    return {
        "n_epochs": run.n_epochs,
        "n_samples": run.n_samples,
        "n_classes": run.n_classes,
        "final_accuracy": float(acc[-1]),
        "best_accuracy": float(acc.max()),
        "best_epoch": int(run.epochs[int(np.argmax(acc))]),
        "max_forget_fraction": float(f[e_max]),
        "max_forget_epoch": int(run.epochs[e_max]),
        "ever_forgotten": ever_forgotten / run.n_samples,
        "double_descent": _double_descent(run, acc).as_dict(),
    }
