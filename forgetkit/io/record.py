"""The JSON metadata record of a run (everything but the outputs), sidecar files, and the
pieces every loader shares."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np

from .._validation import KINDS, duplicate_id
from ..errors import CorruptFileError, ForgetkitError, MissingFileError
from ..run import Run
from .integrity import KEY as CRC_KEY
from .integrity import METADATA_VERSION, RECORD_KEY, checksums, crc_ints, crc_record

SIDECAR_SUFFIX = ".forgetkit.json"
FLOAT_NAMES = ("float16", "float32", "float64")
#: A metadata record is labels and ids, a few bytes per sample; more than this is not one.
MAX_RECORD_BYTES = 1 << 30
INT64_LIMIT = 1 << 63


def format_of(path):
    """The format of ``path`` from its extension (or a Dataset Cartography folder): what
    `RunWriter` appends to (loading, saving and verifying ask `forgetkit.io.registry`)."""
    path = Path(path)
    if path.is_dir() and glob.glob(str(path / "dynamics_epoch_*.jsonl")):
        return "cartography"
    suffix = path.suffix.lower()
    if suffix in (".npz", ".npy", ".parquet"):
        return suffix[1:]
    raise ForgetkitError(
        f"cannot tell the format of {str(path)!r}: expected a .npz, .npy or .parquet file "
        "or a Dataset Cartography folder (dynamics_epoch_*.jsonl)"
    )


def jsonable(values):
    """A list of plain Python values of an array-like, or None."""
    if values is None:
        return None
    return [v.item() if isinstance(v, np.generic) else v for v in np.asarray(values).tolist()]


#: The record version of runs whose checksums cover their metadata too
#: (`forgetkit.io.integrity.crc_record`). Version 2 records carry checksums of the values,
#: labels and epoch numbers only (their other metadata loads unverified); version 1 records
#: (written before checksums existed) load unverified.
RECORD_VERSION = METADATA_VERSION
#: The first record version written with checksums.
CHECKSUMS_VERSION = 2

#: The fields of metadata records (full runs, summaries, top-k runs, Parquet schemas): any
#: other is a corrupt record (a renamed key), never a default.
KNOWN_FIELDS = frozenset((
    "format", "version", "kind", "dtype", "n_samples", "n_classes", "epochs", "labels",
    "sample_ids", "class_names", "meta", CRC_KEY, "layout", "fields", "vocab_size", "k",
    "ids", "tokens"))
#: The record formats forgetkit writes.
RECORD_FORMATS = ("forgetkit-run", "forgetkit-summary", "forgetkit-topk")


def needs_checksums(record):
    """Whether ``record`` says it was written with checksums (version >= 2), so that their
    absence means a corrupt record."""
    version = record.get("version")
    return isinstance(version, int) and not isinstance(version, bool) \
        and version >= CHECKSUMS_VERSION


def run_record(*, kind, dtype, n_samples, n_classes, epochs, labels, sample_ids=None,
               class_names=None, meta=None):
    """The JSON metadata record of a run (without checksums: `with_checksums` adds them)."""
    return {"format": "forgetkit-run", "version": RECORD_VERSION, "kind": kind,
            "dtype": np.dtype(dtype).name,
            **identity_fields(n_samples=n_samples, n_classes=n_classes, epochs=epochs,
                              labels=labels, sample_ids=sample_ids, class_names=class_names,
                              meta=meta)}


def identity_fields(*, n_samples, n_classes, epochs, labels, sample_ids, class_names, meta):
    """The fields every kind's record holds, in their stored order: sizes, epoch numbers,
    labels, sample ids, class names and the free metadata."""
    return {"n_samples": int(n_samples), "n_classes": int(n_classes),
            "epochs": [int(e) for e in epochs], "labels": [int(v) for v in labels],
            "sample_ids": jsonable(sample_ids), "class_names": class_names, "meta": meta}


def stored_epochs(path, records, dtype, n_samples, record, what):
    """The epoch numbers of ``records`` stored at ``path`` (``what``: "summary", "top-k"):
    an (epochs, ``n_samples``) array of ``dtype`` holding at least one epoch and no more
    than ``record`` names; else a CorruptFileError."""
    if records.dtype != dtype or records.ndim != 2 or records.shape[1] != n_samples:
        raise CorruptFileError(f"{str(path)!r} must hold {what} records of shape (epochs, "
                               f"{n_samples}) and dtype {dtype.descr}; got {records.dtype} of "
                               f"shape {records.shape}")
    epochs = record["epochs"][: records.shape[0]]
    if records.shape[0] == 0 or len(epochs) != records.shape[0]:
        raise CorruptFileError(f"{str(path)!r} holds {records.shape[0]} epochs and its metadata "
                               f"names {len(record['epochs'])}; a {what} run needs at least "
                               "one epoch")
    return epochs


class EncodedRecord(dict):
    """A metadata record (a dict) that carries its JSON text, ``json_text`` (what
    ``json.dumps(record)`` gives), made by `record_encoder`."""

    __slots__ = ("json_text",)


def with_checksums(record, epoch_crcs):
    """``record`` with the checksums (`forgetkit.io.integrity.checksums`) of its labels,
    epoch numbers, other fields and the stored epochs' values ``epoch_crcs``."""
    return dict(record, **{CRC_KEY: checksums(record["labels"], record["epochs"], epoch_crcs,
                                              record)})


def record_encoder(record, *, labels_crc=None):
    """A function ``(epochs, epoch_crcs, more=None) -> EncodedRecord``: ``record`` with
    those epoch numbers and checksums of the stored epochs (`with_checksums`; ``more``: a
    dict of further checksum lists), its JSON text joined from
    the encodings of the other fields, made once here. A writer's labels, ids, class names
    and metadata do not change between epochs: encoding them once keeps the per-epoch
    sidecar write off the GIL-holding JSON encoder (and the list of labels off the heap).
    ``labels_crc``: the labels' checksum, for a record that keeps its labels elsewhere (a
    top-k run's token table). The function's ``with_meta(meta)`` is the encoder of the
    record with that metadata (the other fields' encodings kept)."""
    keys = list(record)
    at = keys.index("epochs")
    # each field's JSON on its own: '"key": value', as json.dumps writes it inside a dict
    parts = {k: json.dumps({k: record[k]})[1:-1] for k in keys if k != "epochs"}
    labels_crc = crc_ints(record["labels"]) if labels_crc is None else int(labels_crc)
    return _encoder(dict(record), keys, at, parts, labels_crc)


def _encoder(fixed, keys, at, parts, labels_crc):
    fixed_crc = crc_record(fixed)  # the fields that do not change between epochs
    head = ", ".join(parts[k] for k in keys[:at])
    tail = ", ".join(parts[k] for k in keys[at + 1:])

    def encoded(epochs, epoch_crcs, more=None):
        epochs = [int(e) for e in epochs]
        out = EncodedRecord(fixed)
        out["epochs"] = epochs
        out[CRC_KEY] = {"outputs": [int(c) for c in epoch_crcs], "labels": labels_crc,
                        "epochs": crc_ints(epochs), RECORD_KEY: fixed_crc, **(more or {})}
        body = f'"epochs": {json.dumps(epochs)}, "{CRC_KEY}": {json.dumps(out[CRC_KEY])}'
        out.json_text = "{" + ", ".join(p for p in (head, body, tail) if p) + "}"
        return out

    def with_meta(meta):
        """The encoder of the record with ``meta`` as its metadata: only that field is
        encoded again (a replay's metadata changes with every epoch, its labels never)."""
        return _encoder({**fixed, "meta": meta}, keys, at,
                        {**parts, "meta": json.dumps({"meta": meta})[1:-1]}, labels_crc)

    encoded.with_meta = with_meta
    return encoded


def record_of(run):
    """`run_record` of a Run."""
    return run_record(kind=run.kind, dtype=run.outputs.dtype, n_samples=run.n_samples,
                      n_classes=run.n_classes, epochs=run.epochs, labels=run.labels,
                      sample_ids=run.sample_ids, class_names=run.class_names, meta=run.meta)


#: The token table of a top-k run ``<name>.npy``: ``<name>.tokens.npy``.
TOKENS_SUFFIX = ".tokens.npy"


def tokens_path(path):
    """``<name>.tokens.npy`` beside ``<name>.npy``: the token table."""
    path = Path(path)
    return path.with_name(path.name[: -len(path.suffix)] + TOKENS_SUFFIX)


def pending_tokens_path(path):
    """The token table being committed beside ``<name>.npy``: ``<name>.tokens.npy.next``."""
    tokens = tokens_path(path)
    return tokens.with_name(tokens.name + ".next")


def sidecar_path(path):
    """``<name>.forgetkit.json`` beside ``<name>.npy``."""
    path = Path(path)
    return path.with_name(path.name[: -len(path.suffix)] + SIDECAR_SUFFIX)


def one_line(err):
    """The text of an exception (another library's, whose messages may span lines) on one
    line."""
    return " ".join(str(err).split())


def corrupt(path, err):
    """The error for a file that cannot be decoded."""
    return CorruptFileError(f"cannot read {str(path)!r}: the file is truncated or corrupt "
                            f"({one_line(err)})")


def _is_int(value):
    """An int (not a bool) that fits int64."""
    return isinstance(value, int) and not isinstance(value, bool) and \
        -INT64_LIMIT <= value < INT64_LIMIT


def _is_int_list(value):
    return isinstance(value, list) and all(_is_int(x) for x in value)


def _check_field(record, name, ok, expected, where):
    if name in record and record[name] is not None and not ok(record[name]):
        shown = repr(record[name])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise CorruptFileError(f"{where}: field {name!r} must be {expected}; got {shown}")


def check_record(record, where):
    """Check the types of a run's metadata record (as `run_record` writes it, or a subset of
    it); ``where`` names the file in messages. Returns the record."""
    if not isinstance(record, dict):
        raise CorruptFileError(f"{where} must hold a JSON object; got {type(record).__name__}")
    unknown = sorted(set(record) - KNOWN_FIELDS)
    if unknown:
        raise CorruptFileError(f"{where} holds the unknown field {unknown[0]!r}: the metadata "
                               f"is corrupt (fields: {', '.join(sorted(KNOWN_FIELDS))})")
    for name, ok, expected in (
        ("format", lambda v: v in RECORD_FORMATS, f"one of {', '.join(RECORD_FORMATS)}"),
        ("version", lambda v: _is_int(v) and 1 <= v <= RECORD_VERSION,
         f"an integer from 1 to {RECORD_VERSION}"),
        ("kind", lambda v: v in KINDS, f"one of {', '.join(KINDS)}"),
        ("dtype", lambda v: v in FLOAT_NAMES, f"one of {', '.join(FLOAT_NAMES)}"),
        ("n_samples", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
        ("n_classes", lambda v: _is_int(v) and v >= 2, "an integer >= 2"),
        ("epochs", _is_int_list, "a list of integers"),
        ("labels", _is_int_list, "a list of integers"),
        ("sample_ids", lambda v: isinstance(v, list) and all(
            isinstance(x, (str, int, float)) for x in v), "a list of ids (strings or numbers)"),
        ("class_names", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
         "a list of strings"),
        ("meta", lambda v: isinstance(v, dict), "a JSON object"),
    ):
        _check_field(record, name, ok, expected, where)
    return record


def read_record(path, what="metadata file"):
    """The metadata record in the JSON file ``path``, checked (`check_record`)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise CorruptFileError(f"the {what} {str(path)!r} is larger than "
                                   f"{MAX_RECORD_BYTES} bytes: not a forgetkit record")
        return check_record(parse_record(path.read_bytes(), f"the {what} {str(path)!r}"),
                            f"the {what} {str(path)!r}")
    except FileNotFoundError:
        raise MissingFileError(f"no such {what}: {str(path)!r}") from None


def parse_record(data, where):
    """JSON bytes or text as a Python value; CorruptFileError naming ``where`` if they are not
    UTF-8 JSON."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        detail = "nested too deeply" if isinstance(err, RecursionError) else err
        raise CorruptFileError(f"{where} is not valid JSON ({detail})") from None


def load_labels_file(path, what="labels"):
    """Labels (or other integers: ``what`` names them) from a .npy file or a text file of
    integers."""
    path = Path(path)
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except FileNotFoundError:
        raise MissingFileError(f"no such {what} file: {str(path)!r}") from None
    except Exception as err:
        raise ForgetkitError(f"cannot read {what} from {str(path)!r}: {err}") from None


def refuse_duplicate_ids(sample_ids, source):
    """CorruptFileError naming ``source`` if the stored ``sample_ids`` repeat an id."""
    dup = duplicate_id(sample_ids) if sample_ids is not None else None
    if dup is not None:
        raise CorruptFileError(f"{str(source)!r}: sample id {dup[0]!r} appears twice (samples "
                               f"{dup[1]} and {dup[2]}); sample ids must be unique")


def make_run(outputs, record, labels, kind, *, source):
    """A Run of loaded outputs and their metadata record; ``labels``/``kind`` override.
    ``source`` is the file the run comes from: it becomes ``run.source`` and errors name it.
    """
    if labels is None:
        labels = record.get("labels")
    if labels is None:
        raise ForgetkitError(f"{str(source)!r} stores no labels: pass labels= (an array or a "
                             ".npy file; --labels on the command line)")
    refuse_duplicate_ids(record.get("sample_ids"), source)
    n_epochs = outputs.shape[0] if outputs.ndim == 3 else None
    epochs = record.get("epochs")
    if epochs is not None and n_epochs is not None:
        epochs = np.asarray(epochs[:n_epochs], dtype=np.int64)
        if len(epochs) != n_epochs:
            epochs = None if len(epochs) == 0 else epochs
    try:
        return Run(
            outputs,
            labels,
            kind=kind or record.get("kind", "logits"),
            epochs=epochs,
            sample_ids=record.get("sample_ids"),
            class_names=record.get("class_names"),
            meta=record.get("meta"),
            source=source,
        )
    except ForgetkitError as err:
        if str(source) in str(err):
            raise
        raise type(err)(f"{str(source)!r}: {err}") from None


def read_sidecar_of(file, fmt):
    """The record of format ``fmt`` (a summary's, a top-k run's) in the sidecar ``file``
    (None if absent or of another format)."""
    try:
        record = json.loads(file.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise CorruptFileError(f"the sidecar {str(file)!r} is not valid JSON") from None
    return record if isinstance(record, dict) and record.get("format") == fmt else None
