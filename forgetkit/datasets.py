"""Readers for the real data sets forgetkit's examples use (no download, no framework)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from ._validation import check_option, check_path
from .errors import ForgetkitError, MissingFileError

#: Where Debian's ``dataset-fashion-mnist`` package puts the IDX files.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]


def read_idx(path):
    """Read an IDX file (optionally gzipped) into an ndarray of its stored type and shape."""
    path = Path(check_path("path", path))
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise MissingFileError(f"no such IDX file: {str(path)!r}") from None
    except IsADirectoryError:
        raise ForgetkitError(f"{str(path)!r} is a folder, not an IDX file") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ForgetkitError(f"{str(path)!r} is not an IDX file")
    types = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if data[2] not in types:
        raise ForgetkitError(f"{str(path)!r}: unknown IDX data type 0x{data[2]:02x}")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=types[data[2]], offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ForgetkitError(f"{str(path)!r} is truncated: {arr.size} values for shape {shape}")
    return arr.reshape(shape)


def load_fashion_mnist(split="train", root=None):
    """Fashion-MNIST images and labels.

    Parameters
    ----------
    split : {"train", "test"}
    root : folder of the IDX files; default /usr/share/datasets/fashion-mnist (Debian package
        ``dataset-fashion-mnist``).

    Returns
    -------
    images : ndarray of uint8, shape (n, 28, 28); labels : ndarray of int64, shape (n,)
    """

    check_option("split", split, ("train", "test"))
    root = Path(root) if root is not None else FASHION_MNIST_DIR
    prefix = "train" if split == "train" else "t10k"
    files = {}
    for part, kind in (("images", "idx3"), ("labels", "idx1")):
        for name in (f"{prefix}-{part}-{kind}-ubyte.gz", f"{prefix}-{part}-{kind}-ubyte"):
            if (root / name).exists():
                files[part] = root / name
                break
        else:
            raise MissingFileError(
                f"Fashion-MNIST {split} {part} not found in {str(root)!r} "
                "(apt-get install dataset-fashion-mnist, or pass root=)"
            )
    return read_idx(files["images"]), read_idx(files["labels"]).astype(np.int64)
