"""The executor protocol (forgetkit.execution): the local executor in blocks of samples gives
the results of the run read as one chunk, progress shows on it, and the core finds the dask
executor by the outputs' type without importing forgetkit.distributed itself. Outputs
backends (forgetkit.backends): a new storage kind is one backend class."""

import io
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import forgetkit as fk
from forgetkit.backends import Backend, LazyOutputs, register_backend
from forgetkit.execution import (
    LocalExecutor,
    combine,
    executor_for,
    register_executor,
    use_executor,
)

from .conftest import make_run


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_blocks_give_the_results_of_one_chunk():
    run = make_run(n_epochs=9, n_samples=301, ties=True, seed=2)
    refs = (fk.forget_fraction(run), fk.sample_dynamics(run), fk.data_map(run),
            fk.label_issues(run), fk.KnowledgeFusion().fit(run).plan_)
    for chunks in (1, 50, (300, 1), (7, 200, 94)):
        with use_executor(LocalExecutor(chunks)):
            assert not executor_for(run).whole(run)
            np.testing.assert_array_equal(fk.forget_fraction(run), refs[0])
            pd.testing.assert_frame_equal(fk.sample_dynamics(run), refs[1])
            for got, ref in ((fk.data_map(run), refs[2]), (fk.label_issues(run), refs[3])):
                pd.testing.assert_frame_equal(got, ref, check_exact=True)
                assert got.attrs == ref.attrs
            assert fk.KnowledgeFusion().fit(run).plan_ == refs[4]
    assert executor_for(run).whole(run)  # the context is left


def test_progress_shows_on_blocks_and_on_one_chunk(monkeypatch):
    run = make_run(n_epochs=5, n_samples=40)
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    fk.data_map(run, progress=True)
    assert "training dynamics: 5/5 epochs" in term.getvalue()
    with use_executor(LocalExecutor(10)):
        fk.label_issues(run, progress=True)
        fk.analysis.summary(run.replace(), progress=True)
    assert "training dynamics: 4/4 chunks" in term.getvalue()
    assert "forgetting pass: 4/4 chunks" in term.getvalue()


def test_combine_sums_counts_and_concatenates_rows():
    a = (np.array([1, 2]), pd.DataFrame({"x": [1]}, index=[5]))
    b = (np.array([3, 4]), pd.DataFrame({"x": [2]}, index=[6]))
    counts, rows = combine([a, b])
    assert counts.tolist() == [4, 6] and rows.index.tolist() == [5, 6]


def test_bad_executors_and_blocks_are_named():
    run = make_run(n_samples=10)
    with pytest.raises(ValueError, match="chunks must add up to the run's 10 samples; got 9"):
        LocalExecutor((4, 5)).bounds(run)
    with pytest.raises(ValueError, match="chunks must be >= 1; got 0"):
        LocalExecutor(0)
    with pytest.raises(ValueError, match="at least one block"):
        LocalExecutor(())
    with pytest.raises(TypeError, match="use_executor takes a LocalExecutor or None; got str"):
        with use_executor("dask"):
            pass
    with pytest.raises(TypeError, match="takes a callable and an Executor"):
        register_executor(lambda x: True, "local")


def test_the_core_never_imports_forgetkit_distributed():
    """Only a run on a dask array brings in the dask executor (found through the registry
    hook); forgetkit's modules never import forgetkit.distributed."""
    code = ("import sys, numpy as np, forgetkit as fk\n"
            "run = fk.Run(np.zeros((2, 4, 3)), [0, 1, 2, 0])\n"
            "fk.forget_fraction(run); fk.label_issues(run); fk.KnowledgeFusion().fit(run)\n"
            "assert 'forgetkit.distributed' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    pattern = r"from \.+distributed|import forgetkit\.distributed|from forgetkit\.distributed"
    allowed = {"cli.py", "__init__.py"}  # the CLI's sweep, the lazy fk.sweep attribute
    root = fk.execution.__file__.rsplit("/", 1)[0]
    found = subprocess.run(["grep", "-rlE", pattern, root, "--include=*.py"],
                           capture_output=True, text=True).stdout.split()
    outside = [f for f in found if "/distributed/" not in f
               and not (f.rsplit("/", 1)[1] in allowed and f.count("/") == root.count("/") + 1)]
    assert not outside, outside


class SampleMajor(LazyOutputs):
    """Outputs stored sample by sample, (N, E, C): a storage kind forgetkit does not know."""

    def __init__(self, values):
        n, e, c = values.shape
        super().__init__((e, n, c), values.dtype)
        self.values = values

    def _read(self, e):
        return self.values[:, e]


class SampleMajorBackend(Backend):
    """Its backend: reads a block of epochs by moving the axes, nothing else."""

    streamed = True

    def read(self, epochs):
        block = self.outputs.values[:, epochs]
        return np.ascontiguousarray(np.moveaxis(block, 0, -2) if block.ndim == 3 else block)

    def take(self, samples, *, lazy):
        return SampleMajor(self.outputs.values[samples])


def test_a_new_backend_needs_no_change_to_the_algorithms():
    run = make_run(n_epochs=8, n_samples=200, ties=True, seed=5)
    values = np.ascontiguousarray(np.swapaxes(np.asarray(run.outputs), 0, 1))
    register_backend(lambda x: isinstance(x, SampleMajor), SampleMajorBackend)
    other = fk.Run(SampleMajor(values), run.labels)
    assert isinstance(other.backend, SampleMajorBackend)
    np.testing.assert_array_equal(other.predictions(), run.predictions())
    pd.testing.assert_frame_equal(fk.data_map(other), fk.data_map(run))
    pd.testing.assert_frame_equal(fk.label_issues(other), fk.label_issues(run))
    kf = fk.KnowledgeFusion().fit(other)
    assert kf.plan_ == fk.KnowledgeFusion().fit(run).plan_
    np.testing.assert_array_equal(kf.predict_proba(other), kf.predict_proba(run))
    with use_executor(LocalExecutor(64)):  # blocks of the new storage: its take
        pd.testing.assert_frame_equal(fk.sample_dynamics(other), fk.sample_dynamics(run))
    with pytest.raises(TypeError, match="takes a callable and a Backend subclass"):
        register_backend(lambda x: True, "sample-major")
