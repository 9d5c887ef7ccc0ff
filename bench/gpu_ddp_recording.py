"""Recording under torch.distributed on GPUs (NCCL), checked against a single-process
recording of the same models.

    torchrun --nproc_per_node 2 bench/gpu_ddp_recording.py --out out/ddp
    torchrun --nproc_per_node 2 bench/gpu_ddp_recording.py --part trainer --out out/ddp
    torchrun --nproc_per_node 2 bench/gpu_ddp_recording.py --device cpu --train-subset 1000 \
        --test-subset 1001 --epochs 2 --out out/ddp_smoke          # a check that it runs (gloo)

``--part ddp`` (default): a SmallCNN (examples/train_fmnist.py) trains with
DistributedDataParallel on Fashion-MNIST (each rank its DistributedSampler share of the
training images) for --epochs epochs. After every epoch every rank calls ``record`` on

- ``ddp_plain.npy``: the README's usage unchanged: a DataLoader (shuffle=False) over the
  10,000 test images, which the recorder shards itself;
- ``ddp_sampler.parquet``: a DataLoader with DistributedSampler(shuffle=False) over all test
  images but the last (9,999, padded to 10,000: one duplicate to drop);
- ``ddp_summary.npy``: the plain loader with summary=True;

and rank 0 alone also records the full test set through a one-rank process group
(``single.npy``: the single-process reference). Rank 0 then compares the runs (shape,
labels, sample ids, values: exactly equal share and largest difference, correctness) and
prints one line per check; everything goes to <out>/ddp_check.json. Values may differ in
the last float16 bit where cuDNN picks other kernels for other batch shapes; correctness
should agree on (nearly) every sample.

``--part trainer``: a tiny BERT (no download) trains with transformers.Trainer under
torchrun for 2 epochs with forgetkit's LogitRecorderCallback on an eval set of 1,001
sequences; rank 0 checks that the run holds each sample once, in dataset order, and that
its last epoch matches the final model evaluated on rank 0 alone.

Needs: torch with CUDA and 2 GPUs, Fashion-MNIST (--data), transformers and accelerate for
--part trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from train_fmnist import SmallCNN, to_tensor  # noqa: E402

import forgetkit as fk  # noqa: E402
from forgetkit.datasets import load_fashion_mnist  # noqa: E402
from forgetkit.exporters.torch import LogitRecorder  # noqa: E402


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def compare(name, run, reference, checks):
    """Append to ``checks`` and print how ``run`` compares with ``reference``."""
    a, b = np.asarray(run.outputs, dtype=np.float64), np.asarray(reference.outputs, np.float64)
    same_shape = run.shape == reference.shape
    result = {"run": name, "shape": list(run.shape), "reference_shape": list(reference.shape),
              "labels_equal": bool(np.array_equal(run.labels, reference.labels)),
              "epochs": run.epochs.tolist()}
    if same_shape:
        result.update(exact_share=float(np.mean(a == b)), max_abs_diff=float(np.abs(a - b).max()),
                      correct_agreement=float(np.mean(run.correctness()
                                                      == reference.correctness())))
    checks.append(result)
    print(json.dumps(result), flush=True)


def part_ddp(args, out, rank, world, dev):
    solo = dist.new_group([0])  # every rank takes part in making it
    x_train, y_train = load_fashion_mnist("train", args.data)
    x_test, y_test = load_fashion_mnist("test", args.data)
    x_train, y_train = x_train[: args.train_subset], y_train[: args.train_subset]
    x_test, y_test = x_test[: args.test_subset], y_test[: args.test_subset]
    n_test = len(y_test)
    train = TensorDataset(to_tensor(x_train, "cpu"), torch.as_tensor(y_train))
    test = TensorDataset(to_tensor(x_test, "cpu"), torch.as_tensor(y_test))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        SmallCNN().to(dev), device_ids=[dev] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    train_loader = DataLoader(train, batch_size=128, sampler=sampler, pin_memory=True)
    plain = DataLoader(test, batch_size=1000, pin_memory=True)
    part = Subset(test, range(n_test - 1))
    sampled = DataLoader(part, batch_size=500, sampler=DistributedSampler(part, shuffle=False))
    recorders = {
        "ddp_plain": LogitRecorder(out / "ddp_plain.npy", plain, mode="w"),
        "ddp_sampler": LogitRecorder(out / "ddp_sampler.parquet", sampled, mode="w"),
        "ddp_summary": LogitRecorder(out / "ddp_summary.npy", plain, summary=True, mode="w"),
    }
    single = LogitRecorder(out / "single.npy", plain, group=solo, mode="w") if rank == 0 \
        else None
    timings = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        for x, y in train_loader:
            loss = F.cross_entropy(model(x.to(dev, non_blocking=True)), y.to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync(dev)
        t1 = time.perf_counter()
        accuracy = {name: rec.record(model, epoch) for name, rec in recorders.items()}
        sync(dev)
        t2 = time.perf_counter()
        if single is not None:
            accuracy["single"] = single.record(model, epoch)
        timings.append({"epoch": epoch, "train_s": t1 - t0, "record_3_runs_s": t2 - t1})
        print(f"rank {rank} epoch {epoch}: train {t1 - t0:.2f}s, 3 distributed recordings "
              f"{t2 - t1:.3f}s, accuracy {json.dumps(accuracy)}", flush=True)
    for rec in recorders.values():
        rec.close()
    files = sorted(p.name for p in out.iterdir())
    dist.barrier()
    if rank != 0:
        return None
    single.close()
    reference = fk.load(out / "single.npy")
    checks = []
    compare("ddp_plain", fk.load(out / "ddp_plain.npy"), reference, checks)
    sampled_run = fk.load(out / "ddp_sampler.parquet")
    compare("ddp_sampler", sampled_run, reference.isel(samples=np.arange(n_test - 1)), checks)
    summary = fk.load(out / "ddp_summary.npy")
    summarized = fk.summarize(reference)
    checks.append({"run": "ddp_summary", "kind": summary.kind, "shape": list(summary.shape),
                   "correct_agreement": float(np.mean(summary.correctness()
                                                      == summarized.correctness())),
                   "margin_max_abs_diff": float(np.abs(summary.label_margins()
                                                       - summarized.label_margins()).max()),
                   "bytes": (out / "ddp_summary.npy").stat().st_size,
                   "full_bytes": (out / "ddp_plain.npy").stat().st_size})
    print(json.dumps(checks[-1]), flush=True)
    return {"world": world, "timings": timings, "checks": checks, "files": files}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, 100, (n, 16), generator=g)
        self.labels = (self.ids[:, 0] % 3).long()  # learnable from the first token

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long),
                "labels": self.labels[i]}


def part_trainer(args, out, rank, world, dev):
    import transformers

    from forgetkit.exporters.huggingface import LogitRecorderCallback

    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    train, test = Tokens(4000, seed=1), Tokens(1001, seed=2)
    targs = transformers.TrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=2, per_device_train_batch_size=64,
        per_device_eval_batch_size=100, learning_rate=5e-4, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, use_cpu=dev.type == "cpu")
    callback = LogitRecorderCallback(out / "trainer.npy", test, dtype="float32", mode="w")
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=train,
                                   eval_dataset=test, callbacks=[callback])
    trainer.train()
    print(f"rank {rank}: recorded accuracy {callback.accuracy_}", flush=True)
    dist.barrier()
    if rank != 0:
        return None
    run = fk.load(out / "trainer.npy")
    model.eval()
    with torch.no_grad():
        final = torch.cat([model(input_ids=test.ids[i:i + 100].to(model.device)).logits.cpu()
                           for i in range(0, 1001, 100)]).numpy()
    result = {"world": world, "shape": list(run.shape), "epochs": run.epochs.tolist(),
              "labels_equal": bool(np.array_equal(run.labels, test.labels.numpy())),
              "max_abs_diff_final": float(np.abs(np.asarray(run.outputs[-1]) - final).max()),
              "accuracy": callback.accuracy_}
    print(json.dumps(result), flush=True)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--part", choices=("ddp", "trainer"), default="ddp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", default=None)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: gloo instead of NCCL (a check that the script runs)")
    p.add_argument("--train-subset", type=int, default=None)
    p.add_argument("--test-subset", type=int, default=None)
    args = p.parse_args(argv)
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "ddp":
        if dev.type == "cuda":
            dist.init_process_group("nccl", device_id=dev)
        else:
            dist.init_process_group("gloo")
    # the Trainer's accelerate initialises the process group itself
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    result = (part_ddp if args.part == "ddp" else part_trainer)(args, out, rank, world, dev)
    if result is not None:
        (out / f"{args.part}_check.json").write_text(json.dumps(result, indent=1))
        print(f"wrote {out / f'{args.part}_check.json'}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
