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
from tests.reference_topk import (
    bounds_ref,
    certify_ref,
    layout_ref,
    topk_records_ref,
    unstored_bound_ref,
)


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
def completion(logits, records, targets, mode):
    """Probabilities (E, N, V) that the records allow: exp(z - lse) for the stored classes and
    the target, and for the others a value in [0, u_e] (``mode`` "records": exp(z - lse),
    checked to be within; "max":
    u_e where no stored logit ties the k-th one below it; "zero": 0)."""
    n_epochs, n_tokens, vocab = logits.shape
    out = np.empty((n_epochs, n_tokens, vocab))
    for e in range(n_epochs):
        rec = records[e]
        lse = rec["lse"].astype(np.float64)[:, None]
        u = np.array([unstored_bound_ref(r, y) for r, y in zip(rec, targets, strict=True)])
        p = np.exp(logits[e].astype(np.float64) - lse)
        free = np.ones((n_tokens, vocab), dtype=bool)
        np.put_along_axis(free, rec["ids"].astype(np.int64), False, axis=1)
        free[np.arange(n_tokens), targets] = False
        if mode == "records":  # the bound holds for the records' own probabilities
            assert (np.where(free, p, 0.0) <= u[:, None]).all()
            fill = p
        elif mode == "max":  # ids below the k-th stored one cannot reach p_k
            below = np.arange(vocab)[None, :] < rec["ids"][:, -1:].astype(np.int64)
            p_k = np.exp(rec["logits"][:, -1].astype(np.float64) - lse[:, 0])
            fill = np.where(below & (u == p_k)[:, None], 0.0, u[:, None])
        else:
            fill = np.zeros_like(p)
        p_stored = np.exp(rec["logits"].astype(np.float64) - lse)
        np.put_along_axis(p, rec["ids"].astype(np.int64), p_stored, axis=1)
        p[np.arange(n_tokens), targets] = np.exp(rec["target"].astype(np.float64) - lse[:, 0])
        out[e] = np.where(free, fill, p)
    return out


def mixture(probs, recipe):
    """The fused probabilities (N, V) of a recipe on probabilities (E, N, V), with the
    arithmetic of the fusers."""
    out = None
    for kind, pos, value in recipe:
        if kind == kernels.MEAN:
            out = sum(probs[e] for e in pos) / len(pos)
        elif kind == kernels.WEIGHTED:
            out = sum(w * probs[e] for e, w in zip(pos, value, strict=True))
        else:
            out = value * (sum(probs[e] for e in pos) / len(pos)) + (1 - value) * out
    return out


def check_sound(logits, targets, k, recipe):
    """The certificates of ``recipe`` hold for several completions of the records."""
    records = records_of(logits, targets, k)
    pred, certified, state, label_prob = ft.certify(
        ft.TopKData(records, targets, logits.shape[2]), recipe, chunk=128)
    for mode in ("records", "max", "zero"):
        q = mixture(completion(logits, records, targets, mode), recipe)
        truth = np.argmax(q, axis=1)
        assert (truth[certified] == pred[certified]).all(), mode
        assert (truth[state == 1] == targets[state == 1]).all(), mode
        assert (truth[state == 0] != targets[state == 0]).all(), mode
        assert np.array_equal(label_prob, q[np.arange(len(targets)), targets])
    return pred, certified, state, label_prob


@pytest.mark.parametrize("k", [1, 2, 4])
def test_certificates_hold_for_every_completion(k):
    logits, targets = make_logits(4, n_epochs=6, n_tokens=400, vocab=16)
    recipes = [[(kernels.MEAN, [5], None)], [(kernels.MEAN, [2, 3, 4, 5], None)],
               [(kernels.WEIGHTED, [0, 3, 5], np.array([0.2, 0.3, 0.5]))],
               [(kernels.MEAN, [5], None), (kernels.MIX, [1, 2, 3], 0.4),
                (kernels.MIX, [0, 1], 0.25)]]
    for recipe in recipes:
        _, _, state, label_prob = check_sound(logits, targets, k, recipe)
        # the target's probability is the model's up to the float32 rounding of lse
        softmax = np.stack([fk.probs.softmax(z) for z in logits])
        q = mixture(softmax, recipe)
        np.testing.assert_allclose(label_prob, q[np.arange(len(targets)), targets], rtol=1e-6)
        if len(recipe) == 1 and recipe[0][1] == [5]:  # one checkpoint: exactly its argmax
            assert ((state == 1) == (np.argmax(logits[5], axis=1) == targets)).all()
            assert (state != -1).all()


# -------------------------------------------------------- larger k, tighter interval
RECIPES = [lambda E: [(kernels.MEAN, [E - 1], None)],
           lambda E: [(kernels.MEAN, list(range(E)), None)],
           lambda E: [(kernels.WEIGHTED, list(range(E)), np.linspace(1, 2, E) / np.linspace(1, 2, E).sum())],
           lambda E: [(kernels.MEAN, [E - 1], None), (kernels.MIX, [0], 0.5),
                      (kernels.MIX, list(range(E)), 0.25)]]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n_epochs=st.integers(1, 4), vocab=st.integers(2, 9),
       recipe=st.sampled_from(RECIPES), spread=st.sampled_from([1, 3, 20]))
def test_larger_k_never_widens_the_interval(seed, n_epochs, vocab, recipe, spread):
    rng = np.random.default_rng(seed)
    n_tokens = 25
    # small integers: exact ties between logits (and between bounds) are common
    logits = rng.integers(-spread, spread + 1, (n_epochs, n_tokens, vocab)).astype(np.float32)
    targets = rng.integers(0, vocab, n_tokens)
    steps = recipe(n_epochs)
    before, widths = None, []
    for k in range(1, vocab + 1):
        if k < vocab:
            state = check_sound(logits, targets, k, steps)[2]
            if before is not None:  # certified tokens stay certified, with the same answer
                kept = before != -1
                assert (state[kept] == before[kept]).all()
            before = state
        else:  # the softmax of the logits: the same answers up to the rounding of lse
            state = ft.certify(data_of(logits, targets, k), steps)[2]
            assert (state != -1).all()  # every token certified
        widths.append(int((state == -1).sum()))
    assert widths == sorted(widths, reverse=True)
