"""Record a Hugging Face `transformers.Trainer`'s outputs on a dataset at every epoch's end.

    from forgetkit.exporters.huggingface import LogitRecorderCallback

    trainer = Trainer(model, args, train_dataset=train, eval_dataset=test,
                      callbacks=[LogitRecorderCallback("run.npy", test)])
    trainer.train()

The callback evaluates the model on ``dataset`` in batches made by the Trainer's data
collator, with the columns the Trainer would keep, through
`forgetkit.exporters.torch.LogitRecorder` (dict batches; ``labels`` left out of the model's
keyword arguments; ``ModelOutput.logits`` taken). Under a multi-GPU Trainer (torchrun,
accelerate) each process evaluates its shard and the main process writes every sample once.
"""

from __future__ import annotations

import inspect

from torch.utils.data import DataLoader
from transformers import TrainerCallback, default_data_collator

from ..errors import ForgetkitError
from .torch import LogitRecorder

__all__ = ["LogitRecorderCallback"]


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
        The samples to record on (e.g. the Trainer's ``eval_dataset``). Default: the
        dataset of the Trainer's evaluation DataLoader, which a callback is given only after
        an evaluation ran; so pass it.
    batch_size : int, optional
        Default: the Trainer's evaluation batch size.
    collate_fn : callable, optional
        Default: the Trainer's data collator (the ``collate_fn`` of the training DataLoader
        the Trainer passes to its callbacks).
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

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None,
                       eval_dataloader=None, **kwargs):
        # everything comes from the callback's arguments: the Trainer itself is not one
        dataset = self.dataset
        if dataset is None:
            dataset = getattr(eval_dataloader, "dataset", None)
            if dataset is None:
                raise ForgetkitError("LogitRecorderCallback needs dataset=... (e.g. the "
                                     "Trainer's eval_dataset): a TrainerCallback is not given "
                                     "the Trainer's eval dataset before an evaluation")
        collate = self.collate_fn or getattr(train_dataloader, "collate_fn", None) \
            or default_data_collator
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
