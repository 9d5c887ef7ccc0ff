"""NPZ runs: ``logits`` or ``probs`` (E, N, C) + ``labels`` (N,), optional ``epochs``,
``sample_ids``, ``class_names`` and ``meta`` (a JSON string)."""

from __future__ import annotations

import json
import zipfile

import numpy as np

from ..errors import CorruptFileError, ForgetkitError
from .integrity import KEY as CRC_KEY
from .integrity import RECORD_KEY, crc_ints, crc_of_ints, crc_record
from .record import RECORD_VERSION, corrupt, jsonable, make_run, parse_record

#: The member that lists an NPZ run's members and checksums its metadata (labels, epoch
#: numbers, kind, sizes, sample ids, class names, meta); the zip's CRC-32 covers each
#: member's bytes, not its name.
RECORD_MEMBER = "forgetkit"
#: The members of an NPZ run; any other is a corrupt (or foreign) archive.
MEMBERS = frozenset(("logits", "probs", "labels", "epochs", "sample_ids", "class_names",
                     "meta", RECORD_MEMBER))

#: The first bytes of a zip archive (an NPZ file), with members or empty.
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
#: A member that expands more than this many times (model outputs compress about 1.1x) and
#: to more than IMPLAUSIBLE_MIN_BYTES is refused before it is decompressed: a zip bomb.
IMPLAUSIBLE_RATIO = 100
IMPLAUSIBLE_MIN_BYTES = 64 << 20


def available_memory():
    """Bytes of memory available to this process now (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _check_expansion(path, infos):
    """Refuse members whose declared expansion is implausible or does not fit in memory,
    from the zip's directory alone (nothing is decompressed)."""
    total = packed = 0
    for info in infos:
        total += info.file_size
        packed += info.compress_size
        ratio = info.file_size / max(info.compress_size, 1)
        if ratio > IMPLAUSIBLE_RATIO and info.file_size > IMPLAUSIBLE_MIN_BYTES:
            raise CorruptFileError(
                f"cannot read {str(path)!r}: the member {info.filename!r} would expand "
                f"{ratio:.0f}x, from {info.compress_size} to {info.file_size} bytes; model "
                "outputs never compress so well (refused before decompressing)")
    ratio = total / max(packed, 1)  # members each under the limit may not add up past it
    if ratio > IMPLAUSIBLE_RATIO and total > IMPLAUSIBLE_MIN_BYTES:
        raise CorruptFileError(
            f"cannot read {str(path)!r}: its members would expand {ratio:.0f}x, from {packed} "
            f"to {total} bytes; model outputs never compress so well (refused before "
            "decompressing)")
    available = available_memory()
    if available is not None and total > available:
        raise CorruptFileError(
            f"cannot read {str(path)!r}: its members expand to {total} bytes, more than the "
            f"{available} bytes of memory available; store large runs as .npy or .parquet, "
            "which load lazily")


def _check_members(path):
    """Refuse an archive whose .npy members claim more (or less) data than they hold, before
    numpy allocates arrays of the claimed shapes."""
    with zipfile.ZipFile(path) as zf:
        _check_expansion(path, zf.infolist())
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(f)
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                held = info.file_size - f.tell()
            if claimed != held:
                raise CorruptFileError(
                    f"cannot read {str(path)!r}: the array {info.filename!r} claims shape "
                    f"{shape} of {dtype} ({claimed} bytes) but holds {held} bytes")


def _int_array(value, name, path):
    """A stored array of integers as a list of int, or CorruptFileError naming it."""
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise CorruptFileError(f"{str(path)!r}: {name!r} must be a 1-D array of integers; got "
                               f"shape {arr.shape} of {arr.dtype}")
    return arr.tolist()


def metadata_record(kind, dtype, shape, sample_ids, class_names, meta):
    """The metadata an NPZ run's RECORD_MEMBER checksums (`crc_record`), as a dict."""
    return {"kind": kind, "dtype": np.dtype(dtype).name, "shape": [int(n) for n in shape],
            "sample_ids": jsonable(sample_ids), "class_names": class_names, "meta": meta}


def _check_record_member(path, stored, files, record, outputs, key):
    """Refuse an NPZ run whose members, labels, epoch numbers or metadata differ from what
    its RECORD_MEMBER ``stored`` (JSON text) lists and checksums."""
    where = f"the member {RECORD_MEMBER!r} of {str(path)!r}"
    info = parse_record(stored, where)
    sums = info.get(CRC_KEY) if isinstance(info, dict) else None
    if not isinstance(sums, dict) or not isinstance(info.get("members"), list):
        raise CorruptFileError(f"{where} must list the members and their checksums")
    if sorted(files) != sorted(info["members"]):
        missing = sorted(set(info["members"]) - set(files))
        raise CorruptFileError(f"{str(path)!r} lacks the member {missing[0]!r} that its "
                               f"metadata lists: the file is corrupt" if missing else
                               f"{str(path)!r} holds members its metadata does not list: "
                               f"{sorted(set(files) - set(info['members']))}")
    meta = metadata_record(key, outputs.dtype, outputs.shape, record.get("sample_ids"),
                           record.get("class_names"), record.get("meta"))
    for name, got in (("labels", crc_of_ints(record["labels"])),
                      ("epochs", crc_of_ints(record["epochs"])), (RECORD_KEY, crc_record(meta))):
        if sums.get(name) != got:
            part = "the metadata (kind, shape, sample ids, class names, meta)" \
                if name == RECORD_KEY else f"the {name}"
            raise CorruptFileError(f"{str(path)!r}: {part} does not match its checksum: the "
                                   "metadata is corrupt")


def load_npz(path, *, labels=None, kind=None, verify=True):
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC[0]))
    if head not in ZIP_MAGIC:
        raise CorruptFileError(f"{str(path)!r} is not an NPZ file (a zip archive of .npy "
                               f"arrays): it starts with {head!r}")
    try:
        _check_members(path)
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files)
            unknown = sorted(files - MEMBERS)
            if unknown:
                raise CorruptFileError(
                    f"{str(path)!r} holds the unknown member {unknown[0]!r}: the file is "
                    f"corrupt (an NPZ run's members: {', '.join(sorted(MEMBERS))})")
            key = "logits" if "logits" in files else "probs" if "probs" in files else None
            if key is None:
                raise ForgetkitError(
                    f"{str(path)!r} holds neither 'logits' nor 'probs'; keys: {sorted(files)}"
                )
            outputs = z[key]
            record = {"kind": key}
            if "labels" in files:
                record["labels"] = z["labels"]
            for name in ("epochs", "sample_ids", "class_names"):
                if name in files:
                    record[name] = z[name]
            if "meta" in files:
                text = str(z["meta"])
                try:
                    record["meta"] = json.loads(text) if text else {}
                except (json.JSONDecodeError, RecursionError):
                    record["meta"] = {"text": text}
            stored = str(z[RECORD_MEMBER]) if RECORD_MEMBER in files else None
    except ForgetkitError:
        raise
    except Exception as err:
        raise corrupt(path, err) from None
    if record.get("class_names") is not None:
        names = np.asarray(record["class_names"])
        if names.ndim != 1:
            raise CorruptFileError(f"{str(path)!r}: 'class_names' must be a 1-D array; got "
                                   f"shape {names.shape}")
        record["class_names"] = [str(c) for c in names]
    if record.get("epochs") is not None:
        record["epochs"] = _int_array(record["epochs"], "epochs", path)
    if stored is not None and verify:
        if record.get("labels") is None or record.get("epochs") is None:
            raise CorruptFileError(f"{str(path)!r} lacks its labels or epoch numbers, which "
                                   "its metadata checksums: the file is corrupt")
        _check_record_member(path, stored, files, record, outputs, key)
    return make_run(outputs, record, labels, kind, source=path)


def write_npz(path, run, *, compress=True):
    """Write ``run`` to the file ``path`` (already a temporary path) as NPZ."""
    if run.checked_per_read:  # check every epoch before writing (a streamed run)
        for e in range(run.n_epochs):
            run.epoch_values(e)
    arrays = {run.kind: np.asarray(run.outputs), "labels": run.labels,
              "epochs": run.epochs, "meta": np.array(json.dumps(run.meta))}
    if run.sample_ids is not None:
        arrays["sample_ids"] = np.asarray(run.sample_ids).astype(str) \
            if np.asarray(run.sample_ids).dtype == object else run.sample_ids
    if run.class_names is not None:
        arrays["class_names"] = np.array(run.class_names)
    meta = metadata_record(run.kind, arrays[run.kind].dtype, arrays[run.kind].shape,
                           arrays.get("sample_ids"), run.class_names, run.meta)
    arrays[RECORD_MEMBER] = np.array(json.dumps({
        "format": "forgetkit-run", "version": RECORD_VERSION,
        "members": sorted([*arrays, RECORD_MEMBER]),
        CRC_KEY: {"labels": crc_ints(run.labels), "epochs": crc_ints(run.epochs),
                  RECORD_KEY: crc_record(meta)}}))
    with open(path, "wb") as f:
        (np.savez_compressed if compress else np.savez)(f, **arrays)
