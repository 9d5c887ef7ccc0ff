"""What a top-k run's NPY and Parquet layouts and its shard readers share: its metadata
record (fields, checks, the records' dtype it names), the checksums of its records, argmax
ids and token table, and the Run of loaded records (`topk_run`), whose epochs are verified
on their first read (`EpochChecks`). The records themselves are `forgetkit.kinds.topk`'s."""

from __future__ import annotations

import numpy as np

from ..errors import CorruptFileError, ForgetkitError
from ..kinds.topk import (
    ID_ENCODINGS,
    TOKEN_DTYPE,
    U16_VOCAB,
    TopKOutputs,
    check_records,
    id_encoding,
    token_ids,
    topk_dtype,
)
from ..run import Run
from .integrity import KEY as CRC_KEY
from .integrity import (
    bad_epochs,
    check_fields,
    crc_array,
    crc_ints,
    is_verified,
    mismatch,
    remember_verified,
    stored_checksums,
)
from .record import (
    RECORD_VERSION,
    check_record,
    needs_checksums,
    refuse_duplicate_ids,
    stored_epochs,
)

FORMAT = "forgetkit-topk"
#: The key, beside "outputs" in a top-k record's checksums, of the argmax ids' checksums.
ARGMAX_KEY = "argmax"
#: Tokens whose records are value-checked at a time when a run is loaded unverified.
CHECK_TOKENS = 1 << 20


def table_crc(table, vocab_size, k):
    """The checksum of a top-k run's token table and of its vocabulary size and k (so that
    a changed sidecar cannot make the records another vocabulary's)."""
    return crc_array(np.asarray([vocab_size, k], dtype="<i8"), crc_array(table))


def topk_record(*, n_tokens, vocab_size, k, epochs, table, meta=None, ids=None):
    """The sidecar record of a top-k run (without the epochs' checksums); ``ids``: the id
    encoding (default `forgetkit.kinds.topk.id_encoding`)."""
    return {
        "format": FORMAT,
        "version": RECORD_VERSION,
        "kind": "topk",
        "fields": list(topk_dtype(k, vocab_size).names),
        "n_samples": int(n_tokens),
        "n_classes": int(vocab_size),
        "vocab_size": int(vocab_size),
        "k": int(k),
        "ids": id_encoding(vocab_size) if ids is None else ids,
        "epochs": [int(e) for e in epochs],
        "tokens": {"crc32c": table_crc(table, vocab_size, k), "n_tokens": int(n_tokens)},
        "sample_ids": None,
        "class_names": None,
        "meta": meta,
    }


def duplicate_token(sequences, positions):
    """(sequence id, position, first index, second index) of the first token that appears
    twice in the columns ``sequences`` and ``positions`` (N,), or None. Tokens in sequence
    order (positions increasing within each sequence) are checked in one pass, others
    sorted."""
    seq, pos = np.asarray(sequences, dtype=np.int64), np.asarray(positions, dtype=np.int64)
    if len(seq) < 2:
        return None
    ordered = (seq[1:] > seq[:-1]) | ((seq[1:] == seq[:-1]) & (pos[1:] > pos[:-1]))
    if ordered.all():
        return None
    order = np.lexsort((pos, seq))
    same = np.flatnonzero((seq[order][1:] == seq[order][:-1])
                          & (pos[order][1:] == pos[order][:-1]))
    if not same.size:
        return None
    first, second = sorted((int(order[same[0]]), int(order[same[0] + 1])))
    return int(seq[first]), int(pos[first]), first, second


def refuse_duplicate_tokens(sequences, positions, where, error=ForgetkitError):
    """``error`` (naming ``where``) if a token (sequence id, position) appears twice."""
    dup = duplicate_token(sequences, positions)
    if dup is not None:
        raise error(f"{where}: token (sequence {dup[0]}, position {dup[1]}) appears twice "
                    f"(tokens {dup[2]} and {dup[3]}); each token must appear once")


def argmax_crc(records):
    """The CRC32C of one epoch's argmax ids (`forgetkit.kinds.topk.token_ids` (records, 0)) as
    little-endian int32 (what the forgetting pass reads; the same for every id encoding)."""
    return crc_array(np.ascontiguousarray(token_ids(records, 0), dtype="<i4"))


def epoch_crcs(records):
    """(CRC32C of one epoch's records, of its argmax ids)."""
    return crc_array(records), argmax_crc(records)


def check_topk_record(record, where):
    """The fields of a top-k record, type-checked: (n_tokens, vocab_size, k)."""
    if record.get("kind") != "topk" or "labels" in record:
        raise CorruptFileError(f'{where}: a top-k run\'s record has "kind": "topk" and no '
                               "labels (they are its token table's targets); got kind="
                               f"{record.get('kind')!r}" + (" and labels" if "labels" in record
                                                            else ""))
    check_record({k: v for k, v in record.items() if k not in ("kind", "labels")}, where)
    for name in ("n_samples", "vocab_size", "k", "epochs", "tokens"):
        if record.get(name) is None:
            raise CorruptFileError(f"{where} lacks the field {name!r}")
    n, vocab, k = record["n_samples"], record["vocab_size"], record["k"]
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (vocab, k)) \
        and 1 <= k <= vocab and vocab >= 2 and record.get("n_classes", vocab) == vocab \
        and isinstance(record["tokens"], dict)
    if not ok:
        raise CorruptFileError(f"{where}: fields 'vocab_size', 'k' and 'tokens' must be a "
                               f"vocabulary >= 2, 1 <= k <= vocab_size and the token table's "
                               f"checksum; got vocab_size={vocab!r}, k={k!r}")
    try:
        record_dtype(record)
    except ForgetkitError:
        raise CorruptFileError(f"{where}: field 'ids' must be an id encoding ("
                               f"{', '.join(ID_ENCODINGS)}) that holds vocab_size={vocab} "
                               f"ids; got {record.get('ids')!r}") from None
    return n, vocab, k


def record_dtype(record):
    """The records' dtype that a top-k run's (checked) sidecar record names: its ``ids``
    encoding, or for runs written before it was recorded uint16 ids up to 65,536 ids, else
    uint32."""
    vocab = record["vocab_size"]
    ids = record.get("ids", "uint16" if vocab <= U16_VOCAB else "uint32")
    if not isinstance(ids, str):
        raise ForgetkitError(f"not an id encoding: {ids!r}")
    return topk_dtype(record["k"], vocab, ids=ids)


def topk_run(path, records, record, table, labels, where, *, verify=True, verified=False):
    """The top-k Run of ``records`` (E, N), their sidecar ``record`` (``where`` names it)
    and token ``table``; ``labels`` override the targets. With ``verify`` and checksums,
    each epoch is checked against its checksum on its first full read (`EpochChecks`; its
    values were checked when written); otherwise the values are checked here.
    ``verified``: the caller verified every epoch already."""
    n, vocab, k = check_topk_record(record, where)
    dtype = record_dtype(record)
    epochs = stored_epochs(path, records, dtype, n, record, "top-k")
    checks, sums = None, None
    if verify:
        sums = stored_checksums(record, where)
        if sums is None and needs_checksums(record):
            raise CorruptFileError(f"{where} lacks its checksums (field {CRC_KEY!r})")
    if sums is not None:
        check_fields(record, sums, path)
        if crc_ints(table["target"]) != sums["labels"]:
            raise CorruptFileError(f"{str(path)!r}: the targets do not match their checksum")
        if len(sums["outputs"]) < len(records):
            raise CorruptFileError(f"{where} has checksums of {len(sums['outputs'])} epochs; "
                                   f"the file holds {len(records)}")
        if not (verified or is_verified(path)):
            argmax = sums.get(ARGMAX_KEY)
            ok = isinstance(argmax, list) and len(argmax) >= len(records) and all(
                isinstance(c, int) and not isinstance(c, bool) for c in argmax)
            checks = EpochChecks(path, sums["outputs"][: len(records)], epochs,
                                 argmax[: len(records)] if ok else None)
    else:
        for start in range(0, n, CHECK_TOKENS):
            part = slice(start, start + CHECK_TOKENS)
            try:
                check_records(records[:, part], table["target"][part], vocab)
            except ForgetkitError as err:
                raise CorruptFileError(f"{str(path)!r}: {err}") from None
    refuse_duplicate_tokens(table["sequence"], table["position"], repr(str(path)),
                            CorruptFileError)
    refuse_duplicate_ids(record.get("sample_ids"), path)
    try:
        return Run(TopKOutputs(records, vocab, table["sequence"], table["position"],
                               checks=checks),
                   table["target"] if labels is None else labels, kind="topk", epochs=epochs,
                   sample_ids=record.get("sample_ids"), meta=record.get("meta"), source=path)
    except ForgetkitError as err:
        raise type(err)(f"{str(path)!r}: {err}") from None


class EpochChecks:
    """The stored epochs of a memory-mapped top-k run not yet verified against their
    checksums: each is verified on its first full read (`all`, in threads: every read but
    the forgetting pass's), and the argmax ids that the forgetting pass reads alone
    against their own checksums (`check_argmax`). A
    mismatch is the CorruptFileError naming the file and the epoch; once every epoch holds,
    the file counts as verified in this process (`forgetkit.io.integrity.is_verified`)."""

    def __init__(self, path, crcs, epochs, argmax=None):
        self.path, self.crcs, self.epochs = path, list(crcs), list(epochs)
        self.argmax = None if argmax is None else list(argmax)
        self.done = [False] * len(self.crcs)
        self.argmax_done = [False] * len(self.crcs)

    def check_argmax(self, records, e, ids):
        """Verify the argmax ids ``ids`` (int32 (N,), read from epoch index ``e`` of
        ``records``) against their checksum, or the whole epoch where the file has none
        (thread-safe: each epoch is one thread's)."""
        if self.done[e] or self.argmax_done[e]:
            return
        if self.argmax is None:
            self.check(records, e)
        elif crc_array(np.asarray(ids, dtype="<i4")) != self.argmax[e]:
            raise mismatch(self.path, self.epochs[e], e)
        self.argmax_done[e] = True

    def check(self, records, e):
        """Verify epoch index ``e`` of ``records`` (E, N) unless it was (thread-safe: each
        epoch is one thread's)."""
        if not self.done[e]:
            if crc_array(records[e]) != self.crcs[e]:
                raise mismatch(self.path, self.epochs[e], e)
            self.done[e] = True

    def all(self, records):
        """Verify every epoch of ``records`` not yet verified."""
        todo = [e for e, done in enumerate(self.done) if not done]
        bad = bad_epochs([records[e] for e in todo], [self.crcs[e] for e in todo])
        if bad:
            e = todo[bad[0]]
            raise mismatch(self.path, self.epochs[e], e)
        for e in todo:
            self.done[e] = True
        self.complete()

    def complete(self):
        """Whether every epoch was verified (the file then counts as verified)."""
        if all(self.done):
            remember_verified(self.path)
            return True
        return False


def check_shard_record(record, name):
    """The record of the top-k shard ``name``, checked (CorruptFileError naming it):
    (n_tokens, vocab_size, the records' dtype)."""
    try:
        n, vocab, _ = check_topk_record(record, f"the record of shard {name!r}")
        return n, vocab, record_dtype(record)
    except ForgetkitError as err:
        raise CorruptFileError(str(err)) from None


def check_shard_table(record, table, shape, name, *, verify=True):
    """Refuse a top-k shard whose token ``table`` or records' ``shape`` (E, n) disagree
    with its ``record`` (the table's checksum checked when verifying)."""
    n = record["n_samples"]
    if table.dtype != TOKEN_DTYPE or table.shape != (n,) or shape[1] != n or shape[0] < 1 \
            or (verify and table_crc(table, record["vocab_size"], record["k"])
                != record["tokens"].get("crc32c")):
        raise CorruptFileError(f"shard {name!r}: its token table does not match its record "
                               "(the file is corrupt, or another run's)")
