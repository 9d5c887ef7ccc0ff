"""Data scores (pruning) and coreset selection: against the plain-numpy references of
tests/reference_scores.py, properties, bad input, and the CLI."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import forgetkit as fk
from forgetkit.analysis.scores import (
    SCORES,
    auto_hard_cutoff,
    ccs_budgets,
    ccs_strata,
    class_shares,
    gentle_hard_cutoff,
    select_coreset,
)
from forgetkit.cli import main

from .conftest import import_real_part, make_run
from .reference import correct_ref, softmax64
from .reference_scores import (
    ccs_bins_ref,
    ccs_budgets_ref,
    dynamic_uncertainty_ref,
    el2n_ref,
    label_probs_ref,
    scores_ref,
    ssft_ref,
)

SIX = ["el2n", "forgetting", "aum", "variability", "aleatoric", "dynamic_uncertainty"]


def assert_columns_equal(df, ref, columns):
    for c in columns:
        np.testing.assert_allclose(df[c].to_numpy(), ref[c], rtol=1e-10, atol=1e-12,
                                   err_msg=c)


@pytest.mark.parametrize("dtype,ties", [(np.float64, False), (np.float32, True),
                                        (np.float16, False)])
def test_scores_equal_numpy_reference(dtype, ties):
    run = make_run(n_epochs=13, n_samples=120, n_classes=4, dtype=dtype, ties=ties, seed=3)
    df = fk.data_scores(run)
    assert list(df.columns) == SIX
    assert (df.index == np.arange(120)).all() and df.index.name == "sample"
    assert_columns_equal(df, scores_ref(np.asarray(run.outputs, np.float64), run.labels), SIX)
    assert df.attrs["el2n_epochs"] == 2 and df.attrs["n_epochs"] == 13
    assert set(df.attrs["left_out"]) == {"second_split_forgetting"}


def test_scores_of_a_run_on_a_dask_array_equal_in_memory():
    da = import_real_part("dask.array", "dask (the forgetkit[dask] extra)")
    run = make_run(n_epochs=11, n_samples=90, seed=9).replace(sample_ids=np.arange(90) * 3)
    dask_run = run.replace(outputs=da.from_array(np.asarray(run.outputs),
                                                 chunks=(-1, 25, -1)))
    second = make_run(n_epochs=4, n_samples=90, seed=10).replace(labels=run.labels,
                                                                 sample_ids=run.sample_ids)
    got = fk.data_scores(dask_run, second_split=second)
    ref = fk.data_scores(run, second_split=second)
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert list(got.columns) == list(SCORES)


def test_never_learned_forgetting_is_inf_and_options():
    run = make_run(n_epochs=6, n_samples=40, seed=1)
    logits = np.asarray(run.outputs, np.float64).copy()
    other = (run.labels[0] + 1) % run.n_classes
    logits[:, 0, other] = 100.0  # sample 0 is never correct
    run = run.replace(outputs=logits)
    df = fk.data_scores(run, window=3, el2n_epochs=4)
    assert df.loc[0, "forgetting"] == np.inf
    np.testing.assert_allclose(df["el2n"], el2n_ref(logits, run.labels, 4), rtol=1e-12)
    p = label_probs_ref(logits, run.labels)
    np.testing.assert_allclose(df["dynamic_uncertainty"], dynamic_uncertainty_ref(p, 3),
                               rtol=1e-10, atol=1e-14)
    # epochs: the stored epoch numbers used
    sub = fk.data_scores(run, epochs=[1, 2, 3, 4], window=2)
    ref = scores_ref(logits[1:5], run.labels, window=2)
    assert_columns_equal(sub, ref, SIX)
    assert sub.attrs["epochs"] == [1, 2, 3, 4]


def test_summary_gives_every_score_but_el2n_exactly():
    run = make_run(n_epochs=12, n_samples=150, seed=4)
    full = fk.data_scores(run)
    summ = fk.data_scores(fk.summarize(run))
    assert list(summ.columns) == SIX[1:]
    assert "summary" in summ.attrs["left_out"]["el2n"]
    # forgetting events and AUM exactly; p = exp(label logit - lse) with the lse stored in
    # float32, so the probability scores to float32 precision
    pd.testing.assert_frame_equal(summ[["forgetting", "aum"]], full[["forgetting", "aum"]],
                                  rtol=1e-12)
    pd.testing.assert_frame_equal(summ, full[SIX[1:]], rtol=1e-5, atol=1e-7)
    with pytest.raises(fk.ForgetkitError, match="el2n needs every class's probability"):
        fk.data_scores(fk.summarize(run), scores=["el2n", "aum"])


def test_probabilities_run_gives_the_logit_aum():
    run = make_run(n_epochs=5, n_samples=60, dtype=np.float64, seed=5)
    probs = run.replace(outputs=softmax64(np.asarray(run.outputs)), kind="probs")
    a, b = fk.data_scores(run, window=5), fk.data_scores(probs, window=5)
    pd.testing.assert_frame_equal(a, b, rtol=1e-8, atol=1e-10)


def test_scores_option_and_short_runs():
    run = make_run(n_epochs=4, n_samples=30)
    df = fk.data_scores(run)  # window 10 > 4 epochs: left out, and said why
    assert "dynamic_uncertainty" not in df.columns
    assert "window=10" in df.attrs["left_out"]["dynamic_uncertainty"]
    with pytest.raises(fk.ForgetkitError, match="at least window=10 epochs; 4 are used"):
        fk.data_scores(run, scores=["dynamic_uncertainty"])
    assert list(fk.data_scores(run, scores=["aum", "el2n"]).columns) == ["el2n", "aum"]
    with pytest.raises(fk.ForgetkitError, match="scores must be one of"):
        fk.data_scores(run, scores=["entropy"])
    with pytest.raises(fk.ForgetkitError, match="el2n_epochs must lie in"):
        fk.data_scores(run, el2n_epochs=5)
    with pytest.raises(fk.ForgetkitError, match="second_split_forgetting needs"):
        fk.data_scores(run, scores=["second_split_forgetting"])


def test_second_split_forgetting_matches_reference_and_aligns_ids():
    first = make_run(n_epochs=8, n_samples=50, seed=6)
    first = first.replace(sample_ids=np.arange(100, 150))
    second = make_run(n_epochs=7, n_samples=50, seed=7).replace(labels=first.labels,
                                                                 epochs=np.arange(1, 8))
    correct = correct_ref(np.asarray(second.outputs), second.labels)
    expected = ssft_ref(correct, second.epochs)
    # the second run holds the same samples in another order
    perm = np.random.default_rng(0).permutation(50)
    shuffled = second.isel(samples=perm).replace(sample_ids=np.arange(100, 150)[perm])
    df = fk.data_scores(first, second_split=shuffled)
    np.testing.assert_array_equal(df["second_split_forgetting"].to_numpy(), expected)
    assert df["second_split_forgetting"].max() <= 8 and df["second_split_forgetting"].min() >= 1


def test_ssft_equals_maini_convention_on_a_worked_example():
    # epochs 1..5; columns: forgotten from epoch 3 on; correct at the end; never correct
    correct = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0], [0, 1, 0]], dtype=bool)
    epochs = np.arange(1, 6)
    from forgetkit.analysis.scores import second_split_forgetting

    np.testing.assert_array_equal(second_split_forgetting(correct, epochs), [3, 6, 1])
    np.testing.assert_array_equal(ssft_ref(correct, epochs), [3, 6, 1])


def test_second_split_over_other_samples_is_refused():
    first = make_run(n_epochs=3, n_samples=20).replace(sample_ids=np.arange(20))
    other = make_run(n_epochs=3, n_samples=20).replace(sample_ids=np.arange(5, 25),
                                                       labels=first.labels)
    with pytest.raises(fk.ForgetkitError, match="same samples as run.*5 of run's sample ids "
                                                "are missing"):
        fk.data_scores(first, second_split=other)
    relabelled = first.replace(labels=(first.labels + 1) % first.n_classes)
    with pytest.raises(fk.ForgetkitError, match="other labels"):
        fk.data_scores(first, second_split=relabelled)
    with pytest.raises(TypeError, match="second_split must be a Run"):
        fk.data_scores(first, second_split=np.zeros((3, 20, 5)))


# ------------------------------------------------------------------ coresets
def test_hardest_easiest_random_sizes_and_order():
    s = pd.Series([0.5, 3.0, 1.0, 3.0, -1.0, 2.0], index=[10, 11, 12, 13, 14, 15])
    np.testing.assert_array_equal(select_coreset(s, 0.5, method="hardest"), [11, 13, 15])
    np.testing.assert_array_equal(select_coreset(s, 1 / 3, method="easiest"), [10, 14])
    r = select_coreset(s, 0.5, method="random", seed=3)
    assert len(r) == 3 and set(r) <= set(s.index)
    np.testing.assert_array_equal(r, select_coreset(s, 0.5, method="random", seed=3))
    np.testing.assert_array_equal(select_coreset(s, 1.0, method="ccs"), s.index)


def test_aum_is_negated_when_chosen_by_name():
    df = pd.DataFrame({"aum": [5.0, -2.0, 1.0, 3.0], "el2n": [0.1, 0.9, 0.5, 0.2]},
                      index=[7, 8, 9, 10])
    hardest = select_coreset(df, 0.5, score="aum", method="hardest")
    np.testing.assert_array_equal(hardest, [8, 9])  # the lowest AUM
    np.testing.assert_array_equal(select_coreset(-df["aum"], 0.5, method="hardest"), hardest)
    np.testing.assert_array_equal(select_coreset(df, 0.5, score="el2n", method="hardest"),
                                  [8, 9])


def test_ccs_follows_the_definition():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(size=900), rng.normal(5, 0.3, size=100), [np.inf]])
    n, keep, cut, strata = len(values), 0.3, 0.05, 20
    ids = select_coreset(values, keep, method="ccs", hard_cutoff=cut, strata=strata, seed=1)
    m = round(keep * n)
    assert len(ids) == m and len(set(ids)) == m
    order = np.argsort(-values, kind="stable")
    removed, rest = order[:round(cut * n)], np.sort(order[round(cut * n):])
    assert not set(ids) & set(removed)
    bins = ccs_bins_ref(values[rest], strata)
    budgets = ccs_budgets_ref(np.bincount(bins, minlength=strata).tolist(), m)
    kept_bins = ccs_bins_ref(values[rest], strata)[np.searchsorted(rest, ids)]
    np.testing.assert_array_equal(np.bincount(kept_bins, minlength=strata), budgets)
    # another seed: other samples, the same shares
    other = select_coreset(values, keep, method="ccs", hard_cutoff=cut, strata=strata, seed=2)
    assert set(other) != set(ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 5).map(float),
                          st.floats(-1e6, 1e6, allow_nan=False),
                          st.sampled_from([np.inf, -np.inf])), min_size=1, max_size=60),
       st.floats(0.01, 1.0), st.integers(1, 12), st.integers(0, 3))
def test_selection_properties(values, keep, strata, seed):
    values = np.array(values)
    n, m = len(values), round(keep * len(values))
    for method in ("ccs", "hardest", "easiest", "random"):
        ids = select_coreset(values, keep, method=method, strata=strata, seed=seed)
        assert len(ids) == m and len(np.unique(ids)) == m and np.all(np.diff(ids) > 0)
        if method == "hardest" and 0 < m < n:
            rest = np.setdiff1d(np.arange(n), ids)
            assert values[ids].min() >= values[rest].max()
    bins = ccs_strata(values, strata)
    np.testing.assert_array_equal(bins, ccs_bins_ref(values, strata))
    sizes = np.bincount(bins, minlength=strata)
    budgets = ccs_budgets(sizes, m)
    np.testing.assert_array_equal(budgets, ccs_budgets_ref(sizes.tolist(), m))
    assert budgets.sum() == m and np.all(budgets <= sizes)
    kept = select_coreset(values, keep, method="ccs", strata=strata, seed=seed)
    np.testing.assert_array_equal(np.bincount(bins[kept], minlength=strata), budgets)


def test_auto_hard_cutoff_grows_with_the_pruning_rate():
    keeps = [1.0, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    assert [auto_hard_cutoff(k) for k in keeps] == [0, 0, 0, 0, 0.1, 0.2, 0.3, 0.3]
    rng = np.random.default_rng(4)
    values = rng.normal(size=1000)
    for keep in (0.5, 0.3, 0.1):
        auto = select_coreset(values, keep, hard_cutoff="auto", seed=5)
        np.testing.assert_array_equal(auto, select_coreset(
            values, keep, hard_cutoff=auto_hard_cutoff(keep), seed=5))
    # keep 10%: the 300 hardest are never kept
    kept = select_coreset(values, 0.1, hard_cutoff="auto", seed=5)
    assert values[kept].max() < np.sort(values)[-300]
    # "auto" means no cutoff for the other methods
    np.testing.assert_array_equal(select_coreset(values, 0.1, method="hardest",
                                                 hard_cutoff="auto"),
                                  select_coreset(values, 0.1, method="hardest"))


def test_gentle_hard_cutoff_starts_below_keep_03():
    keeps = [1.0, 0.7, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05]
    assert [gentle_hard_cutoff(k) for k in keeps] == [0, 0, 0, 0, 0, 0.1, 0.2, 0.25, 0.3,
                                                      0.3]
    # never more than "auto", equal to it from keep 0.2 down
    grid = np.linspace(0.01, 1, 100)
    assert all(gentle_hard_cutoff(k) <= auto_hard_cutoff(k) for k in grid)
    assert all(gentle_hard_cutoff(k) == auto_hard_cutoff(k) for k in grid if k <= 0.2)
    rng = np.random.default_rng(4)
    values = rng.normal(size=1000)
    labels = rng.integers(0, 3, size=1000)
    for keep in (0.5, 0.3, 0.25, 0.1):
        for lab in (None, labels):
            np.testing.assert_array_equal(
                select_coreset(values, keep, hard_cutoff="gentle", seed=5, labels=lab),
                select_coreset(values, keep, hard_cutoff=gentle_hard_cutoff(keep), seed=5,
                               labels=lab))
    # keep 30%: unlike "auto", the hardest samples can be kept
    assert values[select_coreset(values, 0.3, hard_cutoff="gentle", seed=5)].max() == \
        values.max()
    assert values[select_coreset(values, 0.3, hard_cutoff="auto", seed=5)].max() < \
        np.sort(values)[-100]
    np.testing.assert_array_equal(select_coreset(values, 0.1, method="random",
                                                 hard_cutoff="gentle", seed=2),
                                  select_coreset(values, 0.1, method="random", seed=2))
    with pytest.raises(fk.ForgetkitError, match="keep must lie in"):
        gentle_hard_cutoff(0)


def test_class_shares_sum_to_the_budget():
    np.testing.assert_array_equal(class_shares([10, 10, 10], 10), [4, 3, 3])
    np.testing.assert_array_equal(class_shares([1, 5, 94], 10), [0, 1, 9])
    np.testing.assert_array_equal(class_shares([3, 0, 3], 6), [3, 0, 3])


@pytest.mark.parametrize("method", ["ccs", "hardest", "easiest", "random"])
def test_class_balanced_selection_keeps_each_class_share(method):
    rng = np.random.default_rng(6)
    labels = np.repeat(["a", "b", "c"], [100, 300, 600])
    values = rng.normal(size=1000) + (labels == "c") * 4.0  # class c much harder
    df = pd.DataFrame({"el2n": values, "label": labels}, index=np.arange(1000) + 50)
    ids = select_coreset(df, 0.2, score="el2n", method=method, labels="label", seed=1,
                         hard_cutoff="auto" if method == "ccs" else 0.0)
    assert len(ids) == 200 and len(np.unique(ids)) == 200
    kept = df.loc[ids, "label"].value_counts()
    assert kept.to_dict() == {"a": 20, "b": 60, "c": 120}
    # within a class: the method itself on that class alone (cutoff per class)
    for c, n_c in (("a", 100), ("c", 600)):
        part = df[df.label == c]
        mine = ids[np.isin(ids, part.index)]
        if method in ("hardest", "easiest"):
            np.testing.assert_array_equal(mine, select_coreset(part, 0.2, score="el2n",
                                                               method=method))
        if method == "ccs":  # round(0.2 n_c) hardest of the class removed
            cut = part.el2n.nlargest(round(0.2 * n_c)).index
            assert not set(mine) & set(cut)
    # labels as an array in row order and as a Series on the ids give the same
    same = select_coreset(df, 0.2, score="el2n", method=method, labels=labels, seed=1,
                          hard_cutoff="auto" if method == "ccs" else 0.0)
    np.testing.assert_array_equal(same, ids)
    series = pd.Series(labels, index=df.index)[::-1]
    np.testing.assert_array_equal(select_coreset(
        df, 0.2, score="el2n", method=method, labels=series, seed=1,
        hard_cutoff="auto" if method == "ccs" else 0.0), ids)


def test_bad_labels():
    df = pd.DataFrame({"el2n": [0.1, 0.2, 0.3, 0.4]}, index=list("abcd"))
    with pytest.raises(fk.ForgetkitError, match=r"labels must have shape \(4,\)"):
        select_coreset(df, 0.5, score="el2n", labels=[0, 1, 0])
    with pytest.raises(fk.ForgetkitError, match="labels must not contain NaN; 1 of 4"):
        select_coreset(df, 0.5, score="el2n", labels=[0.0, np.nan, 1.0, 1.0])
    with pytest.raises(fk.ForgetkitError, match="labels 'y' is not a column of scores"):
        select_coreset(df, 0.5, score="el2n", labels="y")
    with pytest.raises(fk.ForgetkitError, match="no label for 1 of the 4 samples"):
        select_coreset(df, 0.5, score="el2n", labels=pd.Series([0, 1, 0], index=list("abc")))
    with pytest.raises(TypeError, match="labels must be integers or strings; got non-integer"):
        select_coreset(df, 0.5, score="el2n", labels=[0.0, 0.5, 1.0, 1.0])
    kept = select_coreset(df, 0.5, score="el2n", method="hardest", labels=[0.0, 0, 1, 1.0])
    np.testing.assert_array_equal(kept, ["b", "d"])  # integral floats are classes


@pytest.mark.parametrize("kwargs,match", [
    (dict(keep=0.0), r"keep must lie in \(0, 1\]; got 0.0"),
    (dict(keep=1.5), r"keep must lie in \(0, 1\]; got 1.5"),
    (dict(keep=-0.2), r"keep must lie in \(0, 1\]"),
    (dict(keep=float("nan")), "keep must be a finite number"),
    (dict(keep=0.5, method="best"), "method must be one of 'ccs', 'hardest'"),
    (dict(keep=0.5, method="hardest", hard_cutoff=0.1), "hard_cutoff applies to method='ccs'"),
    (dict(keep=0.8, hard_cutoff=0.3), "keep \\+ hard_cutoff must not exceed 1"),
    (dict(keep=0.5, hard_cutoff=1.0), r"hard_cutoff must lie in \[0, 1\)"),
    (dict(keep=0.5, hard_cutoff=-0.1), r"hard_cutoff must lie in \[0, 1\)"),
    (dict(keep=0.5, hard_cutoff=float("nan")), "hard_cutoff must be a finite number"),
    (dict(keep=0.5, hard_cutoff="max"), "hard_cutoff must be one of 'auto', 'gentle'; got 'max'"),
    (dict(keep=0.9, hard_cutoff=0.2), "keep \\+ hard_cutoff must not exceed 1"),
    (dict(keep=0.5, strata=0), "strata must be >= 1"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(fk.ForgetkitError, match=match):
        select_coreset(np.arange(10.0), **kwargs)


def test_bad_scores():
    df = pd.DataFrame({"el2n": [0.1, np.nan, 0.3]}, index=["a", "b", "c"])
    with pytest.raises(fk.ForgetkitError, match="must not contain NaN; 1 of 3 are NaN "
                                                "\\(first at sample 'b'\\)"):
        select_coreset(df, 0.5, score="el2n")
    with pytest.raises(fk.ForgetkitError, match="score 'aum' is not a column of scores; the "
                                                "columns are \\['el2n'\\]"):
        select_coreset(df, 0.5, score="aum")
    two = pd.DataFrame({"a": [1.0, 2.0], "b": [2.0, 1.0]})
    with pytest.raises(fk.ForgetkitError, match="score must name the column"):
        select_coreset(two, 0.5)
    with pytest.raises(TypeError, match="scores must be numbers"):
        select_coreset(np.array(["x", "y"]), 0.5)
    twice = pd.Series([0.1, 0.2, 0.3], index=["a", "b", "a"])
    with pytest.raises(fk.ForgetkitError, match="sample id 'a' appears more than once"):
        select_coreset(twice, 0.5)


def test_cli_coreset_refuses_repeated_ids_and_an_empty_selection(tmp_path, capsys):
    csv = tmp_path / "scores.csv"
    pd.DataFrame({"el2n": [0.3, 0.1, 0.2]}, index=[7, 8, 7]).to_csv(csv)
    out = tmp_path / "keep.npy"
    assert main(["coreset", str(csv), "--score", "el2n", "--keep", "0.5", "--out",
                 str(out)]) == 1
    assert "sample id 7 appears more than once" in capsys.readouterr().err
    pd.DataFrame({"el2n": np.arange(200.0)}).to_csv(csv)
    assert main(["coreset", str(csv), "--score", "el2n", "--keep", "0.001", "--out",
                 str(out)]) == 1
    assert "--keep 0.001 of 200 samples keeps none" in capsys.readouterr().err
    assert not out.exists()


# ----------------------------------------------------------------------- CLI
def test_cli_scores_then_coreset(tmp_path, capsys):
    run = make_run(n_epochs=12, n_samples=80, seed=8)
    fk.save(run, tmp_path / "train.npz")
    csv = tmp_path / "scores.csv"
    assert main(["scores", str(tmp_path / "train.npz"), "--out", str(csv)]) == 0
    assert "left out: second_split_forgetting needs" in capsys.readouterr().out
    table = pd.read_csv(csv, index_col=0)
    pd.testing.assert_frame_equal(table, fk.data_scores(run), check_names=False,
                                  check_index_type=False, rtol=1e-12)
    out = tmp_path / "keep.npy"
    assert main(["coreset", str(csv), "--score", "aum", "--keep", "0.25", "--method", "ccs",
                 "--out", str(out), "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(out), select_coreset(fk.data_scores(run), 0.25,
                                                               score="aum"))
    assert main(["coreset", str(csv), "--score", "el2n", "--keep", "0.1", "--hard-cutoff",
                 "auto", "--seed", "3", "--out", str(tmp_path / "auto.npy"), "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "auto.npy"), select_coreset(
        fk.data_scores(run), 0.1, score="el2n", hard_cutoff=0.3, seed=3))
    np.save(tmp_path / "labels.npy", run.labels)
    assert main(["coreset", str(csv), "--score", "el2n", "--keep", "0.3", "--hard-cutoff",
                 "auto", "--labels", str(tmp_path / "labels.npy"), "--out",
                 str(tmp_path / "bal.npy"), "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "bal.npy"), select_coreset(
        fk.data_scores(run), 0.3, score="el2n", hard_cutoff="auto", labels=run.labels))
    assert main(["coreset", str(csv), "--score", "el2n", "--keep", "0.2", "--hard-cutoff",
                 "gentle", "--labels", str(tmp_path / "labels.npy"), "--out",
                 str(tmp_path / "gentle.npy"), "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "gentle.npy"), select_coreset(
        fk.data_scores(run), 0.2, score="el2n", hard_cutoff=0.2, labels=run.labels))


def test_cli_hard_cutoff_names(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["coreset", "s.csv", "--score", "el2n", "--keep", "0.3", "--hard-cutoff",
              "soft", "--out", "k.npy"])
    assert exc.value.code == 2
    assert "expected a number, 'auto' or 'gentle'; got 'soft'" in capsys.readouterr().err


def test_cli_scores_with_a_second_split_and_chosen_scores(tmp_path):
    run = make_run(n_epochs=5, n_samples=40, seed=11)
    second = make_run(n_epochs=3, n_samples=40, seed=12).replace(labels=run.labels)
    fk.save(run, tmp_path / "a.npz")
    fk.save(second, tmp_path / "b.npz")
    csv = tmp_path / "s.csv"
    assert main(["scores", str(tmp_path / "a.npz"), "--out", str(csv), "--quiet",
                 "--second-split", str(tmp_path / "b.npz"), "--epochs", "1", "2", "3",
                 "--scores", "second_split_forgetting", "aum"]) == 0
    table = pd.read_csv(csv, index_col=0)
    ref = fk.data_scores(run, epochs=[1, 2, 3], second_split=second,
                         scores=["aum", "second_split_forgetting"])
    pd.testing.assert_frame_equal(table, ref, check_names=False, rtol=1e-12)


@pytest.mark.parametrize("args,msg", [
    # options are checked before the scores file is read (it does not exist here)
    (["coreset", "{d}/none.csv", "--score", "el2n", "--keep", "0", "--out", "{d}/k.npy"],
     r"keep must lie in \(0, 1\]; got 0.0"),
    (["coreset", "{d}/none.csv", "--score", "el2n", "--keep", "0.5", "--out", "{d}/k.txt"],
     "--out must be a .npy file"),
    (["coreset", "{d}/none.csv", "--score", "el2n", "--keep", "0.1", "--hard-cutoff", "0.95",
      "--out", "{d}/k.npy"], r"keep \+ hard_cutoff must not exceed 1"),
    (["coreset", "{d}/s.csv", "--score", "entropy", "--keep", "0.5", "--out", "{d}/k.npy"],
     "score 'entropy' is not a column of scores"),
    (["coreset", "{d}/nan.csv", "--score", "el2n", "--keep", "0.5", "--out", "{d}/k.npy"],
     "must not contain NaN"),
    (["coreset", "{d}/none.csv", "--score", "el2n", "--keep", "0.5", "--out", "{d}/k.npy"],
     "no such scores file"),
    (["coreset", "{d}/s.csv", "--score", "el2n", "--keep", "0.5", "--labels", "{d}/l3.npy",
      "--out", "{d}/k.npy"], r"labels must have shape \(2,\)"),
    (["scores", "{d}/none.npz", "--out", "{d}/s2.txt"], "--out must be a .csv file"),
    (["scores", "{d}/train.npz", "--out", "{d}/s2.csv", "--second-split", "{d}/other.npz"],
     "second_split must hold the same samples"),
])
def test_cli_errors_one_line(tmp_path, args, msg):
    fk.save(make_run(n_epochs=3, n_samples=10), tmp_path / "train.npz")
    fk.save(make_run(n_epochs=3, n_samples=12), tmp_path / "other.npz")
    pd.DataFrame({"el2n": [0.1, 0.2]}).to_csv(tmp_path / "s.csv")
    pd.DataFrame({"el2n": [0.1, np.nan]}).to_csv(tmp_path / "nan.csv")
    np.save(tmp_path / "l3.npy", np.array([0, 1, 0]))
    argv = [a.format(d=tmp_path) for a in args]
    proc = subprocess.run([sys.executable, "-m", "forgetkit.cli", *argv], capture_output=True,
                          text=True)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert __import__("re").search(msg, lines[0]), lines[0]
    assert not (tmp_path / "k.npy").exists()


def test_all_score_names_are_documented():
    text = open(__import__("pathlib").Path(__file__).parents[1] / "docs" / "definitions.md").read()
    for name in SCORES:
        assert f"`{name}`" in text, name
