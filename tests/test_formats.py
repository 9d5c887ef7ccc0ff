"""A file format is one class and one registration: a toy format defined here, a folder of
.npy files (no pickles), loads, saves, verifies and converts through forgetkit's public
functions and command line without any change to the package (`forgetkit.io.registry`)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.errors import CorruptFileError, ForgetkitError, MissingFileError
from forgetkit.io.registry import Shard

from .conftest import import_real_part, make_run


class ToyFormat(fk.io.Format):
    """``<name>.toyrun/``: ``epoch-<e>.npy`` per epoch, ``labels.npy`` and ``toy.json``
    (kind, epoch numbers, metadata and each epoch's CRC-32)."""

    name = "toyrun"
    suffixes = (".toyrun",)
    kinds = ("logits", "probs")
    description = "a .toyrun folder"

    def can_open(self, path):
        return self.has_suffix(path)

    def _index(self, path):
        try:
            return json.loads((Path(path) / "toy.json").read_text())
        except FileNotFoundError:
            raise MissingFileError(f"no such run: {str(path)!r}") from None

    def load(self, path, *, labels=None, kind=None, verify=True):
        index = self._index(path)
        outputs = np.stack([np.load(Path(path) / f"epoch-{e}.npy", allow_pickle=False)
                            for e in index["epochs"]])
        if verify and self._bad(outputs, index):
            raise CorruptFileError(f"{str(path)!r}: epochs {self._bad(outputs, index)} do not "
                                   "match their checksums")
        stored = np.load(Path(path) / "labels.npy", allow_pickle=False)
        return fk.Run(outputs, stored if labels is None else labels,
                      kind=kind or index["kind"], epochs=index["epochs"], meta=index["meta"],
                      source=path)

    def save(self, run, path, **options):
        tmp = Path(f"{path}.tmp")
        tmp.mkdir()
        crcs = []
        for e in range(run.n_epochs):
            values = np.ascontiguousarray(run.epoch_values(e))
            np.save(tmp / f"epoch-{int(run.epochs[e])}.npy", values)
            crcs.append(zlib.crc32(values.tobytes()))
        np.save(tmp / "labels.npy", run.labels)
        (tmp / "toy.json").write_text(json.dumps({
            "kind": run.kind, "epochs": run.epochs.tolist(), "meta": run.meta, "crc": crcs}))
        os.replace(tmp, path)
        return path

    def verify(self, path):
        index = self._index(path)
        outputs = [np.load(Path(path) / f"epoch-{e}.npy") for e in index["epochs"]]
        return {"verifiable": True, "epochs": len(outputs), "bad": self._bad(outputs, index)}

    shards = True

    def open_shard(self, fs, path, name, *, verify=True):
        index = json.loads(fs.cat_file(f"{path}/toy.json"))
        with fs.open(f"{path}/labels.npy", "rb") as f:
            labels = np.load(f, allow_pickle=False)
        with fs.open(f"{path}/epoch-{index['epochs'][0]}.npy", "rb") as f:
            first = np.load(f, allow_pickle=False)
        record = {"kind": index["kind"], "epochs": index["epochs"], "labels": labels.tolist(),
                  "meta": index["meta"]}
        return Shard(kind=index["kind"], shape=(len(index["epochs"]), *first.shape),
                     dtype=first.dtype, record=record,
                     read_block=functools.partial(read_toy_block, fs, path, index["epochs"]))

    @staticmethod
    def _bad(outputs, index):
        return [e for e, values, crc in zip(index["epochs"], outputs, index["crc"], strict=True)
                if zlib.crc32(np.ascontiguousarray(values).tobytes()) != crc]


def read_toy_block(fs, path, epochs, start, stop):
    """Samples start..stop of every epoch of a .toyrun shard (on a worker)."""
    blocks = []
    for e in epochs:
        with fs.open(f"{path}/epoch-{e}.npy", "rb") as f:
            blocks.append(np.load(f, allow_pickle=False)[start:stop])
    return np.stack(blocks)


@pytest.fixture
def toy():
    fmt = fk.io.register_format(ToyFormat())
    yield fmt
    fk.io.unregister_format("toyrun")


def test_a_registered_format_loads_saves_verifies_and_converts(tmp_path, toy):
    run = make_run(n_epochs=4, n_samples=40, n_classes=3)
    run = fk.Run(run.outputs, run.labels, epochs=[1, 3, 5, 7], meta={"model": "toy"})
    path = tmp_path / "r.toyrun"
    assert fk.save(run, path) == path
    back = fk.load(path)
    np.testing.assert_array_equal(np.asarray(back.outputs), np.asarray(run.outputs))
    np.testing.assert_array_equal(back.labels, run.labels)
    assert back.epochs.tolist() == [1, 3, 5, 7] and back.meta == {"model": "toy"}
    assert fk.verify(path) == {"path": str(path), "verifiable": True, "metadata": True,
                               "epochs": 4, "bad": []}
    assert main(["verify", "--quiet", str(path)]) == 0
    # converted to every built-in format that stores full runs, and back
    for suffix in (".npy", ".npz", ".parquet"):
        fk.convert(path, tmp_path / f"c{suffix}")
        fk.convert(tmp_path / f"c{suffix}", tmp_path / f"c{suffix[1:]}.toyrun")
        again = fk.load(tmp_path / f"c{suffix[1:]}.toyrun")
        np.testing.assert_array_equal(np.asarray(again.outputs), np.asarray(run.outputs))
        assert again.epochs.tolist() == [1, 3, 5, 7]
    assert fk.forget_fraction(back).tolist() == fk.forget_fraction(run).tolist()


def test_a_registered_format_is_read_as_shards(tmp_path, toy):
    """The shard readers ask the same registry: .toyrun folders load as one dask run."""
    import_real_part("dask", "dask (pip install forgetkit[dask])")
    run = make_run(n_epochs=3, n_samples=30, n_classes=4)
    for i, (a, b) in enumerate([(0, 20), (20, 30)]):
        fk.save(run.isel(samples=np.arange(a, b)), tmp_path / f"s-{i}.toyrun")
    sharded = fk.load(str(tmp_path / "s-*.toyrun"), chunks=7)
    np.testing.assert_array_equal(np.asarray(sharded.outputs), np.asarray(run.outputs))
    np.testing.assert_array_equal(sharded.labels, run.labels)
    assert fk.forget_fraction(sharded).tolist() == fk.forget_fraction(run).tolist()
    from forgetkit.distributed import load_shards

    (tmp_path / "labels.csv").write_text("0\n")
    with pytest.raises(ForgetkitError, match=r"must be a \.npy or \.parquet or \.toyrun file"):
        load_shards([str(tmp_path / "labels.csv")])


def test_a_registered_format_reports_bad_epochs(tmp_path, toy, capsys):
    run = make_run(n_epochs=3, n_samples=20, n_classes=4)
    path = fk.save(run, tmp_path / "r.toyrun")
    values = np.load(path / "epoch-1.npy")
    values[0, 0] += 1
    np.save(path / "epoch-1.npy", values)
    assert fk.verify(path)["bad"] == [1]
    assert main(["verify", str(path)]) == 1
    assert "epoch 1 does not match its checksum" in capsys.readouterr().err
    with pytest.raises(CorruptFileError, match=r"epochs \[1\]"):
        fk.load(path)


def test_the_registry_asks_a_new_format_first_and_names_it(tmp_path, toy):
    names = [f.name for f in fk.io.registered_formats()]
    assert fk.io.registered_formats()[0] is toy
    assert names == ["toyrun", "cartography", "parquet", "npy", "npz"]
    with pytest.raises(ForgetkitError, match=r"cannot tell the format .*\.toyrun folder"):
        fk.load(tmp_path / "run.csv")
    with pytest.raises(ForgetkitError, match="a summary run is saved as .npy or .parquet"):
        fk.save(fk.summarize(make_run()), tmp_path / "s.toyrun")
    with pytest.raises(ForgetkitError, match="a topk run is saved as .npy or .parquet"):
        fk.save(fk.to_topk(make_run(), top_k=2), tmp_path / "t.npz")
    with pytest.raises(ForgetkitError, match="'toyrun' is registered already"):
        fk.io.register_format(ToyFormat())
    assert fk.io.register_format(ToyFormat(), replace=True) in fk.io.registered_formats()
    assert [f.name for f in fk.io.registered_formats()].count("toyrun") == 1
    with pytest.raises(fk.errors.InputTypeError, match="Format instance; got str"):
        fk.io.register_format("toyrun")


def test_an_unregistered_format_is_gone(tmp_path):
    fk.io.register_format(ToyFormat())
    path = fk.save(make_run(n_epochs=2, n_samples=10), tmp_path / "r.toyrun")
    assert fk.io.unregister_format("toyrun").name == "toyrun"
    with pytest.raises(ForgetkitError, match="cannot tell the format"):
        fk.load(path)
    with pytest.raises(ForgetkitError, match="no format named 'toyrun'"):
        fk.io.unregister_format("toyrun")
    shutil.rmtree(path)


@pytest.mark.parametrize("name", ["run.npy", "run.npz", "run.parquet", "folder", "x.csv"])
def test_sniffing_is_cheap_and_never_raises(tmp_path, name):
    """can_open looks at the path only (a missing or junk file is the loader's to report)."""
    path = tmp_path / name
    if name != "folder":
        path.write_bytes(b"junk")
    else:
        path.mkdir()
    claims = [f.name for f in fk.io.registered_formats() if f.can_open(path)]
    assert claims == ([] if "." not in name or name.endswith(".csv")
                      else [name.rsplit(".", 1)[1]])


def test_the_cartography_format_is_read_only(tmp_path):
    folder = tmp_path / "dyn"
    folder.mkdir()
    rows = [{"guid": i, "logits_epoch_0": [0.1, 0.9], "gold": 1} for i in range(3)]
    (folder / "dynamics_epoch_0.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert fk.load(folder).shape == (1, 3, 2)
    assert fk.verify(folder)["verifiable"] is False
    with pytest.raises(ForgetkitError, match="saving to a Dataset Cartography folder .* is "
                                             "not supported"):
        fk.save(make_run(), folder)
