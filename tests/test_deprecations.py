"""Renamed arguments and names, and options made keyword-only, keep their old forms working
with a FutureWarning and the same results (docs/api.md, "Deprecated names"); the new forms
warn nothing; every long call takes ``progress`` keyword-only."""

from __future__ import annotations

import inspect
import warnings

import matplotlib
import numpy as np
import pytest

import forgetkit as fk
from forgetkit import evaluate, linear, noise, plots
from forgetkit.analysis import label_issues as label_issues_module

from .conftest import make_run

matplotlib.use("Agg")


def quiet(fn, *args, **kwargs):
    """Call the new form, failing on any FutureWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        return fn(*args, **kwargs)


def test_split_frac_and_positional_seed():
    run = make_run(n_samples=40)
    new_val, new_test = quiet(run.split, 0.25, seed=3)
    with pytest.warns(FutureWarning, match="'frac' is now 'val_frac'"):
        val, test = run.split(frac=0.25, seed=3)
    np.testing.assert_array_equal(val.labels, new_val.labels)
    with pytest.warns(FutureWarning, match=r"split\(\): pass seed by keyword"):
        val, _ = run.split(0.25, 3)
    np.testing.assert_array_equal(val.labels, new_val.labels)
    with pytest.warns(FutureWarning, match="val_frac"):
        old = fk.split_indices(40, frac=0.25, seed=3)
    np.testing.assert_array_equal(old[0], quiet(fk.split_indices, 40, val_frac=0.25, seed=3)[0])
    with pytest.raises(TypeError, match="both 'frac'"):
        run.split(frac=0.5, val_frac=0.5)
    with pytest.raises(fk.ForgetkitError, match="val_frac must lie"):
        run.split(val_frac=1.0)


def test_memory_budget_positional():
    run = make_run(n_samples=30)
    with pytest.warns(FutureWarning, match="memory_budget"):
        assert run.cache_probs(0) is None
    assert quiet(run.cache_probs, memory_budget=1 << 30).shape == run.shape
    with pytest.warns(FutureWarning, match="memory_budget"):
        run.softmax_stats(1 << 30)


@pytest.mark.parametrize("cls, args, params", [
    (fk.KnowledgeFusion, (2, 11), {"window": 2, "grid": 11}),
    (fk.LikelihoodFusion, (3,), {"max_checkpoints": 3}),
    (fk.EnsembleSelection, (3,), {"max_checkpoints": 3}),
    (fk.CheckpointAverage, ("horizontal", 3), {"select": "horizontal", "max_checkpoints": 3}),
])
def test_fuser_options_keyword_only(cls, args, params):
    from sklearn.base import clone

    with pytest.warns(FutureWarning, match="by keyword"):
        old = cls(*args)
    new = quiet(cls, **params)
    assert old.get_params() == new.get_params()
    for name, value in params.items():
        assert new.get_params()[name] == value
    twin = quiet(clone, new)
    assert twin.get_params() == new.get_params() and twin is not new
    assert quiet(twin.set_params, max_checkpoints=4).max_checkpoints == 4
    sig = inspect.signature(cls)
    kinds = {p.name: p.kind for p in sig.parameters.values()}
    assert all(k == inspect.Parameter.KEYWORD_ONLY for name, k in kinds.items()
               if name != "select"), kinds
    run = make_run(n_epochs=6, n_samples=60)
    np.testing.assert_array_equal(old.fit(run).predict(run), new.fit(run).predict(run))
    assert fk.load_fuser(new.to_json()).get_params() == new.get_params()


def test_evaluation_options_keyword_only():
    run = make_run(n_epochs=6, n_samples=80)
    table = quiet(fk.compare, run, methods=["single", "kf"], seeds=(0,))
    with pytest.warns(FutureWarning, match="methods"):
        old = fk.compare(run, ["single", "kf"], seeds=(0,))
    assert old.equals(table)
    with pytest.warns(FutureWarning, match="fmt"):
        assert fk.format_table(table, "markdown") == quiet(fk.format_table, table, fmt="markdown")
    with pytest.warns(FutureWarning, match="windows"):
        evaluate.window_curve(run, (0,), seeds=(0,))
    p = np.full((4, 2), 0.5)
    with pytest.warns(FutureWarning, match="n_bins"):
        assert evaluate.ece(p, np.zeros(4, int), 3) == evaluate.ece(p, np.zeros(4, int), n_bins=3)


def test_theory_options_keyword_only():
    y = np.arange(100) % 10
    with pytest.warns(FutureWarning, match="seed"):
        old = noise.symmetric(y, 0.3, 10, 1)
    np.testing.assert_array_equal(old[0], quiet(noise.symmetric, y, 0.3, 10, seed=1)[0])
    with pytest.warns(FutureWarning, match="seed"):
        noise.asymmetric(y, 0.3, (np.arange(10) + 1) % 10, 1)
    x = np.random.default_rng(0).normal(size=(20, 3))
    with pytest.warns(FutureWarning, match="depth"):
        linear.simulate_deep_linear(x, y[:20] % 2, 2, 4, 0.05, 4)


def test_renamed_functions():
    run = make_run(n_epochs=5, n_samples=60)
    with pytest.warns(FutureWarning, match="confidence_variability"):
        ax = plots.data_map(run)
    assert ax is not None
    labels = np.array([0, 1])
    logp = np.log(np.array([[0.9, 0.1], [0.2, 0.8]]))
    log_t = np.log(np.array([[0.9, 0.1], [0.1, 0.9]]))
    new = label_issues_module.issue_scores(labels, logp.copy(), log_t)
    with pytest.warns(FutureWarning, match="issue_scores"):
        old = label_issues_module.scores(labels, logp.copy(), log_t)
    np.testing.assert_array_equal(old[0], new[0])
    p = np.array([[0.9, 0.1], [0.3, 0.7]])
    with pytest.warns(FutureWarning, match="prediction_metrics"):
        old = evaluate.scores(p, labels)
    assert old[1:] == evaluate.prediction_metrics(p, labels)[1:]


def test_top_k_is_the_top_k_width_everywhere(tmp_path):
    """`to_topk` and `TopKWriter` name the top-k width ``top_k`` as the recorders do; the
    old ``k=`` gives the same run with a FutureWarning."""
    run = make_run(n_epochs=3, n_samples=30, n_classes=6)
    new = quiet(fk.to_topk, run, top_k=3)
    with pytest.warns(FutureWarning, match="'k' is now 'top_k'"):
        old = fk.to_topk(run, k=3)
    assert new.top_k == old.top_k == 3
    np.testing.assert_array_equal(old.outputs.records, new.outputs.records)
    args = dict(vocab_size=6, targets=run.labels, sequence_ids=np.arange(30),
                positions=np.zeros(30, np.int32))
    paths = tmp_path / "new.npy", tmp_path / "old.npy"
    with quiet(fk.TopKWriter, paths[0], top_k=3, **args) as w:
        w.append(0, run.epoch_values(0))
    with pytest.warns(FutureWarning, match="TopKWriter\\(\\): the argument 'k' is now 'top_k'"):
        w = fk.TopKWriter(paths[1], k=3, **args)
    with w:
        w.append(0, run.epoch_values(0))
    a, b = fk.load(paths[0]), fk.load(paths[1])
    assert a.top_k == b.top_k == 3
    np.testing.assert_array_equal(a.outputs.records, b.outputs.records)
    with pytest.raises(TypeError, match="both 'k'"):
        fk.to_topk(run, k=3, top_k=3)


def test_shadowed_modules_still_callable():
    run = make_run(n_epochs=5, n_samples=60)
    with pytest.warns(FutureWarning, match="is a module"):
        old = label_issues_module(run)
    assert old.equals(quiet(fk.label_issues, run))
    assert inspect.ismodule(label_issues_module)


LONG_CALLS = [fk.predictions, fk.correctness, fk.accuracy, fk.forget_fraction, fk.learn_fraction,
              fk.sample_dynamics, fk.double_descent, fk.analysis.summary, fk.data_map,
              fk.analysis.trajectory, fk.label_issues, fk.summarize, fk.compare,
              fk.compare_splits, evaluate.protocol_splits, evaluate.ensemble_size_curve,
              evaluate.window_curve, fk.Run.predictions, fk.Run.correctness, fk.report.build]


@pytest.mark.parametrize("fn", LONG_CALLS, ids=lambda f: f.__qualname__)
def test_long_calls_take_progress_keyword_only(fn):
    param = inspect.signature(fn).parameters["progress"]
    assert param.kind == inspect.Parameter.KEYWORD_ONLY and param.default is False


def test_progress_passes_through(capsys):
    run = make_run(n_epochs=5, n_samples=60)
    ref = fk.forget_fraction(make_run(n_epochs=5, n_samples=60))
    np.testing.assert_array_equal(fk.forget_fraction(run, progress=True), ref)
    assert fk.sample_dynamics(run, progress=True).equals(fk.sample_dynamics(run))
    table = fk.compare(run, methods=["single", "kf"], seeds=(0,), progress=True)
    assert table.equals(fk.compare(run, methods=["single", "kf"], seeds=(0,)))
    assert capsys.readouterr().err == ""  # not a terminal: silent
