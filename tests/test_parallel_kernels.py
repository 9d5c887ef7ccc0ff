"""The kernels that took serial numpy steps off the forgetting pass, the Knowledge Fusion fit
and `compare` (rows read in place from a sample subset, row tops, undecided rows of ensemble
selection), each against a plain numpy reference."""

import numpy as np
import pytest

import forgetkit as fk
from forgetkit import kernels
from forgetkit.evaluate import ece, nll, prediction_metrics
from forgetkit.run import softmax

from .conftest import make_run


@pytest.fixture(autouse=True, params=["serial", "parallel"])
def build(request):
    """Every test runs on the caller's thread alone and on every thread
    (``kernels.forced``; unforced, calls below ``kernels.jit.PARALLEL_WORK`` take one
    thread, larger ones all)."""
    with kernels.forced(request.param):
        yield request.param


def f16_with_specials(shape, seed):
    """float16 values with many ties, some inf and nan."""
    rng = np.random.default_rng(seed)
    x = (np.round(rng.normal(size=shape) * 2) / 2).astype(np.float16)
    flat = x.reshape(-1)
    for value in (np.inf, -np.inf, np.nan):
        flat[rng.integers(0, flat.size, 5)] = value
    return x


def argmax_reference(values, src):
    """np.argmax of the gathered rows, -1 where a row holds inf or nan."""
    rows = values[:, src].astype(np.float64)
    out = np.argmax(rows, axis=2)
    return np.where(np.isfinite(rows).all(axis=2), out, -1)


@pytest.mark.parametrize("n_classes", [3, 256, 257, 1000])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_argmax_rows_at_equals_numpy(n_classes, dtype):
    values = f16_with_specials((4, 301, n_classes), n_classes).astype(dtype)
    src = np.random.default_rng(1).permutation(301)[:151]  # an odd count: a lone last row
    out = np.empty((4, 151), dtype=np.int32)
    kernels.argmax_rows_at(values, src, out)
    np.testing.assert_array_equal(out, argmax_reference(values, src))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_argmax_rows_as_a_region_equals_numpy(dtype, build, monkeypatch):
    """The forgetting pass's argmax runs as its kernel's region (numba's threads in one
    parallel region) where numba has `jit.REGION_THREADS` threads: the same results."""
    from forgetkit.kernels import jit

    monkeypatch.setattr(jit, "REGION_THREADS", 1)
    values = f16_with_specials((6, 301, 13), 5).astype(dtype)
    out = np.full(6 * 301, -7, dtype=np.int32)
    k = kernels._argmax.argmax_f16 if dtype == np.float16 else kernels._argmax.argmax_float
    k.ran_region = False
    kernels.argmax_rows(values.reshape(-1, 13), out)
    np.testing.assert_array_equal(out.reshape(6, 301), argmax_reference(values, np.arange(301)))
    assert k.ran_region == (build == "parallel" and jit.numba.get_num_threads() > 1)


def test_a_memmap_subset_reads_rows_in_place_with_the_same_results(tmp_path):
    run = make_run(n_epochs=7, n_samples=500, n_classes=6, dtype=np.float16, ties=True)
    fk.save(run, tmp_path / "r.npy")
    idx = np.random.default_rng(2).permutation(500)[:240]
    streamed = fk.load(tmp_path / "r.npy").isel(samples=idx)  # a lazy subset of a memmap
    in_memory = run.isel(samples=idx)
    np.testing.assert_array_equal(streamed.predictions(), in_memory.predictions())
    for e in (0, 6):
        np.testing.assert_array_equal(streamed.probs(e), in_memory.probs(e))


def test_row_top_and_scores_equal_numpy():
    rng = np.random.default_rng(3)
    p = np.round(rng.random((2000, 7)) * 8) / 8  # ties of the max
    p /= p.sum(axis=1, keepdims=True)
    y = rng.integers(0, 7, 2000)
    pred, top, at_label = kernels.row_top(p, y)
    np.testing.assert_array_equal(pred, p.argmax(axis=1))
    np.testing.assert_array_equal(top, p.max(axis=1))
    np.testing.assert_array_equal(at_label, p[np.arange(2000), y])
    hit, nll_, ece_ = prediction_metrics(p, y)
    np.testing.assert_array_equal(hit, p.argmax(axis=1) == y)
    assert (nll_, ece_) == (nll(p, y), ece(p, y))


def _live_rows_ref(total, y, bound, slack):
    """live_rows by its definition, row by row."""
    rows, cands, n_right = [], [], 0
    for r in range(total.shape[0]):
        t, b = total[r], np.broadcast_to(bound[r], total.shape[1])
        cand = [c for c in range(t.size) if t[c] + b[c] >= t.max() - slack]
        if y[r] in cand and len(cand) > 1:
            rows.append(r)
            cands.append(cand)
        elif len(cand) == 1 and np.argmax(t) == y[r]:
            n_right += 1
    return rows, cands, n_right


@pytest.mark.parametrize("per_class", [True, False])
def test_live_rows_and_add_into_equal_numpy(per_class):
    rng = np.random.default_rng(4)
    total = np.round(rng.random((3000, 9)) * 6) / 2  # shared maxima and gaps of exactly 1
    y = rng.integers(0, 9, 3000)
    bound = np.round(rng.random((3000, 9 if per_class else 1)) * 4) / 2  # gaps met exactly
    order = rng.permutation(3000)
    rows, ptr, cand, n_right = kernels.live_rows(total, y, bound, 0.0, order)
    ref_rows, ref_cands, ref_right = _live_rows_ref(total[order], y[order], bound[order], 0.0)
    np.testing.assert_array_equal(rows, order[ref_rows])
    assert [cand[ptr[i]:ptr[i + 1]].tolist() for i in range(rows.size)] == ref_cands
    assert n_right == ref_right and 0 < rows.size < 3000 and n_right > 0
    p = rng.random((3000, 9))
    expected = total + p
    kernels.add_into(total, p)
    np.testing.assert_array_equal(total, expected)


def test_selection_cached_counts_equal_the_full_row_argmax():
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.ones(12) * 0.3, size=(6, 2500))
    probs[:, :50] = np.round(probs[:, :50] * 4) / 4  # exact ties between classes
    total = probs[[0, 2]].sum(axis=0)
    y = rng.integers(0, 12, 2500)
    bound = kernels.class_max(probs)  # as ensemble selection bounds a round's change
    np.testing.assert_array_equal(bound, probs.max(axis=0))
    rows, ptr, cand, _ = kernels.live_rows(total, y, bound, 1e-9)
    got = kernels.selection_cached_counts(probs, total, rows, y, ptr, cand)
    expected = [np.sum(np.argmax(total[rows] + probs[e, rows], axis=1) == y[rows])
                for e in range(6)]
    np.testing.assert_array_equal(got, expected)
    assert rows.size > 500 and np.diff(ptr).max() > 6  # both the candidates and whole rows


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_stats_equal_numpy(dtype, tmp_path):
    """One pass: each row's first argmax of the probabilities, label probability and each
    class's largest probability equal those of forgetkit's softmax; the shift and 1/sum
    reproduce it; rows whose exp underflows (spread > 708) leave shift and inv as nan."""
    run = make_run(n_epochs=7, n_samples=300, n_classes=40, dtype=dtype, ties=True)
    out = np.array(run.outputs)
    if dtype != np.float16:
        out[3, :5, 0] = -1000.0  # underflowing rows
    fk.save(run.replace(outputs=out), tmp_path / "r.npy")
    rows = np.random.default_rng(0).permutation(300)[:200]
    for r in (fk.load(tmp_path / "r.npy"), fk.load(tmp_path / "r.npy").isel(samples=rows)):
        idx = np.arange(300) if r.n_samples == 300 else rows
        stats = r.softmax_stats()
        p = np.stack([softmax(out[e, idx]) for e in range(7)])
        np.testing.assert_array_equal(stats.pred, p.argmax(axis=2))
        np.testing.assert_array_equal(stats.label_prob, p[:, np.arange(idx.size), r.labels])
        np.testing.assert_array_equal(stats.class_max, p.max(axis=0))
        np.testing.assert_array_equal(r.label_probs(), stats.label_prob.T)
        underflow = np.zeros((7, idx.size), dtype=bool)
        if dtype != np.float16:
            underflow[3] = idx < 5
        assert np.isnan(stats.inv[underflow]).all() and (stats.inv[~underflow] > 0).all()
        shift, inv = stats.shift[~underflow], stats.inv[~underflow]
        x = out[:, idx][~underflow].astype(np.float64)
        np.testing.assert_allclose(np.exp(x - shift[:, None]) * inv[:, None], p[~underflow],
                                   rtol=1e-13, atol=1e-300)
    assert r.softmax_stats(memory_budget=0).class_max is not None  # kept once computed
    small = fk.load(tmp_path / "r.npy")
    assert small.softmax_stats(memory_budget=0).class_max is None
    sub = small.isel(samples=rows)  # inherited by subsets
    np.testing.assert_array_equal(sub.cached_softmax_stats.label_prob,
                                  small.softmax_stats().label_prob[:, rows])


@pytest.mark.parametrize("table", [True, False])
def test_float16_softmax_stats_give_the_forgetting_pass(table, tmp_path):
    """On float16 logits whose every exp comes from the table, the stats' first argmax of
    the probabilities is the forgetting pass's argmax of the logits (ties, -0.0 and +0.0
    included) and is taken as it; a value beyond the table leaves the pass to run."""
    run = make_run(n_epochs=6, n_samples=400, n_classes=30, dtype=np.float16, ties=True)
    out = np.array(run.outputs)
    out[2, :40] = -1.0
    out[2, :40, 3], out[2, :40, 7] = -0.0, 0.0
    if not table:
        out[4, 9, 1] = 700.0  # shifted exp for this row
    fk.save(run.replace(outputs=out), tmp_path / "r.npy")
    expected = fk.load(tmp_path / "r.npy").predictions()
    r = fk.load(tmp_path / "r.npy")
    stats = r.softmax_stats()
    assert (r.cache.predictions is stats.pred) == table
    np.testing.assert_array_equal(r.predictions(), expected)
    assert (expected[2, :40] == 3).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("known", [False, True])
def test_add_softmax_live_rows_equals_add_then_live_rows(dtype, known):
    """Round by round, the lazy pass gives the live rows, candidates and right count of
    adding every pick's softmax to every row and calling live_rows; settled rows' totals,
    once brought up to date, have the same bits; with each softmax's shift and inv known
    (float16 rows then add their table values in one pass) or not."""
    rng = np.random.default_rng(6)
    values = np.round(rng.normal(size=(5, 500, 9)) * 4).astype(dtype) / 4
    values[:, :, 0] += np.linspace(0, 3, 500).astype(dtype)  # many rows settle early
    src = rng.permutation(500)
    y = rng.integers(0, 9, 500)
    y[::3] = 0
    probs = np.stack([softmax(values[e, src]) for e in range(5)])
    bound = kernels.class_max(probs)
    order = rng.permutation(500)
    state = (np.zeros(500, np.int64), np.zeros(500, np.int64), np.zeros(500, np.int64))
    stats = fk.Run(values[:, src], y).softmax_stats()
    shift, inv = (stats.shift, stats.inv) if known else (np.full((5, 500), np.nan),) * 2
    eager, lazy = np.zeros((500, 9)), np.zeros((500, 9))
    picks, settled = [], 0
    for e in (1, 4, 4, 0, 2, 1, 3, 4):
        picks.append(e)
        eager += probs[e]
        ref = kernels.live_rows(eager, y, bound, 1e-9, order)
        *live, n_bad = kernels.add_softmax_live_rows(values, picks, src, lazy, y, bound,
                                                     1e-9, order, state, shift, inv)
        for a, b in zip(live, ref, strict=True):
            np.testing.assert_array_equal(a, b)
        assert n_bad == 0
        up_to_date = state[1] == len(picks)
        np.testing.assert_array_equal(lazy[up_to_date], eager[up_to_date])
        settled = max(settled, int((~up_to_date).sum()))
    assert settled > 100 and 0 < live[0].size < 500


def test_em_pass_equals_numpy_and_takes_the_parallel_path_above_its_size(monkeypatch):
    """The EM pass's log-likelihood and update sums equal numpy's (to rounding; blocks of
    rows are summed in order), its bits do not depend on the number of threads, and
    likelihood fusion on a validation set that takes it gives numpy's EM weights."""
    import numba

    from forgetkit.fusion import likelihood

    rng = np.random.default_rng(7)
    q = rng.random((likelihood.PARALLEL_EM_SAMPLES + 123, 6)) + 1e-3
    w = rng.dirichlet(np.ones(6))
    mean_log, sums = kernels.em_pass(q, w)
    np.testing.assert_allclose(mean_log, np.mean(np.log(q @ w)), rtol=1e-13)
    np.testing.assert_allclose(sums, q.T @ (1 / (q @ w)), rtol=1e-12)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = kernels.em_pass(q, w)
    finally:
        numba.set_num_threads(threads)
    assert one[0] == mean_log and np.array_equal(one[1], sums)
    w_big, _ = likelihood.LikelihoodFusion()._solve(q)
    # the same fit through numpy's matrix-vector products
    monkeypatch.setattr(likelihood, "PARALLEL_EM_SAMPLES", q.shape[0] + 1)
    w_numpy, _ = likelihood.LikelihoodFusion()._solve(q)
    np.testing.assert_allclose(w_big, w_numpy, atol=1e-7)


def test_claimed_blocks_run_each_block_once_at_any_number_of_threads():
    """The shared counter of ``kernels.schedule`` hands out every block exactly once to
    threads claiming at once (nogil workers, as ``jit.run`` runs the kernels), with more
    threads than blocks, one thread, or a single block."""
    from concurrent.futures import ThreadPoolExecutor

    from numba import njit

    from forgetkit.kernels.schedule import claim, new_counter

    @njit(nogil=True)
    def visits(seen, n_blocks, counter):
        blk = claim(counter)
        while blk < n_blocks:
            seen[blk] += 1
            blk = claim(counter)

    with ThreadPoolExecutor(4) as pool:
        for threads in (1, 4):
            for n_blocks in (1, 2, 7, 1000, 100_000):
                seen, counter = np.zeros(n_blocks, dtype=np.int64), new_counter()
                futures = [pool.submit(visits, seen, n_blocks, counter) for _ in range(threads)]
                [f.result() for f in futures]
                np.testing.assert_array_equal(seen, np.ones(n_blocks))


def test_compare_does_not_depend_on_threads_or_blocks(tmp_path, monkeypatch):
    """compare on stored float16 logits (the softmax statistics, the KF fit's window
    kernels, ensemble selection's gathered rounds, the EM pass, the scoring pass: every
    kernel whose threads claim blocks) gives the same table at 1 thread and at every
    thread, with 1, 3 or 8 blocks per thread."""
    import numba
    import pandas as pd

    from forgetkit.evaluate import compare_splits
    from forgetkit.fusion import likelihood

    monkeypatch.setattr(likelihood, "PARALLEL_EM_SAMPLES", 100)  # the EM pass too
    run = make_run(n_epochs=9, n_samples=600, n_classes=40, dtype=np.float16, ties=True)
    fk.save(run, tmp_path / "r.npy")
    tables = []
    threads = numba.get_num_threads()
    try:
        for t in sorted({1, threads}):
            numba.set_num_threads(t)
            for blocks_per_thread in (1, 3, 8):
                monkeypatch.setattr(kernels.jit, "BLOCKS_PER_THREAD", blocks_per_thread)
                tables.append(compare_splits(fk.load(tmp_path / "r.npy"),
                                             memory_budget=1 << 20))
    finally:
        numba.set_num_threads(threads)
    for table in tables[1:]:
        pd.testing.assert_frame_equal(table, tables[0])


def test_a_call_on_the_pool_keeps_none_of_its_arrays_after_it():
    """The pool threads drop a call's arguments and results when it ends: a worker's fit
    frees each window's records after the window (not at the next kernel call)."""
    import gc
    import weakref

    from forgetkit.kernels import argmax as _argmax
    from forgetkit.kernels.jit import run

    values = np.random.default_rng(0).random((4000, 10))
    out = np.empty(4000, dtype=np.int32)
    run(_argmax.argmax_float, 3, (values, out))
    np.testing.assert_array_equal(out, values.argmax(axis=1))
    refs = [weakref.ref(values), weakref.ref(out)]
    del values, out
    gc.collect()
    assert [r for r in refs if r() is not None] == []
