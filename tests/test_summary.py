"""Summary runs: per (epoch, sample) the label's logit, the largest other logit and its
class, the log-sum-exp; exact correctness, label probabilities and margins."""

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.kinds.summary import SUMMARY_DTYPE, summarize_outputs

from .conftest import make_run
from .crashes import Killed, kill_at_rename


def reference_summary(z, y):
    """Plain numpy: (label, largest other, its class, log-sum-exp) in float64."""
    z = np.asarray(z, dtype=np.float64)
    rows = np.arange(len(y))
    others = z.copy()
    others[rows, y] = -np.inf
    cls = others.argmax(axis=1)
    top = z.max(axis=1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    return z[rows, y], others[rows, cls], cls, lse


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_summarize_outputs_matches_the_reference(dtype):
    run = make_run(n_epochs=1, n_samples=500, n_classes=7, ties=True, dtype=dtype)
    z, y = np.asarray(run.outputs[0]), run.labels
    rec = summarize_outputs(z, y)
    label, other, cls, lse = reference_summary(z, y)
    assert rec.dtype == SUMMARY_DTYPE and SUMMARY_DTYPE.itemsize == 16
    assert np.array_equal(rec["label"], label.astype(np.float32))
    assert np.array_equal(rec["other"], other.astype(np.float32))
    assert np.array_equal(rec["other_class"], cls)
    assert np.allclose(rec["lse"], lse, rtol=1e-7)


def test_float64_logits_closer_than_float32_keep_their_order():
    y = np.array([0, 1, 2])
    z = np.array([[1.0 + 1e-12, 1.0, 0.0],   # correct by 1e-12: rounds to a tie in float32
                  [5.0, 5.0 - 1e-12, 0.0],   # wrong by 1e-12
                  [0.0, 3.0, 3.0]])          # an exact tie, label above the other: wrong
    summary = fk.summarize(fk.Run(z[None], y))
    full = fk.Run(z[None], y)
    assert summary.correctness().tolist() == full.correctness().tolist() == \
        [[True, False, False]]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_summary_gives_the_full_runs_forgetting_and_dynamics(tmp_path, dtype):
    run = make_run(n_epochs=9, n_samples=400, n_classes=6, ties=True, dtype=dtype)
    run = run.replace(sample_ids=np.arange(400) * 3, epochs=np.arange(9) * 2,
                      class_names=list("abcdef"), meta={"seed": 1})
    summary = fk.summarize(run, tmp_path / "s.npy")
    assert summary.kind == "summary" and summary.shape == run.shape
    assert isinstance(summary.outputs.records, np.memmap)
    assert (tmp_path / "s.npy").stat().st_size == 256 + 9 * 400 * 16
    back = fk.load(tmp_path / "s.npy")
    for s in (summary, back):
        assert np.array_equal(s.predictions(), run.predictions())
        assert np.array_equal(fk.forget_fraction(s), fk.forget_fraction(run))
        assert np.array_equal(fk.learn_fraction(s), fk.learn_fraction(run))
        assert fk.sample_dynamics(s).equals(fk.sample_dynamics(run))
        assert np.array_equal(s.label_margins(), run.label_margins())  # AUM margins
        np.testing.assert_allclose(s.label_probs(), run.label_probs(), rtol=2e-6, atol=1e-12)
        assert s.epochs.tolist() == run.epochs.tolist()
        assert np.array_equal(s.sample_ids, run.sample_ids)
        assert s.class_names == run.class_names and s.meta == {"seed": 1}
    val, test = back.split(0.5, seed=0)
    rval, rtest = run.split(0.5, seed=0)
    assert np.array_equal(test.correctness(), rtest.correctness())
    assert np.array_equal(val.isel(epochs=[0, 4]).label_margins(),
                          rval.isel(epochs=[0, 4]).label_margins())


def test_label_margins_of_a_full_run():
    run = make_run(n_epochs=3, n_samples=50, n_classes=4)
    z = np.asarray(run.outputs, dtype=np.float64)
    rows = np.arange(50)
    others = z.copy()
    others[:, rows, run.labels] = -np.inf
    expected = z[:, rows, run.labels] - others.max(axis=2)
    assert np.array_equal(run.label_margins(), expected)


def test_summary_is_under_one_percent_of_float16_logits_at_1000_classes():
    assert SUMMARY_DTYPE.itemsize / (1000 * np.dtype(np.float16).itemsize) <= 0.008


def test_what_needs_full_outputs_is_refused_clearly(tmp_path):
    summary = fk.summarize(make_run())
    for call, name in ((lambda: summary.probs(0), "probs()"),
                       (lambda: summary.mean_probs([0, 1]), "mean_probs()"),
                       (lambda: summary.epoch_values(0), "epoch_values()")):
        with pytest.raises(ValueError, match=rf"{name[:-2]}\(\) needs every class's outputs; "
                                             "this run is a summary"):
            call()
    with pytest.raises(ValueError, match="a summary run is saved as .npy"):
        fk.save(summary, tmp_path / "x.npz")
    fk.save(summary.isel(samples=[3, 1]), tmp_path / "x.npy")
    assert fk.load(tmp_path / "x.npy").sample_ids.tolist() == [3, 1]
    for fuser in (fk.KnowledgeFusion(), fk.LikelihoodFusion(), fk.EnsembleSelection()):
        with pytest.raises(ValueError, match="Knowledge Fusion .* this run is a summary"):
            fuser.fit(summary)
    fitted = fk.KnowledgeFusion().fit(make_run())
    with pytest.raises(ValueError, match="needs every class's outputs"):
        fitted.predict_proba(summary)
    with pytest.raises(ValueError, match="summarize needs logits"):
        fk.summarize(fk.Run(np.full((2, 3, 2), 0.5), [0, 1, 1], kind="probs"))


def test_summary_writer_appends_resumes_and_refuses(tmp_path):
    run = make_run(n_epochs=4, n_samples=30, n_classes=5)
    path = tmp_path / "w.npy"
    with fk.SummaryWriter(path, 30, 5, labels=run.labels) as w:
        w.append(0, run.outputs[0])                                   # logits
        w.append(1, summarize_outputs(run.outputs[1], run.labels))   # records
    with fk.SummaryWriter(path, 30, 5, labels=run.labels) as w:     # resumed
        assert w.epochs == [0, 1]
        w.append(2, run.outputs[2])
        with pytest.raises(ValueError, match="not after the last stored epoch 2"):
            w.append(2, run.outputs[2])
        w.append(1, run.outputs[3], replace=True)
    back = fk.load(path)
    assert back.epochs.tolist() == [0, 1]
    expected = fk.summarize(run.isel(epochs=[0, 3]))
    assert np.array_equal(back.correctness(), expected.correctness())
    with pytest.raises(ValueError, match="n_classes=5; this writer has n_classes=6"):
        fk.SummaryWriter(path, 30, 6, labels=run.labels)
    fk.save(run, tmp_path / "full.npy")
    with pytest.raises(ValueError, match="not a forgetkit summary"):
        fk.SummaryWriter(tmp_path / "full.npy", 30, 5, labels=run.labels)
    with pytest.raises(ValueError, match="NaN or inf"):
        fk.SummaryWriter(tmp_path / "n.npy", 30, 5, labels=run.labels).append(
            0, np.full((30, 5), np.nan))


def _summary_records(run):
    return np.asarray(run.outputs.records)


def test_a_parquet_summary_writer_appends_stages_resumes_and_finishes(tmp_path):
    """SummaryWriter to .parquet: epochs staged (loadable while it writes), the Parquet file
    written on close and the staging removed; resumed, replaced, refused like the NPY one."""
    from forgetkit.io.parquet import staging_path

    run = make_run(n_epochs=4, n_samples=30, n_classes=5)
    path = tmp_path / "w.parquet"
    with fk.SummaryWriter(path, 30, 5, labels=run.labels) as w:
        w.append(0, run.outputs[0])
        w.append(1, summarize_outputs(run.outputs[1], run.labels))
        staged = fk.load(path)  # while it writes: the staged epochs
        assert staged.epochs.tolist() == [0, 1] and not path.exists()
        assert fk.verify(path)["verifiable"]
    assert path.exists() and not staging_path(path).exists()
    back = fk.load(path)
    expected = fk.summarize(run.isel(epochs=[0, 1]))
    assert np.array_equal(_summary_records(back), _summary_records(expected))
    with fk.SummaryWriter(path, 30, 5, labels=run.labels) as w:  # resumes the finished file
        assert w.epochs == [0, 1]
        w.append(2, run.outputs[2])
        w.append(1, run.outputs[3], replace=True)
    back = fk.load(path)
    assert back.epochs.tolist() == [0, 1]
    expected = fk.summarize(run.isel(epochs=[0, 3]))
    assert np.array_equal(_summary_records(back), _summary_records(expected))
    assert fk.verify(path) == {"path": str(path), "verifiable": True, "metadata": True,
                               "epochs": 2, "bad": []}
    with pytest.raises(fk.errors.RunExistsError):
        fk.SummaryWriter(path, 30, 5, labels=run.labels, mode="x")
    with pytest.raises(ValueError, match="n_classes=5; this writer has 30, 6"):
        fk.SummaryWriter(path, 30, 6, labels=run.labels)
    with fk.SummaryWriter(path, 30, 5, labels=run.labels, mode="w") as w:  # starts over
        w.append(7, run.outputs[0])
    assert fk.load(path).epochs.tolist() == [7]
    w = fk.SummaryWriter(tmp_path / "a.parquet", 30, 5, labels=run.labels)
    w.append(0, run.outputs[0])
    w.abort()  # no Parquet file; the staged epoch is resumed
    assert not (tmp_path / "a.parquet").exists()
    with fk.SummaryWriter(tmp_path / "a.parquet", 30, 5, labels=run.labels) as w:
        assert w.epochs == [0]


def test_a_kill_while_a_parquet_summary_is_finished_loses_nothing(tmp_path, monkeypatch):
    """A kill at any rename of `close` leaves the staged epochs (loaded, and resumed) or
    the finished file: every appended epoch loads either way."""
    run = make_run(n_epochs=3, n_samples=30, n_classes=5)
    expected = _summary_records(fk.summarize(run))
    finished = set()
    for k in range(4):
        path = tmp_path / f"k{k}.parquet"
        w = fk.SummaryWriter(path, 30, 5, labels=run.labels)
        for e in range(3):
            w.append(e, run.outputs[e])
        with monkeypatch.context() as m:
            kill_at_rename(m, k)
            try:
                w.close()
            except Killed:
                pass  # close released the lock on its way out
        finished.add(path.exists())
        assert np.array_equal(_summary_records(fk.load(path)), expected), f"kill at {k}"
        with fk.SummaryWriter(path, 30, 5, labels=run.labels) as again:
            assert again.epochs == [0, 1, 2]
        assert np.array_equal(_summary_records(fk.load(path)), expected)
    assert finished == {False, True}
