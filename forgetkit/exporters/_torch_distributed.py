"""The torch.distributed side of the PyTorch recorder: which samples each rank evaluates,
and one epoch's gather to rank 0.

Each rank evaluates a shard of the evaluation data, knowing the dataset index of every
sample: a DataLoader's own DistributedSampler gives the shards (its padding duplicates are
dropped after the gather); a DataLoader over a map-style dataset without one is split by
the recorder (the sorted indices of its sampler, in contiguous blocks, one per rank);
any other iterable of batches is split by batch (rank r evaluates batches r, r + W, ...,
and every rank reads every batch to count positions).

One epoch: every rank takes rank 0's buffers for the evaluation (batch-norm statistics
differ between DDP ranks after their last training forward; each rank's own come back
afterwards), so that the run holds rank 0's model's outputs. Then all ranks exchange their
counts (all_gather_object), so that a disagreement (class or sample counts, a rank that
failed, non-finite outputs) fails on every rank; the outputs and (index, label) pairs go to
rank 0 (gather of padded byte tensors, on the rank's CUDA device under NCCL); rank 0 checks
the indices (duplicates beyond the sampler's padding, missing ones), queues the epoch in
dataset order and broadcasts its verdict, which every rank raises or returns. A collective
that fails (a rank died, the process group's timeout passed) raises TimeoutError; nothing is
written for that epoch.
"""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from ..errors import ForgetkitError


@dataclass
class Context:
    """A process group the recorder gathers over."""

    group: object
    rank: int
    world: int
    dst: int  # the global rank of the group's rank 0, which writes
    device: torch.device  # where collective tensors live


def context(group=None):
    """The Context of ``group`` (default: the world) when torch.distributed is initialised
    with more than one rank, else None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size(group)
    if world == 1:
        return None
    backend = str(dist.get_backend(group))
    device = torch.device("cpu") if "gloo" in backend or not torch.cuda.is_available() \
        else torch.device("cuda", torch.cuda.current_device())
    dst = 0 if group is None else dist.get_global_rank(group, 0)
    return Context(group, dist.get_rank(group), world, dst, device)


class Shard:
    """This rank's (dataset indices (n,), batch) pairs of one epoch; after iterating,
    ``expected`` holds the sorted dataset indices of the whole evaluation and ``padding``
    how many duplicates the ranks evaluate on purpose (a DistributedSampler's padding)."""

    def __init__(self, data, rank, world, *, batch_size, count, cache):
        self.expected, self.padding = None, 0
        self._data, self._rank, self._world = data, rank, world
        self._batch_size, self._count, self._cache = batch_size, count, cache

    def __iter__(self):
        data = self._data
        if isinstance(data, DataLoader) and not isinstance(data.dataset, IterableDataset):
            if data.batch_sampler is None:
                raise ForgetkitError("a DataLoader with batch_size=None yields single samples; "
                                     "the recorder needs batches (set batch_size)")
            if isinstance(data.sampler, DistributedSampler):
                yield from self._sampler_shards(data)
            else:
                yield from self._own_shards(data)
        else:
            yield from self._batch_shards(data)

    def _sampler_shards(self, loader):
        sampler = loader.sampler
        self.expected = np.arange(len(sampler.dataset))
        self.padding = 0 if sampler.drop_last else sampler.total_size - len(sampler.dataset)
        # a DistributedSampler is deterministic for a given epoch: iterating its batch
        # sampler beside the loader gives each batch's indices
        for indices, batch in zip(loader.batch_sampler, loader, strict=True):
            yield np.asarray(indices, dtype=np.int64), batch

    def _own_shards(self, loader):
        self.expected = np.sort(np.fromiter(iter(loader.sampler), dtype=np.int64))
        shard = np.array_split(self.expected, self._world)[self._rank]
        size = loader.batch_size or self._batch_size
        key = (id(loader), shard.tobytes())
        if key not in self._cache:  # one loader per shard: persistent workers stay
            self._cache.clear()
            self._cache[key] = DataLoader(
                loader.dataset, batch_size=size, sampler=shard.tolist(),
                collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                pin_memory=loader.pin_memory, timeout=loader.timeout,
                worker_init_fn=loader.worker_init_fn,
                multiprocessing_context=loader.multiprocessing_context,
                generator=loader.generator, prefetch_factor=loader.prefetch_factor,
                persistent_workers=loader.persistent_workers)
        starts = range(0, len(shard), size)
        for start, batch in zip(starts, self._cache[key], strict=True):
            yield shard[start:start + size], batch

    def _batch_shards(self, batches):
        position = 0
        for b, batch in enumerate(batches):
            n = self._count(batch)
            if b % self._world == self._rank:
                yield np.arange(position, position + n), batch
            position += n
        self.expected = np.arange(position)


def _collective(ctx, epoch, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a collective; its failure as a TimeoutError."""
    try:
        return fn(*args, group=ctx.group, **kwargs)
    except RuntimeError as err:  # DistBackendError, DistNetworkError: a peer is gone
        raise TimeoutError(
            f"epoch {epoch}: {fn.__name__} across {ctx.world} ranks failed or timed out "
            f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); a rank may have "
            "died or stopped calling record(). Nothing was written for this epoch; earlier "
            "epochs are on disk") from err


def use_rank0_buffers(ctx, epoch, model):
    """Give ``model`` rank 0's buffers (batch-norm statistics: DDP lets each rank update its
    own in the forward passes after its last broadcast) so that every shard is evaluated by
    rank 0's model; return a function that puts this rank's own buffers back."""
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    for dtype in dict.fromkeys(b.dtype for b in buffers):  # module order: the same on all ranks
        group = [b for b in buffers if b.dtype == dtype]
        flat = torch.cat([b.detach().reshape(-1) for b in group]).to(ctx.device)
        wire = flat.to(torch.uint8) if dtype == torch.bool else flat
        _collective(ctx, epoch, dist.broadcast, wire, src=ctx.dst)
        flat = wire.to(dtype)
        offset = 0
        with torch.no_grad():
            for b in group:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()

    def restore():
        with torch.no_grad():
            for b, own in zip(buffers, saved, strict=True):
                b.copy_(own)

    return restore


def evaluate_shard(recorder, model, epoch):
    """(ctx, shard, local) of one recorded epoch: ``recorder._evaluate`` of ``model`` in eval
    mode over this process's shard of ``recorder.data`` (all of it outside torch.distributed,
    where ctx is None), with rank 0's buffers under torch.distributed; the model's mode and
    own buffers are restored. A DDP or DataParallel wrapper is evaluated through its module:
    a DDP forward would sync buffers while the ranks differ in batches."""
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    ctx = context(recorder.group)
    rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world)
    shard = Shard(recorder.data, rank, world, batch_size=recorder.batch_size,
                  count=recorder._batch_length, cache=recorder._shard_loaders)
    was_training = model.training
    restore = use_rank0_buffers(ctx, epoch, model) if ctx is not None else None
    model.eval()
    try:
        local = recorder._evaluate(model, epoch, shard if ctx is not None else
                                   ((None, batch) for batch in recorder.data),
                                   catch=ctx is not None)
    finally:
        model.train(was_training)
        if restore is not None:
            restore()
    return ctx, shard, local


def check_counts(epoch, metas, rank):
    """Raise the same error on every rank if the ranks' counts disagree or one failed."""
    failed = [r for r, m in enumerate(metas) if m["error"] is not None]
    if failed:
        r = failed[0]
        raise ForgetkitError(f"epoch {epoch}: rank {r} failed while evaluating its shard "
                             f"({metas[r]['error']}); nothing was written for this epoch")
    classes = {r: m["classes"] for r, m in enumerate(metas) if m["classes"] is not None}
    if len(set(classes.values())) > 1:
        raise ForgetkitError(f"epoch {epoch}: the ranks disagree on the number of classes "
                             f"(rank: classes {classes}); nothing was written for this epoch")
    if not classes:
        raise ForgetkitError(f"epoch {epoch}: no rank holds any sample to record")
    totals = {r: m["total"] for r, m in enumerate(metas)}
    if len(set(totals.values())) > 1:
        raise ForgetkitError(f"epoch {epoch}: the ranks disagree on the number of samples to "
                             f"record (rank: samples {totals}); every rank needs the same "
                             "evaluation data; nothing was written for this epoch")
    bad = [r for r, m in enumerate(metas) if not m["finite"]]
    if bad:
        raise ForgetkitError(f"outputs of epoch {epoch} contain NaN or inf (on ranks {bad}); "
                             "not stored")


def dataset_order(epoch, ids, expected, padding):
    """Positions in the gathered ``ids`` of the sorted ``expected`` indices (the first of
    duplicates); ForgetkitError naming duplicates beyond ``padding`` and missing or
    unexpected indices."""
    unique, first, counts = np.unique(ids, return_index=True, return_counts=True)
    extra = len(ids) - len(unique)
    if extra > padding:
        dup = unique[counts > 1][:10].tolist()
        raise ForgetkitError(
            f"epoch {epoch}: samples {dup} were evaluated by several ranks ({extra} duplicates; "
            f"the sampler pads {padding}): the ranks' shards overlap; nothing was written for "
            "this epoch")
    missing = np.setdiff1d(expected, unique)
    if missing.size:
        raise ForgetkitError(
            f"epoch {epoch}: no rank evaluated samples {missing[:10].tolist()} ({missing.size} "
            f"of {len(expected)} missing; a DistributedSampler with drop_last=True drops "
            "some); nothing was written for this epoch")
    unexpected = np.setdiff1d(unique, expected)
    if unexpected.size:
        raise ForgetkitError(
            f"epoch {epoch}: ranks evaluated samples {unexpected[:10].tolist()} that rank 0's "
            "data does not hold; nothing was written for this epoch")
    return first


def gather_epoch(ctx, epoch, local, shard, store):
    """Gather one epoch on rank ``ctx.dst``, which calls ``store(ids, labels, values,
    n_classes)`` with the rows in dataset order; return what ``store`` returned, on every
    rank.

    ``local``: dict with ``values`` ((n, K) tensor, or None when n = 0), ``labels`` ((n,)
    tensor), ``ids`` ((n,) int64), ``classes``, ``finite`` and ``error`` (this rank's
    evaluation error, or None).
    """
    values = local["values"]
    meta = {"n": len(local["ids"]), "classes": local["classes"], "finite": local["finite"],
            "total": None if shard.expected is None else len(shard.expected),
            "error": local["error"] and f"{type(local['error']).__name__}: {local['error']}",
            "width": 0 if values is None else values.shape[1] * values.element_size(),
            "dtype": None if values is None else str(values.dtype)}
    metas = [None] * ctx.world
    _collective(ctx, epoch, dist.all_gather_object, metas, meta)
    if local["error"] is not None:
        raise local["error"]
    check_counts(epoch, metas, ctx.rank)
    if not any(m["n"] for m in metas):  # every rank: the same verdict
        raise ForgetkitError(f"epoch {epoch}: the evaluation data yielded no batch on any "
                             "rank (an empty loader or dataset); nothing to record")
    width = max(m["width"] for m in metas)
    dtype = getattr(torch, next(m["dtype"] for m in metas if m["dtype"]).split(".")[-1])
    rows = max(m["n"] for m in metas)
    n = meta["n"]
    raw = torch.zeros((rows, width), dtype=torch.uint8, device=ctx.device)
    index = torch.full((rows, 2), -1, dtype=torch.int64, device=ctx.device)
    if n:
        raw[:n] = values.contiguous().view(torch.uint8).to(ctx.device)
        index[:n, 0] = torch.as_tensor(local["ids"]).to(ctx.device)
        index[:n, 1] = local["labels"].to(ctx.device)
    writes = ctx.rank == 0
    raws = [torch.empty_like(raw) for _ in range(ctx.world)] if writes else None
    indexes = [torch.empty_like(index) for _ in range(ctx.world)] if writes else None
    _collective(ctx, epoch, dist.gather, raw, raws, dst=ctx.dst)
    _collective(ctx, epoch, dist.gather, index, indexes, dst=ctx.dst)
    verdict = [None]
    if writes:
        try:
            counts = [m["n"] for m in metas]
            pairs = torch.cat([t[:c] for t, c in zip(indexes, counts, strict=True)]).cpu().numpy()
            take = dataset_order(epoch, pairs[:, 0], shard.expected, shard.padding)
            gathered = torch.cat([t[:c] for t, c in zip(raws, counts, strict=True)])
            rows_in_order = gathered[torch.as_tensor(take, device=gathered.device)]
            classes = next(m["classes"] for m in metas if m["classes"] is not None)
            verdict[0] = (None, store(shard.expected, pairs[take, 1],
                                      rows_in_order.view(dtype), classes))
        except Exception as err:  # every rank raises it
            verdict[0] = (err, None)
    _collective(ctx, epoch, dist.broadcast_object_list, verdict, src=ctx.dst,
                device=ctx.device)
    err, result = verdict[0]
    if err is not None:
        raise err
    return result


def _padded(tensor, rows, fill, device):
    """``tensor`` (n, ...) in a (rows, ...) tensor on ``device``, the rest ``fill``."""
    out = torch.full((rows, *tensor.shape[1:]), fill, dtype=tensor.dtype, device=device)
    out[:len(tensor)] = tensor.to(device)
    return out


def gather_tokens(ctx, epoch, local, shard, store):
    """Gather one epoch of a token run on rank ``ctx.dst``, which calls ``store(index,
    values, vocab)`` with every token once, in dataset order (sequences by dataset index,
    positions ascending); return what ``store`` returned, on every rank.

    ``local``: dict with ``values`` ((n, w) float32 rows, or None), ``index`` ((n, 3) int64:
    dataset index of the sequence, position, target), ``seqs`` (the dataset indices this rank
    evaluated), ``classes`` (the vocabulary size), ``finite`` and ``error``. The sequences
    (not the tokens) are checked as `gather_epoch` checks samples; a sequence that
    several ranks evaluated (a DistributedSampler's padding) keeps one rank's tokens.
    """
    values, index, seqs = local["values"], local["index"], np.asarray(local["seqs"])
    n = len(index)
    meta = {"n": n, "m": len(seqs), "classes": local["classes"], "finite": local["finite"],
            "total": None if shard.expected is None else len(shard.expected),
            "error": local["error"] and f"{type(local['error']).__name__}: {local['error']}",
            "width": 0 if values is None else int(values.shape[1])}
    metas = [None] * ctx.world
    _collective(ctx, epoch, dist.all_gather_object, metas, meta)
    if local["error"] is not None:
        raise local["error"]
    check_counts(epoch, metas, ctx.rank)
    if not any(m["m"] for m in metas):
        raise ForgetkitError(f"epoch {epoch}: the evaluation data yielded no batch on any "
                             "rank (an empty loader or dataset); nothing to record")
    width = max(m["width"] for m in metas)
    rows = max(max(m["n"] for m in metas), 1)
    device = ctx.device
    raw = torch.zeros((rows, width), dtype=torch.float32, device=device)
    if n and values is not None:
        raw[:n] = values.to(device)
    idx = _padded(torch.as_tensor(index, dtype=torch.int64), rows, -1, device)
    sq = _padded(torch.as_tensor(seqs, dtype=torch.int64), max(m["m"] for m in metas), -1,
                 device)
    writes = ctx.rank == 0
    lists = [[torch.empty_like(t) for _ in range(ctx.world)] if writes else None
             for t in (raw, idx, sq)]
    for t, out in zip((raw, idx, sq), lists, strict=True):
        _collective(ctx, epoch, dist.gather, t, out, dst=ctx.dst)
    verdict = [None]
    if writes:
        try:
            ns, ms = [m["n"] for m in metas], [m["m"] for m in metas]
            seq_all = torch.cat([t[:c] for t, c in zip(lists[2], ms, strict=True)]).cpu().numpy()
            seq_rank = np.repeat(np.arange(ctx.world), ms)
            first = dataset_order(epoch, seq_all, shard.expected, shard.padding)
            owner = seq_rank[first]  # the rank whose tokens of each sequence are kept
            tokens = torch.cat([t[:c] for t, c in zip(lists[1], ns, strict=True)]).cpu().numpy()
            token_rank = np.repeat(np.arange(ctx.world), ns)
            kept = owner[np.searchsorted(shard.expected, tokens[:, 0])] == token_rank
            order = np.flatnonzero(kept)
            order = order[np.lexsort((tokens[order, 1], tokens[order, 0]))]
            same = np.zeros(len(order), dtype=bool)  # a sequence twice on one rank
            same[1:] = (tokens[order[1:], :2] == tokens[order[:-1], :2]).all(axis=1)
            order = order[~same]
            gathered = torch.cat([t[:c] for t, c in zip(lists[0], ns, strict=True)])
            vocab = next(m["classes"] for m in metas if m["classes"] is not None)
            verdict[0] = (None, store(tokens[order],
                                      gathered[torch.as_tensor(order, device=gathered.device)],
                                      vocab))
        except Exception as err:  # every rank raises it
            verdict[0] = (err, None)
    _collective(ctx, epoch, dist.broadcast_object_list, verdict, src=ctx.dst, device=ctx.device)
    err, result = verdict[0]
    if err is not None:
        raise err
    return result


# ------------------------------------------------------------------------ replays
# A replay under torch.distributed: every rank evaluates a share of the checkpoints on its
# own device (rank r: checkpoints r, r + W, ...); in rounds of W checkpoints, the ranks'
# results go to rank 0, which stores them in epoch order (through the same recorder and
# replay log as one process) and broadcasts its verdict, which every rank raises or returns.

def _sendable(err):
    """``err`` if it pickles (it is sent to the other ranks as it is), else a ForgetkitError
    with its type and message."""
    try:
        pickle.dumps(err)
        return err
    except Exception:
        return ForgetkitError(f"{type(err).__name__}: {err}")


def on_every_rank(ctx, what, fn):
    """``fn()`` on every rank; when it fails on any, every rank raises (the failing rank its
    own error, the others a ForgetkitError naming it)."""
    if ctx is None:
        return fn()
    try:
        result, error = fn(), None
    except Exception as err:
        result, error = None, err
    errors = [None] * ctx.world
    _collective(ctx, 0, dist.all_gather_object, errors,
                None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [r for r, e in enumerate(errors) if e is not None]
    if failed:
        raise ForgetkitError(f"rank {failed[0]} failed while {what} ({errors[failed[0]]})")
    return result


def on_rank0(ctx, fn):
    """``fn()`` on rank 0 alone, its error raised on every rank; returns its result on rank 0
    and None elsewhere."""
    if ctx is None:
        return fn()
    verdict = [None]
    if ctx.rank == 0:
        try:
            result = fn()
        except Exception as err:
            verdict[0] = _sendable(err)
            result = None
    _collective(ctx, 0, dist.broadcast_object_list, verdict, src=ctx.dst, device=ctx.device)
    if verdict[0] is not None:
        raise verdict[0]
    return result if ctx.rank == 0 else None


def broadcast(ctx, value):
    """Rank 0's ``value`` on every rank (a picklable value)."""
    if ctx is None:
        return value
    box = [value if ctx.rank == 0 else None]
    _collective(ctx, 0, dist.broadcast_object_list, box, src=ctx.dst, device=ctx.device)
    return box[0]


def same_checkpoints(ctx, checkpoints):
    """Raise on every rank unless every rank replays the same checkpoints: the same epoch
    numbers and file names (their folders may differ between nodes)."""
    if ctx is None:
        return
    mine = [(c.epoch, Path(c.file).name) for c in checkpoints]
    theirs = [None] * ctx.world
    _collective(ctx, 0, dist.all_gather_object, theirs, mine)
    for r, other in enumerate(theirs):
        if other != theirs[0]:
            at = next((i for i, (a, b) in enumerate(zip(theirs[0], other, strict=False))
                       if a != b),
                      min(len(other), len(theirs[0])))
            raise ForgetkitError(
                f"the ranks replay different checkpoints: rank 0 has {len(theirs[0])} "
                f"(epochs {[e for e, _ in theirs[0][:5]]}...), rank {r} {len(other)}; first "
                f"difference at checkpoint {at + 1}: {theirs[0][at:at + 1]} against "
                f"{other[at:at + 1]}; every rank must be given the same checkpoints")


def outgoing(values):
    """``(values, event)``: a rank's outputs to send to rank 0, with the CUDA event after
    which they are computed (recorded now on their device's current stream; None off a
    GPU), so that the exchange, on a stream of its own, waits for them alone."""
    if values is None or values.device.type != "cuda":
        return values, None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(values.device))
    return values, event


def exchange_stream(ctx):
    """A context in which this thread's collectives and copies run on a CUDA stream of
    their own (under NCCL): they then wait for the outputs they send, not for the
    evaluation queued behind them, and the evaluation does not wait for them."""
    if ctx is None or ctx.device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(ctx.device))


def gather_results(ctx, epoch, result):
    """One round's results on rank 0: each rank's ``result`` of the checkpoint it evaluated
    (None when it has none this round; an exception when it failed): ``(digest, values,
    labels, classes)`` with ``values`` what `outgoing` returned (rank 0's: the callable of
    its host copy, kept as it is) and ``labels`` a numpy array. Returns, on rank 0, the
    world's results in rank order (``values`` of the other ranks as tensors on rank 0's
    collective device; an error as the exception), and [] elsewhere."""
    if isinstance(result, BaseException):
        meta = {"error": _sendable(result)}
    elif result is None:
        meta = None
    else:
        digest, values, labels, classes = result
        meta = {"error": None, "digest": digest, "classes": classes,
                "labels": (str(labels.dtype), labels.shape)}
        if ctx.rank != 0:
            values, ready = values
            if ready is not None:
                stream = torch.cuda.current_stream(values.device)
                stream.wait_event(ready)
                values.record_stream(stream)  # computed on the evaluation's stream
            meta.update(none=values is None, nbytes=0 if values is None else
                        values.numel() * values.element_size())
            if values is not None:
                meta.update(dtype=str(values.dtype).split(".")[-1], shape=tuple(values.shape))
    metas = [None] * ctx.world
    _collective(ctx, epoch, dist.all_gather_object, metas, meta)
    sizes = [0 if m is None or m["error"] is not None or r == 0
             else m["nbytes"] + int(np.prod(m["labels"][1])) * np.dtype(m["labels"][0]).itemsize
             for r, m in enumerate(metas)]
    if max(sizes) > 0:
        raw = torch.zeros(max(sizes), dtype=torch.uint8, device=ctx.device)
        if sizes[ctx.rank]:
            labels = result[2]
            parts = [values.contiguous().reshape(-1).view(torch.uint8).to(ctx.device),
                     torch.from_numpy(np.ascontiguousarray(labels).reshape(-1).view(np.uint8))
                     .to(ctx.device)]
            raw[:sizes[ctx.rank]] = torch.cat(parts)
        raws = [torch.empty_like(raw) for _ in range(ctx.world)] if ctx.rank == 0 else None
        _collective(ctx, epoch, dist.gather, raw, raws, dst=ctx.dst)
    if ctx.rank != 0:
        return []
    out = []
    for r, m in enumerate(metas):
        if m is None or m["error"] is not None:
            out.append(None if m is None else m["error"])
        elif r == 0:
            out.append(result)
        else:
            buf = raws[r]
            n = m["nbytes"]
            values = None if m["none"] else \
                buf[:n].view(getattr(torch, m["dtype"])).reshape(m["shape"])
            labels = buf[n:sizes[r]].cpu().numpy().view(np.dtype(m["labels"][0]))
            out.append((m["digest"], values, labels.reshape(m["labels"][1]), m["classes"]))
    return out
