import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import forgetkit as fk
from forgetkit.fusion import (
    CheckpointAverage,
    EarlyStopping,
    EnsembleSelection,
    KnowledgeFusion,
    LikelihoodFusion,
    average_runs,
    best_continuous_eps,
    fixed_epochs,
    fixed_jumps,
    horizontal,
    multi_run,
    single,
    snapshot,
    uniform,
)
from forgetkit.fusion.fitstate import FullFitChunk
from forgetkit.kernels import eps_search as keps

from .conftest import make_run
from .reference import (
    apply_plan_ref,
    ensemble_selection_ref,
    grid_accuracy_ref,
    knowledge_fusion_ref,
)


def tie_heavy(n, c, seed):
    """Probability-like rows rounded to multiples of 1/64: many exact ties."""
    rng = np.random.default_rng(seed)
    a = np.round(rng.random((n, c)) * 8) / 64
    b = np.round(rng.random((n, c)) * 8) / 64
    return a, b, rng.integers(0, c, n)


# ------------------------------------------------------------------ the eps kernel
def label_leads(p, y):
    """``keps.label_leads`` of p: (lead, magnitude, top), correct."""
    n = len(y)
    lead, magnitude = np.empty(n), np.empty(n)
    top, correct = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    keps.label_leads(p, y, lead, magnitude, top, correct)
    return (lead, magnitude, top), correct


def grid_counts(a, b, y, grid, n_blocks):
    return keps.grid_correct_counts(a, b, y, *label_leads(b, y)[0], grid, 1e-12, n_blocks)


@pytest.mark.parametrize("seed", range(3))
def test_label_leads_match_numpy(seed):
    p, _, y = tie_heavy(3000, 6, seed)
    p[:5] = -p[:5]  # negative values too
    (lead, magnitude, top), correct = label_leads(p, y)
    rows = np.arange(len(y))
    others = p.copy()
    others[rows, y] = -np.inf
    np.testing.assert_array_equal(lead, p[rows, y] - others.max(1))
    np.testing.assert_array_equal(magnitude, np.abs(p).max(1))
    np.testing.assert_array_equal(top, np.where(lead <= 0, others.argmax(1), -1))
    np.testing.assert_array_equal(correct, p.argmax(1) == y)
    assert (lead == 0).sum() > 100  # the ties were exercised


def test_mix_into_equals_numpy_then_label_leads():
    a, b, y = tie_heavy(2000, 5, 7)
    for eps in (0.0, 0.25, 0.5, 1.0):
        ref = eps * a + (1 - eps) * b
        out = b.copy()
        n = len(y)
        lead, magnitude = np.empty(n), np.empty(n)
        top, correct = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
        keps.mix_into(a, out, eps, y, lead, magnitude, top, correct)
        np.testing.assert_array_equal(out, ref)
        (lead_ref, magnitude_ref, top_ref), correct_ref = label_leads(ref, y)
        for got, want in ((lead, lead_ref), (magnitude, magnitude_ref), (top, top_ref),
                          (correct, correct_ref)):
            np.testing.assert_array_equal(got, want)
        plain = b.copy()
        keps.mix(a, plain, eps)
        np.testing.assert_array_equal(plain, ref)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n_grid", [11, 101])
def test_grid_kernel_is_exact_on_tie_heavy_data(seed, n_grid):
    a, b, y = tie_heavy(4000, 7, seed)
    grid = np.arange(n_grid) / (n_grid - 1)
    counts = grid_counts(a, b, y, grid, 8)
    assert np.array_equal(counts / len(y), grid_accuracy_ref(a, b, y, grid))


@given(st.integers(1, 300), st.integers(2, 9), st.integers(0, 10**6), st.booleans())
@settings(max_examples=60, deadline=None)
def test_grid_kernel_property(n, c, seed, ties):
    rng = np.random.default_rng(seed)
    if ties:
        a, b, y = tie_heavy(n, c, seed)
    else:
        a = rng.dirichlet(np.ones(c), n)
        b = rng.dirichlet(np.ones(c), n)
        y = rng.integers(0, c, n)
    grid = np.arange(101) / 100
    counts = grid_counts(a, b, y, grid, 3)
    assert np.array_equal(counts / n, grid_accuracy_ref(a, b, y, grid))


@pytest.mark.parametrize("seed", range(4))
def test_continuous_eps_is_at_least_as_good_as_any_grid(seed):
    rng = np.random.default_rng(seed)
    a = rng.dirichlet(np.ones(5) * 0.5, 2000)
    b = rng.dirichlet(np.ones(5) * 0.5, 2000)
    y = rng.integers(0, 5, 2000)
    eps, count = best_continuous_eps(a, b, y)
    fine = np.arange(2001) / 2000
    assert count == np.sum(np.argmax(eps * a + (1 - eps) * b, 1) == y)
    assert count >= np.max(grid_accuracy_ref(a, b, y, fine) * 2000) - 1e-9


# --------------------------------------------------------------- the algorithm
@pytest.mark.parametrize("window", [0, 1, 2])
@pytest.mark.parametrize("rule", ["best", "paper"])
@pytest.mark.parametrize("grid", [11, 101])
def test_kf_equals_reference_on_random_runs(window, rule, grid):
    for seed in range(3):
        run = make_run(n_epochs=9, n_samples=400, n_classes=4, seed=seed, ties=seed == 2)
        kf = KnowledgeFusion(window=window, grid=grid, rule=rule).fit(run)
        plan, accs = knowledge_fusion_ref(run.probs(), run.labels, window=window, grid=grid,
                                          rule=rule)
        assert kf.plan_ == plan
        assert kf.val_accuracy_ == accs
        np.testing.assert_array_equal(kf.predict_proba(run),
                                      apply_plan_ref(run.probs(), plan, window))


@pytest.mark.parametrize("window", [0, 1, 2])
@pytest.mark.parametrize("rule", ["best", "paper"])
def test_kf_equals_reference_on_the_real_run(real_run, window, rule):
    val, test = real_run.split(0.5, seed=1)
    kf = KnowledgeFusion(window=window, rule=rule).fit(val)
    plan, accs = knowledge_fusion_ref(val.probs(), val.labels, window=window, rule=rule)
    assert kf.plan_ == plan and kf.val_accuracy_ == accs
    np.testing.assert_array_equal(kf.predict_proba(test), apply_plan_ref(test.probs(), plan,
                                                                           window))


@pytest.mark.parametrize("seed", range(3))
def test_a_deferred_mix_is_the_mix_made_at_once(seed):
    """The fit mixes a window after its grid counts by reading each sample's correctness
    from the counts' spans (the brute-force arithmetic for samples near a tie), and updates
    the fusion in the next counts' pass: the same correctness, forget counts and fusion,
    bit for bit, as the mix made at once."""
    run = make_run(n_epochs=9, n_samples=400, n_classes=4, seed=seed, ties=True)
    values = np.array(run.outputs)
    values[:, :40] = 0.0  # every class tied at every epoch: the arithmetic decides each eps
    run = fk.Run(values, run.labels)
    grid = np.arange(11) / 10
    deferred, at_once = FullFitChunk(run), FullFitChunk(run)
    assert deferred.logits is not None  # logits read in place: the deferring path
    for window, next_window in ((range(2, 5), range(0, 2)), (range(5, 8), range(1, 3))):
        counts = deferred.grid_counts(window, grid)
        g = int(np.argmax(counts[1:])) + 1  # eps > 0
        p0, w0, w1, p1 = deferred.spans
        near_a_tie = (p0 <= g) & (g < p1) & ~((w0 <= g) & (g < w1))
        deferred.mix(window, grid[g])
        at_once.mix(window, grid[g])
        assert deferred.pending == grid[g] and at_once.pending is None
        assert near_a_tie[:40].all()
        np.testing.assert_array_equal(deferred.cur, at_once.cur)
        np.testing.assert_array_equal(deferred.missed, at_once.missed)
        assert int(deferred.cur.sum()) == counts[g]
        np.testing.assert_array_equal(deferred.grid_counts(next_window, grid),
                                      at_once.grid_counts(next_window, grid))
        assert deferred.pending is None
        np.testing.assert_array_equal(deferred.prob, at_once.prob)
        for mine, theirs in zip(deferred.stats, at_once.stats, strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_the_window_counts_region_gives_the_bits_of_one_thread(monkeypatch):
    """Where it is compiled, a fit's window counts run as their kernel's region (numba's
    threads in one parallel region, `jit.Kernel.on_threads`): the same counts, spans,
    correctness and fusion at each step as on one thread, and the same plan."""
    from forgetkit.kernels import jit

    monkeypatch.setattr(jit, "REGION_THREADS", 1)  # compiled, and run, on any machine
    used = []
    ready = jit.region_ready
    monkeypatch.setattr(jit, "region_ready",
                        lambda k, full: used.append(ready(k, full)) or used[-1])
    run = make_run(n_epochs=9, n_samples=400, n_classes=4, seed=3, ties=True)
    values = np.array(run.outputs, dtype=np.float32)
    values[:, :40] = 0.0  # tied rows: the arithmetic decides, in whichever thread
    run = fk.Run(values, run.labels)
    grid = np.arange(11) / 10
    with jit.forced("parallel"):
        region = FullFitChunk(run)
    serial = FullFitChunk(run)
    for window in (range(2, 5), range(0, 2), range(5, 8), range(1, 3)):
        with jit.forced("parallel"):
            counts = region.grid_counts(window, grid)
        with jit.forced("serial"):
            np.testing.assert_array_equal(counts, serial.grid_counts(window, grid))
        np.testing.assert_array_equal(region.spans, serial.spans)
        g = int(np.argmax(counts[1:])) + 1
        region.mix(window, grid[g])
        serial.mix(window, grid[g])
        np.testing.assert_array_equal(region.cur, serial.cur)
    region.window_mean(range(0, 9)), serial.window_mean(range(0, 9))  # settles the mixes
    np.testing.assert_array_equal(region.prob, serial.prob)
    with jit.forced("parallel"):
        plan = fk.KnowledgeFusion().fit(run)
    with jit.forced("serial"):
        assert plan.plan_ == fk.KnowledgeFusion().fit(run).plan_
    assert (True in used) == (numba_threads() > 1)


def test_the_window_counts_region_sums_what_the_threads_count(monkeypatch):
    """The window counts as their region add up every thread's counts, rows holding inf or
    nan, and rows whose correctness a mix changed, as one thread does."""
    from forgetkit import kernels
    from forgetkit.kernels import jit
    from forgetkit.run import softmax

    monkeypatch.setattr(jit, "REGION_THREADS", 1)
    run = make_run(n_epochs=9, n_samples=2000, n_classes=5, seed=4, ties=True)
    values = np.array(run.outputs, dtype=np.float32)
    values[3, ::37, 1] = np.inf  # 55 rows not whole in a window holding epoch 3
    labels, rows, grid = run.labels, np.arange(2000), np.arange(11) / 10
    results = {}
    for build in ("serial", "parallel"):
        prob = softmax(values[-1].astype(np.float64))
        leads, correct = kernels.label_leads(prob, labels)
        mean, spans = np.zeros_like(prob), np.zeros((4, 2000), dtype=np.int32)
        with jit.forced(build):
            first = kernels.window_grid_counts(values, range(5, 8), rows, prob, labels, leads,
                                               correct, grid, 1e-12, mean, spans)
            # the mean of 5-7 mixed in by 0.7 (not chosen from the spans: rows change)
            second = kernels.window_grid_counts(values, range(2, 5), rows, prob, labels,
                                                leads, correct, grid, 1e-12, mean, spans,
                                                mix_eps=0.7)
        results[build] = first, second, prob, correct, spans
    assert keps.window_grid_counts.ran_region == (numba_threads() > 1)
    serial, region = results["serial"], results["parallel"]
    (counts, bad, changed), (counts2, bad2, changed2) = serial[:2]
    assert bad == 0 and bad2 == 55 and changed == 0 and changed2 > 0
    for mine, theirs in zip(region[:2], serial[:2], strict=True):
        np.testing.assert_array_equal(mine[0], theirs[0])
        assert mine[1:] == theirs[1:]
    for mine, theirs in zip(region[2:], serial[2:], strict=True):
        np.testing.assert_array_equal(mine, theirs)


def numba_threads():
    import numba

    return numba.get_num_threads()


@pytest.mark.parametrize("made_by", ["counts", "settle"])
def test_a_deferred_mix_that_disagrees_with_its_spans_raises(made_by):
    """The correctness a deferred mix set is checked when the mix is made, in the next
    counts' pass or wherever the fusion is read otherwise: a disagreement raises."""
    run = make_run(n_epochs=9, n_samples=400, n_classes=4, seed=1)
    grid = np.arange(11) / 10
    chunk = FullFitChunk(run)
    chunk.grid_counts(range(2, 5), grid)
    chunk.mix(range(2, 5), grid[5])
    chunk.cur[0] = not chunk.cur[0]  # what the mix will not reproduce
    with pytest.raises(RuntimeError, match="correctness of 1 sample"):
        if made_by == "counts":
            chunk.grid_counts(range(0, 2), grid)
        else:
            chunk.continuous_eps(range(0, 2), "best", None)


def test_a_chunk_whose_spans_do_not_describe_the_mix_mixes_at_once():
    """Spans describe the fusion their counts saw: after a mix off their grid, or another
    window's mean, the next mix is made at once, the same as on a chunk that never counted."""
    run = make_run(n_epochs=9, n_samples=400, n_classes=4, seed=3, ties=True)
    grid = np.arange(11) / 10
    w1, w2, w3 = range(1, 4), range(4, 7), range(6, 9)
    for calls in ([("grid", w1), ("mix", w1, 0.55), ("mix", w1, 0.5)],
                  [("grid", w1), ("continuous", w2), ("mix", w1, 0.5)],
                  [("grid", w1), ("mix", w1, 0.5), ("continuous", w2), ("mix", w2, 0.3),
                   ("grid", w3), ("mix", w3, 0.2)]):
        chunk, at_once = FullFitChunk(run), FullFitChunk(run)
        for call in calls:
            if call[0] == "grid":
                chunk.grid_counts(call[1], grid)
            elif call[0] == "continuous":
                chunk.continuous_eps(call[1], "best", None)
            else:
                chunk.mix(call[1], call[2])
                at_once.mix(call[1], call[2])
                np.testing.assert_array_equal(chunk.cur, at_once.cur)
                np.testing.assert_array_equal(chunk.missed, at_once.missed)
        chunk.continuous_eps(w3, "best", None)  # makes a deferred mix
        np.testing.assert_array_equal(chunk.prob, at_once.prob)


def test_budget_and_early_stop_match_reference(real_small):
    for kw in ({"max_windows": 1}, {"max_windows": 3}, {"stop_when_no_gain": True}):
        kf = KnowledgeFusion(**kw).fit(real_small)
        plan, _ = knowledge_fusion_ref(real_small.probs(), real_small.labels, **kw)
        assert kf.plan_ == plan
    kf1 = KnowledgeFusion(max_windows=1).fit(real_small)
    assert sum(eps > 0 for _, eps in kf1.plan_) <= 1
    assert kf1.ensemble_size_ <= 4


def test_with_windows_is_the_budgeted_fit_and_staged_stages_are_its_predictions(real_small):
    val, test = real_small.split(0.5, seed=1)
    kf = KnowledgeFusion().fit(val)
    stages = [p.copy() for p in kf.staged_predict_proba(test)]
    n_used = sum(eps > 0 for _, eps in kf.plan_)
    assert len(stages) == n_used + 1 >= 3
    for i in (0, 1, 2, n_used):
        kf_i = kf.with_windows(i)
        if i:
            assert kf_i.plan_ == KnowledgeFusion(max_windows=i).fit(val).plan_
        np.testing.assert_array_equal(kf_i.predict_proba(test), stages[i])
    np.testing.assert_array_equal(stages[0], test.probs(-1))
    np.testing.assert_array_equal(stages[-1], kf.predict_proba(test))


def test_kf_beats_single_network_on_the_real_run(real_run):
    gains = []
    for seed in (0, 1, 2):
        val, test = real_run.split(0.5, seed=seed)
        kf = KnowledgeFusion().fit(val)
        gains.append(np.mean(kf.predict(test) == test.labels)
                     - np.mean(np.argmax(test.probs(-1), 1) == test.labels))
    assert np.mean(gains) > 0


@given(st.integers(0, 10**6), st.sampled_from([0, 1, 2]), st.sampled_from([None, 11]))
@settings(max_examples=25, deadline=None)
def test_fused_probabilities_sum_to_one(seed, window, grid):
    run = make_run(n_epochs=6, n_samples=120, n_classes=5, seed=seed)
    p = KnowledgeFusion(window=window, grid=grid).fit(run).predict_proba(run)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert (p >= 0).all()


def test_continuous_grid_never_loses_to_the_101_grid(real_small):
    cont = KnowledgeFusion(grid=None, max_windows=1).fit(real_small)
    grid = KnowledgeFusion(max_windows=1).fit(real_small)
    assert cont.val_accuracy_[0] >= grid.val_accuracy_[0]


def test_plan_json_roundtrip_and_checkpoints_only_inference(real_run, tmp_path):
    val, test = real_run.split(0.5, seed=0)
    kf = KnowledgeFusion().fit(val)
    kf.to_json(tmp_path / "plan.json")
    back = KnowledgeFusion.from_json(tmp_path / "plan.json")
    assert back.plan_ == kf.plan_ and back.checkpoints_ == kf.checkpoints_
    full = kf.predict_proba(test)
    np.testing.assert_array_equal(back.predict_proba(test), full)
    only = test.isel(epochs=kf.checkpoints_)  # production: just the needed checkpoints
    np.testing.assert_array_equal(back.predict_proba(only), full)
    rec = json.loads(kf.to_json())
    assert rec["checkpoints"][-1]["epoch"] == 59


# ------------------------------------------------------------------ bad input
def test_kf_refuses_bad_input():
    run = make_run(n_epochs=5, n_samples=50)
    with pytest.raises(ValueError, match="not fitted yet"):
        KnowledgeFusion().predict_proba(run)
    with pytest.raises(ValueError, match="window must be >= 0; got -1"):
        KnowledgeFusion(window=-1).fit(run)
    with pytest.raises(ValueError, match="grid must be >= 2; got 1"):
        KnowledgeFusion(grid=1).fit(run)
    with pytest.raises(ValueError, match="rule must be one of 'best', 'paper'; got 'greedy'"):
        KnowledgeFusion(rule="greedy").fit(run)
    with pytest.raises(ValueError, match="single class"):
        KnowledgeFusion().fit(fk.Run(run.outputs, np.zeros(50, int)))
    with pytest.raises(ValueError, match="at least 2 samples; got 1"):
        KnowledgeFusion().fit(run.isel(samples=[0]))
    with pytest.raises(ValueError, match="at least 2 epochs; got 1"):
        KnowledgeFusion().fit(run.isel(epochs=[4]))
    kf = KnowledgeFusion().fit(run)
    other = fk.Run(run.outputs, run.labels, epochs=[10, 11, 12, 13, 14])
    with pytest.raises(ValueError, match="lacks epochs"):
        kf.predict_proba(other)
    with pytest.raises(ValueError, match="has 3 classes; the fusion was fitted on 5"):
        kf.predict_proba(make_run(n_epochs=5, n_classes=3))
    with pytest.raises(TypeError, match="labels are required"):
        KnowledgeFusion().fit(np.asarray(run.outputs))
    with pytest.raises(ValueError, match="not a forgetkit Knowledge Fusion plan"):
        KnowledgeFusion.from_json('{"format": "other"}')


def test_fit_accepts_outputs_and_labels():
    run = make_run()
    a = KnowledgeFusion().fit(np.asarray(run.outputs), run.labels)
    assert a.plan_ == KnowledgeFusion().fit(run).plan_


# -------------------------------------------------------------------- baselines
def test_fixed_averages():
    run = make_run(n_epochs=10)
    p = run.probs()
    assert fixed_epochs(10, "fixed_jumps", 3) == [3, 6, 9]
    assert fixed_epochs(10, "horizontal", 3) == [7, 8, 9]
    np.testing.assert_array_equal(single(run), p[9])
    np.testing.assert_allclose(horizontal(run, 3), p[7:].mean(0), rtol=1e-15)
    np.testing.assert_allclose(fixed_jumps(run, 3), p[[3, 6, 9]].mean(0), rtol=1e-15)
    np.testing.assert_allclose(uniform(run), p.mean(0), rtol=1e-14)
    np.testing.assert_allclose(snapshot(run, [4, 9]), p[[4, 9]].mean(0), rtol=1e-15)
    with pytest.raises(ValueError, match="lacks epochs \\[12\\]"):
        snapshot(run, [4, 12])
    with pytest.raises(ValueError, match="at least one stored epoch"):
        snapshot(run, [])
    with pytest.raises(ValueError, match="max_checkpoints=11 exceeds the 10 stored epochs"):
        horizontal(run, 11)


def test_early_stopping_and_selection_match_reference(real_small):
    es = EarlyStopping().fit(real_small)
    assert es.checkpoints_ == [int(np.argmax(fk.accuracy(real_small)))]
    sel = EnsembleSelection(max_checkpoints=20).fit(real_small)
    assert sel.selection_ == ensemble_selection_ref(real_small.probs(), real_small.labels, 20)
    np.testing.assert_allclose(sel.predict_proba(real_small).sum(1), 1, atol=1e-12)


def test_ensemble_selection_streams_large_runs(real_small, tmp_path, monkeypatch):
    """Without the probability cache (a run too large for memory) the picks are the same."""

    fk.save(real_small, tmp_path / "r.npy")
    sel = EnsembleSelection(max_checkpoints=8, memory_budget=0).fit(fk.load(tmp_path /
                                                                            "r.npy"))
    assert sel.selection_ == ensemble_selection_ref(real_small.probs(), real_small.labels, 8)
    # a lazy subset of the memmap (the protocol's validation half) is read in place, and a
    # Parquet run is decoded epoch by epoch
    rows = np.random.default_rng(0).permutation(real_small.n_samples)[:900]
    ref = ensemble_selection_ref(real_small.probs()[:, rows], real_small.labels[rows], 20)
    streamed = EnsembleSelection(max_checkpoints=20, memory_budget=0)
    assert streamed.fit(fk.load(tmp_path / "r.npy").isel(samples=rows)).selection_ == ref
    fk.save(real_small, tmp_path / "r.parquet", layout="binary")
    assert streamed.fit(fk.load(tmp_path / "r.parquet").isel(samples=rows)).selection_ == ref


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("budget", ["row", "class", "gathered"])
def test_streamed_selection_on_candidate_classes_is_exact(dtype, ties, budget, tmp_path):
    """Diffuse outputs over many classes: later rounds score only the classes that can still
    win (bounded by each class's largest probability over the epochs, or each row's when
    (N, C) does not fit the budget; with more budget, the candidates' values are gathered
    and kept between rounds); picks equal the brute force's, for logits and for a
    probabilities run too large to hold."""

    run = make_run(n_epochs=9, n_samples=400, n_classes=60, dtype=dtype, ties=ties)
    # "class": the bound fits, nothing more; "gathered": all but the probabilities fit
    budget = {"row": 0, "class": 400 * 60 * 8, "gathered": 9 * 400 * 60 * 8 - 1}[budget]
    ref = ensemble_selection_ref(run.probs(), run.labels, 15)
    fk.save(run, tmp_path / "r.npy")
    sel = EnsembleSelection(max_checkpoints=15, memory_budget=budget)
    assert sel.fit(fk.load(tmp_path / "r.npy")).selection_ == ref
    probs = run.replace(outputs=run.probs().astype(dtype), kind="probs", validate=False)
    fk.save(probs, tmp_path / "p.npy")
    assert sel.fit(fk.load(tmp_path / "p.npy")).selection_ == \
        ensemble_selection_ref(probs.probs(), run.labels, 15)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gathered_entries_hold_each_live_rows_candidates(dtype):
    """Round after round of random candidate lists, every live row's entry holds its
    candidates and their stored values at every epoch: kept where it held them, read anew
    where not, moved when the buffers fill; over the budget, every entry is dropped."""
    from forgetkit.fusion.selection import _Entries

    rng = np.random.default_rng(3)
    n_epochs, n_samples, n_classes = 4, 60, 12
    values = rng.normal(size=(n_epochs, n_samples + 7, n_classes)).astype(dtype)
    src = rng.permutation(n_samples + 7)[:n_samples]
    run = fk.Run(values[:, src], rng.integers(0, n_classes, n_samples))
    per_class = n_epochs * values.itemsize + 8
    entries = _Entries(run, 100 * per_class)  # room for 100 classes: moves and refusals
    held = moved = refused = 0
    for _ in range(40):
        rows = np.sort(rng.choice(n_samples, rng.integers(1, 40), replace=False))
        cands = [np.sort(rng.choice(n_classes, rng.integers(2, 5), replace=False))
                 for _ in rows]
        ptr = np.concatenate([[0], np.cumsum([c.size for c in cands])])
        before = entries.cls
        kept = entries.offset[rows].copy()
        if not entries.update((values, src), rows, ptr, np.concatenate(cands)):
            assert (entries.offset == -1).all() and entries.used == 0
            refused += 1
            continue
        moved += entries.cls is not before
        assert entries.used <= entries.cls.size <= entries.limit
        others = np.setdiff1d(np.flatnonzero(entries.offset >= 0), rows)
        for r in others:  # rows not live this round keep a valid entry
            o, n = entries.offset[r], entries.size[r]
            got = entries.values[n_epochs * o: n_epochs * (o + n)].reshape(n_epochs, n)
            np.testing.assert_array_equal(got, values[:, src[r]][:, entries.cls[o:o + n]])
        for r, c in zip(rows, cands, strict=True):
            o, n = entries.offset[r], entries.size[r]
            cls = entries.cls[o:o + n]
            assert np.isin(c, cls).all() and (np.diff(cls) > 0).all()
            got = entries.values[n_epochs * o: n_epochs * (o + n)].reshape(n_epochs, n)
            np.testing.assert_array_equal(got, values[:, src[r]][:, cls])
            held += kept[rows == r][0] == o
    assert held > 0 and moved > 1 and refused > 0


def test_streamed_selection_names_bad_values(tmp_path, monkeypatch):

    out = np.array(make_run(n_epochs=4, n_samples=50, n_classes=6).outputs)
    out[2, 7, 1] = np.inf
    np.save(tmp_path / "r.npy", out)
    run = fk.load(tmp_path / "r.npy", labels=make_run(n_epochs=4, n_samples=50,
                                                      n_classes=6).labels)
    with pytest.raises(ValueError, match="epoch 2"):
        EnsembleSelection(max_checkpoints=2, memory_budget=0).fit(run)


def test_multi_run_and_tta():
    runs = [make_run(seed=0), fk.Run(make_run(seed=1).outputs, make_run(seed=0).labels)]
    np.testing.assert_allclose(multi_run(runs), (single(runs[0]) + single(runs[1])) / 2)
    avg = average_runs(runs)
    assert avg.kind == "probs"
    np.testing.assert_allclose(avg.probs(3), (runs[0].probs(3) + runs[1].probs(3)) / 2)
    KnowledgeFusion().fit(avg)  # combinable with KF
    with pytest.raises(ValueError, match="other labels"):
        multi_run([make_run(seed=0), make_run(seed=1)])


def test_streamed_runs_fuse_like_cached_ones(real_small, tmp_path, monkeypatch):
    """Likelihood fusion and the fixed averages read a streamed run's logits in place (rows
    of a lazy subset included) and give the cached computation's results."""

    rows = np.random.default_rng(4).permutation(real_small.n_samples)[:700]
    cached = real_small.isel(samples=rows)
    ref_lf = LikelihoodFusion(max_checkpoints=4).fit(cached)
    ref_h = horizontal(cached, 5)
    fk.save(real_small, tmp_path / "r.npy")
    streamed = fk.load(tmp_path / "r.npy").isel(samples=rows)
    lf = LikelihoodFusion(max_checkpoints=4).fit(streamed)
    assert lf.checkpoints_ == ref_lf.checkpoints_
    np.testing.assert_array_equal(lf.weights_, ref_lf.weights_)
    np.testing.assert_array_equal(horizontal(streamed, 5), ref_h)
    np.testing.assert_array_equal(lf.predict_proba(streamed), ref_lf.predict_proba(cached))


def test_likelihood_fusion_reaches_the_optimum(real_small):
    """At the maximum of the concave log-likelihood over the simplex (KKT): the gradient
    mean(q_e / mix) is 1 on every kept checkpoint and at most 1 on every checkpoint, those
    the fit dropped (weight exactly 0: min_weight=0 keeps every positive one) included,
    to the precision that tol=1e-10 gives (plain EM stopped at 2,000 iterations 2.2e-4
    away; SQUAREM's EM 2e-5)."""

    q = np.maximum(real_small.label_probs(), 1e-300)
    lf = LikelihoodFusion(min_weight=0.0).fit(real_small)
    assert lf.n_iter_ < lf.max_iter and (lf.weights_ > 0).all()
    w = np.zeros(real_small.n_epochs)
    w[lf.checkpoints_] = lf.weights_
    gradient = (q / (q @ w)[:, None]).mean(axis=0)
    assert gradient.max() < 1 + 1e-9
    np.testing.assert_allclose(gradient[lf.checkpoints_], 1, atol=1e-9)
    with pytest.warns(RuntimeWarning, match="max_iter=3"):
        short = LikelihoodFusion(max_iter=3, min_weight=0.0).fit(real_small)
    assert short.log_likelihood_ <= lf.log_likelihood_ + 1e-12


def test_likelihood_fusion_runs_blas_on_one_thread(real_small, monkeypatch):
    """The fit's matrix products run on one BLAS thread (many BLAS threads spun beside
    numba's and gained nothing on these skinny products), and the setting is restored."""
    from threadpoolctl import threadpool_info

    from forgetkit.fusion import likelihood

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    seen, hessian = [], likelihood._hessian

    def spy(*args):
        seen.append(blas_threads())
        return hessian(*args)

    before = blas_threads()
    monkeypatch.setattr(likelihood, "_hessian", spy)
    LikelihoodFusion().fit(real_small)
    assert seen and all(threads == {1} for threads in seen)
    assert blas_threads() == before


def test_likelihood_fusion(real_small):
    lf = LikelihoodFusion().fit(real_small)
    assert np.isclose(lf.weights_.sum(), 1) and (lf.weights_ >= 0).all()
    p = real_small.probs()
    y = real_small.labels
    ll_single = np.mean(np.log(p[-1][np.arange(len(y)), y]))
    ll_uniform = np.mean(np.log(p.mean(0)[np.arange(len(y)), y]))
    assert lf.log_likelihood_ >= max(ll_single, ll_uniform)
    pruned = LikelihoodFusion(max_checkpoints=3).fit(real_small)
    assert pruned.ensemble_size_ == 3 and len(pruned.weights_) == 3
    np.testing.assert_allclose(pruned.predict_proba(real_small).sum(1), 1, atol=1e-12)
    horizontal = CheckpointAverage("horizontal", max_checkpoints=3).fit(real_small)
    assert horizontal.checkpoints_ == [57, 58, 59]


@pytest.mark.parametrize("grid", [np.arange(101) / 100, np.arange(11) / 10, np.arange(2) / 1,
                                  np.array([0.5]), np.array([0.0, 0.001, 0.5, 0.51, 1.0]),
                                  np.array([0.3, 0.3, 0.7]),
                                  np.sort(np.random.default_rng(3).random(37) ** 3)])
def test_grid_searches_match_numpy_searchsorted(grid):
    """The searches start from the uniform grid's index and walk: exact on any grid."""
    from numba import njit

    @njit
    def both(grid, xs):
        out = np.empty((2, xs.shape[0]), dtype=np.int64)
        for i in range(xs.shape[0]):
            out[0, i] = keps._first_above(grid, xs[i])
            out[1, i] = keps._first_at_least(grid, xs[i])
        return out

    xs = np.concatenate([grid, np.nextafter(grid, 2), np.nextafter(grid, -1),
                         np.linspace(-0.5, 1.5, 997), [-np.inf, np.inf, 0.0, -0.0, -1e300, 1e300]])
    above, at_least = both(grid, xs)
    np.testing.assert_array_equal(above, np.searchsorted(grid, xs, side="right"))
    np.testing.assert_array_equal(at_least, np.searchsorted(grid, xs, side="left"))
