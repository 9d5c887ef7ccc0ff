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

`replay` writes the same run afterwards from the ``checkpoint-N`` folders a Trainer saved.

For a causal language model, ``top_k=...`` (or ``tokens=True``) records a top-k token run
instead (`forgetkit.exporters.torch.TokenRecorder`: per target token the target's logit, the
log-sum-exp and the k largest logits with their ids), in the callback and in `replay`.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
import threading
from functools import partial
from pathlib import Path

from torch.utils.data import DataLoader, Dataset
from transformers import TrainerCallback, default_data_collator

from ..errors import CorruptFileError, ForgetkitError
from . import _torch_distributed as ddp
from ._checkpoints import ReplayLog, content_hash, existing_run, hash_pool, ordered, paths_of
from ._torch_devices import as_device, batches_of, place
from ._torch_logits import LogitRecorder
from ._torch_replay import (
    Device,
    Item,
    autocast_dtype,
    drive,
    fit_keys,
    flat_bytes,
    read_checkpoint,
    shared_names,
)
from ._torch_tokens import TokenRecorder
from .weight_space import compare_averages, load_average

__all__ = ["LogitRecorderCallback", "average_weights", "compare_weight_space", "replay"]


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
    tokens : bool, default False
        Record a causal language model's next tokens as a top-k token run
        (`forgetkit.exporters.torch.TokenRecorder`) instead of one output row per sample.
    top_k : int, optional
        The logits kept per token (default 8); giving it implies ``tokens=True``.
    **options
        Passed to `forgetkit.exporters.torch.LogitRecorder` (``dtype``, ``summary``,
        ``label_key``, ``sample_ids``, ``meta``, ``mode``, ``durable``...), or in token mode
        to `TokenRecorder` (``label_key``, ``sequence_ids``, ``meta``, ``mode``...).

    Attributes
    ----------
    recorder : LogitRecorder or TokenRecorder, made when training begins
    accuracy_ : list of float, the recorded accuracy of each epoch (next-token accuracy in
        token mode)
    """

    def __init__(self, path, dataset=None, *, batch_size=None, collate_fn=None, tokens=False,
                 top_k=None, **options):
        self.path = path
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.tokens = bool(tokens) or top_k is not None
        if self.tokens:
            options["top_k"] = 8 if top_k is None else top_k
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
        self.recorder = (TokenRecorder if self.tokens else LogitRecorder)(self.path, loader,
                                                                          **self.options)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        # state.epoch is e + 1 (a float) when epoch e ends
        self.accuracy_.append(self.recorder.record(model, int(round(state.epoch)) - 1))

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.close()


# ------------------------------------------------------------------- replay
_CHECKPOINT_DIR = re.compile(r"checkpoint-\d+")


def checkpoint_dirs(source):
    """The checkpoint folders of ``source``: a Trainer output directory (its
    ``checkpoint-N`` folders), one saved model folder (holding ``config.json``), a glob
    pattern, or a list of those."""
    dirs = []
    for text in paths_of(source, "checkpoint folder"):
        folder = Path(text)
        if (folder / "config.json").is_file():
            dirs.append(str(folder))
        elif folder.is_dir():
            found = sorted(str(p) for p in folder.iterdir()
                           if p.is_dir() and _CHECKPOINT_DIR.fullmatch(p.name))
            if not found:
                raise ForgetkitError(f"{text!r} holds no checkpoint-N folder (a Trainer's "
                                     "output_dir) and no saved model (config.json)")
            dirs += found
        else:
            raise ForgetkitError(f"checkpoint folder {text!r} does not exist")
    return dirs


def trainer_step(folder):
    """(epoch number, step) a Trainer checkpoint folder records: its ``global_step`` (in
    ``trainer_state.json``) for both, or (None, None)."""
    try:
        with open(Path(folder) / "trainer_state.json") as f:
            step = json.load(f).get("global_step")
    except (OSError, ValueError):
        return None, None
    return (step, step) if isinstance(step, int) and not isinstance(step, bool) \
        else (None, None)


def model_class_of(folder):
    """The transformers class named first in a checkpoint's ``config.json``
    ``architectures``."""
    import transformers

    try:
        with open(Path(folder) / "config.json") as f:
            names = json.load(f).get("architectures") or []
    except (OSError, ValueError) as err:
        raise ForgetkitError(f"cannot read {str(Path(folder) / 'config.json')!r}: {err}") \
            from None
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ForgetkitError(f"the config of {str(folder)!r} names no transformers model "
                             f"class ({names}); pass model_class=...")
    return cls


#: Keys of a ``config.json`` that do not change the model it builds.
NOT_ARCHITECTURE = ("_name_or_path", "transformers_version")

#: A saved model folder's weight files, in the order looked for (each also as shards listed
#: in ``<name>.index.json``).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

# from_pretrained is not safe in two threads at once (it patches torch's module
# initialisation while it builds a model): one builds at a time
_BUILDING = threading.Lock()


def folder_config(folder):
    """The ``config.json`` of a checkpoint folder as a dict, less `NOT_ARCHITECTURE`."""
    try:
        with open(Path(folder) / "config.json") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise CorruptFileError(f"cannot read {str(Path(folder) / 'config.json')!r}: {err}") \
            from None
    return {k: v for k, v in config.items() if k not in NOT_ARCHITECTURE}


def folder_state(folder):
    """The state dict saved in a model folder: its ``model.safetensors`` or
    ``pytorch_model.bin`` (or their shards), read ``weights_only`` and mapped into memory."""
    folder = Path(folder)
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return read_checkpoint(folder / name, mmap=True)[0]
        index = folder / f"{name}.index.json"
        if index.is_file():
            try:
                with open(index) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as err:
                raise CorruptFileError(f"cannot read {str(index)!r}: {err}") from None
            state = {}
            for shard in shards:
                state.update(read_checkpoint(folder / shard, mmap=True)[0])
            return state
    raise CorruptFileError(f"checkpoint folder {str(folder)!r} holds no "
                           f"{' or '.join(WEIGHT_FILES)} (nor their shards)")


def complete_state(state, names, tied, defaults):
    """``state`` (a folder's) under every name in ``names``, the model's: a tied weight
    (``tied``: each name's other names, `shared_names`) saved under one of its names only,
    a buffer the folder does not hold from ``defaults`` (the model's own, as from_pretrained
    keeps it)."""
    for k in names:
        if k not in state:
            alias = next((a for a in tied[k] if a in state), None)
            if alias is not None:
                state[k] = state[alias]
            elif k in defaults:
                state[k] = defaults[k]
    return state


def build(model_class, folder):
    """``model_class.from_pretrained(folder)`` in eval mode, from the local folder."""
    try:
        with _BUILDING:
            model = model_class.from_pretrained(folder, local_files_only=True)
    except Exception as err:
        message = " ".join(str(err).split())[:300]
        raise CorruptFileError(f"cannot load checkpoint {str(folder)!r} with "
                               f"{model_class.__name__}.from_pretrained: {message}") from None
    return model.eval()


class PretrainedDevice(Device):
    """One device's model for a Trainer's checkpoint folders: built once (from the first
    folder), it receives each folder's weights in place as a state dict does (read,
    hashed and copied to the device ahead). A folder whose config differs from the model's,
    or whose weights do not fit it, is loaded with ``from_pretrained`` into a model of its
    own, evaluated in its place."""

    def __init__(self, model, model_class, config, device, batches, pool):
        super().__init__(model, device, batches, keys=list(model.state_dict()),
                         trust_pickle=False, pool=pool)
        self.resident, self.model_class, self.config = model, model_class, config
        # buffers a folder may not hold (from_pretrained keeps the model's own)
        self.defaults = {k: v.detach().cpu().clone() for k, v in model.named_buffers()}

    def state(self, checkpoint):
        """The folder's state dict under every name of the model's (`complete_state`),
        checked by `fit_keys`."""
        state = complete_state(folder_state(checkpoint.file), self.names, self.tied,
                               self.defaults)
        return fit_keys(state, self.names, checkpoint.file)

    def fits(self, checkpoint, fn):
        """``fn()`` (a read of the checkpoint into this model), or None where the folder's
        config differs from the model's or its weights do not fit it."""
        if folder_config(checkpoint.file) != self.config:
            return None
        try:
            return fn()
        except ForgetkitError as err:
            if type(err) is not ForgetkitError:  # a read error, the folder's own
                raise
            return None

    def own_model(self, checkpoint):
        """(model, content hash) of a folder loaded with ``from_pretrained``."""
        model = build(self.model_class, checkpoint.file)
        digest = content_hash([(k, str(t.dtype), tuple(t.shape), flat_bytes(t))
                               for k, t in sorted(model.state_dict().items())], pool=self.pool)
        return model, digest

    def read(self, position, checkpoint):
        item = self.fits(checkpoint, lambda: super(PretrainedDevice, self).read(position,
                                                                                checkpoint))
        if item is not None:
            return item
        model, digest = self.own_model(checkpoint)
        return Item(position, checkpoint, digest, None, model=model.to(self.device))

    def digest(self, checkpoint):
        digest = self.fits(checkpoint, lambda: super(PretrainedDevice, self).digest(checkpoint))
        return digest if digest is not None else self.own_model(checkpoint)[1]

    def load(self, item):
        if item.model is not None:
            self.model = item.model
            return
        self.model = self.resident
        super().load(item)


class _Rows(Dataset):
    """Dict samples of a dict of equally long arrays."""

    def __init__(self, columns):
        self.columns = columns

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def replay(output_dir_or_checkpoint_dirs, dataset, path, *, model_class=None, epochs=None,
           device=None, devices=None, batch_size=256, collate_fn=None, label_key="labels",
           on_duplicate="warn", autocast=None, progress=True, tokens=False, top_k=None,
           group=None, **recorder_options):
    """Evaluate every checkpoint a `transformers.Trainer` saved on ``dataset`` and write the
    run that `LogitRecorderCallback` would have written while it trained.

    Parameters
    ----------
    output_dir_or_checkpoint_dirs : str, Path or list
        A Trainer's ``output_dir`` (every ``checkpoint-N`` folder in it is replayed, in step
        order), checkpoint folders, or a glob pattern. Each is loaded with
        ``model_class.from_pretrained(folder)`` from the local folder.
    dataset : Dataset or datasets.Dataset of dict samples, or a dict of arrays
        Batched by ``collate_fn`` with the columns the model's forward takes.
    path : str or Path, the run (``.npy`` or ``.parquet``).
    model_class : transformers model class, optional
        Default: the class named in the checkpoint's ``config.json`` (``architectures``).
    epochs : list of int, optional
        Epoch numbers in the order given. Default: each checkpoint's global step (its
        ``trainer_state.json``), else the number in its folder name.
    device, devices : where to evaluate (default: the CPU; under torch.distributed with
        NCCL, the rank's current CUDA device); several devices take whole checkpoints each.
        Each device builds the model once (``from_pretrained`` of the first folder) and
        receives every folder's weights of the same config in place; a folder of another
        config is built with ``from_pretrained`` into a model of its own.
    batch_size : int, default 256
    collate_fn : callable, optional
        Default: padding with the checkpoint's tokenizer when it saved one (what the
        Trainer does with a tokenizer), else `transformers.default_data_collator`.
    label_key, on_duplicate, autocast, progress, **recorder_options
        As for `forgetkit.exporters.torch.replay`.
    tokens : bool, default False; top_k : int, optional (default 8; implies ``tokens``)
        Write the top-k token run that `LogitRecorderCallback` writes in token mode (a
        causal language model's next tokens; ``recorder_options`` as `TokenRecorder` takes
        them; without labels the targets are the next input ids). A checkpoint whose
        vocabulary differs from the run's is refused.
    group : torch.distributed ProcessGroup, optional
        As for `forgetkit.exporters.torch.replay`: under torch.distributed each rank
        evaluates its share of the folders and rank 0 writes the run.

    Returns
    -------
    Run, with ``meta["replay"]["checkpoints"]`` (folder, step and content hash per epoch);
    None on ranks other than 0.
    """
    import transformers

    order = _folders(output_dir_or_checkpoint_dirs, epochs)
    model_class = model_class or model_class_of(order[0].file)
    if isinstance(dataset, dict):
        dataset = _Rows(dataset)
    keep = set(inspect.signature(model_class.forward).parameters) | \
        {"label", "label_ids", label_key}
    collate = collate_fn
    if collate is None:
        collate = default_data_collator
        if (Path(order[0].file) / "tokenizer_config.json").is_file():
            tokenizer = transformers.AutoTokenizer.from_pretrained(order[0].file,
                                                                   local_files_only=True)
            collate = transformers.DataCollatorWithPadding(tokenizer)
    names = getattr(dataset, "column_names", None)  # a datasets.Dataset
    if names is not None:
        dataset = dataset.remove_columns([c for c in names if c not in keep])
    else:
        collate = without_unused(collate, keep)
    tokens = tokens or top_k is not None
    ctx = ddp.context(group)
    ddp.same_checkpoints(ctx, order)
    log = ddp.on_rank0(ctx, lambda: ReplayLog(existing_run(path, recorder_options.get("mode", "a")),
                                              recorder_options.get("meta"), on_duplicate, path))

    def prepare(pool):
        # token batches need no labels (the targets are then the next input ids)
        batches = batches_of(DataLoader(dataset, batch_size=batch_size, collate_fn=collate),
                             batch_size=batch_size, label_key=None if tokens else label_key)
        if devices is not None:
            targets = [as_device(d) for d in devices]
        elif device is not None or ctx is None or ctx.device.type != "cuda":
            targets = [as_device(device or "cpu")]
        else:  # a rank of an NCCL process group: its current CUDA device
            targets = [ctx.device]
        if tokens:
            recorder = TokenRecorder(path, batches, batch_size=batch_size, label_key=label_key,
                                     top_k=8 if top_k is None else top_k, **recorder_options)
            recorder.same_batches = True  # each device's placed batches, read once
        else:
            recorder = LogitRecorder(path, batches, batch_size=batch_size,
                                     label_key=label_key, **recorder_options)
        model = build(model_class, order[0].file)
        config = folder_config(order[0].file)
        models = [model.to(targets[0])] + [copy.deepcopy(model).to(t) for t in targets[1:]]
        devs = [PretrainedDevice(m, model_class, config, t, place(batches, t), pool)
                for m, t in zip(models, targets, strict=True)]
        return recorder, devs

    with hash_pool() as pool:
        recorder, devs = ddp.on_every_rank(ctx, "preparing the replay", partial(prepare, pool))
        start = ddp.broadcast(ctx, ddp.on_rank0(ctx, lambda: log.resume(order, devs[0].digest)))
        return drive(order[start:], devs, recorder, log, autocast=autocast_dtype(autocast),
                     progress=progress, ctx=ctx)


# ------------------------------------------------------------------ weight space
def _folders(output_dir_or_checkpoint_dirs, epochs):
    """The checkpoint folders (`Checkpoint` list) in the order of their epoch numbers."""
    dirs = checkpoint_dirs(output_dir_or_checkpoint_dirs)
    return ordered(dirs, epochs=epochs, own=None if epochs is not None else trainer_step)


class _FolderStates:
    """``read(checkpoint)`` of `forgetkit.exporters.weight_space.averaged_state` for
    checkpoint folders of ``model``'s architecture (`complete_state`)."""

    def __init__(self, model):
        state = model.state_dict(keep_vars=True)
        self.names = list(state)
        self.tied = shared_names(state)[1]
        self.defaults = {k: v.detach().cpu().clone() for k, v in model.named_buffers()}

    def __call__(self, checkpoint):
        return complete_state(folder_state(checkpoint.file), self.names, self.tied,
                              self.defaults)


def average_weights(output_dir_or_checkpoint_dirs, *, weights=None, model_class=None,
                    epochs=None, bn_data=None, batch_size=256, label_key="labels",
                    device=None):
    """The model holding the average of the weights of a Trainer's checkpoint folders.

    The model is ``model_class.from_pretrained`` of the first folder (default class: the
    one its ``config.json`` names), on ``device`` if given; the average is
    `forgetkit.exporters.torch.average_weights`'s (floating parameters and buffers averaged
    with ``weights``, uniform by default; integer buffers from the last folder; BatchNorm
    statistics re-estimated on ``bn_data``). Folders and ``epochs`` as `replay` takes them.
    """
    order = _folders(output_dir_or_checkpoint_dirs, epochs)
    model = build(model_class or model_class_of(order[0].file), order[0].file)
    if device is not None:
        model.to(as_device(device))
    return load_average(model, order, weights, read=_FolderStates(model), bn_data=bn_data,
                        batch_size=batch_size, label_key=label_key, device=device)


def compare_weight_space(output_dir_or_checkpoint_dirs, data, run, *, model_class=None,
                         epochs=None, device=None, **options):
    """`forgetkit.exporters.torch.compare_weight_space` for a Trainer's checkpoint folders:
    ``run`` is their replayed (or recorded) run on ``data`` (what `LogitRecorder` takes, or
    for a top-k token run what `TokenRecorder` takes: dict batches or columns of
    ``input_ids``, ``attention_mask`` and labels); the model is ``from_pretrained`` of the
    first folder, on ``device`` if given. ``options``: those of `compare_averages`."""
    order = _folders(output_dir_or_checkpoint_dirs, epochs)
    model = build(model_class or model_class_of(order[0].file), order[0].file)
    if device is not None:
        model.to(as_device(device))
    return compare_averages(model, order, _FolderStates(model), data, run, device=device,
                            **options)
