"""Record test logits from a PyTorch Lightning training with forgetkit's callback.

    python examples/train_fmnist_lightning.py --epochs 3 --out runs/lightning_cnn.parquet
"""

from __future__ import annotations

import argparse
import json

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from train_fmnist import SmallCNN, to_tensor  # noqa: E402  (examples/ is the script's folder)

import forgetkit as fk
from forgetkit.datasets import load_fashion_mnist
from forgetkit.exporters.torch import LogitRecorder


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = SmallCNN()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=None)
    args = p.parse_args(argv)
    xtr, ytr = load_fashion_mnist("train", args.data)
    xte, yte = load_fashion_mnist("test", args.data)
    train = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(to_tensor(xtr, "cpu"), torch.as_tensor(ytr)),
        batch_size=256, shuffle=True)
    test = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(to_tensor(xte, "cpu"), torch.as_tensor(yte)),
        batch_size=2048)
    recorder = LogitRecorder(args.out, test, mode="w", meta={"framework": "lightning"})
    trainer = pl.Trainer(max_epochs=args.epochs, callbacks=[recorder.lightning_callback()],
                         enable_progress_bar=False, logger=False, enable_checkpointing=False)
    trainer.fit(Module(), train)
    run = fk.load(args.out)
    print(json.dumps({"epochs": run.n_epochs, "final_accuracy": float(fk.accuracy(run)[-1]),
                      "accelerator": str(trainer.strategy.root_device)}))


if __name__ == "__main__":
    main()
