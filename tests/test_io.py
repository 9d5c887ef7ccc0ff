import json
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forgetkit as fk

from .conftest import ROOT, kill_when_ready, make_run


@pytest.mark.parametrize("suffix", [".npz", ".npy", ".parquet"])
def test_roundtrip_keeps_everything(tmp_path, suffix):
    run = make_run(n_epochs=4, n_samples=50, n_classes=3)
    run = fk.Run(run.outputs, run.labels, epochs=[2, 4, 6, 8], sample_ids=np.arange(50) * 10,
                 class_names=["a", "b", "c"], meta={"model": "toy", "seed": 3})
    fk.save(run, tmp_path / f"r{suffix}")
    back = fk.load(tmp_path / f"r{suffix}")
    assert np.array_equal(np.asarray(back.outputs), np.asarray(run.outputs))
    assert np.array_equal(back.labels, run.labels)
    assert back.epochs.tolist() == [2, 4, 6, 8]
    assert np.array_equal(back.sample_ids, run.sample_ids)
    assert back.class_names == ["a", "b", "c"]
    assert back.meta == {"model": "toy", "seed": 3}


@pytest.mark.parametrize("name, shape, model", [
    ("fmnist_resnet18_clean_seed100", (60, 10000, 10), "resnet18-cifar-style"),
    ("fmnist_resnet18_sym20_h200_test", (40, 10000, 10), "resnet18"),
    ("fmnist_resnet18_sym20_h200_train5k", (40, 5000, 10), "resnet18"),
])
def test_sample_npz_format_loads(name, shape, model):
    """The NPZ runs in data_samples/ load as float16 logits with their JSON metadata."""
    path = ROOT / "data_samples" / f"{name}.npz"
    run = fk.load(path)
    assert run.shape == shape and run.outputs.dtype == np.float16 and run.kind == "logits"
    assert run.meta["model"] == model
    with np.load(path) as raw:
        assert np.array_equal(np.asarray(run.outputs), raw["logits"])
        assert np.array_equal(run.labels, raw["labels"])


def test_bare_npy_is_memory_mapped_and_needs_labels(tmp_path):
    run = make_run()
    np.save(tmp_path / "o.npy", np.asarray(run.outputs))
    with pytest.raises(ValueError, match="pass labels="):
        fk.load(tmp_path / "o.npy")
    np.save(tmp_path / "y.npy", run.labels)
    back = fk.load(tmp_path / "o.npy", labels=tmp_path / "y.npy")
    assert isinstance(back.outputs, np.memmap)
    assert np.array_equal(fk.forget_fraction(back), fk.forget_fraction(run))


def test_parquet_layout_and_lazy_reads(tmp_path, real_small):
    fk.save(real_small, tmp_path / "r.parquet")
    pf = pq.ParquetFile(tmp_path / "r.parquet")
    assert pf.metadata.num_row_groups == 60
    assert pf.schema_arrow.names == ["epoch", "sample", "outputs"]
    assert pa.types.is_fixed_size_list(pf.schema_arrow.field("outputs").type)
    md = json.loads(pf.schema_arrow.metadata[b"forgetkit"])
    assert md["labels"] == real_small.labels.tolist()
    run = fk.load(tmp_path / "r.parquet")
    assert not isinstance(run.outputs, np.ndarray)  # lazy: read by row group
    assert np.array_equal(run.outputs[7], np.asarray(real_small.outputs[7]))


def test_parquet_from_another_tool_with_variable_lists(tmp_path):
    """A plain list<float> column written by other code reads, with labels given."""
    rng = np.random.default_rng(0)
    vals = rng.normal(size=(3, 20, 4)).astype(np.float32)
    with pq.ParquetWriter(tmp_path / "o.parquet", pa.schema(
            [("epoch", pa.int64()), ("sample", pa.int64()), ("outputs", pa.list_(pa.float32()))]
    )) as w:
        for e in range(3):
            w.write_table(pa.table({"epoch": [e] * 20, "sample": list(range(20))[::-1],
                                    "outputs": list(vals[e][::-1])}))
    labels = rng.integers(0, 4, 20)
    run = fk.load(tmp_path / "o.parquet", labels=labels)
    assert np.array_equal(np.asarray(run.outputs), vals)  # rows put back in sample order


def test_parquet_mismatched_classes_between_epochs(tmp_path):
    schema = pa.schema([("epoch", pa.int64()), ("sample", pa.int64()),
                        ("outputs", pa.list_(pa.float32()))])
    with pq.ParquetWriter(tmp_path / "bad.parquet", schema) as w:
        w.write_table(pa.table({"epoch": [0, 0], "sample": [0, 1],
                                "outputs": [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]}, schema=schema))
        w.write_table(pa.table({"epoch": [1, 1], "sample": [0, 1],
                                "outputs": [[1.0, 2.0], [1.0, 2.0]]}, schema=schema))
    run = fk.load(tmp_path / "bad.parquet", labels=[0, 1])
    with pytest.raises(ValueError, match="epoch 1 .* 2 classes; expected 3"):
        fk.forget_fraction(run)


def test_cartography_import(tmp_path):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 5, 2))
    gold = [0, 1, 1, 0, 1]
    for e in range(3):
        with open(tmp_path / f"dynamics_epoch_{e}.jsonl", "w") as f:
            for i in reversed(range(5)):  # order differs from the first epoch's: aligned by guid
                order = i if e == 0 else (4 - i)
                f.write(json.dumps({"guid": f"id{order}", f"logits_epoch_{e}":
                                    logits[e, order].tolist(), "gold": gold[order]}) + "\n")
    run = fk.load(tmp_path)
    ids = run.sample_ids.tolist()
    assert sorted(ids) == [f"id{i}" for i in range(5)]
    pos = [int(s[2:]) for s in ids]
    np.testing.assert_allclose(np.asarray(run.outputs), logits[:, pos].astype(np.float32))
    assert run.labels.tolist() == [gold[p] for p in pos]


# ------------------------------------------------------------------ writer
@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_writer_appends_and_resumes(tmp_path, suffix):
    run = make_run(n_epochs=6, n_samples=40, n_classes=3)
    path = tmp_path / f"w{suffix}"
    with fk.RunWriter(path, 40, 3, labels=run.labels, dtype="float32") as w:
        for e in range(3):
            w.append(e, run.outputs[e])
    with fk.RunWriter(path, 40, 3, labels=run.labels, dtype="float32") as w:  # resumed
        assert w.epochs == [0, 1, 2]
        with pytest.raises(ValueError, match="not after the last stored epoch 2"):
            w.append(2, run.outputs[2])
        for e in range(3, 6):
            w.append(e, run.outputs[e])
    back = fk.load(path)
    assert back.epochs.tolist() == list(range(6))
    assert np.array_equal(np.asarray(back.outputs), np.asarray(run.outputs))


def test_writer_replace_drops_later_epochs(tmp_path):
    run = make_run(n_epochs=5, n_samples=10, n_classes=3)
    path = tmp_path / "w.npy"
    with fk.RunWriter(path, 10, 3, labels=run.labels, dtype="float32") as w:
        for e in range(5):
            w.append(e, run.outputs[e])
        w.append(3, run.outputs[0], replace=True)
    back = fk.load(path)
    assert back.epochs.tolist() == [0, 1, 2, 3]
    assert np.array_equal(np.asarray(back.outputs[3]), np.asarray(run.outputs[0]))


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_writer_refuses_other_shapes_and_nonfinite(tmp_path, suffix):
    run = make_run(n_epochs=2, n_samples=10, n_classes=3)
    path = tmp_path / f"w{suffix}"
    w = fk.RunWriter(path, 10, 3, labels=run.labels)
    w.append(0, run.outputs[0])
    with pytest.raises(ValueError, match=r"shape \(10, 3\).*got shape \(10, 4\)"):
        w.append(1, np.zeros((10, 4)))
    bad = np.asarray(run.outputs[1]).copy()
    bad[2, 1] = np.inf
    with pytest.raises(ValueError, match="epoch 1 contain NaN or inf"):
        w.append(1, bad)
    w.abort()
    assert fk.load(path).epochs.tolist() == [0]  # earlier epochs kept
    with pytest.raises(ValueError, match="n_classes=3; this writer has n_classes=4"):
        fk.RunWriter(path, 10, 4, labels=run.labels)
    with pytest.raises(ValueError, match="n_samples=10; this writer has n_samples=11"):
        fk.RunWriter(path, 11, 3, labels=np.zeros(11, int))
    with pytest.raises(FileExistsError):
        fk.RunWriter(path, 10, 3, labels=run.labels, mode="x")


def test_writer_float16_overflow_is_refused(tmp_path):
    w = fk.RunWriter(tmp_path / "w.npy", 2, 2, labels=[0, 1])
    with pytest.raises(ValueError, match="NaN or inf \\(in float16\\)"):
        w.append(0, np.array([[1e6, 0.0], [0.0, 1.0]]))


def test_disk_full_keeps_completed_epochs(tmp_path, monkeypatch):
    run = make_run(n_epochs=3, n_samples=10, n_classes=3)
    path = tmp_path / "w.npy"
    w = fk.RunWriter(path, 10, 3, labels=run.labels)
    w.append(0, run.outputs[0])
    w.append(1, run.outputs[1])
    real_write = w._store._file.write

    def full(data):
        real_write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(w._store._file, "write", full)
    with pytest.raises(OSError, match="No space"):
        w.append(2, run.outputs[2])
    back = fk.load(path)
    assert back.epochs.tolist() == [0, 1]
    assert np.array_equal(np.asarray(back.outputs), np.asarray(run.outputs[:2]).astype(np.float16))


CHILD = textwrap.dedent("""
    import sys, time, numpy as np, forgetkit as fk
    path, n = sys.argv[1], 2000
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 100, n)
    w = fk.RunWriter(path, n, 100, labels=labels, dtype="float32", layout="binary")
    e = 0
    while True:
        w.append(e, np.full((n, 100), e, dtype=np.float32))
        e += 1
        if e == 3:
            print("ready", flush=True)
""")


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_killed_writer_keeps_completed_epochs(tmp_path, suffix):
    path = tmp_path / f"killed{suffix}"
    kill_when_ready(CHILD, path, settle=0.3)
    run = fk.load(path)
    assert run.n_epochs >= 3
    assert run.epochs.tolist() == list(range(run.n_epochs))
    for e in (0, run.n_epochs - 1):
        assert (np.asarray(run.outputs[e]) == e).all()


# ------------------------------------------------------------------ bad files
def test_truncated_and_corrupt_files(tmp_path, real_small):
    for suffix in (".npz", ".npy", ".parquet"):
        path = tmp_path / f"r{suffix}"
        fk.save(real_small, path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
        with pytest.raises(ValueError, match="truncated or corrupt"):
            run = fk.load(path)
            fk.forget_fraction(run)
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        fk.load(tmp_path / "junk.parquet")


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot tell the format"):
        fk.load(tmp_path / "run.csv")
    with pytest.raises(FileNotFoundError, match="no such run"):
        fk.load(tmp_path / "run.npz")


def test_failed_save_leaves_existing_file_intact(tmp_path):
    good = make_run(n_epochs=3)
    target = tmp_path / "out.npy"
    fk.save(good, target)
    before = target.read_bytes()
    out = np.asarray(good.outputs).copy()
    out[2, 0, 0] = np.nan
    np.save(tmp_path / "bad.npy", out)
    bad = fk.load(tmp_path / "bad.npy", labels=good.labels)  # memmap: checked while read
    with pytest.raises(ValueError, match="NaN or inf"):
        fk.save(bad, target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["bad.npy", "out.forgetkit.json", "out.npy"]


def test_atomic_write_keeps_the_target_on_error(tmp_path):
    from forgetkit.io import atomic_write

    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [target]
    with atomic_write(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and sorted(tmp_path.iterdir()) == [target]


def test_a_record_encoded_again_for_new_metadata_keeps_its_text(tmp_path):
    """A writer given new metadata with an epoch (a replay's, every epoch) encodes only the
    metadata again: the record's JSON text is the one encoding it all afresh gives."""
    from forgetkit.io.record import record_encoder, run_record

    fields = dict(kind="logits", dtype="float16", n_samples=4, n_classes=3, epochs=[],
                  labels=[2, 0, 1, 2], sample_ids=["a", "b", "c", "é"], class_names=None)
    encode = record_encoder(run_record(**fields, meta={"x": 1}))
    for meta in ({"replay": {"checkpoints": [{"epoch": 3, "sha256": "ab"}]}}, {}, None):
        again = encode.with_meta(meta)([3, 5], [11, 12])
        fresh = record_encoder(run_record(**fields, meta=meta))([3, 5], [11, 12])
        assert again.json_text == fresh.json_text
        assert dict(again) == dict(fresh) == json.loads(again.json_text)
    with fk.RunWriter(tmp_path / "r.npy", 4, 3, labels=[2, 0, 1, 2]) as w:
        for e in range(3):
            w.append(e, np.zeros((4, 3)), meta={"step": e})
    run = fk.load(tmp_path / "r.npy")
    assert run.meta == {"step": 2} and run.epochs.tolist() == [0, 1, 2]
