import numpy as np
import pytest

import forgetkit as fk
from forgetkit.kernels import floats as kfloats
from forgetkit.kernels import softmax as ksoftmax

from .conftest import make_run


def test_attributes_and_defaults():
    run = make_run(n_epochs=3, n_samples=8, n_classes=4)
    assert run.shape == (3, 8, 4) and run.kind == "logits"
    assert run.epochs.tolist() == [0, 1, 2]
    assert run.sample_ids is None and run.class_names is None and run.meta == {}
    assert "epochs=3" in repr(run)


@pytest.mark.parametrize(
    "outputs,labels,kw,exc,msg",
    [
        (np.zeros((50000, 10)), np.zeros(50000, int), {}, ValueError,
         r"outputs must have shape \(epochs, samples, classes\); got shape \(50000, 10\)"),
        (np.zeros((2, 3, 4), dtype=np.int32), [0, 1, 2], {}, TypeError, "float16, float32"),
        (np.zeros((0, 3, 4)), [0, 1, 2], {}, ValueError, "empty run"),
        (np.zeros((2, 3, 4)), [0, 1], {}, ValueError, "labels must have length 3"),
        (np.zeros((2, 3, 4)), [0, 1, 4], {}, ValueError,
         r"labels must lie in \[0, 4\); got value 4"),
        (np.zeros((2, 3, 4)), [0, -1, 2], {}, ValueError, "got value -1"),
        (np.zeros((2, 3, 4)), [0.5, 1, 2], {}, TypeError, "labels must be integers"),
        (np.zeros((2, 3, 4)), [0, 1, 2], {"kind": "logit"}, ValueError,
         "kind must be one of 'logits', 'probs'; got 'logit'"),
        (np.zeros((2, 3, 4)), [0, 1, 2], {"kind": "probs"}, ValueError, "not a probability"),
        (np.zeros((3, 3, 4)), [0, 1, 2], {"epochs": [0, 2, 2]}, ValueError,
         "strictly increasing.*got 2 followed by 2"),
        (np.zeros((3, 3, 4)), [0, 1, 2], {"epochs": [5, 3, 7]}, ValueError,
         "got 5 followed by 3"),
        (np.zeros((3, 3, 4)), [0, 1, 2], {"epochs": [1, 2]}, ValueError, r"shape \(3,\)"),
        (np.zeros((2, 3, 4)), [0, 1, 2], {"class_names": ["a"]}, ValueError, "4 entries"),
    ],
)
def test_bad_inputs_are_named(outputs, labels, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        fk.Run(outputs, labels, **kw)


def test_nan_names_the_epoch():
    out = np.zeros((4, 3, 2))
    out[2, 1, 0] = np.inf
    with pytest.raises(ValueError, match=r"NaN or inf at epoch index 2 \(epoch 30\)"):
        fk.Run(out, [0, 1, 0], epochs=[0, 10, 30, 40])


def test_probs_kind_accepts_probabilities():
    p = np.full((2, 3, 4), 0.25)
    run = fk.Run(p, [0, 1, 2], kind="probs")
    assert np.array_equal(run.probs(0), p[0])


def test_probs_is_softmax_in_float64():
    run = make_run(dtype=np.float16)
    p = run.probs([0, 3])
    assert p.dtype == np.float64 and p.shape == (2, run.n_samples, run.n_classes)
    x = np.asarray(run.outputs[3], dtype=np.float64)
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(p[1], ref / ref.sum(1, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)
    assert run.probs(-1).shape == (run.n_samples, run.n_classes)
    with pytest.raises(ValueError, match=r"epoch index must lie in \[0, 12\); got 12"):
        run.probs(12)


def test_isel_by_position():
    run = make_run(n_epochs=5, n_samples=20)
    sub = run.isel(samples=[3, 1])
    assert sub.sample_ids.tolist() == [3, 1]
    assert np.array_equal(sub.outputs[:, 0], run.outputs[:, 3])
    mask = np.zeros(20, bool)
    mask[[2, 5]] = True
    assert run.isel(samples=mask).sample_ids.tolist() == [2, 5]
    ep = run.isel(epochs=[0, 2, 4])
    assert ep.epochs.tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="strictly increasing"):
        run.isel(epochs=[2, 0])
    with pytest.raises(ValueError, match=r"samples must lie in \[0, 20\); got 20"):
        run.isel(samples=[20])


def test_split_follows_the_protocol():
    run = make_run(n_samples=11)
    val, test = run.split(0.5, seed=1)
    perm = np.random.default_rng(1).permutation(11)
    assert val.sample_ids.tolist() == perm[:5].tolist()
    assert test.sample_ids.tolist() == perm[5:].tolist()
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        run.split(1.0)


def test_subset_of_a_streamed_run_is_lazy_and_equal(tmp_path):
    from forgetkit.run import SubsetOutputs

    run = make_run(n_epochs=6, n_samples=200, dtype=np.float16)
    fk.save(run, tmp_path / "r.npy")
    mm = fk.load(tmp_path / "r.npy")
    idx = np.random.default_rng(0).permutation(200)[:90]
    lazy, eager = mm.isel(samples=idx), run.isel(samples=idx)
    assert isinstance(lazy.outputs, SubsetOutputs) and lazy.shape == (6, 90, 5)
    assert np.array_equal(np.asarray(lazy.outputs), np.asarray(eager.outputs))
    assert np.array_equal(lazy.outputs[2:4, 5], np.asarray(eager.outputs)[2:4, 5])
    assert np.array_equal(fk.forget_fraction(lazy), fk.forget_fraction(eager))
    assert fk.KnowledgeFusion().fit(lazy).plan_ == fk.KnowledgeFusion().fit(eager).plan_
    assert isinstance(lazy.isel(samples=[0, 1]).outputs, SubsetOutputs)  # nested stays lazy


def test_subsets_keep_checking_what_was_not_checked(tmp_path):
    run = make_run(n_epochs=4, n_samples=30)
    out = np.asarray(run.outputs).copy()
    out[2, 5, 1] = np.nan
    np.save(tmp_path / "o.npy", out)
    streamed = fk.load(tmp_path / "o.npy", labels=run.labels)
    with pytest.raises(ValueError, match="NaN or inf at epoch index 2"):
        streamed.isel(samples=np.arange(10)).probs(2)  # lazy: checked when read
    with pytest.raises(ValueError, match="NaN or inf at epoch index 1"):
        streamed.isel(epochs=[1, 2])  # copied into memory: checked when built
    assert not run.isel(samples=[0, 1]).checked_per_read  # checked once, when built


# ------------------------------------------------------------------ softmax kernels
def _ulps(a, b):
    return np.abs(a.view(np.int64) - b.view(np.int64))


def test_fast_exp_within_one_ulp_of_numpy():
    from numba import njit


    @njit
    def fast_exp(x, out):
        for i in range(x.shape[0]):
            out[i] = ksoftmax._exp_nonpositive(x[i])

    rng = np.random.default_rng(0)
    x = np.concatenate([-rng.exponential(30, 200_000), -rng.random(50_000) * 1e-6,
                        [0.0, -0.0, -1e-300, ksoftmax.EXP_MIN, -np.log(2), -700.5]])
    x = np.maximum(x, ksoftmax.EXP_MIN)
    out = np.empty_like(x)
    fast_exp(x, out)
    assert _ulps(out, np.exp(x)).max() <= 1
    assert out[x == 0].tolist() == [1.0, 1.0]


def test_float16_bits_convert_exactly():
    from numba import njit

    @njit
    def convert(bits, out):
        for i in range(bits.shape[0]):
            out[i] = kfloats.f16_to_f64(bits[i])

    half = np.arange(65536, dtype=np.uint16).view(np.float16)
    finite = np.isfinite(half)
    out = np.empty(65536)
    convert(half.view(np.int16), out)
    ref = half.astype(np.float64)
    assert np.array_equal(out[finite], ref[finite])
    assert np.array_equal(np.signbit(out[finite]), np.signbit(ref[finite]))  # -0.0 stays


def test_float16_exp_table_is_math_exp_within_its_range():
    import math

    table = ksoftmax.f16_exp_table()
    values = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    inside = (values >= ksoftmax.EXP_MIN) & (values <= ksoftmax.F16_TABLE_MAX)
    assert inside.sum() > 45_000
    assert table[inside].tolist() == [math.exp(v) for v in values[inside]]
    assert np.isnan(table[~inside]).all()  # out of range, inf and nan: the shifted path
    assert not table.flags.writeable


@pytest.mark.parametrize("row", [[600.0, 0.0, -5.0], [600.5, 0.0, -5.0], [3.0, -708.0, 1.0],
                                 [3.0, -708.5, 1.0], [0.0, -0.0, 0.0], [-700.0, -705.0, -708.0]])
def test_float16_rows_on_both_sides_of_the_table_limits(row):

    x = np.array([row], dtype=np.float16)
    p = fk.run.softmax(x)
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert _ulps(p[p > 1e-300], ref[p > 1e-300]).max() <= 4
    # float16 rows within the table are not shifted (m = 0); the others are shifted by
    # their max, which is then > 0 (what ensemble selection's streamed scorer relies on)
    in_table = x64.min() >= ksoftmax.EXP_MIN and x64.max() <= ksoftmax.F16_TABLE_MAX
    m = _exp_row_shift(x.view(np.int16)[0])
    assert (m == 0.0) == in_table


def _exp_row_shift(bits):
    from numba import njit

    @njit
    def shift(bits, table):
        return ksoftmax.exp_row(bits, np.empty(bits.shape[0]), table)[1]

    return shift(bits, ksoftmax.f16_exp_table())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_extreme_rows_take_the_exact_path(dtype):
    # spreads beyond 708 underflow to subnormals: those rows go through math.exp
    x = np.array([[0.0, -700.0, -720.0, -760.0], [3.0, 2.0, 1.0, 0.0],
                  [-1000.0, -1000.0, -1700.0, -1010.0]], dtype=dtype)
    p = fk.run.softmax(x)
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert _ulps(p[p > 1e-300], ref[p > 1e-300]).max() <= 4
    np.testing.assert_array_equal(p == 0, ref == 0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_mean_softmax_equals_the_mean_of_per_epoch_softmax(dtype):
    run = make_run(n_epochs=5, n_samples=203, n_classes=37, dtype=dtype)
    for idx in ([1, 2, 3], [4], [0, 2]):
        stack = np.asarray(run.outputs)[idx]
        ref = np.mean(np.stack([fk.run.softmax(s) for s in stack]), axis=0)
        np.testing.assert_array_equal(fk.run.mean_softmax(stack), ref)
    bad = np.asarray(run.outputs)[:2].copy()
    bad[1, 7, 3] = np.nan
    with pytest.raises(ValueError, match="1 rows hold NaN or inf"):
        fk.run.mean_softmax(bad)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7])
def test_combined_softmax_is_numpys_sequence_of_additions(dtype, k):
    """Epochs are combined 3 at a time in one pass: the bits must be those of adding the
    epochs' softmaxes one by one (and dividing, for the mean)."""

    run = make_run(n_epochs=8, n_samples=120, n_classes=11, dtype=dtype)
    values = np.asarray(run.outputs).copy()
    values[3, 5, 2] = 650.0  # a float16 row outside the table: shifted exp
    values[5, 6, 1] = -900.0  # a spread beyond 708: math.exp
    epochs = np.random.default_rng(k).permutation(8)[:k]
    probs = [fk.run.softmax(values[e]) for e in epochs]
    weights = np.random.default_rng(k).random(k)
    mean_ref = probs[0].copy()
    for p in probs[1:]:
        mean_ref += p
    mean_ref /= k
    weighted_ref = np.zeros_like(mean_ref)
    for w, p in zip(weights, probs, strict=True):
        weighted_ref += w * p
    rows = np.arange(120)
    order = np.random.default_rng(k).permutation(120)  # any order of reading the rows
    stored = fk.kernels.source(values)  # read-only, as the library passes it
    for w, ref in ((np.empty(0), mean_ref), (weights, weighted_ref)):
        out = np.empty_like(ref)
        assert ksoftmax.combine_softmax(stored, epochs, w, rows, order,
                                        ksoftmax.f16_exp_table(), out, False, 7) == 0
        np.testing.assert_array_equal(out, ref)
    if k > 1:  # accumulate: the weighted sum added to what out holds
        out = mean_ref.copy()
        assert ksoftmax.combine_softmax(stored, epochs, weights, rows, order,
                                        ksoftmax.f16_exp_table(), out, True, 7) == 0
        expected = mean_ref.copy()
        for wt, p in zip(weights, probs, strict=True):
            expected += wt * p
        np.testing.assert_array_equal(out, expected)


def test_subset_carries_the_forgetting_pass_over(tmp_path):
    run = make_run(n_epochs=6, n_samples=80, n_classes=7, dtype=np.float16)
    fk.save(run, tmp_path / "r.npy")
    streamed = fk.load(tmp_path / "r.npy")
    idx = np.random.default_rng(2).permutation(80)[:30]
    fresh = fk.predictions(streamed.isel(samples=idx))
    fk.predictions(streamed)
    inherited = streamed.isel(samples=idx)
    assert inherited.cache.predictions is not None
    np.testing.assert_array_equal(fk.predictions(inherited), fresh)
    assert not fk.predictions(inherited).flags.writeable


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_exp_of_gathered_values_is_bitwise_the_row_kernels(dtype):
    """Ensemble selection exponentiates a row's candidate classes from a float64 buffer:
    it must give the row kernel's values bit for bit."""

    x = (np.random.default_rng(5).standard_normal(4099) * 6).astype(dtype)
    m = float(x.max())
    row = x.view(np.int16) if dtype == np.float16 else x
    whole, gathered = np.empty(x.size), np.empty(x.size)
    ksoftmax.exp_shifted(row, m, whole)
    ksoftmax.exp_shifted(x.astype(np.float64), m, gathered)
    np.testing.assert_array_equal(whole, gathered)
