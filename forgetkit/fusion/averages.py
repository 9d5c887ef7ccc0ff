"""Fixed checkpoint averages and early stopping: the baselines Knowledge Fusion is compared
with (paper section 5 and App. C).

The averages are plain functions returning fused probabilities (n_samples, n_classes); every
baseline is also a fuser (fit on validation data, predict_proba on any run with the same
epochs) so that `forgetkit.compare` treats all methods alike.
"""

from __future__ import annotations

import numpy as np

from .._deprecation import keyword_options
from .._validation import check_array, check_int, check_option
from ..errors import ForgetkitError, PlanError
from ..run import check_run, check_runs
from .base import Fuser, as_run, check_validation_run
from .schema import check_checkpoints, check_weights_present

FIXED = ("single", "horizontal", "fixed_jumps", "uniform")


def fixed_epochs(n_epochs, select, k=1):
    """Epoch indices of a fixed average.

    "single": [E-1]; "horizontal": the last k epochs; "fixed_jumps": k epochs spaced
    E // k apart, ending at E-1; "uniform": all epochs.
    """
    check_option("select", select, FIXED)
    k = check_int("max_checkpoints", k, minimum=1)
    if select in ("horizontal", "fixed_jumps") and k > n_epochs:
        raise ForgetkitError(f"max_checkpoints={k} exceeds the {n_epochs} stored epochs")
    if select == "single":
        return [n_epochs - 1]
    if select == "horizontal":
        return list(range(n_epochs - k, n_epochs))
    if select == "fixed_jumps":
        step = max(1, n_epochs // k)
        return sorted(n_epochs - 1 - step * j for j in range(k))
    return list(range(n_epochs))


def single(run):
    """Probabilities of the final epoch (the single network)."""
    check_run("run", run)
    return run.mean_probs(fixed_epochs(run.n_epochs, "single"))


def horizontal(run, k):
    """Mean probabilities of the last k epochs (horizontal ensemble)."""
    check_run("run", run)
    return run.mean_probs(fixed_epochs(run.n_epochs, "horizontal", k))


def fixed_jumps(run, k):
    """Mean probabilities of k epochs equally spaced over training, ending at the last."""
    check_run("run", run)
    return run.mean_probs(fixed_epochs(run.n_epochs, "fixed_jumps", k))


def uniform(run):
    """Mean probabilities of all stored epochs."""
    check_run("run", run)
    return run.mean_probs(range(run.n_epochs))


def snapshot(run, cycle_ends):
    """Mean probabilities at the cycle-end epochs (epoch *numbers*) of a cyclic schedule."""
    check_run("run", run)
    ends = check_array("cycle_ends", cycle_ends, kinds="iu").reshape(-1)
    if ends.size == 0:
        raise ForgetkitError("cycle_ends must list at least one stored epoch number")
    return run.mean_probs(run.epoch_positions(ends))


def multi_run(runs):
    """Mean final-epoch probabilities of independently trained runs on the same samples."""
    runs = check_runs("runs", runs)
    check_same_samples(runs)
    total = single(runs[0])
    for r in runs[1:]:
        total += single(r)
    return total / len(runs)


def average_runs(runs):
    """Test-time augmentation: a probabilities Run averaging, epoch by epoch, runs that hold
    the same samples and epochs under different augmentations. Fit KF on it as on any run."""
    runs = check_runs("runs", runs)
    check_same_samples(runs)
    first = runs[0]
    for r in runs[1:]:
        if not np.array_equal(r.epochs, first.epochs):
            raise ForgetkitError("runs to average must hold the same epochs")
    out = np.empty(first.shape, dtype=np.float64)
    for e in range(first.n_epochs):
        out[e] = first.probs(e)
        for r in runs[1:]:
            out[e] += r.probs(e)
        out[e] /= len(runs)
    return first.replace(outputs=out, kind="probs", validate=False,
                         meta=dict(first.meta, averaged_runs=len(runs)))


def check_same_samples(runs):
    """Refuse runs that do not hold the same samples (shape and labels), naming the first."""
    first = runs[0]
    for i, r in enumerate(runs[1:], 1):
        if r.n_samples != first.n_samples or r.n_classes != first.n_classes:
            raise ForgetkitError(f"run {i} has shape {r.shape[1:]} (samples, classes); run 0 has "
                                 f"{first.shape[1:]}")
        if not np.array_equal(r.labels, first.labels):
            raise ForgetkitError(f"run {i} has other labels than run 0: not the same samples")


class CheckpointAverage(Fuser):
    """A fixed average of epochs as a fuser: ``select`` in "single", "horizontal",
    "fixed_jumps", "uniform"; ``max_checkpoints`` (the ensemble budget k, keyword-only) is
    the number of epochs horizontal and fixed jumps average."""

    @keyword_options
    def __init__(self, select="single", *, max_checkpoints=1):
        self.select = select
        self.max_checkpoints = max_checkpoints

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        self._check_params()
        check_validation_run(run)
        self._fit_shape(run, fixed_epochs(run.n_epochs, self.select, self.max_checkpoints))
        return self

    def _check_params(self):
        check_option("select", self.select, FIXED)
        check_int("max_checkpoints", self.max_checkpoints, minimum=1)

    def _read_state(self, fields):
        n_epochs = len(self.epochs_)
        try:
            expected = fixed_epochs(n_epochs, self.select, self.max_checkpoints)
        except ForgetkitError as err:
            raise PlanError(f"{fields.where}: {err}") from None
        check_weights_present(self, fields, needed=False)
        check_checkpoints(self, fields, expected, f"select={self.select!r} with "
                          f"max_checkpoints={self.max_checkpoints} over {n_epochs} epochs")


class EarlyStopping(Fuser):
    """The epoch of best validation accuracy (ties: the earliest)."""

    _state = ("best_epoch_index",)

    def fit(self, run, labels=None):
        run = as_run(run, labels)
        check_validation_run(run)
        self.best_epoch_index_ = int(np.argmax(run.correctness().mean(axis=1)))
        self._fit_shape(run, [self.best_epoch_index_])
        return self

    def _read_state(self, fields):
        best = fields.integer(fields.get("best_epoch_index"), "best_epoch_index", 0,
                              len(self.epochs_) - 1)
        check_weights_present(self, fields, needed=False)
        check_checkpoints(self, fields, [best], "best_epoch_index alone")
        self.best_epoch_index_ = best
