"""forgetkit: local overfitting (forgetting) in stored training runs, and Knowledge Fusion.

Method: "On Local Overfitting and Forgetting in Deep Neural Networks" (Stern, Yaacoby,
Weinshall, AAAI 2025). Deep-learning frameworks are never imported here; see
``forgetkit.exporters`` for the PyTorch and JAX writers.

Subpackages: ``io`` (formats, atomic writes, `RunWriter`), ``kernels`` (numba, private),
``analysis`` (forgetting), ``fusion`` (Knowledge Fusion and the baselines), ``theory``
(section 4, fairness, label noise), ``report`` (figures, HTML); modules ``run`` (`Run`),
``evaluate`` (the split-half protocol), ``cli``.
"""

from . import datasets, errors, evaluate
from .analysis import (
    accuracy,
    correctness,
    data_map,
    data_scores,
    double_descent,
    forget_fraction,
    label_issues,
    learn_fraction,
    pred_probs,
    predictions,
    sample_dynamics,
    select,
    select_coreset,
)
from .errors import ForgetkitError
from .evaluate import compare, compare_splits, format_table, mcnemar
from .fusion import (
    CheckpointAverage,
    EarlyStopping,
    EnsembleSelection,
    Fuser,
    KnowledgeFusion,
    LikelihoodFusion,
    average_runs,
    distill,
    fixed_jumps,
    horizontal,
    load_fuser,
    multi_run,
    single,
    snapshot,
    uniform,
)
from .io import RunWriter, SummaryWriter, convert, load, load_cartography, save, summarize
from .report import plots, write_report
from .run import Run, split_indices
from .theory import fairness, linear, noise

__version__ = "0.1.0"

__all__ = [
    "ForgetkitError",
    "errors",
    "CheckpointAverage",
    "EarlyStopping",
    "EnsembleSelection",
    "KnowledgeFusion",
    "LikelihoodFusion",
    "Run",
    "RunWriter",
    "Fuser",
    "average_runs",
    "datasets",
    "distill",
    "evaluate",
    "fairness",
    "linear",
    "noise",
    "plots",
    "write_report",
    "compare",
    "compare_splits",
    "fixed_jumps",
    "format_table",
    "horizontal",
    "mcnemar",
    "multi_run",
    "single",
    "snapshot",
    "uniform",
    "accuracy",
    "convert",
    "correctness",
    "data_map",
    "double_descent",
    "forget_fraction",
    "label_issues",
    "learn_fraction",
    "load",
    "load_cartography",
    "load_fuser",
    "pred_probs",
    "predictions",
    "sample_dynamics",
    "save",
    "summarize",
    "SummaryWriter",
    "select",
    "select_coreset",
    "data_scores",
    "split_indices",
]


def __getattr__(name):
    # fk.sweep runs on dask.distributed, an optional dependency: imported on first use only
    if name == "sweep":
        from .distributed import sweep

        return sweep
    raise AttributeError(f"module 'forgetkit' has no attribute {name!r}")
