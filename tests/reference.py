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
    """Algorithm 1 of the paper as docs/definitions.md states it, with the brute-force grid search.

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


# ------------------------------------------------------------------ training dynamics
def label_margins_ref(values, labels, *, softmax=True):
    """One epoch (N, C) to (p, margin, correct) by the definitions, row by row: the label's
    probability, the label's value minus the largest other (log-probabilities for a
    probabilities epoch), and argmax == label (lowest index on ties)."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    p, margin, correct = np.empty(n), np.empty(n), np.empty(n, dtype=bool)
    for r in range(n):
        row, y = values[r], labels[r]
        others = [c for c in range(len(row)) if c != y]
        o = max(others, key=lambda c: (row[c], -c))  # largest, lowest index among equals
        p[r] = softmax64(row)[y] if softmax else row[y]
        if softmax:
            margin[r] = row[y] - row[o]
        else:
            tiny = np.finfo(np.float64).tiny
            margin[r] = np.log(max(row[y], tiny)) - np.log(max(row[o], tiny))
        correct[r] = int(np.argmax(row)) == y
    return p, margin, correct


def data_map_ref(outputs, labels, *, kind="logits", burn_out=None):
    """Per-sample data-map statistics written as Dataset Cartography's
    compute_train_dy_metrics computes them (np.mean and np.std of the label's probability
    trend, numpy argmax), with correctness as a share and AUM added: list of dicts."""
    z = np.asarray(outputs, dtype=np.float64)[:burn_out]
    probs = softmax64(z) if kind == "logits" else z
    rows = []
    for n, y in enumerate(labels):
        trend = [probs[e, n, y] for e in range(len(z))]
        correct = [int(np.argmax(z[e, n])) == y for e in range(len(z))]
        margins = [z[e, n, y] - max(z[e, n, c] for c in range(z.shape[2]) if c != y)
                   for e in range(len(z))]
        conf = np.mean(trend)
        rows.append(dict(
            confidence=conf,
            variability=np.std(trend),
            correctness=np.mean(correct),
            forgetfulness=sum(1 for e in range(len(z) - 1) if correct[e] and not correct[e + 1]),
            never_learned=not any(correct),
            threshold_closeness=conf * (1 - conf),
            aum=np.mean(margins) if kind == "logits" else np.nan,
        ))
    return rows


def confident_joint_ref(labels, probs):
    """The calibrated confident joint with explicit loops (confident learning)."""
    n_samples, n_classes = probs.shape
    t = [np.mean([probs[n, j] for n in range(n_samples) if labels[n] == j]) for j in
         range(n_classes)]
    joint = np.zeros((n_classes, n_classes))
    for n in range(n_samples):
        above = [j for j in range(n_classes) if probs[n, j] >= t[j]]
        if above:
            joint[labels[n], max(above, key=lambda j: (probs[n, j], -j))] += 1
    for i in range(n_classes):
        joint[i] *= np.sum(labels == i) / joint[i].sum()
    return joint


def label_issues_ref(outputs, labels, *, kind="logits"):
    """(score, suggested label, estimated issues) of label_issues by its definition: the
    posterior log odds of a wrong label, with the trajectory's mean log-probabilities as
    evidence and the confident joint's noise transition (off-diagonal cells raised by twice
    their mean, at least 1) as prior."""
    x = np.asarray(outputs, dtype=np.float64)
    probs = softmax64(x) if kind == "logits" else x
    if kind == "logits":
        log_probs = x - (np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
                         + x.max(-1, keepdims=True))
    else:
        log_probs = np.log(np.maximum(x, np.finfo(np.float64).tiny))
    mean, mean_log = probs.mean(axis=0), log_probs.mean(axis=0)
    joint = confident_joint_ref(labels, mean)
    n_classes = len(joint)
    off = [joint[i, j] for i in range(n_classes) for j in range(n_classes) if i != j]
    prior = 2 * max(np.mean(off), 1.0)
    smoothed = np.array([[joint[i, j] + (prior if i != j else 0.0) for j in range(n_classes)]
                         for i in range(n_classes)])
    transition = smoothed / smoothed.sum(axis=0)
    score, suggested = np.empty(len(labels)), np.empty(len(labels), dtype=np.int64)
    for n, y in enumerate(labels):
        w = np.exp(mean_log[n]) * transition[y]
        score[n] = np.log(sum(w[j] for j in range(n_classes) if j != y)) - np.log(w[y])
        suggested[n] = int(np.argmax(w))
    return score, suggested, sum(off)
