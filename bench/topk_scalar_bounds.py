"""Could the top-k KF fit skip most tokens' layouts? A simulation along a fitted plan.

    python -m bench.topk_scalar_bounds [RUN]

A fit that keeps three numbers per token (the target's mixture, a bound on every other
class's mixture from each checkpoint's largest stored probability not the target's, and the
lower mixture of one rival class, the final checkpoint's largest other) answers a window
from them where the target wins, or the rival beats it, at both ends of the eps range, and
must make the token's layout and rows otherwise ("promoted", from then on). This follows
`KnowledgeFusion().fit`'s plan on RUN (default: the GPT-2 sample) in numpy, with relative
margins of 1e-9, and prints the share of the unsettled tokens promoted after each window and
never. Few never promoted means such a fit would make nearly every layout anyway.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / \
    "lm_fortunes_gpt2_heldout_top8.npy"
MARGIN = 1e-9


def _mean(x, window):
    out = x[window[0]].copy()
    for e in window[1:]:
        out += x[e]
    return out / len(window) if len(window) > 1 else out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    import forgetkit as fk
    from forgetkit import kernels
    from forgetkit.fusion import topk
    from forgetkit.kinds import kind_of

    run = fk.load(argv[0] if argv else SAMPLE)
    kf = fk.KnowledgeFusion().fit(run)
    data = kind_of(run).certified_bounds(run)
    n_epochs, n = run.n_epochs, run.n_samples
    fields = data.fields(slice(None))
    logits, ids = np.asarray(fields[0], dtype=np.float64), np.asarray(fields[1])
    target, lse = np.asarray(fields[2], dtype=np.float64), np.asarray(fields[3], dtype=np.float64)
    y = run.labels.astype(np.int64)
    rival = topk._rival(ids[-1], y)  # the final checkpoint's largest other class, as the fit
    settled = kernels.topk_settle(fields, np.arange(n_epochs, dtype=np.int64),
                                  np.arange(n, dtype=np.int64), y, data.vocab_size, rival)
    keep = ~settled
    p = np.exp(logits - lse[..., None])
    p_y = np.exp(target - lse)[:, keep]
    other = np.where(ids == y[None, :, None], -1.0, p).max(axis=2)[:, keep]
    low = np.where(ids == rival[None, :, None], p, 0.0).max(axis=2)[:, keep]
    b_y, b_other, b_low = p_y[-1].copy(), other[-1].copy(), low[-1].copy()
    promoted = ~((b_y > b_other * (1 + MARGIN)) | (b_low >= b_y * (1 + MARGIN)))
    shares = []
    for a, eps in kf.plan_:
        window = list(kf._window(a, n_epochs))
        a_y, a_other, a_low = _mean(p_y, window), _mean(other, window), _mean(low, window)
        wins = (b_y > b_other * (1 + MARGIN)) & (a_y > a_other * (1 + MARGIN))
        loses = (b_low >= b_y * (1 + MARGIN)) & (a_low >= a_y * (1 + MARGIN))
        promoted |= ~(wins | loses)
        if eps > 0:
            b_y, b_other, b_low = (eps * a_y + (1 - eps) * b_y,
                                   eps * a_other + (1 - eps) * b_other,
                                   eps * a_low + (1 - eps) * b_low)
            promoted |= ~((b_y > b_other * (1 + MARGIN)) | (b_low >= b_y * (1 + MARGIN)))
        shares.append(promoted.mean())
    print(f"{n} tokens, {settled.mean():.2f} settled; of the others, promoted after each "
          f"window: {' '.join(f'{s:.2f}' for s in shares)}; never: {1 - promoted.mean():.2f}")


if __name__ == "__main__":
    main()
