"""Top-k runs: per (checkpoint, token) the target's logit, the log-sum-exp over the
vocabulary and the k largest logits with their token ids (`forgetkit.kinds.topk`).

On disk (NPY), three files:

- ``<name>.npy``: the records, a structured array of shape (n_epochs, n_tokens) of
  `forgetkit.kinds.topk.topk_dtype` (at k = 8: 56 bytes per record up to 65,536 token ids, 64
  above, with 24-bit ids), memory-mapped on load;
- ``<name>.tokens.npy``: the token table (`forgetkit.kinds.topk.TOKEN_DTYPE`: per token its
  sequence id, position and target token id, which is the run's label);
- ``<name>.forgetkit.json``: the sidecar, ``"format": "forgetkit-topk"``, ``"kind": "topk"``,
  ``vocab_size`` (= ``n_classes``), ``k``, ``ids`` (the id encoding, "uint16" or "uint24";
  absent in runs written before 24-bit ids: "uint16" up to 65,536 ids, else "uint32"), the
  epoch numbers, metadata, the CRC32C of every
  stored epoch's records (`forgetkit.io.integrity`) and of its argmax ids (``"argmax"``:
  the forgetting pass reads and verifies only those), and of the token table with the
  vocabulary size and k.

Loading verifies each epoch on its first read (`forgetkit.io.topk_record.EpochChecks`), once
per process for an unchanged file.

`TopKWriter` appends epoch by epoch as `SummaryWriter` does (lock, resume, replace,
durable): each epoch's records are written and flushed, then the sidecar, then the header,
so the file always loads as the epochs completed. A new token table is written as
``<name>.tokens.npy.next`` before the records and sidecar are committed
(`forgetkit.io.pair.commit_pair`) and renamed into place after; a reader takes whichever of
the two matches the sidecar's checksum, so it sees the old run or the new one.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .._deprecation import keyword_options
from .._progress import Progress
from .._validation import check_bool, check_int, check_meta, check_option, check_path
from ..errors import CorruptFileError, ForgetkitError, InputTypeError
from ..kinds import kind_of
from ..kinds import topk as _topk
from ..kinds.topk import (
    DEFAULT_TOP_K,
    TOKEN_DTYPE,
    TopKOutputs,
    check_records,
    convert_records,
    ids_of,
    is_topk_dtype,
    top_k_of,
    topk_dtype,
)
from ..run import Run
from .atomic import atomic_write, fsync_path, remove_stale_temps
from .guard import refuse_overwrite
from .integrity import KEY as CRC_KEY
from .integrity import crc_ints
from .lock import RunLock
from .npy import epochs_of_record, open_records, verify_tensor
from .pair import READ_ATTEMPTS, commit_pair, file_identity, open_pair
from .record import (  # noqa: F401 (TOKENS_SUFFIX: forgetkit.io.topk's, as before)
    TOKENS_SUFFIX,
    one_line,
    pending_tokens_path,
    read_sidecar_of,
    record_encoder,
    sidecar_path,
    tokens_path,
)
from .summary import SummaryWriter, summary_header
from .topk_parquet import write_topk_parquet
from .topk_record import (
    ARGMAX_KEY,
    FORMAT,
    argmax_crc,
    check_topk_record,
    epoch_crcs,
    record_dtype,
    refuse_duplicate_tokens,
    table_crc,
    topk_record,
    topk_run,
)


def token_table(targets, sequence_ids, positions, vocab_size):
    """The token table (`TOKEN_DTYPE`, shape (n_tokens,)) of checked ``targets`` (token ids
    in [0, vocab_size)), ``sequence_ids`` and ``positions``."""
    targets = np.asarray(targets)
    if targets.ndim != 1 or targets.size == 0 or targets.dtype.kind not in "iu":
        raise ForgetkitError(f"targets must be a non-empty 1-d array of token ids; got "
                             f"{targets.dtype} of shape {targets.shape}")
    if int(targets.min()) < 0 or int(targets.max()) >= vocab_size:
        bad = int(np.flatnonzero((targets < 0) | (targets >= vocab_size))[0])
        raise ForgetkitError(f"targets must be token ids in [0, vocab_size={vocab_size}); got "
                             f"{int(targets[bad])} at token {bad}")
    n = len(targets)
    out = TopKOutputs(np.empty((0, n), topk_dtype(1, vocab_size)), vocab_size, sequence_ids,
                      positions)  # checks the columns
    refuse_duplicate_tokens(out.sequence_ids, out.positions, "sequence_ids and positions")
    table = np.empty(n, dtype=TOKEN_DTYPE)
    table["sequence"], table["position"], table["target"] = (out.sequence_ids, out.positions,
                                                             targets)
    return table


def _encoder(record, table):
    """``(epochs, crcs) -> EncodedRecord``: `record_encoder` of a top-k record (the labels,
    its targets, live in the token table); ``crcs`` are `epoch_crcs` pairs, stored as the
    epochs' checksums and, under ``"argmax"``, those of their argmax ids. Its
    ``with_meta(meta)`` encodes only new metadata again, as `record_encoder`'s does."""
    return _with_argmax(record_encoder(record, labels_crc=crc_ints(table["target"])))


def _with_argmax(encode):
    def encoded(epochs, crcs):
        return encode(epochs, [c[0] for c in crcs], {ARGMAX_KEY: [int(c[1]) for c in crcs]})

    encoded.with_meta = lambda meta: _with_argmax(encode.with_meta(meta))
    return encoded


def read_topk_record(path):
    """The sidecar record of the top-k run at ``path``, or None if ``path`` is not one."""
    if Path(path).suffix.lower() != ".npy":
        return None
    try:
        return read_topk_sidecar(sidecar_path(path))
    except CorruptFileError:
        return None  # not ours to judge: the NPY loader reports it


def is_topk(path):
    """Whether ``path`` is a top-k run (a .npy whose sidecar says so)."""
    return read_topk_record(path) is not None


def read_topk_sidecar(file):
    """The top-k record in the sidecar ``file`` (None if absent or not a top-k run's)."""
    return read_sidecar_of(file, FORMAT)


def read_tokens(path, record, *, verify=True):
    """The token table of the top-k run at ``path`` whose sidecar record is ``record``:
    ``<name>.tokens.npy`` or, while a new one is being committed, ``<name>.tokens.npy.next``
    (whichever matches the record's checksum: checked whatever ``verify`` says, as it tells
    the two apart; 16 bytes per token)."""
    want = record["tokens"].get("crc32c")
    vocab, k = record["vocab_size"], record["k"]
    n = record["n_samples"]
    seen = []
    # the pending table first: a commit renames it over the table, so that one read after
    # it is missing sees the renamed one
    for file in (pending_tokens_path(path), tokens_path(path)):
        try:
            table = np.load(file, allow_pickle=False)
        except FileNotFoundError:
            continue
        except Exception as err:
            seen.append(f"{str(file)!r} does not load ({one_line(err)})")
            continue
        if table.dtype != TOKEN_DTYPE or table.shape != (n,):
            seen.append(f"{str(file)!r} holds {table.dtype} of shape {table.shape}")
        elif table_crc(table, vocab, k) != want:  # always: it tells the two tables apart
            seen.append(f"{str(file)!r} does not match its checksum")
        else:
            return table
    detail = "; ".join(seen) or f"{str(tokens_path(path))!r} is missing"
    raise CorruptFileError(f"the token table of {str(path)!r} ({n} tokens of {TOKEN_DTYPE.descr}"
                           f"): {detail}")


def load_topk(path, *, labels=None, verify=True):
    """A top-k run (kind "topk") from ``path``, memory-mapped; ``verify`` checks the stored
    checksums (`forgetkit.load`)."""
    where = f"the sidecar {str(sidecar_path(path))!r}"
    for attempt in range(READ_ATTEMPTS):
        before = file_identity(sidecar_path(path))
        records, record, _ = open_pair(path, open_records, read_topk_sidecar)
        if record is None:
            raise ForgetkitError(f"{str(path)!r} is not a forgetkit top-k run (no {FORMAT} "
                                 "sidecar)")
        check_topk_record(record, where)
        records = epochs_of_record(path, records, record)
        try:
            table = read_tokens(path, record, verify=verify)
            break
        except CorruptFileError:
            # a writer committed another run meanwhile (its token table replaced ours):
            # read the pair again
            if attempt + 1 == READ_ATTEMPTS or file_identity(sidecar_path(path)) == before:
                raise
    return topk_run(path, records, record, table, labels, where, verify=verify)


@keyword_options(renamed={"k": "top_k"})
def to_topk(run, top_k=DEFAULT_TOP_K, path=None, *, sequence_ids=None, positions=None,
            progress=False):
    """The top-k run of a logits run (its samples taken as tokens), in memory or written.

    Parameters
    ----------
    run : Run or str or Path
        Logits of shape (n_epochs, n_tokens, vocab_size) (a Run, or a run file to load),
        read one epoch at a time; labels are the target token ids.
    top_k : int, default 8
        The largest logits kept per epoch and token, 1 <= top_k <= vocab_size (``k=``, its
        old name, still works with a FutureWarning).
    path : str or Path, optional
        ``.npy`` (with its token table and sidecar) or ``.parquet`` to write; None keeps the
        run in memory.
    sequence_ids, positions : array-like of int of shape (n_tokens,), optional
        The token table; default: each token its own sequence (its index), at position 0.
    progress : bool, default False

    Returns
    -------
    Run of kind "topk"
        Loaded from ``path`` when given. Correctness, `Run.label_probs` and
        `Run.label_margins` equal those of ``run`` (`forgetkit.kinds.topk.topk_records`).
    """
    if path is not None:
        check_path("path", path)
    check_bool("progress", progress)
    from . import load  # the package's loader, which imports this module

    if not isinstance(run, Run):
        if not isinstance(run, (str, os.PathLike)):
            raise InputTypeError(f"run must be a forgetkit.Run or the path of a run file; got "
                                 f"{type(run).__name__}")
        run = load(run)
    kind = kind_of(run)
    if not (kind.full and kind.softmax):
        raise ForgetkitError(f"to_topk needs logits (a top-k run holds the largest logits and "
                             f"the log-sum-exp); got a run of kind {run.kind!r}: "
                             f"{kind.holds}")
    n = run.n_samples
    sequence_ids = np.arange(n) if sequence_ids is None else sequence_ids
    positions = np.zeros(n, np.int32) if positions is None else positions
    table = token_table(run.labels, sequence_ids, positions, run.n_classes)
    records = np.empty((run.n_epochs, n), dtype=topk_dtype(top_k, run.n_classes))
    bar = Progress(run.n_epochs, "top-k records", enabled=progress)
    for e in range(run.n_epochs):
        _topk.topk_records(run.epoch_values(e), run.labels, top_k, out=records[e])
        bar.update()
    top = Run(TopKOutputs(records, run.n_classes, table["sequence"], table["position"]),
              run.labels, kind="topk", epochs=run.epochs, sample_ids=run.sample_ids,
              meta=run.meta)
    if path is None:
        return top
    refuse_overwrite({"the top-k run": path}, [run.source])
    save_topk(top, path)
    return load(path)


def _write_tokens(file, table):
    with atomic_write(file) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array(f, table, allow_pickle=False)


def save_topk(run, path):
    """Write the top-k ``run`` to ``path`` (.npy with its token table and sidecar, committed
    as one; or .parquet), its ids in the vocabulary's encoding (`topk_dtype`: a run read
    with uint32 ids is written with 24-bit ones); returns ``path``."""
    path = Path(path)
    kind, outputs = kind_of(run), run.outputs

    def epoch_records(e):  # (N,) records of epoch index e, verified, one epoch in memory
        return kind.read_records(run, slice(e, e + 1))[0]

    table = token_table(run.labels, outputs.sequence_ids, outputs.positions, run.n_classes)
    record = topk_record(n_tokens=run.n_samples, vocab_size=run.n_classes, k=run.top_k,
                         epochs=run.epochs, table=table, meta=run.meta)
    record["sample_ids"] = None if run.sample_ids is None else \
        [v.item() if isinstance(v, np.generic) else v for v in run.sample_ids.tolist()]
    if path.suffix.lower() == ".parquet":
        with RunLock(path), atomic_write(path) as tmp:
            write_topk_parquet(tmp, epoch_records, record, table)
        return path
    if path.suffix.lower() != ".npy":
        raise ForgetkitError(f"a top-k run is saved as .npy or .parquet; got {str(path)!r}")
    dtype = record_dtype(record)

    def write_tensor(tmp):
        crcs = []
        with open(tmp, "wb") as f:
            f.write(summary_header(run.n_epochs, run.n_samples, dtype))
            for e in range(run.n_epochs):
                epoch = convert_records(np.ascontiguousarray(epoch_records(e)), dtype)
                crcs.append(epoch_crcs(epoch))
                f.write(memoryview(epoch.reshape(-1).view(np.uint8)))
        return crcs

    with RunLock(path):
        commit_topk(path, table, write_tensor, lambda crcs: _encoder(record, table)(
            record["epochs"], crcs))
    return path


def commit_topk(path, table, write_tensor, record_for):
    """Commit a new token table, records and sidecar as one: the table goes to
    ``<name>.tokens.npy.next`` first, the records and sidecar are committed
    (`commit_pair`), then the table is renamed into place (`read_tokens` takes the pending
    table while its checksum is the sidecar's)."""
    pending = pending_tokens_path(path)
    _write_tokens(pending, table)
    commit_pair(path, write_tensor, record_for)
    os.replace(pending, tokens_path(path))
    fsync_path(Path(path).parent)


class TopKWriter(SummaryWriter):
    """Append a top-k run epoch by epoch (the `SummaryWriter` of top-k runs: same lock,
    resume, replace and durability; ``.npy`` only).

    Parameters
    ----------
    path : str or Path, ``.npy``
    vocab_size : int >= 2
    top_k : int, 1 <= top_k <= vocab_size
        The largest logits kept per checkpoint and token (``k=``, its old name, still works
        with a FutureWarning).
    targets : array-like of int of shape (n_tokens,)
        The target token id of each token (the run's labels), in [0, vocab_size).
    sequence_ids, positions : array-like of int of shape (n_tokens,)
        Each token's sequence id and the position of its target in that sequence.
    meta : dict, optional
    mode : {"a", "w", "x"}
        "a" (default) appends to an existing top-k run at ``path`` (which must have the same
        vocabulary, k and token table) or starts one; "w" starts over; "x" refuses an
        existing run.
    durable : bool, default True
        Flush every epoch to disk (fsync) before `append` returns.
    """

    @keyword_options(renamed={"k": "top_k"})
    def __init__(self, path, *, vocab_size, top_k, targets, sequence_ids, positions, meta=None,
                 mode="a", durable=True):
        self.path = self.target = Path(check_path("path", path))
        self.parquet = False  # (SummaryWriter's staging of Parquet files)
        if self.path.suffix.lower() != ".npy":
            raise ForgetkitError(f"top-k runs are written as .npy (with a sidecar and a token "
                                 f"table); got {str(self.path)!r}")
        check_option("mode", mode, ("a", "w", "x"))
        self.n_classes = check_int("vocab_size", vocab_size, minimum=2)
        self.dtype = topk_dtype(top_k, self.n_classes)  # (a resumed run's own: _existing_epochs)
        self.top_k = int(top_k)
        self.table = token_table(targets, sequence_ids, positions, self.n_classes)
        self.n_samples = len(self.table)
        self.labels = self.table["target"]
        self.sample_ids = self.class_names = None
        self.meta = check_meta(meta)
        self.epochs = []
        self.crcs = []
        self._closed = False
        self.durable = bool(durable)
        self._encoder = None
        self._lock_and_open(mode)

    def _files(self):
        return (self.path, tokens_path(self.path), pending_tokens_path(self.path))

    def _start(self):
        remove_stale_temps(tokens_path(self.path))
        remove_stale_temps(pending_tokens_path(self.path))
        _write_tokens(tokens_path(self.path), self.table)
        pending_tokens_path(self.path).unlink(missing_ok=True)

    def append(self, epoch, records, *, replace=False, meta=None):
        """Store epoch number ``epoch``: records (n_tokens,) of a `topk_dtype` of this run's k
        (stored in this run's id encoding), or
        the logits (n_tokens, vocab_size) to take them from (`topk_records`). The records
        are checked first (`forgetkit.kinds.topk.check_records`: finite, ids in the vocabulary,
        logits descending, the log-sum-exp at least the largest logit); nothing is written
        for an epoch that fails. Epoch numbers must increase; ``replace=True`` drops a
        stored epoch number and the later ones first. ``meta`` (a dict), if given, replaces
        the run's metadata."""
        super().append(epoch, records, replace=replace, meta=meta)

    def _crc(self, records):
        return epoch_crcs(records)

    def _records_of(self, epoch, values):
        where = f"the records of epoch {epoch}"
        if values.dtype.names is not None:
            if not is_topk_dtype(values.dtype):
                raise InputTypeError(f"{where} must be of a topk_dtype ({self.dtype.descr}); "
                                     f"got {values.dtype}")
            if top_k_of(values.dtype) != self.top_k:
                raise ForgetkitError(f"{where} hold k={top_k_of(values.dtype)} with "
                                     f"{ids_of(values.dtype)} ids; this run stores "
                                     f"k={self.top_k} with {ids_of(self.dtype)} ids "
                                     f"(vocab_size={self.n_classes})")
            if values.shape != (self.n_samples,):
                raise ForgetkitError(f"{where} must be {self.n_samples} records (one per token); "
                                     f"got shape {values.shape}")
            check_records(values, self.labels, self.n_classes, where=where)
            return convert_records(values, self.dtype)
        if values.ndim == 2 and values.shape[0] == self.n_samples:
            if values.shape[1] != self.n_classes:
                raise ForgetkitError(f"the logits of epoch {epoch} cover a vocabulary of "
                                     f"{values.shape[1]} ids; this run's is {self.n_classes}")
            try:
                return convert_records(_topk.topk_records(values, self.labels, self.top_k),
                                       self.dtype)
            except ForgetkitError as err:
                raise ForgetkitError(f"logits of epoch {epoch}: {err}") from None
        raise ForgetkitError(f"epoch {epoch} must be {self.n_samples} top-k records or logits "
                             f"of shape ({self.n_samples}, {self.n_classes}); got "
                             f"{values.dtype} of shape {values.shape}")

    def _record(self):
        if self._encoder is None:
            self._encoder = _encoder(topk_record(
                n_tokens=self.n_samples, vocab_size=self.n_classes, k=self.top_k, epochs=[],
                table=self.table, meta=self.meta, ids=ids_of(self.dtype)), self.table)
        return self._encoder(self.epochs, self.crcs)

    def _existing_epochs(self):
        record = read_topk_record(self.path)
        if record is None:
            raise ForgetkitError(f"{str(self.path)!r} exists but is not a forgetkit top-k run "
                                 "(a full run, a summary, or another file); use mode='w' or "
                                 "another path")
        stored, record, _ = open_pair(self.path, open_records, read_topk_sidecar)
        check_topk_record(record, f"the sidecar of {str(self.path)!r}")
        for field, mine in (("vocab_size", self.n_classes), ("k", self.top_k),
                            ("n_samples", self.n_samples)):
            if record.get(field) != mine:
                raise ForgetkitError(f"the existing top-k run at {str(self.path)!r} has "
                                     f"{field}={record.get(field)}; this writer has "
                                     f"{field}={mine} (a different vocabulary or tokenization; "
                                     "use mode='w' to start over, or another path)")
        table = read_tokens(self.path, record)
        if not np.array_equal(table, self.table):
            field = next(f for f in TOKEN_DTYPE.names if not np.array_equal(table[f],
                                                                           self.table[f]))
            i = int(np.flatnonzero(table[field] != self.table[field])[0])
            raise ForgetkitError(f"the existing top-k run at {str(self.path)!r} has another "
                                 f"token table: token {i} has {field} {table[field][i]} there "
                                 f"and {self.table[field][i]} here (a different tokenization; "
                                 "use mode='w' to start over, or another path)")
        _settle_tokens(self.path, record)
        self.dtype = record_dtype(record)  # a run written before 24-bit ids keeps its ids
        if stored.dtype != self.dtype:
            raise CorruptFileError(f"{str(self.path)!r} holds records of {stored.dtype}; its "
                                   f"sidecar names {self.dtype.descr}")
        stored = epochs_of_record(self.path, stored, record)  # as a load sees them
        n = stored.shape[0]
        verify_tensor(self.path, stored, record)
        argmax = record[CRC_KEY].get(ARGMAX_KEY) if isinstance(record.get(CRC_KEY), dict) \
            else None
        crcs = [(record[CRC_KEY]["outputs"][e], argmax[e]) if isinstance(argmax, list)
                and len(argmax) > e else epoch_crcs(stored[e]) for e in range(n)]
        return list(record["epochs"][:n]), crcs


def _settle_tokens(path, record):
    """Finish or drop a pending token table left by a killed commit: renamed into place if
    it is the one the sidecar names, else removed."""
    pending = pending_tokens_path(path)
    if not pending.exists():
        return
    try:
        ours = table_crc(np.load(pending, allow_pickle=False), record["vocab_size"],
                         record["k"]) == record["tokens"]["crc32c"]
    except Exception:
        ours = False
    if ours:
        os.replace(pending, tokens_path(path))
    else:
        pending.unlink()


def topk_bad_epochs(path, records, record, sums):
    """What verifying a top-k run adds: its token table's targets against the labels'
    checksum (CorruptFileError), and the indices of the epochs whose argmax ids (what the
    forgetting pass reads and checks alone) do not match their checksums."""
    if crc_ints(read_tokens(path, record)["target"]) != sums["labels"]:
        raise CorruptFileError(f"{str(path)!r}: the targets do not match their checksum")
    argmax = sums.get(ARGMAX_KEY)
    if not isinstance(argmax, list):
        return set()
    return {e for e in range(len(records))
            if e >= len(argmax) or argmax_crc(records[e]) != argmax[e]}
