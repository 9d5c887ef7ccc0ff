"""Fairness check of the paper's appendix: does fusion change the bias between a natural and
a transformed version of the same test set (e.g. colour and greyscale images)?"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._validation import check_int
from ..errors import ForgetkitError
from ..fusion import KnowledgeFusion
from ..run import check_run
from ..splits import split_indices


def amplification_bias(pred_natural, pred_transformed, n_classes):
    """Bias between two domains of a balanced test set (Zhao et al. 2017, in the form of
    Wang et al. 2020 for natural vs transformed images):

        bias = 1/C * sum_c  max(N_c^nat, N_c^tr) / (N_c^nat + N_c^tr)  -  1/2

    where N_c^nat (N_c^tr) counts the natural (transformed) test images *predicted* as class c.
    0 means no preference for either domain, 0.5 the largest bias. A class that neither
    domain predicts contributes 0 (it cannot favour one).
    """
    n_classes = check_int("n_classes", n_classes, minimum=1)
    a = np.asarray(pred_natural, dtype=np.int64)
    b = np.asarray(pred_transformed, dtype=np.int64)
    for name, p in (("pred_natural", a), ("pred_transformed", b)):
        if p.ndim != 1:
            raise ForgetkitError(f"{name} must be one-dimensional; got shape {p.shape}")
        if p.size and (p.min() < 0 or p.max() >= n_classes):
            raise ForgetkitError(f"{name} must lie in [0, {n_classes})")
    na = np.bincount(a, minlength=n_classes).astype(np.float64)
    nb = np.bincount(b, minlength=n_classes).astype(np.float64)
    total = na + nb
    share = np.divide(np.maximum(na, nb), total, out=np.full(n_classes, 0.5), where=total > 0)
    return float(np.mean(share) - 0.5)


def compare_fairness(natural, transformed, *, seeds=(0, 1, 2), val_frac=0.5, window=1):
    """Single network and KF(inf) on a natural and a transformed test run of the same samples.

    For each split, KF is fitted on the validation half of the natural run and applied to the
    test halves of both runs. Returns a DataFrame (one row per method): accuracy on each run
    and the amplification bias (means over splits).
    """
    check_run("natural", natural)
    check_run("transformed", transformed)
    if natural.n_samples != transformed.n_samples or \
            not np.array_equal(natural.labels, transformed.labels):
        raise ForgetkitError("natural and transformed runs must hold the same samples and labels")
    rows = []
    for s in seeds:
        val, test = split_indices(natural.n_samples, val_frac, seed=s)
        kf = KnowledgeFusion(window=window).fit(natural.isel(samples=val))
        nat, tr = natural.isel(samples=test), transformed.isel(samples=test)
        preds = {
            "single": (np.argmax(nat.probs(-1), 1), np.argmax(tr.probs(-1), 1)),
            "kf": (kf.predict(nat), kf.predict(tr)),
        }
        for method, (pn, pt) in preds.items():
            rows.append({"split": s, "method": method,
                         "accuracy_natural": 100 * np.mean(pn == nat.labels),
                         "accuracy_transformed": 100 * np.mean(pt == tr.labels),
                         "bias": amplification_bias(pn, pt, natural.n_classes)})
    return pd.DataFrame(rows).groupby("method", sort=False).mean().drop(columns="split")
