"""Fusers: combine a run's checkpoints into one predictor, fitted on validation data.

- ``base``: the `Fuser` base (scikit-learn parameters, one ``predict_proba``, JSON);
- ``knowledge``: Knowledge Fusion (the paper's method);
- ``likelihood``: likelihood-weighted fusion;
- ``selection``: greedy ensemble selection;
- ``averages``: fixed checkpoint averages and early stopping (the baselines);
- ``distill``: soft targets of a fitted fuser for self-distillation.
"""

from .averages import (
    CheckpointAverage,
    EarlyStopping,
    average_runs,
    fixed_epochs,
    fixed_jumps,
    horizontal,
    multi_run,
    single,
    snapshot,
    uniform,
)
from .base import Fuser, load_fuser, register_fuser
from .fitstate import best_continuous_eps
from .knowledge import KnowledgeFusion
from .likelihood import LikelihoodFusion
from .selection import EnsembleSelection

# the fusers load_fuser reads (a new fuser: its module and one line here)
for _fuser in (KnowledgeFusion, LikelihoodFusion, EnsembleSelection, CheckpointAverage,
               EarlyStopping):
    register_fuser(_fuser)
del _fuser

__all__ = [
    "CheckpointAverage",
    "EarlyStopping",
    "EnsembleSelection",
    "Fuser",
    "KnowledgeFusion",
    "LikelihoodFusion",
    "average_runs",
    "best_continuous_eps",
    "fixed_epochs",
    "fixed_jumps",
    "horizontal",
    "load_fuser",
    "multi_run",
    "single",
    "snapshot",
    "uniform",
]
