"""Every byte that changes a result is covered (issue 38, item 1): the metadata that defines a
run (epoch numbers, labels, sample ids, class names, shape, kind, vocabulary, k) is
checksummed as its values are, in every format, and checked by `load` and `verify`."""

import json
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.io.record import sidecar_path
from forgetkit.kinds.topk import TopKOutputs, topk_records

from .conftest import import_real_part

E, N, C = 3, 12, 3


def original_run():
    rng = np.random.default_rng(7)
    return fk.Run(rng.normal(size=(E, N, C)).astype(np.float32), rng.integers(0, C, N),
                  epochs=[1, 3, 7], sample_ids=[f"s{i}" for i in range(N)],
                  class_names=["cat", "dog", "eel"], meta={"lr": 0.1})


RUN = original_run()


def topk_run(run, k=2):
    records = np.stack([topk_records(run.epoch_values(e), run.labels, k)
                        for e in range(run.n_epochs)])
    return fk.Run(TopKOutputs(records, run.n_classes, np.arange(run.n_samples) // 4,
                              np.arange(run.n_samples) % 4), run.labels, kind="topk",
                  epochs=run.epochs)


def refused(path, match=None):
    """``path`` is refused by `load` (a CorruptFileError matching ``match``) and by
    `verify`."""
    with pytest.raises(fk.errors.CorruptFileError, match=match):
        fk.load(path)
    with pytest.raises(fk.ForgetkitError):
        fk.verify(path)


def stored_metadata(path):
    """The key-value metadata of a Parquet file, but the serialized Arrow schema (which
    would restore the old metadata on read)."""
    return {k: v for k, v in pq.read_metadata(path).metadata.items() if k != b"ARROW:schema"}


def edit_sidecar(path, change):
    sidecar = sidecar_path(path)
    record = json.loads(sidecar.read_text())
    change(record)
    sidecar.write_text(json.dumps(record))


@pytest.mark.parametrize("field, value", [
    ("sample_ids", [f"t{i}" for i in range(N)]),
    ("class_names", ["cat", "dog", "fox"]),
    ("meta", {"lr": 0.2}),
    ("kind", "probs"),
])
def test_npy_sidecar_metadata_is_checksummed(tmp_path, field, value):
    path = tmp_path / "run.npy"
    fk.save(RUN, path)
    edit_sidecar(path, lambda r: r.update({field: value}))
    refused(path, "metadata")


def test_a_renamed_sidecar_key_is_refused_not_defaulted(tmp_path):
    path = tmp_path / "run.npy"
    fk.save(RUN, path)
    edit_sidecar(path, lambda r: r.update(apochs=r.pop("epochs")))
    refused(path, "apochs")
    edit_sidecar(path, lambda r: r.pop("apochs"))
    refused(path, "epochs")


def test_an_npy_header_epoch_count_cannot_hide_epochs(tmp_path):
    path = tmp_path / "run.npy"
    fk.save(RUN, path)
    data = path.read_bytes()
    at = data.index(b"'shape': (3,")
    path.write_bytes(data[:at] + b"'shape': (2," + data[at + len(b"'shape': (3,"):])
    run = fk.load(path)  # the sidecar names and checksums 3 epochs, and the file holds them
    assert run.epochs.tolist() == [1, 3, 7]
    np.testing.assert_array_equal(np.asarray(run.outputs), np.asarray(RUN.outputs))
    assert fk.verify(path)["epochs"] == 3
    with open(path, "r+b") as f:  # the third epoch's bytes gone as well: refused
        f.truncate(len(data) - N * C * 4)
    refused(path, "epoch")


def _writer(kind, path, n, v, y):
    """A writer of each kind that appends npy epochs (full run, summary, top-k)."""
    if kind == "full":
        return fk.RunWriter(path, n_samples=n, n_classes=v, labels=y)
    if kind == "summary":
        return fk.SummaryWriter(path, n_samples=n, n_classes=v, labels=y)
    return fk.TopKWriter(path, vocab_size=v, top_k=2, targets=y,
                         sequence_ids=np.zeros(n, dtype=int), positions=np.arange(n))


@pytest.mark.parametrize("kind", ["full", "summary", "topk"])
def test_a_resumed_writer_keeps_the_epochs_a_load_shows(tmp_path, kind):
    """A writer killed after its sidecar names an epoch but before the header counts it:
    the load shows that epoch (its bytes are on disk, checksummed), so the writer that
    resumes keeps it too and appends after it."""
    n, v = 6, 5
    rng = np.random.default_rng(0)
    y = rng.integers(0, v, n)
    z = rng.normal(size=(4, n, v)).astype(np.float32)
    path = tmp_path / "run.npy"
    with _writer(kind, path, n, v, y) as w:
        for e in range(3):
            w.append(e, z[e])
    data = path.read_bytes()
    at = data.index(b"'shape': (3,")  # the header as the kill left it: 2 epochs counted
    path.write_bytes(data[:at] + b"'shape': (2," + data[at + len(b"'shape': (3,"):])
    assert fk.load(path).epochs.tolist() == [0, 1, 2]
    with _writer(kind, path, n, v, y) as w:
        assert w.epochs == [0, 1, 2]
        w.append(3, z[3])
    run = fk.load(path)
    assert run.epochs.tolist() == [0, 1, 2, 3]
    assert fk.verify(path)["bad"] == []


def test_npz_member_names_and_metadata_are_covered(tmp_path):
    path = tmp_path / "run.npz"
    fk.save(RUN, path, compress=False)
    data = bytearray(path.read_bytes())
    at = data.rindex(b"epochs.npy")  # the central directory's entry
    data[at + len("epochs.np")] = ord("x")
    path.write_bytes(bytes(data))
    refused(path, "epochs")
    fk.save(RUN.replace(sample_ids=[f"t{i}" for i in range(N)]), tmp_path / "other.npz")
    with np.load(tmp_path / "other.npz") as z:
        ids = z["sample_ids"]
    fk.save(RUN, path)
    with np.load(path) as z:
        arrays = dict(z)
    arrays["sample_ids"] = ids
    np.savez(path, **arrays)
    refused(path, "metadata")


def test_npz_members_have_a_total_expansion_limit(tmp_path):
    path = tmp_path / "bomb.npz"
    fk.save(RUN, path)
    member = np.zeros(63 << 18, dtype=np.float32)  # 63 MiB of zeros: each under the limit
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        for i in range(6):
            with zf.open(f"pad{i}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, member)
    with pytest.raises(fk.errors.CorruptFileError, match="expand"):
        fk.load(path)


@pytest.mark.parametrize("layout", ["list", "binary"])
def test_parquet_metadata_is_checksummed(tmp_path, layout):
    path = tmp_path / "run.parquet"
    fk.save(RUN, path, layout=layout)
    table, md = pq.read_table(path), pq.read_metadata(path).metadata
    record = json.loads(md[b"forgetkit"])
    record["class_names"] = ["cat", "dog", "fox"]
    pq.write_table(table.replace_schema_metadata(
        {b"forgetkit": json.dumps(record).encode(),
         b"forgetkit.crc32c": md[b"forgetkit.crc32c"]}), path, row_group_size=N)
    refused(path, "metadata")


def test_summary_n_classes_is_checksummed(tmp_path):
    path = fk.summarize(RUN, tmp_path / "s.npy").source
    edit_sidecar(path, lambda r: r.update(n_classes=20_000))
    refused(path, "metadata")


def test_summary_sidecar_bad_label_is_one_line(tmp_path, capsys):
    path = fk.summarize(RUN, tmp_path / "s.npy").source
    edit_sidecar(path, lambda r: r["labels"].__setitem__(0, "x"))
    refused(path, "labels")
    assert main(["verify", str(path)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_topk_sidecar_key_flip_is_one_line(tmp_path, capsys, suffix):
    path = tmp_path / f"t{suffix}"
    fk.save(topk_run(RUN), path)
    if suffix == ".npy":
        edit_sidecar(path, lambda r: r.update(vocab_sizd=r.pop("vocab_size")))
    else:
        table, md = pq.read_table(path), stored_metadata(path)
        record = json.loads(md[b"forgetkit"])
        record["vocab_sizd"] = record.pop("vocab_size")
        md[b"forgetkit"] = json.dumps(record).encode()
        pq.write_table(table.replace_schema_metadata(md), path, row_group_size=N)
    refused(path, "vocab_sizd")
    assert main(["verify", str(path)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_topk_meta_is_checksummed(tmp_path):
    path = tmp_path / "t.npy"
    fk.save(topk_run(RUN).replace(meta={"model": "a"}), path)
    edit_sidecar(path, lambda r: r.update(meta={"model": "b"}))
    refused(path, "metadata")


def test_runs_written_before_metadata_checksums_still_load(tmp_path, capsys):
    path = tmp_path / "run.npy"
    fk.save(RUN, path)

    def downgrade(record):  # as version 2 wrote it: no checksum of the metadata
        record["version"] = 2
        record["crc32c"].pop("record")
    edit_sidecar(path, downgrade)
    run = fk.load(path)
    assert run.sample_ids.tolist() == RUN.sample_ids.tolist()
    assert fk.verify(path)["verifiable"]
    assert main(["verify", str(path)]) == 0
    assert "metadata cannot be verified" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["summary", "topk"])
def test_a_record_run_header_epoch_count_cannot_hide_epochs(tmp_path, fmt):
    path = tmp_path / "r.npy"
    if fmt == "summary":
        fk.summarize(RUN, path)
    else:
        fk.save(topk_run(RUN), path)
    expected = np.asarray(fk.load(path).outputs.records).copy()
    data = path.read_bytes()
    at = data.index(b"'shape': (3,")
    path.write_bytes(data[:at] + b"'shape': (1," + data[at + len(b"'shape': (3,"):])
    run = fk.load(path)
    assert run.epochs.tolist() == [1, 3, 7]
    np.testing.assert_array_equal(np.asarray(run.outputs.records), expected)
    assert fk.verify(path)["epochs"] == 3


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_shard_metadata_is_checksummed(tmp_path, suffix):
    import_real_part("dask", "dask (pip install forgetkit[dask])")
    for i, part in enumerate((slice(0, 6), slice(6, N))):
        shard = fk.Run(np.asarray(RUN.outputs)[:, part], RUN.labels[part], epochs=RUN.epochs,
                       sample_ids=RUN.sample_ids[part], class_names=RUN.class_names)
        fk.save(shard, tmp_path / f"shard-{i}{suffix}")
    fk.load(str(tmp_path / f"shard-*{suffix}"))
    path = tmp_path / f"shard-1{suffix}"
    if suffix == ".npy":
        edit_sidecar(path, lambda r: r.update(class_names=["cat", "dog", "fox"]))
    else:
        table, md = pq.read_table(path), stored_metadata(path)
        record = json.loads(md[b"forgetkit"])
        record["class_names"] = ["cat", "dog", "fox"]
        md[b"forgetkit"] = json.dumps(record).encode()
        pq.write_table(table.replace_schema_metadata(md), path, row_group_size=6)
    with pytest.raises(fk.errors.CorruptFileError, match="shard-1.*metadata"):
        fk.load(str(tmp_path / f"shard-*{suffix}"))


@pytest.mark.parametrize("old, new", [("crc32c", "crc32a"), ("labels", "labelr")])
def test_a_renamed_checksum_or_labels_key_is_refused_by_load_and_verify(tmp_path, capsys,
                                                                        old, new):
    path = tmp_path / "run.npy"
    fk.save(RUN, path)
    edit_sidecar(path, lambda r: r.update({new: r.pop(old)}))
    refused(path, new)
    assert main(["verify", str(path)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
