"""forgetkit: local overfitting (forgetting) in stored training runs, and Knowledge Fusion.

Method: "On Local Overfitting and Forgetting in Deep Neural Networks" (Stern, Yaacoby,
Weinshall, AAAI 2025). Deep-learning frameworks are never imported here; see
``forgetkit.exporters`` for the PyTorch and JAX writers.

Subpackages: ``io`` (formats, atomic writes, `RunWriter`), ``kernels`` (numba, private),
``analysis`` (forgetting), ``fusion`` (Knowledge Fusion and the baselines), ``theory``
(section 4, fairness, label noise), ``report`` (figures, HTML); modules ``run`` (`Run`),
``evaluate`` (the split-half protocol), ``cli``.

Short module paths: ``forgetkit.fairness``, ``forgetkit.linear`` and ``forgetkit.noise`` are
``forgetkit.theory.*``, ``forgetkit.plots`` is ``forgetkit.report.plots`` and
``forgetkit.distill`` is ``forgetkit.fusion.distill``; each imports under either path (the
same module). Every public name, its signature and return type: docs/api.md.
"""

import sys as _sys

from . import datasets, errors, evaluate
from .analysis import (
    accuracy,
    correctness,
    data_map,
    data_scores,
    double_descent,
    forget_fraction,
    learn_fraction,
    mean_surprisal,
    memorization,
    memorized_spans,
    pred_probs,
    predictions,
    sample_dynamics,
    select,
    select_coreset,
    sequence_dynamics,
    surprisal,
)
from .analysis.label_issues import label_issues
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
from .fusion.distill import read_soft_targets, soft_targets, write_soft_targets
from .io import (
    RunWriter,
    SummaryWriter,
    TopKWriter,
    convert,
    load,
    load_cartography,
    save,
    summarize,
    to_topk,
    verify,
)
from .report import explore, plots, write_report
from .run import Run
from .splits import split_indices
from .theory import fairness, linear, noise

# the short paths import too (one module object under both names)
for _name, _module in (("fairness", fairness), ("linear", linear), ("noise", noise),
                       ("plots", plots), ("distill", distill)):
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module

__version__ = "0.1.0"

__all__ = [
    # modules
    "datasets",
    "distill",
    "errors",
    "evaluate",
    "fairness",
    "linear",
    "noise",
    "plots",
    # classes and functions
    "ForgetkitError",
    "CheckpointAverage",
    "EarlyStopping",
    "EnsembleSelection",
    "KnowledgeFusion",
    "LikelihoodFusion",
    "Run",
    "RunWriter",
    "Fuser",
    "average_runs",
    "write_report",
    "explore",
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
    "verify",
    "SummaryWriter",
    "TopKWriter",
    "to_topk",
    "select",
    "select_coreset",
    "data_scores",
    "soft_targets",
    "split_indices",
    "write_soft_targets",
    "read_soft_targets",
    # token runs (language models)
    "mean_surprisal",
    "memorization",
    "memorized_spans",
    "sequence_dynamics",
    "surprisal",
]


def __getattr__(name):
    # fk.sweep runs on dask.distributed, an optional dependency: imported on first use only
    if name == "sweep":
        from .distributed.sweep import sweep

        return sweep
    raise AttributeError(f"module 'forgetkit' has no attribute {name!r}")
