"""Label noise as in the paper's noisy runs (App.): a fraction p of the samples, chosen at
random, gets a wrong label. Use the returned labels to train in any framework."""

from __future__ import annotations

import numpy as np

from .._deprecation import keyword_options
from .._validation import check_array, check_int, check_labels, check_number
from ..errors import ForgetkitError
from ..probs import LOG_FLOOR
from ..run import Run, check_run


def _selected(n, p, seed):
    if not 0.0 <= check_number("p", p) <= 1.0:
        raise ForgetkitError(f"p must lie in [0, 1]; got {p}")
    rng = np.random.default_rng(seed)
    chosen = np.zeros(n, dtype=bool)
    chosen[rng.choice(n, size=int(round(p * n)), replace=False)] = True
    return chosen, rng


@keyword_options
def symmetric(labels, p, n_classes, *, seed=0):
    """Symmetric noise: round(p*N) random samples switch to another class, uniformly.

    Returns
    -------
    noisy : ndarray of int64 (N,); mask : bool (N,), True where the label was changed.
    """
    n_classes = check_int("n_classes", n_classes, minimum=2)
    y = check_labels(labels, len(check_array("labels", labels, ndim=1)), n_classes)
    chosen, rng = _selected(len(y), p, seed)
    noisy = y.copy()
    shift = rng.integers(1, n_classes, size=int(chosen.sum()))
    noisy[chosen] = (y[chosen] + shift) % n_classes  # any class but the true one, uniformly
    return noisy, noisy != y


@keyword_options
def asymmetric(labels, p, mapping, *, seed=0):
    """Asymmetric noise: round(p*N) random samples take ``mapping[label]``.

    ``mapping`` is an int array (n_classes,) (a deterministic class permutation such as
    ``(c + 1) % C``); classes mapped to themselves stay clean, so the mask (True where the
    label changed) may hold fewer than round(p*N) samples.
    """
    mapping = np.asarray(mapping)
    if mapping.ndim != 1 or mapping.dtype.kind not in "iu":
        raise ForgetkitError(f"mapping must be a 1-d integer array (n_classes,); got {mapping!r}")
    n_classes = len(mapping)
    if mapping.min() < 0 or mapping.max() >= n_classes:
        raise ForgetkitError(f"mapping values must lie in [0, {n_classes})")
    y = check_labels(labels, len(check_array("labels", labels, ndim=1)), n_classes)
    chosen, _ = _selected(len(y), p, seed)
    noisy = y.copy()
    noisy[chosen] = mapping[y[chosen]]
    return noisy, noisy != y


def training_losses(run):
    """Cross-entropy loss of every stored epoch on every sample of a (training-set) run,
    against ``run.labels`` (the labels it was trained with): float64 (n_epochs, n_samples)."""
    check_run("run", run)
    rows = np.arange(run.n_samples)
    out = np.empty((run.n_epochs, run.n_samples))
    for e in range(run.n_epochs):
        out[e] = -np.log(np.clip(run.probs(e)[rows, run.labels], LOG_FLOOR, None))
    return out


def large_loss_dominance(losses, noise_mask, *, frac=None):
    """Per epoch, clean minus noisy count among the largest-loss training points (paper
    Fig. 2c-d): positive when clean points dominate the hard set, negative when the noisy
    (not yet memorised) points do.

    Parameters
    ----------
    losses : ndarray (n_epochs, n_samples), or a training-set Run (losses are computed)
    noise_mask : bool (n_samples,), True for samples whose label was corrupted
    frac : share of samples counted as large-loss; default the noise rate (the size of the
        noisy set), as in the paper.

    Returns
    -------
    ndarray of int64 (n_epochs,)
    """

    if isinstance(losses, Run):
        losses = training_losses(losses)
    losses = check_array("losses", losses, kinds="biuf").astype(np.float64)
    mask = check_array("noise_mask", noise_mask, kinds="biu").astype(bool)
    if losses.ndim != 2 or mask.shape != (losses.shape[1],):
        raise ForgetkitError(f"losses must be (epochs, samples) and noise_mask (samples,); got "
                             f"{losses.shape} and {mask.shape}")
    frac = mask.mean() if frac is None else check_number("frac", frac, minimum=0, maximum=1)
    k = int(round(frac * losses.shape[1]))
    if k < 1:
        raise ForgetkitError("no large-loss points to count: frac (or the noise rate) is 0")
    top = np.argpartition(-losses, k - 1, axis=1)[:, :k]
    noisy = mask[top].sum(axis=1)
    return (k - noisy) - noisy
