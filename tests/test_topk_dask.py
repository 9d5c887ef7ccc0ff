"""Certified fusion on top-k runs held on dask (shards, or any dask array of records) on a
real dask.distributed cluster (2 worker processes): every fuser's fit, certificates,
certified accuracy and `compare` equal the in-memory path's bit for bit, also after a
worker is killed mid-fit; a shard read epoch by epoch is verified per epoch."""

import os
import signal

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.errors import CorruptFileError, ForgetkitError
from forgetkit.fusion import fitstate
from forgetkit.kinds.topk import TopKOutputs, topk_dtype

from .conftest import import_real_part
from .test_topk_fusion import make_logits, topk_run

dask = import_real_part("dask", "dask (the forgetkit[dask] extra)")
da = import_real_part("dask.array", "dask (the forgetkit[dask] extra)")
distributed = import_real_part("distributed", "dask.distributed (the forgetkit[dask] extra)")

@pytest.fixture(scope="module")
def top():
    """A top-k run (k = 3 of 30 classes, 8 checkpoints, 2,000 tokens) held in memory."""
    logits, targets = make_logits(5, n_epochs=8, n_tokens=2000, vocab=30)
    return topk_run(logits, targets, 3)


def write_shards(run, folder, suffix=".npy"):
    """``run`` as three shards of unequal sizes."""
    folder.mkdir()
    bounds = [0, run.n_samples * 7 // 20, run.n_samples * 3 // 4, run.n_samples]
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        fk.save(run.isel(samples=np.arange(a, b)), folder / f"shard-{i}{suffix}")
    return str(folder / f"shard-*{suffix}")


def on_dask(run, source, tmp_path):
    """``run`` held on dask: NPY shards (chunks that cut the shards: one read per epoch and
    chunk), Parquet shards (one chunk per shard, every epoch read at once), or a dask array
    of the records chunked by tokens only."""
    if source == "npy":
        return fk.load(write_shards(run, tmp_path / "s"), chunks=300)
    if source == "parquet":
        return fk.load(write_shards(run, tmp_path / "s", ".parquet"))
    out = run.outputs
    records = da.from_array(np.asarray(out.records), chunks=(-1, 450))
    return fk.Run(TopKOutputs(records, run.n_classes, out.sequence_ids, out.positions),
                  run.labels, kind="topk", epochs=run.epochs)


def fusers():
    return [fk.KnowledgeFusion(), fk.KnowledgeFusion(window=0, grid=11, stop_when_no_gain=True),
            fk.EnsembleSelection(max_checkpoints=4), fk.LikelihoodFusion(max_checkpoints=3),
            fk.EarlyStopping(), fk.CheckpointAverage("horizontal", max_checkpoints=3)]


@pytest.mark.parametrize("source", ["npy", "parquet", "array"])
def test_every_fuser_on_dask_equals_memory_bit_for_bit(client, top, tmp_path, source):
    run = on_dask(top, source, tmp_path)
    assert run.is_distributed and run.kind == "topk"
    for ref, got in zip(fusers(), fusers(), strict=True):
        ref.fit(top)
        got.fit(run)
        assert got.to_json() == ref.to_json(), type(ref).__name__
        assert got.certified(run).equals(ref.certified(top))
        assert got.certified_accuracy(run) == ref.certified_accuracy(top)
        # a plan fitted in memory certifies the run on dask alike
        assert ref.certified(run).equals(ref.certified(top))


def test_compare_on_topk_shards_equals_memory(client, top, tmp_path):
    run = on_dask(top, "npy", tmp_path)
    ref = fk.compare(top, seeds=(0, 1))
    assert "accuracy_low" in ref
    assert fk.compare(run, seeds=(0, 1)).equals(ref)


def test_every_class_stored_gives_fused_probabilities_on_dask(client, tmp_path):
    logits, targets = make_logits(3, n_epochs=5, n_tokens=600, vocab=6)
    top = topk_run(logits, targets, 6)  # k is the vocabulary: every value exact
    run = on_dask(top, "npy", tmp_path)
    kf = fk.KnowledgeFusion().fit(top)
    assert fk.KnowledgeFusion().fit(run).plan_ == kf.plan_
    got = kf.predict_proba(run)
    assert isinstance(got, da.Array)
    np.testing.assert_array_equal(got.compute(), kf.predict_proba(top))


def test_the_continuous_eps_search_is_refused_on_dask(client, top, tmp_path):
    run = on_dask(top, "array", tmp_path)
    with pytest.raises(ForgetkitError, match="grid=None .* pass an eps grid"):
        fk.KnowledgeFusion(grid=None).fit(run)


def test_a_corrupt_epoch_of_a_shard_fails_the_fit_naming_shard_and_epoch(client, tmp_path):
    logits, targets = make_logits(7, n_epochs=4, n_tokens=300, vocab=12)
    top = topk_run(logits, targets, 3)
    folder = tmp_path / "s"
    folder.mkdir()
    for i, (a, b) in enumerate([(0, 100), (100, 300)]):
        fk.save(top.isel(samples=np.arange(a, b)), folder / f"shard-{i}.npy")
    pattern = str(folder / "shard-*.npy")
    bad = folder / "shard-1.npy"
    with open(bad, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        offset = f.tell()
    data = bytearray(bad.read_bytes())
    # epoch index 2, token 50: the exponent of its largest logit
    data[offset + topk_dtype(3, 12).itemsize * (200 * 2 + 50) + 11] ^= 0x10
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"shard .*shard-1.npy.*epoch index 2 does not "
                                               "match its checksum"):
        fk.KnowledgeFusion().fit(fk.load(pattern))
    # read in parts, the values are checked instead
    with pytest.raises(ForgetkitError, match=r"shard .*shard-1.npy.*epoch index 2"):
        fk.KnowledgeFusion().fit(fk.load(pattern, chunks=60))


def test_the_fit_survives_a_worker_killed_mid_fit(client, top, tmp_path, monkeypatch):
    """Each chunk's fit state is a chain of futures: a worker lost after the first mix is
    recomputed from its shards, and the plan is the in-memory one."""
    mix = fitstate.ChunkedFitState.mix
    killed = []

    def mix_after_a_kill(state, window, eps):
        if getattr(state.parts, "client", None) is not None and state.n_mixed == 1:
            pid = next(iter(state.parts.client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        mix(state, window, eps)

    monkeypatch.setattr(fitstate.ChunkedFitState, "mix", mix_after_a_kill)
    ref = fk.KnowledgeFusion(window=0).fit(top)
    assert sum(eps > 0 for _, eps in ref.plan_) >= 2
    got = fk.KnowledgeFusion(window=0).fit(on_dask(top, "npy", tmp_path))
    assert got.to_json() == ref.to_json()
    assert killed


def _set_cache_bytes(value):
    import forgetkit.kinds.topk as kinds_topk

    old, kinds_topk.CACHE_BYTES = kinds_topk.CACHE_BYTES, value
    return old


@pytest.mark.parametrize("source", ["npy", "array"])
def test_workers_without_room_for_a_record_cache_read_each_window(client, top, tmp_path,
                                                                   source):
    """With no room for a record cache on the workers, each window reads its epochs of the
    chunk there; the fits equal the in-memory ones."""
    run = on_dask(top, source, tmp_path)
    old = client.run(_set_cache_bytes, 0)
    try:
        for ref, got in zip(fusers(), fusers(), strict=True):
            assert got.fit(run).to_json() == ref.fit(top).to_json(), type(ref).__name__
    finally:
        client.run(_set_cache_bytes, next(iter(old.values())))


@pytest.mark.parametrize("cache_bytes", [0, 1 << 29])
def test_a_chunks_fit_state_keeps_none_of_the_records_it_read(top, monkeypatch, cache_bytes):
    """A worker's fit and selection states hold layouts and bounds, not the chunk's records:
    what the layouts and each step read is freed after them (the 10M-token fit's memory)."""
    import gc
    import weakref

    from forgetkit.distributed.topk import ChunkFit, ChunkRecords, ChunkSelection
    from forgetkit.kinds.topk import TopKData

    monkeypatch.setattr("forgetkit.kinds.topk.CACHE_BYTES", cache_bytes)
    reads = []  # a weak reference to every array read from the chunk

    def noted(read):
        def wrapper(*args):
            array = read(*args)
            reads.append(weakref.ref(array))
            return array
        return wrapper

    monkeypatch.setattr(ChunkRecords, "hold", noted(ChunkRecords.hold))
    monkeypatch.setattr(ChunkRecords, "_epoch", noted(ChunkRecords._epoch))
    records = da.from_array(np.asarray(top.outputs.records), chunks=(-1, 700))[:, 700:1400]
    data = TopKData(ChunkRecords(records), top.labels[700:1400], top.n_classes)
    state = ChunkFit(data)
    assert len(state.grid_counts((0, 1, 2), np.linspace(0, 1, 5))) == 5
    state.mix((3, 4), 0.5)
    selection = ChunkSelection(data).add(2, 0)
    assert selection.scores().shape == (top.n_epochs,)
    gc.collect()
    assert len(reads) >= 3 + (cache_bytes == 0) * 2  # the layouts' holds, and the windows'
    assert [ref for ref in reads if ref() is not None] == []
