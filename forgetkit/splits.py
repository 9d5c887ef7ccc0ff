"""The paper's split-half protocol: which samples validate and which test."""

from __future__ import annotations

import numpy as np

from ._deprecation import keyword_options
from ._validation import check_int, check_number
from .errors import ForgetkitError


def check_val_frac(val_frac):
    """Return ``val_frac`` as a float strictly between 0 and 1."""
    if not 0.0 < check_number("val_frac", val_frac) < 1.0:
        raise ForgetkitError(f"val_frac must lie strictly between 0 and 1; got {val_frac}")
    return float(val_frac)


@keyword_options(renamed={"frac": "val_frac"})
def split_indices(n_samples, val_frac=0.5, *, seed=0):
    """Validation and test sample indices of the paper's split-half protocol.

    ``perm = numpy.random.default_rng(seed).permutation(n_samples)``; validation is
    ``perm[:int(n_samples * val_frac)]`` (``perm[:N//2]`` for 0.5), test the rest.

    Returns
    -------
    val, test : ndarray of int64
    """
    n_samples = check_int("n_samples", n_samples, minimum=1)
    check_val_frac(val_frac)
    perm = np.random.default_rng(check_int("seed", seed, minimum=0)).permutation(n_samples)
    n_val = int(n_samples * val_frac)
    if n_val < 1 or n_val >= n_samples:
        raise ForgetkitError(f"val_frac={val_frac} leaves an empty half of {n_samples} samples")
    return perm[:n_val], perm[n_val:]
