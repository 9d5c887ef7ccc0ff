"""Certified fusion on top-k token runs: layout, bounds and certificates against plain-numpy
references, soundness against the full logits, k == vocabulary equal to the full run bit for
bit, and larger k never widening the interval."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import forgetkit as fk
from forgetkit import kernels
from forgetkit.fusion import topk as ft
from tests.reference_topk import bounds_ref, certify_ref, layout_ref, topk_records_ref


def make_logits(seed=0, n_epochs=8, n_tokens=300, vocab=20, ties=False):
    """float32 logits (E, N, V) of a run that learns and forgets, and targets (N,)."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, n_tokens)
    z = rng.normal(size=(n_epochs, n_tokens, vocab)) * 1.5
    learn = np.linspace(-1, 2.5, n_epochs)[:, None] + rng.normal(size=(n_epochs, n_tokens))
    z[:, np.arange(n_tokens), targets] += learn
    if ties:
        z = np.round(z * 2) / 2
    return z.astype(np.float32), targets


def records_of(logits, targets, k):
    return np.stack([topk_records_ref(z, targets, k) for z in logits])


def data_of(logits, targets, k):
    return ft.TopKData(records_of(logits, targets, k), targets, logits.shape[2])


# ------------------------------------------------------------ kernels vs references
def test_layout_and_bounds_match_the_reference():
    logits, targets = make_logits(1, n_epochs=4, n_tokens=60, vocab=12, ties=True)
    rec = records_of(logits, targets, 3)
    data = ft.TopKData(rec, targets, 12)
    cls, label_col, unstored_col = ft.Layout(data, range(4), slice(None)).parts
    rows = layout_ref(rec, targets, 12)
    for n, row in enumerate(rows):
        width = len(row)
        assert cls[n, :width].tolist() == [c for c, _ in row]
        assert (cls[n, width:] == 13).all()  # padding
        assert cls[n, label_col[n]] == targets[n]
        kinds = [kind for _, kind in row]
        assert unstored_col[n] == (kinds.index("unstored") if "unstored" in kinds else -1)
    upper, lower = np.empty(cls.shape), np.empty(cls.shape)
    for e in range(4):
        kernels.topk_bounds(rec[e], targets, 12, (cls, label_col, unstored_col), upper, lower)
        for n, row in enumerate(rows):
            up, low = bounds_ref(rec[e, n], targets[n], row)
            assert upper[n, :len(row)].tolist() == up
            assert lower[n, :len(row)].tolist() == low
            assert (upper[n, len(row):] == 0).all() and (lower[n, len(row):] == 0).all()


def test_certificate_matches_the_reference_on_ties():
    rng = np.random.default_rng(3)
    logits, targets = make_logits(2, n_epochs=3, n_tokens=200, vocab=9, ties=True)
    data = data_of(logits, targets, 2)
    layout = ft.Layout(data, range(3), slice(None))
    rows = layout_ref(records_of(logits, targets, 2), targets, 9)
    # bounds rounded to a coarse grid: ties between lower and upper bounds everywhere
    upper = np.round(rng.uniform(0, 1, layout.shape) * 4) / 4
    lower = np.minimum(upper, np.round(rng.uniform(0, 1, layout.shape) * 4) / 4)
    n_idx = np.arange(len(targets))
    lower[n_idx, layout.label_col] = upper[n_idx, layout.label_col]
    pred, certified, state = kernels.topk_certify(upper, lower, layout.parts, 9)
    for n, row in enumerate(rows):
        w = len(row)
        assert (pred[n], certified[n], state[n]) == certify_ref(
            upper[n, :w].tolist(), lower[n, :w].tolist(), row, targets[n])


# ------------------------------------------------------------------ soundness
def full_mixture(logits, recipe):
    """The fused probabilities (N, V) of a recipe on full logits (plain numpy)."""
    p = fk.probs.softmax
    out = None
    for kind, pos, value in recipe:
        if kind == kernels.MEAN:
            out = sum(p(logits[e]) for e in pos) / len(pos)
        elif kind == kernels.WEIGHTED:
            out = sum(w * p(logits[e]) for e, w in zip(pos, value, strict=True))
        else:
            a = sum(p(logits[e]) for e in pos) / len(pos)
            out = value * a + (1 - value) * out
    return out


@pytest.mark.parametrize("k", [1, 2, 4])
def test_certificates_hold_for_the_true_logits(k):
    logits, targets = make_logits(4, n_epochs=6, n_tokens=400, vocab=16)
    data = data_of(logits, targets, k)
    recipes = [[(kernels.MEAN, [5], None)], [(kernels.MEAN, [2, 3, 4, 5], None)],
               [(kernels.WEIGHTED, [0, 3, 5], np.array([0.2, 0.3, 0.5]))],
               [(kernels.MEAN, [5], None), (kernels.MIX, [1, 2, 3], 0.4),
                (kernels.MIX, [0, 1], 0.25)]]
    for recipe in recipes:
        pred, certified, state, label_prob = ft.certify(data, recipe, chunk=128)
        q = full_mixture(logits, recipe)
        truth = np.argmax(q, axis=1)
        assert (truth[certified] == pred[certified]).all()
        assert (truth[state == 1] == targets[state == 1]).all()
        assert (truth[state == 0] != targets[state == 0]).all()
        np.testing.assert_allclose(label_prob, q[np.arange(len(targets)), targets],
                                   rtol=1e-6)
        if recipe[0][1] == [5] and len(recipe) == 1:  # one checkpoint: exact correctness
            assert ((state == 1) == (records_of(logits, targets, k)["ids"][5, :, 0]
                                     == targets)).all()
