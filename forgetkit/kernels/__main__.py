"""``python -m forgetkit.kernels``: compile every kernel into numba's cache (see
``forgetkit.kernels.warmup``)."""

import sys

from .warmup import warmup

if __name__ == "__main__":
    seconds = warmup(quiet="--quiet" in sys.argv[1:])
    if "--quiet" not in sys.argv[1:]:
        print(f"forgetkit's kernels are compiled into numba's cache ({seconds:.1f} s)")
