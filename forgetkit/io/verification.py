"""`forgetkit.verify`: check every stored epoch of a run against its checksums."""

from __future__ import annotations

from pathlib import Path

from ..errors import CorruptFileError, MissingFileError
from .integrity import bad_epochs, check_fields, crc_ints, stored_checksums
from .npy import open_memmap, open_records, read_sidecar
from .npz import load_npz
from .pair import open_pair
from .parquet import open_parquet_run, staging_path
from .record import format_of
from .summary import is_summary, read_summary_sidecar, staged_summary
from .summary_parquet import is_summary_parquet, load_summary_parquet
from .topk import is_topk, read_tokens, read_topk_sidecar
from .topk_parquet import is_topk_parquet, load_topk_parquet
from .topk_record import ARGMAX_KEY, argmax_crc


def verify_run(path):
    """See `forgetkit.io.verify`."""
    path = Path(path)
    fmt = format_of(path)
    if not path.exists() and not (fmt == "parquet" and staging_path(path).is_dir()):
        raise MissingFileError(f"no such run: {str(path)!r}")
    result = {"path": str(path), "verifiable": False, "epochs": 0, "bad": []}
    if fmt == "parquet" and not path.exists() and staged_summary(path).exists():
        path, fmt = staged_summary(path), "npy"  # a SummaryWriter's staged epochs
    if fmt == "npy":
        summary, topk = is_summary(path), is_topk(path)
        tensor, record, _ = open_pair(
            path, open_records if summary or topk else open_memmap,
            read_topk_sidecar if topk else read_summary_sidecar if summary else read_sidecar)
        record = record or {}
        sums = stored_checksums(record, f"the sidecar of {str(path)!r}")
        if sums is None:
            return result
        check_fields(record, sums, path)
        if topk:  # the token table: its own checksum, and its targets the labels'
            table = read_tokens(path, record)
            if crc_ints(table["target"]) != sums["labels"]:
                raise CorruptFileError(f"{str(path)!r}: the targets do not match their "
                                       "checksum")
        if len(sums["outputs"]) < len(tensor):
            raise CorruptFileError(f"the sidecar of {str(path)!r} has checksums of "
                                   f"{len(sums['outputs'])} epochs; the file holds "
                                   f"{len(tensor)}")
        epochs = record.get("epochs") or []
        bad = bad_epochs(tensor, sums["outputs"][: len(tensor)])
        argmax = sums.get(ARGMAX_KEY) if topk else None
        if isinstance(argmax, list):  # what the forgetting pass checks alone
            bad = sorted(set(bad) | {e for e in range(len(tensor)) if e >= len(argmax)
                                     or argmax_crc(tensor[e]) != argmax[e]})
        result.update(verifiable=True, epochs=len(tensor), bad=[int(epochs[e]) for e in bad])
    elif fmt == "parquet" and (is_summary_parquet(path) or is_topk_parquet(path)):
        # every epoch checked as read
        run = (load_summary_parquet if is_summary_parquet(path) else load_topk_parquet)(path)
        result.update(verifiable=True, epochs=run.n_epochs)
    elif fmt == "parquet":
        source = open_parquet_run(path, staging_path(path))
        if all(c is None for c in source.crcs):
            return result
        bad = []
        for i, e in enumerate(source.epochs):
            try:
                source.read_epoch(i)
            except CorruptFileError:
                bad.append(int(e))
        result.update(verifiable=True, epochs=len(source.epochs), bad=bad)
    elif fmt == "npz":  # every member's zip CRC-32 is checked as it is read
        run = load_npz(path)
        result.update(verifiable=True, epochs=run.n_epochs)
    return result
