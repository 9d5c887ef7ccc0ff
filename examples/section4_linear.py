"""Section 4 of the paper on real data: the points a deep linear model forgets (via the PCA
view of its training) against the points a deep network forgets.

Linear side: Fashion-MNIST training pixels (Debian package dataset-fashion-mnist), centred;
W_opt and its projections W(k) on the first k principal components; S(k) = test points
correct under some W(k'), k' > k, and wrong under W_opt. Deep side: the sample run's test
logits (ResNet-18, 60 epochs); M(n) = test points correct at some epoch after n and wrong at
the end. Also a deep linear network trained by gradient descent, with its forget times.

    python examples/section4_linear.py [--run data_samples/fmnist_resnet18_clean_seed100.npz]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import forgetkit as fk
from forgetkit import linear
from forgetkit.datasets import load_fashion_mnist


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="data_samples/fmnist_resnet18_clean_seed100.npz")
    p.add_argument("--data", default=None)
    p.add_argument("--gd-steps", type=int, default=3000)
    args = p.parse_args(argv)
    t0 = time.time()
    xtr, ytr = load_fashion_mnist("train", args.data)
    xte, yte = load_fashion_mnist("test", args.data)
    xtr = xtr.reshape(len(xtr), -1) / 255.0
    xte = xte.reshape(len(xte), -1) / 255.0
    mean = xtr.mean(axis=0)
    xtr, xte = xtr - mean, xte - mean

    deep = fk.load(args.run)
    assert np.array_equal(deep.labels, yte), "the deep run must be the Fashion-MNIST test set"
    vals, _ = linear.pca(xtr)
    rank = int(np.sum(vals > vals[0] * 1e-12))
    ks = np.unique(np.concatenate([np.arange(1, 51), np.geomspace(50, rank, 40).round()]))
    path = linear.pca_path(xtr, ytr, xte, yte, ks=ks.astype(int))
    acc = fk.accuracy(path)
    print(f"pixels: d={xtr.shape[1]}, rank {rank}; W_opt test accuracy {100 * acc[-1]:.2f}%; "
          f"best W(k) {100 * acc.max():.2f}% at k={path.epochs[np.argmax(acc)]}")
    print(f"deep run: final accuracy {100 * fk.accuracy(deep)[-1]:.2f}%, "
          f"{100 * fk.sample_dynamics(deep)['forgotten'].mean():.2f}% of test points forgotten")
    alpha, beta = linear.align_indices(path, deep)
    print(f"time alignment (indices): deep epoch index n = {alpha:.3f} * k index + {beta:.2f}")
    table = linear.overlap_table(path, deep, alpha=alpha, beta=beta)
    table["lift"] = table["S_in_M"] / table["chance"]
    show = table.iloc[np.linspace(0, len(table) - 1, min(12, len(table))).astype(int)]
    print(show.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    both = table[(table.S >= 20) & (table.M >= 20)]
    print(f"over the {len(both)} aligned pairs with |S|, |M| >= 20: mean |S∩M|/|S| = "
          f"{both.S_in_M.mean():.3f}, mean |S∩M|/|M| = {both.M_in_S.mean():.3f}, "
          f"mean chance |M|/N = {both.chance.mean():.4f} (lift {both.lift.mean():.1f}x)")

    sim = linear.simulate_deep_linear(xtr[:20000], ytr[:20000], depth=3, width=128, lr=0.02,
                                      steps=args.gd_steps, record_every=25, seed=0,
                                      X_eval=xte, y_eval=yte, init_scale=0.05)
    dyn = fk.sample_dynamics(sim)
    forgotten = dyn[dyn.forgotten]
    print(f"deep linear net (depth 3, width 128, {args.gd_steps} GD steps on 20,000 images): "
          f"test accuracy {100 * fk.accuracy(sim)[-1]:.2f}%, max F_e "
          f"{100 * fk.forget_fraction(sim).max():.2f}%, {len(forgotten)} test points forgotten, "
          f"median forget step {forgotten.forget_epoch.median():.0f}")
    M = dyn.forgotten.to_numpy()
    S = linear.forgotten_after(path, 0)
    s_in_m, m_in_s = linear.overlap(S, M)
    print(f"GD-forgotten vs PCA-path S(1): |S∩M|/|S| = {s_in_m:.3f}, |S∩M|/|M| = {m_in_s:.3f}")
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
