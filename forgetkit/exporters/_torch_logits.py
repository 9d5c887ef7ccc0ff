"""`LogitRecorder`: a PyTorch model's outputs on fixed evaluation data, once per epoch (the
class `forgetkit.exporters.torch` exports)."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from ..errors import ForgetkitError
from . import _torch_distributed as ddp
from ._common import RecorderBase, check_class_counts
from ._torch_devices import (
    correct_count,
    default_output,
    host_copy,
    integer_labels,
    split_batch,
    summary_rows,
    to_device,
)

__all__ = ["LogitRecorder"]


class LogitRecorder(RecorderBase):
    """Append the model's outputs on ``data`` to a forgetkit run at every `record` call.

    Parameters
    ----------
    path : str or Path
        ``.npy`` or ``.parquet`` run file (``.npy`` with ``summary=True``); an existing run
        there is appended to (a resumed training), as long as it holds the same samples
        (matched by sample id) and classes.
    data : DataLoader or iterable of batches, or an (inputs, labels) pair of tensors
        Batches are (inputs, labels, ...) tuples or dicts holding the labels under
        ``label_key``. Must yield the same samples in the same order every epoch.
    output_fn : callable, optional
        Maps the model's output to the (batch, n_classes) logits tensor (default: the tensor,
        the first element of a tuple, ``out["logits"]`` or ``out.logits``).
    batch_size : int, used when ``data`` is a pair of tensors (and for the shards of a
        DataLoader that has no batch size of its own).
    label_key : str, default "labels"
        The labels' key in dict batches; the other entries are passed to the model as
        keyword arguments.
    group : torch.distributed ProcessGroup, optional
        The group to gather over (default: the world, when a process group is initialised).
    **options
        The recorder options (`forgetkit.exporters._common.RecorderOptions`): ``dtype``
        ("float16" default, the stored precision), ``summary`` (store the summary of each
        sample's logits, computed on the model's device), ``sample_ids``, ``max_pending``,
        ``durable``, and ``kind``, ``format``, ``layout``, ``meta``, ``class_names``,
        ``mode`` for `forgetkit.RunWriter`.

    `record` evaluates on the training thread; the device-to-host copy and the disk write
    run on a background thread (an error there is raised by the next `record` or `close`).
    """

    def __init__(self, path, data, *, output_fn=None, batch_size=1024, label_key="labels",
                 group=None, **options):
        super().__init__(path, **options)
        if (isinstance(data, (tuple, list)) and len(data) == 2
                and all(isinstance(t, torch.Tensor) for t in data)):
            inputs, labels = data
            if len(inputs) != len(labels):
                raise ForgetkitError(f"inputs ({len(inputs)}) and labels ({len(labels)}) "
                                     "differ in length")
            data = [(inputs[i:i + batch_size], labels[i:i + batch_size])
                    for i in range(0, len(inputs), batch_size)]
        self.data = data
        self.batch_size = batch_size
        self.label_key = label_key
        self.group = group
        self.output_fn = output_fn or default_output
        self._torch_dtype = getattr(torch, self.dtype.name)
        # float64 logits are summarised on the host (exactly); others in float32 on device
        self._device_summary = self.summary and self.dtype != np.float64
        self._shard_loaders = {}

    def record(self, model, epoch):
        """Run ``model`` in eval mode without gradients over the data and store the outputs
        as epoch number ``epoch``; return the epoch's accuracy. The model's train/eval mode is
        restored afterwards. Under torch.distributed every rank must call it; each evaluates
        its shard with rank 0's buffers (batch-norm statistics; its own are put back), rank 0
        writes, and every rank returns the accuracy over all samples."""
        ctx, shard, local = ddp.evaluate_shard(self, model, epoch)
        if ctx is None:
            local = self._checked(local, epoch)
            return self._store(epoch, None, local["labels"], local["values"], local["classes"])
        return ddp.gather_epoch(ctx, epoch, local, shard, partial(self._store, epoch))

    def _checked(self, local, epoch):
        if local["error"] is not None:
            raise local["error"]
        if local["values"] is None:
            raise ForgetkitError(f"epoch {epoch}: the evaluation data yielded no batch (an "
                                 "empty loader or dataset); nothing to record")
        if not local["finite"]:
            raise ForgetkitError(f"outputs of epoch {epoch} contain NaN or inf (in "
                                 f"{self.dtype}); not stored")
        return local

    def _batch_length(self, batch):
        return len(torch.as_tensor(split_batch(batch, self.label_key)[2]).reshape(-1))

    def _evaluate(self, model, epoch, batches, *, catch, sync=True):
        """This process's outputs: dict of ``values`` (n, C) in the stored dtype (summary
        rows (n, 4) with a device summary), ``labels`` (n,) and ``ids`` (n,) tensors on the
        model's device, ``classes``, ``finite`` (a bool; with ``sync=False`` a boolean
        tensor on the device, so that nothing waits for the device: a CUDA graph capture)
        and ``error`` (with ``catch``, an error of the evaluation, to be raised on every
        rank)."""
        device = next(model.parameters(), torch.empty(0)).device
        chunks, labels, ids, shapes = [], [], [], []
        finite = torch.ones((), dtype=torch.bool, device=device)
        try:
            with torch.inference_mode():
                for index, batch in batches:
                    args, kwargs, y = split_batch(batch, self.label_key)
                    out = self.output_fn(model(*to_device(args, device),
                                               **to_device(kwargs, device)))
                    shapes.append(tuple(out.shape))
                    check_class_counts(shapes[:1] + shapes[-1:], epoch)  # this batch vs the first
                    out = out.detach().to(self._torch_dtype)  # half the bytes for float16
                    y = integer_labels(torch.as_tensor(y).reshape(-1), epoch)
                    y = y.to(out.device, non_blocking=True)
                    if len(y) != len(out):
                        raise ForgetkitError(f"epoch {epoch}: a batch of {len(out)} outputs "
                                             f"came with {len(y)} labels")
                    finite &= torch.isfinite(out).all()
                    chunks.append(summary_rows(out, y) if self._device_summary else out)
                    labels.append(y)
                    if index is not None:
                        ids.append(index)
        except Exception as err:
            if not catch:
                raise
            return {"error": err, "values": None, "labels": None, "ids": np.empty(0, np.int64),
                    "classes": None, "finite": True}
        return {"error": None, "finite": bool(finite) if sync else finite,
                "values": torch.cat(chunks) if chunks else None,
                "labels": torch.cat(labels) if labels else torch.empty(0, dtype=torch.int64),
                "ids": np.concatenate(ids) if ids else np.empty(0, np.int64),
                "classes": shapes[0][-1] if shapes else None}

    def _store(self, epoch, ids, labels, values, n_classes, *, meta=None):
        """Queue the epoch's rows (``values`` on the device, ``labels``, dataset indices
        ``ids`` or None for positions) for writing, with the run's metadata ``meta`` if
        given; return its accuracy."""
        summary = self._device_summary
        labels = torch.as_tensor(labels)
        accuracy = correct_count(values, labels.to(values.device), summary) / len(values)
        self._commit(epoch, self.host_copy(values), labels.cpu().numpy(), n_classes,
                     ids=ids, meta=meta)
        return accuracy

    def host_copy(self, values):
        """`host_copy` of an epoch's outputs (or summary rows) on the device: the callable
        that `_commit` takes, its copy started."""
        return host_copy(values, self._device_summary)

    def lightning_callback(self, *, every_n_epochs=1):
        """A PyTorch Lightning callback recording at the end of every training epoch (and
        closing the run when fitting ends). Under strategy="ddp" it runs on every rank: each
        evaluates its shard and rank 0 writes."""
        try:
            from lightning.pytorch import Callback
        except ImportError:
            try:
                from pytorch_lightning import Callback
            except ImportError:
                raise ImportError("PyTorch Lightning is not installed: pip install lightning")\
                    from None
        recorder = self

        class _LogitRecorderCallback(Callback):
            def on_train_epoch_end(self, trainer, pl_module):
                if trainer.current_epoch % every_n_epochs == 0:
                    recorder.record(pl_module, trainer.current_epoch)

            def on_fit_end(self, trainer, pl_module):
                recorder.close()

        return _LogitRecorderCallback()
