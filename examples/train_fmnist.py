"""Train a CNN or ResNet-18 on Fashion-MNIST and record its test logits every epoch.

The test-set logits go through forgetkit's PyTorch exporter into a run file; afterwards the
script prints forgetkit's forgetting analysis and the KF comparison of that run.

    python examples/train_fmnist.py --epochs 3 --model cnn --out runs/cnn.npy          # CPU
    python examples/train_fmnist.py --epochs 40 --model resnet18 --noise 0.2 \\
        --out runs/resnet18_sym20.npy --train-out runs/resnet18_sym20_train.npy      # GPU

Data: the IDX files of Debian's ``dataset-fashion-mnist`` (or ``--data DIR``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import forgetkit as fk
from forgetkit import noise
from forgetkit.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from forgetkit.exporters.torch import LogitRecorder


class SmallCNN(nn.Module):
    def __init__(self, width=32, n_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * 7 * 7, n_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 with one input channel."""

    def __init__(self, width=64, n_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**i
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, n_classes)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


def to_tensor(images, device):
    x = torch.tensor(images, dtype=torch.float32, device=device).unsqueeze(1) / 255.0
    return (x - 0.2860) / 0.3530


def augment(x):
    """Random crop (padding 2) and horizontal flip, on the device."""
    n = x.shape[0]
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    i, j = np.random.randint(0, 5, 2)  # noqa: NPY002
    x = padded[:, :, i:i + 28, j:j + 28]
    flip = torch.rand(n, device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(3), x)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "resnet18"), default="cnn")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--wd", type=float, default=5e-4)
    p.add_argument("--noise", type=float, default=0.0, help="fraction of noisy train labels")
    p.add_argument("--noise-kind", choices=("sym", "asym"), default="sym")
    p.add_argument("--train-subset", type=int, default=None, help="train on the first n")
    p.add_argument("--out", required=True, help="run file for the test logits (.npy/.parquet)")
    p.add_argument("--train-out", help="also record the (noisy-labelled) training set here")
    p.add_argument("--train-record-n", type=int, default=None,
                   help="record only the first n training samples (default: all)")
    p.add_argument("--data", default=None, help="folder of the Fashion-MNIST IDX files")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-checkpoints", metavar="DIR",
                   help="also save the model's state dict after every epoch as "
                        "DIR/epoch_<e>.pt (for replay and weight averages)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002  (the crop offsets of augment())
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    x_train, y_train = load_fashion_mnist("train", args.data)
    x_test, y_test = load_fashion_mnist("test", args.data)
    if args.train_subset:
        x_train, y_train = x_train[: args.train_subset], y_train[: args.train_subset]
    mask = np.zeros(len(y_train), bool)
    if args.noise > 0:
        if args.noise_kind == "sym":
            y_train, mask = noise.symmetric(y_train, args.noise, 10, seed=args.seed)
        else:
            y_train, mask = noise.asymmetric(y_train, args.noise, (np.arange(10) + 1) % 10,
                                             seed=args.seed)
    xtr, ytr = to_tensor(x_train, dev), torch.as_tensor(y_train, device=dev)
    xte, yte = to_tensor(x_test, dev), torch.as_tensor(y_test, device=dev)

    width = args.width or (64 if args.model == "resnet18" else 32)
    model = (ResNet18 if args.model == "resnet18" else SmallCNN)(width).to(dev)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.wd,
                          nesterov=True)
    steps = args.epochs * ((len(xtr) + args.batch_size - 1) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=steps)

    meta = dict(vars(args), dataset="fashion-mnist (Debian dataset-fashion-mnist)",
                n_train=len(xtr), device_name=torch.cuda.get_device_name(dev)
                if dev.type == "cuda" else "cpu", torch=torch.__version__)
    recorder = LogitRecorder(args.out, (xte, yte), batch_size=2048, meta=meta, mode="w",
                             class_names=FASHION_MNIST_CLASSES)
    train_rec = None
    if args.train_out:
        n = args.train_record_n or len(xtr)
        train_rec = LogitRecorder(args.train_out, (xtr[:n], ytr[:n]), batch_size=2048, mode="w",
                                  meta=dict(meta, noise_mask=np.flatnonzero(mask[:n]).tolist()))
    t0 = time.time()
    record_seconds = 0.0
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xtr), device=dev)
        for i in range(0, len(xtr), args.batch_size):
            idx = perm[i: i + args.batch_size]
            loss = F.cross_entropy(model(augment(xtr[idx])), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        t = time.time()
        if args.save_checkpoints:
            Path(args.save_checkpoints).mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), Path(args.save_checkpoints) / f"epoch_{epoch}.pt")
        acc = recorder.record(model, epoch)
        if train_rec is not None:
            train_rec.record(model, epoch)
        record_seconds += time.time() - t
        print(f"epoch {epoch + 1}/{args.epochs} loss {loss.item():.3f} test acc {acc:.4f} "
              f"({time.time() - t0:.0f}s)", flush=True)
    recorder.close()
    if train_rec is not None:
        train_rec.close()
    seconds = time.time() - t0

    run = fk.load(args.out)
    s = fk.analysis.summary(run)
    result = {"seconds": seconds, "record_seconds": record_seconds,
              "final_accuracy": s["final_accuracy"], "best_accuracy": s["best_accuracy"],
              "max_forget_fraction": s["max_forget_fraction"],
              "max_forget_epoch": s["max_forget_epoch"], "ever_forgotten": s["ever_forgotten"]}
    if run.n_epochs >= 2:
        table = fk.compare(run, methods=["single", "kf1", "kf", "horizontal", "likelihood"])
        print(fk.format_table(table))
        result["kf_gain_pp"] = float(table.loc["kf", "gain"])
        result["kf_gain_se"] = float(table.loc["kf", "gain_se"])
        result["kf_k"] = float(table.loc["kf", "k"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
