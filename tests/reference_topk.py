"""Plain-numpy references of certified fusion on top-k runs (docs/definitions.md, "Certified
fusion on top-k runs"), written for clarity, not speed: each token's class layout, each
checkpoint's bounds, and the certificate of a mixture."""

from __future__ import annotations

import math

import numpy as np

from forgetkit.kinds.topk import token_ids

#: exp elementwise with the C library's exp (Python's math.exp), the one the definitions and
#: the kernels use: numpy's SIMD exp differs from it in the last bit on some CPUs (AVX-512).
libm_exp = np.vectorize(math.exp, otypes=[np.float64])


def tie_floor_ref(records, y):
    """The lowest id over checkpoints (records (E,) of one token) under which no unstored
    class reaches the checkpoint's bound: its k-th stored id where the bound is its k-th
    probability, else -1."""
    floors = []
    for record in records:
        p = libm_exp(record["logits"].astype(np.float64) - np.float64(record["lse"]))
        u = unstored_bound_ref(record, y)
        floors.append(int(token_ids(record)[-1]) if u == p[-1] else -1)
    return min(floors)


def unstored_bound_ref(record, y):
    """min(p_k, max(0, 1 - the sum of the stored probabilities, the target's included) +
    2**-21 * max(|lse|, |largest logit|, 1))."""
    p = libm_exp(record["logits"].astype(np.float64) - np.float64(record["lse"]))
    total = 0.0
    for v in p:
        total += v
    if y not in token_ids(record).tolist():
        total += libm_exp(np.float64(record["target"]) - np.float64(record["lse"]))
    slack = 2.0 ** -21 * max(abs(float(record["lse"])), abs(float(record["logits"][0])), 1.0)
    return min(p[-1], max(0.0, 1.0 - total) + slack)


def layout_ref(records, targets, vocab):
    """Per token: the ascending list of (class, kind) of its layout, kind "class" or
    "unstored" (the slot at the smallest class no checkpoint stored above the tie floor,
    or the vocabulary size if none)."""
    rows = []
    ids = token_ids(records)
    for n, y in enumerate(targets):
        classes = sorted(set(int(c) for c in ids[:, n].ravel()) | {int(y)})
        row = [(c, "class") for c in classes]
        if len(classes) < vocab:
            floor = tie_floor_ref(records[:, n], y)
            m = next(c for c in range(floor + 1, vocab + 1) if c not in classes)
            row.append((m, "unstored"))
            row.sort()
        rows.append(row)
    return rows


def bounds_ref(record, y, row):
    """(upper, lower) lists of one checkpoint's record at one token over its layout row."""
    p = libm_exp(record["logits"].astype(np.float64) - np.float64(record["lse"]))
    p_y = libm_exp(np.float64(record["target"]) - np.float64(record["lse"]))
    stored = dict(zip(token_ids(record).tolist(), p.tolist(), strict=True))
    u = unstored_bound_ref(record, y)
    upper, lower = [], []
    for c, kind in row:
        if kind == "class" and c == y:
            upper.append(p_y)
            lower.append(p_y)
        elif kind == "class" and c in stored:
            upper.append(stored[c])
            lower.append(stored[c])
        else:
            upper.append(u)
            lower.append(0.0)
    return upper, lower


def certify_ref(upper, lower, row, y):
    """(prediction, certified, state) of one token's mixture bounds over its layout row."""
    real = [i for i, (_, kind) in enumerate(row) if kind == "class"]
    best = max(real, key=lambda i: (lower[i], -row[i][0]))
    c_best = row[best][0]
    certified = all(lower[best] > upper[i] if row[i][0] < c_best else lower[best] >= upper[i]
                    for i in range(len(row)) if i != best)
    y_col = next(i for i, (c, kind) in enumerate(row) if c == y and kind == "class")
    q = upper[y_col]
    wrong = any(lower[i] >= q if row[i][0] < y else lower[i] > q
                for i in range(len(row)) if i != y_col)
    state = 1 if certified and best == y_col else (0 if wrong else -1)
    return c_best, certified, state
