"""Plain-numpy references of every kernel and algorithm, written for clarity, not speed.

They follow docs/definitions.md (sections "Forgetting", "Knowledge Fusion (KF)", "Exact
epsilon search" and "Baselines") literally; the tests compare forgetkit with them value by
value.
"""

from __future__ import annotations

import numpy as np


def softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def correct_ref(outputs, labels):
    """correct[e, n] = argmax_c outputs[e, n, c] == y[n] (lowest index wins ties)."""
    return np.argmax(np.asarray(outputs, dtype=np.float64), axis=-1) == labels[None, :]


def fractions_ref(correct):
    """(accuracy, F, L) per epoch by the definitions."""
    final = correct[-1]
    acc = correct.mean(axis=1)
    forget = np.array([np.mean(c & ~final) for c in correct])
    learn = np.array([np.mean(~c & final) for c in correct])
    return acc, forget, learn


def dynamics_ref(correct, epochs):
    """Per-sample statistics with explicit loops."""
    n_epochs, n_samples = correct.shape
    rows = []
    for n in range(n_samples):
        col = correct[:, n]
        hits = [e for e in range(n_epochs) if col[e]]
        events = sum(1 for e in range(n_epochs - 1) if col[e] and not col[e + 1])
        forgotten = bool(hits) and not col[-1]
        rows.append(
            dict(
                first_correct=epochs[hits[0]] if hits else None,
                last_correct=epochs[hits[-1]] if hits else None,
                epochs_correct=len(hits),
                forgetting_events=events,
                forgotten=forgotten,
                forget_epoch=epochs[hits[-1] + 1] if forgotten else None,
            )
        )
    return rows


# ------------------------------------------------------------------ Knowledge Fusion
def grid_accuracy_ref(a, b, labels, grid):
    """Brute force: accuracy of eps*a + (1-eps)*b for each eps of the grid."""
    return np.array([np.mean(np.argmax(eps * a + (1 - eps) * b, axis=1) == labels)
                     for eps in grid])


def knowledge_fusion_ref(P, y, *, window=1, grid=101, rule="best", max_windows=None,
                         stop_when_no_gain=False):
    """Algorithm 1 of the paper as DESIGN.md states it, with the brute-force grid search.

    P: probabilities (E, N, C) float64. Returns (plan, val_accuracy_after_each_step).
    """
    n_epochs = P.shape[0]
    G = np.arange(grid) / (grid - 1)
    correct = np.argmax(P, axis=2) == y[None, :]
    prob = P[n_epochs - 1].copy()
    explore = set(range(n_epochs))
    plan, accs = [], []
    used = 0
    while explore and (max_windows is None or used < max_windows):
        cur = np.argmax(prob, axis=1) == y
        f = {e: np.mean(correct[e] & ~cur) for e in explore}
        best_f = max(f.values())
        a = min(e for e in explore if f[e] == best_f)
        for e in range(a - window, a + window + 1):
            explore.discard(e)
        lo, hi = max(a - window, 0), min(a + window, n_epochs - 1)
        A = np.mean(P[lo : hi + 1], axis=0)
        acc = grid_accuracy_ref(A, prob, y, G)
        base = np.mean(cur)
        if rule == "best":
            i = int(np.argmax(acc))  # first maximum = smallest eps
        else:
            i = int(np.flatnonzero(acc >= base).max())
        if stop_when_no_gain and acc[i] <= base:
            break
        eps = G[i]
        plan.append((a, float(eps)))
        prob = eps * A + (1 - eps) * prob
        accs.append(float(np.mean(np.argmax(prob, axis=1) == y)))
        if eps > 0:
            used += 1
    return plan, accs


def apply_plan_ref(P, plan, window):
    n_epochs = P.shape[0]
    prob = P[n_epochs - 1].copy()
    for a, eps in plan:
        lo, hi = max(a - window, 0), min(a + window, n_epochs - 1)
        A = np.mean(P[lo : hi + 1], axis=0)
        prob = eps * A + (1 - eps) * prob
    return prob


def ensemble_selection_ref(P, y, k):
    """Greedy forward selection with replacement (Caruana et al. 2004), ties to earlier."""
    total = np.zeros_like(P[0])
    chosen = []
    for _ in range(k):
        scores = [np.mean(np.argmax(total + P[e], axis=1) == y) for e in range(P.shape[0])]
        e = int(np.argmax(scores))
        chosen.append(e)
        total = total + P[e]
    return chosen
