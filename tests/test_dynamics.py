"""Training dynamics: data maps, AUM, selection and label issues, against plain numpy."""

import json
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from sklearn.metrics import average_precision_score, roc_auc_score  # noqa: E402

import forgetkit as fk  # noqa: E402
from forgetkit import kernels, plots  # noqa: E402
from forgetkit.analysis import confident_joint, ranking_metrics, set_metrics  # noqa: E402
from forgetkit.analysis.dynamics import trajectory  # noqa: E402
from forgetkit.cli import main  # noqa: E402

from .conftest import ROOT, import_real_part, make_run  # noqa: E402
from .reference import (  # noqa: E402
    confident_joint_ref,
    data_map_ref,
    label_issues_ref,
    label_margins_ref,
    softmax64,
)

NOISY_TRAIN = ROOT / "data_samples" / "fmnist_resnet18_sym20_h200_train5k.npz"
COLUMNS = ["confidence", "variability", "correctness", "forgetfulness", "never_learned",
           "threshold_closeness", "aum"]


@pytest.fixture(scope="module")
def train_run():
    """The real ResNet-18 training run (40 epochs, 5,000 training images, 20% flipped)."""
    return fk.load(NOISY_TRAIN)


@pytest.fixture(scope="module")
def noise_mask(train_run):
    mask = np.zeros(train_run.n_samples, dtype=bool)
    mask[train_run.meta["noise_mask"]] = True
    return mask


def check_data_map(run, dm, *, burn_out=None):
    ref = data_map_ref(np.asarray(run.outputs), run.labels, kind=run.kind, burn_out=burn_out)
    for col in COLUMNS:
        want = np.array([row[col] for row in ref])
        got = dm[col].to_numpy()
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13, err_msg=col)
        else:
            assert np.array_equal(got, want), col


# ------------------------------------------------------------------------ kernel
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("ties", [False, True])
def test_kernel_matches_reference(dtype, ties):
    run = make_run(n_epochs=2, n_samples=400, n_classes=7, dtype=dtype, ties=ties, seed=3)
    values = np.asarray(run.outputs[1])
    n = len(values)
    p, margin, correct = np.empty(n), np.empty(n), np.empty(n, dtype=bool)
    total = np.zeros((n, 7))
    assert kernels.label_margins(values, run.labels, p, margin, correct, total=total) == 0
    ref_p, ref_margin, ref_correct = label_margins_ref(values, run.labels)
    np.testing.assert_allclose(p, ref_p, rtol=1e-14, atol=1e-300)
    assert np.array_equal(margin, ref_margin) and np.array_equal(correct, ref_correct)
    np.testing.assert_allclose(total, softmax64(values), rtol=1e-14)
    probs = softmax64(values).astype(dtype)
    probs[0] = 0.0
    probs[0, run.labels[0]] = 1.0  # a zero probability: its log is taken at the tiny float
    assert kernels.label_margins(probs, run.labels, p, margin, correct, softmax=False) == 0
    ref_p, ref_margin, ref_correct = label_margins_ref(probs, run.labels, softmax=False)
    assert np.array_equal(p, ref_p) and np.array_equal(correct, ref_correct)
    np.testing.assert_allclose(margin, ref_margin, rtol=1e-14, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("softmax", [True, False])
@pytest.mark.parametrize("mode", ["serial", "numpy", "parallel"])
def test_one_call_over_epochs_equals_a_call_per_epoch(dtype, softmax, mode):
    """The kernel (one thread, the numpy twin, the pool's threads) over (E, N, C) gives the
    bits of E calls over (N, C): the same per-epoch results, totals summed in epoch order;
    bad rows counted over all epochs."""
    run = make_run(n_epochs=5, n_samples=700, n_classes=6, dtype=dtype, ties=True, seed=11)
    values = np.asarray(run.outputs)
    if not softmax:
        values = np.stack([softmax64(v) for v in values]).astype(dtype)
    values[3, 17, 2] = np.nan
    e, n, c = values.shape

    def outputs(shape):
        return (np.empty(shape), np.empty(shape), np.empty(shape, dtype=bool),
                np.full((n, c), 0.25), np.full((n, c), -0.5))

    each, once = outputs((e, n)), outputs((e, n))
    with kernels.forced(mode):
        bad_each = sum(kernels.label_margins(values[i], run.labels, *(a[i] for a in each[:3]),
                                             softmax=softmax, total=each[3],
                                             total_log=each[4]) for i in range(e))
        bad_once = kernels.label_margins(values, run.labels, *once[:3], softmax=softmax,
                                         total=once[3], total_log=once[4])
    assert bad_each == bad_once == 1
    for a, b in zip(each, once, strict=True):
        assert np.array_equal(a, b, equal_nan=a.dtype != bool)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_kernel_counts_rows_holding_nan_or_inf(dtype):
    values = np.zeros((4, 3), dtype=dtype)
    values[1, 2], values[3, 0] = np.nan, np.inf
    p, margin, correct = np.empty(4), np.empty(4), np.empty(4, dtype=bool)
    for softmax in (True, False):
        assert kernels.label_margins(values, np.zeros(4, np.int64), p, margin, correct,
                                     softmax=softmax) == 2
        assert np.isnan(p[[1, 3]]).all() and not correct[[1, 3]].any()


# ---------------------------------------------------------------------- data map
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_data_map_matches_reference(dtype):
    run = make_run(n_epochs=9, n_samples=250, n_classes=4, dtype=dtype, ties=dtype != np.float64)
    dm = fk.data_map(run)
    check_data_map(run, dm)
    assert list(dm.columns) == ["label", *COLUMNS[:5], "threshold_closeness", "aum", "region"]
    assert dm.index.name == "sample" and np.array_equal(dm.index, np.arange(250))
    assert dm.attrs["n_epochs"] == 9


def test_data_map_of_the_real_training_run(train_run):
    sub = train_run.isel(samples=np.arange(300))
    check_data_map(sub, fk.data_map(sub))
    check_data_map(sub, fk.data_map(sub, burn_out=12), burn_out=12)
    assert fk.data_map(sub, burn_out=12).attrs["n_epochs"] == 12


def test_burn_out_is_checked():
    run = make_run(n_epochs=5)
    for bad, err in ((0, ValueError), (6, ValueError), (2.5, TypeError)):
        with pytest.raises(err, match="burn_out"):
            fk.data_map(run, burn_out=bad)


def test_regions_are_the_documented_thirds():
    run = make_run(n_epochs=10, n_samples=900, seed=5)
    dm = fk.data_map(run)
    v_cut, c_cut = dm.attrs["thresholds"]["variability"], dm.attrs["thresholds"]["confidence"]
    assert v_cut == pytest.approx(np.quantile(dm["variability"], 2 / 3), rel=1e-12)
    amb = dm["region"] == "ambiguous"
    assert amb.sum() == 300 and (dm.loc[amb, "variability"] > v_cut).all()
    rest = dm[~amb]
    assert c_cut == np.median(rest["confidence"])
    easy = rest["region"] == "easy-to-learn"
    assert (rest.loc[easy, "confidence"] >= c_cut).all()
    assert (rest.loc[~easy, "confidence"] < c_cut).all()
    assert (rest.loc[~easy, "region"] == "hard-to-learn").all()
    assert list(dm["region"].cat.categories) == list(fk.analysis.REGIONS)


def test_one_epoch_has_zero_variability_and_no_ambiguous_region():
    run = make_run(n_epochs=1, n_samples=50)
    dm = fk.data_map(run)
    assert (dm["variability"] == 0).all() and (dm["forgetfulness"] == 0).all()
    assert not (dm["region"] == "ambiguous").any()
    check_data_map(run, dm)


def test_never_learned_samples_are_flagged():
    out = np.zeros((4, 3, 3), dtype=np.float32)
    out[:, :, 0] = 1.0  # everyone predicts class 0
    out[1, 1, 1] = 2.0  # sample 1 (label 1) is right once, then forgotten
    dm = fk.data_map(fk.Run(out, [0, 1, 2]))
    assert dm["never_learned"].tolist() == [False, False, True]
    assert dm["forgetfulness"].tolist() == [0, 1, 0]
    assert dm["correctness"].tolist() == [1.0, 0.25, 0.0]


def test_probabilities_run_has_nan_aum_with_a_warning():
    logits = make_run(n_epochs=6, n_samples=80)
    run = fk.Run(softmax64(np.asarray(logits.outputs)), logits.labels, kind="probs")
    with pytest.warns(UserWarning, match="aum"):
        dm = fk.data_map(run)
    assert dm["aum"].isna().all()
    check_data_map(run, dm)
    ref = fk.data_map(logits)
    np.testing.assert_allclose(dm["confidence"], ref["confidence"], rtol=1e-12)


def test_bad_inputs_give_the_usual_errors():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\); got value 3"):
        fk.Run(np.zeros((2, 2, 3)), [0, 3])
    out = make_run(n_epochs=3, n_samples=20).outputs.copy()
    out[2, 5, 1] = np.nan
    run = fk.Run(out, np.zeros(20, np.int64), validate=False)
    for fn in (fk.data_map, fk.label_issues):
        with pytest.raises(ValueError, match="NaN or inf at epoch index 2"):
            fn(run)


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_streamed_run_equals_in_memory(tmp_path, suffix):
    run = make_run(n_epochs=7, n_samples=500, n_classes=6, dtype=np.float16, seed=2)
    fk.save(run, tmp_path / f"run{suffix}")
    disk = fk.load(tmp_path / f"run{suffix}")
    assert disk.checked_per_read
    pd.testing.assert_frame_equal(fk.data_map(disk), fk.data_map(run))
    pd.testing.assert_frame_equal(fk.label_issues(disk), fk.label_issues(run))
    sub = disk.isel(samples=np.arange(100, 300))  # a lazy subset, read in place
    pd.testing.assert_frame_equal(fk.data_map(sub), fk.data_map(run.isel(samples=range(100, 300))))


def test_summary_run_gives_the_data_map():
    run = make_run(n_epochs=6, n_samples=200, n_classes=5, dtype=np.float16, seed=8)
    full, summary = fk.data_map(run), fk.data_map(fk.summarize(run))
    for col in ("correctness", "forgetfulness", "never_learned", "aum", "label"):
        assert np.array_equal(summary[col], full[col]), col
    for col in ("confidence", "variability", "threshold_closeness"):  # float32 log-sum-exp
        np.testing.assert_allclose(summary[col], full[col], atol=1e-6, err_msg=col)
    with pytest.raises(ValueError, match="mean probabilities need every class"):
        trajectory(fk.summarize(run), mean_probs=True)


def test_memmapped_summary_equals_in_memory(tmp_path):
    run = make_run(n_epochs=7, n_samples=400, n_classes=6, dtype=np.float16, seed=5)
    memory, disk = fk.summarize(run), fk.summarize(run, tmp_path / "s.npy")
    assert isinstance(disk.outputs.records, np.memmap)
    for fn in (fk.data_map, fk.label_issues):
        got, want = fn(disk), fn(memory)
        pd.testing.assert_frame_equal(got, want)
        assert got.attrs == want.attrs


def constant_top_run(n_epochs=8, n_samples=600, n_classes=6, seed=11):
    """Logits where each sample's largest other class is the same at every epoch (its true
    class for the mislabelled quarter) and the remaining classes are negligible."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n_samples)
    other = (labels + rng.integers(1, n_classes, n_samples)) % n_classes
    noisy = rng.random(n_samples) < 0.25
    rows = np.arange(n_samples)
    z = rng.normal(-30.0, 1.0, size=(n_epochs, n_samples, n_classes))
    z[:, rows, labels] = rng.normal(np.where(noisy, -0.5, 1.5), 1.0, (n_epochs, n_samples))
    z[:, rows, other] = rng.normal(np.where(noisy, 1.5, 0.0), 1.0, (n_epochs, n_samples))
    return fk.Run(z.astype(np.float32), labels), noisy


def test_summary_label_issues_equal_the_full_run_when_the_top_other_class_is_fixed():
    run, noisy = constant_top_run()
    summary = fk.summarize(run)
    other = summary.outputs.records["other_class"]
    assert (other == other[0]).all()
    full, got = fk.label_issues(run), fk.label_issues(summary)
    np.testing.assert_allclose(got["score"], full["score"], rtol=1e-6, atol=1e-6)
    assert np.array_equal(got["suggested_label"], full["suggested_label"])
    assert np.array_equal(got["is_issue"], full["is_issue"])
    assert got["is_issue"].sum() > 100 and set_metrics(got["is_issue"].to_numpy(), noisy)[
        "f1"] > 0.8
    np.testing.assert_allclose(got.attrs["summary"]["joint"], full.attrs["summary"]["joint"],
                               rtol=1e-12)
    for key in ("n_issues", "n_epochs", "per_class"):
        assert got.attrs["summary"][key] == full.attrs["summary"][key], key


def test_a_label_never_confidently_kept_is_the_most_suspicious_without_a_warning():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 300)
    z = rng.normal(size=(5, 300, 4))
    z[:, labels == 3, 0] += 6  # class 3's samples all look like class 0
    summary = fk.summarize(fk.Run(z.astype(np.float32), labels))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log(0) of the transition was a RuntimeWarning
        issues = fk.label_issues(summary)
    assert np.isposinf(issues["score"][labels == 3]).all()
    assert issues["is_issue"][labels == 3].all()


@pytest.mark.parametrize("name", ["fmnist_cnn_sym20_h200_train4k",
                                  "fmnist_resnet18_asym30_h200_train4k",
                                  "fmnist_resnet18_sym20_h200_train5k",
                                  "fmnist_resnet18_sym40_h200_train4k"])
def test_summary_label_issues_close_to_the_full_run_on_real_runs(name, tmp_path):
    # measured (full -> summary): AUROC .9941->.9943, .9929->.9960, .9985->.9984,
    # .9971->.9970; F1 .896->.914, .981->.985, .967->.972, .966->.973; noise rate within
    # 0.014. Bounds: AUROC 0.01, F1 0.03, noise rate 0.025.
    run = fk.load(ROOT / "data_samples" / f"{name}.npz")
    mask = np.zeros(run.n_samples, dtype=bool)
    mask[run.meta["noise_mask"]] = True
    full = fk.label_issues(run)
    got = fk.label_issues(fk.summarize(run, tmp_path / "s.npy"))
    assert np.array_equal(got["label"], full["label"])
    assert abs(ranking_metrics(got["score"], mask)["auroc"]
               - ranking_metrics(full["score"], mask)["auroc"]) < 0.01
    assert abs(set_metrics(got["is_issue"].to_numpy(), mask)["f1"]
               - set_metrics(full["is_issue"].to_numpy(), mask)["f1"]) < 0.03
    assert abs(got.attrs["summary"]["noise_rate"] - full.attrs["summary"]["noise_rate"]) < 0.025
    assert (got["suggested_label"] == full["suggested_label"]).mean() > 0.97


def test_sample_ids_index_the_data_map():
    run = make_run(n_epochs=4, n_samples=30)
    run = run.replace(sample_ids=np.array([f"s{i}" for i in range(30)]))
    dm = fk.data_map(run)
    assert dm.index.tolist() == [f"s{i}" for i in range(30)]
    assert fk.label_issues(run).index.tolist() == dm.index.tolist()


def test_cartography_formulas_agree(train_run):
    """Dataset Cartography's compute_train_dy_metrics (allenai/cartography,
    cartography/selection/train_dy_filtering.py), its formulas re-implemented: a float32
    softmax (torch's), np.mean and np.std of the label's probability trend, correctness as a
    count of correct epochs, forgetfulness 1000 for samples never learned."""
    z = np.asarray(train_run.outputs, dtype=np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    rows = np.arange(train_run.n_samples)
    trend = probs[:, rows, train_run.labels].astype(np.float64)  # float() of each
    correct = np.argmax(z, axis=-1) == train_run.labels
    confidence, variability = trend.mean(axis=0), trend.std(axis=0)
    counts = correct.sum(axis=0)
    forgetful = np.where(counts == 0, 1000, (correct[:-1] & ~correct[1:]).sum(axis=0))
    dm = fk.data_map(train_run)
    assert np.abs(dm["confidence"] - confidence).max() < 1e-6
    assert np.abs(dm["variability"] - variability).max() < 1e-6
    assert np.abs(dm["threshold_closeness"] - confidence * (1 - confidence)).max() < 1e-6
    assert np.array_equal(dm["correctness"] * train_run.n_epochs, counts)
    assert np.array_equal(np.where(dm["never_learned"], 1000, dm["forgetfulness"]), forgetful)


# ------------------------------------------------------------------------ select
def test_select_orders_like_cartography():
    run = make_run(n_epochs=8, n_samples=300, seed=9)
    dm = fk.data_map(run)
    amb = fk.select(dm, region="ambiguous", frac=0.33)
    assert len(amb) == int(0.33 * 300)
    assert np.array_equal(amb, dm["variability"].sort_values(ascending=False,
                                                            kind="stable").index[:99])
    hard = fk.select(run, region="hard", frac=0.1)
    assert np.array_equal(hard, dm["confidence"].sort_values(kind="stable").index[:30])
    easy = fk.select(dm, region="easy-to-learn")
    assert set(easy) == set(dm.index[dm["region"] == "easy-to-learn"])
    assert dm.loc[easy, "confidence"].is_monotonic_decreasing


def test_select_errors_name_the_argument():
    dm = fk.data_map(make_run(n_epochs=3, n_samples=10))
    with pytest.raises(ValueError, match="region must be one of"):
        fk.select(dm, region="medium")
    for frac in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"frac must lie in \(0, 1\]"):
            fk.select(dm, region="ambiguous", frac=frac)
    with pytest.raises(ValueError, match="selects none"):
        fk.select(dm, region="ambiguous", frac=0.05)
    with pytest.raises(ValueError, match="missing"):
        fk.select(dm.drop(columns="variability"), region="ambiguous", frac=0.5)


# --------------------------------------------------------------------------- plot
def test_data_map_plot(train_run, tmp_path):
    dm = fk.data_map(train_run)
    ax = plots.confidence_variability(dm)
    assert ax.get_xlabel() == "variability" and ax.get_ylabel() == "confidence"
    path = tmp_path / "dm.png"
    ax.figure.savefig(path)
    plt.close(ax.figure)
    img = plt.imread(path)
    assert img[..., :3].std() > 0.01
    fig, ax = plt.subplots()
    assert plots.confidence_variability(make_run(n_epochs=3, n_samples=40), ax=ax) is ax
    plt.close(fig)


# ---------------------------------------------------------------------------- CLI
def test_cli_datamap_writes_figure_and_selection(tmp_path, capsys):
    png, ids = tmp_path / "dm.png", tmp_path / "ids.csv"
    assert main(["datamap", str(NOISY_TRAIN), "-o", str(png), "--select", "ambiguous",
                 "--frac", "0.33", "--out", str(ids), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ambiguous" in out and "never learned" in out
    assert png.read_bytes().startswith(b"\x89PNG")
    table = pd.read_csv(ids, index_col=0)
    want = fk.select(fk.load(NOISY_TRAIN), region="ambiguous", frac=0.33)
    assert table.index.tolist() == want.tolist() and len(want) == 1650


@pytest.mark.parametrize("argv, msg", [
    (["--select", "ambiguous"], "--select REGION and --out IDS.csv go together"),
    (["--frac", "0.3"], "--frac needs --select"),
    (["--burn-out", "99"], r"burn_out must lie in \[1, 40\]"),
])
def test_cli_datamap_errors_are_one_line(argv, msg, capsys):
    assert main(["datamap", str(NOISY_TRAIN), *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("forgetkit datamap: error:")
    assert __import__("re").search(msg, err[0]), err[0]


# ------------------------------------------------------------------- label issues
def test_label_issues_on_the_real_training_run(train_run, noise_mask):
    li = fk.label_issues(train_run)
    assert list(li.columns) == ["label", "suggested_label", "score", "is_issue"]
    assert np.array_equal(li["label"], train_run.labels)
    s = li.attrs["summary"]
    assert s["n_issues"] == li["is_issue"].sum() == round(s["estimated_issues"])
    assert abs(s["noise_rate"] - noise_mask.mean()) < 0.01  # 21.1% estimated, 20.9% true
    per_class = pd.DataFrame(s["per_class"])
    assert per_class.shape == (10, 3) and per_class["n_samples"].sum() == 5000
    assert per_class["estimated_issues"].sum() == pytest.approx(s["estimated_issues"])
    assert np.shape(s["joint"]) == (10, 10)
    assert li.nlargest(3, "score").attrs == li.attrs  # plain values: pandas carries them
    ranking = ranking_metrics(li["score"], noise_mask)
    flagged = set_metrics(li["is_issue"].to_numpy(), noise_mask)
    # a trivial baseline: one minus the final epoch's probability of the label
    final = 1 - train_run.probs(-1)[np.arange(train_run.n_samples), train_run.labels]
    trivial = ranking_metrics(final, noise_mask)
    assert ranking["auroc"] > trivial["auroc"] + 0.005 and ranking["auroc"] > 0.998
    assert ranking["ap"] > trivial["ap"] + 0.015
    assert flagged["f1"] > 0.96
    # the flagged set is the n_issues highest scores
    assert li.loc[li["is_issue"], "score"].min() >= li.loc[~li["is_issue"], "score"].max()


def test_label_issues_score_and_count_by_their_definition(train_run):
    sub = train_run.isel(samples=np.arange(600))
    li = fk.label_issues(sub, n_issues=40)
    assert li["is_issue"].sum() == 40
    assert li.loc[li["is_issue"], "score"].min() >= li.loc[~li["is_issue"], "score"].max()
    score, suggested, estimated = label_issues_ref(np.asarray(sub.outputs), sub.labels)
    np.testing.assert_allclose(li["score"], score, rtol=1e-9, atol=1e-9)
    assert np.array_equal(li["suggested_label"], suggested)
    assert li.attrs["summary"]["estimated_issues"] == pytest.approx(estimated, rel=1e-12)
    with pytest.raises(ValueError, match=r"n_issues must lie in \[0, 600\]"):
        fk.label_issues(sub, n_issues=601)


def test_label_issues_of_probabilities_and_of_a_streamed_run(tmp_path):
    logits = make_run(n_epochs=6, n_samples=300, n_classes=5, seed=4)
    run = fk.Run(softmax64(np.asarray(logits.outputs)), logits.labels, kind="probs")
    got = fk.label_issues(run)
    score, suggested, estimated = label_issues_ref(np.asarray(run.outputs), run.labels,
                                                   kind="probs")
    np.testing.assert_allclose(got["score"], score, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got["score"], fk.label_issues(logits)["score"], rtol=1e-9,
                               atol=1e-9)
    assert got.attrs["summary"]["estimated_issues"] == pytest.approx(estimated, rel=1e-12)


def test_confident_joint_matches_reference_and_cleanlab(train_run):
    probs = fk.pred_probs(train_run)
    labels = train_run.labels
    joint = confident_joint(labels[:800], probs[:800])
    np.testing.assert_allclose(joint, confident_joint_ref(labels[:800], probs[:800]),
                               rtol=1e-12)
    # cleanlab differs in details (a 1e-6 slack on the thresholds, the overall argmax when
    # several classes are confident, at least 1 on the diagonal): estimates agree closely
    count = import_real_part("cleanlab.count", "cleanlab (pip install forgetkit[cleanlab])")
    theirs = count.num_label_issues(labels, probs, estimation_method="off_diagonal_calibrated")
    joint = confident_joint(labels, probs)
    assert joint.sum() - np.trace(joint) == pytest.approx(theirs, abs=2)


def test_pred_probs(train_run):
    sub = train_run.isel(samples=np.arange(200))
    z = np.asarray(sub.outputs)
    np.testing.assert_allclose(fk.pred_probs(sub, how="final"), softmax64(z[-1]), rtol=1e-14)
    np.testing.assert_allclose(fk.pred_probs(sub), softmax64(z).mean(axis=0), rtol=1e-13)
    with pytest.raises(ValueError, match="how must be one of 'mean', 'final'; got 'last'"):
        fk.pred_probs(sub, how="last")


def test_ranking_and_set_metrics_match_scikit_learn():
    rng = np.random.default_rng(0)
    mask = rng.random(500) < 0.2
    score = np.round(rng.normal(size=500) + mask, 1)  # many ties
    got = ranking_metrics(score, mask)
    assert got["auroc"] == pytest.approx(roc_auc_score(mask, score), abs=1e-12)
    assert got["ap"] == pytest.approx(average_precision_score(mask, score), abs=1e-12)
    flagged = score > 1.0
    m = set_metrics(flagged, mask)
    tp = (flagged & mask).sum()
    assert m["precision"] == tp / flagged.sum() and m["recall"] == tp / mask.sum()
    with pytest.raises(ValueError, match=r"noise_mask must be a boolean array of shape \(500,\)"):
        ranking_metrics(score, mask.astype(int))


def test_report_section_lists_the_most_suspicious(train_run, noise_mask):
    from forgetkit.report.html import label_issue_section

    section = label_issue_section(train_run, noise_mask, top=5)
    assert len(section["top"]) == 5 and section["metrics"]["auroc"] > 0.99
    li = fk.label_issues(train_run)
    assert section["top"].index.tolist() == li["score"].nlargest(5).index.tolist()
    assert json.dumps({k: v for k, v in section["metrics"].items()})  # plain numbers


def test_warnings_only_for_probabilities(train_run):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fk.data_map(train_run.isel(samples=np.arange(50)))
