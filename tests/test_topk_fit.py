"""Knowledge Fusion's fit on top-k runs against a plain-numpy reference: the window means
made row by row from the records, the eps grid counts read up to each row's padding, the
tokens the fit leaves out as settled, and whole plans bit for bit against a fit whose state
is built from `tests.reference_topk` (layouts and bounds in Python, windows summed with
numpy)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
from numba import njit

import forgetkit as fk
from forgetkit import kernels
from forgetkit.execution import LocalParts
from forgetkit.fusion import knowledge
from forgetkit.fusion import topk as ft
from forgetkit.fusion.fitstate import REL_BAND, ChunkedFitState, FitChunk
from forgetkit.kinds import kind_of
from forgetkit.kinds.topk import TopKOutputs, token_ids, topk_records
from tests.reference_topk import bounds_ref, layout_ref

#: (seed, epochs, tokens, vocabulary, k, ties): ties and small vocabularies (layouts that
#: hold every class), k = 1, and runs where many tokens are never right (settled).
CASES = [(1, 6, 240, 12, 2, True), (2, 8, 300, 30, 3, False), (3, 5, 200, 7, 1, True),
         (4, 7, 260, 40, 5, False), (5, 4, 150, 5, 4, True)]


def make_logits(seed, n_epochs, n_tokens, vocab, ties):
    """float32 logits (E, N, V) of a run that learns and forgets (a third of its tokens
    never learnt), and targets (N,)."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, n_tokens)
    z = rng.normal(size=(n_epochs, n_tokens, vocab)) * 1.5
    learn = np.linspace(-1, 2.5, n_epochs)[:, None] + rng.normal(size=(n_epochs, n_tokens))
    learn[:, : n_tokens // 3] -= 4.0
    z[:, np.arange(n_tokens), targets] += learn
    if ties:
        z = np.round(z * 2) / 2
    return z.astype(np.float32), targets


def topk_run(seed, n_epochs, n_tokens, vocab, k, ties):
    logits, targets = make_logits(seed, n_epochs, n_tokens, vocab, ties)
    records = np.stack([topk_records(z, targets, k) for z in logits])
    return fk.Run(TopKOutputs(records, vocab, np.arange(n_tokens) // 10,
                              np.arange(n_tokens) % 10 + 1), targets, kind="topk")


class Reference:
    """Every epoch's upper and lower bounds (E, N, M) in the layout of every epoch, from the
    plain-Python reference (padding: class vocab + 1, bounds 0)."""

    def __init__(self, run):
        records = np.asarray(run.outputs.records)
        targets, vocab = run.labels, run.n_classes
        self.rows = layout_ref(records, targets, vocab)
        width = max(len(row) for row in self.rows)
        n_epochs, n = records.shape
        self.upper, self.lower = np.zeros((2, n_epochs, n, width))
        self.label_col = np.array([next(i for i, (c, kind) in enumerate(row)
                                        if c == y and kind == "class")
                                   for row, y in zip(self.rows, targets, strict=True)])
        for e in range(n_epochs):
            for i, (row, y) in enumerate(zip(self.rows, targets, strict=True)):
                up, low = bounds_ref(records[e, i], y, row)
                self.upper[e, i, :len(row)], self.lower[e, i, :len(row)] = up, low

    def window(self, epochs, lower=False):
        """The mean of the epochs' bounds: summed in order, then divided (numpy)."""
        values = self.lower if lower else self.upper
        out = values[epochs[0]].copy()
        for e in epochs[1:]:
            out += values[e]
        if len(epochs) > 1:
            out /= len(epochs)
        return out


class ReferenceChunk(FitChunk):
    """The fit's state on the reference's bounds, every token kept."""

    def __init__(self, ref, correct):
        self.ref = ref
        super().__init__(correct, ref.upper[-1].copy(), ref.label_col)

    def window_mean(self, window):
        if self.window != window:
            self.mean[...] = self.ref.window(list(window))
            self.window = window
        return self.mean


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("cache", [False, True])
def test_window_means_and_grid_counts_match_the_reference(case, cache):
    run = topk_run(*case)
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    n_epochs = run.n_epochs
    layout = ft.Layout(data, range(n_epochs), slice(None), cache=cache)
    assert (layout.cache.size > 0) == cache
    assert layout.shape == ref.upper.shape[1:]
    assert np.array_equal(layout.label_col, ref.label_col)
    grid = np.arange(101) / 100
    for prob in (ref.upper[-1].copy(), ref.window([0, 2]), ref.window([1]) * 0.5):
        leads, _ = kernels.label_leads(prob, ref.label_col)
        for window in ([n_epochs - 1], [0, 1], list(range(n_epochs)), [1, 2, 3], [2]):
            upper, lower = np.empty(layout.shape), np.empty(layout.shape)
            ft.window_mean(data, window, layout, upper, lower)
            assert np.array_equal(upper, ref.window(window))
            assert np.array_equal(lower, ref.window(window, lower=True))
            # the fit's pass (early answers from the leads, rows for the others): the
            # counts of the padded rows
            epochs = np.asarray(window, dtype=np.int64)
            counts = kernels.topk_window_grid_counts(
                *layout.read(data, epochs), layout.extent, prob, leads, grid, REL_BAND)
            assert np.array_equal(counts, kernels.grid_correct_counts(
                upper, prob, ref.label_col, leads, grid, REL_BAND))


@pytest.mark.parametrize("case", [(6, 3, 40, 70_000, 4, True), (7, 3, 40, 1 << 16, 4, True)])
def test_layouts_of_wide_vocabularies_match_the_reference(case):
    """Vocabularies beyond `kernels.topk.DIRECT_CLASSES` lay tokens out with a hash set,
    those up to it with a bit set (here, all of its words): both give the reference's
    layouts, unstored slots above tied k-th logits included."""
    run = topk_run(*case)
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    layout = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    assert layout.shape == ref.upper.shape[1:]
    assert np.array_equal(layout.label_col, ref.label_col)
    assert np.array_equal(layout.cls, [[c for c, _ in row] + [run.n_classes + 1] * (
        layout.shape[1] - len(row)) for row in ref.rows])
    for window in ([0], [0, 1, 2], [2]):
        upper, lower = np.empty(layout.shape), np.empty(layout.shape)
        ft.window_mean(data, window, layout, upper, lower)
        assert np.array_equal(upper, ref.window(window))
        assert np.array_equal(lower, ref.window(window, lower=True))


@pytest.mark.parametrize("case", [CASES[1], (6, 3, 40, 70_000, 4, True)])
def test_layouts_wider_than_the_first_rows_are_made_again(case, monkeypatch):
    """Tokens with more classes than `kernels.LAYOUT_COLUMNS` are laid out again in rows
    wide enough for any token: the same layout, columns and unstored slots as rows wide
    enough from the start (bit set and hash set alike)."""
    run = topk_run(*case)
    data = kind_of(run).certified_bounds(run)
    full = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    widths = (full.cls <= run.n_classes).sum(1)
    narrow = min(int(np.median(widths)), int(widths.max()) - 1)
    assert widths.min() <= narrow < widths.max()  # some tokens fit, some do not
    monkeypatch.setattr(kernels, "LAYOUT_COLUMNS", narrow)
    again = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    for name in ("cls", "ends", "label_col", "unstored_col", "cols", "src", "cache"):
        assert np.array_equal(getattr(again, name), getattr(full, name)), name
    assert again.cols.dtype == full.cols.dtype
    assert np.array_equal(full.ends, widths)


@pytest.mark.parametrize("case", CASES)
def test_settled_tokens_are_wrong_under_every_mixture(case):
    run = topk_run(*case)
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    chunk = ft.TopKFitChunk(data, slice(None), settle=True)
    settled = np.flatnonzero(chunk.layout.settled)
    assert len(settled) > 0 or case[3] <= 7  # tiny vocabularies: nothing settles
    correct = np.asarray(run.correctness())
    assert not correct[:, settled].any()  # wrong at every epoch: no forget count misses them
    assert np.array_equal(chunk.correct, correct[:, ~chunk.layout.settled])
    rng = np.random.default_rng(0)
    rows = np.arange(len(settled))
    for _ in range(20):  # random mixtures, made as the fit makes them
        fused = ref.window([run.n_epochs - 1])[settled]
        for _ in range(3):
            w = sorted(rng.choice(run.n_epochs, size=rng.integers(1, 4), replace=False))
            eps = rng.choice([1e-6, 0.01, 0.5, 1.0])
            kernels.mix(np.ascontiguousarray(ref.window(list(w))[settled]), fused, eps)
            label = fused[rows, ref.label_col[settled]]
            others = fused.copy()
            others[rows, ref.label_col[settled]] = -np.inf
            assert (others.max(axis=1) > label).all()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("options", [{}, {"window": 0}, {"window": 2, "grid": 11},
                                     {"rule": "paper"}, {"grid": None}])
def test_fit_plans_equal_the_reference_fits(case, options, monkeypatch):
    run = topk_run(*case)
    got = fk.KnowledgeFusion(**options).fit(run)
    ref = Reference(run)
    correct = np.asarray(run.correctness())
    monkeypatch.setattr(knowledge, "_fit_state", lambda run, grid: ChunkedFitState(
        LocalParts([ReferenceChunk(ref, correct)])))
    want = fk.KnowledgeFusion(**options).fit(run)
    assert got.plan_ == want.plan_
    assert got.val_accuracy_ == want.val_accuracy_
    assert got.initial_accuracy_ == want.initial_accuracy_


def test_fit_chunks_give_the_plan_of_one_chunk(monkeypatch):
    run = topk_run(2, 8, 300, 30, 3, False)
    whole = fk.KnowledgeFusion().fit(run)
    picks = fk.EnsembleSelection().fit(run).selection_
    monkeypatch.setattr(knowledge.topk, "FIT_CHUNK_TOKENS", 37)
    chunked = fk.KnowledgeFusion().fit(run)
    assert chunked.plan_ == whole.plan_ and chunked.val_accuracy_ == whole.val_accuracy_
    assert fk.EnsembleSelection().fit(run).selection_ == picks


@pytest.mark.parametrize("case", CASES)
def test_one_pass_certificates_equal_the_layout_and_bounds_path(case):
    run = topk_run(*case)
    data = kind_of(run).certified_bounds(run)
    last = run.n_epochs - 1
    weights = np.linspace(1.0, 2.0, run.n_epochs) / np.linspace(1.0, 2.0, run.n_epochs).sum()
    recipes = [[(kernels.MEAN, [last], None)],
               [(kernels.MEAN, list(range(run.n_epochs)), None)],
               [(kernels.WEIGHTED, list(range(run.n_epochs)), weights.tolist())],
               [(kernels.MEAN, [last], None), (kernels.MIX, [0, 1], 0.3),
                (kernels.MIX, [2, 1, 3], 0.25)]]
    for recipe in recipes:
        got = ft.certify(data, recipe, chunk=64)
        layout = ft.Layout(data, ft.recipe_epochs(recipe), slice(None))
        upper, lower = ft.recipe_bounds(data, recipe, layout)
        want = kernels.topk_certify(upper, lower, layout.parts, run.n_classes)
        for a, b in zip(got[:3], want, strict=True):
            assert np.array_equal(a, b)
        assert np.array_equal(got[3], upper[np.arange(run.n_samples), layout.label_col])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("cache", [False, True])
def test_selection_scores_match_the_reference(case, cache):
    """Each epoch's count of tokens whose first argmax of total + its bounds is the
    target, against numpy on the reference's rows: totals made as the selection makes
    them (sums of picks' bounds, with many ties) and arbitrary ones."""
    run = topk_run(*case)
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    layout = ft.Layout(data, range(run.n_epochs), slice(None), cache=cache)
    rng = np.random.default_rng(case[0])
    real = layout.cls <= run.n_classes  # padding holds 0 in both
    totals = [np.zeros(layout.shape), ref.upper[-1] + ref.upper[0], 2 * ref.upper[1],
              np.where(real, rng.integers(0, 3, layout.shape) / 4, 0.0)]
    for total in totals:
        got = ft.selection_scores(data, layout, total)
        want = [np.sum(np.argmax(total + ref.upper[e], axis=1) == ref.label_col)
                for e in range(run.n_epochs)]
        assert got.tolist() == want


def mass_boundary_run(seed, n_tokens=400, vocab=50, k=3):
    """A top-k run whose tokens' rival (the final checkpoint's largest class) is stored
    there only, and whose target lies below the k stored classes at every checkpoint:
    before the final one the unstored mass is near its probability (within a few percent
    either way, equal for some tokens), so the rival's bound u there is decided by that
    mass; at the final one nothing else is left unstored, so the unstored slot cannot
    settle a token the rival does not."""
    rng = np.random.default_rng(seed)
    n_epochs = 3
    targets = rng.integers(0, vocab, n_tokens)
    z = np.full((n_epochs, n_tokens, vocab), -30.0)
    for n, y in enumerate(targets):
        others = rng.permutation([c for c in range(vocab) if c != y])
        stored, rival, rest = others[:k], others[k], others[k + 1:]
        z[:, n, stored] = [2.0 + 0.1 * j for j in range(k)]
        z[:, n, y] = 1.5
        # the rest's mass: its probability times len(rest) near the target's
        level = 1.5 - np.log(len(rest)) + rng.choice([-0.05, -0.01, 0.0, 0.01, 0.05])
        z[:-1, n, rest] = level
        z[-1, n, rival] = 3.0  # stored, largest, at the final checkpoint only
        z[-1, n, stored[0]] = -30.0  # which leaves no unstored mass there
    z = z.astype(np.float32)
    records = np.stack([topk_records(x, targets, k) for x in z])
    return fk.Run(TopKOutputs(records, vocab, np.arange(n_tokens) // 10,
                              np.arange(n_tokens) % 10 + 1), targets, kind="topk")


@pytest.mark.parametrize("make", [partial(topk_run, *case) for case in CASES]
                         + [partial(mass_boundary_run, 7), partial(mass_boundary_run, 8, k=1)])
def test_settled_tokens_are_those_the_definition_names(make):
    """`Layout`'s settled tokens, against the definition on the reference's bounds: the
    final checkpoint's largest class other than the target, a class stored with a logit
    above the target's at the first checkpoint where that one fails, or the unstored slot
    (where the vocabulary has unstored classes), beats the target at every checkpoint by
    the margin and is at least the floor. The mass-boundary runs decide most checkpoints
    by their unstored mass (the rival's bound u, `kernels.topk._record_probs`)."""
    run = make()
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    layout = ft.Layout(data, range(run.n_epochs), slice(None), settle=True)
    records = np.asarray(run.outputs.records)
    rival = ft._rival(token_ids(records[-1]), run.labels)
    has_slot = run.n_epochs * data.top_k + 1 < run.n_classes
    want = []
    for n, row in enumerate(ref.rows):
        p_y = ref.upper[:, n, ref.label_col[n]]
        col_of = {c: i for i, (c, kind) in enumerate(row) if kind == "class"}

        def beats_at(col, n=n, p_y=p_y):
            up = ref.upper[:, n, col]
            return (up > p_y * (1 + 2.0 ** -20)) & (up >= 2.0 ** -900)

        cols = [i for i, (c, kind) in enumerate(row) if kind != "class" and has_slot]
        if rival[n] >= 0:
            cols.append(col_of[rival[n]])
            fails = np.flatnonzero(~beats_at(col_of[rival[n]]))
            if fails.size:  # the classes stored above the target where the rival fails
                rec = records[fails[0], n]
                cols += [col_of[c] for c, z in zip(token_ids(rec[None])[0], rec["logits"],
                                                   strict=True)
                         if c != run.labels[n] and z > rec["target"]]
        want.append(rival[n] >= 0 and any(beats_at(col).all() for col in cols))
    assert layout.settled.tolist() == want


def _room_beats_ref(record, y):
    """Whether the mass term of a record's unstored bound (max(0, 1 - mass) + slack, the
    mass summing its stored probabilities in order and then the target's where unstored)
    beats the target's probability by the settle margin and is at least the floor: plain
    Python, with the C library's exp."""
    top = float(record["lse"])
    probs = [math.exp(float(z) - top) for z in record["logits"]]
    p_y = math.exp(float(record["target"]) - top)
    total = 0.0
    for p in probs:
        total += p
    if y not in token_ids(record[None])[0].tolist():
        total += p_y
    slack = 2.0 ** -21 * max(abs(top), abs(float(record["logits"][0])), 1.0)
    room = max(0.0, 1.0 - total) + slack
    return room > p_y * (1 + 2.0 ** -20) and room >= 2.0 ** -900


@njit
def _room_beats_all(logits, ids, target, lse, targets):
    out = np.empty(logits.shape[:2], dtype=np.bool_)
    for e in range(logits.shape[0]):
        for s in range(logits.shape[1]):
            out[e, s] = kernels.topk._room_beats(logits, ids, target, lse, e, s, targets[s])
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_the_settle_scans_mass_test_is_the_definitions(k):
    """`kernels.topk._room_beats` (the settle scan's test of the unstored mass, decided from
    as few exps as it can) against the plain definition, on records whose unstored mass
    lies at the target's probability times the margin (within a few ulps to a few percent
    either way), far above it and far below it, peaked and flat, the target stored or not."""
    rng = np.random.default_rng(k)
    n, vocab = 3000, 500
    targets = rng.integers(0, vocab, n)
    z = np.full((n, vocab), -40.0)
    for i, y in enumerate(targets):
        stored = rng.choice([c for c in range(vocab) if c != y], k, replace=False)
        z[i, stored] = np.sort(rng.normal(size=k) * rng.choice([0.1, 1.0, 5.0]))[::-1]
        if rng.random() < 0.3:  # the target among the stored
            stored[rng.integers(k)] = y
            z[i, y] = z[i, stored].max() if k == 1 else z[i, stored[1:]].max()
        else:
            z[i, y] = z[i, stored].min() - rng.exponential(2.0)
        # the unstored rest's mass: a multiple of the target's probability near the margin
        want = np.exp(z[i, y]) * rng.choice([1 + 2.0 ** -20, 1.0, 1 - 1e-3, 1 + 1e-3, 1.05,
                                             0.95, 1e-3, 1e3, 1e6])
        rest = [c for c in range(vocab) if c != y and c not in stored]
        z[i, rest] = np.log(want / len(rest))
    records = topk_records(z.astype(np.float32), targets, k)[None]
    got = _room_beats_all(records["logits"], token_ids(records), records["target"],
                          records["lse"], targets)[0]
    want = [_room_beats_ref(records[0, i], targets[i]) for i in range(n)]
    assert got.tolist() == want
    assert 0.1 < np.mean(want) < 0.9  # both answers, many near the boundary


@pytest.mark.parametrize("case", CASES)
def test_mixes_equal_the_reference_state(case):
    """The fit's mix (each window's mean made row by row and mixed at once) leaves the
    fusion, its leads and the forget counts as the reference's numpy mix does."""
    run = topk_run(*case)
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    correct = np.asarray(run.correctness())
    got = ft.TopKFitChunk(data, slice(None))
    assert np.array_equal(got.correct, correct)
    want = ReferenceChunk(ref, correct)
    last = run.n_epochs - 1
    for window, eps in ((range(0, 2), 0.3), (range(last - 1, last + 1), 0.01),
                        (range(1, 4), 1.0), (range(2, 3), 0.5)):
        assert np.array_equal(got.grid_counts(window, np.arange(11) / 10),
                              want.grid_counts(window, np.arange(11) / 10))
        got.mix(window, eps)
        want.mix(window, eps)
        assert np.array_equal(got.prob, want.prob)
        for a, b in zip((*got.stats, got.cur, got.missed), (*want.stats, want.cur, want.missed),
                        strict=True):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("case", CASES[:3])
def test_selection_totals_equal_the_sums_of_bounds(case):
    """A selection's running total (each pick's row made and added at once) is numpy's sum
    of the picks' bounds, and the picks are those of the reference's greedy rounds."""
    run = topk_run(*case)
    ref = Reference(run)
    data = kind_of(run).certified_bounds(run)
    layout = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    total, want = np.zeros(layout.shape), np.zeros(layout.shape)
    for e in (run.n_epochs - 1, 0, 0, 2):
        layout.add_into(data, [e], total)
        want += ref.upper[e]
        assert np.array_equal(total, want)
    picks, want_total = [], np.zeros(layout.shape)
    for _ in range(4):
        scores = [np.sum(np.argmax(want_total + ref.upper[e], axis=1) == ref.label_col)
                  for e in range(run.n_epochs)]
        picks.append(int(np.argmax(scores)))
        want_total += ref.upper[picks[-1]]
    assert ft.topk_selection(data, 4) == picks


@pytest.mark.parametrize("case", [CASES[0], CASES[3], (6, 4, 60, 6, 6, True)])
def test_layout_hits_are_the_runs_correctness(case):
    """The correctness a fit's layout reads with its records (with or without a record
    cache; every class stored) is the run's, at the tokens it keeps."""
    run = topk_run(*case)
    data = kind_of(run).certified_bounds(run)
    correct = np.asarray(run.correctness())
    for settle, cache in ((False, True), (False, False), (True, True), (True, False)):
        layout = ft.Layout(data, range(run.n_epochs), slice(1, None), settle=settle,
                           cache=cache, hits=True)
        assert np.array_equal(layout.hits, correct[:, 1:][:, ~layout.settled])


def test_record_caches_stay_within_the_process_budget(monkeypatch):
    """Layouts keep record probabilities while `CACHE_BYTES` has room in the process, give
    the bytes back when freed, and a fit without any cache gives the same plan. A layout
    without a cache still reads each window's records after a pickle round trip."""
    import gc
    import pickle

    from forgetkit.kinds import topk as kt

    run = topk_run(2, 8, 300, 30, 3, False)
    data = kind_of(run).certified_bounds(run)
    gc.collect()
    one = run.n_epochs * run.n_samples * (data.top_k + 2) * 8
    monkeypatch.setattr(kt, "CACHE_BYTES", kt._cache_used[0] + one)
    first = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    second = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    assert first.cache.shape == (run.n_epochs, run.n_samples, data.top_k + 2)
    assert second.cache.size == 0  # no room: its windows read the records
    del first
    gc.collect()
    third = ft.Layout(data, range(run.n_epochs), slice(None), cache=True)
    assert third.cache.size > 0
    moved = pickle.loads(pickle.dumps(second))  # as a dask worker gets it from another
    for window in ([0, 1], [5]):
        a, b, c = np.empty(second.shape), np.empty(third.shape), np.empty(moved.shape)
        assert np.array_equal(ft.window_mean(data, window, second, a)[0],
                              ft.window_mean(data, window, third, b)[0])
        assert np.array_equal(ft.window_mean(data, window, moved, c)[0], b)
    del second, third, moved
    gc.collect()
    monkeypatch.setattr(kt, "CACHE_BYTES", kt._cache_used[0] + 10 * one)
    cached, picked = fk.KnowledgeFusion().fit(run), fk.EnsembleSelection().fit(run)
    monkeypatch.setattr(kt, "CACHE_BYTES", 0)
    bare, bare_picked = fk.KnowledgeFusion().fit(run), fk.EnsembleSelection().fit(run)
    assert bare.plan_ == cached.plan_ and bare.val_accuracy_ == cached.val_accuracy_
    assert np.array_equal(bare_picked.weights_, picked.weights_)
