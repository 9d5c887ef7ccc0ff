"""Recording top-k token runs of causal language models: `TokenRecorder` (one process and
torch.distributed), the Hugging Face Trainer callback in token mode and `replay` of
``checkpoint-N`` folders; against the full logits (`forgetkit.kinds.topk.topk_records`)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import forgetkit as fk

from .conftest import ROOT, import_real_part

torch = import_real_part("torch", "PyTorch (pip install forgetkit[torch])")

from forgetkit.exporters._torch_tokens import topk_rows  # noqa: E402
from forgetkit.exporters.torch import TokenRecorder  # noqa: E402
from forgetkit.kinds.topk import token_ids, topk_records  # noqa: E402

V, T, K = 37, 9, 5


def reference_rows(z, targets, k):
    """numpy: (target logit, lse, k largest logits by value descending then id ascending,
    their ids) per row, in float64."""
    order = np.lexsort((np.broadcast_to(np.arange(z.shape[1]), z.shape), -z), axis=1)[:, :k]
    z64 = z.astype(np.float64)
    m = z64.max(1, keepdims=True)
    lse = (m + np.log(np.exp(z64 - m).sum(1, keepdims=True)))[:, 0]
    return z64[np.arange(len(z)), targets], lse, np.take_along_axis(z64, order, 1), order


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_topk_rows_equal_numpy_with_ties_by_ascending_id(dtype):
    g = np.random.default_rng(1)
    z = g.integers(-2, 3, (300, V)).astype(np.float32)  # ties everywhere, across the k-th too
    z[:100] = g.normal(size=(100, V)) * 4
    z[5] = 0.0  # all equal
    y = g.integers(0, V, len(z))
    for k in (1, K, V):
        rows = topk_rows(torch.from_numpy(z).to(getattr(torch, dtype)), torch.from_numpy(y),
                         k).numpy()
        ref = reference_rows(np.asarray(torch.from_numpy(z).to(getattr(torch, dtype)).double()),
                             y, k)
        assert np.array_equal(rows[:, 2 + k:].view(np.int32), ref[3])
        assert np.array_equal(rows[:, 2:2 + k], ref[2].astype(np.float32))
        assert np.array_equal(rows[:, 0], ref[0].astype(np.float32))
        np.testing.assert_allclose(rows[:, 1], ref[1], rtol=1e-6, atol=1e-6)


def test_rows_of_a_vocabulary_above_65536_become_24_bit_records():
    from forgetkit.exporters._torch_tokens import rows_to_records

    vocab, k = 70_000, 8
    g = np.random.default_rng(2)
    z = g.normal(size=(12, vocab)).astype(np.float32)
    z[:, 65_536:] += 3.0  # top ids above 2**16
    y = g.integers(0, vocab, len(z))
    records = rows_to_records(topk_rows(torch.from_numpy(z), torch.from_numpy(y), k).numpy(),
                              k, vocab)
    assert records.dtype.itemsize == 64 and token_ids(records).max() >= 1 << 16
    ref = topk_records(z, y, k)
    assert np.array_equal(token_ids(records), token_ids(ref))
    assert np.array_equal(records["logits"], ref["logits"])


# ------------------------------------------------------------------ a tiny causal LM
class TinyLM(torch.nn.Module):
    """Embedding -> linear over a vocabulary of ``vocab`` (no transformers needed); a dict
    batch's attention mask is taken and ignored."""

    def __init__(self, seed, vocab=V):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Embedding(vocab, 6)
        self.out = torch.nn.Linear(6, vocab)
        with torch.no_grad():  # small integers: ties between logits, exact everywhere
            self.emb.weight.copy_(torch.randint(-2, 3, (vocab, 6), generator=g).float())
            self.out.weight.copy_(torch.randint(-1, 2, (vocab, 6), generator=g).float())
            self.out.bias.zero_()

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.out(self.emb(input_ids))}


def token_data(n=11, seed=0):
    """Right-padded sequences: input ids, attention mask, labels (-100 at some positions)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (n, T), generator=g)
    lengths = torch.randint(2, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    labels[::3, 2] = -100  # ignored positions inside sequences
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def expected_run(model, data, k):
    """(records, sequence index, position, target) of the kept next tokens from the full
    logits, by `topk_records`."""
    with torch.no_grad():
        logits = model(data["input_ids"])["logits"][:, :-1].numpy()
    target = data["labels"][:, 1:]
    kept = (target != -100) & (data["attention_mask"][:, 1:] != 0)
    seq, pos = np.nonzero(kept.numpy())
    y = target.numpy()[seq, pos]
    return topk_records(logits[seq, pos], y, k), seq, pos + 1, y


def test_token_recorder_stores_the_top_k_of_every_kept_next_token(tmp_path):
    data = token_data()
    with TokenRecorder(tmp_path / "run.npy", data, top_k=K, batch_size=4) as rec:
        accuracy = [rec.record(TinyLM(e), e) for e in (0, 3)]
    run = fk.load(tmp_path / "run.npy")
    assert run.kind == "topk" and run.n_classes == V and run.top_k == K
    assert run.epochs.tolist() == [0, 3]
    stored = np.load(tmp_path / "run.npy")
    for i, e in enumerate((0, 3)):
        records, seq, pos, y = expected_run(TinyLM(e), data, K)
        assert np.array_equal(run.sequence_ids, seq) and np.array_equal(run.positions, pos)
        assert np.array_equal(run.labels, y)
        for field in ("target", "logits", "ids"):
            assert np.array_equal(stored[i][field], records[field]), field
        np.testing.assert_allclose(stored[i]["lse"], records["lse"], rtol=1e-6)
        assert accuracy[i] == pytest.approx(np.mean(token_ids(records, 0) == y))
    assert np.array_equal(run.correctness(), token_ids(stored, 0) == run.labels)
    # user sequence ids, a tensor of input ids (every position a target), and resuming
    TokenRecorder(tmp_path / "ids.npy", data, top_k=2, sequence_ids=np.arange(11) * 10 + 5,
                  batch_size=3).record(TinyLM(0), 0)
    assert np.array_equal(fk.load(tmp_path / "ids.npy").sequence_ids, seq * 10 + 5)
    plain = tmp_path / "plain.npy"
    with TokenRecorder(plain, data["input_ids"], top_k=2) as rec:
        rec.record(TinyLM(0), 0)
    with TokenRecorder(plain, data["input_ids"], top_k=2) as rec:  # mode "a": appended
        rec.record(TinyLM(1), 1)
    run = fk.load(plain)
    assert run.epochs.tolist() == [0, 1] and run.n_samples == 11 * (T - 1)
    assert run.positions.tolist()[: T - 1] == list(range(1, T))


def test_token_recorder_refuses_bad_input_and_writes_nothing_for_that_epoch(tmp_path):
    data = token_data()
    path = tmp_path / "run.npy"
    with pytest.raises(fk.ForgetkitError, match=r"top_k=38 is larger than the vocabulary"):
        TokenRecorder(path, data, top_k=V + 1).record(TinyLM(0), 0)
    assert not path.exists()
    rec = TokenRecorder(path, data, top_k=K, batch_size=4)
    rec.record(TinyLM(0), 0)
    with pytest.raises(fk.ForgetkitError, match=r"vocabulary of 40 tokens; the run recorded 37"):
        rec.record(TinyLM(1, vocab=V + 3), 1)
    original = token_data()
    data["attention_mask"][4, 1:] = 1  # a sequence grows
    data["labels"][4] = data["input_ids"][4]
    with pytest.raises(fk.ForgetkitError, match=r"sequence 4 has 8 target tokens; at the "
                                                r"first recorded epoch it had \d"):
        rec.record(TinyLM(1), 1)
    data["attention_mask"][4], data["labels"][4] = original["attention_mask"][4], \
        original["labels"][4]
    data["labels"][6, 3] = (data["labels"][6, 3] + 1) % V  # another tokenization
    with pytest.raises(fk.ForgetkitError, match=r"sequence 6 position 3 has target token"):
        rec.record(TinyLM(1), 1)
    data["labels"][6, 3] = original["labels"][6, 3]
    bad = TinyLM(2)
    with torch.no_grad():
        bad.out.bias[3] = float("nan")
    with pytest.raises(fk.ForgetkitError, match="NaN or inf"):
        rec.record(bad, 1)
    rec.record(TinyLM(1), 1)
    rec.close()
    assert fk.load(path).epochs.tolist() == [0, 1]
    with pytest.raises(fk.ForgetkitError, match="top_k must be a positive integer"):
        TokenRecorder(path, data, top_k=0)
    labels = dict(data, labels=data["labels"].clone())
    labels["labels"][0, 1] = V
    with pytest.raises(fk.ForgetkitError, match=r"target token id 37 is outside"):
        TokenRecorder(tmp_path / "x.npy", labels).record(TinyLM(0), 0)
    with pytest.raises(fk.ForgetkitError, match="logits of shape"):
        TokenRecorder(tmp_path / "x.npy", data,
                      output_fn=lambda out: out["logits"][:, 0]).record(TinyLM(0), 0)
    assert not (tmp_path / "x.npy").exists()


# ------------------------------------------------------------ torch.distributed
DDP_TOKENS = textwrap.dedent("""
    import datetime, json, sys
    import numpy as np, torch, torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    sys.path.insert(0, sys.argv[4])
    from tests.test_tokens_record import TinyLM, token_data
    from forgetkit.exporters.torch import TokenRecorder

    rank, world, tmp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    data = token_data()
    rows = [{k: v[i] for k, v in data.items()} for i in range(len(data["input_ids"]))]
    loader = DataLoader(rows, batch_size=2, sampler=DistributedSampler(rows, shuffle=False))
    with TokenRecorder(f"{tmp}/ddp.npy", loader, top_k=4) as rec:  # 11 sequences, 1 padded
        acc = [rec.record(TinyLM(e), e) for e in (0, 1)]
    try:
        TokenRecorder(f"{tmp}/big.npy", loader, top_k=99).record(TinyLM(0), 0)
        err = None
    except Exception as e:
        err = str(e)
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump({"accuracy": acc, "error": err}, f)
    dist.barrier()  # no rank leaves while another is still in a collective
    dist.destroy_process_group()
""")


def test_token_recorder_under_torch_distributed_equals_one_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(DDP_TOKENS)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(tmp_path),
                               str(ROOT)], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    for r, p in enumerate(procs):
        err = p.communicate(timeout=600)[1]
        assert p.returncode == 0, f"rank {r}:\n{err[-3000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    with TokenRecorder(tmp_path / "one.npy", token_data(), top_k=4) as rec:
        acc = [rec.record(TinyLM(e), e) for e in (0, 1)]
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"] == pytest.approx(acc)
    assert all("top_k=99 is larger than the vocabulary" in r["error"] for r in ranks)
    assert not (tmp_path / "big.npy").exists()
    one, ddp = fk.load(tmp_path / "one.npy"), fk.load(tmp_path / "ddp.npy")
    assert np.array_equal(np.load(tmp_path / "ddp.npy"), np.load(tmp_path / "one.npy"))
    assert np.array_equal(ddp.sequence_ids, one.sequence_ids)
    assert np.array_equal(ddp.positions, one.positions)


# ------------------------------------------------------------ Hugging Face
def tiny_gpt2(transformers, vocab=V, seed=0):
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=16, n_embd=16, n_layer=1,
                                     n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(config)


class Sequences(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data["input_ids"])

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.data.items()}


def test_trainer_token_mode_and_replay_of_its_checkpoints_are_the_same_run(tmp_path):
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    from forgetkit.exporters.huggingface import LogitRecorderCallback, replay

    train, test = Sequences(token_data(24, seed=1)), Sequences(token_data(7, seed=2))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, per_device_train_batch_size=8,
        per_device_eval_batch_size=3, learning_rate=1e-2, report_to=[], save_strategy="epoch",
        logging_strategy="no", use_cpu=True, disable_tqdm=True)
    callback = LogitRecorderCallback(tmp_path / "rec.npy", test, top_k=K)
    model = tiny_gpt2(transformers)
    transformers.Trainer(model=model, args=args, train_dataset=train,
                         callbacks=[callback]).train()
    recorded = fk.load(tmp_path / "rec.npy")
    assert recorded.kind == "topk" and recorded.epochs.tolist() == [0, 1]
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=test.data["input_ids"],
                       attention_mask=test.data["attention_mask"]).logits
    records, seq, pos, y = expected_run(lambda ids: {"logits": logits}, test.data, K)
    final = np.load(tmp_path / "rec.npy")[-1]
    assert np.array_equal(token_ids(final), token_ids(records))
    np.testing.assert_allclose(final["logits"], records["logits"], rtol=1e-5, atol=1e-5)
    assert np.array_equal(recorded.sequence_ids, seq) and np.array_equal(recorded.labels, y)
    assert callback.accuracy_[-1] == pytest.approx(np.mean(token_ids(records, 0) == y))
    # the checkpoints replayed: the recorded run bit for bit (the Trainer's steps as epochs)
    run = replay(tmp_path / "out", test.data, tmp_path / "replayed.npy", top_k=K, batch_size=3,
                 progress=False)
    assert run.kind == "topk" and run.epochs.tolist() == [3, 6]
    assert np.load(tmp_path / "replayed.npy").tobytes() == \
        np.load(tmp_path / "rec.npy").tobytes()
    assert np.array_equal(run.positions, recorded.positions)
    # a checkpoint of another vocabulary: refused, nothing written for it
    tiny_gpt2(transformers, vocab=V + 2).save_pretrained(tmp_path / "out" / "checkpoint-9")
    with pytest.raises(fk.ForgetkitError, match=r"vocabulary of 39 tokens; the run recorded 37"):
        replay(tmp_path / "out", test.data, tmp_path / "mixed.npy", top_k=K, batch_size=3,
               progress=False)
    assert fk.load(tmp_path / "mixed.npy").epochs.tolist() == [3, 6]
    with pytest.raises(fk.ForgetkitError, match=r"has vocab_size=37; this writer has "
                                                r"vocab_size=39"):  # resuming the replay
        replay(tmp_path / "out", test.data, tmp_path / "replayed.npy", top_k=K, batch_size=3,
               progress=False)
    assert fk.load(tmp_path / "replayed.npy").epochs.tolist() == [3, 6]
    with pytest.raises(fk.ForgetkitError, match=r"top_k=40 is larger than the vocabulary"):
        replay(tmp_path / "out", test.data, tmp_path / "big.npy", top_k=40, progress=False)
    assert not (tmp_path / "big.npy").exists()


def test_replay_of_state_dict_checkpoints_in_token_mode_equals_the_recording(tmp_path):
    from forgetkit.exporters.torch import replay

    data = token_data()
    with TokenRecorder(tmp_path / "rec.npy", data, top_k=K, batch_size=4) as rec:
        for e in (0, 1, 2):
            rec.record(TinyLM(e), e)
            torch.save(TinyLM(e).state_dict(), tmp_path / f"ckpt-{e}.pt")
    run = replay(TinyLM(9), str(tmp_path / "ckpt-*.pt"), data, tmp_path / "rep.npy", top_k=K,
                 batch_size=4, progress=False)
    assert run.kind == "topk" and run.epochs.tolist() == [0, 1, 2]
    assert np.load(tmp_path / "rep.npy").tobytes() == np.load(tmp_path / "rec.npy").tobytes()
    assert np.array_equal(run.sequence_ids, fk.load(tmp_path / "rec.npy").sequence_ids)
    torch.save(TinyLM(3, vocab=V + 1).state_dict(), tmp_path / "ckpt-3.pt")
    with pytest.raises(fk.ForgetkitError, match="does not fit the model"):
        replay(TinyLM(9), str(tmp_path / "ckpt-*.pt"), data, tmp_path / "rep.npy", top_k=K,
               progress=False)
    assert fk.load(tmp_path / "rep.npy").epochs.tolist() == [0, 1, 2]
