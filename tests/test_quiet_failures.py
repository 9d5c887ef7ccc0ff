"""Quiet failures (issue 38, item 7, io's part): a Parquet page-checksum error names the
epoch (row group), not the page ordinal; `forgetkit analyze` on a top-k run verifies every
checksum of the records it reads."""

import numpy as np
import pyarrow.parquet as pq
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.kinds import kind_of
from forgetkit.kinds.topk import TopKOutputs, topk_records

from .conftest import import_real_part

E, N, C = 3, 50, 4


def runs():
    rng = np.random.default_rng(0)
    run = fk.Run(rng.normal(size=(E, N, C)).astype(np.float32), rng.integers(0, C, N),
                 epochs=[1, 3, 7])
    records = np.stack([topk_records(run.epoch_values(e), run.labels, 2) for e in range(E)])
    topk = fk.Run(TopKOutputs(records, C, np.arange(N) // 5, np.arange(N) % 5), run.labels,
                  kind="topk", epochs=run.epochs)
    return run, topk


def flip_in_last_row_group(path, column):
    """Flip one bit in the middle of ``column``'s pages in the last row group (epoch 7)."""
    md = pq.ParquetFile(path).metadata
    col = md.row_group(md.num_row_groups - 1).column(column)
    at = col.data_page_offset + col.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def read_all(run):
    kind = kind_of(run)
    if kind.stores_values:
        np.asarray(run.outputs)
    else:
        kind.read_records(run)


def corrupted_parquet(tmp_path, fmt, column):
    """A Parquet run of ``fmt`` ("full", "summary", "topk") with one bit flipped in
    ``column``'s pages of its last epoch (7)."""
    run, topk = runs()
    path = tmp_path / f"{fmt}.parquet"
    if fmt == "summary":
        fk.summarize(run, path)
    else:
        fk.save(topk if fmt == "topk" else run, path)
    flip_in_last_row_group(path, column)
    return path


@pytest.mark.parametrize("fmt, column", [("full", 2), ("summary", 3), ("topk", 7)])
def test_a_page_checksum_error_names_the_epoch(tmp_path, fmt, column):
    path = corrupted_parquet(tmp_path, fmt, column)
    with pytest.raises(fk.errors.CorruptFileError) as err:
        read_all(fk.load(path))
    assert "epoch 7 (index 2)" in str(err.value) and "page_ordinal" not in str(err.value)
    assert "does not match its checksum" in str(err.value)


def test_a_parquet_shard_page_checksum_error_names_the_epoch(tmp_path):
    import_real_part("dask", "dask (pip install forgetkit[dask])")
    run, _ = runs()
    path = tmp_path / "shard-0.parquet"
    fk.save(run, path)
    flip_in_last_row_group(path, 2)
    with pytest.raises(fk.errors.CorruptFileError, match=r"epoch 7 \(index 2\)"):
        fk.load([str(path)]).predictions().compute()


@pytest.mark.parametrize("fmt, column", [("full", 2), ("summary", 3), ("topk", 7)])
def test_verify_lists_the_epoch_whose_pages_fail(tmp_path, fmt, column, capsys):
    path = corrupted_parquet(tmp_path, fmt, column)
    assert fk.verify(path)["bad"] == [7]
    assert main(["verify", str(path)]) == 1
    assert capsys.readouterr().err.strip() == f"{path}: bad: epoch 7 does not match its checksum"
