"""Companions are part of the run (issue 38, item 3): an output path is checked against
every file of every input run (token tables, pending files, sidecars, staging folders,
locks), and a lock file must be a regular file with one link."""

import os

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.kinds.topk import TopKOutputs, topk_records

E, N, C = 3, 12, 5


def full_run():
    rng = np.random.default_rng(3)
    return fk.Run(rng.normal(size=(E, N, C)).astype(np.float32), rng.integers(0, C, N),
                  epochs=[1, 2, 4])


def topk_run(k=2):
    run = full_run()
    records = np.stack([topk_records(run.epoch_values(e), run.labels, k)
                        for e in range(run.n_epochs)])
    return fk.Run(TopKOutputs(records, C, np.arange(N) // 4, np.arange(N) % 4), run.labels,
                  kind="topk", epochs=run.epochs)


@pytest.fixture
def stored_topk(tmp_path):
    path = tmp_path / "t.npy"
    fk.save(topk_run(), path)
    table = (tmp_path / "t.tokens.npy").read_bytes()
    yield path
    assert (tmp_path / "t.tokens.npy").read_bytes() == table  # untouched
    fk.load(path)


def test_the_token_table_is_refused_as_an_output_of_the_api(stored_topk):
    tokens = stored_topk.with_name("t.tokens.npy")
    with pytest.raises(fk.errors.OverwriteError, match="t.tokens.npy"):
        fk.convert(stored_topk, tokens)
    with pytest.raises(fk.errors.OverwriteError, match="t.tokens.npy"):
        fk.save(fk.load(stored_topk), tokens)


@pytest.mark.parametrize("args", [
    ["convert", "{run}", "{tokens}"],
    ["analyze", "{run}", "--quiet", "--json", "{tokens}"],
    ["datamap", "{run}", "-o", "{tokens}"],
    ["analyze", "{run}", "--quiet", "--json", "{tokens}.next"],  # the pending table
])
def test_the_token_table_is_refused_as_an_output_of_the_cli(stored_topk, args, capsys):
    tokens = stored_topk.with_name("t.tokens.npy")
    argv = [a.format(run=stored_topk, tokens=tokens) for a in args]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "t.tokens.npy" in err


def test_a_file_inside_an_input_staging_folder_is_refused(tmp_path):
    path = tmp_path / "r.parquet"
    with fk.RunWriter(path, N, C, labels=full_run().labels) as writer:
        writer.append(0, np.zeros((N, C), np.float32))
        staged = path.with_name("r.parquet.partial") / "copy.npy"
        with pytest.raises(fk.errors.OverwriteError, match="partial"):
            fk.convert(path, staged)


@pytest.mark.parametrize("write", ["save", "writer"])
def test_a_hard_link_planted_as_the_lock_is_refused(tmp_path, write):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = tmp_path / "r.npy"
    os.link(victim, tmp_path / "r.npy.lock")
    with pytest.raises(fk.ForgetkitError, match="lock file .*link"):
        if write == "save":
            fk.save(full_run(), path)
        else:
            fk.RunWriter(path, N, C, labels=full_run().labels)
    assert victim.read_text() == "keep me"
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_lock_file_of_another_user_is_refused(tmp_path):
    path = tmp_path / "r.npy"
    lock = tmp_path / "r.npy.lock"
    lock.write_text("")
    os.chown(lock, 12345, 12345)
    with pytest.raises(fk.ForgetkitError, match="lock file .*owned by another user"):
        fk.save(full_run(), path)
    assert not path.exists()
