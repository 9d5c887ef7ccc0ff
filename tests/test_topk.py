"""Top-k runs of language models: per (checkpoint, token) the target's logit, the
log-sum-exp over the vocabulary and the k largest logits with their ids. Every derived
quantity equals the full-vocabulary run built from the same logits."""

import json

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.errors import CorruptFileError, ForgetkitError, RunExistsError, RunLockedError
from forgetkit.io.topk import tokens_path
from forgetkit.kinds import kind_of
from forgetkit.kinds import topk as _topk
from forgetkit.kinds.topk import (
    TOKEN_DTYPE,
    ids_of,
    set_token_ids,
    token_ids,
    topk_dtype,
    topk_records,
)

from .conftest import make_run
from .crashes import Killed, kill_at_rename, saving_in_turn

V, K = 40, 4


def token_run(n_epochs=6, n_tokens=300, vocab=V, seed=0, dtype=np.float32, ties=True):
    """A full-vocabulary run of ``n_tokens`` tokens in sequences of 10 (ties: logits rounded
    so that equal values occur)."""
    run = make_run(n_epochs=n_epochs, n_samples=n_tokens, n_classes=vocab, seed=seed,
                   dtype=dtype, ties=ties)
    return run


def tokens(n):
    return np.arange(n) // 10 + 100, np.arange(n) % 10 + 1


def topk_of(run, k=K, path=None, **options):
    """The top-k run of a full run (written with TopKWriter when ``path`` is given)."""
    seq, pos = tokens(run.n_samples)
    if path is None:
        recs = np.stack([topk_records(run.epoch_values(e), run.labels, k)
                         for e in range(run.n_epochs)])
        return fk.Run(_topk.TopKOutputs(recs, run.n_classes, seq, pos), run.labels,
                      kind="topk", epochs=run.epochs)
    with fk.TopKWriter(path, vocab_size=run.n_classes, top_k=k, targets=run.labels,
                       sequence_ids=seq, positions=pos, **options) as w:
        for e in range(run.n_epochs):
            w.append(run.epochs[e], topk_records(run.epoch_values(e), run.labels, k))
    return fk.load(path)


# --------------------------------------------------------------------- the records
def test_dtype_is_56_bytes_at_k8_and_64_with_24_bit_ids_past_65536():
    assert topk_dtype(8, 50_257).itemsize == 56
    assert topk_dtype(8, 65_536)["ids"].base == np.dtype("<u2")
    for vocab in (65_537, 70_000, 256_000, 1 << 24):  # language models' 32k-256k
        assert topk_dtype(8, vocab).itemsize == 64
        assert topk_dtype(8, vocab)["ids"].shape == (8, 3)
        assert _topk.is_topk_dtype(topk_dtype(8, vocab))
    assert topk_dtype(8, (1 << 24) + 1)["ids"].base == np.dtype("<u4")
    assert topk_dtype(16, 50_000).itemsize == 8 + 6 * 16
    assert topk_dtype(8, 70_000, ids="uint32").itemsize == 72  # runs written before
    with pytest.raises(fk.ForgetkitError, match="holding vocab_size=70000 ids"):
        topk_dtype(8, 70_000, ids="uint16")
    with pytest.raises(fk.ForgetkitError, match=r"k must lie in \[1, vocab_size=5\]"):
        topk_dtype(6, 5)


def test_topk_records_match_a_plain_sort():
    run = token_run(n_epochs=1)
    z, y = run.epoch_values(0).astype(np.float64), run.labels
    rec = topk_records(z, y, K)
    rows = np.arange(len(y))
    # descending logits, equal logits by ascending id: lexsort on (id, -logit)
    order = np.array([np.lexsort((np.arange(V), -row))[:K] for row in z])
    assert np.array_equal(token_ids(rec), order)
    assert np.array_equal(rec["logits"], z[rows[:, None], order].astype(np.float32))
    assert np.array_equal(rec["target"], z[rows, y].astype(np.float32))
    lse = np.log(np.exp(z).sum(axis=1))
    np.testing.assert_allclose(rec["lse"], lse, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_every_derived_quantity_equals_the_full_run(dtype):
    full = token_run(dtype=dtype)
    top = topk_of(full)
    assert top.kind == "topk" and top.shape == full.shape and top.top_k == K
    assert not kind_of(top).full and kind_of(full).full
    with pytest.warns(FutureWarning, match="holds_every_class is deprecated"):
        assert not top.holds_every_class and full.holds_every_class
    assert np.array_equal(top.predictions(), full.predictions())
    assert np.array_equal(top.correctness(), full.correctness())
    assert np.array_equal(fk.forget_fraction(top), fk.forget_fraction(full))
    assert np.array_equal(fk.learn_fraction(top), fk.learn_fraction(full))
    assert fk.sample_dynamics(top).equals(fk.sample_dynamics(full))
    assert np.array_equal(top.label_margins(), full.label_margins())  # AUM margins
    np.testing.assert_allclose(top.label_probs(), full.label_probs(), rtol=2e-6, atol=1e-12)
    a, b = fk.data_map(top), fk.data_map(full)
    assert a["correctness"].equals(b["correctness"]) and a["aum"].equals(b["aum"])
    np.testing.assert_allclose(a["confidence"], b["confidence"], rtol=2e-6, atol=1e-12)
    # stored probabilities and the unstored bound against the full softmax
    probs = full.probs()  # (E, N, V)
    recs = np.asarray(top.outputs.records)
    ids = token_ids(recs).astype(np.int64)
    stored = np.take_along_axis(probs, ids, axis=2)
    np.testing.assert_allclose(top.outputs.stored_probs(), stored, rtol=2e-6, atol=1e-12)
    u = top.outputs.unstored_bound()
    unstored = probs.copy()
    np.put_along_axis(unstored, ids, -1.0, axis=2)
    assert (unstored.max(axis=2) <= u * (1 + 1e-5) + 1e-12).all()
    assert (u <= top.outputs.stored_probs()[..., -1]).all()


def test_scores_and_label_issues_from_a_topk_run():
    full = token_run(n_epochs=12)
    top = topk_of(full)
    scores, ref = fk.data_scores(top), fk.data_scores(full)
    assert "el2n" not in scores and "top-k run" in scores.attrs["left_out"]["el2n"]
    for col in ("forgetting", "aum"):
        assert scores[col].equals(ref[col])
    np.testing.assert_allclose(scores["variability"], ref["variability"], rtol=1e-5,
                               atol=1e-12)
    # label issues of a classifier's top-k run (every sample its own sequence, position 0):
    # what the summary of the same logits gives (exact from the records)
    n = full.n_samples
    classifier = fk.Run(_topk.TopKOutputs(top.outputs.records, V, np.arange(n),
                                          np.zeros(n, np.int32)), full.labels, kind="topk",
                        epochs=full.epochs)
    assert fk.label_issues(classifier).equals(fk.label_issues(fk.summarize(full)))
    # a language model's tokens (targets inside sequences): next-token targets, refused
    with pytest.raises(ForgetkitError, match="next-token targets") as refused:
        fk.label_issues(top)
    assert "\n" not in str(refused.value)
    assert np.array_equal(fk.summarize(top).outputs.records,
                          fk.summarize(full).outputs.records)


def test_k_equal_to_the_vocabulary_has_no_unstored_mass():
    full = token_run(n_epochs=2, vocab=6)
    top = topk_of(full, k=6)
    assert (top.outputs.unstored_bound() == 0).all()
    np.testing.assert_allclose(top.outputs.stored_probs().sum(axis=2), 1.0, rtol=1e-6)


def test_k1_gives_correctness_and_refuses_margins():
    full = token_run(n_epochs=3)
    top = topk_of(full, k=1)
    assert np.array_equal(top.correctness(), full.correctness())
    with pytest.raises(fk.ForgetkitError, match="k = 1"):
        top.label_margins()


def test_methods_needing_every_class_say_what_a_topk_run_holds():
    top = topk_of(token_run(n_epochs=2))
    for call in (lambda: top.probs(), lambda: top.epoch_values(0),
                 lambda: top.mean_probs([0]), lambda: np.asarray(top.outputs)):
        with pytest.raises(fk.ForgetkitError, match="top-k run .* k largest logits"):
            call()


def test_token_table_follows_selections():
    top = topk_of(token_run(n_epochs=3))
    seq, pos = tokens(top.n_samples)
    assert np.array_equal(top.sequence_ids, seq) and np.array_equal(top.positions, pos)
    sub = top.isel(samples=[5, 17, 299], epochs=[0, 2])
    assert sub.sequence_ids.tolist() == seq[[5, 17, 299]].tolist()
    assert sub.positions.tolist() == pos[[5, 17, 299]].tolist()
    assert sub.top_k == K and np.array_equal(sub.correctness(), top.correctness()[[0, 2]][
        :, [5, 17, 299]])
    assert fk.Run(np.zeros((1, 2, 3)), [0, 1]).sequence_ids is None


# ----------------------------------------------------------------------- storage
def test_writer_and_load_round_trip(tmp_path):
    full = token_run()
    full = full.replace(epochs=np.arange(6) * 100)
    path = tmp_path / "t.npy"
    top = topk_of(full, path=path, meta={"model": "gpt"})
    assert isinstance(top.outputs.records, np.memmap)
    assert path.stat().st_size == 256 + 6 * 300 * topk_dtype(K, V).itemsize
    assert top.epochs.tolist() == list(range(0, 600, 100)) and top.meta == {"model": "gpt"}
    assert np.array_equal(top.labels, full.labels) and top.n_classes == V
    assert np.array_equal(top.correctness(), full.correctness())
    table = np.load(tokens_path(path))
    assert table.dtype == TOKEN_DTYPE and np.array_equal(table["target"], full.labels)
    record = json.loads((tmp_path / "t.forgetkit.json").read_text())
    assert record["kind"] == "topk" and record["k"] == K and record["vocab_size"] == V
    assert fk.verify(path)["bad"] == [] and fk.verify(path)["verifiable"]


def test_writer_takes_logits_and_resumes(tmp_path):
    full = token_run(n_epochs=4)
    path = tmp_path / "t.npy"
    seq, pos = tokens(full.n_samples)
    args = dict(vocab_size=V, top_k=K, targets=full.labels, sequence_ids=seq, positions=pos)
    with fk.TopKWriter(path, **args) as w:
        w.append(0, full.epoch_values(0))  # logits: the records are taken here
        w.append(1, full.epoch_values(1))
    with fk.TopKWriter(path, **args) as w:  # a resumed training
        assert w.epochs == [0, 1]
        w.append(2, full.epoch_values(2))
        w.append(1, full.epoch_values(3), replace=True)  # drops 1 and 2
    back = fk.load(path)
    assert back.epochs.tolist() == [0, 1]
    ref = full.isel(epochs=[0, 3])
    assert np.array_equal(back.correctness(), ref.correctness())


def test_save_and_convert_keep_the_token_table(tmp_path):
    top = topk_of(token_run(n_epochs=3), path=tmp_path / "a.npy")
    fk.convert(tmp_path / "a.npy", tmp_path / "b.npy")
    back = fk.load(tmp_path / "b.npy")
    assert np.array_equal(np.asarray(back.outputs.records), np.asarray(top.outputs.records))
    assert np.array_equal(back.sequence_ids, top.sequence_ids)
    assert np.array_equal(back.positions, top.positions)
    sub = top.isel(samples=np.arange(0, 300, 7))
    fk.save(sub, tmp_path / "sub.npy")
    again = fk.load(tmp_path / "sub.npy")
    assert np.array_equal(again.positions, sub.positions)
    assert np.array_equal(again.correctness(), sub.correctness())


# --------------------------------------------------------------------- integrity
def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("read", ["forget_fraction", "label_probs", "isel", "verify"])
@pytest.mark.parametrize("field", ["argmax id", "other id"])
def test_a_flipped_byte_is_refused_naming_the_epoch(tmp_path, read, field):
    path = tmp_path / "t.npy"
    full = token_run(n_epochs=4)
    topk_of(full, path=path)
    itemsize = topk_dtype(K, V).itemsize
    # epoch index 2, token 3: the high byte of ids[0] (what the forgetting pass reads) or
    # of ids[1] (which it does not read)
    at = 8 + 4 * K + (0 if field == "argmax id" else 2) + 1
    flip(path, 256 + 2 * 300 * itemsize + 3 * itemsize + at)
    if read == "verify":
        assert fk.verify(path)["bad"] == [2]
        return
    run = fk.load(path)  # checked on the first read of each epoch
    if read == "forget_fraction" and field == "other id":  # the bytes it reads hold
        assert np.array_equal(fk.forget_fraction(run), fk.forget_fraction(full))
        read = "label_probs"  # any full read refuses the epoch
    calls = {"forget_fraction": lambda: fk.forget_fraction(run),
             "label_probs": lambda: run.label_probs(),
             "isel": lambda: run.isel(samples=[0, 1])}
    with pytest.raises(CorruptFileError, match=r"epoch 2 \(index 2\) does not match"):
        calls[read]()
    with pytest.raises(CorruptFileError, match="token id 4.* lies outside the vocabulary"):
        fk.load(path, verify=False)  # unverified: the values are checked instead


def test_verified_once_per_process(tmp_path):
    path = tmp_path / "t.npy"
    topk_of(token_run(n_epochs=3), path=path)
    run = fk.load(path)
    assert run.outputs.checks is not None
    run.predictions()  # verifies the argmax ids only
    assert run.outputs.checks is not None and fk.load(path).outputs.checks is not None
    run.label_probs()
    assert run.outputs.checks is None  # every epoch verified
    assert fk.load(path).outputs.checks is None  # the unchanged file is not read again


@pytest.mark.parametrize("vocab", [V, 70_000])
def test_parquet_round_trip_and_conversions(tmp_path, vocab):
    full = token_run(n_epochs=3, n_tokens=120, vocab=V)
    top = topk_of(full, path=tmp_path / "a.npy")
    if vocab != V:  # the same records over a larger vocabulary: 24-bit ids
        wide = _topk.convert_records(np.asarray(top.outputs.records), topk_dtype(K, vocab))
        top = fk.Run(_topk.TopKOutputs(wide, vocab, top.sequence_ids, top.positions),
                     top.labels, kind="topk", epochs=top.epochs)
        fk.save(top, tmp_path / "a.npy")
    fk.save(top, tmp_path / "t.parquet")
    back = fk.load(tmp_path / "t.parquet")
    assert back.kind == "topk" and back.n_classes == vocab and back.top_k == K
    assert np.array_equal(back.outputs.records, np.asarray(top.outputs.records))
    assert np.array_equal(back.sequence_ids, top.sequence_ids)
    assert np.array_equal(back.positions, top.positions)
    assert np.array_equal(back.correctness(), full.correctness())
    assert fk.verify(tmp_path / "t.parquet") == {"path": str(tmp_path / "t.parquet"),
                                                 "verifiable": True, "metadata": True,
                                                 "epochs": 3, "bad": []}
    fk.convert(tmp_path / "t.parquet", tmp_path / "b.npy")  # and back: the same checksums
    a = json.loads((tmp_path / "a.forgetkit.json").read_text())["crc32c"]
    b = json.loads((tmp_path / "b.forgetkit.json").read_text())["crc32c"]
    assert a == b
    import pyarrow.parquet as pq
    cols = pq.read_table(tmp_path / "t.parquet").column_names
    assert cols == ["epoch", "sample", "sequence", "position", "target_id", "target", "lse",
                    "logits", "ids"]


def test_forgetting_pass_result_in_fresh_mapped_memory(tmp_path, monkeypatch):
    import mmap
    import pickle

    def owner(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a.obj if isinstance(a, memoryview) else a

    full = token_run(n_epochs=4, n_tokens=300)
    topk_of(full, path=tmp_path / "t.npy")
    monkeypatch.setattr(_topk, "FRESH_BYTES", 1024)
    a = _topk.fresh_array((4, 300), np.int32)
    assert isinstance(owner(a), mmap.mmap) and a.flags.writeable and a.shape == (4, 300)
    assert _topk.fresh_array((4, 10), np.int32).base is None  # small: numpy's
    run = fk.load(tmp_path / "t.npy")
    pred = run.predictions()
    assert isinstance(owner(pred), mmap.mmap) and not pred.flags.writeable
    assert np.array_equal(pred, full.predictions())
    assert np.array_equal(pickle.loads(pickle.dumps(pred)), pred)
    assert np.array_equal(fk.forget_fraction(run), fk.forget_fraction(full))
    assert fk.sample_dynamics(run).equals(fk.sample_dynamics(full))


def test_new_metadata_encodes_the_same_record_text(tmp_path):
    """A writer given new metadata with an epoch (a replay's, every epoch) encodes only the
    metadata again: the record's text is the one encoding it all afresh gives."""
    from forgetkit.io import topk as T

    table = np.zeros(5, TOKEN_DTYPE)
    table["target"] = [3, 1, 4, 1, 5]
    fields = dict(n_tokens=5, vocab_size=V, k=K, epochs=[], table=table, ids=ids_of(
        topk_dtype(K, V)))
    encode = T._encoder(T.topk_record(**fields, meta={"x": 1}), table)
    crcs = [(11, 21), (12, 22)]
    for meta in ({"replay": {"checkpoints": [{"epoch": 3}]}}, {}, None):
        again = encode.with_meta(meta)([3, 5], crcs)
        fresh = T._encoder(T.topk_record(**fields, meta=meta), table)([3, 5], crcs)
        assert again.json_text == fresh.json_text
        assert dict(again) == dict(fresh) == json.loads(again.json_text)
        assert again["crc32c"]["argmax"] == [21, 22]
    full = token_run(n_epochs=3)
    with fk.TopKWriter(tmp_path / "m.npy", **writer_args(full)) as w:
        for e in range(3):
            w.append(e, full.epoch_values(e), meta={"step": e})
    run = fk.load(tmp_path / "m.npy")
    assert run.meta == {"step": 2} and run.epochs.tolist() == [0, 1, 2]
    assert fk.verify(tmp_path / "m.npy")["bad"] == []


# ------------------------------------------------- vocabularies above 65,536 ids
WIDE = 70_000


def wide_run(n_epochs=3, n_tokens=24, seed=5):
    """A full run over WIDE ids whose largest logits and targets mostly lie above 65,535
    (the third byte of a 24-bit id), some at id 0."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n_epochs, n_tokens, WIDE)).astype(np.float32)
    z[:, :, 65_530:] += 2.5
    z[:, :, 0] += 6.0 * (rng.random((n_epochs, n_tokens)) < 0.2)
    labels = rng.integers(65_530, WIDE, n_tokens)
    z[:, np.arange(n_tokens), labels] += 5.0 * (rng.random((n_epochs, n_tokens)) < 0.6)
    return fk.Run(z, labels)


def test_vocabulary_above_65536_stores_24_bit_ids_in_64_bytes_at_k8(tmp_path):
    full = wide_run()
    top = topk_of(full, k=8, path=tmp_path / "w.npy")
    assert top.outputs.records.dtype.itemsize == 64 and top.n_classes == WIDE
    assert json.loads((tmp_path / "w.forgetkit.json").read_text())["ids"] == "uint24"
    assert (tmp_path / "w.npy").stat().st_size == 256 + 3 * 24 * 64
    ids = token_ids(top.outputs.records)
    assert ids.max() >= 1 << 16 and ids.min() == 0  # all three bytes in use
    assert np.array_equal(top.outputs.records, topk_of(full, k=8).outputs.records)
    # every derived quantity equals the full run's
    assert np.array_equal(top.predictions(), full.predictions())
    assert np.array_equal(top.correctness(), full.correctness())
    assert 0 < top.correctness().mean() < 1
    assert np.array_equal(fk.forget_fraction(top), fk.forget_fraction(full))
    assert fk.sample_dynamics(top).equals(fk.sample_dynamics(full))
    assert np.array_equal(top.label_margins(), full.label_margins())
    np.testing.assert_allclose(top.label_probs(), full.label_probs(), rtol=2e-6, atol=1e-12)
    stored = np.take_along_axis(full.probs(), ids.astype(np.int64), axis=2)
    np.testing.assert_allclose(top.outputs.stored_probs(), stored, rtol=2e-6, atol=1e-12)
    # Parquet (uint32 id column) and back to NPY: the same records and checksums
    fk.save(top, tmp_path / "w.parquet")
    back = fk.load(tmp_path / "w.parquet")
    assert np.array_equal(back.outputs.records, top.outputs.records)
    assert np.array_equal(back.correctness(), full.correctness())
    import pyarrow.parquet as pq
    column = pq.read_schema(tmp_path / "w.parquet").field("ids").type
    assert column.list_size == 8 and str(column.value_type) == "uint32"
    fk.convert(tmp_path / "w.parquet", tmp_path / "b.npy")
    a, b = (json.loads((tmp_path / f"{n}.forgetkit.json").read_text()) for n in "wb")
    assert a["crc32c"] == b["crc32c"] and b["ids"] == "uint24"


def test_24_bit_ids_decode_alike_from_any_layout():
    rng = np.random.default_rng(0)
    for k in (1, 3, 8):
        recs = np.zeros((3, 50), topk_dtype(k, WIDE))
        ids = rng.integers(0, 1 << 24, (3, 50, k))
        set_token_ids(recs, ids)
        assert np.array_equal(token_ids(recs), ids)
        for j in range(k):  # contiguous (one word per record), a row, a strided view
            assert token_ids(recs, j).dtype == np.int32
            assert np.array_equal(token_ids(recs, j), ids[..., j])
            assert np.array_equal(token_ids(recs[1], j), ids[1, :, j])
            assert np.array_equal(token_ids(recs[:, ::2], j), ids[:, ::2, j])


def test_ids_outside_a_wide_vocabulary_are_refused(tmp_path):
    full = wide_run(n_epochs=1)
    good = topk_records(full.epoch_values(0), full.labels, 8)
    w = fk.TopKWriter(tmp_path / "w.npy", **writer_args(full, top_k=8))
    for bad_id in (WIDE, (1 << 24) - 1):
        recs = good.copy()
        ids = np.array(token_ids(recs))
        ids[2, 7] = bad_id
        set_token_ids(recs, ids)
        with pytest.raises(fk.ForgetkitError,
                           match=rf"token id {bad_id} lies outside the vocabulary \[0, {WIDE}\)"):
            w.append(0, recs)
    for bad_id in (1 << 24, -1):  # not storable in three bytes
        with pytest.raises(fk.ForgetkitError, match=r"must lie in \[0, 16777216\)"):
            set_token_ids(good.copy(), np.full((24, 8), bad_id))
    w.append(0, good)
    w.close()
    assert np.array_equal(fk.load(tmp_path / "w.npy").outputs.records[0], good)


def test_runs_written_with_uint32_ids_still_load_resume_and_convert(tmp_path, monkeypatch):
    from forgetkit.io import topk as io_topk

    full = wide_run()
    seq, pos = tokens(full.n_samples)
    args = dict(vocab_size=WIDE, top_k=8, targets=full.labels, sequence_ids=seq, positions=pos)
    recs = [topk_records(full.epoch_values(e), full.labels, 8) for e in range(3)]
    with monkeypatch.context() as m:  # the writer as it was before 24-bit ids
        m.setattr(_topk, "id_encoding", lambda v: "uint16" if v <= 1 << 16 else "uint32")
        record = io_topk.topk_record

        def old_record(**kw):
            return {k: v for k, v in record(**kw).items() if k != "ids"}

        m.setattr(io_topk, "topk_record", old_record)
        with fk.TopKWriter(tmp_path / "old.npy", **args) as w:
            w.append(0, recs[0])
            w.append(1, recs[1])
        fk.save(fk.load(tmp_path / "old.npy"), tmp_path / "old.parquet")
    assert "ids" not in json.loads((tmp_path / "old.forgetkit.json").read_text())
    old = fk.load(tmp_path / "old.npy")
    assert old.outputs.records.dtype == topk_dtype(8, WIDE, ids="uint32")
    assert (tmp_path / "old.npy").stat().st_size == 256 + 2 * 24 * 72
    assert np.array_equal(old.correctness(), full.correctness()[:2])
    assert fk.verify(tmp_path / "old.npy")["bad"] == []
    parquet = fk.load(tmp_path / "old.parquet")
    assert parquet.outputs.records.dtype == old.outputs.records.dtype
    assert np.array_equal(parquet.outputs.records, old.outputs.records)
    with fk.TopKWriter(tmp_path / "old.npy", **args) as w:  # resumed: keeps uint32 ids
        w.append(2, recs[2])
    old = fk.load(tmp_path / "old.npy")
    assert old.n_epochs == 3 and old.outputs.records.dtype.itemsize == 72
    assert np.array_equal(old.predictions(), full.predictions())
    fk.save(old, tmp_path / "new.npy")  # saved anew: 24-bit ids
    new = fk.load(tmp_path / "new.npy")
    assert new.outputs.records.dtype.itemsize == 64
    assert np.array_equal(new.outputs.records, np.stack(recs))
    assert np.array_equal(token_ids(new.outputs.records), token_ids(old.outputs.records))


# ------------------------------------------------------------------ bad input
def writer_args(run, **changes):
    seq, pos = tokens(run.n_samples)
    args = dict(vocab_size=run.n_classes, top_k=K, targets=run.labels, sequence_ids=seq,
                positions=pos)
    args.update(changes)
    return args


def test_bad_records_are_refused_and_nothing_is_written(tmp_path):
    full = token_run(n_epochs=2, n_tokens=50)
    good = topk_records(full.epoch_values(0), full.labels, K)
    path = tmp_path / "t.npy"
    w = fk.TopKWriter(path, **writer_args(full))
    w.append(0, good)

    def bad(change):
        recs = good.copy()
        change(recs)
        return recs

    def ids_set(index, value):
        def change(r):
            ids = np.array(token_ids(r))
            ids[index] = value(ids) if callable(value) else value
            set_token_ids(r, ids)
        return change

    cases = [
        (ids_set((3, 1), V), rf"token id {V} lies outside the vocab"),
        (lambda r: r["lse"].__setitem__(5, r["logits"][5, 0] - 0.01),
         "log-sum-exp .* lies below its largest logit"),
        (lambda r: r["lse"].__setitem__(5, r["target"][5] - 1.0), "lies below"),
        (lambda r: r["logits"].__setitem__((2, 0), np.nan), "'logits' holds NaN or inf"),
        (lambda r: r["target"].__setitem__(7, np.inf), "'target' holds NaN or inf"),
        (lambda r: r["lse"].__setitem__(1, -np.inf), "'lse' holds NaN or inf"),
        (lambda r: r["logits"].__setitem__((4, 3), r["logits"][4, 0] + 1),
         "not in descending order"),
        (ids_set((6, 1), lambda ids: ids[6, 0]), "stores one id twice"),
        (lambda r: (r["logits"].__setitem__((8, 1), r["logits"][8, 0]),
                    ids_set((8, 1), lambda ids: ids[8, 0] - 1 if ids[8, 0] else 0)(r)),
         "equal logits out of id order|stores one id twice"),
    ]
    for change, message in cases:
        with pytest.raises(fk.ForgetkitError, match=message):
            w.append(1, bad(change))
    with pytest.raises(fk.ForgetkitError, match="hold k=3 .* this run stores k=4"):
        w.append(1, topk_records(full.epoch_values(1), full.labels, 3))
    with pytest.raises(fk.ForgetkitError, match="vocabulary of 41 ids; this run's is 40"):
        w.append(1, np.zeros((50, 41), np.float32))
    logits = full.epoch_values(1).copy()
    logits[3, 7] = np.nan
    with pytest.raises(fk.ForgetkitError, match="logits of epoch 1: logits hold NaN"):
        w.append(1, logits)
    w.close()
    back = fk.load(path)  # nothing was written for the refused epochs
    assert back.epochs.tolist() == [0] and fk.verify(path)["bad"] == []
    assert np.array_equal(back.outputs.records[0], good)


def test_the_writer_refuses_bad_setups(tmp_path):
    full = token_run(n_epochs=1, n_tokens=50)
    with pytest.raises(fk.ForgetkitError, match=r"k must lie in \[1, vocab_size=40\]"):
        fk.TopKWriter(tmp_path / "a.npy", **writer_args(full, top_k=41))
    with pytest.raises(fk.ForgetkitError, match=r"token ids in \[0, vocab_size=30\); got"):
        fk.TopKWriter(tmp_path / "a.npy", **writer_args(full, vocab_size=30))
    with pytest.raises(fk.ForgetkitError, match="positions must be 50 integers"):
        fk.TopKWriter(tmp_path / "a.npy", **writer_args(full, positions=np.arange(49)))
    with pytest.raises(fk.ForgetkitError, match=r"written as \.npy"):
        fk.TopKWriter(tmp_path / "a.parquet", **writer_args(full))
    assert not list(tmp_path.iterdir())  # nothing written, no lock left
    path = tmp_path / "t.npy"
    fk.TopKWriter(path, **writer_args(full)).close()
    # a different vocabulary, k, or tokenization than the stored run
    for change, message in [(dict(vocab_size=50), "vocab_size=40; this writer has "
                                                  "vocab_size=50"),
                            (dict(top_k=2), "k=4; this writer has k=2"),
                            (dict(positions=np.where(np.arange(50) == 9, 99, tokens(50)[1])),
                             "another token table: token 9 has position 10 there and 99 here")]:
        with pytest.raises(fk.ForgetkitError, match=message):
            fk.TopKWriter(path, **writer_args(full, **change))
    fk.TopKWriter(path, **writer_args(full, top_k=2), mode="w").close()  # starts over
    assert json.loads((tmp_path / "t.forgetkit.json").read_text())["k"] == 2
    with pytest.raises(RunExistsError):
        fk.TopKWriter(path, **writer_args(full, top_k=2), mode="x")
    fk.save(full, tmp_path / "full.npy")
    with pytest.raises(fk.ForgetkitError, match="not a forgetkit top-k run"):
        fk.TopKWriter(tmp_path / "full.npy", **writer_args(full))
    with fk.TopKWriter(path, **writer_args(full, top_k=2)):
        with pytest.raises(RunLockedError):
            fk.TopKWriter(path, **writer_args(full, top_k=2))


def test_a_token_table_that_does_not_match_is_refused(tmp_path):
    path = tmp_path / "t.npy"
    topk_of(token_run(n_epochs=2, n_tokens=50), path=path)
    table = np.load(tokens_path(path))
    table["position"][3] += 1
    np.save(tokens_path(path), table)
    with pytest.raises(CorruptFileError, match="token table .* does not match its checksum"):
        fk.load(path)
    tokens_path(path).unlink()
    with pytest.raises(CorruptFileError, match=r"tokens\.npy' is missing"):
        fk.load(path)


# --------------------------------------------------------------- crash safety
def _state(path):
    run = fk.load(path)
    return (np.asarray(run.outputs.records).copy(), run.labels.copy(), run.epochs.copy(),
            run.positions.copy(), run.sequence_ids.copy())


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_kill_at_any_rename_of_save_leaves_the_old_run_or_the_new(tmp_path, monkeypatch):
    old = topk_of(token_run(n_epochs=3, n_tokens=40, seed=1))
    new = topk_of(token_run(n_epochs=2, n_tokens=60, seed=2))
    seen = set()
    for k in range(6):
        path = tmp_path / f"k{k}.npy"
        fk.save(old, path)
        before = _state(path)
        fk.save(new, tmp_path / f"n{k}.npy")
        after = _state(tmp_path / f"n{k}.npy")
        with monkeypatch.context() as m:
            calls = kill_at_rename(m, k)
            try:
                fk.save(new, path)
            except Killed:
                pass
        state = _state(path)
        assert _same(state, before) or _same(state, after), f"kill at rename {k}: a mix"
        seen.add("old" if _same(state, before) else "new")
        fk.save(old, path)  # the next write commits as usual
        assert _same(_state(path), before)
        if calls["n"] <= k:
            break
    assert seen == {"old", "new"}


def test_a_kill_inside_a_replacing_append_leaves_the_old_run_or_the_new(tmp_path,
                                                                       monkeypatch):
    full = token_run(n_epochs=3, n_tokens=40)
    outcomes = set()
    for k in range(4):
        path = tmp_path / f"w{k}.npy"
        with fk.TopKWriter(path, **writer_args(full)) as w:
            for e in range(3):
                w.append(e, full.epoch_values(e))
        before = _state(path)
        w = fk.TopKWriter(path, **writer_args(full))
        with monkeypatch.context() as m:
            calls = kill_at_rename(m, k)
            try:
                w.append(1, full.epoch_values(0), replace=True)
            except Killed:
                pass
        w._lock.release()  # the process "died": its lock goes with it
        state = _state(path)
        if _same(state, before):
            outcomes.add("old")
        else:
            assert state[2].tolist() == [0, 1]
            assert np.array_equal(state[0][1], state[0][0])
            outcomes.add("new")
        assert fk.verify(path)["bad"] == []
        with fk.TopKWriter(path, **writer_args(full)) as w:  # resumes either
            w.append(7, full.epoch_values(2))
        if calls["n"] <= k:
            break
    assert outcomes == {"old", "new"}


KILLED_WRITER = """
import sys, numpy as np, forgetkit as fk
from forgetkit.kinds.topk import topk_records
n, v = 2000, 300
rng = np.random.default_rng(0)
y = rng.integers(0, v, n)
with fk.TopKWriter(sys.argv[1], vocab_size=v, top_k=8, targets=y, sequence_ids=np.arange(n) // 50,
                   positions=np.arange(n) % 50) as w:
    for e in range(10000):
        z = rng.normal(size=(n, v)).astype(np.float32)
        w.append(e, topk_records(z, y, 8))
        if e == 2:
            print("ready", flush=True)
"""


def test_a_killed_writer_keeps_its_completed_epochs(tmp_path):
    from .conftest import kill_when_ready

    path = tmp_path / "killed.npy"
    kill_when_ready(KILLED_WRITER, path, settle=0.3)
    run = fk.load(path)
    assert run.n_epochs >= 3 and run.epochs.tolist() == list(range(run.n_epochs))
    assert fk.verify(path)["bad"] == [] and run.top_k == 8
    with fk.TopKWriter(path, vocab_size=300, top_k=8, targets=run.labels,
                       sequence_ids=run.sequence_ids, positions=run.positions) as w:
        assert w.epochs == run.epochs.tolist()  # resumes after them


# ------------------------------------------------------------------- dask shards
def write_topk_shards(full, folder, bounds, suffix=".npy"):
    folder.mkdir()
    top = topk_of(full)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        fk.save(top.isel(samples=np.arange(a, b)), folder / f"shard-{i:03d}{suffix}")
    return top, str(folder / f"shard-*{suffix}")


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_topk_shards_load_on_dask_like_in_memory(tmp_path, suffix):
    pytest.importorskip("dask")
    full = token_run(n_epochs=5, n_tokens=200)
    top, pattern = write_topk_shards(full, tmp_path / "s", [0, 70, 200], suffix)
    for chunks in (None, 50):
        run = fk.load(pattern, chunks=chunks)
        assert run.is_distributed and run.kind == "topk" and run.shape == full.shape
        assert np.array_equal(run.sequence_ids, top.sequence_ids)
        assert np.array_equal(run.positions, top.positions) and run.top_k == K
        assert np.array_equal(fk.forget_fraction(run), fk.forget_fraction(full))
        assert fk.sample_dynamics(run).equals(fk.sample_dynamics(top))
        assert fk.data_map(run).equals(fk.data_map(top))
        np.testing.assert_array_equal(np.asarray(run.label_probs()), top.label_probs())


def test_a_corrupt_topk_shard_is_refused_on_the_worker_naming_it(tmp_path):
    pytest.importorskip("dask")
    full = token_run(n_epochs=3, n_tokens=100)
    _, pattern = write_topk_shards(full, tmp_path / "s", [0, 40, 100])
    bad = tmp_path / "s" / "shard-001.npy"
    flip(bad, 256 + topk_dtype(K, V).itemsize * 60 * 2 + 5)  # epoch index 2, a logit
    run = fk.load(pattern)  # only headers, sidecars and token tables read here
    with pytest.raises(CorruptFileError, match=r"shard .*shard-001.npy.*epoch index 2 does "
                                               "not match its checksum"):
        fk.forget_fraction(run)
    flip(bad, 256 + topk_dtype(K, V).itemsize * 60 * 2 + 5)  # restored
    fk.save(topk_of(token_run(n_epochs=2, n_tokens=60)), bad)
    with pytest.raises(CorruptFileError, match="shard .*shard-001.npy.* has 2 epochs"):
        fk.load(pattern)


def test_a_reader_never_sees_one_runs_records_with_the_others_token_table(tmp_path):
    path = tmp_path / "r.npy"
    runs = [topk_of(token_run(n_epochs=3, n_tokens=40, seed=1)),
            topk_of(token_run(n_epochs=2, n_tokens=60, seed=2))]
    runs[1] = fk.Run(_topk.TopKOutputs(runs[1].outputs.records, V, np.arange(60) + 7,
                                       np.arange(60) * 3), runs[1].labels, kind="topk",
                     epochs=runs[1].epochs)
    states = []
    for i, run in enumerate(runs):
        fk.save(run, tmp_path / f"s{i}.npy")
        states.append(_state(tmp_path / f"s{i}.npy"))
    with saving_in_turn(runs, path):
        for _ in range(100):
            state = _state(path)
            assert _same(state, states[0]) or _same(state, states[1])


def test_to_topk_of_a_logits_run(tmp_path):
    full = token_run(n_epochs=3, n_tokens=80)
    top = fk.to_topk(full, K)
    assert np.array_equal(top.outputs.records, topk_of(full).outputs.records)
    assert top.sequence_ids.tolist() == list(range(80)) and (top.positions == 0).all()
    seq, pos = tokens(80)
    for name in ("t.npy", "t.parquet"):
        back = fk.to_topk(full, K, tmp_path / name, sequence_ids=seq, positions=pos)
        assert back.source == tmp_path / name
        assert np.array_equal(back.outputs.records, top.outputs.records)
        assert np.array_equal(back.positions, pos)
    with pytest.raises(fk.ForgetkitError, match="to_topk needs logits"):
        fk.to_topk(full.replace(outputs=full.probs(), kind="probs"), K)
    with pytest.raises(fk.ForgetkitError, match=r"k must lie in \[1, vocab_size=40\]"):
        fk.to_topk(full, 41)


def test_forgetkit_verify_and_convert_on_the_command_line(tmp_path, capsys):
    from forgetkit.cli import main

    path = tmp_path / "t.npy"
    topk_of(token_run(n_epochs=3, n_tokens=50), path=path)
    assert main(["convert", str(path), str(tmp_path / "t.parquet")]) == 0
    assert main(["verify", str(path), str(tmp_path / "t.parquet")]) == 0
    flip(path, 256 + topk_dtype(K, V).itemsize * 50 + 3)  # epoch index 1
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    assert "epoch 1 does not match its checksum" in capsys.readouterr().err
    flip(tokens_path(path), 200)
    assert main(["analyze", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "token table" in err and len(err.strip().splitlines()) == 1
