"""Record a PyTorch model's outputs on fixed evaluation data once per epoch.

    from forgetkit.exporters.torch import LogitRecorder

    recorder = LogitRecorder("run.npy", test_loader)      # DataLoader with shuffle=False
    for epoch in range(epochs):
        train_one_epoch(model)
        recorder.record(model, epoch)
    recorder.close()
"""

from __future__ import annotations

import torch

from ._common import RecorderBase, check_class_counts

__all__ = ["LogitRecorder"]


def default_output(out):
    """The logits tensor of a model's output: itself, the first element of a tuple/list, or
    ``out["logits"]`` of a dict."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    raise TypeError(f"cannot find the logits in a model output of type {type(out).__name__}; "
                    "pass output_fn=... that returns the (batch, n_classes) tensor")


class LogitRecorder(RecorderBase):
    """Append the model's outputs on ``data`` to a forgetkit run at every `record` call.

    Parameters
    ----------
    path : str or Path
        ``.npy`` or ``.parquet`` run file; an existing run there is appended to (a resumed
        training), as long as its samples and classes match.
    data : DataLoader or iterable of (inputs, labels) batches, or an (inputs, labels) pair
        of tensors. Must yield the same samples in the same order every epoch.
    dtype : "float16" (default) or "float32"/"float64": the stored precision.
    output_fn : callable, optional
        Maps the model's output to the (batch, n_classes) logits tensor (default: the tensor,
        the first element of a tuple, or ``out["logits"]``).
    batch_size : int, used when ``data`` is a pair of tensors.
    kind, format, layout, meta, class_names, mode : passed to `forgetkit.RunWriter`.
    """

    def __init__(self, path, data, *, dtype="float16", output_fn=None, batch_size=1024,
                 kind="logits", format=None, layout="list", meta=None, class_names=None,
                 mode="a"):
        super().__init__(path, dtype=dtype, kind=kind, format=format, layout=layout,
                         meta=meta, class_names=class_names, mode=mode)
        if (isinstance(data, (tuple, list)) and len(data) == 2
                and all(isinstance(t, torch.Tensor) for t in data)):
            inputs, labels = data
            if len(inputs) != len(labels):
                raise ValueError(f"inputs ({len(inputs)}) and labels ({len(labels)}) differ in "
                                 "length")
            data = [(inputs[i:i + batch_size], labels[i:i + batch_size])
                    for i in range(0, len(inputs), batch_size)]
        self.data = data
        self.output_fn = output_fn or default_output
        self._torch_dtype = getattr(torch, self.dtype.name)

    def record(self, model, epoch):
        """Run ``model`` in eval mode without gradients over the data and store the outputs
        as epoch number ``epoch``; return the epoch's accuracy. The model's train/eval mode is
        restored afterwards."""
        was_training = model.training
        device = next(model.parameters(), torch.empty(0)).device
        chunks, labels = [], []
        model.eval()
        try:
            with torch.no_grad():
                for batch in self.data:
                    x, y = batch[0], batch[1]
                    out = self.output_fn(model(x.to(device, non_blocking=True)))
                    # cast on the device: half the bytes to copy for float16
                    chunks.append(out.detach().to(self._torch_dtype))
                    labels.append(torch.as_tensor(y).reshape(-1))
        finally:
            model.train(was_training)
        check_class_counts(chunks, epoch)
        outputs = torch.cat(chunks).cpu().numpy()  # one device-to-host copy per epoch
        return self._store(epoch, outputs, torch.cat(labels).cpu().numpy())

    def lightning_callback(self, *, every_n_epochs=1):
        """A PyTorch Lightning callback recording at the end of every training epoch."""
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
