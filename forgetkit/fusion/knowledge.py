"""Knowledge Fusion (paper section 5, Algorithm 1): mix the checkpoints that hold forgotten
knowledge into the final model, with weights chosen on validation data.

The algorithm, step by step, is in docs/definitions.md ("Knowledge Fusion").
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from .._deprecation import keyword_options
from .._progress import Progress
from .._validation import check_bool, check_int, check_option
from ..errors import ForgetkitError
from ..execution import LocalParts, executor_for
from ..kinds import kind_of
from . import topk
from .base import Fuser, as_run, check_validation_run
from .fitstate import REL_BAND, ChunkedFitState, FullFitChunk, best_continuous_eps  # noqa: F401
from .schema import check_checkpoints, check_weights_present

RULES = ("best", "paper")
#: Most points of the eps grid: a step of 1e-6 (the exact search, grid=None, is finer still).
MAX_GRID = 1_000_001


class KnowledgeFusion(Fuser):
    """Knowledge Fusion: mix forgotten-knowledge checkpoints into the final model.

    Parameters
    ----------
    window : int, default 1
        Each step averages epochs a-window..a+window (clipped) around the chosen epoch a.
    grid : int or None, default 101
        Number of eps points in numpy.arange(grid) / (grid - 1); None searches the exact best
        eps over the continuous interval [0, 1].
    rule : {"best", "paper"}
        "best": eps of highest validation accuracy (ties: the smallest eps); "paper": the
        largest eps whose accuracy is >= the current accuracy.
    max_windows : int or None
        Budget of windows with eps > 0 (KF(i) is max_windows=i; None is KF(inf)).
    max_checkpoints : int or None
        The ensemble budget every fuser takes: stop before a window with eps > 0 that would
        make the fusion need more than this many checkpoints at inference.
    stop_when_no_gain : bool
        Stop at the first step whose best accuracy does not exceed the current one (that step
        is not added to the plan).
    progress : bool, default False
        Show the fit's progress (epochs explored / total) on a terminal. A constructor
        option like every fuser option (``fit`` takes data only, scikit-learn's rule).

    Every parameter is keyword-only.

    On a top-k token run the fit counts certified tokens (docs/definitions.md, "Certified
    fusion on top-k runs"): F'_e counts the tokens correct at epoch e (exact) and not
    certified correct under the current fusion, and the eps search (exact on these counts,
    grid or continuous) maximises the number of certified correct tokens; uncertain tokens
    count as wrong, so the fit maximises the lower end of the accuracy interval.
    ``val_accuracy_`` are then certified accuracies; `certified_accuracy` gives the whole
    interval. With k equal to the vocabulary the plan is the full-vocabulary run's.

    Attributes
    ----------
    plan_ : list of (epoch_index, eps)
    checkpoints_ : list of int, sorted epoch indices needed at inference
    val_accuracy_ : list of float, validation accuracy after each step
    initial_accuracy_ : float, validation accuracy of the final epoch alone
    epochs_ : ndarray, the epoch numbers of the fitted run
    weights_ : None (the plan, not fixed weights, says how checkpoints combine)
    """

    _state = ("plan", "val_accuracy", "initial_accuracy")
    _what = "Knowledge Fusion plan"

    @keyword_options
    def __init__(self, *, window=1, grid=101, rule="best", max_windows=None,
                 max_checkpoints=None, stop_when_no_gain=False, progress=False):
        self.window = window
        self.grid = grid
        self.rule = rule
        self.max_windows = max_windows
        self.max_checkpoints = max_checkpoints
        self.stop_when_no_gain = stop_when_no_gain
        self.progress = progress

    def _grid_points(self):
        if self.grid is None:
            return None
        n = check_int("grid", self.grid, minimum=2, maximum=MAX_GRID)
        return np.arange(n) / (n - 1)

    def _check_params(self):
        check_int("window", self.window, minimum=0)
        check_option("rule", self.rule, RULES)
        check_int("max_windows", self.max_windows, minimum=1, allow_none=True)
        check_int("max_checkpoints", self.max_checkpoints, minimum=1, allow_none=True)
        check_bool("stop_when_no_gain", self.stop_when_no_gain)
        check_bool("progress", self.progress)
        self._grid_points()

    def _window(self, a, n_epochs):
        return range(max(a - self.window, 0), min(a + self.window, n_epochs - 1) + 1)

    def fit(self, run, labels=None):
        """Fit the plan on validation data: a Run, or outputs (E, N, C) and labels (N,)."""
        run = as_run(run, labels)
        self._check_params()
        grid = self._grid_points()
        check_validation_run(run)
        n_epochs = run.n_epochs
        state = _fit_state(run, grid)
        needed = {n_epochs - 1}  # checkpoints of the plan so far
        explore = np.ones(n_epochs, dtype=bool)
        n_correct, left = state.n_correct, n_epochs
        plan, accs, used = [], [], 0
        bar = Progress(n_epochs, "knowledge fusion", enabled=self.progress)
        while left and (self.max_windows is None or used < self.max_windows):
            # ties: the earliest epoch
            a = int(np.argmax(np.where(explore, state.missed, -1)))
            window = self._window(a, n_epochs)
            explore[window.start: window.stop] = False
            before, left = left, int(explore.sum())
            bar.update(before - left)
            eps, count = self._choose_eps(state, window, grid, n_correct)
            if self.stop_when_no_gain and count <= n_correct:
                break
            if eps > 0 and self.max_checkpoints is not None \
                    and len(needed.union(window)) > self.max_checkpoints:
                break
            plan.append((a, float(eps)))
            if eps > 0:
                needed.update(window)
                state.mix(window, eps)
                used += 1
            n_correct = count  # the eps search's counts are exact: cur.sum() == count
            accs.append(n_correct / run.n_samples)
        self._fit_shape(run, sorted(needed))
        self.plan_ = plan
        self.val_accuracy_ = accs
        self.initial_accuracy_ = state.n_final_correct / run.n_samples
        return self

    def _checkpoints(self, plan):
        """Epoch indices needed to apply ``plan``: the final one and every used window."""
        n_epochs = len(self.epochs_)
        needed = {n_epochs - 1}
        for a, eps in plan:
            if eps > 0:
                needed.update(self._window(a, n_epochs))
        return sorted(needed)

    def with_windows(self, n_windows):
        """The fitted KF(n_windows): this plan cut after its n-th window with eps > 0.

        KnowledgeFusion(max_windows=n) fitted on the same data gives exactly this plan, so
        one KF(inf) fit yields every KF(i) (the ensemble-size curve).
        """
        self._check_fitted()
        check_int("n_windows", n_windows, minimum=0)
        used = [i for i, (_, eps) in enumerate(self.plan_) if eps > 0]
        cut = 0 if n_windows == 0 else (used[n_windows - 1] + 1 if n_windows <= len(used)
                                        else len(self.plan_))
        new = type(self)(**self.get_params()).set_params(max_windows=n_windows or None)
        new.epochs_, new.n_classes_, new.kind_ = self.epochs_, self.n_classes_, self.kind_
        new.initial_accuracy_ = self.initial_accuracy_
        new.plan_, new.val_accuracy_ = self.plan_[:cut], self.val_accuracy_[:cut]
        new.checkpoints_, new.weights_ = new._checkpoints(new.plan_), None
        return new

    def _choose_eps(self, state, window, grid, base):
        """(eps, number correct) of mixing the mean of ``window`` into the current fusion
        of ``state``, chosen by the rule; ``base`` = number correct at eps=0."""
        if grid is None:
            return state.continuous_eps(window, self.rule, base)
        counts = state.grid_counts(window, grid)
        if self.rule == "best":
            i = int(np.argmax(counts))
        else:
            i = int(np.flatnonzero(counts >= base).max())
        return grid[i], int(counts[i])

    def _predict_proba(self, run):
        *_, prob = self._stages(run)  # every stage is the same array
        return prob

    def recipe(self, run):
        """`Fuser.recipe`: the final epoch, then each window with eps > 0 mixed in."""
        self._check_fitted()
        n_epochs = len(self.epochs_)
        pos = dict(zip(self.checkpoints_, self._positions(run, self.checkpoints_), strict=True))
        steps = [(kernels.MEAN, [pos[n_epochs - 1]], None)]
        steps += [(kernels.MIX, [pos[e] for e in self._window(a, n_epochs)], float(eps))
                  for a, eps in self.plan_ if eps > 0]
        return steps

    def staged_predict_proba(self, run):
        """Yield the fused probabilities (n_samples, n_classes) of KF(0) (the final epoch
        alone), KF(1), KF(2), ...: one stage after each window with eps > 0, in one pass.
        Each stage is a new array; on a run on a dask array, a lazy dask array
        (``with_windows(i).predict_proba(run)``, computed on the workers)."""
        self._check_fitted()
        self._as_input(run)  # checked here, not at the first stage
        return self._staged_predict_proba(run)

    def _staged_predict_proba(self, run):
        if kind_of(self._as_input(run)).bounded:  # exact only where the bounds are (else raises)
            for i in range(1 + sum(eps > 0 for _, eps in self.plan_)):
                yield self.with_windows(i).predict_proba(run)
            return
        if executor_for(self._as_input(run)).lazy:
            for i in range(1 + sum(eps > 0 for _, eps in self.plan_)):
                yield self.with_windows(i).predict_proba(run)
            return
        for prob in self._stages(run):
            yield prob.copy()

    def _stages(self, run):
        """The stages of `staged_predict_proba` as one array updated in place (a run held
        in memory or on disk)."""
        self._check_fitted()
        run = self._as_input(run)
        n_epochs = len(self.epochs_)
        pos = dict(zip(self.checkpoints_, self._positions(run, self.checkpoints_), strict=True))
        prob = run.probs(pos[n_epochs - 1])
        mean = np.empty_like(prob)
        yield prob
        for a, eps in self.plan_:
            if eps > 0:
                run.mean_probs([pos[e] for e in self._window(a, n_epochs)], out=mean)
                kernels.mix(mean, prob, eps)
                yield prob

    # -------------------------------------------------------------- persistence
    def _state_record(self):
        return {
            "plan": [{"epoch_index": int(a), "epoch": int(self.epochs_[a]), "eps": float(eps)}
                     for a, eps in self.plan_],
            "val_accuracy": [float(x) for x in self.val_accuracy_],
            "initial_accuracy": float(self.initial_accuracy_),
        }

    def _read_state(self, fields):
        n_epochs = len(self.epochs_)
        steps = fields.list(fields.get("plan"), "plan")
        if len(steps) > n_epochs:  # each step removes its epoch from those explored
            fields.fail("the length of plan", f"at most {n_epochs} (the epochs)", len(steps))
        plan = []
        for i, step in enumerate(steps):
            a = fields.epoch_ref(step, f"plan[{i}]", self.epochs_)
            plan.append((a, fields.number(step.get("eps"), f"plan[{i}].eps", 0.0, 1.0)))
        accs = fields.list(fields.get("val_accuracy"), "val_accuracy", length=len(plan))
        self.val_accuracy_ = [fields.number(x, f"val_accuracy[{i}]", 0.0, 1.0)
                              for i, x in enumerate(accs)]
        self.initial_accuracy_ = fields.number(fields.get("initial_accuracy"),
                                               "initial_accuracy", 0.0, 1.0)
        self.plan_ = plan
        check_weights_present(self, fields, needed=False)
        check_checkpoints(self, fields, self._checkpoints(plan),
                          f"the final epoch and the windows (window={self.window}) of the "
                          "plan's steps with eps > 0")


def _fit_state(run, grid):
    """The fit's `ChunkedFitState` of ``run``: chunks of its certified bounds where its kind
    is bounded (a top-k run; on the workers where its records are a dask array), else the
    `FullFitChunk` of each chunk of samples on the run's executor."""
    kind = kind_of(run)
    executor = executor_for(run)
    if kind.bounded:
        data = kind.certified_bounds(run)
        if executor.lazy:  # each chunk's state on the workers
            return data.fit_state(grid)
        rows = data.chunks(max(data.n_tokens, 1) if grid is None else topk.FIT_CHUNK_TOKENS)
        return ChunkedFitState(LocalParts([topk.TopKFitChunk(data, r, settle=grid is not None)
                                           for r in rows]))
    if grid is None and not executor.whole(run):
        raise ForgetkitError("grid=None (the continuous eps search) needs a run held in memory "
                             "or on disk, read as one chunk; on a run on a dask array pass an "
                             "eps grid (e.g. grid=101)")
    return ChunkedFitState(executor.persist(run, FullFitChunk))
