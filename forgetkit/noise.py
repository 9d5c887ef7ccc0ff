"""Label noise as in the paper's noisy runs (App.): a fraction p of the samples, chosen at
random, gets a wrong label. Use the returned labels to train in any framework."""

from __future__ import annotations

import numpy as np

from ._validation import check_int, check_labels


def _selected(n, p, seed):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1]; got {p}")
    rng = np.random.default_rng(seed)
    chosen = np.zeros(n, dtype=bool)
    chosen[rng.choice(n, size=int(round(p * n)), replace=False)] = True
    return chosen, rng


def symmetric(labels, p, n_classes, seed=0):
    """Symmetric noise: round(p*N) random samples switch to another class, uniformly.

    Returns
    -------
    noisy : ndarray of int64 (N,); mask : bool (N,), True where the label was changed.
    """
    n_classes = check_int("n_classes", n_classes, minimum=2)
    y = check_labels(labels, len(np.asarray(labels)), n_classes)
    chosen, rng = _selected(len(y), p, seed)
    noisy = y.copy()
    shift = rng.integers(1, n_classes, size=int(chosen.sum()))
    noisy[chosen] = (y[chosen] + shift) % n_classes  # any class but the true one, uniformly
    return noisy, noisy != y


def asymmetric(labels, p, mapping, seed=0):
    """Asymmetric noise: round(p*N) random samples take ``mapping[label]``.

    ``mapping`` is an int array (n_classes,) (a deterministic class permutation such as
    ``(c + 1) % C``); classes mapped to themselves stay clean, so the mask (True where the
    label changed) may hold fewer than round(p*N) samples.
    """
    mapping = np.asarray(mapping)
    if mapping.ndim != 1 or mapping.dtype.kind not in "iu":
        raise ValueError(f"mapping must be a 1-d integer array (n_classes,); got {mapping!r}")
    n_classes = len(mapping)
    if mapping.min() < 0 or mapping.max() >= n_classes:
        raise ValueError(f"mapping values must lie in [0, {n_classes})")
    y = check_labels(labels, len(np.asarray(labels)), n_classes)
    chosen, _ = _selected(len(y), p, seed)
    noisy = y.copy()
    noisy[chosen] = mapping[y[chosen]]
    return noisy, noisy != y
