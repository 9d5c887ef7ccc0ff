"""GPU overhead of recording a run while it trains: ResNet-18 on Fashion-MNIST.

Trains the same model from the same seed under each configuration, a few epochs each:

- ``none``: training only;
- ``eval``: training, then the 10,000 test images evaluated every epoch in the loop (the
  forward pass and an accuracy, what any loop that reports test accuracy pays);
- ``record``: training, then ``LogitRecorder.record`` on the 10,000 test images every
  epoch (float16 logits to a .npy run; the copy to the host and the write on the
  recorder's background thread; durable: every epoch fsync'd);
- ``record_nodurable``: the same with ``durable=False`` (no fsync: the operating system
  flushes when it likes), to separate the cost of the fsyncs;
- ``summary``: the same as ``record`` with ``summary=True`` (label logit, largest other, lse).

``--no-durable`` records every configuration without fsync (``record`` then equals
``record_nodurable``); ``--configs`` picks configurations.

Configurations alternate round by round (none, eval, record, record_nodurable, summary,
none, ...) so that
clock drift hits all of them alike. Epoch times exclude each run's first epoch (cuDNN
autotuning, allocator warm-up). Prints the mean epoch time of each configuration, the time
spent inside ``record`` on the training thread, and the overhead of recording in percent
against training alone and against evaluating in the loop (goal: at most 2%); writes every
figure to ``<out>/gpu_recording_overhead.json``.

    python bench/gpu_recording_overhead.py --out out/overhead              # 4 epochs x 2 rounds
    python bench/gpu_recording_overhead.py --epochs 6 --rounds 3 --out out/overhead
    python bench/gpu_recording_overhead.py --device cpu --train-subset 512 --test-subset 256 \
        --epochs 2 --rounds 1 --out out/smoke                      # a check that it runs

Needs: torch with CUDA, Fashion-MNIST's IDX files (--data, default
/usr/share/datasets/fashion-mnist).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from train_fmnist import ResNet18, augment, to_tensor  # noqa: E402

import forgetkit as fk  # noqa: E402
from forgetkit.datasets import load_fashion_mnist  # noqa: E402
from forgetkit.exporters.torch import LogitRecorder  # noqa: E402

CONFIGS = ("none", "eval", "record", "record_nodurable", "summary")
RECORDING = ("record", "record_nodurable", "summary")


def sync(dev):
    """Wait for the device's queued work (CUDA), so that epoch times are complete."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train_run(config, data, args, out):
    """Train one run under ``config``; return per-epoch seconds and seconds in record()."""
    xtr, ytr, xte, yte = data
    dev = xtr.device
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002  (augment's crop offsets)
    model = ResNet18().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4,
                          nesterov=True)
    steps = args.epochs * ((len(xtr) + args.batch_size - 1) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=steps)
    recorder = None
    if config in RECORDING:
        durable = config != "record_nodurable" and not args.no_durable
        recorder = LogitRecorder(out / f"{config}.npy", (xte, yte), batch_size=args.eval_batch,
                                 summary=config == "summary", mode="w", durable=durable)
    epoch_seconds, record_seconds, accuracy = [], [], []
    sync(dev)
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train()
        perm = torch.randperm(len(xtr), device=dev)
        for i in range(0, len(xtr), args.batch_size):
            idx = perm[i:i + args.batch_size]
            loss = F.cross_entropy(model(augment(xtr[idx])), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        t = time.perf_counter()
        if config == "eval":
            model.eval()
            with torch.inference_mode():
                correct = sum(int((model(xte[i:i + args.eval_batch]).argmax(1)
                                   == yte[i:i + args.eval_batch]).sum())
                              for i in range(0, len(xte), args.eval_batch))
            accuracy.append(correct / len(xte))
        elif recorder is not None:
            accuracy.append(recorder.record(model, epoch))
        record_seconds.append(time.perf_counter() - t)
        sync(dev)
        epoch_seconds.append(time.perf_counter() - start)
    t = time.perf_counter()
    if recorder is not None:
        recorder.close()
    close_seconds = time.perf_counter() - t
    return {"epoch_seconds": epoch_seconds, "in_loop_seconds": record_seconds,
            "close_seconds": close_seconds, "accuracy": accuracy,
            "final_loss": float(loss.item())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the runs and the JSON results")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-batch", type=int, default=2048)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--train-subset", type=int, default=None, help="train on the first n")
    p.add_argument("--test-subset", type=int, default=None, help="record the first n")
    p.add_argument("--no-durable", action="store_true",
                   help="record without fsync in every configuration (durable=False)")
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS),
                   help="configurations to run (none and eval are always run)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(args.device)
    x_train, y_train = load_fashion_mnist("train", args.data)
    x_train, y_train = x_train[: args.train_subset], y_train[: args.train_subset]
    x_test, y_test = load_fashion_mnist("test", args.data)
    x_test, y_test = x_test[: args.test_subset], y_test[: args.test_subset]
    data = (to_tensor(x_train, dev), torch.as_tensor(y_train, device=dev),
            to_tensor(x_test, dev), torch.as_tensor(y_test, device=dev))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, "
          f"{args.epochs} epochs x {args.rounds} rounds per configuration", flush=True)
    configs = [c for c in CONFIGS if c in ("none", "eval") or c in args.configs]
    runs = {c: [] for c in configs}
    for r in range(args.rounds):
        for config in configs:
            result = train_run(config, data, args, out)
            runs[config].append(result)
            times = " ".join(f"{s:.3f}" for s in result["epoch_seconds"])
            acc = result["accuracy"][-1] if result["accuracy"] else float("nan")
            print(f"round {r} {config:8s} epochs (s): {times}  in-loop eval/record (s): "
                  f"{sum(result['in_loop_seconds']):.3f}  close {result['close_seconds']:.3f}s "
                  f"test acc {acc:.4f}", flush=True)
    summary = {}
    for config, results in runs.items():
        steady = [s for res in results for s in res["epoch_seconds"][1:]]
        in_loop = [s for res in results for s in res["in_loop_seconds"][1:]]
        summary[config] = {"mean_epoch_s": statistics.mean(steady),
                           "median_epoch_s": statistics.median(steady),
                           "stdev_epoch_s": statistics.stdev(steady) if len(steady) > 1 else 0,
                           "mean_in_loop_s": statistics.mean(in_loop)}
    base, evaluated = summary["none"]["mean_epoch_s"], summary["eval"]["mean_epoch_s"]
    for config in configs[1:]:
        s = summary[config]
        s["overhead_vs_none_pct"] = 100 * (s["mean_epoch_s"] - base) / base
        s["overhead_vs_eval_pct"] = 100 * (s["mean_epoch_s"] - evaluated) / evaluated
    print("\nconfiguration     mean epoch (s)  median  stdev   in record()/eval (s)  "
          "vs none (%)  vs eval (%)")
    for config, s in summary.items():
        print(f"{config:16s}  {s['mean_epoch_s']:11.4f}  {s['median_epoch_s']:.4f}  "
              f"{s['stdev_epoch_s']:.4f}  {s['mean_in_loop_s']:20.4f}  "
              f"{s.get('overhead_vs_none_pct', 0):11.2f}  {s.get('overhead_vs_eval_pct', 0):10.2f}")
    for config in (c for c in configs if c in RECORDING):
        run = fk.load(out / f"{config}.npy")
        print(f"{config}: stored {run.shape} {run.kind}, final accuracy "
              f"{fk.accuracy(run)[-1]:.4f}, file {(out / f'{config}.npy').stat().st_size} bytes")
    for config in (c for c in configs if c in RECORDING):
        print(f"\n{config} overhead: {summary[config]['overhead_vs_none_pct']:.2f}% of a "
              f"training epoch against training alone, "
              f"{summary[config]['overhead_vs_eval_pct']:.2f}% against evaluating the test set "
              f"in the loop (goal: at most 2%)")
    (out / "gpu_recording_overhead.json").write_text(json.dumps(
        {"args": vars(args), "device": name,
         "torch": torch.__version__, "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
