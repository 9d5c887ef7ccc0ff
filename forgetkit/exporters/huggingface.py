"""Record a Hugging Face `transformers.Trainer`'s outputs on a dataset at every epoch's end.

    from forgetkit.exporters.huggingface import LogitRecorderCallback

    trainer = Trainer(model, args, train_dataset=train, eval_dataset=test,
                      callbacks=[LogitRecorderCallback("run.npy")])
    trainer.train()

The callback evaluates the model on ``dataset`` (default: the Trainer's eval dataset) in
batches made by the Trainer's data collator, with the columns the Trainer would keep, through
`forgetkit.exporters.torch.LogitRecorder` (dict batches; ``labels`` left out of the model's
keyword arguments; ``ModelOutput.logits`` taken). Under a multi-GPU Trainer (torchrun,
accelerate) each process evaluates its shard and the main process writes every sample once.
"""

from __future__ import annotations

import inspect
import sys

from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, default_data_collator

from ..errors import ForgetkitError
from .torch import LogitRecorder

__all__ = ["LogitRecorderCallback"]

#: How many calling frames are searched for the Trainer that runs the callback.
MAX_FRAMES = 16


def calling_trainer():
    """The `transformers.Trainer` whose training loop called the current callback event, or
    None. (A TrainerCallback receives the model and dataloaders but not the Trainer, whose
    eval dataset and data collator the callback needs.)"""
    frame = sys._getframe(1)
    for _ in range(MAX_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def kept_columns(model, args, label_key):
    """The input names the Trainer keeps for ``model`` (its forward's parameters, the label
    names), or None when ``args.remove_unused_columns`` is off."""
    if not getattr(args, "remove_unused_columns", True):
        return None
    forward = getattr(model, "get_base_model", lambda: model)().forward
    names = set(inspect.signature(forward).parameters)
    return names | {"label", "label_ids", label_key} | set(args.label_names or [])


def without_unused(collate, keep):
    """``collate`` applied to features less the keys not in ``keep`` (dict features)."""
    def collate_kept(features):
        return collate([{k: v for k, v in f.items() if k in keep}
                        if isinstance(f, dict) else f for f in features])

    return collate_kept


class LogitRecorderCallback(TrainerCallback):
    """A `transformers.TrainerCallback` recording the model's outputs on ``dataset`` at the
    end of every epoch (epoch numbers 0, 1, ...), closing the run when training ends.

    Parameters
    ----------
    path : str or Path
        ``.npy`` or ``.parquet`` run file (``.npy`` with ``summary=True``).
    dataset : torch Dataset or datasets.Dataset of dict samples, optional
        Default: the Trainer's ``eval_dataset``.
    batch_size : int, optional
        Default: the Trainer's evaluation batch size.
    collate_fn : callable, optional
        Default: the Trainer's data collator.
    **options
        Passed to `forgetkit.exporters.torch.LogitRecorder` (``dtype``, ``summary``,
        ``label_key``, ``sample_ids``, ``meta``, ``mode``, ``durable``...).

    Attributes
    ----------
    recorder : LogitRecorder, made when training begins
    accuracy_ : list of float, the recorded accuracy of each epoch
    """

    def __init__(self, path, dataset=None, *, batch_size=None, collate_fn=None, **options):
        self.path = path
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.options = options
        self.recorder = None
        self.accuracy_ = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        trainer = calling_trainer()
        dataset = self.dataset
        if dataset is None:
            dataset = None if trainer is None else trainer.eval_dataset
            if dataset is None:
                raise ForgetkitError("LogitRecorderCallback records on dataset=..., or on the "
                                     "Trainer's eval_dataset; the Trainer has none")
            if isinstance(dataset, dict):
                raise ForgetkitError(f"the Trainer has several eval datasets "
                                     f"({sorted(dataset)}); pass dataset=... to choose one")
        collate = self.collate_fn or (trainer.data_collator if trainer is not None
                                      else default_data_collator)
        keep = kept_columns(model, args, self.options.get("label_key", "labels"))
        if keep is not None:
            names = getattr(dataset, "column_names", None)  # a datasets.Dataset
            if names is not None:
                dataset = dataset.remove_columns([c for c in names if c not in keep])
            else:
                collate = without_unused(collate, keep)
        loader = DataLoader(dataset, batch_size=self.batch_size or args.eval_batch_size,
                            collate_fn=collate, num_workers=args.dataloader_num_workers,
                            pin_memory=args.dataloader_pin_memory)
        self.recorder = LogitRecorder(self.path, loader, **self.options)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        # state.epoch is e + 1 (a float) when epoch e ends
        self.accuracy_.append(self.recorder.record(model, int(round(state.epoch)) - 1))

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.close()
