"""Forgetting analysis (paper section 3): F_e, L_e, per-sample dynamics, double descent.

All functions take a `Run`. The one pass over the outputs (`Run.predictions`) is a numba
kernel that reads float16/32/64 directly, streams the run in chunks of epochs and is kept on
the Run, so calling several functions on one run reads the data once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ..errors import ForgetkitError


def predictions(run, *, progress=False):
    """Predicted class (argmax over classes, ties to the lowest index) at every epoch:
    int32 (n_epochs, n_samples), computed once per run by `Run.predictions`."""
    return run.predictions(progress=progress)


def correctness(run, *, progress=False):
    """Whether each sample is classified correctly at each epoch: bool (n_epochs, n_samples)."""
    return run.correctness(progress=progress)


def accuracy(run):
    """Accuracy a_e at every epoch: float64 (n_epochs,)."""
    return correctness(run).mean(axis=1)


def forget_fraction(run):
    """Forget fraction F_e: share of samples correct at e but wrong at the final epoch. (E,)"""
    correct = correctness(run)
    return (correct & ~correct[-1]).mean(axis=1)


def learn_fraction(run):
    """Learn fraction L_e: share of samples wrong at e but correct at the final epoch. (E,)"""
    correct = correctness(run)
    return (~correct & correct[-1]).mean(axis=1)


def sample_dynamics(run):
    """Per-sample learning/forgetting statistics.

    Returns
    -------
    pandas.DataFrame, one row per sample (index: sample ids, or positions), columns:
        label, correct_final, first_correct / last_correct (epoch numbers, <NA> if never
        correct), epochs_correct, forgetting_events (correct at one stored epoch, wrong at the
        next), forgotten (ever correct but wrong at the final epoch) and forget_epoch (the
        first stored epoch after the last correct one, for forgotten samples).
    """
    correct = correctness(run)
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


def double_descent(run, *, min_drop=0.01, smooth=None):
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
    if min_drop <= 0:
        raise ForgetkitError(f"min_drop must be > 0; got {min_drop}")
    correct = correctness(run)
    acc = correct.mean(axis=1)
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
    at_peak = correct[peak]
    lost = at_peak & ~correct[dip]
    return DoubleDescent(
        found=True,
        peak_epoch=int(run.epochs[peak]),
        dip_epoch=int(run.epochs[dip]),
        second_peak_epoch=int(run.epochs[second]),
        peak_accuracy=float(acc[peak]),
        dip_accuracy=float(acc[dip]),
        second_peak_accuracy=float(acc[second]),
        learned_first_ascent=float(at_peak.mean()),
        forgotten_in_dip=float(lost.mean()),
        never_relearned=float((lost & ~correct[dip:].any(axis=0)).mean()),
        forgotten_at_end=float((at_peak & ~correct[-1]).mean()),
    )


def summary(run, *, progress=False):
    """The headline numbers of the forgetting analysis as a dict (what `forgetkit analyze`
    prints): final accuracy, max F_e and its epoch, share of samples ever forgotten, double
    descent phases."""
    correct = correctness(run, progress=progress)
    f = forget_fraction(run)
    e_max = int(np.argmax(f))
    forgotten = correct.any(axis=0) & ~correct[-1]
    return {
        "n_epochs": run.n_epochs,
        "n_samples": run.n_samples,
        "n_classes": run.n_classes,
        "final_accuracy": float(correct[-1].mean()),
        "best_accuracy": float(correct.mean(axis=1).max()),
        "best_epoch": int(run.epochs[int(np.argmax(correct.mean(axis=1)))]),
        "max_forget_fraction": float(f[e_max]),
        "max_forget_epoch": int(run.epochs[e_max]),
        "ever_forgotten": float(forgotten.mean()),
        "double_descent": double_descent(run).as_dict(),
    }
