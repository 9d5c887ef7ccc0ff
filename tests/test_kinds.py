"""A new record kind is one module plus one registration: this file is that module for two
toy kinds, registered here without touching the package, and runs the analyses and a
Knowledge Fusion fit on them.

- "argmax-label": per (epoch, sample) the predicted class, the label's probability and the
  label's margin: F_e, the data map and label probabilities come exactly from the records;
  Knowledge Fusion is refused with the kind's one message of what it holds.
- "log-probs": per (epoch, sample) every class's log-probability: every class's
  probability is known, so Knowledge Fusion fits on it with the plan of the same
  probabilities stored as a "probs" run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import forgetkit as fk
from forgetkit.errors import ForgetkitError
from forgetkit.kinds import Kind, RecordKind, RecordOutputs, kind_named, kind_of, register_kind

from .conftest import make_run

ARGMAX_DTYPE = np.dtype([("pred", "<i4"), ("label_prob", "<f8"), ("margin", "<f8")])
ARGMAX_HOLDS = ("this run holds, per epoch and sample, the predicted class and the label's "
                "probability and margin only")


class ArgmaxOutputs(RecordOutputs):
    """Records (E, N) of ARGMAX_DTYPE standing in for (E, N, C) outputs."""

    HOLDS = ARGMAX_HOLDS

    def correct(self, labels):
        return self.read()["pred"] == labels

    def predictions(self, labels):
        return self.read()["pred"].astype(np.int32)

    def label_probs(self):
        return self.read()["label_prob"]

    def label_margins(self, labels):
        return self.read()["margin"]


ARGMAX = register_kind(RecordKind("argmax-label", ArgmaxOutputs, ARGMAX_HOLDS))


class LogProbOutputs(RecordOutputs):
    """Records (E, N) of one (C,) float64 field ``logp``: every class's log-probability."""

    HOLDS = "this run holds every class's log-probability"


class LogProbKind(Kind):
    """Every class's log-probability, stored as records: ``full`` (probabilities are their
    exp), margins on log-probabilities (no AUM)."""

    name, holds, full, stores_values = "log-probs", LogProbOutputs.HOLDS, True, False
    outputs_type = LogProbOutputs

    @staticmethod
    def _logp(run, epochs=None):
        return run.outputs.read(epochs)["logp"]

    def predictions(self, run, *, progress=False):
        return np.argmax(self._logp(run), axis=-1).astype(np.int32)

    def label_probs(self, run, epochs=None):
        return np.exp(np.take_along_axis(self._logp(run, epochs), run.labels[None, :, None],
                                         axis=-1)[..., 0])

    def label_margins(self, run, epochs=None):
        logp = self._logp(run, epochs).copy()
        rows = np.arange(run.n_samples)
        label = logp[:, rows, run.labels].copy()
        logp[:, rows, run.labels] = -np.inf
        return label - logp.max(axis=-1)

    def epoch_probs(self, run, e, out):
        out[...] = np.exp(self._logp(run, slice(e, e + 1))[0])
        return out


LOG_PROBS = register_kind(LogProbKind())


@pytest.fixture(scope="module")
def full():
    return make_run(n_epochs=12, n_samples=300, n_classes=5, seed=3)


def argmax_run(full):
    records = np.empty((full.n_epochs, full.n_samples), dtype=ARGMAX_DTYPE)
    records["pred"] = full.predictions()
    records["label_prob"] = full.label_probs().T
    records["margin"] = full.label_margins()
    return fk.Run(ArgmaxOutputs(records, full.n_classes), full.labels, kind="argmax-label",
                  epochs=full.epochs)


def log_prob_runs(full):
    """(the "log-probs" run, the "probs" run of the same probabilities)."""
    z = full.probs().astype(np.float64)  # any positive rows: their logs, normalised
    logp = np.log(z) - np.log(z.sum(axis=-1, keepdims=True))
    records = np.empty((full.n_epochs, full.n_samples),
                       dtype=[("logp", "<f8", (full.n_classes,))])
    records["logp"] = logp
    toy = fk.Run(LogProbOutputs(records, full.n_classes), full.labels, kind="log-probs",
                 epochs=full.epochs)
    return toy, fk.Run(np.exp(logp), full.labels, kind="probs", epochs=full.epochs)


def test_registered_kinds_are_taken_by_name_and_checked_against_their_outputs(full):
    run = argmax_run(full)
    assert kind_of(run) is ARGMAX is kind_named("argmax-label")
    assert not ARGMAX.full and not ARGMAX.stores_values and not ARGMAX.bounded
    with pytest.raises(ForgetkitError, match="does not go with outputs of type ArgmaxOutputs"):
        fk.Run(run.outputs, full.labels, kind="logits")
    with pytest.raises(ForgetkitError, match="kind must be one of"):
        fk.Run(full.outputs, full.labels, kind="argmax")


def test_forgetting_and_data_map_of_a_toy_kind_equal_the_full_runs(full):
    run = argmax_run(full)
    np.testing.assert_array_equal(fk.forget_fraction(run), fk.forget_fraction(full))
    np.testing.assert_array_equal(run.correctness(), full.correctness())
    np.testing.assert_array_equal(run.label_probs(), full.label_probs())
    ours, theirs = fk.data_map(run), fk.data_map(full)
    for column in ("correctness", "forgetfulness", "never_learned", "region", "label"):
        pd.testing.assert_series_equal(ours[column], theirs[column])
    for column in ("confidence", "variability", "aum"):
        np.testing.assert_allclose(ours[column], theirs[column], rtol=1e-12, atol=1e-15)
    sub = run.isel(epochs=np.arange(3, 12), samples=np.arange(0, 300, 2))
    np.testing.assert_array_equal(
        fk.forget_fraction(sub), fk.forget_fraction(full.isel(epochs=np.arange(3, 12),
                                                               samples=np.arange(0, 300, 2))))


def test_what_a_toy_kind_cannot_give_is_refused_with_what_it_holds(full):
    run = argmax_run(full)
    with pytest.raises(ForgetkitError, match="mixes the probabilities") as err:
        fk.KnowledgeFusion().fit(run)
    assert ARGMAX_HOLDS in str(err.value)
    with pytest.raises(ForgetkitError, match=r"probs\(\) needs every class's outputs"):
        run.probs(0)


def test_knowledge_fusion_fits_a_toy_kind_that_holds_every_class(full):
    toy, probs = log_prob_runs(full)
    assert kind_of(toy).full and not kind_of(toy).softmax
    np.testing.assert_array_equal(toy.predictions(), probs.predictions())
    np.testing.assert_array_equal(toy.probs(4), probs.probs(4))
    ours = fk.KnowledgeFusion(window=1).fit(toy)
    theirs = fk.KnowledgeFusion(window=1).fit(probs)
    assert ours.plan_ == theirs.plan_ and ours.val_accuracy_ == theirs.val_accuracy_
    np.testing.assert_allclose(ours.predict_proba(toy), theirs.predict_proba(probs),
                               rtol=1e-12, atol=1e-15)
    trajectory = fk.analysis.dynamics.trajectory(toy, mean_probs=True)
    np.testing.assert_allclose(trajectory.mean_probs, toy.mean_probs(range(toy.n_epochs)),
                               rtol=1e-12)
