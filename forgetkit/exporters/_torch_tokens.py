"""Top-k token runs of a causal language model: `forgetkit.exporters.torch.TokenRecorder`.

A sample is a target token: position t + 1 of a sequence, predicted by the logits at t.
Per (checkpoint, token) the run keeps the target's logit, the log-sum-exp over the
vocabulary and the k largest logits with their token ids (`forgetkit.kinds.topk.topk_dtype`);
they are computed on the model's device in float32 (float64 for a float64 model), so that
2k + 2 numbers per token reach the host. Positions whose target is masked
(``attention_mask`` 0) or ignored (label -100) are not stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import numpy as np
import torch

from ..errors import ForgetkitError, InputTypeError
from . import _torch_distributed as ddp
from ._common import RecorderBase
from ._torch_devices import default_output, host_copy, to_device, token_batches

#: The label that marks a position as ignored (Hugging Face's and torch's loss convention).
IGNORE_INDEX = -100


def topk_rows(logits, targets, k):
    """The top-k record of each row of ``logits`` (n, V) with targets (n,), on its device:
    a float32 (n, 2k + 2) tensor holding the target's logit, the log-sum-exp, the k largest
    logits and their ids (int32 bits). Order: logits descending, equal logits by ascending
    id (``ids[0]`` is the argmax with numpy's rule: the lowest id among ties). Computed in
    float32 (float64 for float64 logits), then rounded to float32."""
    return topk_candidates(logits, targets, k, exact=True)[0]


def topk_candidates(logits, targets, k, *, exact=False):
    """``(rows, settled)``: `topk_rows` of ``logits`` without waiting for the device
    (``exact=False``): ``rows`` are `topk_rows`'s where ``settled`` (a bool tensor on the
    device) is True; where it is False, some row has more logits equal to its k-th largest
    than torch.topk took (which of them it takes is not said), and `topk_rows` must be
    called. With ``exact`` such rows are sorted here (waiting for the device) and
    ``settled`` is None."""
    z = logits if logits.dtype == torch.float64 else logits.float()
    # one more than k: a logit equal to the k-th largest was left out (a tie cut) exactly
    # when the (k + 1)-th largest equals the k-th
    more = min(k + 1, z.shape[-1])
    values, ids = torch.topk(z, more, dim=-1, sorted=True)
    cut = values[:, k] == values[:, k - 1] if more > k else \
        torch.zeros(len(z), dtype=torch.bool, device=z.device)
    values, ids = values[:, :k], ids[:, :k]
    settled = None
    if exact:
        # the rows cut inside a tie are sorted (stably: ties by ascending id)
        if bool(cut.any()):
            rows = cut.nonzero().squeeze(1)
            exact_rows = torch.sort(z[rows], dim=-1, descending=True, stable=True)
            values[rows], ids[rows] = exact_rows.values[:, :k], exact_rows.indices[:, :k]
    else:
        settled = ~cut.any()
    order = ids.argsort(dim=-1)  # ties inside the k: by ascending id
    values, ids = values.gather(-1, order), ids.gather(-1, order)
    order = values.argsort(dim=-1, descending=True, stable=True)
    values, ids = values.gather(-1, order), ids.gather(-1, order)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    target = z.gather(-1, targets[:, None])
    return torch.cat([target.float(), lse.float(), values.float(),
                      ids.to(torch.int32).view(torch.float32)], dim=1), settled


def rows_to_records(rows, k, vocab_size):
    """Host (n, 2k + 2) float32 rows of `topk_rows` as records of
    `forgetkit.kinds.topk.topk_dtype`."""
    from ..kinds.topk import set_token_ids, topk_dtype

    rows = np.asarray(rows, dtype=np.float32).reshape(-1, 2 * k + 2)
    out = np.empty(len(rows), dtype=topk_dtype(k, vocab_size))
    out["target"] = rows[:, 0]
    out["lse"] = rows[:, 1]
    out["logits"] = rows[:, 2:2 + k]
    return set_token_ids(out, np.ascontiguousarray(rows[:, 2 + k:]).view(np.int32))


def token_targets(batch, *, input_key, label_key):
    """(targets (B, T-1), kept (B, T-1) bool) of a batch's next tokens: the labels (or the
    input ids) shifted by one, kept where the target's ``attention_mask`` is not 0 and its
    label is not -100."""
    ids = batch[input_key]
    labels = batch.get(label_key) if label_key is not None else None
    target = (ids if labels is None else torch.as_tensor(labels))[:, 1:]
    kept = target != IGNORE_INDEX
    mask = batch.get("attention_mask")
    if mask is not None:
        kept &= torch.as_tensor(mask)[:, 1:].to(target.device) != 0
    return target, kept


def _dict_batch(batch, input_key):
    if isinstance(batch, torch.Tensor):
        return {input_key: batch}
    if isinstance(batch, Mapping) and input_key in batch:
        return batch
    raise InputTypeError(f"token batches must be dicts holding {input_key!r} (and optionally "
                         f"'attention_mask' and labels) or tensors of input ids; got "
                         f"{type(batch).__name__}" + (f" with keys {sorted(batch)}"
                                                      if isinstance(batch, Mapping) else ""))


class TokenRecorder(RecorderBase):
    """Append a causal language model's top-k next-token records on ``data`` to a top-k run
    (`forgetkit.io.topk.TopKWriter`) at every `record` call.

    Parameters
    ----------
    path : str or Path
        ``.npy`` top-k run (with its sidecar and token table; `forgetkit.convert` makes a
        Parquet copy); an existing run there is appended to (mode "a") when it holds the
        same tokens and vocabulary.
    data : DataLoader or iterable of dict batches, a dict of columns, or input ids
        Batches hold ``input_ids`` (B, T) and optionally ``attention_mask`` and labels (under
        ``label_key``; -100 marks an ignored position); the dict less its labels goes to the
        model as keyword arguments (a tensor batch: ``model(input_ids)``). A dict of columns
        or an (N, T) tensor/array of input ids is batched by ``batch_size``. Must yield the
        same sequences in the same order every time.
    top_k : int, default 8
        Logits kept per token (with their ids); at most the vocabulary size.
    batch_size : int, default 32
        For data given as columns (and the shards of a DataLoader without a batch size).
    output_fn : callable, optional
        Maps the model's output to the (B, T, vocab) logits (default: the tensor, the first
        element of a tuple, ``out["logits"]`` or ``out.logits``).
    input_key, label_key : str, default "input_ids", "labels"
        Targets are the labels shifted by one when a batch holds labels, else the input ids.
    sequence_ids : array-like, optional
        The id of each sequence (by dataset index, or by position in the data); stored as the
        tokens' sequence ids. Default: the dataset index.
    group : torch.distributed ProcessGroup, optional
        The group to gather over (default: the world, when initialised).
    meta : dict, optional, the run's metadata.
    mode : {"a", "w", "x"}, default "a"; max_pending : int, default 2; durable : bool,
        default True. As for `forgetkit.exporters.torch.LogitRecorder`.

    Tokens are stored sequence by sequence (dataset order), positions ascending; a token's
    position is the index of its target in the sequence (1 .. T-1). Under torch.distributed
    every rank calls `record`, evaluates its shard, rank 0 writes (padding duplicates of a
    DistributedSampler dropped by sequence), the other ranks write nothing.
    """

    def __init__(self, path, data, *, top_k=8, batch_size=32, output_fn=None,
                 input_key="input_ids", label_key="labels", sequence_ids=None, group=None,
                 meta=None, mode="a", max_pending=2, durable=True):
        super().__init__(path, meta=meta, mode=mode, max_pending=max_pending,
                         durable=durable, dtype="float32")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ForgetkitError(f"top_k must be a positive integer; got {top_k!r}")
        self.top_k = int(top_k)
        self.batch_size = int(batch_size)
        self.input_key, self.label_key = input_key, label_key
        self.data = token_batches(data, self.batch_size, input_key)
        self.output_fn = output_fn or default_output
        self.sequence_ids = None if sequence_ids is None else np.asarray(sequence_ids)
        self.group = group
        self._shard_loaders = {}
        #: the batches are the same objects, never changed, at every evaluation (a replay's)
        self.same_batches = False
        self._target_cache = {}
        self._table = None  # (sequence index, position, target) of the first recorded epoch
        self._index_of_first = None
        self._vocab = None

    # ------------------------------------------------------------------ recording
    def record(self, model, epoch):
        """Run ``model`` in eval mode without gradients over the data and store its top-k
        records as epoch ``epoch``; return the next-token accuracy (the target is the
        argmax). The model's train/eval mode is restored. Nothing is written for an epoch
        that fails a check (top_k above the vocabulary, a vocabulary or tokens other than at
        the first recorded epoch, non-finite logits). Under torch.distributed every rank
        calls it and evaluates its shard with rank 0's buffers, as `LogitRecorder` does."""
        ctx, shard, local = ddp.evaluate_shard(self, model, epoch)
        if ctx is None:
            if local["error"] is not None:
                raise local["error"]
            if local["sequences"] == 0:
                raise ForgetkitError(f"epoch {epoch}: the evaluation data yielded no batch (an "
                                     "empty loader or dataset); nothing to record")
            if not local["finite"]:
                raise ForgetkitError(f"logits of epoch {epoch} contain NaN or inf; not stored")
            return self._store(epoch, local["index"].cpu().numpy(), local["values"],
                               local["classes"])
        return ddp.gather_tokens(ctx, epoch, local, shard, partial(self._store, epoch))

    def _batch_length(self, batch):
        return len(_dict_batch(batch, self.input_key)[self.input_key])

    def _evaluate(self, model, epoch, batches, *, catch, sync=True):
        """This process's tokens: dict of ``values`` (n, 2k + 2) float32 rows on the
        model's device (None when n = 0), ``index`` (n, 3) int64 (sequence index, position,
        target), ``seqs`` (the dataset indices evaluated, np int64), ``sequences`` (their
        count), ``classes`` (the vocabulary size), ``finite`` and ``error`` (with
        ``catch``, the evaluation's error, to raise on every rank); ``labels`` is ``index``
        (what a replay stores with the rows). ``sync`` is taken for the replay's sake: the
        evaluation waits for the device once, at its end.

        On a GPU nothing waits for the device between batches: whether a batch's top-k
        needs the exact (sorting) path is read back while the next batch is evaluated,
        and only such a batch is completed then; the non-finite check is read at the end."""
        device = next(model.parameters(), torch.empty(0)).device
        k = self.top_k
        rows, index, seqs, vocab = [], [], [], None
        finite, start = torch.ones((), dtype=torch.bool, device=device), 0
        unsettled = None  # the last batch's (row number, z, targets, settled, its event)

        def settle():
            i, z, t, settled, event = unsettled
            event.synchronize()
            if not bool(settled):
                rows[i] = topk_rows(z, t, k)

        try:
            with torch.inference_mode():
                for positions, batch in batches:
                    batch = _dict_batch(batch, self.input_key)
                    inputs = {key: v for key, v in batch.items() if key != self.label_key}
                    ids = batch[self.input_key]
                    n = len(ids)
                    own = positions is None
                    if own:
                        positions = np.arange(start, start + n)
                    start += n
                    seqs.append(np.asarray(positions, dtype=np.int64))
                    if len(inputs) == 1:
                        out = model(to_device({self.input_key: ids}, device)[self.input_key])
                    else:
                        out = model(**to_device(inputs, device))
                    logits = self.output_fn(out)
                    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape):
                        raise ForgetkitError(
                            f"epoch {epoch}: the model returned logits of shape "
                            f"{tuple(logits.shape)} for input ids {tuple(ids.shape)}; a causal "
                            "language model gives (batch, sequence, vocabulary) (use output_fn "
                            "to pick the logits)")
                    v = int(logits.shape[-1])
                    if vocab is None:
                        vocab = v
                    elif v != vocab:
                        raise ForgetkitError(f"epoch {epoch}: the model returned {vocab} and "
                                             f"{v} logits per token in different batches")
                    if k > v:
                        raise ForgetkitError(f"top_k={k} is larger than the vocabulary ({v} "
                                             f"logits per token); nothing written for epoch "
                                             f"{epoch}")
                    at, t, where = self._targets(batch, seqs[-1], logits.device, v, epoch,
                                                 cache=own and self.same_batches)
                    z = logits[at[:, 0], at[:, 1]]  # the kept positions' logits, in order
                    if len(z):  # one reduction pass (NaN propagates), no mask written
                        low, high = torch.aminmax(z)
                        finite &= torch.isfinite(low) & torch.isfinite(high)
                    index.append(where)
                    if logits.device.type != "cuda":
                        rows.append(topk_rows(z, t, k))
                        continue
                    r, settled = topk_candidates(z, t, k)
                    flag = torch.empty((), dtype=torch.bool, pin_memory=True)
                    flag.copy_(settled, non_blocking=True)
                    event = torch.cuda.Event(blocking=True)
                    event.record()
                    rows.append(r)
                    if unsettled is not None:
                        settle()
                    unsettled = (len(rows) - 1, z, t, flag, event)
                if unsettled is not None:
                    settle()
                finite = bool(finite)
        except Exception as err:
            if not catch:
                raise
            none = torch.empty((0, 3), dtype=torch.int64)
            return {"error": err, "values": None, "index": none, "labels": none,
                    "seqs": np.empty(0, np.int64), "sequences": 0, "classes": None,
                    "finite": True}
        index = torch.cat(index) if index else torch.empty((0, 3), dtype=torch.int64)
        return {"error": None, "finite": finite,
                "values": torch.cat(rows) if rows else None, "index": index, "labels": index,
                "seqs": np.concatenate(seqs) if seqs else np.empty(0, np.int64),
                "sequences": start, "classes": vocab}

    def _targets(self, batch, seqs, device, vocab, epoch, *, cache):
        """``(at, t, index)`` of a batch on ``device``: the kept positions (n, 2) (row,
        position - 1), their targets (n,) and the tokens' index rows (n, 3) (sequence
        index from ``seqs``, position, target); the targets checked against ``vocab``.
        With ``cache`` (the same batch object at every evaluation: a replay's) found once
        per batch."""
        key = (id(batch), vocab, str(device))
        if cache and key in self._target_cache:
            return self._target_cache[key]
        target, kept = token_targets(to_device(batch, device), input_key=self.input_key,
                                     label_key=self.label_key)
        at = kept.nonzero()  # (n_kept, 2): row, position - 1
        t = target[kept].long()
        if len(t) and bool(((t < 0) | (t >= vocab)).any()):
            bad = int(t[(t < 0) | (t >= vocab)][0])
            raise ForgetkitError(f"epoch {epoch}: target token id {bad} is outside the "
                                 f"vocabulary of {vocab} (labels other than -100 must be "
                                 "token ids)")
        rank_seq = torch.as_tensor(seqs, device=at.device)
        found = at, t, torch.stack([rank_seq[at[:, 0]], at[:, 1] + 1, t], dim=1)
        if cache:
            self._target_cache[key] = found
        return found

    def _store(self, epoch, index, values, vocab):
        """Queue the epoch's rows ``values`` (n, 2k + 2) on the device, with ``index`` (n, 3):
        sequence index, position, target, in dataset order; return its accuracy."""
        index = np.asarray(index, dtype=np.int64).reshape(-1, 3)
        if len(index) == 0:
            raise ForgetkitError(f"epoch {int(epoch)}: no position of the data has a target to "
                                 "record (every one is padding or labelled -100)")
        hits = values[:, 2 + self.top_k].view(torch.int32).long() == \
            torch.as_tensor(index[:, 2]).to(values.device)
        accuracy = float(hits.double().mean())
        self._commit(epoch, self.host_copy(values), index, vocab)
        return accuracy

    def host_copy(self, values):
        """The callable returning the rows ``values`` (on the device) on the host; its copy
        started (as `forgetkit.exporters.torch.host_copy`)."""
        if values is None:  # no target on this device's shard (refused when committed)
            width = 2 * self.top_k + 2
            return lambda: np.empty((0, width), np.float32)
        return host_copy(values, False)

    def _commit(self, epoch, values, labels, n_classes, *, ids=None, meta=None):
        """Queue epoch ``epoch`` after checking its tokens: ``values`` the rows (or a
        callable returning them), ``labels`` the tokens' (n, 3) index (sequence index,
        position, target), ``n_classes`` the vocabulary size."""
        index = np.asarray(labels, dtype=np.int64).reshape(-1, 3)
        epoch = int(epoch)
        if len(index) == 0:
            raise ForgetkitError(f"epoch {epoch}: no position of the data has a target to "
                                 "record (every one is padding or labelled -100)")
        self._check_tokens(epoch, index, n_classes)
        if self._writer is None or self._writer.closed:
            self._index_of_first = index  # the token table `_open` writes
        k, vocab = self.top_k, int(n_classes)

        def records():
            return rows_to_records(values() if callable(values) else values, k, vocab)

        super()._commit(epoch, records, index[:, 2], vocab, meta=meta)

    def _check_tokens(self, epoch, index, vocab):
        """Raise if ``vocab`` or the tokens differ from the first recorded epoch's."""
        if self._table is None:
            return
        if vocab != self._vocab:
            raise ForgetkitError(
                f"epoch {epoch}: the model has a vocabulary of {vocab} tokens; the run recorded "
                f"{self._vocab} (a checkpoint of another vocabulary or tokenizer?); nothing "
                "written for this epoch")
        old = self._table
        if np.array_equal(index, old):
            return
        seq_new, n_new = np.unique(index[:, 0], return_counts=True)
        seq_old, n_old = np.unique(old[:, 0], return_counts=True)
        if not (np.array_equal(seq_new, seq_old) and np.array_equal(n_new, n_old)):
            both = np.union1d(seq_new, seq_old)
            a = dict(zip(seq_old.tolist(), n_old.tolist(), strict=True))
            b = dict(zip(seq_new.tolist(), n_new.tolist(), strict=True))
            s = next(s for s in both.tolist() if a.get(s, 0) != b.get(s, 0))
            raise ForgetkitError(
                f"epoch {epoch}: sequence {self._sequence_name(s)} has {b.get(s, 0)} target "
                f"tokens; at the first recorded epoch it had {a.get(s, 0)} (sequence lengths or "
                "masks changed: the data must give the same tokens every epoch); nothing "
                "written for this epoch")
        at = int(np.argmax((index != old).any(axis=1)))
        raise ForgetkitError(
            f"epoch {epoch}: sequence {self._sequence_name(index[at, 0])} position "
            f"{index[at, 1]} has target token {index[at, 2]}; at the first recorded epoch "
            f"{old[at, 2]} at position {old[at, 1]} (another tokenization or data order?); "
            "nothing written for this epoch")

    def _sequence_name(self, s):
        return repr(self.sequence_ids[s].item()) if self.sequence_ids is not None else int(s)

    def _open(self, labels, n_classes, ids):
        """Open the `TopKWriter` for the tokens of this epoch (its index is the table)."""
        from ..io.background import BackgroundWriter
        from ..io.topk import TopKWriter

        index = self._index_of_first
        seqs = index[:, 0]
        if self.sequence_ids is not None:
            if len(self.sequence_ids) <= seqs.max():
                raise ForgetkitError(f"sequence_ids has {len(self.sequence_ids)} entries; the "
                                     f"data holds sequence {int(seqs.max())}")
            seqs = self.sequence_ids[seqs]
        o = self._writer_options
        writer = TopKWriter(self.path, vocab_size=int(n_classes), top_k=self.top_k,
                            targets=index[:, 2], sequence_ids=seqs,
                            positions=index[:, 1].astype(np.int32), meta=o["meta"],
                            mode=o["mode"], durable=self.durable)
        self._writer = BackgroundWriter(writer, max_pending=self.max_pending)
        self._labels = np.asarray(labels, dtype=np.int64)
        self._table, self._vocab = index, int(n_classes)
        self._last_epoch = writer.epochs[-1] if writer.epochs else None
