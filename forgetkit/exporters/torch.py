"""Record a PyTorch model's outputs on fixed evaluation data once per epoch.

    from forgetkit.exporters.torch import LogitRecorder

    recorder = LogitRecorder("run.npy", test_loader)      # DataLoader with shuffle=False
    for epoch in range(epochs):
        train_one_epoch(model)
        recorder.record(model, epoch)
    recorder.close()

Under torch.distributed (a process group initialised by torchrun, Lightning's or accelerate's
DDP) the same lines run on every rank: each rank evaluates its shard, rank 0 writes the epoch
in dataset order, the other ranks write nothing (see `forgetkit.exporters._torch_distributed`).
Batches are (inputs, labels) pairs or dicts (Hugging Face style: the dict less its labels goes
to the model as keyword arguments).

Also here: `TokenRecorder` (a language model's top-k token runs), `replay` (the same runs from
saved checkpoints) and the weight-space tools `average_weights` and `compare_weight_space`
(`forgetkit.exporters.weight_space`).
"""

from ._torch_devices import (  # noqa: F401  (public here since they were defined here)
    correct_count,
    default_output,
    host_copy,
    integer_labels,
    split_batch,
    summary_rows,
)
from ._torch_logits import LogitRecorder
from ._torch_replay import replay
from ._torch_tokens import TokenRecorder
from .weight_space import average_weights, compare_weight_space

__all__ = ["LogitRecorder", "TokenRecorder", "average_weights", "compare_weight_space",
           "replay"]
