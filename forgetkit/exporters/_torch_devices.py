"""The torch side shared by the recorders and the replays: batches (their forms, their
labels, moving them to a device), model outputs (the logits of an output, their summary, the
copy to the host) and devices.

Imports nothing else of `forgetkit.exporters` but `forgetkit.kinds.summary`, so that the
recorders (`_torch_logits`, `_torch_tokens`) and the replays (`_torch_replay`, `huggingface`)
build on it without an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler

from ..errors import ForgetkitError, InputTypeError
from ..kinds.summary import SUMMARY_DTYPE


def default_output(out):
    """The logits tensor of a model's output: itself, the first element of a tuple/list,
    ``out["logits"]`` of a dict, or ``out.logits`` (a Hugging Face ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, Mapping) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    raise InputTypeError(f"cannot find the logits in a model output of type {type(out).__name__}; "
                         "pass output_fn=... that returns the (batch, n_classes) tensor")


def split_batch(batch, label_key):
    """(positional inputs, keyword inputs, labels) of a batch: an (inputs, labels, ...)
    tuple or list, or a mapping whose ``label_key`` entry holds the labels and whose other
    entries are the model's keyword arguments."""
    if isinstance(batch, Mapping):
        if label_key not in batch:
            raise ForgetkitError(f"a dict batch must hold its labels under label_key="
                                 f"{label_key!r}; got keys {sorted(batch)}")
        return (), {k: v for k, v in batch.items() if k != label_key}, batch[label_key]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return (batch[0],), {}, batch[1]
    raise InputTypeError(f"batches must be (inputs, labels) pairs or dicts with a "
                         f"{label_key!r} entry; got {type(batch).__name__}")


def to_device(values, device):
    """Tensors of a tuple or dict moved to ``device`` (other values as they are)."""
    def move(v):
        return v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v

    if isinstance(values, dict):
        return {k: move(v) for k, v in values.items()}
    return tuple(move(v) for v in values)


def integer_labels(y, epoch):
    """Labels ``y`` (a tensor) as int64, refusing non-integer values as `forgetkit.Run` does
    (a float 2.7 is not stored as 2)."""
    if y.is_floating_point():
        if not bool(torch.isfinite(y).all()) or not torch.equal(y, y.round()):
            bad = y[~torch.isfinite(y) | (y != y.round())][0].item()
            raise ForgetkitError(f"epoch {epoch}: labels must be integers (class indices); "
                                 f"got {bad}")
    elif y.dtype == torch.bool or y.is_complex():
        raise ForgetkitError(f"epoch {epoch}: labels must be integers (class indices); got "
                             f"dtype {y.dtype}")
    return y.long()


def summary_rows(out, labels):
    """The summary of logits ``out`` (B, C) with ``labels`` (B,) on their device, as float32
    (B, 4): label logit, largest other logit, its class (int32 bits), log-sum-exp; the rows
    of `forgetkit.kinds.summary.SUMMARY_DTYPE` when viewed as such on the host."""
    z = out.float()
    label = z.gather(1, labels[:, None]).squeeze(1)
    other, other_class = z.scatter(1, labels[:, None], float("-inf")).max(dim=1)
    lse = torch.logsumexp(z, dim=1)
    return torch.stack([label, other, other_class.to(torch.int32).view(torch.float32), lse], 1)


def correct_count(values, labels, summary):
    """Rows whose prediction is the label: outputs (N, C), or summary rows (N, 4)."""
    if not summary:
        return int((values.argmax(dim=1) == labels).sum())
    label, other = values[:, 0], values[:, 1]
    other_class = values[:, 2].view(torch.int32)
    return int(((label > other) | ((label == other) & (labels < other_class))).sum())


def host_copy(values, summary):
    """A callable returning ``values`` as numpy (summary rows as SUMMARY_DTYPE records). A
    CUDA tensor's copy starts now, asynchronously into pinned memory, and the callable
    (run on the writer thread) waits for it; other devices copy in the callable."""
    done = None
    if values.device.type == "cuda":
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        # blocking: the writer thread sleeps until the copy is done instead of spinning on
        # a CPU core that the training loop's launches need
        done = torch.cuda.Event(blocking=True)
        done.record()
        values = host

    def to_numpy():
        if done is not None:
            done.synchronize()
        arr = values.cpu().numpy()
        return arr.view(SUMMARY_DTYPE).reshape(-1) if summary else arr

    return to_numpy


def _as_tensor(x):
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _is_array(x):
    return isinstance(x, (torch.Tensor, np.ndarray))


def forward(model, args, kwargs, what):
    """``model(*args, **kwargs)``; an error the model raises on the batch (inputs of another
    shape or dtype than it takes) becomes a ForgetkitError naming ``what`` (e.g. "bn_data"),
    torch's text kept."""
    try:
        return model(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        message = " ".join(str(err).split())[:300]
        raise ForgetkitError(f"{what} does not fit the model: {type(err).__name__}: "
                             f"{message}") from None


def check_batch_size(batch_size):
    """``batch_size`` as a positive int."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ForgetkitError(f"batch_size must be a positive integer; got {batch_size!r}")
    return int(batch_size)


def batches_of(data, *, batch_size, label_key):
    """The evaluation batches of ``data`` as a list, read once: an (inputs, labels) pair of
    arrays or tensors, a dict of arrays (the labels under ``label_key``), a map-style
    Dataset, a DataLoader (not shuffling), or an iterable of batches (each checked to hold
    its labels under ``label_key``, unless it is None)."""
    batch_size = check_batch_size(batch_size)
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(map(_is_array, data)):
        inputs, labels = map(_as_tensor, data)
        if len(inputs) != len(labels):
            raise ForgetkitError(f"inputs ({len(inputs)}) and labels ({len(labels)}) differ "
                                 "in length")
        if len(inputs) == 0:
            raise ForgetkitError("data holds no sample (inputs and labels are empty)")
        return [(inputs[i:i + batch_size], labels[i:i + batch_size])
                for i in range(0, len(inputs), batch_size)]
    if isinstance(data, Mapping) and data and all(map(_is_array, data.values())):
        if label_key not in data:
            raise ForgetkitError(f"a dict of arrays must hold the labels under label_key="
                                 f"{label_key!r}; got keys {sorted(data)}")
        columns = {k: _as_tensor(v) for k, v in data.items()}
        n = len(columns[label_key])
        return [{k: v[i:i + batch_size] for k, v in columns.items()}
                for i in range(0, n, batch_size)]
    if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
        data = DataLoader(data, batch_size=batch_size, shuffle=False)
    if isinstance(data, DataLoader) and isinstance(data.sampler, RandomSampler):
        raise ForgetkitError("the DataLoader shuffles (shuffle=True); a replay needs the same "
                             "samples in the same order for every checkpoint")
    try:
        batches = list(data)
    except TypeError:
        raise InputTypeError(f"data must be (inputs, labels) arrays, a dict of arrays, a "
                             f"Dataset, a DataLoader or an iterable of batches; got "
                             f"{type(data).__name__}") from None
    if not batches:
        raise ForgetkitError("data yielded no batch")
    for b in batches if label_key is not None else ():
        split_batch(b, label_key)  # the batch shape is checked before any checkpoint is read
    return [map_tensors(b, _as_tensor_or_keep) for b in batches]


def _as_tensor_or_keep(v):
    return torch.as_tensor(v) if isinstance(v, np.ndarray) else v


def map_tensors(batch, fn):
    if isinstance(batch, Mapping):
        return {k: fn(v) for k, v in batch.items()}
    return tuple(fn(v) for v in batch)


def resident(batches, device):
    for b in batches:
        for v in (b.values() if isinstance(b, Mapping) else b):
            if isinstance(v, torch.Tensor) and v.device != device:
                return False
    return True


def _nbytes(batches):
    total = 0
    for b in batches:
        for v in (b.values() if isinstance(b, Mapping) else b):
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total


def place(batches, device):
    """The batches on ``device`` (resident) when they fit in half its free memory, else in
    pinned host memory (copied to the device batch by batch, asynchronously)."""
    def tensor_op(op):
        return lambda v: op(v) if isinstance(v, torch.Tensor) else v

    if device.type != "cuda":
        return [map_tensors(b, tensor_op(lambda t: t.to(device))) for b in batches]
    free, _ = torch.cuda.mem_get_info(device)
    if _nbytes(batches) <= free // 2:
        return [map_tensors(b, tensor_op(lambda t: t.to(device))) for b in batches]
    return [map_tensors(b, tensor_op(lambda t: t.pin_memory())) for b in batches]


def as_device(d):
    """A torch.device (an int: that CUDA device; "cuda": the current one, by index)."""
    d = torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def token_batches(data, batch_size, input_key):
    """The evaluation batches of ``data``: a tensor or array of input ids (N, T), a dict of
    such columns (``input_ids``, ``attention_mask``, labels), or an iterable of dict
    batches (a DataLoader) as it is."""
    batch_size = check_batch_size(batch_size)
    if isinstance(data, (torch.Tensor, np.ndarray)):
        data = {input_key: data}
    if isinstance(data, Mapping):
        if input_key not in data:
            raise ForgetkitError(f"the token data must hold the input ids under "
                                 f"input_key={input_key!r}; got keys {sorted(data)}")
        columns = {k: torch.as_tensor(np.asarray(v)) if isinstance(v, np.ndarray) else v
                   for k, v in data.items()}
        n = len(columns[input_key])
        bad = [k for k, v in columns.items() if len(v) != n]
        if bad:
            raise ForgetkitError(f"the token data's columns differ in length: {input_key!r} "
                                 f"has {n} sequences, {bad[0]!r} {len(columns[bad[0]])}")
        return [{k: v[i:i + batch_size] for k, v in columns.items()}
                for i in range(0, n, batch_size)]
    return data
