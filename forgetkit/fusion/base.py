"""What every fuser shares: scikit-learn parameters, the fitted-state check, matching a
run's epochs, one ``predict_proba`` from checkpoints and weights, and one versioned JSON
format (`Fuser.to_json`, `load_fuser`).

A fuser is fitted on a validation run and applied to any run that holds the fitted epochs
(a test run, new data, or only the checkpoints it needs).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import numpy as np

from .. import kernels
from .._validation import check_array, check_path
from ..errors import ForgetkitError, InputTypeError, MissingFileError, PlanError
from ..execution import executor_for
from ..io.atomic import write_json_atomic
from ..io.record import parse_record
from ..kinds import kind_named, kind_of
from ..run import Run, check_run
from . import topk
from .schema import FORMAT, FORMAT_VERSION, MAX_FUSER_BYTES, fuser_from_record


def as_run(run, labels=None, *, kind="logits"):
    """Accept a Run, or an outputs array (E, N, C) with labels (N,)."""
    if isinstance(run, Run):
        if labels is not None:
            raise InputTypeError(
                "labels are taken from the Run; pass either a Run or (outputs, labels)")
        return run
    if labels is None:
        raise InputTypeError("fit(outputs, labels): labels are required with a bare outputs array")
    return Run(run, labels, kind=kind)


def check_validation_run(run):
    """Refuse runs a fuser cannot be fitted on (a kind with neither every class's
    probabilities nor bounds of them, such as a summary; one sample, one class, one
    epoch)."""
    kind = kind_of(run)
    if not (kind.full or kind.bounded):
        raise ForgetkitError("Knowledge Fusion (like every fuser) mixes the probabilities of "
                             f"every class at several epochs; {kind.holds}")
    if run.n_samples < 2:
        raise ForgetkitError(f"the validation set needs at least 2 samples; got {run.n_samples}")
    if not np.any(run.labels != run.labels[0]):
        raise ForgetkitError("the validation set holds a single class; fusion needs at least two")
    if run.n_epochs < 2:
        raise ForgetkitError(f"fusion needs a run with at least 2 epochs; got {run.n_epochs}")


class Fuser:
    """Base of every fuser.

    Subclasses store their options in ``__init__`` under the argument names (scikit-learn's
    rule, so that `get_params`, `set_params` and ``sklearn.base.clone`` work), and ``fit``
    sets ``checkpoints_`` (epoch indices needed at inference) and ``weights_`` (their
    weights, or None for a plain mean) through ``_fit_shape``. Fitted state that the JSON
    format must keep is listed in ``_state`` (attribute names without the trailing ``_``;
    stored as top-level fields of the record).
    """

    _state = ()
    _what = "fuser"  # what the JSON of this class is called in messages

    # ---------------------------------------------------------------- parameters
    @classmethod
    def _param_names(cls):
        if cls.__init__ is object.__init__:
            return []
        sig = inspect.signature(cls.__init__)
        return sorted(p.name for p in sig.parameters.values() if p.name != "self"
                      and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def get_params(self, deep=True):
        """The constructor arguments as a dict (``deep`` is accepted for scikit-learn)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params):
        """Set constructor arguments; returns self. Unknown names are refused."""
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise ForgetkitError(f"{type(self).__name__} has no parameter {name!r}; valid "
                                     f"parameters: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self):
        defaults = {} if type(self).__init__ is object.__init__ else {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if not (v is defaults.get(k) or v == defaults.get(k))]
        return f"{type(self).__name__}({', '.join(changed)})"

    # ---------------------------------------------------------------- fitted state
    def _check_fitted(self):
        if not hasattr(self, "epochs_"):
            raise ForgetkitError(
                f"this {type(self).__name__} is not fitted yet: call fit(validation_run) first"
            )

    def _fit_shape(self, run, checkpoints, weights=None):
        self.epochs_ = run.epochs.copy()
        self.n_classes_ = run.n_classes
        self.kind_ = run.kind
        self.checkpoints_ = [int(e) for e in checkpoints]
        self.weights_ = None if weights is None else np.asarray(weights, dtype=np.float64)

    @property
    def ensemble_size_(self):
        """Number of checkpoints needed at inference (k)."""
        return len(self.checkpoints_)

    @property
    def checkpoint_epochs_(self):
        """Epoch numbers of ``checkpoints_`` (int64)."""
        self._check_fitted()
        return self.epochs_[np.asarray(self.checkpoints_, dtype=np.int64)]

    def _as_input(self, run):
        """A Run of the outputs to fuse: a Run, or a bare outputs array (E, N, C) of the
        fitted epochs' kind (labels are not needed to predict)."""
        if isinstance(run, Run):
            return run
        if hasattr(run, "shape") and hasattr(run, "dtype"):  # ndarray, memmap, dask array
            outputs = run
            if outputs.ndim != 3:
                raise ForgetkitError(f"run must be a Run or an outputs array (epochs, samples, "
                                     f"classes); got shape {tuple(outputs.shape)}")
        else:
            outputs = check_array("run", run, ndim=3, kinds="f")
        n_samples = outputs.shape[1]
        # a bare array: of the fitted kind, or logits where that kind stores records
        kind = self.kind_ if kind_named(self.kind_).stores_values else "logits"
        return Run(outputs, np.zeros(n_samples, dtype=np.int64), kind=kind,
                   epochs=self.epochs_ if outputs.shape[0] == len(self.epochs_) else None)

    def _positions(self, run, indices):
        """Positions in ``run`` of fitted epoch indices, matched by epoch number."""
        self._check_fitted()
        check_run("run", run)
        if run.n_classes != self.n_classes_:
            raise ForgetkitError(f"the run has {run.n_classes} classes; the fusion was fitted on "
                                 f"{self.n_classes_}")
        return run.epoch_positions(self.epochs_[np.asarray(indices, dtype=np.int64)])

    # ---------------------------------------------------------------- prediction
    def predict_proba(self, run):
        """Fused probabilities (n_samples, n_classes) of ``run`` (a Run or an outputs array
        (E, N, C)) holding the fitted epochs: all of them, or only ``checkpoints_``. For a
        run on a dask array, a dask array computed chunk by chunk on the workers (the same
        values as in memory). A top-k run gives them only when k is the vocabulary size
        (else ForgetkitError: the unstored classes' probabilities are bounded, not known;
        `certified` gives the predictions and the target's exact probability)."""
        self._check_fitted()
        run = self._as_input(run)
        kind = kind_of(run)
        if kind.bounded:  # exact only where the bounds are (else raises)
            return topk.exact_probs(kind.certified_bounds(run), self.recipe(run))
        return executor_for(run).map_samples(run, self._predict_proba, (None, self.n_classes_),
                                             np.float64)

    def _predict_proba(self, run):
        """`predict_proba` of a Run held in memory or on disk."""
        pos = self._positions(run, self.checkpoints_)
        if self.weights_ is None:
            return run.mean_probs(pos)
        return run.weighted_probs(pos, self.weights_)

    def recipe(self, run):
        """How `predict_proba` combines the epochs of ``run``: a list of steps (kind, epoch
        positions, value) with kind ``kernels.MEAN`` (value None), ``WEIGHTED`` (the weights)
        or ``MIX`` (eps), each with the arithmetic predict_proba uses
        (``forgetkit.kernels.recipes``); `forgetkit.evaluate.score_fusers` runs the recipes
        of several fusers in one pass."""
        pos = self._positions(run, self.checkpoints_)
        if self.weights_ is None:
            return [(kernels.MEAN, pos, None)]
        return [(kernels.WEIGHTED, pos, np.asarray(self.weights_, dtype=np.float64))]

    def predict(self, run):
        """Fused class predictions: int64 (n_samples,). On a top-k run, the class of largest
        lower bound (the prediction of `certified`)."""
        self._check_fitted()
        run = self._as_input(run)
        if kind_of(run).bounded:
            return self._certificate(run)[0]
        return np.argmax(self.predict_proba(run), axis=1)

    def certified(self, run):
        """Per sample (token), the fused prediction and whether it is certified.

        On a top-k run the fused probabilities are known exactly for the target only, and
        bounded for the other classes (docs/definitions.md, "Certified fusion on top-k
        runs"); on any other run every prediction is exact, hence certified.

        Returns
        -------
        pandas.DataFrame indexed by the run's sample ids, columns ``target`` (the label),
        ``prediction`` (the class of largest lower bound, ties to the lowest id),
        ``certified`` (bool: the prediction holds for every completion of the unstored
        probabilities), ``correct`` (True: certified correct, False: certified wrong, None:
        uncertain) and ``label_prob`` (the fused probability of the target, exact).
        """
        self._check_fitted()
        run = self._as_input(run)
        pred, certified, state, label_prob = self._certificate(run)
        return topk.certificate_frame(pred, certified, state, label_prob, run.labels,
                                      run.sample_ids,
                                      name="token" if kind_of(run).bounded else "sample")

    def certified_accuracy(self, run):
        """(low, high): the fused accuracy on ``run`` lies in [certified correct, certified
        correct + uncertain] / n_samples (equal ends on a run that is not top-k)."""
        self._check_fitted()
        state = self._certificate(self._as_input(run), states_only=True)[2]
        return float(np.mean(state == 1)), float(np.mean(state != 0))

    def _certificate(self, run, *, states_only=False):
        """(prediction, certified, state, label_prob) arrays of `certified` (with
        ``states_only``: predictions only where ``state`` needed them, `topk.certify`)."""
        kind = kind_of(run)
        if kind.bounded:
            return topk.certify(kind.certified_bounds(run), self.recipe(run),
                                states_only=states_only)
        prob = self.predict_proba(run)
        pred, _, label_prob = kernels.row_top(prob, run.labels)
        hit = pred == run.labels
        return pred, np.ones(pred.shape, dtype=bool), hit.astype(np.int8), label_prob

    # ---------------------------------------------------------------- persistence
    def _state_record(self):
        """Fitted attributes of the subclass as JSON values."""
        return {name: _jsonable(getattr(self, name + "_")) for name in self._state}

    def _check_params(self):
        """Raise ForgetkitError naming the first invalid constructor argument (called by
        ``fit`` and when a fuser is read from JSON)."""

    def _read_state(self, fields):
        """Check and set the fitted state of a record read from JSON (``fields``: a
        `schema.Fields`); ``epochs_``, ``checkpoints_`` and ``weights_`` are already set."""
        raise NotImplementedError

    def to_json(self, path=None):
        """The fitted fuser as JSON text (one versioned format for every fuser, epoch
        numbers included); also written atomically to ``path`` if given."""
        self._check_fitted()
        record = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "fuser": type(self).__name__,
            "params": {k: _jsonable(v) for k, v in self.get_params().items()},
            "epochs": [int(e) for e in self.epochs_],
            "n_classes": int(self.n_classes_),
            "kind": self.kind_,
            "checkpoints": [{"epoch_index": int(e), "epoch": int(self.epochs_[e])}
                            for e in self.checkpoints_],
            "weights": None if self.weights_ is None else self.weights_.tolist(),
            **self._state_record(),
        }
        text = json.dumps(record, indent=1)
        if path is not None:
            write_json_atomic(Path(path), record, indent=1)
        return text

    @classmethod
    def from_json(cls, source):
        """A fitted fuser from JSON text or a path to a JSON file; on a subclass, the file
        must hold that fuser."""
        fuser = load_fuser(source, _what=cls._what)
        if not isinstance(fuser, cls):
            raise ForgetkitError(f"the file holds a {type(fuser).__name__}, not a {cls.__name__}")
        return fuser


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


#: The fusers `load_fuser` reads, by class name (`register_fuser`).
FUSERS = {}


def register_fuser(cls):
    """Let `load_fuser` read fusers of ``cls`` (a `Fuser` subclass), stored under its class
    name; returns ``cls`` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Fuser)):
        raise InputTypeError(f"register_fuser takes a Fuser subclass; got {cls!r}")
    FUSERS[cls.__name__] = cls
    return cls


def _is_json_text(source):
    """Whether ``source`` is JSON text rather than the path of a file."""
    if not isinstance(source, str) or os.path.exists(source):
        return False
    return any(c in source for c in '{["\n') or source.strip() in ("null", "true", "false")


def check_fuser(name, value):
    """Return ``value`` if it is a fitted fuser, else raise (InputTypeError for another type,
    ForgetkitError for a fuser not fitted yet)."""
    if not isinstance(value, Fuser):
        raise InputTypeError(f"{name} must be a fitted forgetkit fuser; got "
                             f"{type(value).__name__} {value!r}"[:200])
    value._check_fitted()
    return value


def _read_source(source):
    """(JSON text, name for messages) of JSON text or a path to a JSON file."""
    check_path("source", source)
    if _is_json_text(source):
        return source, "the fuser JSON"
    path = Path(source)
    try:
        size = path.stat().st_size
        if size > MAX_FUSER_BYTES:
            raise PlanError(f"{str(path)!r} holds {size} bytes: not a fuser file (those take "
                            "kilobytes); was a run given in place of the plan?")
        return path.read_bytes(), repr(str(path))
    except FileNotFoundError:
        raise MissingFileError(f"no such fuser file: {str(path)!r}") from None
    except IsADirectoryError:
        raise PlanError(f"{str(path)!r} is a folder, not a fuser file") from None


def load_fuser(source, *, _what="fuser"):
    """Any fitted fuser from its JSON (text or path), as written by `Fuser.to_json`;
    Knowledge Fusion plans of format version 1 are read too.

    Every field is checked against the fuser schema (`forgetkit.fusion.schema`); a file
    that breaks it raises PlanError naming the field and its value."""
    text, where = _read_source(source)
    try:
        record = parse_record(text, where)
    except ForgetkitError as err:
        raise PlanError(f"not a forgetkit {_what}: {err}") from None
    return fuser_from_record(record, dict(FUSERS), where, _what)
