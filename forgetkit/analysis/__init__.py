"""Analyses of a run's training dynamics: forgetting (paper section 3), data maps and AUM
(``dynamics``), label issues (``label_issues``), pruning scores and coresets (``scores``)."""

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
    label_issues,
    pred_probs,
    ranking_metrics,
    set_metrics,
)
from .scores import data_scores, select_coreset

__all__ = ["DoubleDescent", "REGIONS", "accuracy", "confident_joint", "correctness", "data_map",
           "double_descent", "forget_fraction", "label_issues", "learn_fraction", "pred_probs",
           "predictions", "ranking_metrics", "sample_dynamics", "select", "set_metrics", "summary",
           "trajectory"]
__all__ += ["data_scores", "select_coreset"]
