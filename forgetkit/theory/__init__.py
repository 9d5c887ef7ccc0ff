"""The paper's analyses beyond a single run: deep linear models and PCA (section 4),
fairness of forgetting, and label noise."""

from . import fairness, linear, noise

__all__ = ["fairness", "linear", "noise"]
