"""Weight space against output space on real ResNet-18 runs (a lent GPU).

    python bench/gpu_weight_space.py --data DIR --out OUTDIR [--epochs 40] \\
        [--noise 0.0 0.2] [--train-subset N] [--bn-samples 10000]

For each noise rate: `examples/train_fmnist.py` trains a ResNet-18 on Fashion-MNIST (its
IDX files in ``--data``), records the test logits every epoch and saves every epoch's state
dict; then `forgetkit.exporters.torch.compare_weight_space` scores, on the paper's split
halves of the test set (seeds 0, 1, 2), the output-space methods of `forgetkit.compare` and
the weight averages of the same checkpoints (the last 2, 5, 10, 20; EMA 0.5, 0.8, 0.9, 0.95;
the greedy soup), BatchNorm statistics re-estimated on the first ``--bn-samples`` training
images. Writes OUTDIR/weight_space_<noise>.json (the table, the training's summary, seconds)
and prints the markdown tables.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _train_module():
    spec = importlib.util.spec_from_file_location("train_fmnist",
                                                  ROOT / "examples" / "train_fmnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder of the Fashion-MNIST IDX files")
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.2])
    p.add_argument("--train-subset", type=int, default=None)
    p.add_argument("--bn-samples", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)

    import torch

    import forgetkit as fk
    from forgetkit.datasets import load_fashion_mnist
    from forgetkit.exporters.torch import compare_weight_space

    train = _train_module()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    x_train, y_train = load_fashion_mnist("train", args.data)
    x_test, y_test = load_fashion_mnist("test", args.data)
    test = (train.to_tensor(x_test, dev), torch.as_tensor(y_test, device=dev))
    n_bn = args.bn_samples
    bn = (train.to_tensor(x_train[:n_bn], dev), torch.as_tensor(y_train[:n_bn], device=dev))
    for noise in args.noise:
        tag = f"sym{round(100 * noise)}" if noise else "clean"
        ckpts, run_path = out / f"ckpt_{tag}", out / f"test_{tag}.npy"
        cmd = [sys.executable, str(ROOT / "examples" / "train_fmnist.py"), "--model",
               "resnet18", "--epochs", str(args.epochs), "--noise", str(noise), "--out",
               str(run_path), "--save-checkpoints", str(ckpts), "--seed", str(args.seed),
               "--device", args.device]
        if args.data:
            cmd += ["--data", args.data]
        if args.train_subset:
            cmd += ["--train-subset", str(args.train_subset)]
        start = time.perf_counter()
        log = out / f"train_{tag}.log"
        with open(log, "w") as f:  # followed while it trains: tail -f
            subprocess.run(cmd, check=True, stdout=f, text=True)
        trained = json.loads(log.read_text().strip().splitlines()[-1])
        train_s = time.perf_counter() - start
        print(f"{tag}: trained in {train_s:.0f} s", flush=True)
        run = fk.load(run_path)
        start = time.perf_counter()
        table = compare_weight_space(
            train.ResNet18().to(dev), ckpts, test, run, bn_data=bn, batch_size=2048,
            last=(2, 5, 10, 20), decays=(0.5, 0.8, 0.9, 0.95), device=dev)
        compare_s = time.perf_counter() - start
        device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        record = {"noise": noise, "epochs": args.epochs, "train_subset": args.train_subset,
                  "bn_samples": n_bn, "device": device,
                  "train_seconds": round(train_s, 1), "compare_seconds": round(compare_s, 1),
                  "training": trained,
                  "table": json.loads(table.reset_index().to_json(orient="records"))}
        (out / f"weight_space_{tag}.json").write_text(json.dumps(record, indent=1))
        print(f"## {tag}: {args.epochs} epochs, final test accuracy "
              f"{100 * trained['final_accuracy']:.2f}% (train {train_s:.0f} s, compare "
              f"{compare_s:.0f} s)")
        print(fk.format_table(table, fmt="markdown"))
        print(np.round(table[["k", "forward_passes"]].to_numpy().T, 1).tolist())


if __name__ == "__main__":
    main()
