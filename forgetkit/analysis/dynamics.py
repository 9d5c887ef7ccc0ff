"""Training dynamics beyond the paper: data maps (Dataset Cartography, Swayamdipta et al.
2020), the area under the margin (AUM, Pleiss et al. 2020) and cartography-style selection.

Everything comes from one streaming pass over the epochs (`trajectory`): each epoch is read
once, in chunks of epochs of about 64 MB, each reduced by one numba kernel call to the label's
probability, the label's margin and correctness per sample and epoch, then folded into
per-sample running statistics; memory grows with the number of samples, never with the
epochs. The pass runs per chunk of samples on the run's executor (`forgetkit.execution`;
one chunk for a run held here, the workers' chunks for a run on a dask array) and only the
per-sample rows come back; the region thresholds are then taken over all of them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from .. import kernels
from .._progress import Progress
from .._validation import check_bool, check_int, check_number, check_option
from ..errors import ForgetkitError
from ..execution import executor_for
from ..kinds import kind_of
from ..kinds.summary import epoch_chunks
from ..run import check_run

#: Data-map regions, in the order of the categorical ``region`` column.
REGIONS = ("easy-to-learn", "ambiguous", "hard-to-learn")
#: Short names accepted by `select`.
REGION_ALIASES = {"easy": "easy-to-learn", "hard": "hard-to-learn"}
#: Share of samples in the ambiguous region (the most variable), as in cartography's 33%
#: selections; the rest is split at its median confidence.
AMBIGUOUS_SHARE = 1 / 3



def _log(probs):
    """The log of probabilities, each at least the smallest normal float64 (the arithmetic
    of ``kernels.label_margins`` on a probabilities run)."""
    return np.log(np.maximum(probs, np.finfo(np.float64).tiny))


@dataclass
class Trajectory:
    """Per-sample statistics of one pass over the first ``n_epochs`` epochs of a run
    (arrays of shape (n_samples,)); ``mean_probs`` and ``mean_log_probs`` (n_samples,
    n_classes) are the means of the epochs' probabilities and log-probabilities when they
    were asked for, else None."""

    n_epochs: int
    confidence: np.ndarray
    variability: np.ndarray
    correctness: np.ndarray
    forgetfulness: np.ndarray
    never_learned: np.ndarray
    margin: np.ndarray
    mean_probs: np.ndarray | None = None
    mean_log_probs: np.ndarray | None = None


def check_burn_out(burn_out, n_epochs):
    """The number of epochs a pass uses: ``burn_out`` (1..n_epochs), or all when None."""
    if burn_out is None:
        return n_epochs
    burn_out = check_int("burn_out", burn_out, minimum=1)
    if burn_out > n_epochs:
        raise ForgetkitError(f"burn_out must lie in [1, {n_epochs}] (the run's epochs); "
                             f"got {burn_out}")
    return burn_out


def trajectory(run, *, burn_out=None, mean_probs=False, mean_log_probs=False, progress=False):
    """One streaming pass over the epochs of ``run``: the per-sample training dynamics.

    With p[e, n] the probability of sample n's label at epoch e (softmax of logits in
    float64), over the epochs e < burn_out:

    - confidence = mean_e p; variability = population std_e p (ddof = 0, by Welford's
      update, numerically stable in one pass); correctness = mean_e correct;
    - forgetfulness = number of e with correct[e] and not correct[e + 1]; never_learned:
      never correct;
    - margin = mean_e (z_y - max_{k != y} z_k) on logits (AUM); on probabilities the same
      on log-probabilities.

    A summary or a top-k run (k >= 2) gives all of these from its records, epoch by epoch,
    but not ``mean_probs`` or ``mean_log_probs``.

    Parameters
    ----------
    run : Run
    burn_out : int, optional
        Use only the first ``burn_out`` epochs (Dataset Cartography's option).
    mean_probs : bool, default False
        Also return the mean of the epochs' probabilities (n_samples, n_classes), summed
        in the same pass (equal to ``run.mean_probs(range(burn_out))``).
    mean_log_probs : bool, default False
        Also return the mean of the epochs' log-probabilities (n_samples, n_classes) (for
        logits, the log-softmax; for probabilities, the log of each, at least the smallest
        normal float64).
    progress : bool, default False

    Returns
    -------
    Trajectory
    """
    check_run("run", run)
    for name, flag in (("mean_probs", mean_probs), ("mean_log_probs", mean_log_probs),
                       ("progress", progress)):
        check_bool(name, flag)
    n_epochs = check_burn_out(burn_out, run.n_epochs)
    kind = kind_of(run)
    if (mean_probs or mean_log_probs) and not kind.full:
        raise ForgetkitError(f"mean probabilities need every class's outputs; {kind.holds}")
    n = run.n_samples
    labels = run.labels
    previous = np.zeros(n, dtype=bool)
    total_p, mean, m2, total_margin = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    n_correct = np.zeros(n, dtype=np.int64)
    events = np.zeros(n, dtype=np.int64)
    total = np.zeros((n, run.n_classes)) if mean_probs else None
    total_log = np.zeros((n, run.n_classes)) if mean_log_probs else None
    bar = Progress(n_epochs, "training dynamics", enabled=progress)
    # Stored values are read in chunks of epochs, one kernel call each (a call per epoch
    # of a mid-sized run costs more in waking threads than in work); records epoch by epoch.
    chunks = (epoch_chunks(n_epochs, n * run.n_classes * run.outputs.itemsize)
              if kind.stores_values else ((e, e + 1) for e in range(n_epochs)))
    for start, stop in chunks:
        epochs = slice(start, stop)
        if not kind.stores_values:  # exact from the records (e.g. label logit, largest other, lse)
            ps, margins, corrects = (kind.label_probs(run, epochs), kind.label_margins(run, epochs),
                                     kind.correctness(run, epochs))
            if total is not None or total_log is not None:  # records of every class
                probs = kind.epoch_probs(run, start, np.empty((n, run.n_classes)))
                for acc, values in ((total, probs), (total_log, _log(probs))):
                    if acc is not None:
                        acc += values
        else:
            values = run.backend.read(epochs)
            if run.checked_per_read:
                for i, epoch_values in enumerate(values):
                    kind.check_values(run, start + i, epoch_values)
            shape = (stop - start, n)
            ps, margins, corrects = np.empty(shape), np.empty(shape), np.empty(shape, dtype=bool)
            if kernels.label_margins(values, labels, ps, margins, corrects,
                                     softmax=kind.softmax, total=total, total_log=total_log):
                for i, epoch_values in enumerate(values):
                    run.check_epoch(start + i, epoch_values)  # raises the error naming the epoch
        for e, p, margin, correct in zip(range(start, stop), ps, margins, corrects,
                                         strict=True):
            total_p += p
            total_margin += margin
            delta = p - mean
            mean += delta / (e + 1)
            m2 += delta * (p - mean)
            n_correct += correct
            if e:
                events += previous & ~correct
            previous = correct
        bar.update(stop - start)
    for acc in (total, total_log):
        if acc is not None:
            acc /= n_epochs
    return Trajectory(
        n_epochs=n_epochs,
        confidence=total_p / n_epochs,
        variability=np.sqrt(m2 / n_epochs),
        correctness=n_correct / n_epochs,
        forgetfulness=events,
        never_learned=n_correct == 0,
        margin=total_margin / n_epochs,
        mean_probs=total,
        mean_log_probs=total_log,
    )


def region_thresholds(confidence, variability):
    """(variability threshold, confidence threshold) of the data-map regions: ambiguous
    above the first, easy-to-learn at or above the second among the rest."""
    v_cut = float(np.quantile(variability, 1 - AMBIGUOUS_SHARE))
    rest = variability <= v_cut
    return v_cut, float(np.median(confidence[rest]))


def regions(confidence, variability):
    """Data-map region of each sample, a Categorical of `REGIONS`.

    ambiguous: variability above its 2/3 quantile (the most variable third; none when the
    variabilities tie there, e.g. a single epoch); of the rest, easy-to-learn: confidence at
    or above the rest's median; hard-to-learn: below it.
    """
    v_cut, c_cut = region_thresholds(confidence, variability)
    codes = np.where(variability > v_cut, 1, np.where(confidence >= c_cut, 0, 2))
    return pd.Categorical.from_codes(codes, REGIONS)


def sample_index(run):
    """The run's sample ids, or positions, as the index of per-sample tables."""
    ids = run.sample_ids if run.sample_ids is not None else np.arange(run.n_samples)
    return pd.Index(ids, name="sample")


def data_map(run, *, burn_out=None, progress=False):
    """Dataset Cartography's data map of a run (training-set outputs, usually).

    Parameters
    ----------
    run : Run
        Outputs (n_epochs, n_samples, n_classes), logits or probabilities; read in one
        streaming pass.
    burn_out : int, optional
        Use only the first ``burn_out`` epochs (cartography's ``--burn_out``).
    progress : bool, default False

    Returns
    -------
    pandas.DataFrame
        One row per sample (index: sample ids, or positions), columns:

        - ``label``;
        - ``confidence``: mean over epochs of the label's probability p;
        - ``variability``: population standard deviation of p (0 with one epoch);
        - ``correctness``: share of epochs classified correctly;
        - ``forgetfulness``: number of forgetting events (correct at an epoch, wrong at the
          next); 0 for samples never learned, which ``never_learned`` flags;
        - ``never_learned``: never classified correctly;
        - ``threshold_closeness``: c (1 - c), c the confidence;
        - ``aum``: area under the margin, mean over epochs of the label's logit minus the
          largest other logit; NaN for a probabilities run (a warning says so: AUM is
          defined on logits);
        - ``region``: "easy-to-learn", "ambiguous" or "hard-to-learn" (see `regions`).

        ``attrs["thresholds"]`` holds the region thresholds (``variability``,
        ``confidence``), ``attrs["n_epochs"]`` the epochs used.
    """
    check_run("run", run)
    check_bool("progress", progress)
    n_epochs = check_burn_out(burn_out, run.n_epochs)
    if not kind_of(run).logit_margins:
        warnings.warn("the run holds probabilities: aum (defined on logits) is NaN",
                      UserWarning, stacklevel=2)
    df = executor_for(run).map_reduce(run, partial(_sample_table, burn_out=n_epochs),
                                      progress=progress, desc="training dynamics")
    confidence, variability = df["confidence"].to_numpy(), df["variability"].to_numpy()
    df["region"] = regions(confidence, variability)
    v_cut, c_cut = region_thresholds(confidence, variability)
    df.attrs["thresholds"] = {"variability": v_cut, "confidence": c_cut}
    df.attrs["n_epochs"] = n_epochs
    return df


def _sample_table(run, *, burn_out, progress=False):
    """The per-sample columns of `data_map` (all but ``region``) of a run or a chunk of its
    samples: one row per sample, from one `trajectory` pass."""
    t = trajectory(run, burn_out=burn_out, progress=progress)
    return pd.DataFrame(
        {
            "label": run.labels,
            "confidence": t.confidence,
            "variability": t.variability,
            "correctness": t.correctness,
            "forgetfulness": t.forgetfulness,
            "never_learned": t.never_learned,
            "threshold_closeness": t.confidence * (1 - t.confidence),
            "aum": t.margin if kind_of(run).logit_margins else np.full(run.n_samples, np.nan),
        },
        index=sample_index(run),
    )


#: How `select` orders each region: (column, descending).
_ORDER = {"easy-to-learn": ("confidence", True), "ambiguous": ("variability", True),
          "hard-to-learn": ("confidence", False)}


def select(run_or_datamap, *, region, frac=None):
    """Sample ids of a data-map region, as Dataset Cartography's filtering selects them.

    Parameters
    ----------
    run_or_datamap : Run or pandas.DataFrame
        A run (its `data_map` is computed) or a data map.
    region : {"easy-to-learn", "ambiguous", "hard-to-learn"} (or "easy", "hard")
    frac : float in (0, 1], optional
        Select the ``int(frac * n_samples)`` samples at the region's end of its metric:
        ambiguous the highest variability, easy-to-learn the highest confidence,
        hard-to-learn the lowest confidence (cartography's orders; its 33% subsets use
        frac = 0.33). None: the samples of the ``region`` column, in the same order.

    Returns
    -------
    ndarray of shape (n_selected,)
        Sample ids (the data map's index), the region's most typical first; ties keep run
        order.
    """
    region = REGION_ALIASES.get(region, region) if isinstance(region, str) else region
    check_option("region", region, REGIONS + tuple(REGION_ALIASES))
    if frac is not None:
        frac = check_number("frac", frac)  # its range: below
    if not isinstance(run_or_datamap, pd.DataFrame):
        check_run("run_or_datamap", run_or_datamap)
    dm = run_or_datamap if isinstance(run_or_datamap, pd.DataFrame) else data_map(run_or_datamap)
    column, descending = _ORDER[region]
    needed = {column} | ({"region"} if frac is None else set())
    missing = needed - set(dm.columns)
    if missing:
        raise ForgetkitError(f"run_or_datamap must be a Run or a data map with columns "
                             f"{sorted(needed)}; missing {sorted(missing)}")
    values = dm[column].to_numpy(dtype=np.float64)
    order = np.argsort(-values if descending else values, kind="stable")
    if frac is None:
        in_region = (dm["region"] == region).to_numpy()
        return dm.index.to_numpy()[order[in_region[order]]]
    if not 0.0 < frac <= 1.0:
        raise ForgetkitError(f"frac must lie in (0, 1]; got {frac}")
    n = int(frac * len(dm))
    if n == 0:
        raise ForgetkitError(f"frac={frac} of {len(dm)} samples selects none")
    return dm.index.to_numpy()[order[:n]]
