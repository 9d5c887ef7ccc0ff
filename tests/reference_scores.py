"""Plain-numpy references of the data scores and CCS (docs/definitions.md, "Data scores"),
written loop by loop from the definitions, independent of forgetkit's code."""

from __future__ import annotations

import math

import numpy as np

from .reference import correct_ref, softmax64


def label_probs_ref(logits, labels):
    """p[e, n] (E, N): the label's softmax probability."""
    P = softmax64(logits)
    return P[:, np.arange(len(labels)), labels]


def el2n_ref(logits, labels, n_first=None):
    E = logits.shape[0]
    n_first = math.ceil(0.1 * E) if n_first is None else n_first
    P = softmax64(logits)
    out = np.zeros(len(labels))
    for n, y in enumerate(labels):
        for e in range(n_first):
            target = np.zeros(P.shape[2])
            target[y] = 1.0
            out[n] += np.sqrt(np.sum((P[e, n] - target) ** 2))
    return out / n_first


def forgetting_ref(correct):
    E, N = correct.shape
    out = np.zeros(N)
    for n in range(N):
        if not correct[:, n].any():
            out[n] = np.inf
            continue
        out[n] = sum(1 for e in range(E - 1) if correct[e, n] and not correct[e + 1, n])
    return out


def aum_ref(logits, labels):
    E, N, C = logits.shape
    out = np.zeros(N)
    for n, y in enumerate(labels):
        for e in range(E):
            z = logits[e, n].astype(np.float64)
            out[n] += z[y] - max(z[k] for k in range(C) if k != y)
    return out / E


def variability_ref(p):
    """p (E, N) -> population std over epochs."""
    return np.array([np.sqrt(np.mean((p[:, n] - p[:, n].mean()) ** 2))
                     for n in range(p.shape[1])])


def aleatoric_ref(p):
    return np.array([np.mean(p[:, n] * (1 - p[:, n])) for n in range(p.shape[1])])


def dynamic_uncertainty_ref(p, window=10):
    E, N = p.shape
    out = np.zeros(N)
    for n in range(N):
        stds = [np.std(p[k:k + window, n]) for k in range(E - window + 1)]
        out[n] = np.mean(stds)
    return out


def ssft_ref(correct, epochs):
    """Second-split forgetting time: the epoch number from which on the sample is wrong at
    every epoch; epochs[-1] + 1 if correct at the last one."""
    E, N = correct.shape
    out = np.zeros(N)
    for n in range(N):
        if correct[E - 1, n]:
            out[n] = epochs[-1] + 1
            continue
        e = E - 1
        while e > 0 and not correct[e - 1, n]:
            e -= 1
        out[n] = epochs[e]
    return out


def scores_ref(logits, labels, *, window=10):
    """Every score of a logits run (E, N, C) as a dict of (N,) arrays."""
    p = label_probs_ref(logits, labels)
    correct = correct_ref(logits, labels)
    return {"el2n": el2n_ref(logits, labels), "forgetting": forgetting_ref(correct),
            "aum": aum_ref(logits, labels), "variability": variability_ref(p),
            "aleatoric": aleatoric_ref(p),
            "dynamic_uncertainty": dynamic_uncertainty_ref(p, window)}


def ccs_bins_ref(values, strata):
    """CCS's bin of each hardness value: equal-width bins over [min, max] of the finite
    values, the maximum in the last bin, inf last and -inf first."""
    finite = [v for v in values if np.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    width = (hi - lo) / strata
    bins = []
    for v in values:
        if v == np.inf or (np.isfinite(v) and width == 0):
            bins.append(strata - 1)
        elif v == -np.inf:
            bins.append(0)
        else:
            bins.append(min(int(np.floor((v - lo) / width)), strata - 1))
    return np.array(bins, dtype=np.int64)


def ccs_budgets_ref(sizes, m):
    """Budget per bin: non-empty bins from the smallest (ties: lower index) up, each
    min(size, remaining // bins left)."""
    order = sorted((s, b) for b, s in enumerate(sizes) if s > 0)
    budgets = [0] * len(sizes)
    remaining = m
    for i, (s, b) in enumerate(order):
        budgets[b] = min(s, remaining // (len(order) - i))
        remaining -= budgets[b]
    return np.array(budgets, dtype=np.int64)
