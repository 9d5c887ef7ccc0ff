"""Label issues of a run on a dask array: `forgetkit.analysis.label_issues`'s steps over its
chunks of samples.

One pass reads each chunk's outputs once and keeps its labels and trajectory means (mean
probabilities and log-probabilities, (n, C) each) where they were computed (on the workers
of a dask.distributed Client). Then, as in memory:

1. each sample's mean probability of its label, gathered in sample order (N floats): the
   class thresholds, summed in sample order as in memory (per-chunk sums added here would
   round differently);
2. each chunk's confident counts under those thresholds (C, C), summed: integer counts,
   exact; the joint and the noise transition T follow here;
3. each chunk's scores and suggested labels under log T, concatenated.

The client holds N-long columns and (C, C) tables, never the tensor or an (N, C) array.
"""

from __future__ import annotations

import dask
import numpy as np

from ..analysis.dynamics import trajectory
from ..analysis.label_issues import (
    calibrate,
    class_thresholds,
    confident_counts,
    issue_scores,
    noise_transition,
)
from .chunks import combine, persist_chunks


def _means(run):
    """(labels (n,), mean probabilities (n, C), mean log-probabilities (n, C)) of a chunk."""
    t = trajectory(run, mean_probs=True, mean_log_probs=True)
    return run.labels, t.mean_probs, t.mean_log_probs


def _label_probs(means):
    labels, probs, _ = means
    return probs[np.arange(len(labels)), labels]


def _counts(means, thresholds):
    labels, probs, _ = means
    return confident_counts(labels, probs, thresholds)


def _scores(means, log_t):
    labels, _, log_probs = means
    return issue_scores(labels, log_probs.copy(), log_t)  # the kept means stay as they are


def full_scores(run):
    """(joint, score, suggested, n_epochs) of `label_issues` on a run on a dask array
    (shapes (C, C), (N,), (N,) and an int), equal to the in-memory path's."""
    means = persist_chunks(run, _means)

    def each(fn, *args):
        return dask.compute(*[dask.delayed(fn)(part, *args) for part in means])

    counts, thresholds = class_thresholds(run.labels, np.concatenate(each(_label_probs)),
                                          run.n_classes)
    joint = calibrate(combine(each(_counts, thresholds)), counts)
    log_t = dask.delayed(np.log(noise_transition(joint)))  # sent once, not once per chunk
    score, suggested = (np.concatenate(part) for part in zip(*each(_scores, log_t),
                                                               strict=True))
    return joint, score, suggested, run.n_epochs
