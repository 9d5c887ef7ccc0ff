"""The fuser API every fuser shares: scikit-learn parameters and clone, one JSON format,
prediction from arrays, the staged Knowledge Fusion API, and the README's Python tour."""

import json
import re

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.fusion import (
    CheckpointAverage,
    EarlyStopping,
    EnsembleSelection,
    KnowledgeFusion,
    LikelihoodFusion,
)

from .conftest import ROOT, import_real_part, make_run

sklearn_base = import_real_part("sklearn.base", "scikit-learn")

FUSERS = [
    KnowledgeFusion(window=2, max_windows=3),
    KnowledgeFusion(grid=None, rule="paper"),
    LikelihoodFusion(max_checkpoints=4),
    EnsembleSelection(max_checkpoints=6),
    CheckpointAverage("horizontal", max_checkpoints=3),
    CheckpointAverage("fixed_jumps", max_checkpoints=4),
    EarlyStopping(),
]


@pytest.mark.parametrize("fuser", FUSERS, ids=repr)
def test_clone_keeps_params_and_drops_the_fit(fuser):
    fitted = sklearn_base.clone(fuser).fit(make_run())
    copy = sklearn_base.clone(fitted)
    assert copy.get_params() == fuser.get_params()
    assert not hasattr(copy, "epochs_") and hasattr(fitted, "epochs_")
    with pytest.raises(ValueError, match="not fitted yet"):
        copy.predict_proba(make_run())


def test_get_and_set_params():
    kf = KnowledgeFusion()
    assert kf.get_params() == {"grid": 101, "max_checkpoints": None, "max_windows": None,
                               "progress": False, "rule": "best", "stop_when_no_gain": False,
                               "window": 1}
    assert kf.set_params(window=3) is kf and kf.window == 3
    assert repr(kf) == "KnowledgeFusion(window=3)"
    with pytest.raises(ValueError, match="has no parameter 'k'; valid parameters: "):
        kf.set_params(k=3)


@pytest.mark.parametrize("fuser", FUSERS, ids=repr)
def test_json_round_trip_gives_identical_probabilities(fuser, tmp_path):
    val, test = make_run(n_epochs=15, seed=1).split(0.5, seed=0)
    fitted = sklearn_base.clone(fuser).fit(val)
    path = tmp_path / "fuser.json"
    fitted.to_json(path)
    back = fk.load_fuser(path)
    assert type(back) is type(fitted) and back.get_params() == fitted.get_params()
    assert back.checkpoints_ == fitted.checkpoints_
    np.testing.assert_array_equal(back.predict_proba(test), fitted.predict_proba(test))
    only = test.isel(epochs=fitted.checkpoints_)  # production: just the needed checkpoints
    np.testing.assert_array_equal(back.predict_proba(only), fitted.predict_proba(test))
    assert json.loads(path.read_text())["fuser"] == type(fitted).__name__


def test_from_json_on_a_subclass_refuses_another_fuser():
    text = EarlyStopping().fit(make_run()).to_json()
    assert isinstance(fk.Fuser.from_json(text), EarlyStopping)
    with pytest.raises(ValueError, match="holds a EarlyStopping, not a KnowledgeFusion"):
        KnowledgeFusion.from_json(text)


def test_version_1_plans_still_load(real_small):
    kf = KnowledgeFusion().fit(real_small)
    record = json.loads(kf.to_json())
    v1 = {k: record[k] for k in ("params", "epochs", "n_classes", "plan", "checkpoints",
                                 "val_accuracy", "initial_accuracy")}
    v1["params"] = {k: v for k, v in v1["params"].items() if k != "max_checkpoints"}
    v1.update(format="forgetkit-knowledge-fusion", version=1)
    back = fk.load_fuser(json.dumps(v1))
    assert back.plan_ == kf.plan_
    np.testing.assert_array_equal(back.predict_proba(real_small), kf.predict_proba(real_small))


def test_predict_from_a_bare_outputs_array():
    run = make_run()
    for fuser in (KnowledgeFusion(), LikelihoodFusion(), EnsembleSelection()):
        fuser.fit(np.asarray(run.outputs), run.labels)
        np.testing.assert_array_equal(fuser.predict_proba(np.asarray(run.outputs)),
                                      fuser.predict_proba(run))


def test_staged_predict_proba_yields_independent_stages(real_small):
    val, test = real_small.split(0.5, seed=0)
    kf = KnowledgeFusion().fit(val)
    stages = list(kf.staged_predict_proba(test))
    assert len(stages) == 1 + sum(eps > 0 for _, eps in kf.plan_)
    assert len(stages) > 2 and not np.array_equal(stages[0], stages[-1])
    np.testing.assert_array_equal(stages[0], test.probs(-1))
    np.testing.assert_array_equal(stages[-1], kf.predict_proba(test))
    for i, stage in enumerate(stages):
        np.testing.assert_array_equal(stage, kf.with_windows(i).predict_proba(test))


def test_one_ensemble_budget_name(real_small):
    """max_checkpoints bounds the checkpoints of every fuser, KF included."""
    for fuser in (KnowledgeFusion(max_checkpoints=5), LikelihoodFusion(max_checkpoints=5),
                  EnsembleSelection(max_checkpoints=5)):
        assert fuser.fit(real_small).ensemble_size_ <= 5
    kf, full = KnowledgeFusion(max_checkpoints=5).fit(real_small), \
        KnowledgeFusion().fit(real_small)
    assert full.ensemble_size_ > 5
    assert kf.plan_ == full.plan_[: len(kf.plan_)]  # the budget cuts the same plan
    assert CheckpointAverage("horizontal", max_checkpoints=5).fit(real_small).ensemble_size_ == 5


def test_isel_and_sel_name_positions_and_labels_apart():
    run = fk.Run(make_run(n_epochs=6, n_samples=8).outputs, make_run(n_epochs=6,
                 n_samples=8).labels, epochs=[0, 2, 4, 6, 8, 10],
                 sample_ids=[f"s{i}" for i in range(8)])
    by_number = run.sel(epochs=[4, 10], samples=["s3", "s0"])
    by_position = run.isel(epochs=[2, 5], samples=[3, 0])
    assert by_number.epochs.tolist() == by_position.epochs.tolist() == [4, 10]
    assert by_number.sample_ids.tolist() == ["s3", "s0"]
    np.testing.assert_array_equal(by_number.outputs, by_position.outputs)
    with pytest.raises(ValueError, match=r"lacks epochs \[5\]"):
        run.sel(epochs=[5])
    with pytest.raises(ValueError, match=r"lacks sample ids \['x'\]"):
        run.sel(samples=["x"])


def test_the_readme_python_tour_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Python\n\n```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    block = block.replace('"data_samples/', f'"{ROOT}/data_samples/')
    exec(compile(block, "README.md", "exec"), {})
    assert (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("fuser", FUSERS, ids=repr)
def test_every_fuser_checks_its_validation_run(fuser):
    with pytest.raises(ValueError, match="at least 2 epochs; got 1"):
        sklearn_base.clone(fuser).fit(make_run().isel(epochs=[3]))
    with pytest.raises(ValueError, match="single class"):
        sklearn_base.clone(fuser).fit(fk.Run(make_run().outputs, np.zeros(300, int)))
