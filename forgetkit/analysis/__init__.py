"""Analyses of a run's training dynamics: forgetting (paper section 3), data maps and AUM
(``dynamics``), label issues (``label_issues``), pruning scores and coresets (``scores``),
token runs of language models: surprisal, memorization, per-sequence tables (``tokens``).

Each submodule is reachable under its own name (``forgetkit.analysis.label_issues`` is the
module; the function is ``forgetkit.label_issues``, also
``forgetkit.analysis.label_issues.label_issues``)."""

from .._deprecation import callable_module
from . import dynamics, forgetting, label_issues, scores, tokens
from .dynamics import REGIONS, data_map, select, trajectory
from .forgetting import (
    DoubleDescent,
    accuracy,
    correctness,
    double_descent,
    forget_fraction,
    learn_fraction,
    predictions,
    sample_dynamics,
    summary,
)
from .label_issues import (
    confident_joint,
    pred_probs,
    ranking_metrics,
    set_metrics,
)
from .scores import data_scores, select_coreset
from .tokens import (
    mean_surprisal,
    memorization,
    memorized_spans,
    sequence_dynamics,
    surprisal,
)

__all__ = ["DoubleDescent", "REGIONS", "accuracy", "confident_joint", "correctness", "data_map",
           "double_descent", "dynamics", "forget_fraction", "forgetting", "label_issues",
           "learn_fraction", "pred_probs", "predictions", "ranking_metrics", "sample_dynamics",
           "select", "set_metrics", "summary", "trajectory"]
__all__ += ["data_scores", "select_coreset", "scores"]
__all__ += ["mean_surprisal", "memorization", "memorized_spans", "sequence_dynamics",
            "surprisal", "tokens"]

# calling forgetkit.analysis.label_issues(run), the function this module was shadowed by,
# still works with a FutureWarning
callable_module(label_issues, label_issues.label_issues)
