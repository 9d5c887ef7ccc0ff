"""Top-k runs of language models: per (checkpoint, token) a few numbers instead of the
vocabulary.

A sample is a target token, identified by (sequence id, position), and its label is the
target token id y. For one checkpoint and token with logits z over a vocabulary of V ids a
top-k record holds

- ``target``: z[y], the target's logit;
- ``lse``: log(sum_v exp(z[v])), the log-sum-exp over the vocabulary;
- ``logits``: the k largest logits, descending (equal logits by ascending id);
- ``ids``: their token ids: uint16 for vocabularies up to 65,536 ids, else 24-bit
  little-endian (three bytes per id, a (k, 3) uint8 field) up to 2**24 ids, read and
  written only through `token_ids` and `set_token_ids` (files written before 24-bit ids
  hold uint32 ids, which these read too);

computed from the model's logits before rounding to float32: 8 + 6k bytes at most 65,536
ids (56 at k = 8), 8 + 7k above (64 at k = 8).
From these, exactly as from the full logits:

- correct = (ids[0] == y): the argmax, ties to the lowest id, is the target;
- the target's probability p = exp(target - lse), hence surprisal -log p;
- the AUM margin target - (logits[0] if ids[0] != y else logits[1]) (k >= 2);
- the stored ids' probabilities exp(logits - lse), and for every id not stored the bound
  0 <= p(c) <= u = min(p of the k-th stored id, max(0, 1 - sum of the stored
  probabilities)) (0 when k is the vocabulary: nothing is unstored).

Probabilities of every class and window means need the full outputs; Knowledge Fusion
works from the stored probabilities and the bound (docs/definitions.md, "Top-k runs").
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np

from .. import kernels
from .._validation import check_int
from ..errors import ForgetkitError
from ..execution import executor_for
from .base import SUMMARY_DTYPE, RecordKind, RecordOutputs, register_kind

#: k used when none is given (recorders).
DEFAULT_TOP_K = 8
#: Largest vocabulary whose ids are stored as uint16.
U16_VOCAB = 1 << 16
#: Largest vocabulary whose ids are stored in three bytes (above: uint32).
U24_VOCAB = 1 << 24
#: How a top-k record stores its token ids: its ``ids`` field's (base dtype, shape after k).
#: "uint32" is what runs of vocabularies above 65,536 held before 24-bit ids.
ID_ENCODINGS = {"uint16": ("<u2", ()), "uint24": ("u1", (3,)), "uint32": ("<u4", ())}
#: The token table of a top-k run: per token its sequence id, the position of its target
#: token in that sequence, and the target token id (the run's label).
TOKEN_DTYPE = np.dtype([("sequence", "<i8"), ("position", "<i4"), ("target", "<i4")])
#: Relative float32 slack of the checks of lse against the logits (rounding of a
#: log-sum-exp computed in float32 on a device).
LSE_SLACK = 8 * float(np.finfo(np.float32).eps)
#: What a top-k run cannot give, for the errors of the methods that need the full outputs.
HOLDS = ("this run is a top-k run (per checkpoint and token: the target's logit, the "
         "log-sum-exp over the vocabulary and the k largest logits with their token ids), "
         "which gives correctness, predictions, target probabilities and margins exactly "
         "and every other class's probability only within bounds")


def topk_dtype(k, vocab_size, *, ids=None):
    """The record dtype of a top-k run: fields ``target`` <f4, ``lse`` <f4, ``logits``
    <f4 (k,), ``ids`` (k,) <u2 (vocab_size <= 65,536) or (k, 3) uint8 (24-bit
    little-endian ids, vocab_size <= 2**24; above, (k,) <u4).

    Parameters
    ----------
    k : int, 1 <= k <= vocab_size
    vocab_size : int >= 2
    ids : {"uint16", "uint24", "uint32"}, optional
        The id encoding (`ID_ENCODINGS`); default `id_encoding` (vocab_size). It must hold
        every id of the vocabulary.
    """
    k, vocab_size = _check_k(k, vocab_size)
    ids = id_encoding(vocab_size) if ids is None else ids
    if ids not in ID_ENCODINGS or vocab_size > _capacity(ids):
        raise ForgetkitError(f"ids must be one of {', '.join(ID_ENCODINGS)} holding "
                             f"vocab_size={vocab_size} ids; got {ids!r}")
    base, tail = ID_ENCODINGS[ids]
    return np.dtype([("target", "<f4"), ("lse", "<f4"), ("logits", "<f4", (k,)),
                     ("ids", base, (k, *tail))])


def id_encoding(vocab_size):
    """The id encoding of new records of a vocabulary: "uint16" up to 65,536 ids, "uint24"
    up to 2**24, else "uint32"."""
    return "uint16" if vocab_size <= U16_VOCAB else "uint24" if vocab_size <= U24_VOCAB \
        else "uint32"


def _capacity(encoding):
    return {"uint16": U16_VOCAB, "uint24": U24_VOCAB, "uint32": 1 << 32}[encoding]


def ids_of(dtype):
    """The id encoding ("uint16", "uint24" or "uint32") of a `topk_dtype`."""
    field = np.dtype(dtype)["ids"]
    return "uint24" if field.base == np.dtype("u1") else \
        "uint16" if field.base == np.dtype("<u2") else "uint32"


def token_ids(records, j=None):
    """The token ids of top-k ``records`` (..., ) of any id encoding: (..., k), or (...,)
    the j-th stored id (j = 0: the argmax) when ``j`` is given; uint16, uint32 or int32
    (24-bit ids, decoded). The one reader of the ``ids`` field."""
    ids = records["ids"]
    if ids.dtype != np.uint8:
        return ids if j is None else ids[..., j]
    if j is not None:
        if records.flags.c_contiguous and records.size:
            # one little-endian 4-byte word per record, ending with the id's 3 bytes (the
            # byte before them is the previous field's): one strided read, as for uint16
            start = records.dtype.fields["ids"][1] + 3 * int(j) - 1
            words = np.ndarray(records.shape, dtype="<u4", buffer=records, offset=start,
                               strides=records.strides)
            return (words >> np.uint32(8)).view(np.int32)
        ids = ids[..., j, :]
    out = np.zeros(ids.shape[:-1] + (4,), dtype=np.uint8)
    out[..., :3] = ids
    return out.view("<i4")[..., 0]


def set_token_ids(records, ids):
    """Write token ids (..., k) into ``records["ids"]`` in the records' encoding
    (`token_ids` reads them back); ids that the encoding cannot hold are refused."""
    ids = np.asarray(ids)
    field = records["ids"]
    encoding = ids_of(records.dtype)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= _capacity(encoding)):
        raise ForgetkitError(f"token ids must lie in [0, {_capacity(encoding)}) to be stored "
                             f"as {encoding}; got ids in [{ids.min()}, {ids.max()}]")
    if encoding != "uint24":
        field[...] = ids
        return records
    wide = np.ascontiguousarray(ids, dtype="<u4")
    field[...] = wide.view(np.uint8).reshape(wide.shape + (4,))[..., :3]
    return records


def convert_records(records, dtype):
    """``records`` in the `topk_dtype` ``dtype`` (same k, ids re-encoded); the records
    themselves when they have it."""
    dtype = np.dtype(dtype)
    if records.dtype == dtype:
        return records
    out = np.empty(records.shape, dtype=dtype)
    for field in ("target", "lse", "logits"):
        out[field] = records[field]
    return set_token_ids(out, token_ids(records))


def _check_k(k, vocab_size):
    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    k = check_int("k", k, minimum=1)
    if k > vocab_size:
        raise ForgetkitError(f"k must lie in [1, vocab_size={vocab_size}] (the vocabulary); "
                             f"got k={k}")
    return k, vocab_size


def is_topk_dtype(dtype):
    """Whether ``dtype`` is a `topk_dtype` (any k, any id encoding)."""
    dtype = np.dtype(dtype)
    if dtype.names != ("target", "lse", "logits", "ids"):
        return False
    k = dtype["logits"].shape
    ids = dtype["ids"]
    return (len(k) == 1 and dtype["target"] == np.dtype("<f4") and
            dtype["lse"] == np.dtype("<f4") and dtype["logits"].base == np.dtype("<f4")
            and any(ids.base == np.dtype(base) and ids.shape == k + tail
                    for base, tail in ID_ENCODINGS.values()))


def top_k_of(dtype):
    """k of a `topk_dtype`."""
    return int(np.dtype(dtype)["logits"].shape[0])


def topk_records(logits, targets, k, *, vocab_size=None, out=None):
    """The top-k records of one checkpoint's logits (the numpy reference).

    Parameters
    ----------
    logits : ndarray of shape (n_tokens, vocab_size), float16, float32 or float64
    targets : array-like of int of shape (n_tokens,), the target token ids
    k : int, 1 <= k <= vocab_size
    vocab_size : int, optional
        The vocabulary (default: the logits' columns); ids are stored in its width.
    out : ndarray of `topk_dtype`, shape (n_tokens,), optional

    Returns
    -------
    ndarray of `topk_dtype` (k, vocab_size), shape (n_tokens,)
        Computed in float64 (ranks, ties to the lowest id, and the log-sum-exp), stored as
        float32.
    """
    values = np.asarray(logits)
    if values.ndim != 2:
        raise ForgetkitError(f"logits must have shape (tokens, vocabulary); got shape "
                             f"{values.shape}")
    n, v = values.shape
    vocab_size = v if vocab_size is None else vocab_size
    if v != vocab_size:
        raise ForgetkitError(f"logits must have {vocab_size} columns (the vocabulary); got "
                             f"{v}")
    dtype = topk_dtype(k, vocab_size)
    targets = np.asarray(targets, dtype=np.int64)
    if targets.shape != (n,) or (n and (targets.min() < 0 or targets.max() >= v)):
        raise ForgetkitError(f"targets must be {n} token ids in [0, {v}); got "
                             f"{targets.shape} ids")
    if out is None:
        out = np.empty(n, dtype=dtype)
    step = max(1, (1 << 24) // (8 * v))
    for start in range(0, n, step):
        z = values[start: start + step].astype(np.float64)
        rows = np.arange(len(z))
        if not np.isfinite(z).all():
            raise ForgetkitError("logits hold NaN or inf; no records made")
        order = np.argsort(-z, axis=1, kind="stable")[:, :k]  # ties: ascending ids
        top = z[rows, order[:, 0]]
        lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        part = out[start: start + step]
        part["target"] = z[rows, targets[start: start + step]]
        part["lse"] = lse
        part["logits"] = np.take_along_axis(z, order, axis=1)
        set_token_ids(part, order)
        if not (np.isfinite(part["lse"]).all() and np.isfinite(part["logits"]).all()):
            raise ForgetkitError("logits hold values beyond the float32 range; no records "
                                 "made")
    return out


# ------------------------------------------------------------- derived quantities
def record_fields(records):
    """The fields the top-k kernels take from records (N,): (logits (N, k), ids int32 (N, k)
    whatever their encoding, target (N,), lse (N,)), each contiguous: one compiled kernel
    serves every vocabulary."""
    return tuple(np.ascontiguousarray(token_ids(records), dtype=np.int32) if f == "ids"
                 else np.ascontiguousarray(records[f]) for f in ("logits", "ids", "target", "lse"))


def correct(records, targets):
    """Whether the target is the argmax (ties to the lowest id): bool (..., n_tokens)."""
    return token_ids(records, 0) == np.asarray(targets)


def predictions(records):
    """The argmax token id (ties to the lowest id): int64 (..., n_tokens)."""
    return token_ids(records, 0).astype(np.int64)


def label_probs(records):
    """The target's probability exp(target - lse): float64 (..., n_tokens)."""
    return kernels.exp(records["target"].astype(np.float64) - records["lse"])


def label_margins(records, targets):
    """The AUM margin z[y] - max_{v != y} z[v]: float64 (..., n_tokens). Needs k >= 2
    (with k = 1 the largest other logit of a correct token is not stored)."""
    k = top_k_of(records.dtype)
    if k < 2:
        raise ForgetkitError("margins need the largest logit other than the target's, which "
                             "a top-k run with k = 1 does not store for tokens it predicts "
                             "correctly; record with k >= 2")
    return records["target"].astype(np.float64) - _largest_other(records, targets)[0]


def _largest_other(records, targets):
    """(largest other logit, its id) of records with k >= 2."""
    logits, ids = records["logits"], token_ids(records)
    first = ids[..., 0] == np.asarray(targets)
    return (np.where(first, logits[..., 1], logits[..., 0]),
            np.where(first, ids[..., 1], ids[..., 0]))


def stored_probs(records):
    """The stored ids' probabilities exp(logits - lse): float64 (..., n_tokens, k)."""
    return kernels.exp(records["logits"].astype(np.float64)
                       - records["lse"].astype(np.float64)[..., None])


def unstored_bound(records, *, vocab_size=None):
    """u = min(p of the k-th stored id, max(0, 1 - sum of the stored probabilities)): the
    bound 0 <= p(c) <= u of every id c a record does not store: float64 (..., n_tokens);
    0 where k is ``vocab_size`` (every id stored)."""
    p = stored_probs(records)
    u = np.minimum(p[..., -1], np.maximum(0.0, 1.0 - p.sum(axis=-1)))
    if vocab_size is not None and p.shape[-1] >= vocab_size:
        u[...] = 0.0
    return u


def as_summary(records, targets):
    """The summary records (`forgetkit.kinds.summary.SUMMARY_DTYPE`) of top-k records: the
    target's logit, the largest other logit and its id, the log-sum-exp, exactly (k >= 2,
    or k = 1 where no token is predicted correctly)."""
    if top_k_of(records.dtype) < 2:
        raise ForgetkitError("the largest other logit needs k >= 2 (see label_margins)")
    out = np.empty(records.shape, dtype=SUMMARY_DTYPE)
    out["label"] = records["target"]
    out["other"], out["other_class"] = _largest_other(records, targets)
    out["lse"] = records["lse"]
    return out


def check_records(records, targets, vocab_size, *, where="records"):
    """Raise ForgetkitError unless ``records`` (..., n_tokens) of a `topk_dtype` are valid
    for ``targets`` and ``vocab_size``: finite values; ids in [0, vocab_size), distinct per
    token; logits descending, equal ones by ascending id; lse at least the largest logit
    and the target's at most it,
    and equal to it where the target is stored (up to float32 rounding, `LSE_SLACK`)."""
    records = np.asarray(records)
    targets = np.asarray(targets)
    for field in ("target", "lse", "logits"):
        values = records[field]
        if not np.isfinite(values).all():
            bad = np.argwhere(~np.isfinite(values))[0].tolist()
            raise ForgetkitError(f"{where}: field {field!r} holds NaN or inf (at index {bad})")
    ids = token_ids(records)
    if ids.size and int(ids.max()) >= vocab_size:
        bad = np.argwhere(ids >= vocab_size)[0].tolist()
        raise ForgetkitError(f"{where}: token id {int(ids[tuple(bad)])} lies outside the "
                             f"vocabulary [0, {vocab_size}) (at index {bad})")
    logits = records["logits"]
    if logits.shape[-1] > 1:
        if (np.diff(logits, axis=-1) > 0).any():
            bad = np.argwhere((np.diff(logits, axis=-1) > 0).any(axis=-1))[0].tolist()
            raise ForgetkitError(f"{where}: the logits of token {bad} are not in descending "
                                 "order")
        ties = (logits[..., 1:] == logits[..., :-1]) & (ids[..., 1:] < ids[..., :-1])
        if ties.any():
            bad = np.argwhere(ties.any(axis=-1))[0].tolist()
            raise ForgetkitError(f"{where}: token {bad} stores equal logits out of id order "
                                 "(equal logits go by ascending id, so that ids[0] is the "
                                 "argmax with ties to the lowest id)")
        sorted_ids = np.sort(ids, axis=-1)
        if (sorted_ids[..., 1:] == sorted_ids[..., :-1]).any():
            bad = np.argwhere((sorted_ids[..., 1:] == sorted_ids[..., :-1]).any(axis=-1))
            raise ForgetkitError(f"{where}: token {bad[0].tolist()} stores one id twice")
    top = logits[..., 0].astype(np.float64)
    lse = records["lse"].astype(np.float64)
    target = records["target"].astype(np.float64)
    slack = LSE_SLACK * np.maximum(1.0, np.abs(top))
    low = lse < np.maximum(top, target) - slack
    if low.any():
        i = tuple(np.argwhere(low)[0])
        raise ForgetkitError(f"{where}: the log-sum-exp {lse[i]!r} of token {list(i)} lies "
                             f"below its largest logit {max(top[i], target[i])!r} (beyond "
                             "float32 rounding): not a log-sum-exp over the vocabulary")
    at = ids == targets[..., None]
    stored_target = np.where(at, logits, -np.inf).max(axis=-1)
    with np.errstate(invalid="ignore"):
        off = at.any(axis=-1) & (np.abs(stored_target - target) > slack)
    off |= ~at.any(axis=-1) & (target > logits[..., -1] + slack)
    if off.any():
        i = tuple(np.argwhere(off)[0])
        raise ForgetkitError(f"{where}: the target's logit {target[i]!r} of token {list(i)} "
                             "disagrees with its stored top-k logits (the target is stored "
                             "with another value, or exceeds the k-th largest logit without "
                             "being stored)")


class TopKOutputs(RecordOutputs):
    """The outputs of a top-k run: records (n_epochs, n_tokens) of a `topk_dtype` standing in
    for the (n_epochs, n_tokens, vocab_size) logits, with the token table.

    ``shape`` is that of the logits; selecting epochs (``outputs[idx]``) or tokens
    (``outputs[:, idx]``) gives a TopKOutputs of the selection (its token table too);
    reading one epoch's values (``outputs[e]``) raises a ValueError, as no per-class values
    are stored.

    Parameters
    ----------
    records : ndarray or memmap (or a dask array) of a `topk_dtype`, shape (E, N)
    vocab_size : int
    sequence_ids : array-like of int of shape (N,)
    positions : array-like of int of shape (N,)
    """

    HOLDS = HOLDS

    def __init__(self, records, vocab_size, sequence_ids, positions, *, checks=None):
        if not is_topk_dtype(getattr(records, "dtype", np.dtype(np.float32))) \
                or records.ndim != 2:
            raise ForgetkitError(f"top-k records must be a (n_epochs, n_tokens) array of a "
                                 f"topk_dtype; got {getattr(records, 'dtype', None)} of shape "
                                 f"{getattr(records, 'shape', None)}")
        self.top_k, vocab_size = _check_k(top_k_of(records.dtype), vocab_size)
        super().__init__(records, vocab_size)
        n = records.shape[1]
        self.sequence_ids = _token_column("sequence_ids", sequence_ids, n, np.int64)
        self.positions = _token_column("positions", positions, n, np.int32)
        #: Checks of the stored epochs not yet verified against their checksums, made on
        #: their first full read (`forgetkit.io.topk.EpochChecks`), or None.
        self.checks = checks

    @property
    def records(self):
        """The records (E, N), every epoch verified first if it was not yet (`checks`)."""
        if self.checks is not None:
            self.checks.all(self._stored)
            self.checks = None
        return self._stored

    @records.setter
    def records(self, value):
        self._stored = value

    @property
    def stored(self):
        """The records as stored (a memmap, an ndarray or a dask array), not verified."""
        return self._stored

    def builder(self, samples):
        return partial(TopKOutputs, vocab_size=self.n_classes,
                       sequence_ids=self.sequence_ids[samples],
                       positions=self.positions[samples])

    def correct(self, labels):
        return correct(self.read(), labels)

    def predictions(self, labels):
        """The argmax token ids: int32 (n_epochs, n_tokens), read epoch by epoch in threads
        (the copy and the checksum release the GIL), only what they need: an epoch not yet
        verified is checked against the checksum of its argmax ids
        (`forgetkit.io.topk.EpochChecks.check_argmax`; a full check where the file has none).
        A memory-mapped file's pages are mapped by the threads as they read them (mapping
        them all first with madvise(MADV_POPULATE_READ), one thread, made the fresh pass
        slower: 0.52-0.56 s against 0.47-0.50 s for 5.6 GB); the result is a
        `fresh_array`."""
        records, checks = self._stored, self.checks
        out = fresh_array(records.shape, np.int32)

        def epoch(e):
            out[e] = token_ids(records[e], 0)
            if checks is not None:
                checks.check_argmax(records, e, out[e])

        with ThreadPoolExecutor(max(1, min(len(out), os.cpu_count() or 1))) as pool:
            list(pool.map(epoch, range(len(out))))  # the first bad epoch raises
        return out

    def label_probs(self):
        return label_probs(self.read())

    def label_margins(self, labels):
        return label_margins(self.read(), labels)

    def summary(self, labels):
        return as_summary(self.read(), labels)

    def stored_probs(self):
        """exp(logits - lse): float64 (n_epochs, n_tokens, k)."""
        return stored_probs(self.read())

    def unstored_bound(self):
        """`unstored_bound`: float64 (n_epochs, n_tokens)."""
        return unstored_bound(self.read(), vocab_size=self.n_classes)

    def top_predictions(self, epoch, *, rows=None, n=None):
        """The ``n`` (default: every stored) largest predictions at epoch index ``epoch``
        of the tokens ``rows`` (default all), highest first: (token ids int64 (R, n),
        probabilities exp(logit - lse) float64 (R, n))."""
        records = self.records[epoch]  # verified against the checksums first
        records = np.asarray(records if rows is None else records[rows])
        n = top_k_of(records.dtype) if n is None else min(int(n), top_k_of(records.dtype))
        return token_ids(records)[..., :n].astype(np.int64), stored_probs(records)[..., :n]


#: Arrays at least this large that `fresh_array` maps itself.
FRESH_BYTES = 1 << 26


def fresh_array(shape, dtype):
    """An uninitialised array for results written once: of at least `FRESH_BYTES`, a fresh
    anonymous mapping (POSIX) in the kernel's default pages, where numpy advises large
    allocations to use transparent huge pages. Filling 400 MB of those in a fresh process
    took 0.05 to 1.5 s on the 2-core machine (a VM; the slow cases were fresh processes), in
    4 KiB pages 0.13 to 0.3 s (faulted in by the threads that fill it)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < FRESH_BYTES or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(shape, dtype=dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


def _token_column(name, values, n, dtype):
    values = np.asarray(values)
    if values.shape != (n,) or (values.size and values.dtype.kind not in "iu"):
        raise ForgetkitError(f"{name} must be {n} integers (one per token); got "
                             f"{values.dtype} of shape {values.shape}")
    if values.size and (int(values.min()) < np.iinfo(dtype).min
                        or int(values.max()) > np.iinfo(dtype).max):
        raise ForgetkitError(f"{name} must fit {np.dtype(dtype).name}; got values in "
                             f"[{values.min()}, {values.max()}]")
    return values.astype(dtype, copy=False)


#: Tokens per chunk of the passes that stream a top-k run's bounds (certificates,
#: predictions): each holds a few float64 arrays of (chunk, layout width).
CHUNK_TOKENS = 1 << 14
#: Tokens per chunk of a Knowledge Fusion fit or an ensemble selection held in this
#: process. These keep every chunk's state (layout, record cache, fusion) to the end, so a
#: larger chunk costs only its layout's first rows (`kernels.LAYOUT_COLUMNS` wide) more,
#: and makes each pass one kernel call over more tokens; the record cache budget
#: (`CACHE_BYTES`) still goes to chunks in turn.
FIT_CHUNK_TOKENS = 1 << 16
#: Bytes of record probabilities that the layouts alive in a process may keep at once
#: (`cache_array`): k + 2 float64 per kept record, read by every window of a fit and every
#: round of a selection instead of the records' k + 1 exps. Per process, so that the fit
#: states of many chunks (on dask workers too) hold at most this much each process.
CACHE_BYTES = 1 << 29
_cache_lock = threading.Lock()
_cache_used = [0]


def cache_array(shape):
    """A new float64 array of ``shape`` for record probabilities where `CACHE_BYTES` has
    room for it in this process, else None; its bytes return to the budget when it is
    freed."""
    nbytes = 8 * int(np.prod(shape))
    with _cache_lock:
        if _cache_used[0] + nbytes > CACHE_BYTES:
            return None
        _cache_used[0] += nbytes
    out = np.empty(shape)
    weakref.finalize(out, _release_cache, nbytes)
    return out


def _release_cache(nbytes):
    with _cache_lock:
        _cache_used[0] -= nbytes


def _kernel_fields(block):
    """The four fields of records ``block`` as the kernels take them: read-only views, so
    that records held in memory, memory-mapped or read on a worker share each kernel's one
    compiled specialization (numba types read-only arrays apart)."""
    fields = tuple(f.view() for f in (block["logits"], token_ids(block), block["target"],
                                      block["lse"]))
    for f in fields:
        f.flags.writeable = False
    return fields


class TopKData:
    """The records of a top-k run that certified fusion reads (`TopKKind.certified_bounds`).

    Parameters
    ----------
    records : ndarray or memmap (n_epochs, n_tokens) of a `topk_dtype`; read a chunk of
        tokens at a time
    targets : ndarray of int (n_tokens,)
    vocab_size : int
    """

    def __init__(self, records, targets, vocab_size):
        dtype = getattr(records, "dtype", None)
        if getattr(records, "ndim", 0) != 2 or dtype is None or not is_topk_dtype(dtype):
            raise ForgetkitError("top-k records must be an (epochs, tokens) array of the top-k "
                                 f"record dtype; got {dtype} of shape "
                                 f"{getattr(records, 'shape', None)}")
        self.records = records
        self.targets = np.asarray(targets, dtype=np.int64)
        self.vocab_size = int(vocab_size)
        self.top_k = top_k_of(dtype)
        self.n_epochs = records.shape[0]

    @property
    def n_tokens(self):
        return self.targets.shape[0]

    @property
    def exact(self):
        """Whether every class is stored (k == the vocabulary): every value is exact."""
        return self.top_k >= self.vocab_size

    def rows(self, e, rows):
        """Records (n,) of epoch index ``e`` at tokens ``rows`` (a slice)."""
        return np.asarray(self.records[int(e), rows])

    @property
    def holds_records(self):
        """Whether the records are an array here (in memory or a memmap), whose views cost
        nothing to keep; else they are read on demand (`forgetkit.distributed.topk`)."""
        return isinstance(self.records, np.ndarray)

    def fields(self, rows, epochs=None):
        """The fields the top-k kernels read, of every epoch (or of the epoch indices
        ``epochs``, int64 (W,)) at tokens ``rows`` (a slice): (logits (E, n, k) float32, ids
        (E, n, k), target (E, n) float32, lse (E, n) float32); of every epoch, views of the
        records (24-bit ids decoded to int32)."""
        block = np.asarray(self.records[slice(None) if epochs is None else epochs, rows])
        return _kernel_fields(block)

    def chunks(self, size=CHUNK_TOKENS):
        """Slices of tokens, ``size`` at a time."""
        n = self.n_tokens
        return [slice(s, min(s + size, n)) for s in range(0, n, size)]


class TopKKind(RecordKind):
    """The top-k kind: exact correctness, predictions, target probabilities and margins from
    the records; every other class's probability within bounds (`certified_bounds`), exact
    where k is the vocabulary."""

    bounded = True

    def certified_bounds(self, run):
        """The `TopKData` of a top-k run held in memory or on disk; of one whose records
        live on an executor's workers (a dask array), what that executor reads them with
        (`forgetkit.execution.Executor.certified_bounds`)."""
        executor = executor_for(run)
        if executor.lazy:
            return executor.certified_bounds(run)
        if not isinstance(run.outputs.stored, np.ndarray):
            raise ForgetkitError("certified fusion reads a top-k run's records here, not on "
                                 "dask workers: load the run from one file (not a glob of "
                                 "shards, without chunks=)")
        return TopKData(run.outputs.records, run.labels, run.n_classes)


TOPK = register_kind(TopKKind("topk", TopKOutputs, HOLDS))
