"""forgetkit: local overfitting (forgetting) in stored training runs, and Knowledge Fusion.

Method: "On Local Overfitting and Forgetting in Deep Neural Networks" (Stern, Yaacoby,
Weinshall, AAAI 2025). Deep-learning frameworks are never imported here; see
``forgetkit.exporters`` for the PyTorch and JAX writers.
"""

from . import baselines, datasets, distill, fairness, linear, noise, plots, report
from .baselines import (
    CheckpointAverage,
    EarlyStopping,
    EnsembleSelection,
    average_runs,
    fixed_jumps,
    horizontal,
    multi_run,
    single,
    snapshot,
    uniform,
)
from .evaluate import compare, compare_splits, format_table, mcnemar
from .forgetting import (
    accuracy,
    correctness,
    double_descent,
    forget_fraction,
    learn_fraction,
    predictions,
    sample_dynamics,
)
from .fusion import KnowledgeFusion, LikelihoodFusion
from .io import RunWriter, convert, load, load_cartography, save
from .run import Run, split_indices

__version__ = "0.1.0"

__all__ = [
    "CheckpointAverage",
    "EarlyStopping",
    "EnsembleSelection",
    "KnowledgeFusion",
    "LikelihoodFusion",
    "Run",
    "RunWriter",
    "average_runs",
    "baselines",
    "datasets",
    "distill",
    "fairness",
    "linear",
    "noise",
    "plots",
    "report",
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
    "double_descent",
    "forget_fraction",
    "learn_fraction",
    "load",
    "load_cartography",
    "predictions",
    "sample_dynamics",
    "save",
    "split_indices",
]
