"""Identity is unique (issue 38, item 4, io's part): duplicate sample ids are refused
wherever ids enter (Run, the writers, summaries, top-k runs) and when a stored run holding
them is loaded; `fk.save` never writes what `fk.load` refuses."""

import json

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.io.record import sidecar_path
from forgetkit.io.topk import tokens_path
from forgetkit.io.topk_record import table_crc
from forgetkit.kinds.topk import TopKOutputs, topk_records

E, N, C = 3, 8, 4
IDS = [f"s{i % 6}" for i in range(N)]  # "s0" at samples 0 and 6


def logits():
    return np.random.default_rng(2).normal(size=(E, N, C)).astype(np.float32)


LABELS = np.arange(N) % C


def test_run_refuses_duplicate_ids():
    with pytest.raises(fk.ForgetkitError, match=r"sample id 's0' appears twice \(samples 0 "
                                                r"and 6\)"):
        fk.Run(logits(), LABELS, sample_ids=IDS)


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_writers_refuse_duplicate_ids(tmp_path, suffix):
    with pytest.raises(fk.ForgetkitError, match="'s0' appears twice"):
        fk.RunWriter(tmp_path / f"r{suffix}", N, C, labels=LABELS, sample_ids=IDS)
    with pytest.raises(fk.ForgetkitError, match="'s0' appears twice"):
        fk.SummaryWriter(tmp_path / f"s{suffix}", N, C, labels=LABELS, sample_ids=IDS)
    assert not list(tmp_path.iterdir())


def test_topk_writer_refuses_a_repeated_token(tmp_path):
    sequences, positions = np.arange(N) // 4, np.arange(N) % 4
    positions[5] = 0  # token (1, 0) twice
    with pytest.raises(fk.ForgetkitError, match=r"token \(sequence 1, position 0\) appears "
                                                r"twice"):
        fk.TopKWriter(tmp_path / "t.npy", vocab_size=C, top_k=2, targets=LABELS,
                      sequence_ids=sequences, positions=positions)
    assert not (tmp_path / "t.npy").exists()


def old_sidecar(path, change):
    """Change the sidecar of ``path`` as a run written before checksums (version 1)."""
    sidecar = sidecar_path(path)
    record = json.loads(sidecar.read_text())
    record.pop("crc32c")
    record["version"] = 1
    change(record)
    sidecar.write_text(json.dumps(record))
    return record


def test_a_summary_with_duplicate_ids_does_not_load(tmp_path):
    path = tmp_path / "s.npy"
    fk.summarize(fk.Run(logits(), LABELS), path)
    old_sidecar(path, lambda r: r.update(sample_ids=IDS))
    with pytest.raises(fk.errors.CorruptFileError, match="'s0' appears twice"):
        fk.load(path)


def test_a_topk_run_with_a_repeated_token_or_id_does_not_load(tmp_path):
    run = fk.Run(logits(), LABELS)
    records = np.stack([topk_records(run.epoch_values(e), LABELS, 2) for e in range(E)])
    path = tmp_path / "t.npy"
    fk.save(fk.Run(TopKOutputs(records, C, np.arange(N) // 4, np.arange(N) % 4), LABELS,
                   kind="topk"), path)
    table = np.load(tokens_path(path))
    table["position"][5] = 0
    np.save(tokens_path(path), table)
    record = old_sidecar(path, lambda r: None)
    record["tokens"]["crc32c"] = table_crc(table, record["vocab_size"], record["k"])
    sidecar_path(path).write_text(json.dumps(record))
    with pytest.raises(fk.errors.CorruptFileError, match=r"token \(sequence 1, position 0\) "
                                                         "appears twice"):
        fk.load(path)



def test_save_refuses_a_topk_run_that_load_would_refuse(tmp_path):
    run = fk.Run(logits(), LABELS)
    records = np.stack([topk_records(run.epoch_values(e), LABELS, 2) for e in range(E)])
    positions = np.arange(N) % 4
    positions[5] = 0
    topk = fk.Run(TopKOutputs(records, C, np.arange(N) // 4, positions), LABELS, kind="topk")
    for suffix in (".npy", ".parquet"):
        with pytest.raises(fk.ForgetkitError, match=r"token \(sequence 1, position 0\)"):
            fk.save(topk, tmp_path / f"t{suffix}")
    assert not list(tmp_path.iterdir())
