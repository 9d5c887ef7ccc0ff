"""The paper's figures. Each function takes ``ax=None`` (a new figure is made), returns the
Axes and never calls ``plt.show()``; matplotlib is imported inside."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._deprecation import renamed
from .._validation import check_frame
from ..analysis import dynamics, forgetting
from ..errors import ForgetkitError
from ..run import Run, check_run, check_runs
from ..theory.noise import large_loss_dominance


def _axes(ax, figsize=(6.4, 4.0)):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _plain(text):
    """``text`` shown as written in a legend: a "$" is escaped, never read as math."""
    return str(text).replace("$", r"\$")


def class_names(run):
    """The run's class names, or "class 0", "class 1", ... when it has none."""
    check_run("run", run)
    return run.class_names or [f"class {c}" for c in range(run.n_classes)]


def accuracy_retention(run, *, ax=None):
    """Test accuracy per epoch and the share of samples correct at that epoch *and* at the
    end (paper Fig. 2a-b); the gap between the curves is the forget fraction F_e. Double
    descent phases are marked when found."""
    check_run("run", run)
    ax = _axes(ax)
    correct = forgetting.correctness(run)
    acc = correct.mean(axis=1)
    kept = (correct & correct[-1]).mean(axis=1)
    ax.plot(run.epochs, 100 * acc, label="test accuracy", color="C0")
    ax.plot(run.epochs, 100 * kept, label="correct at epoch and at the end", color="C1")
    ax.fill_between(run.epochs, 100 * kept, 100 * acc, color="C3", alpha=0.2,
                    label="forgotten by the end (F_e)")
    dd = forgetting.double_descent(run)
    if dd.found:
        ax.axvspan(dd.peak_epoch, dd.dip_epoch, color="0.85", zorder=0,
                   label="double-descent dip")
        ax.axvline(dd.second_peak_epoch, color="0.5", ls=":", lw=1)
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of test samples (%)")
    ax.set_title("Accuracy and what of it survives to the end")
    ax.legend(loc="lower right", fontsize="small")
    return ax


def forget_learn(runs, *, labels=None, ax=None):
    """Forget fraction F_e (solid) and learn fraction L_e (dashed) per epoch (Fig. 3a).

    ``runs``: one Run or a list (e.g. model sizes or data fractions) with ``labels``.
    """

    runs = [runs] if isinstance(runs, Run) else check_runs("runs", runs)
    labels = labels or ([""] if len(runs) == 1 else [f"run {i}" for i in range(len(runs))])
    if isinstance(labels, str) or len(labels) != len(runs):
        raise ForgetkitError(f"labels must be a sequence of {len(runs)} names (one per run); "
                             f"got {labels!r}"[:200])
    ax = _axes(ax)
    for i, (run, name) in enumerate(zip(runs, labels, strict=True)):
        name = _plain(name)
        sep = ": " if name else ""
        ax.plot(run.epochs, 100 * forgetting.forget_fraction(run), color=f"C{i}",
                label=f"{name}{sep}F_e (forget)")
        ax.plot(run.epochs, 100 * forgetting.learn_fraction(run), color=f"C{i}", ls="--",
                label=f"{name}{sep}L_e (learn)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of test samples (%)")
    ax.set_title("Forget and learn fractions against the final model")
    ax.legend(fontsize="small")
    return ax


def _wrong_at_end(run):
    df = forgetting.sample_dynamics(run)
    return df[~df["correct_final"]]


def epochs_correct_hist(run, *, ax=None):
    """Among samples wrong after training: how many epochs each was correct (Fig. 3b)."""
    ax = _axes(ax)
    wrong = _wrong_at_end(run)
    ax.hist(wrong["epochs_correct"], bins=np.arange(run.n_epochs + 2) - 0.5, color="C0")
    ax.set_xlabel("number of epochs correct")
    ax.set_ylabel("samples wrong at the end")
    ax.set_title(f"{len(wrong)} samples wrong at the end: epochs they were right")
    return ax


def last_correct_hist(run, *, ax=None):
    """Among samples wrong after training but correct at some epoch: the last epoch they
    were correct (Fig. 3c)."""
    ax = _axes(ax)
    last = _wrong_at_end(run)["last_correct"].dropna().astype(int)
    edges = np.append(run.epochs, run.epochs[-1] + 1) - 0.5
    ax.hist(last, bins=edges, color="C3")
    ax.set_xlabel("last epoch correct")
    ax.set_ylabel("forgotten samples")
    ax.set_title(f"{len(last)} forgotten samples: when they were last right")
    return ax


def noisy_dominance(losses, noise_mask, *, epochs=None, frac=None, ax=None):
    """Clean minus noisy count among the large-loss training points per epoch (Fig. 2c-d).

    ``losses``: (n_epochs, n_samples) training losses or a training-set Run.
    """

    ax = _axes(ax)
    diff = large_loss_dominance(losses, noise_mask, frac=frac)
    x = np.arange(len(diff)) if epochs is None else np.asarray(epochs)
    ax.axhline(0, color="0.5", lw=1)
    ax.plot(x, diff, color="C2", marker=".")
    ax.set_xlabel("epoch")
    ax.set_ylabel("clean − noisy among large-loss points")
    ax.set_title("Which points dominate the large-loss set")
    return ax


def _gain_curve(ax, grouped, x, xlabel, title):
    """Mean gain over splits with standard errors against ``x``."""
    ax = _axes(ax)
    ax.errorbar(x, grouped["gain"].mean(), yerr=grouped["gain"].sem().fillna(0), marker="o",
                capsize=3)
    ax.axhline(0, color="0.5", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test gain over single network (pp)")
    ax.set_title(title)
    return ax


def gain_vs_checkpoints(curve, *, ax=None):
    """KF gain over the single network against the ensemble size k (App. figure), from
    `forgetkit.evaluate.ensemble_size_curve`: mean over splits with standard errors."""
    g = check_frame("curve", curve, ("windows", "k", "gain")).groupby("windows")
    return _gain_curve(ax, g, g["k"].mean(), "checkpoints used (k)",
                       "KF(i): gain against ensemble size")


def gain_vs_window(curve, *, ax=None):
    """KF(inf) gain against the window size w, from `forgetkit.evaluate.window_curve`."""
    g = check_frame("curve", curve, ("window", "gain")).groupby("window")
    return _gain_curve(ax, g, g["gain"].mean().index, "window w (epochs averaged: 2w + 1)",
                       "KF(inf): gain against window size")


def compare_methods(table, *, ax=None):
    """Test accuracy of each method with standard errors, from `forgetkit.compare`."""
    check_frame("table", table, ("label", "k", "accuracy", "accuracy_se"))
    ax = _axes(ax)
    y = np.arange(len(table))[::-1]
    err = np.nan_to_num(table["accuracy_se"].to_numpy())
    ax.errorbar(table["accuracy"], y, xerr=err, fmt="o", capsize=3)
    ax.axvline(table.loc["single", "accuracy"] if "single" in table.index else np.nan,
               color="0.5", ls=":", lw=1)
    ax.set_yticks(y, [f"{lab} (k={k:.0f})" for lab, k in zip(table["label"], table["k"],
                                                              strict=True)],
                  parse_math=False)
    ax.set_xlabel("test accuracy (%), mean ± standard error over splits")
    ax.set_title("Knowledge Fusion against the baselines")
    return ax


def per_class_forgetting(run, *, ax=None):
    """Share of each class's samples that were learned and then forgotten by the end."""
    check_run("run", run)
    ax = _axes(ax)
    df = forgetting.sample_dynamics(run)
    share = df.groupby("label")["forgotten"].mean().reindex(range(run.n_classes), fill_value=0)
    names = class_names(run)
    order = np.argsort(share.to_numpy())
    ax.barh(np.arange(run.n_classes), 100 * share.to_numpy()[order], color="C3")
    ax.set_yticks(np.arange(run.n_classes), [names[i] for i in order], parse_math=False)
    ax.set_xlabel("samples forgotten by the end (% of the class)")
    ax.set_title("Which classes lose the most to forgetting")
    return ax


def confidence_variability(dm_or_run, *, ax=None, gridsize=50):
    """Dataset Cartography's data map: confidence against variability, one hexagon per cell
    of samples, coloured by the cell's mean correctness and shaded by its density (opaque
    where most samples lie), so it stays readable at millions of points. Dashed lines mark
    the region thresholds of `forgetkit.data_map`.

    ``dm_or_run``: a data map (`forgetkit.data_map`) or a Run (its data map is computed).
    """
    import matplotlib as mpl

    if isinstance(dm_or_run, pd.DataFrame):
        dm = check_frame("dm_or_run", dm_or_run, ("variability", "confidence", "correctness"))
    else:
        dm = dynamics.data_map(check_run("dm_or_run", dm_or_run))
    ax = _axes(ax, figsize=(6.4, 5.0))
    x = dm["variability"].to_numpy(dtype=np.float64)
    y = dm["confidence"].to_numpy(dtype=np.float64)
    extent = (0.0, max(0.5, float(x.max())), 0.0, 1.0)
    kw = dict(gridsize=gridsize, extent=extent, mincnt=1)
    counts = ax.hexbin(x, y, C=np.ones_like(x), reduce_C_function=np.sum, **kw)
    n = counts.get_array()
    counts.remove()
    cells = ax.hexbin(x, y, C=dm["correctness"].to_numpy(dtype=np.float64),
                      reduce_C_function=np.mean, **kw)
    cmap, norm = mpl.colormaps["RdYlBu"], mpl.colors.Normalize(0.0, 1.0)
    colors = cmap(norm(cells.get_array()))
    # clipped: the densest cell's share can round to just above 1, which matplotlib refuses
    colors[:, 3] = np.clip(0.2 + 0.8 * np.log1p(n) / np.log1p(n.max()), 0.0, 1.0)
    cells.set_array(None)
    cells.set_facecolor(colors)
    cells.set_edgecolor("none")
    ax.figure.colorbar(mpl.cm.ScalarMappable(norm, cmap), ax=ax,
                       label="correctness (cell mean); opacity: density")
    v_cut, c_cut = dynamics.region_thresholds(y, x)
    ax.axvline(v_cut, color="0.3", ls="--", lw=1)
    ax.plot([extent[0], v_cut], [c_cut, c_cut], color="0.3", ls="--", lw=1)
    box = dict(boxstyle="round,pad=0.3", fc="white", alpha=0.8)
    ax.text((v_cut + extent[1]) / 2, 0.5, "ambiguous", ha="center", va="center", bbox=box)
    ax.text(v_cut / 2, (c_cut + 1) / 2, "easy-to-learn", ha="center", va="center", bbox=box)
    ax.text(v_cut / 2, c_cut / 2, "hard-to-learn", ha="center", va="center", bbox=box)
    ax.set_xlim(extent[:2])
    ax.set_ylim(extent[2:])
    ax.set_xlabel("variability")
    ax.set_ylabel("confidence")
    ax.set_title(f"Data map: {len(dm):,} samples")
    return ax


#: Deprecated: the figure's old name, which `forgetkit.data_map` (the table) also has.
data_map = renamed(confidence_variability, "data_map", where="forgetkit.plots")
