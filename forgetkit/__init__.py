"""forgetkit: local overfitting (forgetting) in stored training runs, and Knowledge Fusion.

Method: "On Local Overfitting and Forgetting in Deep Neural Networks" (Stern, Yaacoby,
Weinshall, AAAI 2025). Deep-learning frameworks are never imported here; see
``forgetkit.exporters`` for the PyTorch and JAX writers.
"""

from .forgetting import (
    accuracy,
    correctness,
    double_descent,
    forget_fraction,
    learn_fraction,
    predictions,
    sample_dynamics,
)
from .io import RunWriter, convert, load, load_cartography, save
from .run import Run, split_indices

__version__ = "0.1.0"

__all__ = [
    "Run",
    "RunWriter",
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
