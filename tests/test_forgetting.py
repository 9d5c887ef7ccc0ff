import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import forgetkit as fk
from forgetkit.analysis.forgetting import summary
from forgetkit.kernels import argmax as kargmax
from forgetkit.kernels import source

from .conftest import make_run
from .reference import correct_ref, dynamics_ref, fractions_ref


def check_against_reference(run):
    correct = correct_ref(np.asarray(run.outputs), run.labels)
    acc, forget, learn = fractions_ref(correct)
    assert np.array_equal(fk.correctness(run), correct)
    assert np.array_equal(fk.accuracy(run), acc)
    assert np.array_equal(fk.forget_fraction(run), forget)
    assert np.array_equal(fk.learn_fraction(run), learn)
    df = fk.sample_dynamics(run)
    ref = dynamics_ref(correct, run.epochs)
    for col in ref[0]:
        got = [None if v is pd.NA else v for v in df[col].tolist()]
        assert got == [row[col] for row in ref], col


def test_real_run_matches_reference(real_run):
    check_against_reference(real_run)


def test_identity_holds_exactly_in_counts(real_run):
    correct = fk.correctness(real_run)
    final = correct[-1].sum()
    learn = (~correct & correct[-1]).sum(axis=1)
    forget = (correct & ~correct[-1]).sum(axis=1)
    assert np.array_equal(correct.sum(axis=1) + learn - forget, np.full(60, final))
    a, f, lf = fk.accuracy(real_run), fk.forget_fraction(real_run), fk.learn_fraction(real_run)
    np.testing.assert_allclose(a + lf - f, a[-1], rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("suffix,layout", [(".npz", "list"), (".npy", "list"),
                                           (".parquet", "list"), (".parquet", "binary")])
def test_every_format_and_dtype(real_small, tmp_path, dtype, suffix, layout):
    run = fk.Run(np.asarray(real_small.outputs).astype(dtype), real_small.labels)
    path = tmp_path / f"run{suffix}"
    fk.save(run, path, layout=layout)
    back = fk.load(path)
    assert back.outputs.dtype == dtype
    check_against_reference(back)


def test_float16_specials_and_ties():
    # -0 and +0 tie (lowest index wins), subnormals, negatives, exact ties
    vals = np.array(
        [[-0.0, 0.0, -1.0], [0.0, -0.0, -1.0], [-2.0, -1e-7, -1e-7], [5.0, 5.0, 5.0],
         [-65504.0, -60000.0, -65000.0], [6e-8, 0.0, -6e-8], [-1.0, -2.0, -0.5]],
        dtype=np.float16,
    )
    out = np.empty(len(vals), dtype=np.int32)
    kargmax.argmax_f16(source(vals), out)
    assert out.tolist() == np.argmax(vals.astype(np.float64), axis=1).tolist()


@given(hnp.arrays(np.int16, st.tuples(st.integers(1, 40), st.integers(2, 7))))
@settings(max_examples=200, deadline=None)
def test_float16_kernel_matches_numpy_on_any_bits(bits):
    vals = bits.view(np.float16)
    finite = np.isfinite(vals).all(axis=1)
    out = np.empty(len(vals), dtype=np.int32)
    kargmax.argmax_f16(source(bits), out)
    assert (out[~finite] == -1).all()
    expect = np.argmax(vals[finite].astype(np.float64), axis=1)
    assert np.array_equal(out[finite], expect)


@pytest.mark.parametrize("n_classes", [255, 256, 257, 1000])
def test_float16_kernel_on_both_sides_of_the_row_pairing(n_classes):
    bits = np.random.default_rng(n_classes).integers(-32768, 32768, size=(31, n_classes),
                                                      dtype=np.int16)
    vals = bits.view(np.float16)
    vals[::3] = np.where(np.isfinite(vals[::3]), vals[::3], 1.0)  # every third row finite
    finite = np.isfinite(vals).all(axis=1)
    out = np.empty(len(vals), dtype=np.int32)
    kargmax.argmax_f16(source(bits), out)
    assert (out[~finite] == -1).all() and finite.sum() >= 11
    assert np.array_equal(out[finite], np.argmax(vals[finite].astype(np.float64), axis=1))


def test_float16_kernel_beyond_65535_classes():
    # the packed one-pass key holds the class index in 16 bits: wider rows take two passes
    rng = np.random.default_rng(1)
    vals = (rng.integers(-8, 8, size=(4, 70_000)) / 8).astype(np.float16)
    vals[1, 69_999] = 3.0
    vals[2, 5] = np.nan
    out = np.empty(4, dtype=np.int32)
    kargmax.argmax_f16(source(vals), out)
    expect = np.argmax(vals.astype(np.float64), axis=1)
    assert out.tolist() == [expect[0], 69_999, -1, expect[3]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_kernel_on_tie_heavy_data(dtype):
    rng = np.random.default_rng(3)
    vals = (rng.integers(-3, 3, size=(5000, 7)) / 4).astype(dtype)
    out = np.empty(len(vals), dtype=np.int32)
    kargmax.argmax_float(source(vals), out)
    assert np.array_equal(out, np.argmax(vals, axis=1))


runs = st.builds(
    lambda e, n, c, seed, dtype, ties: make_run(e, n, c, seed, dtype, ties),
    st.integers(1, 8), st.integers(1, 60), st.integers(2, 6), st.integers(0, 10**6),
    st.sampled_from([np.float16, np.float32, np.float64]), st.booleans(),
)


@given(runs)
@settings(max_examples=60, deadline=None)
def test_fraction_properties(run):
    a, f, lf = fk.accuracy(run), fk.forget_fraction(run), fk.learn_fraction(run)
    for x in (a, f, lf):
        assert ((x >= 0) & (x <= 1)).all()
    np.testing.assert_allclose(a + lf - f, a[-1], rtol=0, atol=1e-12)
    assert f[-1] == 0 and lf[-1] == 0


@given(runs, st.integers(0, 10**6))
@settings(max_examples=40, deadline=None)
def test_invariant_to_sample_order(run, seed):
    perm = np.random.default_rng(seed).permutation(run.n_samples)
    shuffled = run.isel(samples=perm)
    np.testing.assert_allclose(fk.forget_fraction(shuffled), fk.forget_fraction(run), atol=1e-15)
    np.testing.assert_allclose(fk.learn_fraction(shuffled), fk.learn_fraction(run), atol=1e-15)
    d1 = fk.sample_dynamics(run).reset_index(drop=True).iloc[perm].reset_index(drop=True)
    d2 = fk.sample_dynamics(shuffled).reset_index(drop=True)
    pd.testing.assert_frame_equal(d1, d2)


def test_sample_dynamics_uses_epoch_numbers():
    labels = np.array([0, 1])
    out = np.zeros((4, 2, 2), dtype=np.float32)
    # sample 0: right, wrong, right, wrong (2 forgetting events); sample 1: never right
    out[[0, 2], 0, 0] = 1
    out[[1, 3], 0, 1] = 1
    out[:, 1, 0] = 1
    run = fk.Run(out, labels, epochs=[10, 20, 30, 40])
    df = fk.sample_dynamics(run)
    row = df.loc[0]
    assert (row.first_correct, row.last_correct, row.epochs_correct) == (10, 30, 2)
    assert row.forgetting_events == 2 and row.forgotten and row.forget_epoch == 40
    assert df.loc[1].first_correct is pd.NA and not df.loc[1].forgotten


def test_double_descent_found_on_a_dip():
    x = np.concatenate([np.linspace(0.5, 0.8, 15), np.linspace(0.8, 0.7, 20),
                        np.linspace(0.7, 0.85, 25)])
    rng = np.random.default_rng(0)
    n = 4000
    correct = rng.random((len(x), n)) < x[:, None]
    labels = rng.integers(0, 5, n)
    out = rng.normal(size=(len(x), n, 5)).astype(np.float32)
    for e in range(len(x)):
        out[e, np.arange(n), labels] += np.where(correct[e], 10, -10)
    dd = fk.double_descent(fk.Run(out, labels))
    assert dd.found
    assert 12 <= dd.peak_epoch <= 19 and 30 <= dd.dip_epoch <= 38
    assert dd.second_peak_epoch >= 55
    lost = correct[dd.peak_epoch] & ~correct[dd.dip_epoch]
    assert dd.forgotten_in_dip == pytest.approx(lost.mean())


def test_double_descent_absent_on_the_clean_real_run(real_run):
    assert not fk.double_descent(real_run).found


def test_summary_of_real_run(real_run):
    s = summary(real_run)
    assert s["final_accuracy"] == pytest.approx(0.9529)
    assert s["max_forget_fraction"] == pytest.approx(fk.forget_fraction(real_run).max())


def test_nan_is_reported_with_its_epoch(tmp_path):
    run = make_run(n_epochs=5)
    out = np.asarray(run.outputs).copy()
    out[3, 7, 1] = np.nan
    with pytest.raises(ValueError, match="epoch index 3"):
        fk.Run(out, run.labels)
    # a memory-mapped run is checked during the pass
    np.save(tmp_path / "o.npy", out)
    mm = fk.load(tmp_path / "o.npy", labels=run.labels)
    with pytest.raises(ValueError, match="NaN or inf at epoch index 3"):
        fk.forget_fraction(mm)


def test_epoch_counts_in_threads_equal_the_boolean_reference(monkeypatch):
    from forgetkit.analysis import forgetting

    run = make_run(n_epochs=7, n_samples=500, n_classes=4, seed=3)
    correct = run.correctness()
    final = correct[-1]
    want = np.stack([correct.sum(axis=1), (correct & ~final).sum(axis=1),
                     (~correct & final).sum(axis=1)])
    ever = int(np.count_nonzero(correct.any(axis=0) & ~final))
    assert 0 < ever and want[1].any() and want[2].any()
    for threshold in (1 << 24, 0):  # one thread; threads over the epochs
        monkeypatch.setattr(forgetting, "THREADED_COUNTS", threshold)
        counts, got = forgetting.epoch_counts(run)
        assert np.array_equal(counts, want) and got == ever
