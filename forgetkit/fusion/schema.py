"""The schema of a fuser's JSON (`Fuser.to_json`), checked field by field when it is read.

A fuser read from a file is applied to runs the file never saw, so nothing in it is trusted:
every field is checked for its type and range, the epoch indices and numbers against the
epochs the file states, the checkpoints against what the fitted state implies, and weights
for being a probability vector. The first failure raises PlanError naming the field and
the value found.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ForgetkitError, PlanError
from ..kinds import kind_named, kinds

FORMAT = "forgetkit-fuser"
#: The format of a fitted fuser; version 1 was Knowledge Fusion's plan alone.
FORMAT_VERSION = 2
KF_PLAN_V1 = "forgetkit-knowledge-fusion"
#: How far from 1 the stored weights may sum (they are written with 17 significant digits).
WEIGHT_SUM_TOLERANCE = 1e-6
#: Largest fuser file read: fitted fusers take kilobytes; a larger file is a mistake (such
#: as a run given in place of the plan).
MAX_FUSER_BYTES = 64 << 20
#: Largest class count a fuser may state (beyond any classification run stored so far).
MAX_CLASSES = 1 << 24
_INT64 = 1 << 63


def fitted_kinds():
    """The registered kinds a fuser is fitted on: those holding every class's probabilities
    or bounds of them (a top-k token run: certified fusion)."""
    return tuple(k for k in kinds() if kind_named(k).full or kind_named(k).bounded)


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Typed reads of the fields of one fuser record; each failure is a PlanError that
    names ``where`` (the file), the field and the value."""

    def __init__(self, record, where):
        self.where = where
        self.record = self.object(record, "the file")

    def fail(self, field, expected, value):
        raise PlanError(f"{self.where}: {field} must be {expected}; got {_shown(value)}")

    def get(self, name, default=...):
        """Field ``name`` of the record; required unless a default is given."""
        if name not in self.record:
            if default is ...:
                raise PlanError(f"{self.where}: the field {name!r} is missing")
            return default
        return self.record[name]

    def object(self, value, field):
        if not isinstance(value, dict):
            self.fail(field, "a JSON object", value)
        return value

    def list(self, value, field, *, length=None, nonempty=False):
        if not isinstance(value, list):
            self.fail(field, "a list", value)
        if length is not None and len(value) != length:
            self.fail(f"the length of {field}", f"{length}", len(value))
        if nonempty and not value:
            self.fail(field, "a non-empty list", value)
        return value

    def integer(self, value, field, lo=-_INT64, hi=_INT64 - 1):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(field, f"an integer in [{lo}, {hi}]", value)
        return value

    def number(self, value, field, lo=-math.inf, hi=math.inf):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not lo <= value <= hi:
            self.fail(field, f"a finite number in [{lo}, {hi}]", value)
        return float(value)

    def epoch_ref(self, value, field, epochs):
        """An ``{"epoch_index": i, "epoch": n}`` object: i in [0, E), n == epochs[i] (the
        number may be absent). Returns i."""
        self.object(value, field)
        if "epoch_index" not in value:
            raise PlanError(f"{self.where}: {field} has no 'epoch_index'")
        i = self.integer(value["epoch_index"], f"{field}.epoch_index", 0, len(epochs) - 1)
        number = int(epochs[i])
        if "epoch" in value and self.integer(value["epoch"], f"{field}.epoch") != number:
            self.fail(f"{field}.epoch", f"{number} (the epoch number at epoch_index {i})",
                      value["epoch"])
        return i


def read_fuser_record(fields, classes):
    """The fuser class named by the record and its checked constructor parameters."""
    name = fields.get("fuser")
    if not isinstance(name, str) or name not in classes:
        fields.fail("fuser", f"one of {', '.join(classes)}", name)
    cls = classes[name]
    params = fields.object(fields.get("params", {}), "params")
    valid = cls._param_names()
    for key in params:
        if key not in valid:
            fields.fail("params", f"parameters of {name} ({', '.join(valid) or 'none'})", key)
    fuser = cls(**params)
    try:
        fuser._check_params()
    except ForgetkitError as err:
        raise PlanError(f"{fields.where}: params: {err}") from None
    return fuser


def fuser_from_record(record, classes, where, what="fuser"):
    """A fitted fuser from its JSON record (a parsed dict), every field checked; ``what``
    names the expected content in messages (e.g. "Knowledge Fusion plan")."""
    fields = Fields(record, where)
    fmt, version = fields.get("format", None), fields.get("version", None)
    if fmt == KF_PLAN_V1:
        if version != 1:
            fields.fail("version", "1 for format 'forgetkit-knowledge-fusion'", version)
        fields.record = dict(fields.record, fuser="KnowledgeFusion", weights=None)
    elif fmt == FORMAT:
        if version != FORMAT_VERSION:
            fields.fail("version", f"{FORMAT_VERSION} (this forgetkit reads fuser files of "
                        f"versions 1 and {FORMAT_VERSION})", version)
    else:
        fields.fail("format", f"{FORMAT!r} (this is not a forgetkit {what})", fmt)
    fuser = read_fuser_record(fields, classes)
    epochs = fields.list(fields.get("epochs"), "epochs", nonempty=True)
    for i, e in enumerate(epochs):
        fields.integer(e, f"epochs[{i}]")
        if i and e <= epochs[i - 1]:
            fields.fail(f"epochs[{i}]", f"greater than epochs[{i - 1}] = {epochs[i - 1]} "
                        "(epoch numbers increase)", e)
    n_classes = fields.integer(fields.get("n_classes"), "n_classes", 2, MAX_CLASSES)
    kind = fields.get("kind", "logits")
    fitted = fitted_kinds()
    if kind not in fitted:
        fields.fail("kind", f"one of {', '.join(fitted)}", kind)
    refs = fields.list(fields.get("checkpoints"), "checkpoints", nonempty=True)
    checkpoints = [fields.epoch_ref(c, f"checkpoints[{i}]", epochs) for i, c in enumerate(refs)]
    if checkpoints != sorted(set(checkpoints)):
        fields.fail("checkpoints", "sorted by epoch_index without repeats", checkpoints)
    weights = fields.get("weights", None)
    if weights is not None:
        fields.list(weights, "weights", length=len(checkpoints))
        weights = [fields.number(w, f"weights[{i}]", 0.0, 1.0) for i, w in enumerate(weights)]
        if abs(math.fsum(weights) - 1.0) > WEIGHT_SUM_TOLERANCE:
            fields.fail("the sum of weights", f"1 (within {WEIGHT_SUM_TOLERANCE})",
                        math.fsum(weights))
    fuser.epochs_ = np.asarray(epochs, dtype=np.int64)
    fuser.n_classes_ = n_classes
    fuser.kind_ = kind
    fuser.checkpoints_ = checkpoints
    fuser.weights_ = None if weights is None else np.asarray(weights, dtype=np.float64)
    fuser._read_state(fields)
    return fuser


def check_weights_present(fuser, fields, needed):
    """Refuse weights that the fuser class does (``needed``) or does not use."""
    if needed and fuser.weights_ is None:
        fields.fail("weights", f"a list of {len(fuser.checkpoints_)} weights for "
                    f"{type(fuser).__name__}", None)
    if not needed and fuser.weights_ is not None:
        fields.fail("weights", f"null for {type(fuser).__name__}", fuser.weights_.tolist())


def check_checkpoints(fuser, fields, expected, why):
    """Refuse stored checkpoints other than ``expected`` (what the fitted state implies)."""
    if list(fuser.checkpoints_) != list(expected):
        fields.fail("checkpoints", f"the epoch indices {list(expected)} ({why})",
                    list(fuser.checkpoints_))
