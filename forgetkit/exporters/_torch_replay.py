"""Replay saved PyTorch checkpoints into a run: `forgetkit.exporters.torch.replay`.

The pipeline: the evaluation data is read once and moved to each
device once (kept resident when it fits in half the free memory, else kept in pinned host
memory and copied batch by batch); each device has one model instance that receives every
checkpoint's weights in place; a reader thread per device reads (maps) and checks the next
checkpoints and copies them to the device on a side stream while the current one is
evaluated (their content hashes are computed on a pool meanwhile); on a GPU the evaluation
of one batch is captured as a CUDA graph (one per batch shape) before the first checkpoint,
while the first one is read, and replayed for every batch of every checkpoint. With several
devices each evaluates whole checkpoints (the next one goes to the device that asks first);
the main thread stores them in epoch order through `LogitRecorder` (whose background thread
copies the outputs to the host and writes them).

Under torch.distributed (torchrun, one node or several) every rank runs this pipeline on its
own share of the checkpoints (rank r: checkpoints r, r + W, ...; one process per GPU, no
interpreter shared); after each round of W checkpoints the others' outputs go to rank 0
(`_torch_distributed.gather_results`, on a CUDA stream of its own under NCCL), which stores
them in epoch order through the same recorder and replay log as one process does: the run
is the one-process run, bit for bit. Whatever fails on any rank is raised on every rank
before the failing checkpoint is written.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import threading
import warnings
import zipfile
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from .._progress import Progress
from ..errors import CorruptFileError, ForgetkitError, InputTypeError
from . import _torch_distributed as ddp
from ._checkpoints import (
    Checkpoint,
    ReplayLog,
    checkpoint_files,
    content_hash,
    existing_run,
    hash_pool,
    ordered,
    resolved,
)
from ._torch_devices import as_device, batches_of, place, resident, token_batches
from ._torch_logits import LogitRecorder
from ._torch_tokens import TokenRecorder

#: File suffixes read as PyTorch checkpoints (a folder given as ``checkpoints``).
SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors")

#: Keys under which a checkpoint dict may hold the model's state dict.
STATE_KEYS = ("state_dict", "model_state_dict", "model")

#: Checkpoints read ahead per device, and the threads reading them.
READ_AHEAD = 3
READERS = 2

#: Several devices: each checkpoint goes to the device that asks first (False: checkpoint
#: i to device i mod n, the same split every time, for devices of different kinds).
BALANCE = True

#: Stage checkpoints as on a GPU (packed into one buffer) on other devices too (tests).
STAGE_ALWAYS = False

#: Outputs evaluated but not yet stored that a device may hold (bytes, and results).
OPEN_BYTES = 256 * 2**20
OPEN_MAX = 16


def _int_or_none(value):
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
        else None


def _is_state(obj):
    return isinstance(obj, Mapping) and bool(obj) and \
        all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def read_checkpoint(file, *, trust_pickle=False, mmap=False):
    """``(state dict, own epoch, own step)`` of a checkpoint file: a state dict in a
    ``.pt/.pth/.bin/.ckpt`` file (or a dict holding one under ``state_dict``,
    ``model_state_dict`` or ``model``, with Lightning's ``epoch`` and ``global_step``), or a
    ``.safetensors`` file. Loads with ``weights_only=True`` unless ``trust_pickle``: a file
    that needs other objects is refused and nothing in it runs. ``mmap``: the tensors are
    views of the file mapped into memory (no copy; a file torch cannot map is read)."""
    file = str(file)
    if file.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ForgetkitError("reading .safetensors checkpoints needs the safetensors "
                                 "package: pip install safetensors") from None
        try:
            return load_file(file), None, None
        except Exception as err:
            raise CorruptFileError(f"cannot read checkpoint {file!r}: {err}") from None
    try:
        try:
            obj = torch.load(file, map_location="cpu", weights_only=not trust_pickle,
                             mmap=mmap)
        except MemoryError:  # not a file torch cannot map: no second read
            raise
        except Exception:
            if not mmap:
                raise
            # not mappable (a legacy, non-zip file; a file system without mmap): read it,
            # and any error is that read's
            obj = torch.load(file, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as err:
        if not trust_pickle and "weights_only" in str(err):
            first = str(err).split("Unsupported global:")[-1].split("\n")[0].strip() \
                if "Unsupported global:" in str(err) else "an object other than tensors"
            raise ForgetkitError(
                f"checkpoint {file!r} needs arbitrary code to load ({first}); it was not "
                "loaded. Pass trust_pickle=True (--trust-pickle) only if you trust the file"
            ) from None
        raise CorruptFileError(f"cannot read checkpoint {file!r}: {err}") from None
    except (MemoryError, KeyboardInterrupt):
        raise
    except FileNotFoundError:
        raise
    except Exception as err:
        message = " ".join(str(err).split())[:300] or type(err).__name__
        raise CorruptFileError(f"cannot read checkpoint {file!r} (truncated or not a "
                               f"PyTorch checkpoint?): {message}") from None
    if _is_state(obj):
        return dict(obj), None, None
    if isinstance(obj, Mapping):
        for key in STATE_KEYS:
            if _is_state(obj.get(key)):
                step = obj.get("global_step", obj.get("step"))
                return dict(obj[key]), _int_or_none(obj.get("epoch")), _int_or_none(step)
    if isinstance(obj, torch.nn.Module):  # a whole pickled model (trust_pickle=True)
        return obj.state_dict(), None, None
    what = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, Mapping) \
        else f"a {type(obj).__name__}"
    raise ForgetkitError(f"checkpoint {file!r} holds no state dict of tensors ({what}; "
                         f"expected one, or a dict holding one under {list(STATE_KEYS)})")


class _Opaque:
    """What `own_epoch` makes of every object of a pickle: nothing is imported or run."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Dict(dict):
    """An ``OrderedDict`` of a peeked pickle (which may carry attributes)."""


class _Peek(pickle.Unpickler):
    """Reads a checkpoint's pickle for its plain values only: every global is `_Opaque`
    (``OrderedDict`` a dict), every tensor None."""

    def find_class(self, module, name):
        return _Dict if (module, name) == ("collections", "OrderedDict") else _Opaque

    def persistent_load(self, pid):
        return None


def _may_hold_epoch(data):
    """Whether a pickle ``data`` may hold the string ``epoch`` or ``step`` (as a dict key):
    only a string opcode can make one under `_Peek`, and it holds the letters themselves,
    unless escaped (protocol 0: a backslash)."""
    return b"epoch" in data or b"step" in data or b"\\" in data


def own_epoch(file, *, trust_pickle=False):
    """(epoch, step) that a checkpoint file records itself (Lightning's ``epoch`` and
    ``global_step``), or (None, None). Reads only the pickle inside the file's zip archive,
    with every object and tensor left out (nothing in it runs, whatever ``trust_pickle``)."""
    if str(file).endswith(".safetensors"):
        return None, None
    try:
        with zipfile.ZipFile(str(file)) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            data = archive.read(name)
            if not _may_hold_epoch(data):
                return None, None
            obj = _Peek(io.BytesIO(data)).load()
    except Exception:  # not a zip checkpoint: read again (and reported) when replayed
        return None, None
    if isinstance(obj, dict):  # (a bare state dict's values are all _Opaque)
        return _int_or_none(obj.get("epoch")), \
            _int_or_none(obj.get("global_step", obj.get("step")))
    return None, None


def _prefixes(keys):
    """Dotted prefixes (``a.``, ``a.b.``) of ``keys``, shortest first."""
    found = set()
    for k in keys:
        parts = k.split(".")
        for depth in (1, 2):
            if len(parts) > depth:
                found.add(".".join(parts[:depth]) + ".")
    return sorted(found, key=lambda p: (p.count("."), p))


def fit_keys(state, model_keys, file):
    """``state`` with its keys made the model's: as they are, less a prefix (Lightning's
    module attribute such as ``model.``, DDP's ``module.``, torch.compile's ``_orig_mod.``;
    keys outside the prefix are then left out), or with the model's own prefix added.
    Keys that do not fit raise an error naming the first missing and unexpected ones."""
    want = set(model_keys)
    if set(state) == want:
        return state
    for prefix in _prefixes(state):
        inner = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if set(inner) == want:
            return inner
    for prefix in _prefixes(model_keys):
        if all(k.startswith(prefix) for k in model_keys) and \
                {prefix + k for k in state} == want:
            return {prefix + k: v for k, v in state.items()}
    missing = [k for k in model_keys if k not in state]
    unexpected = [k for k in state if k not in want]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing keys (first {missing[0]!r})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys (first {unexpected[0]!r})")
    raise ForgetkitError(f"checkpoint {file!r} does not fit the model: {', '.join(parts)}")


def _bytes(t):
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def flat_bytes(t):
    """The bytes of a tensor as a numpy uint8 array (any dtype): for a contiguous host
    tensor of a numpy dtype a view made by numpy, without a call into torch per step."""
    if t.device.type == "cpu" and not t.requires_grad and t.is_contiguous():
        try:
            return t.numpy().reshape(-1).view(np.uint8)
        except (TypeError, RuntimeError):  # bfloat16, float8, a conjugate view...
            pass
    return _bytes(t).numpy()


def _order(tensors):
    """The tensors' positions in a packed buffer: the widest dtypes first."""
    return sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())


def pack(tensors, *, pin=False):
    """``(buffer, layout)``: the tensors' bytes in one uint8 buffer (pinned with ``pin``),
    the widest dtypes first so that every tensor's view of it is aligned; `unpack` gives
    the tensors back as views."""
    order = _order(tensors)
    layout, offset = [None] * len(tensors), 0
    for i in order:
        t = tensors[i]
        n = t.numel() * t.element_size()
        layout[i] = (offset, n, t.dtype, tuple(t.shape))
        offset += n
    buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=pin)
    # one copy of every tensor's bytes, in one call (not a few calls per tensor, each
    # giving up and taking back the interpreter lock that the other threads want)
    if order:
        torch.cat([torch.from_numpy(flat_bytes(tensors[i]))
                   if tensors[i].device.type == "cpu" else _bytes(tensors[i])
                   for i in order], out=buffer)
    return buffer, layout


def unpack(buffer, layout):
    """The tensors packed by `pack`, as views of ``buffer`` (wherever it now is)."""
    return [buffer[o:o + n].view(dtype).reshape(shape) for o, n, dtype, shape in layout]


@dataclass
class Item:
    """A checkpoint read, checked, hashed and (on a GPU) copied to its device."""

    position: int
    checkpoint: Checkpoint
    digest: object  # the content hash, or a PendingHash of it (`resolved`)
    tensors: list  # in the model's key order, on the device once staged (None: `flat`)
    event: object = None  # CUDA event: the copy to the device is done
    flat: object = None  # the device buffer of the staged tensors (`pack`'s layout)
    model: object = None  # a model of its own, evaluated instead of the device's


def shared_names(state):
    """``(keys, tied)`` of a model's state dict (``keep_vars``): one key per tensor (the
    first name of tied weights, such as a language model's output and input embeddings),
    and each key's other names."""
    first, keys, tied = {}, [], {k: [] for k in state}
    for k, t in state.items():
        at = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.numel() else None
        if at is not None and at in first:
            tied[first[at]].append(k)
            tied[k].append(first[at])
        else:
            keys.append(k)
            if at is not None:
                first[at] = k
    return keys, tied


class Device:
    """One device's model instance, data and reader thread. ``keys``: the model's state
    dict keys (a checkpoint must hold each, tied weights under each of their names); each
    tensor is read and loaded once."""

    def __init__(self, model, device, batches, *, keys, trust_pickle, pool, cuda_graph=False):
        self.device = device
        self.model = model
        self.names = keys
        state = model.state_dict(keep_vars=True)
        self.keys, self.tied = shared_names({k: state[k] for k in keys})
        self.targets = [state[k] for k in self.keys]
        self.batches = batches
        self.trust_pickle = trust_pickle
        self.pool = pool
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.staged = self.cuda or STAGE_ALWAYS  # checkpoints packed into one buffer
        self.reader = ThreadPoolExecutor(READERS, thread_name_prefix="forgetkit-replay-read")
        self.bytewise = _bytewise(self.targets)
        # a graph replays fixed memory: the batches must be resident on the device
        self.graphable = bool(cuda_graph) and CAPTURE.supports(device) and \
            resident(batches, device)

    def evaluate_graphable(self, recorder, epoch, batches=None):
        """The recorder's evaluation (of ``batches``, default all) with nothing waiting for
        the device (its ``finite`` a device tensor)."""
        return recorder._evaluate(self.model, epoch,
                                  ((None, b) for b in (batches or self.batches)),
                                  catch=False, sync=False)

    def read(self, position, checkpoint):
        """Read (the file mapped into memory), fit and check a checkpoint, and start its
        content hash on the hash pool (the digest is needed only when the result is
        stored); on a GPU start its copy to the device (all its tensors packed into one
        pinned buffer: one copy at full speed)."""
        tensors, digest = self.weights(checkpoint, wait=False)
        item = Item(position, checkpoint, digest, tensors)
        if self.staged:
            host, layout = pack(tensors, pin=self.cuda)
            if self.cuda:
                with torch.cuda.stream(self.stream):
                    item.flat = host.to(self.device, non_blocking=True)
                    item.event = torch.cuda.Event()
                    item.event.record(self.stream)
            else:
                item.flat = host
            # the same dtypes as the model's: loaded as bytes, from the buffer at once
            same = self.bytewise is not None and all(
                t.dtype == target.dtype for t, target in zip(tensors, self.targets,
                                                             strict=True))
            item.tensors = None if same else unpack(item.flat, layout)
        return item

    def digest(self, checkpoint):
        """The content hash of a checkpoint's weights."""
        return self.weights(checkpoint)[1]

    def state(self, checkpoint):
        """The checkpoint's state dict with the model's keys (the file mapped into memory)."""
        state, _, _ = read_checkpoint(checkpoint.file, trust_pickle=self.trust_pickle,
                                      mmap=True)
        return fit_keys(state, self.names, checkpoint.file)

    def weights(self, checkpoint, *, wait=True):
        """(tensors in the model's key order, content hash) of a checkpoint, checked;
        ``wait=False``: the hash a `PendingHash`, computed on the pool."""
        state = self.state(checkpoint)
        tensors = [state[k] for k in self.keys]
        for k, t, target in zip(self.keys, tensors, self.targets, strict=False):
            if t.shape != target.shape:
                raise ForgetkitError(
                    f"checkpoint {checkpoint.file!r} does not fit the model: {k!r} has shape "
                    f"{tuple(t.shape)} there and {tuple(target.shape)} in the model (a "
                    "checkpoint of another architecture?)")
        digest = content_hash([(k, str(state[k].dtype), tuple(state[k].shape),
                                flat_bytes(state[k])) for k in sorted(state)], pool=self.pool,
                              wait=wait)
        return tensors, digest

    def load(self, item):
        """Copy the item's weights into the model (in place, on the compute stream)."""
        if item.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(item.event)
        if item.tensors is None:  # `pack`'s buffer in the model's own dtypes: its bytes
            targets, sources = self.bytewise[0], item.flat.split(self.bytewise[1])
        else:
            targets, sources = self.targets, item.tensors
        with torch.no_grad():
            try:
                torch._foreach_copy_(targets, sources)
            except (AttributeError, RuntimeError, TypeError):
                for target, t in zip(targets, sources, strict=False):
                    target.copy_(t)
        if item.event is not None:
            item.flat.record_stream(stream)  # allocated on the side stream, read on this one
        item.tensors = item.flat = None


def _bytewise(targets):
    """``(byte views, sizes)`` of the model's tensors in `pack`'s order, where each is
    contiguous (its bytes in row order, as packed), else None."""
    views = []
    for i in _order(targets):
        t = targets[i].detach()
        if not t.is_contiguous():
            return None
        view = _bytes(t)
        if t.numel() and view.data_ptr() != t.data_ptr():
            return None
        views.append(view)
    return views, [v.numel() for v in views]


def _devices(device, devices, model, ctx=None):
    """The devices to evaluate on: ``devices``, else ``device``, else where the model is (on a
    rank of an NCCL process group, its current CUDA device when the model is on the CPU)."""
    if devices is not None:
        if device is not None:
            raise ForgetkitError("pass device=... or devices=..., not both")
        out = [as_device(d) for d in devices]
        if not out:
            raise ForgetkitError("devices is empty")
        return out
    if device is not None:
        return [as_device(device)]
    own = next(model.parameters(), torch.empty(0)).device
    if own.type == "cpu" and ctx is not None and ctx.device.type == "cuda":
        return [ctx.device]
    return [own]


class _Results:
    """The positions to evaluate, handed out in order to whichever device asks first
    (with `BALANCE`; else position i to device i mod n), and the per-position results of
    the device workers, taken in order by the main thread. A worker waits while its
    results not yet taken hold ``OPEN_BYTES`` (at least 2 results, at most ``OPEN_MAX``):
    a device that started sooner runs ahead of one that has not yet, instead of waiting
    for it."""

    def __init__(self, n_positions, n_devices):
        self._items = {}
        self._cond = threading.Condition()
        self._open = [0] * n_devices
        self._limit = 2
        self._next = [0] if BALANCE else list(range(n_devices))
        self._n, self._step = n_positions, 1 if BALANCE else n_devices
        self.stop = False

    def next_position(self, d, held=0):
        """The next position device ``d`` evaluates, or None when all are handed out or
        (with `BALANCE`) when the device already ``held`` its share of those left."""
        with self._cond:
            i = 0 if BALANCE else d
            p = self._next[i]
            if p >= self._n or self.stop or \
                    (BALANCE and held and self._n - p <= held * len(self._open)):
                return None
            self._next[i] += self._step
            return p

    def result_bytes(self, nbytes):
        """The size of one result (its outputs), which sets how many may wait."""
        with self._cond:
            self._limit = max(2, min(OPEN_MAX, OPEN_BYTES // max(1, int(nbytes))))
            self._cond.notify_all()

    def reserve(self, d):
        with self._cond:
            self._cond.wait_for(lambda: self.stop or self._open[d] < self._limit)
            self._open[d] += 1
            return not self.stop

    def put(self, position, d, result):
        with self._cond:
            self._items[position] = (d, result)
            self._cond.notify_all()

    def take(self, position):
        with self._cond:
            self._cond.wait_for(lambda: position in self._items)
            d, result = self._items.pop(position)
            self._open[d] -= 1
            self._cond.notify_all()
            return result

    def close(self):
        with self._cond:
            self.stop = True
            self._cond.notify_all()


#: Kernels may be chosen by the address of their inputs: a batch's graph is captured with its
#: input at the same address modulo ALIGN as the batch it replays (the eager choice).
ALIGN = 256

#: Values of a batch other than tensors that are told apart by value; others by identity.
_PLAIN = (int, float, bool, str, bytes, type(None))


def _signature(batch):
    """What one graph serves: the batch's structure, each tensor's shape, strides, dtype,
    device and address modulo `ALIGN`, and its other values (plain ones by value, others by
    identity: that batch alone)."""
    items = batch.items() if isinstance(batch, Mapping) else enumerate(batch)
    sig = [type(batch)]
    for k, v in items:
        if isinstance(v, torch.Tensor):
            sig.append((k, tuple(v.shape), v.stride(), v.dtype, v.device,
                        v.data_ptr() % ALIGN))
        elif isinstance(v, _PLAIN):
            sig.append((k, type(v), v))
        else:
            sig.append((k, "id", id(v)))
    return tuple(sig)


def static_like(t):
    """An uninitialised tensor with the shape, strides, dtype and device of ``t``, at the
    same address modulo `ALIGN` (where the dtype allows)."""
    size = t.element_size()
    span = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * size \
        if t.numel() else 0
    raw = torch.empty(span + ALIGN, dtype=torch.uint8, device=t.device)
    shift = (t.data_ptr() - raw.data_ptr()) % ALIGN
    shift = shift if shift % size == 0 else 0
    return raw[shift:shift + span].view(t.dtype).as_strided(t.shape, t.stride())


def _tensor_items(batch):
    items = batch.items() if isinstance(batch, Mapping) else enumerate(batch)
    return [(k, v) for k, v in items if isinstance(v, torch.Tensor)]


def _static_batch(batch):
    """``batch`` (a dict or tuple) with each tensor replaced by a `static_like` copy."""
    static = dict(batch) if isinstance(batch, Mapping) else list(batch)
    for k, v in _tensor_items(batch):
        static[k] = static_like(v)
        static[k].copy_(v)
    return static if isinstance(batch, Mapping) else type(batch)(static)


class _CudaCapture:
    """Captures calls as CUDA graphs on a side stream of ``device`` that waits for the work
    queued so far (the data placed): without `torch.cuda.graph`'s device-wide
    synchronisation and emptying of the memory caches, which reach the other devices. The
    graphs share one memory pool (they replay one after another on one stream, and each
    one's outputs are copied out before the next replays)."""

    @staticmethod
    def supports(device):
        return device.type == "cuda"

    def __init__(self, device):
        self.device = device
        self.side = torch.cuda.Stream(device)
        self.side.wait_stream(torch.cuda.current_stream(device))
        self.pool = None

    def warm(self, fn):
        """Run ``fn`` eagerly on the side stream and wait for it (cuDNN and cuBLAS set
        themselves up outside the capture)."""
        with torch.cuda.stream(self.side):
            fn()
        self.side.synchronize()

    def graph(self, fn):
        """``(graph, outputs)``: ``fn`` captured; ``graph.replay()`` runs it again on the
        current stream, writing the same output tensors."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.side):
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                out = fn()
            finally:
                graph.capture_end()
        if self.pool is None:
            self.pool = graph.pool()
        return graph, out

    def abandon(self):
        """After a failed capture: wait for the device before going on eagerly."""
        torch.cuda.synchronize(self.device)


#: How evaluations are captured (tests put a stand-in here to run the graph path on the CPU).
CAPTURE = _CudaCapture


class _Graph:
    """One device's evaluation as CUDA graphs of one batch each: a graph per kind of batch
    (`_signature`: with a smaller last batch, two), captured on a static copy of the first
    batch of its kind. The model instance receives every checkpoint's weights in place;
    evaluating a checkpoint copies each batch into its graph's static input, replays the
    graph and copies its outputs into the checkpoint's: one graph launch and a few copies
    per batch instead of the batch's kernels launched from Python. Capturing runs one batch
    per kind through Python, not every batch (which on several devices side by side runs
    under one interpreter lock).

    Captured before any checkpoint is loaded (the graph reads the parameters' memory, not
    their values), while the reader threads read the first checkpoints."""

    def __init__(self, dev, recorder, epoch, autocast, capture, signatures, statics):
        graphs = {}
        for sig, static in statics.items():
            with _autocast(dev, autocast):
                graphs[sig] = capture.graph(
                    partial(dev.evaluate_graphable, recorder, epoch, [static]))
        self.plan, rows = [], 0  # per batch: (its tensors, static's tensors, graph, out, rows)
        for batch, sig in zip(dev.batches, signatures, strict=True):
            graph, out = graphs[sig]
            n = len(out["values"])
            self.plan.append(([v for _, v in _tensor_items(batch)],
                              [v for _, v in _tensor_items(statics[sig])], graph, out,
                              slice(rows, rows + n)))
            rows += n
        first = self.plan[0][3]
        self.shape = (rows, *first["values"].shape[1:])
        self.dtype, self.device = first["values"].dtype, first["values"].device
        self.classes = first["classes"]
        self.labels = None  # the same for every checkpoint: gathered once

    def evaluate(self):
        """The outputs of the weights now in the model, in a tensor of their own, queued
        on the device: nothing waits for it."""
        gather = self.labels is None
        with torch.inference_mode():
            values = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            if gather:
                self.labels = torch.empty(self.shape[0], dtype=torch.int64,
                                          device=self.device)
            for tensors, static, graph, out, rows in self.plan:
                for s, t in zip(static, tensors, strict=True):
                    s.copy_(t)
                graph.replay()
                values[rows].copy_(out["values"])
                if gather:
                    self.labels[rows].copy_(out["labels"])
        return {"values": values, "labels": self.labels, "classes": self.classes}


def _autocast(dev, autocast):
    if not autocast:
        return contextlib.nullcontext()
    return torch.autocast(dev.device.type, dtype=autocast, cache_enabled=False)


def _work(dev, d, checkpoints, recorder, results, autocast, keep):
    """Device ``d``'s loop: take positions, read ahead, load, evaluate; each result (or
    error) is put at its position, its outputs as ``keep(values)`` returns them. On a GPU
    the evaluation is captured as a graph first, while the first checkpoints are read."""
    pending = deque()  # (position, future of its Item), positions increasing
    graph = None  # a _Graph once captured; False where it cannot be
    labels = None  # the same for every checkpoint (the recorder checks that they are)

    def top_up(ahead=READ_AHEAD):
        while len(pending) < ahead:
            p = results.next_position(d, len(pending))
            if p is None:
                return
            pending.append((p, dev.reader.submit(dev.read, p, checkpoints[p])))

    cuda = torch.cuda.device(dev.device) if dev.cuda else contextlib.nullcontext()
    with cuda:
        # while the graph is captured only the first checkpoint is read: it is ready
        # sooner than with the next ones read beside it (on every device at once)
        top_up(1 if dev.graphable else READ_AHEAD)
        while pending:
            p, future = pending[0]
            if not results.reserve(d):
                break
            try:
                if graph is None and dev.graphable:
                    graph = _capture(dev, recorder, checkpoints[p].epoch, autocast)
                    top_up()
                item = future.result()
                pending.popleft()
                top_up()
                epoch = item.checkpoint.epoch
                dev.load(item)
                if graph:
                    local = graph.evaluate()
                else:
                    with _autocast(dev, autocast):
                        local = dev.evaluate_graphable(recorder, epoch)
                if local.get("finite") is False:  # an evaluation that checked (tokens)
                    raise ForgetkitError(f"outputs of epoch {epoch} contain NaN or inf; not "
                                         "stored")
                if labels is None:
                    labels = local["labels"].cpu().numpy()
                    values = local["values"]
                    results.result_bytes(values.numel() * values.element_size())
                # the copy to the host (``keep``) starts here, in this device's order;
                # nothing waits for the device (NaN or inf outputs are refused when written)
                results.put(p, d, (item, (keep(local["values"]), labels, local["classes"])))
            except BaseException as err:
                results.put(p, d, err)
                break
    for _, f in pending:
        f.cancel()


def _capture(dev, recorder, epoch, autocast):
    """A _Graph of the device's evaluation, or False (with a warning) where the model
    cannot be captured; the eager evaluation then goes on. The warm-up (eager, on the
    first batch of each kind) raises its errors as the evaluation's own."""
    signatures = [_signature(b) for b in dev.batches]
    firsts = {}
    for sig, b in zip(signatures, dev.batches, strict=True):
        firsts.setdefault(sig, b)
    capture = CAPTURE(dev.device)
    with _autocast(dev, autocast):
        capture.warm(partial(dev.evaluate_graphable, recorder, epoch, list(firsts.values())))
    try:
        statics = {sig: _static_batch(b) for sig, b in firsts.items()}
        return _Graph(dev, recorder, epoch, autocast, capture, signatures, statics)
    except Exception as err:
        capture.abandon()
        warnings.warn(f"the evaluation on {dev.device} could not be captured as a CUDA graph "
                      f"({type(err).__name__}: {' '.join(str(err).split())[:200]}); it runs "
                      "eagerly (cuda_graph=False says so without trying)", stacklevel=2)
        return False


def autocast_dtype(autocast):
    if autocast is None or isinstance(autocast, torch.dtype):
        return autocast
    value = getattr(torch, str(autocast), None)
    if not isinstance(value, torch.dtype):
        raise ForgetkitError(f"autocast must be a torch dtype such as 'bfloat16' or "
                             f"'float16'; got {autocast!r}")
    return value


def ordered_checkpoints(checkpoints, *, epochs, trust_pickle, pool):
    """The `Checkpoint` list of ``checkpoints`` (files, folders or glob patterns) in the
    order of their epoch numbers: ``epochs`` if given, else each file's own (read, pickles
    only, in parallel on ``pool``), else the last integer of its name."""
    files = checkpoint_files(checkpoints, suffixes=SUFFIXES)
    own = None
    if epochs is None:
        found = dict(zip(files, pool.map(partial(own_epoch, trust_pickle=trust_pickle),
                                         files), strict=True))
        own = found.__getitem__
    return ordered(files, epochs=epochs, own=own)


def replay(model, checkpoints, data, path, *, epochs=None, device=None, devices=None,
           batch_size=256, trust_pickle=False, on_duplicate="warn", output_fn=None,
           label_key="labels", autocast=None, cuda_graph=True, progress=True, tokens=False,
           top_k=None, group=None, **recorder_options):
    """Evaluate every saved checkpoint of a training on ``data`` and write the run that
    `LogitRecorder` would have written while it trained.

    Parameters
    ----------
    model : torch.nn.Module
        An instance of the trained architecture; it receives each checkpoint's weights in
        turn (and keeps the last one's) and is evaluated in eval mode, at its own precision.
    checkpoints : str, Path or list
        A glob pattern (``"ckpts/*.pt"``), a folder, or a list of files: state dicts in
        ``.pt/.pth/.bin/.ckpt`` files (also a dict holding one under ``state_dict``,
        ``model_state_dict`` or ``model``, as Lightning's checkpoints do; a prefix such as
        Lightning's ``model.`` is matched to the model's keys) or ``.safetensors``.
        Each file is mapped into memory while it is read (as safetensors does): it must not
        be rewritten in place during the replay (replacing it by a rename is safe).
    data : what `LogitRecorder` takes
        (inputs, labels) arrays or tensors (batched by ``batch_size``), a dict of arrays, a
        Dataset, a DataLoader (not shuffling) or an iterable of batches; read once.
    path : str or Path
        The run to write (``.npy`` or ``.parquet``).
    epochs : list of int, optional
        The epoch number of each checkpoint (in the order given). Default: the
        checkpoint's own (Lightning's ``epoch``), else the last integer of its file name.
        Checkpoints are replayed in the order of their epoch numbers.
    device : str or torch.device, optional
        Where to evaluate (default: where ``model`` is).
    devices : list of int or str, optional
        Several devices in this process: whole checkpoints per device (a model copy and a
        thread on each; the next checkpoint goes to the device that is free first), written
        in epoch order. For several GPUs, one process per GPU (torchrun, below) scales as
        well or better and reaches other nodes.
    batch_size : int, default 256
        For data given as arrays or a Dataset.
    trust_pickle : bool, default False
        Load with ``weights_only=False``. Without it a checkpoint that needs other objects
        than tensors and plain containers is refused, and nothing in it runs.
    on_duplicate : {"warn", "skip", "error"}
        A checkpoint whose weights equal an earlier one's (same content hash): a warning
        naming both files (kept), left out, or an error.
    output_fn, label_key : as for `LogitRecorder`.
    autocast : torch dtype or its name, optional
        Evaluate under ``torch.autocast`` with this dtype (default: none, the model's own
        precision, as the recorder evaluated it).
    cuda_graph : bool, default True
        On a GPU with the data resident, capture the evaluation of one batch as a CUDA
        graph (one per batch shape: the last batch may be smaller) before the first
        checkpoint and replay it for every batch of every checkpoint (the weights are
        copied into the captured model in place, each batch into the graph's input): one
        launch per batch instead of the batch's kernels launched from Python. A model that
        cannot be captured is evaluated eagerly, with a warning.
    progress : bool, default True
        Checkpoints done / total on a terminal.
    tokens : bool, default False; top_k : int, optional (default 8; implies ``tokens``)
        Write the top-k token run of a causal language model that
        `forgetkit.exporters.torch.TokenRecorder` writes (``data`` as it takes it: dict
        batches or columns of ``input_ids``, ``attention_mask``, labels); evaluated eagerly
        (no CUDA graph); a checkpoint of another vocabulary is refused.
    **recorder_options
        `forgetkit.exporters._common.RecorderOptions` (``dtype``, ``summary``, ``meta``,
        ``mode``...). With ``mode="a"`` (default) a replay into an existing run continues
        after the checkpoints it holds (matched by content hash); a run whose epochs came
        from other checkpoints is refused (``mode="w"`` replaces it).

    group : torch.distributed ProcessGroup, optional
        Under torch.distributed (a process group initialised, e.g. by torchrun): the ranks
        that share the replay (default: the world). Every rank calls `replay` with the same
        checkpoints and data; each evaluates checkpoints rank, rank + W, ... on its device
        (default: under NCCL, the rank's current CUDA device when ``model`` is on the CPU);
        rank 0 writes the run, equal bit for bit to a one-process replay (resumed and
        checked for duplicates alike); the other ranks write nothing and return None. A
        failure on any rank (a checkpoint list that differs, a read or evaluation error, a
        check of the run) is raised on every rank before that checkpoint is written.

    Returns
    -------
    Run
        The run at ``path`` (None on ranks other than 0). Its
        ``meta["replay"]["checkpoints"]`` holds, per epoch, the checkpoint's file, step and
        SHA-256 content hash.
    """
    if not isinstance(model, torch.nn.Module):
        raise InputTypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    autocast = autocast_dtype(autocast)
    pool = hash_pool()
    try:
        order = ordered_checkpoints(checkpoints, epochs=epochs, trust_pickle=trust_pickle,
                                    pool=pool)
        return _replay(model, order, data, path, pool, device=device, devices=devices,
                       batch_size=batch_size, trust_pickle=trust_pickle,
                       on_duplicate=on_duplicate, output_fn=output_fn, label_key=label_key,
                       autocast=autocast, cuda_graph=cuda_graph, progress=progress,
                       group=group, tokens=tokens or top_k is not None, top_k=top_k,
                       **recorder_options)
    finally:
        pool.shutdown(wait=False)


def _replay(model, order, data, path, pool, *, device, devices, batch_size, trust_pickle,
            on_duplicate, output_fn, label_key, autocast, cuda_graph, progress, group,
            tokens=False, top_k=None, **recorder_options):
    recorder_options.setdefault("max_pending", 4)  # epochs of small outputs may queue
    ctx = ddp.context(group)
    ddp.same_checkpoints(ctx, order)
    log = ddp.on_rank0(ctx, lambda: ReplayLog(existing_run(path, recorder_options.get("mode", "a")),
                                              recorder_options.get("meta"), on_duplicate, path))

    def prepare():
        targets = _devices(device, devices, model, ctx)
        if tokens:  # the token data's forms: columns or an (N, T) tensor are batched first;
            # the recorder checks each batch (labels are optional)
            batches = batches_of(token_batches(data, batch_size, "input_ids"),
                                 batch_size=batch_size, label_key=None)
        else:
            batches = batches_of(data, batch_size=batch_size, label_key=label_key)
        keys = list(model.state_dict())
        replicas = [model.to(targets[0])] + [copy.deepcopy(model).to(t) for t in targets[1:]]
        for m in replicas:
            m.eval()
        if tokens:
            recorder = TokenRecorder(path, batches, top_k=8 if top_k is None else top_k,
                                     output_fn=output_fn, batch_size=batch_size,
                                     label_key=label_key, **recorder_options)
            recorder.same_batches = True  # each device's placed batches, read once
        else:
            recorder = LogitRecorder(path, batches, output_fn=output_fn,
                                     batch_size=batch_size, label_key=label_key,
                                     **recorder_options)
        # the token evaluation waits for the device (ties, masks): no graph
        devs = [Device(m, t, place(batches, t), keys=keys, trust_pickle=trust_pickle,
                       pool=pool, cuda_graph=cuda_graph and not tokens)
                for m, t in zip(replicas, targets, strict=False)]
        return recorder, devs

    recorder, devs = ddp.on_every_rank(ctx, "preparing the replay", prepare)

    def resume():
        with ThreadPoolExecutor(2, thread_name_prefix="forgetkit-replay-resume") as ahead:
            return log.resume(order, devs[0].digest, pool=ahead)

    start = ddp.broadcast(ctx, ddp.on_rank0(ctx, resume))
    return drive(order[start:], devs, recorder, log, autocast=autocast, progress=progress,
                 ctx=ctx)


def drive(order, devs, recorder, log, *, autocast=None, progress=True, ctx=None):
    """Replay the checkpoints ``order`` on the devices ``devs`` (a worker thread each,
    taking whole checkpoints as `_Results` hands them out), storing them through
    ``recorder`` in epoch order as ``log`` says (checked against the stored ones, duplicates
    handled); returns the run.

    Under torch.distributed (``ctx``, a `_torch_distributed.Context`) this rank evaluates
    checkpoints ``rank, rank + W, ...`` of ``order``; after each round of W checkpoints rank 0
    receives the others' outputs and stores the round in epoch order (``log`` is rank 0's;
    the other ranks write nothing and return None). Whatever fails, on any rank, is raised
    on every rank before anything of its checkpoint is written."""
    from ..io import load

    path = recorder.path
    rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world)
    mine = order[rank::world]
    bar = Progress(len(order), f"replay into {path}", enabled=progress and rank == 0,
                   unit="checkpoints")
    results = _Results(len(mine), len(devs))
    # rank 0 copies its outputs to the host as it goes; the others send theirs from the device
    keep = recorder.host_copy if rank == 0 else ddp.outgoing
    workers = [threading.Thread(target=_work, name=f"forgetkit-replay-{d}", daemon=True,
                                args=(dev, d, mine, recorder, results, autocast, keep))
               for d, dev in enumerate(devs)]
    written = [0]

    def store(first, received):
        """Rank 0: store the round's results (checkpoints ``first``, ``first + 1``...)."""
        for r, result in enumerate(received[:len(order) - first]):
            if isinstance(result, BaseException):
                raise result
            checkpoint = order[first + r]
            digest, values, labels, n_classes = result
            if rank == 0 and r:  # another rank's outputs, on this rank's collective device
                values = recorder.host_copy(values)
            if log.admit(checkpoint, digest):
                recorder._commit(checkpoint.epoch, values, labels, n_classes,
                                 meta=log.meta_with(checkpoint, digest))
                written[0] += 1
            bar.update()

    def finish():
        recorder.close()
        if written[0] == 0 and not log.stored:
            raise ForgetkitError(f"no checkpoint was replayed into {str(path)!r} (every one "
                                 "was a duplicate left out)")

    try:
        for w in workers:
            w.start()
        with recorder, ddp.exchange_stream(ctx):
            for first in range(0, len(order), world):
                result = None
                if first + rank < len(order):
                    result = results.take(first // world)
                    if not isinstance(result, BaseException):
                        item, (values, labels, n_classes) = result
                        try:
                            result = (resolved(item.digest), values, labels, n_classes)
                        except Exception as err:  # hashing failed: a read error
                            result = err
                if ctx is None:
                    store(first, [result])
                else:
                    received = ddp.gather_results(ctx, order[first].epoch, result)
                    ddp.on_rank0(ctx, partial(store, first, received))
            ddp.on_rank0(ctx, finish)
    finally:
        results.close()
        for w in workers:
            w.join()
        for dev in devs:
            dev.reader.shutdown(wait=True, cancel_futures=True)
    return load(path) if rank == 0 else None
