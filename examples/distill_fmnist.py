"""Self-distillation from Knowledge Fusion: a student trained on the fused soft targets of a
noisy run, against the run's own final network and the KF ensemble.

One command, end to end:

1. train a teacher (ResNet-18 by default) on Fashion-MNIST with symmetric label noise,
   recording the logits of the 10,000 test images and of every training image each epoch;
2. fit Knowledge Fusion on a random half of the test set (the paper's split, seed 0);
3. write the fused soft targets of the training set (`forgetkit.distill.write_soft_targets`,
   temperature T) to <out>/targets.parquet;
4. train a student of the same architecture from scratch on the noisy labels and those
   targets: loss = alpha * T^2 * KL(targets || softmax(z / T)) + (1 - alpha) * CE(z, noisy y);
5. print the test accuracy, on the other half of the test set, of the teacher's final
   network, the KF ensemble and the student (and the two networks on the whole test set).

    python examples/distill_fmnist.py --out runs/distill                           # GPU
    python examples/distill_fmnist.py --model cnn --epochs 2 --train-subset 2000 \\
        --device cpu --out runs/distill_smoke                                     # CPU check

Writes the runs, the plan, the targets and ``results.json`` under --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from train_fmnist import ResNet18, SmallCNN, augment, to_tensor  # examples/ is the folder

import forgetkit as fk
from forgetkit import noise
from forgetkit.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from forgetkit.exporters.torch import LogitRecorder
from forgetkit.fusion.distill import write_soft_targets


def make_model(args, dev):
    width = args.width or (64 if args.model == "resnet18" else 32)
    model = (ResNet18 if args.model == "resnet18" else SmallCNN)(width).to(dev)
    return model.to(memory_format=torch.channels_last)


def train(model, xtr, ytr, args, *, soft=None, recorders=()):
    """SGD with one-cycle learning rate; with ``soft`` (N, C) targets, the distillation loss.
    Every recorder records after every epoch. Returns the seconds taken."""
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4,
                          nesterov=True)
    steps = args.epochs * ((len(xtr) + args.batch_size - 1) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=steps)
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xtr), device=xtr.device)
        for i in range(0, len(xtr), args.batch_size):
            idx = perm[i:i + args.batch_size]
            logits = model(augment(xtr[idx]))
            loss = F.cross_entropy(logits, ytr[idx])
            if soft is not None:
                T = args.temperature
                kd = F.kl_div(F.log_softmax(logits / T, 1), soft[idx],
                              reduction="batchmean") * T * T
                loss = args.alpha * kd + (1 - args.alpha) * loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        acc = [rec.record(model, epoch) for rec in recorders]
        print(f"epoch {epoch + 1}/{args.epochs} loss {loss.item():.3f} recorded accuracy "
              f"{[round(a, 4) for a in acc]} ({time.time() - t0:.0f}s)", flush=True)
    for rec in recorders:
        rec.close()
    return time.time() - t0


def predict(model, x, batch=2048):
    model.eval()
    with torch.inference_mode():
        return torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for runs, plan, targets, results")
    p.add_argument("--model", choices=("cnn", "resnet18"), default="resnet18")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--noise", type=float, default=0.2, help="symmetric label noise")
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the distillation term")
    p.add_argument("--train-subset", type=int, default=None)
    p.add_argument("--data", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002  (augment's crop offsets)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    x_train, y_train = load_fashion_mnist("train", args.data)
    x_test, y_test = load_fashion_mnist("test", args.data)
    if args.train_subset:
        x_train, y_train = x_train[: args.train_subset], y_train[: args.train_subset]
    y_noisy, mask = noise.symmetric(y_train, args.noise, 10, seed=args.seed)
    xtr, ytr = to_tensor(x_train, dev), torch.as_tensor(y_noisy, device=dev)
    xte, yte = to_tensor(x_test, dev), torch.as_tensor(y_test, device=dev)
    meta = dict(vars(args), noise_mask=np.flatnonzero(mask).tolist())

    # 1. the noisy teacher, recording test and training logits every epoch
    teacher = make_model(args, dev)
    test_rec = LogitRecorder(out / "teacher_test.npy", (xte, yte), batch_size=2048, mode="w",
                             class_names=FASHION_MNIST_CLASSES, meta=dict(meta, split="test"))
    train_rec = LogitRecorder(out / "teacher_train.npy", (xtr, ytr), batch_size=2048,
                              mode="w", meta=dict(meta, split="train"))
    teacher_seconds = train(teacher, xtr, ytr, args, recorders=(test_rec, train_rec))

    # 2. Knowledge Fusion fitted on half the test set
    test_run = fk.load(out / "teacher_test.npy")
    val_idx, held_idx = fk.split_indices(test_run.n_samples, 0.5, seed=0)
    kf = fk.KnowledgeFusion().fit(test_run.isel(samples=val_idx))
    kf.to_json(out / "plan.json")
    held = test_run.isel(samples=held_idx)
    kf_pred = kf.predict(held)

    # 3. soft targets of the training set from the same plan
    train_run = fk.load(out / "teacher_train.npy")
    write_soft_targets(out / "targets.parquet", kf, train_run, temperature=args.temperature)
    table = pq.read_table(out / "targets.parquet")
    order = np.argsort(table.column("sample_id").to_numpy())
    soft = np.stack(table.column("targets").to_numpy(zero_copy_only=False))[order]
    soft = torch.as_tensor(soft, dtype=torch.float32, device=dev)

    # 4. the student, from scratch, on the noisy labels and the fused targets
    torch.manual_seed(args.seed + 1)
    student = make_model(args, dev)
    student_seconds = train(student, xtr, ytr, args, soft=soft)

    # 5. the three accuracies on the held-out half (and the networks on the whole test set)
    y_held = y_test[held_idx]
    teacher_pred, student_pred = predict(teacher, xte).cpu().numpy(), \
        predict(student, xte).cpu().numpy()
    results = {
        "held_out_samples": int(len(held_idx)),
        "teacher_final_acc": float(np.mean(teacher_pred[held_idx] == y_held)),
        "kf_ensemble_acc": float(np.mean(kf_pred == y_held)),
        "student_acc": float(np.mean(student_pred[held_idx] == y_held)),
        "teacher_final_acc_full_test": float(np.mean(teacher_pred == y_test)),
        "student_acc_full_test": float(np.mean(student_pred == y_test)),
        "kf_checkpoints": int(kf.ensemble_size_),
        "kf_plan": [[int(a), float(e)] for a, e in kf.plan_],
        "targets_agree_with_clean_labels": float(np.mean(soft.argmax(1).cpu().numpy()
                                                         == y_train)),
        "noisy_labels_agree_with_clean": float(np.mean(y_noisy == y_train)),
        "teacher_seconds": teacher_seconds, "student_seconds": student_seconds,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "args": {k: v for k, v in vars(args).items()},
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"test accuracy on the held-out half ({len(held_idx)} images): teacher (final "
          f"network) {results['teacher_final_acc']:.4f}, KF ensemble "
          f"({results['kf_checkpoints']} checkpoints) {results['kf_ensemble_acc']:.4f}, "
          f"student {results['student_acc']:.4f}")
    print(json.dumps({k: v for k, v in results.items() if k != "args"}))


if __name__ == "__main__":
    main()
