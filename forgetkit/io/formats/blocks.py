"""What the shard readers of every format share: the errors naming a shard, and the check
of a block of outputs read on a worker."""

from __future__ import annotations

import numpy as np

from ...errors import CorruptFileError, ForgetkitError, MissingFileError
from ..integrity import KEY as CRC_KEY
from ..integrity import check_fields, crc_array, stored_checksums
from ..record import check_record, one_line


def corrupt_shard(name, err):
    """The error for a shard file that cannot be decoded."""
    return CorruptFileError(f"cannot read shard {name!r}: the file is truncated or corrupt "
                            f"({one_line(err)})")


def missing_shard(name):
    """The error for a shard file gone since its run was loaded."""
    return MissingFileError(f"shard {name!r} is missing (it was there when the run was "
                            "loaded)")


def check_block(out, name, start, crcs=None, whole=False):
    """On the worker: refuse NaN or inf in the block ``out`` (E, n, C) of samples from
    ``start`` on, and (a block holding whole epochs) epochs that do not match the stored
    checksums ``crcs``, naming the shard and the epoch."""
    for e in range(len(out)):
        if whole and crcs is not None and e < len(crcs) and crc_array(out[e]) != crcs[e]:
            raise CorruptFileError(f"shard {name!r}: epoch index {e} does not match its "
                                   "checksum: the file is corrupt")
        if not np.isfinite(out[e]).all():
            bad = int(np.flatnonzero(~np.isfinite(out[e]).all(axis=-1))[0])
            raise ForgetkitError(f"shard {name!r}: outputs contain NaN or inf at epoch "
                                 f"index {e} (sample {start + bad} of the shard)")


def check_shard_metadata(record, sums, name, *, verify=True):
    """Refuse a shard whose metadata ``record`` holds an unknown field or, when verifying,
    does not match its checksums ``sums`` (the stored ``"crc32c"`` field, or None), as
    `forgetkit.load` refuses the same file."""
    where = f"shard {name!r}"
    try:
        check_record({k: v for k, v in record.items() if k != "kind"}, f"the metadata of {where}")
        if verify and sums is not None:
            check_fields(record, stored_checksums({CRC_KEY: sums}, where), name, where=where)
    except ForgetkitError as err:
        raise CorruptFileError(str(err)) from None
