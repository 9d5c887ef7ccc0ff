"""Token runs (forgetkit.analysis.tokens): surprisal, memorization of tokens, sequences and
spans, and per-sequence tables, against plain numpy references on a small vocabulary; exact
means (the exact mean rounded once) and the same bits on every executor, with sequences
split across chunks."""

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import forgetkit as fk
from forgetkit.analysis import tokens as tokens_module
from forgetkit.analysis.tokens import exact_means, exact_sums
from forgetkit.execution import LocalExecutor, use_executor

from .conftest import import_real_part

VOCAB = 50


def token_run(n_epochs=6, n_sequences=12, seed=0, sample_ids=False):
    """A full-vocabulary token run (logits multiples of 1/4: argmax ties), its tokens'
    sequence ids and positions, in shuffled order (a sequence's tokens are not adjacent).
    Sequence 0 is memorized from the first epoch on; sequence 1 is memorized, then its
    last token forgotten at the final epoch."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 25, n_sequences)
    lengths[:2] = (3, 4)
    ids = rng.permutation(1000)[:n_sequences] * 3 + 1  # unsorted, sparse sequence ids
    seq = np.repeat(ids, lengths)
    pos = np.concatenate([np.arange(n) + 1 for n in lengths])  # a target per next token
    keep = np.ones(len(seq), bool)
    keep[rng.choice(np.flatnonzero(seq != ids[1]), 5, replace=False)] = False  # ignored ones
    seq, pos = seq[keep], pos[keep]
    n = len(seq)
    y = rng.integers(0, VOCAB, n)
    z = rng.normal(size=(n_epochs, n, VOCAB))
    z[:, np.arange(n), y] += np.linspace(-0.5, 3.5, n_epochs)[:, None] + rng.normal(
        size=(n_epochs, n))
    z = np.round(z * 4) / 4
    first, second = np.flatnonzero(seq == ids[0]), np.flatnonzero(seq == ids[1])
    z[:, first, y[first]] = 9.0
    z[1:, second, y[second]] = 9.0
    z[-1, second[-1], y[second[-1]]] = -9.0
    order = rng.permutation(n)
    run = fk.Run(z[:, order].astype(np.float32), y[order],
                 sample_ids=rng.permutation(n) * 5 + 2 if sample_ids else None)
    return run, seq[order], pos[order]


def reference(run):
    """correct (E, N), surprisal (E, N) and p (E, N) in plain float64 numpy."""
    z = np.asarray(run.outputs, dtype=np.float64)
    rows = np.arange(run.n_samples)
    top = z.max(axis=2)
    lse = top + np.log(np.exp(z - top[..., None]).sum(axis=2))
    target = z[:, rows, run.labels]
    return z.argmax(axis=2) == run.labels, lse - target, np.exp(target - lse)


def exact_mean(values):
    return float(sum(Fraction(float(x)) for x in values) / len(values))


@pytest.fixture(scope="module")
def tokens():
    return token_run()


def test_exact_sums_are_exact_and_add_up_over_parts(monkeypatch):
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.normal(size=400) * 10.0 ** rng.integers(-300, 300, 400),
                        [5e-324, -5e-324, 2.2e-308, 1.7e308, 1.7e308, -1.7e308, 0.0]])
    g = rng.integers(0, 3, len(v))
    sums = exact_sums(v, g, 3)
    for k in range(3):
        exact = sum(Fraction(float(x)) for x in v[g == k])
        assert Fraction(sums[k], 2 ** 1074) == exact
        count = int((g == k).sum())
        assert exact_means([sums[k]], [count])[0] == float(exact / count)
    parts = exact_sums(v[:150], g[:150], 3) + exact_sums(v[150:], g[150:], 3)
    assert (parts == sums).all()
    # in steps whose limbs widen the cells, small blocks and flushes: the same integers
    monkeypatch.setattr(tokens_module, "_SUM_BLOCK", 7)
    monkeypatch.setattr(tokens_module, "_FLUSH_AFTER", 50)
    acc = tokens_module.ExactSums(3)
    order = np.argsort(np.abs(v))
    for part in np.array_split(order, 9):
        acc.add(v[part], g[part])
    assert (acc.result() == sums).all()
    with pytest.raises(ValueError, match="finite values"):
        exact_sums([1.0, np.nan], [0, 0], 1)


def test_surprisal_and_its_means_against_numpy(tokens):
    run, seq, _ = tokens
    correct, s_ref, _ = reference(run)
    s = fk.surprisal(run)
    assert s.shape == (run.n_epochs, run.n_samples)
    np.testing.assert_allclose(s, s_ref, rtol=1e-12, atol=1e-14)
    mean = fk.mean_surprisal(run)
    assert mean.tolist() == [exact_mean(row) for row in s]  # exact mean, rounded once
    by_seq = fk.mean_surprisal(run, sequence_ids=seq, by="sequence")
    assert by_seq.index.tolist() == sorted(set(seq.tolist()))
    assert by_seq.columns.tolist() == run.epochs.tolist()
    for sid in by_seq.index[:4]:
        assert by_seq.loc[sid].tolist() == [exact_mean(row[seq == sid]) for row in s]


def sequence_reference(run, seq):
    correct, s, p = reference(run)
    rows = []
    for sid in sorted(set(seq.tolist())):
        c, idx = correct[:, seq == sid], seq == sid
        mem = c.all(axis=1)
        rows.append({
            "sequence": sid, "n_tokens": int(idx.sum()), "accuracy_final": c[-1].mean(),
            "memorized_final": bool(mem[-1]),
            "first_memorized": int(run.epochs[np.argmax(mem)]) if mem.any() else pd.NA,
            "epochs_memorized": int(mem.sum()), "forgotten": bool(mem.any() and not mem[-1]),
            "memorization_losses": int((mem[:-1] & ~mem[1:]).sum()),
            "forgetting_events": int((c[:-1] & ~c[1:]).sum()),
            "surprisal_first": s[0, idx].mean(), "surprisal_last": s[-1, idx].mean(),
            "confidence": p[:, idx].mean(axis=0).mean(),
            "variability": p[:, idx].std(axis=0).mean()})
    return pd.DataFrame(rows).set_index("sequence")


def test_sequence_dynamics_against_numpy(tokens):
    run, seq, _ = tokens
    table = fk.sequence_dynamics(run, sequence_ids=seq)
    ref = sequence_reference(run, seq)
    assert table.columns.tolist() == ref.columns.tolist()
    exact = ["n_tokens", "accuracy_final", "memorized_final", "epochs_memorized",
             "forgotten", "memorization_losses", "forgetting_events"]
    pd.testing.assert_frame_equal(table[exact], ref[exact], check_dtype=False)
    assert table["first_memorized"].astype("Int64").equals(
        ref["first_memorized"].astype("Int64"))
    floats = ["surprisal_first", "surprisal_last", "confidence", "variability"]
    np.testing.assert_allclose(table[floats], ref[floats], rtol=1e-12)
    # the planted sequences: memorized throughout; memorized, then forgotten at the end
    always = table[table["epochs_memorized"] == run.n_epochs]
    assert len(always) >= 1 and always["first_memorized"].iloc[0] == 0
    lost = table[table["forgotten"]]
    assert len(lost) >= 1 and not lost["memorized_final"].any()
    assert (table["memorization_losses"] >= table["forgotten"]).all()
    # means are exact means of forgetkit's own per-token values, rounded once
    s, dm = fk.surprisal(run), fk.data_map(run)
    for sid in table.index[:3]:
        idx = seq == sid
        assert table.loc[sid, "surprisal_last"] == exact_mean(s[-1, idx])
        assert table.loc[sid, "confidence"] == exact_mean(dm["confidence"].to_numpy()[idx])
        assert table.loc[sid, "variability"] == exact_mean(dm["variability"].to_numpy()[idx])


def test_memorization_of_tokens_sequences_and_spans(tokens):
    run, seq, pos = tokens
    correct, _, _ = reference(run)
    sids = sorted(set(seq.tolist()))
    spans = pd.DataFrame({"sequence": [sids[0], sids[1], sids[1], sids[2]],
                          "start": [0, 1, 3, 2], "stop": [100, 3, 5, 6]})
    table = fk.memorization(run, sequence_ids=seq, positions=pos, spans=spans)
    assert table.index.tolist() == run.epochs.tolist()
    np.testing.assert_array_equal(table["tokens"], correct.mean(axis=1))
    whole = np.stack([correct[:, seq == s].all(axis=1) for s in sids], axis=1)
    np.testing.assert_array_equal(table["sequences"], whole.mean(axis=1))
    for column, mem in (("tokens_forgotten", correct), ("sequences_forgotten", whole)):
        before = np.array([mem[:e].any(axis=0) & ~mem[e] for e in range(run.n_epochs)])
        np.testing.assert_array_equal(table[column], before.mean(axis=1))
    assert table["sequences_forgotten"].iloc[-1] > 0  # the planted sequence
    expected = np.stack([correct[:, (seq == s) & (pos >= a) & (pos < b)].all(axis=1)
                         for s, a, b in spans.to_numpy()], axis=1)
    got = fk.memorized_spans(run, spans, sequence_ids=seq, positions=pos)
    assert got.dtype == bool and got.shape == (run.n_epochs, 4)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(table["spans"], expected.mean(axis=1))
    assert table.attrs == {"n_tokens": run.n_samples, "n_sequences": len(sids), "n_spans": 4}
    # a whole sequence as a span is the sequence's memorization
    np.testing.assert_array_equal(
        fk.memorized_spans(run, np.array([[s, 0, 10**6] for s in sids]), sequence_ids=seq,
                           positions=pos), whole)
    # per token, memorized is correct: the first epoch and forgetting are sample_dynamics'
    dyn = fk.sample_dynamics(run)
    assert (dyn["first_correct"].notna().to_numpy() == correct.any(axis=0)).all()


def all_tables(run, seq, pos):
    """Every token table of a run (seq and pos: None for a run that holds them)."""
    held = run.sequence_ids if seq is None else seq
    spans = np.array([[s, 0, 4] for s in sorted(set(held.tolist()))])
    return (fk.sequence_dynamics(run, sequence_ids=seq),
            fk.memorization(run, sequence_ids=seq, positions=pos, spans=spans),
            fk.mean_surprisal(run), fk.mean_surprisal(run, sequence_ids=seq, by="sequence"),
            fk.memorized_spans(run, spans, sequence_ids=seq, positions=pos))


def assert_same(got, ref):
    for g, r in zip(got, ref, strict=True):
        if isinstance(r, pd.DataFrame):
            pd.testing.assert_frame_equal(g, r, check_exact=True)
            assert g.attrs == r.attrs
        else:
            np.testing.assert_array_equal(np.asarray(g), r)


@pytest.mark.parametrize("sample_ids", [False, True])
def test_blocks_of_tokens_give_the_same_bits(sample_ids):
    run, seq, pos = token_run(seed=3, sample_ids=sample_ids)
    ref = all_tables(run, seq, pos)
    n = run.n_samples
    for chunks in (1, 17, (5, n - 30, 25)):
        with use_executor(LocalExecutor(chunks)):
            assert_same(all_tables(run, seq, pos), ref)


def test_dask_chunks_give_the_same_bits():
    dask = import_real_part("dask", "dask (the forgetkit[dask] extra)")
    da = import_real_part("dask.array", "dask (the forgetkit[dask] extra)")
    run, seq, pos = token_run(seed=4, sample_ids=True)
    ref = all_tables(run, seq, pos)
    n = run.n_samples
    on_dask = run.replace(outputs=da.from_array(np.asarray(run.outputs),
                                                chunks=(-1, (7, n - 40, 33), -1)))
    with dask.config.set(scheduler="synchronous"):
        assert_same(all_tables(on_dask, seq, pos), ref)
        s = fk.surprisal(on_dask)
        assert isinstance(s, da.Array)
        np.testing.assert_array_equal(s.compute(), fk.surprisal(run))


def test_topk_shards_on_dask_give_the_same_bits(tmp_path):
    dask = import_real_part("dask", "dask (the forgetkit[dask] extra)")
    run, seq, pos = token_run(seed=4)
    twin = topk_twin(run, seq, pos, tmp_path)
    ref = all_tables(twin, None, None)
    bounds = [0, 7, twin.n_samples - 33, twin.n_samples]
    (tmp_path / "shards").mkdir()
    for i in range(3):  # shards that cut sequences
        fk.save(twin.isel(samples=np.arange(bounds[i], bounds[i + 1])),
                tmp_path / "shards" / f"shard-{i}.npy")
    with dask.config.set(scheduler="synchronous"):
        for got in (fk.load(str(tmp_path / "shards" / "shard-*.npy")),
                    fk.load(tmp_path / "topk.npy", chunks=40)):
            assert got.is_distributed and got.kind == "topk"
            assert_same(all_tables(got, None, None), ref)


def test_token_analyses_work_on_a_summary(tokens, tmp_path):
    run, seq, pos = tokens
    summary = fk.summarize(run, tmp_path / "s.npy")
    got, ref = all_tables(summary, seq, pos), all_tables(run, seq, pos)
    # correctness exact; p and surprisal up to the float32 rounding of the stored logit and
    # log-sum-exp (absolute for surprisal: one float32 step of lse)
    for g, r in zip(got, ref, strict=True):
        if isinstance(r, pd.DataFrame):
            pd.testing.assert_frame_equal(g, r, check_exact=False, rtol=2e-6, atol=2e-6)
        else:
            np.testing.assert_allclose(np.asarray(g, dtype=float), r, rtol=2e-6, atol=2e-6)
    assert_same([got[1]["tokens"], got[1]["sequences"], got[4]],
                [ref[1]["tokens"].to_numpy(), ref[1]["sequences"].to_numpy(), ref[4]])


def test_bad_token_input_is_named(tokens):
    run, seq, pos = tokens
    with pytest.raises(ValueError, match="needs each token's sequence id.*pass sequence_ids="):
        fk.sequence_dynamics(run)
    with pytest.raises(ValueError, match=r"sequence_ids must have shape \(\d+,\)"):
        fk.memorization(run, sequence_ids=seq[:-1])
    with pytest.raises(TypeError, match="sequence_ids must be integers; got dtype float64"):
        fk.mean_surprisal(run, sequence_ids=seq * 1.0, by="sequence")
    with pytest.raises(ValueError, match="by must be one of 'token', 'sequence'; got 'x'"):
        fk.mean_surprisal(run, by="x")
    spans = [[int(seq[0]), 0, 5]]
    with pytest.raises(ValueError, match="spans need each token's position"):
        fk.memorized_spans(run, spans, sequence_ids=seq)
    twice = pos.copy()
    twice[np.flatnonzero(seq == seq[0])[:2]] = 1
    with pytest.raises(ValueError, match=rf"sequence {seq[0]} position 1 appears more than"):
        fk.memorized_spans(run, spans, sequence_ids=seq, positions=twice)
    with pytest.raises(ValueError, match="positions must be >= 0; got -1"):
        fk.memorized_spans(run, spans, sequence_ids=seq, positions=pos - 2)
    for bad, message in (([[0, 0, 5]], "span 0 names sequence 0, which holds no token"),
                         ([[int(seq[0]), 5, 5]], "span 0 must have start < stop"),
                         ([[int(seq[0]), 500, 600]], "span 0 .* holds no stored token"),
                         ([[1.5, 0, 2]], "spans must hold integers"),
                         (np.zeros((0, 3), int), "at least one; got shape"),
                         (pd.DataFrame({"sequence": [1]}), "missing \\['start', 'stop'\\]")):
        with pytest.raises(ValueError, match=message):
            fk.memorized_spans(run, bad, sequence_ids=seq, positions=pos)
    with pytest.raises(TypeError, match="run must be a forgetkit.Run"):
        fk.sequence_dynamics("run.npy")


def test_sequences_command_writes_the_table(tokens, tmp_path, capsys):
    from forgetkit.cli import main

    run, seq, _ = tokens
    fk.save(run, tmp_path / "r.npy")
    np.save(tmp_path / "seq.npy", seq)
    out, mem = tmp_path / "seq.csv", tmp_path / "mem.csv"
    assert main(["sequences", str(tmp_path / "r.npy"), "--out", str(out), "--memorization",
                 str(mem), "--sequence-ids", str(tmp_path / "seq.npy"), "--quiet"]) == 0
    table = pd.read_csv(out, index_col="sequence")
    ref = fk.sequence_dynamics(run, sequence_ids=seq)
    assert table.index.tolist() == ref.index.tolist()
    np.testing.assert_array_equal(table["surprisal_last"], ref["surprisal_last"])
    np.testing.assert_array_equal(table["forgetting_events"], ref["forgetting_events"])
    np.testing.assert_array_equal(pd.read_csv(mem, index_col="epoch")["sequences"],
                                  fk.memorization(run, sequence_ids=seq)["sequences"])
    capsys.readouterr()
    assert main(["sequences", str(tmp_path / "r.npy"), "--out", str(tmp_path / "x.csv")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no sequence ids" in err and "--sequence-ids" in err
    assert main(["sequences", str(tmp_path / "r.npy"), "--out", str(tmp_path / "x.txt")]) == 1
    assert "--out must be a .csv file" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


# ------------------------------------------------------------------ top-k twins
def topk_twin(run, seq, pos, tmp_path=None, k=4):
    """The top-k run (k largest logits, target logit, log-sum-exp) of the same logits, in
    memory or written by TopKWriter and loaded (a memmap)."""
    from forgetkit.io.topk import TopKWriter
    from forgetkit.kinds.topk import TopKOutputs, topk_records

    z = np.asarray(run.outputs)
    if tmp_path is None:
        records = np.stack([topk_records(z[e], run.labels, k) for e in range(run.n_epochs)])
        return fk.Run(TopKOutputs(records, VOCAB, seq, pos), run.labels, kind="topk",
                      epochs=run.epochs, sample_ids=run.sample_ids)
    path = tmp_path / "topk.npy"
    with TopKWriter(path, vocab_size=VOCAB, top_k=k, targets=run.labels, sequence_ids=seq,
                    positions=pos) as writer:
        for e in range(run.n_epochs):
            writer.append(int(run.epochs[e]), z[e])
    return fk.load(path)


def test_a_topk_run_gives_the_full_runs_token_analyses(tokens, tmp_path):
    run, seq, pos = tokens
    spans = np.array([[s, 1, 5] for s in sorted(set(seq.tolist()))])
    on_disk = topk_twin(run, seq, pos, tmp_path)
    fk.save(on_disk, tmp_path / "topk.parquet")
    for twin in (topk_twin(run, seq, pos), on_disk, fk.load(tmp_path / "topk.parquet")):
        assert twin.kind == "topk" and twin.top_k == 4 and twin.n_classes == VOCAB
        # forgetting and per-token dynamics: exact
        np.testing.assert_array_equal(twin.correctness(), run.correctness())
        for f in (fk.forget_fraction, fk.learn_fraction, fk.accuracy):
            np.testing.assert_array_equal(f(twin), f(run))
        pd.testing.assert_frame_equal(fk.sample_dynamics(twin), fk.sample_dynamics(run))
        # memorization: exact, the token table from the run itself
        pd.testing.assert_frame_equal(fk.memorization(twin, spans=spans),
                                      fk.memorization(run, sequence_ids=seq, positions=pos,
                                                      spans=spans))
        np.testing.assert_array_equal(fk.memorized_spans(twin, spans),
                                      fk.memorized_spans(run, spans, sequence_ids=seq,
                                                         positions=pos))
        # AUM margins exact (float32 logits), data maps up to float32 lse
        np.testing.assert_array_equal(twin.label_margins(), run.label_margins())
        dm, ref_dm = fk.data_map(twin), fk.data_map(run)
        np.testing.assert_array_equal(dm["aum"], ref_dm["aum"])
        np.testing.assert_array_equal(dm["forgetfulness"], ref_dm["forgetfulness"])
        np.testing.assert_allclose(dm[["confidence", "variability"]],
                                   ref_dm[["confidence", "variability"]], rtol=2e-6,
                                   atol=2e-6)
        # surprisal: up to one float32 step of the stored logit and log-sum-exp
        np.testing.assert_allclose(fk.surprisal(twin), fk.surprisal(run), rtol=2e-6,
                                   atol=2e-6)
        np.testing.assert_allclose(fk.mean_surprisal(twin), fk.mean_surprisal(run),
                                   rtol=2e-6)
        table, ref = fk.sequence_dynamics(twin), fk.sequence_dynamics(run, sequence_ids=seq)
        floats = ["surprisal_first", "surprisal_last", "confidence", "variability"]
        pd.testing.assert_frame_equal(table.drop(columns=floats), ref.drop(columns=floats))
        np.testing.assert_allclose(table[floats], ref[floats], rtol=2e-6, atol=2e-6)
        pd.testing.assert_frame_equal(fk.mean_surprisal(twin, by="sequence"),
                                      fk.mean_surprisal(run, sequence_ids=seq, by="sequence"),
                                      check_exact=False, rtol=2e-6, atol=2e-6)


def test_a_topk_run_in_blocks_gives_the_same_bits(tokens):
    run, seq, pos = tokens
    twin = topk_twin(run, seq, pos)
    ref = all_tables(twin, None, None)
    with use_executor(LocalExecutor((9, twin.n_samples - 20, 11))):
        assert_same(all_tables(twin, None, None), ref)


def test_sequences_command_on_a_topk_run_reads_its_token_table(tokens, tmp_path, capsys):
    from forgetkit.cli import main

    run, seq, pos = tokens
    twin = topk_twin(run, seq, pos, tmp_path)
    out = tmp_path / "seq.csv"
    assert main(["sequences", str(tmp_path / "topk.npy"), "--out", str(out)]) == 0
    assert "tokens in" in capsys.readouterr().out
    table = pd.read_csv(out, index_col="sequence")
    ref = fk.sequence_dynamics(twin)
    np.testing.assert_array_equal(table["memorization_losses"], ref["memorization_losses"])
    np.testing.assert_array_equal(table["confidence"], ref["confidence"])
