"""The kernels' numpy twins (``kernels.twins``), which small calls run while the kernel is
not compiled: each gives the bits of its kernel on one thread, declines where it does not
apply, and `jit.use_twin` picks it only where it should."""

import numpy as np
import pytest

from forgetkit import kernels
from forgetkit.kernels import jit, twins
from forgetkit.kernels.softmax import f16_exp_table

K = kernels  # the kernels, as the library calls them


def tie_heavy(n, c, seed):
    """Probability-like rows in multiples of 1/64 (many exact ties, zeros included)."""
    rng = np.random.default_rng(seed)
    return (np.round(rng.random((n, c)) * 8) / 64, np.round(rng.random((n, c)) * 8) / 64,
            rng.integers(0, c, n))


def f16_logits(shape, seed, scale=4.0):
    rng = np.random.default_rng(seed)
    return (np.round(rng.normal(size=shape) * scale * 4) / 4).astype(np.float16)


def both(fn):
    """fn() with every kernel call on the caller's thread alone, then on the numpy twins."""
    with kernels.forced("serial"):
        serial = fn()
    with kernels.forced("numpy"):
        twin = fn()
    return serial, twin


def assert_same(a, b):
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


@pytest.mark.parametrize("n_classes", [1, 2, 3, 7, 10, 16, 33, 100, 257])
def test_float16_softmaxes_equal_the_kernels(n_classes):
    """Softmax rows, label probabilities, window means (1 to 7 epochs: the kernel adds 3
    at a time), weighted sums (negative weights too) and accumulated sums of float16 rows
    read through the exp table, on a permuted subset of rows."""
    values = f16_logits((7, 120, n_classes), n_classes)
    rows = np.random.default_rng(0).permutation(120)[:77]
    table = f16_exp_table()
    src = kernels.source(values)
    out = np.empty((120, n_classes))
    assert twins.softmax_rows(src[3], table, out) == 0  # the twin applies
    assert twins.label_probs(src[3], rows, rows % n_classes, table, np.empty(77), 1) == 0
    for k in (1, 2, 3, 4, 7):
        epochs = np.arange(7 - k, 7)
        assert twins.combine_softmax(src, epochs, np.empty(0), rows, rows, table,
                                     np.empty((77, n_classes)), False, 1) == 0

    def passes():
        p = np.empty((120, n_classes))
        results = [K.softmax_rows(values[3], p), p]
        for k in (1, 2, 3, 4, 7):
            out = np.empty((77, n_classes))
            results += [K.combine_softmax(values, np.arange(7 - k, 7), rows, out), out]
        weights = [0.5, -0.25, 1.0 / 3, 2.0]
        total = np.full((77, n_classes), 0.125)
        results += [K.combine_softmax(values, [0, 2, 5, 6], rows, total, weights=weights,
                                      accumulate=True), total]
        labels = np.arange(77) % n_classes
        q = np.empty(77)
        results += [K.label_probs(values[2], rows, labels, q), q]
        fresh = np.empty((77, n_classes))
        results += [K.combine_softmax(values, [1, 4], rows, fresh, weights=[0.75, 0.25]),
                    fresh]
        return tuple(results)

    assert_same(*both(passes))


@pytest.mark.parametrize("n_classes", [1, 2, 10, 33])
def test_label_margins_of_float16_logits_equal_the_kernel(n_classes):
    """Label probability, margin, correctness (ties of the label and the largest other
    class) and the sums of probabilities and log-probabilities of float16 logits."""
    values = f16_logits((300, n_classes), n_classes, scale=0.25)
    labels = np.random.default_rng(3).integers(0, n_classes, 300)
    assert twins.label_margins(kernels.source(values)[None], labels, f16_exp_table(), True,
                               *(np.empty((1, 300)),) * 2, np.empty((1, 300), bool),
                               np.empty((0, 0)), np.empty((0, 0)), 1) == 0

    def passes():
        p, margin, correct = np.empty(300), np.empty(300), np.empty(300, bool)
        total, total_log = np.full((300, n_classes), 0.5), np.full((300, n_classes), -1.25)
        n_bad = K.label_margins(values, labels, p, margin, correct, total=total,
                                total_log=total_log)
        return n_bad, p, margin, correct, total, total_log

    serial, twin = both(passes)
    assert_same(serial, twin)
    if n_classes > 1:
        assert (serial[2] == 0).sum() > 5  # ties of the label and the other class


def test_softmax_twins_decline_rows_outside_the_table_and_other_floats():
    """A float16 row holding a value above 600, inf or nan, and float32/64 rows, take the
    kernels (the twin returns None; a sum's ``out`` as it was), with the kernels' bits."""
    table = f16_exp_table()
    values = f16_logits((3, 40, 6), 1)
    for special in (700.0, np.inf, np.nan):
        bad = values.copy()
        bad[1, 7, 2] = special
        src = kernels.source(bad)
        assert twins.softmax_rows(src[1], table, np.empty((40, 6))) is None
        out = np.full((40, 6), 5.0)  # an accumulated sum must stay as it was
        assert twins.combine_softmax(src, np.arange(3), np.empty(0), np.arange(40),
                                     np.arange(40), table, out, False, 1) is None
        assert twins.label_probs(src[1], np.arange(40), np.zeros(40, np.int64), table,
                                 np.empty(40), 1) is None
        assert (out == 5.0).all()

        def passes(bad=bad):
            p, m = np.empty((40, 6)), np.empty((40, 6))
            return (K.softmax_rows(bad[1], p), p[np.arange(40) != 7],
                    K.combine_softmax(bad, [0, 1, 2], np.arange(40), m), m[np.arange(40) != 7])

        assert_same(*both(passes))
    assert twins.softmax_rows(kernels.source(values[0].astype(np.float32)), table,
                              np.empty((40, 6))) is None
    empty = np.empty((0, 0))
    probs = kernels.source(values[0])  # probabilities (softmax=False): the kernel
    assert twins.label_margins(probs[None], np.zeros(40, np.int64), table, False,
                               np.empty((1, 40)), np.empty((1, 40)), np.empty((1, 40), bool),
                               empty, empty, 1) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_softmax_rows_without_its_kernel_is_combine_softmax(dtype, monkeypatch):
    """Not forced and not compiled, softmax_rows of float32/64 rows (underflowing and
    inf/nan rows among them) runs combine_softmax of one epoch: the bits of its kernel."""
    values = f16_logits((50, 9), 2, scale=40.0).astype(dtype)
    values[3, 0] = np.inf
    values[4, 1] = np.nan
    values[5, :2] = (900.0, -900.0)  # the math.exp path
    with kernels.forced("serial"):
        want = np.empty((50, 9))
        n_want = K.softmax_rows(values, want)
    routed = []
    combine = kernels.combine_softmax
    monkeypatch.setattr(kernels, "combine_softmax",
                        lambda *a, **k: routed.append(1) or combine(*a, **k))
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: False)
    got = np.empty((50, 9))
    assert K.softmax_rows(values, got) == n_want == 2
    assert routed == [1]
    ok = np.isfinite(values).all(axis=1)
    np.testing.assert_array_equal(got[ok], want[ok])


@pytest.mark.parametrize("seed", range(3))
def test_eps_search_twins_equal_the_kernels(seed):
    """label_leads (ties, zeros, -0.0 and negative values), mix, mix_into, the grid counts
    on uniform and uneven grids, row tops, mixture counts and the means of held
    probabilities."""
    a, b, y = tie_heavy(1500, 6, seed)
    b[:5] = -b[:5]
    b[5:9, :] = 0.0
    b[9, 1] = -0.0
    grids = [np.arange(n) / (n - 1) for n in (2, 11, 101)]
    grids.append(np.sort(np.random.default_rng(seed).random(37)))
    stack = np.stack([a, b, a * 0.5])

    def passes():
        leads, correct = K.label_leads(b, y)
        results = [leads, correct]
        for g in grids:
            results.append(K.grid_correct_counts(a, np.abs(b), y, K.label_leads(np.abs(b), y)[0],
                                                 g, 1e-12))
        mixed = b.copy()
        K.mix(a, mixed, 0.3)
        into = b.copy()
        state = K.label_leads(into, y)
        K.mix_into(a, into, 0.7, y, *state)
        results += [mixed, into, state, K.row_top(a, y),
                    K.mixture_correct_count(a, b, y, 0.45),
                    K.mean_first_axis(stack, np.empty_like(a)),
                    K.class_max(np.abs(stack))]
        total = b.copy()
        K.add_into(total, a)
        return tuple(results) + (total,)

    serial, twin = both(passes)
    assert_same(serial, twin)
    assert (serial[0][0] == 0).sum() > 50  # ties of the lead were exercised
    empty = both(lambda: K.label_leads(np.empty((0, 0)), np.empty(0, dtype=np.int64)))
    assert_same(*empty)  # no row: a top-k chunk whose every token settled


def test_grid_twin_leaves_large_grids_to_the_kernel(monkeypatch):
    a, b, y = tie_heavy(200, 5, 9)
    leads = K.label_leads(b, y)[0]
    grid = np.arange(101) / 100
    args = (a, b, y, *leads, grid, 1e-12, 1)
    assert twins.grid_correct_counts(*args) is not None
    monkeypatch.setattr(twins, "GRID_WORK", 10)
    assert twins.grid_correct_counts(*args) is None
    with kernels.forced("numpy"):
        np.testing.assert_array_equal(K.grid_correct_counts(a, b, y, leads, grid, 1e-12),
                                      keps_counts(a, b, y, leads, grid))


def keps_counts(a, b, y, leads, grid):
    return jit.run(kernels._eps.grid_correct_counts, 1, (a, b, y, *leads, grid, 1e-12, 1))


def test_use_twin_runs_twins_for_small_calls_whose_kernel_is_not_compiled(monkeypatch):
    k = kernels._eps.mix
    args = (np.zeros((2, 3)), np.zeros((2, 3)), 0.5)
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: False)
    assert jit.use_twin(k, jit.TWIN_WORK - 1, args)
    assert not jit.use_twin(k, jit.TWIN_WORK, args)  # large: compiling pays
    monkeypatch.setattr(jit, "_compiled", lambda dispatcher, args: True)
    assert not jit.use_twin(k, 10, args)  # compiled (e.g. by forgetkit warmup): the kernel
    with kernels.forced("numpy"):
        assert jit.use_twin(k, jit.TWIN_WORK, args)
        assert jit.threads(1 << 30) == 1  # a kernel without a twin: one thread
    for build in ("serial", "parallel"):
        with kernels.forced(build):
            assert not jit.use_twin(k, 10, args)


@pytest.mark.parametrize("per_class", [True, False])
def test_selection_twins_equal_the_kernels(per_class):
    """Ensemble selection's live rows (bounds per class or per row, ties of the max) and
    the correct counts over their candidates, or over whole rows."""
    rng = np.random.default_rng(5)
    probs = np.round(rng.dirichlet(np.ones(8) * 0.3, size=(6, 700)) * 32) / 32
    total = probs[0] + probs[1] + probs[2]
    y = rng.integers(0, 8, 700)
    bound = probs.max(axis=0) if per_class else probs.max(axis=(0, 2))[:, None]
    order = rng.permutation(700)

    def passes():
        rows, ptr, cand, n_right = K.live_rows(total, y, bound, 1e-9, order=order)
        whole = K.selection_cached_counts(probs, total, np.arange(700), y,
                                          np.zeros(701, np.int64), np.empty(0, np.int64))
        return (rows, ptr, cand, n_right,
                K.selection_cached_counts(probs, total, rows, y, ptr, cand), whole)

    serial, twin = both(passes)
    assert_same(serial, twin)
    lens = np.diff(serial[1])
    assert len(serial[0]) > 20 and serial[3] > 0 and (2 * lens > 8).any() and \
        (2 * lens <= 8).any()  # live and settled rows, short and long candidate lists
