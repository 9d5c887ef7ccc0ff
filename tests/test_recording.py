"""Recording where training happens: the background writer, dict batches and summaries,
real torch.distributed (2 processes, gloo), Lightning DDP, a Hugging Face Trainer, Keras 3
and JAX outputs sharded over 2 devices."""

import json
import os
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.io.background import BackgroundWriter

from .conftest import ROOT, import_real_part

torch = import_real_part("torch", "PyTorch (pip install forgetkit[torch])")


def test_import_forgetkit_imports_none_of_the_new_frameworks():
    code = ("import sys, forgetkit; print(sorted(m for m in ('keras', 'transformers', "
            "'lightning', 'accelerate', 'torch', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------- background writer
class ListWriter:
    """A writer that keeps appended epochs, fails on ``fail`` and sleeps ``delay`` each."""

    path = "list"

    def __init__(self, fail=(), delay=0.0):
        self.epochs, self.values, self.fail, self.delay = [], [], set(fail), delay
        self.closed = self.aborted = False

    def append(self, epoch, values):
        time.sleep(self.delay)
        if epoch in self.fail:
            raise OSError(28, "No space left on device")
        self.epochs.append(epoch)
        self.values.append(values)

    def close(self):
        self.closed = True

    def abort(self):
        self.aborted = True


def test_background_writer_reports_errors_on_the_next_call_and_on_close():
    w = ListWriter(fail={1}, delay=0.01)
    bg = BackgroundWriter(w, max_pending=1)
    bg.submit(0, np.zeros(2))
    bg.submit(1, lambda: np.ones(2))  # a callable runs on the writer thread
    bg.submit(2, np.zeros(2))
    time.sleep(0.2)
    with pytest.raises(OSError, match="No space left") as info:
        bg.submit(3, np.zeros(2))
    if sys.version_info >= (3, 11):  # exceptions carry notes
        assert "writing epoch 1 to 'list' failed; epochs [2] queued after it were not " \
            "written" in info.value.__notes__[0]
    bg.submit(4, np.zeros(2))  # reported once: later epochs are written again
    bg.close()
    assert w.epochs == [0, 4] and w.closed
    w = ListWriter(fail={0})
    bg = BackgroundWriter(w)
    bg.submit(0, np.zeros(2))
    with pytest.raises(OSError):
        bg.close()
    assert w.closed


def test_background_writer_bounds_what_waits():
    w = ListWriter(delay=0.15)
    bg = BackgroundWriter(w, max_pending=1)
    start = time.perf_counter()
    for e in range(4):
        bg.submit(e, np.zeros(1))
    waited = time.perf_counter() - start
    bg.flush()
    assert w.epochs == [0, 1, 2, 3] and waited >= 0.25  # submit 3 waited for epochs 0 and 1


UNCLOSED = textwrap.dedent("""
    import sys, numpy as np
    from forgetkit import RunWriter
    from forgetkit.io.background import BackgroundWriter
    bg = BackgroundWriter(RunWriter(sys.argv[1], 50, 3, labels=np.zeros(50, int)))
    for e in range(3):
        bg.submit(e, lambda e=e: np.full((50, 3), e, np.float32))
    raise RuntimeError("the training loop failed before close()")
""")


def test_epochs_queued_when_the_program_dies_are_written(tmp_path):
    out = subprocess.run([sys.executable, "-c", UNCLOSED, str(tmp_path / "u.npy")],
                         capture_output=True, text=True, timeout=120)
    assert "the training loop failed" in out.stderr
    run = fk.load(tmp_path / "u.npy")
    assert run.epochs.tolist() == [0, 1, 2]
    assert np.array_equal(np.asarray(run.outputs)[:, 0, 0], [0, 1, 2])


# ----------------------------------------------------- torch: dict batches, summaries
class KeywordModel(torch.nn.Module):
    """A model called with keyword arguments, returning an object with ``.logits``."""

    def __init__(self, d=8, c=4):
        super().__init__()
        self.lin = torch.nn.Linear(d, c)

    def forward(self, features, scale=None):
        return types.SimpleNamespace(logits=self.lin(features) * scale[:, None])


def dict_batches(x, y, size=64, label_key="labels"):
    return [{"features": x[i:i + size], "scale": torch.ones(len(x[i:i + size])),
             label_key: y[i:i + size]} for i in range(0, len(x), size)]


def toy(n=300, d=8, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


def test_dict_batches_go_to_the_model_as_keywords(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    x, y = toy()
    model = KeywordModel()
    for key in ("labels", "label"):
        rec = LogitRecorder(tmp_path / f"{key}.npy", dict_batches(x, y, label_key=key),
                            dtype="float32", label_key=key)
        acc = rec.record(model, 0)
        rec.close()
        with torch.no_grad():
            expected = model.lin(x).numpy()
        assert np.array_equal(np.asarray(fk.load(tmp_path / f"{key}.npy").outputs[0]), expected)
        assert acc == pytest.approx(np.mean(expected.argmax(1) == y.numpy()))
    with pytest.raises(ValueError, match=r"labels under label_key='target'; got keys \["):
        LogitRecorder(tmp_path / "k.npy", dict_batches(x, y), label_key="target").record(model, 0)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_torch_summary_recorder_equals_the_summary_of_the_full_run(tmp_path, dtype):
    from forgetkit.exporters.torch import LogitRecorder

    x, y = toy(c=6)
    with LogitRecorder(tmp_path / "full.npy", (x, y), dtype=dtype, batch_size=70) as full, \
            LogitRecorder(tmp_path / "sum.npy", (x, y), dtype=dtype, batch_size=70,
                          summary=True) as summ:
        for epoch in range(3):
            model = torch.nn.Linear(8, 6)
            assert full.record(model, epoch) == summ.record(model, epoch)
    run, summary = fk.load(tmp_path / "full.npy"), fk.load(tmp_path / "sum.npy")
    assert summary.kind == "summary" and summary.shape == run.shape
    assert np.array_equal(summary.correctness(), run.correctness())
    assert np.array_equal(summary.label_margins(), run.label_margins())
    np.testing.assert_allclose(summary.label_probs(), run.label_probs(), rtol=1e-5)
    with pytest.raises(ValueError, match="summary=True writes a .npy summary"):
        LogitRecorder(tmp_path / "s.parquet", (x, y), summary=True)


def test_resuming_matches_samples_by_id(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    x, y = toy()
    ids = np.arange(300) * 7
    model = torch.nn.Linear(8, 4)
    with LogitRecorder(tmp_path / "r.npy", (x, y), dtype="float32", sample_ids=ids) as rec:
        rec.record(model, 0)
    perm = np.random.default_rng(1).permutation(300)
    with LogitRecorder(tmp_path / "r.npy", (x[perm], y[perm]), dtype="float32",
                       sample_ids=ids[perm]) as rec:  # the same samples in another order
        rec.record(model, 1)
    run = fk.load(tmp_path / "r.npy")
    assert np.array_equal(run.sample_ids, ids) and np.array_equal(run.labels, y.numpy())
    assert np.array_equal(np.asarray(run.outputs[1]), np.asarray(run.outputs[0]))
    with pytest.raises(ValueError, match=r"holds other samples than this recording"):
        LogitRecorder(tmp_path / "r.npy", (x, y), sample_ids=ids + 1).record(model, 2)
    with pytest.raises(ValueError, match="has label"):
        LogitRecorder(tmp_path / "r.npy", (x, (y + 1) % 4), sample_ids=ids).record(model, 2)
    with pytest.raises(ValueError, match="epoch 1 is not after the last recorded epoch 1"):
        LogitRecorder(tmp_path / "r.npy", (x, y), dtype="float32",
                      sample_ids=ids).record(model, 1)


# ------------------------------------------------------------ torch.distributed
DDP_WORKER = textwrap.dedent("""
    import datetime, json, os, sys, types
    import numpy as np, torch, torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    import forgetkit as fk
    from forgetkit.exporters.torch import LogitRecorder

    rank, world, tmp, scenario = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg-{scenario}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    N, D, C = 301, 6, 5
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (N, D), generator=g).float()  # integer values: exact outputs
    y = torch.randint(0, C, (N,), generator=g)
    ds = TensorDataset(x, y)

    class Net(torch.nn.Module):
        def __init__(self, epoch, classes=C, bad=False):
            super().__init__()
            self.lin = torch.nn.Linear(D, classes)
            w = torch.randint(-2, 3, (classes, D), generator=torch.Generator().manual_seed(epoch))
            with torch.no_grad():
                self.lin.weight.copy_(w.float())
                self.lin.bias.zero_()
                if bad == "nan":
                    self.lin.weight[0, 0] = float("nan")
            self.bad = bad

        def forward(self, x=None, features=None):
            if self.bad == "raise":
                raise RuntimeError("out of memory on this rank")
            z = self.lin(x if x is not None else features)
            return types.SimpleNamespace(logits=z) if features is not None else z

    results = {}

    def attempt(name, fn):
        try:
            results[name] = fn()
        except Exception as err:
            results[name] = f"{type(err).__name__}: {err}"

    def record(path, data, epochs, model=Net, **options):
        with LogitRecorder(f"{tmp}/{path}", data, **options) as rec:
            return [rec.record(model(e), e) for e in epochs]

    if scenario == "main":
        plain = DataLoader(ds, batch_size=64)  # the README's usage, unchanged
        attempt("plain", lambda: record("plain.npy", plain, [0, 1]))
        sampler = DataLoader(ds, batch_size=50, sampler=DistributedSampler(ds, shuffle=False))
        attempt("sampler", lambda: record("sampler.parquet", sampler, [0, 1],
                                          sample_ids=np.arange(N) * 10))
        dicts = [{"features": x[i:i + 40], "labels": y[i:i + 40]} for i in range(0, N, 40)]
        attempt("dict_summary", lambda: record("dict_summary.npy", dicts, [0, 1],
                                               summary=True))
        attempt("classes", lambda: record("plain.npy", plain, [2],
                                          model=lambda e: Net(e, classes=C + rank)))
        mine = DataLoader(TensorDataset(x[: N - rank], y[: N - rank]), batch_size=64)
        attempt("samples", lambda: record("samples.npy", mine, [0]))
        same = DataLoader(ds, batch_size=50, sampler=DistributedSampler(
            ds, num_replicas=2, rank=0, shuffle=False))
        attempt("duplicates", lambda: record("dup.npy", same, [0]))
        short = DataLoader(ds, batch_size=50, sampler=DistributedSampler(
            ds, shuffle=False, drop_last=True))
        attempt("missing", lambda: record("missing.npy", short, [0]))
        attempt("nan", lambda: record("plain.npy", plain, [2],
                                      model=lambda e: Net(e, bad="nan" if rank else False)))
        attempt("raises", lambda: record("plain.npy", plain, [2],
                                         model=lambda e: Net(e, bad="raise" if rank else False)))
        normed = torch.nn.Sequential(Net(0).lin, torch.nn.BatchNorm1d(C))
        with torch.no_grad():
            normed[1].running_mean.fill_(2.0 * rank)  # DDP ranks' statistics drift apart

        def buffers():
            record("buffers.npy", plain, [0], model=lambda e: normed, dtype="float32")
            return float(normed[1].running_mean[0])  # this rank's own, put back

        attempt("buffers", buffers)
    else:  # rank 1 dies before the third epoch's gather
        rec = LogitRecorder(f"{tmp}/death.npy", DataLoader(ds, batch_size=64))
        rec.record(Net(0), 0)
        rec.record(Net(1), 1)
        if rank == 1:
            os._exit(0)
        attempt("death", lambda: rec.record(Net(2), 2))
        rec.close()
    with open(f"{tmp}/{scenario}-{rank}.json", "w") as f:
        json.dump(results, f)
    # torch requires it: without it gloo's threads may abort the process at exit
    dist.destroy_process_group()
""")


def reference_outputs(epochs, dtype=np.float16):
    """The DDP worker's model outputs on all 301 samples, computed in one process."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (301, 6), generator=g).float()
    y = torch.randint(0, 5, (301,), generator=g)
    out = []
    for e in epochs:
        w = torch.randint(-2, 3, (5, 6), generator=torch.Generator().manual_seed(e)).float()
        out.append((x @ w.T).numpy().astype(dtype))
    return np.stack(out), y.numpy(), x, w


def run_ranks(tmp_path, scenario, world=2):
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), str(tmp_path),
                               scenario], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    for r, (p, err) in enumerate(zip(procs, errors, strict=True)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{err[-3000:]}"
    return [json.loads((tmp_path / f"{scenario}-{r}.json").read_text()) for r in range(world)
            if (tmp_path / f"{scenario}-{r}.json").exists()]


def test_torch_distributed_two_ranks_write_each_sample_once(tmp_path):
    from forgetkit.exporters.torch import LogitRecorder

    results = run_ranks(tmp_path, "main")
    expected, y, x, _ = reference_outputs([0, 1])
    accuracy = [float(np.mean(expected[e].argmax(1) == y)) for e in range(2)]
    for r in results:  # every rank returns the accuracy over all samples
        for name in ("plain", "sampler", "dict_summary"):
            assert r[name] == pytest.approx(accuracy), (name, r[name])
    plain = fk.load(tmp_path / "plain.npy")
    assert plain.shape == (2, 301, 5) and plain.sample_ids is None
    assert np.array_equal(np.asarray(plain.outputs), expected)
    assert np.array_equal(plain.labels, y)
    sampler = fk.load(tmp_path / "sampler.parquet")  # 301 samples, padded to 302: one dropped
    assert np.array_equal(np.asarray(sampler.outputs), expected)
    assert np.array_equal(sampler.sample_ids, np.arange(301) * 10)
    summary = fk.load(tmp_path / "dict_summary.npy")
    assert summary.kind == "summary"
    assert np.array_equal(summary.correctness(), plain.correctness())
    assert np.array_equal(summary.label_margins(), plain.label_margins())
    # bad input: the same clear error on both ranks, nothing written for that epoch
    for name, message in (
            ("classes", "ranks disagree on the number of classes (rank: classes {0: 5, 1: 6})"),
            ("samples", "ranks disagree on the number of samples to record (rank: samples "
                        "{0: 301, 1: 300})"),
            ("duplicates", "were evaluated by several ranks (151 duplicates; the sampler pads "
                           "1)"),
            ("missing", "no rank evaluated samples [300] (1 of 301 missing"),
            ("nan", "outputs of epoch 2 contain NaN or inf (on ranks [1])"),
            ("raises", "rank 1 failed while evaluating its shard (RuntimeError: out of memory")):
        assert message in results[0][name] and results[0][name].startswith("ForgetkitError"), \
            results[0][name]
        assert results[1][name].startswith("ForgetkitError") or name == "raises"
    assert results[1]["classes"] == results[0]["classes"]
    assert results[1]["raises"] == "RuntimeError: out of memory on this rank"
    assert not (tmp_path / "samples.npy").exists() and not (tmp_path / "dup.npy").exists()
    assert fk.load(tmp_path / "plain.npy").epochs.tolist() == [0, 1]
    # every shard evaluated with rank 0's batch-norm statistics; each rank keeps its own
    assert [r["buffers"] for r in results] == [0.0, 2.0]
    bn = torch.nn.BatchNorm1d(5).eval()
    with torch.no_grad():
        normed = bn(torch.as_tensor(expected[0], dtype=torch.float32)).numpy()
    assert np.array_equal(np.asarray(fk.load(tmp_path / "buffers.npy").outputs[0]), normed)
    # resuming with another world size: epoch 2 from one process
    three, _, _, w = reference_outputs([0, 1, 2])
    model = torch.nn.Linear(6, 5)
    with torch.no_grad():
        model.weight.copy_(w)
        model.bias.zero_()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.as_tensor(y)),
                                         batch_size=100)
    with LogitRecorder(tmp_path / "plain.npy", loader) as rec:
        rec.record(model, 2)
    assert np.array_equal(np.asarray(fk.load(tmp_path / "plain.npy").outputs), three)


def test_a_rank_dying_mid_gather_times_out_and_keeps_earlier_epochs(tmp_path):
    results = run_ranks(tmp_path, "death")
    assert len(results) == 1 and results[0]["death"].startswith("TimeoutError: epoch 2: "), \
        results
    assert "a rank may have died" in results[0]["death"]
    run = fk.load(tmp_path / "death.npy")
    assert run.epochs.tolist() == [0, 1]
    assert np.array_equal(np.asarray(run.outputs), reference_outputs([0, 1])[0])


# ------------------------------------------------------------------ Lightning DDP
LIGHTNING_DDP = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    import lightning.pytorch as pl
    import forgetkit as fk
    from forgetkit.exporters.torch import LogitRecorder

    tmp = sys.argv[1]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(203, 8, generator=g), torch.randint(0, 3, (203,), generator=g)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.lin(x)

        def training_step(self, batch, _):
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(x, y)
    test = torch.utils.data.DataLoader(data, batch_size=32)
    recorder = LogitRecorder(f"{tmp}/lightning.npy", test, dtype="float32", mode="w")
    torch.manual_seed(0)
    module = Module()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp",
                         callbacks=[recorder.lightning_callback()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=32))
    with open(f"{tmp}/epochs-{trainer.global_rank}.json", "w") as f:
        json.dump(recorder.epochs, f)  # what each rank wrote
    if trainer.global_rank == 0:
        with torch.no_grad():
            final = module(x).numpy()
        run = fk.load(f"{tmp}/lightning.npy")
        json.dump({"shape": list(run.shape), "epochs": run.epochs.tolist(),
                   "labels": bool(np.array_equal(run.labels, y.numpy())),
                   "max_diff": float(np.abs(np.asarray(run.outputs[-1]) - final).max()),
                   "world": trainer.world_size}, open(f"{tmp}/lightning.json", "w"))
""")


def test_lightning_ddp_callback_writes_each_sample_once(tmp_path):
    import_real_part("lightning", "PyTorch Lightning (pip install forgetkit[lightning])")
    script = tmp_path / "fit.py"
    script.write_text(LIGHTNING_DDP)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "lightning.json").read_text())
    assert result["world"] == 2 and result["shape"] == [2, 203, 3]
    assert result["epochs"] == [0, 1] and result["labels"]
    assert result["max_diff"] < 1e-5  # rank 0's final model on all 203 samples
    assert json.loads((tmp_path / "epochs-0.json").read_text()) == [0, 1]
    assert json.loads((tmp_path / "epochs-1.json").read_text()) == []  # rank 1 wrote nothing


# ------------------------------------------------------------- Hugging Face Trainer
class TokenDataset(torch.utils.data.Dataset):
    """Random token ids of a tiny vocabulary (no tokenizer, no download)."""

    def __init__(self, n, seed, length=12, vocab=40, classes=3):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, vocab, (n, length), generator=g)
        self.mask = torch.ones(n, length, dtype=torch.long)
        self.mask[: n // 2, length - 3:] = 0
        self.labels = torch.randint(0, classes, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i],
                "labels": self.labels[i], "unused_column": 7}


def tiny_bert(transformers, seed=0):
    """A one-layer BERT classifier of 3 classes over a 40-token vocabulary."""
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, num_labels=3)
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(config)


def train_recording(transformers, out, path, *, save_strategy="no"):
    """tiny_bert trained 2 epochs by a Trainer (output_dir ``out``) whose
    LogitRecorderCallback records its eval set (37 samples, batches of 10) to ``path``;
    returns (model, eval set, callback)."""
    from forgetkit.exporters.huggingface import LogitRecorderCallback

    model = tiny_bert(transformers)
    train, test = TokenDataset(64, seed=1), TokenDataset(37, seed=2)
    args = transformers.TrainingArguments(
        output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=16,
        per_device_eval_batch_size=10, learning_rate=1e-3, report_to=[],
        save_strategy=save_strategy, logging_strategy="no", use_cpu=True, disable_tqdm=True)
    callback = LogitRecorderCallback(path, test, dtype="float32")
    transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test,
                         callbacks=[callback]).train()
    return model, test, callback


def test_huggingface_trainer_callback_records_the_eval_dataset(tmp_path):
    transformers = import_real_part("transformers", "transformers (pip install "
                                    "forgetkit[huggingface])")
    model, test, callback = train_recording(transformers, tmp_path / "out", tmp_path / "hf.npy")
    run = fk.load(tmp_path / "hf.npy")
    assert run.shape == (2, 37, 3) and run.epochs.tolist() == [0, 1]
    assert np.array_equal(run.labels, test.labels.numpy())
    model.eval()
    with torch.no_grad():
        final = model(input_ids=test.ids, attention_mask=test.mask).logits.numpy()
    np.testing.assert_allclose(np.asarray(run.outputs[-1]), final, atol=1e-5)
    assert callback.accuracy_[-1] == pytest.approx(np.mean(final.argmax(1) == test.labels.numpy()))


TRAINER_DDP = textwrap.dedent("""
    import json, sys
    import numpy as np, torch, transformers
    import forgetkit as fk
    from forgetkit.exporters.huggingface import LogitRecorderCallback

    tmp = sys.argv[1]

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.ids = torch.randint(2, 40, (n, 8), generator=g)
            self.labels = self.ids[:, 0] % 3

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.labels[i]}

    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    test = Tokens(41, seed=2)
    args = transformers.TrainingArguments(
        output_dir=f"{tmp}/out", num_train_epochs=2, per_device_train_batch_size=16,
        per_device_eval_batch_size=8, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, disable_tqdm=True)
    callback = LogitRecorderCallback(f"{tmp}/trainer.npy", test, dtype="float32")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(64, seed=1),
                                   eval_dataset=test, callbacks=[callback])
    trainer.train()
    model.eval()
    with torch.no_grad():
        final = model(input_ids=test.ids).logits.numpy()
    with open(f"{tmp}/rank{trainer.args.process_index}.json", "w") as f:
        json.dump({"world": trainer.args.world_size, "epochs": callback.recorder.epochs,
                   "accuracy": callback.accuracy_, "final": final.tolist()}, f)
""")


def test_huggingface_trainer_on_two_processes_writes_each_sample_once(tmp_path):
    import_real_part("transformers", "transformers (pip install forgetkit[huggingface])")
    script = tmp_path / "train.py"
    script.write_text(TRAINER_DDP)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["epochs"] == [0, 1] and ranks[1]["epochs"] == []  # rank 1 wrote nothing
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]
    run = fk.load(tmp_path / "trainer.npy")
    assert run.shape == (2, 41, 3) and run.sample_ids is None
    np.testing.assert_allclose(np.asarray(run.outputs[-1]), ranks[0]["final"], atol=1e-5)


# ----------------------------------------------------------------------- Keras 3
def test_keras_callback_records_pairs_and_batches(tmp_path):
    os.environ.setdefault("KERAS_BACKEND", "torch")  # no TensorFlow: PyTorch runs Keras
    keras = import_real_part("keras", "Keras 3 (pip install forgetkit[keras])")
    from forgetkit.exporters.keras import LogitRecorderCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    y = rng.integers(0, 3, 120)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pair = LogitRecorderCallback(tmp_path / "pair.npy", (x, y), dtype="float32")
    onehot = np.eye(3)[y]
    batches = LogitRecorderCallback(tmp_path / "batches.npy",
                                    [(x[i:i + 50], onehot[i:i + 50]) for i in range(0, 120, 50)],
                                    dtype="float32", summary=True)
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[pair, batches])
    run, summary = fk.load(tmp_path / "pair.npy"), fk.load(tmp_path / "batches.npy")
    assert run.shape == (2, 120, 3) and run.epochs.tolist() == [0, 1]
    final = model.predict(x, verbose=0)
    np.testing.assert_allclose(np.asarray(run.outputs[-1]), final, atol=1e-6)
    assert np.array_equal(run.labels, y) and np.array_equal(summary.labels, y)
    assert np.array_equal(summary.correctness(), run.correctness())
    assert pair.accuracy_[-1] == pytest.approx(np.mean(final.argmax(1) == y))


# ----------------------------------------------------------- JAX on 2 devices
JAX_SHARDED = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import forgetkit as fk
    from forgetkit.exporters.jax import LogitRecorder

    tmp = sys.argv[1]
    assert jax.device_count() == 2, jax.devices()
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), P("batch"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = rng.integers(0, 4, 256)
    w = rng.normal(size=(8, 4)).astype(np.float32)
    batches = [(jax.device_put(x[i:i + 64], sharding), y[i:i + 64]) for i in range(0, 256, 64)]

    def apply_fn(params, inputs):
        return jnp.tanh(inputs) @ params

    one_device = jax.jit(apply_fn)
    sharded = jax.jit(apply_fn)(w, batches[0][0])
    assert len(sharded.sharding.device_set) == 2, sharded.sharding
    for summary in (False, True):
        with LogitRecorder(f"{tmp}/j{summary}.npy", batches, apply_fn, dtype="float32",
                           summary=summary) as rec:
            for e in range(2):
                rec.record(jnp.asarray(w * (e + 1)), e)
    expected = np.stack([np.asarray(one_device(jax.device_put(w * (e + 1), jax.devices()[0]),
                                               jax.device_put(x, jax.devices()[0])))
                         for e in range(2)])
    run, summary = fk.load(f"{tmp}/jFalse.npy"), fk.load(f"{tmp}/jTrue.npy")
    np.testing.assert_allclose(np.asarray(run.outputs), expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(run.labels, y) and np.array_equal(summary.labels, y)
    assert np.array_equal(summary.correctness(), fk.summarize(run).correctness())
    print("ok")
""")


def test_jax_outputs_sharded_over_two_devices(tmp_path):
    import_real_part("jax", "JAX (pip install forgetkit[jax])")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", JAX_SHARDED, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("summary", [False, True])
def test_durable_false_reaches_the_writer_and_the_sidecar_is_plain_json(tmp_path, monkeypatch,
                                                                         summary):
    """``durable=False`` on the recorder: no fsync of the run's file; the sidecar, written
    from its cached encoding, is what json.dumps of the record gives."""
    from forgetkit.exporters.torch import LogitRecorder

    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(20, 4), torch.arange(20) % 3
    path = tmp_path / "run.npy"
    for durable in (False, True):
        synced.clear()
        with LogitRecorder(path, (x, y), batch_size=8, summary=summary, mode="w",
                           durable=durable, meta={"seed": 1}) as rec:
            for epoch in range(3):
                rec.record(model, epoch)
        assert bool(synced) == durable
    sidecar = tmp_path / "run.forgetkit.json"
    record = json.loads(sidecar.read_text())
    assert sidecar.read_text() == json.dumps(record)
    assert record["epochs"] == [0, 1, 2] and record["labels"] == y.tolist()
    assert record["meta"] == {"seed": 1}
    run = fk.load(path)
    assert run.n_epochs == 3 and run.kind == ("summary" if summary else "logits")
