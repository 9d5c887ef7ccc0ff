"""Analyses of a run's training dynamics: forgetting (paper section 3)."""

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

__all__ = ["DoubleDescent", "accuracy", "correctness", "double_descent", "forget_fraction",
           "learn_fraction", "predictions", "sample_dynamics", "summary"]
