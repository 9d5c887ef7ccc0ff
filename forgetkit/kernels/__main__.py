"""``python -m forgetkit.kernels``: compile every kernel into numba's cache (see
``forgetkit.kernels.warmup``); ``--later FILE``: the background compile of
``forgetkit.kernels.jit.compile_later``; ``--parts FOLDER``: a process of the warmup that
runs the parts named on its stdin (``forgetkit.kernels.warmup.serve_parts``)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--later"]:
        from .jit import compile_wanted

        compile_wanted(sys.argv[2])
    elif sys.argv[1:2] == ["--parts"]:
        from .warmup import serve_parts

        serve_parts(sys.argv[2])
    else:
        from .warmup import warmup

        seconds = warmup(quiet="--quiet" in sys.argv[1:])
        if "--quiet" not in sys.argv[1:]:
            print(f"forgetkit's kernels are compiled into numba's cache ({seconds:.1f} s)")
