"""Train an MLP on Fashion-MNIST in plain JAX and record its test logits every epoch with
forgetkit's JAX exporter.

    python examples/train_fmnist_jax.py --epochs 5 --out runs/jax_mlp.npy
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import forgetkit as fk
from forgetkit.datasets import load_fashion_mnist
from forgetkit.exporters.jax import LogitRecorder


def init(key, sizes):
    params = []
    for din, dout in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (din, dout)) * jnp.sqrt(2 / din), jnp.zeros(dout)))
    return params


def apply_fn(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=None)
    args = p.parse_args(argv)

    xtr, ytr = load_fashion_mnist("train", args.data)
    xte, yte = load_fashion_mnist("test", args.data)
    xtr = jnp.asarray(xtr.reshape(len(xtr), -1) / 255.0, jnp.float32)
    xte = jnp.asarray(xte.reshape(len(xte), -1) / 255.0, jnp.float32)
    ytr = jnp.asarray(ytr)
    params = init(jax.random.PRNGKey(0), [784, 512, 256, 10])

    @jax.jit
    def step(params, x, y):
        def loss(p):
            logp = jax.nn.log_softmax(apply_fn(p, x))
            return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

        grads = jax.grad(loss)(params)
        return jax.tree_util.tree_map(lambda a, g: a - args.lr * g, params, grads)

    test_batches = [(xte[i:i + 2000], yte[i:i + 2000]) for i in range(0, len(yte), 2000)]
    recorder = LogitRecorder(args.out, test_batches, apply_fn, mode="w",
                             meta={"model": "mlp-784-512-256-10", "framework": "jax",
                                   "device": str(jax.devices()[0])})
    rng = np.random.default_rng(0)
    t0, rec_s = time.time(), 0.0
    for epoch in range(args.epochs):
        perm = rng.permutation(len(ytr))
        for i in range(0, len(perm), args.batch_size):
            idx = perm[i:i + args.batch_size]
            params = step(params, xtr[idx], ytr[idx])
        t = time.time()
        acc = recorder.record(params, epoch)
        rec_s += time.time() - t
        print(f"epoch {epoch + 1}/{args.epochs} test acc {acc:.4f} ({time.time() - t0:.0f}s)",
              flush=True)
    recorder.close()
    run = fk.load(args.out)
    print(json.dumps({"device": str(jax.devices()[0]), "epochs": run.n_epochs,
                      "final_accuracy": float(fk.accuracy(run)[-1]),
                      "max_forget_fraction": float(fk.forget_fraction(run).max()),
                      "seconds": time.time() - t0, "record_seconds": rec_s}))


if __name__ == "__main__":
    main()
