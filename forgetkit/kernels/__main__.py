"""``python -m forgetkit.kernels``: compile every kernel into numba's cache (see
``forgetkit.kernels.warmup``); ``--later FILE``: the background compile of
``forgetkit.kernels.jit.compile_later``; ``--part NAME FOLDER``: one part of the warmup, in
a process of its own (prints the kernels it compiled, one JSON line)."""

import json
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--later"]:
        from .jit import compile_wanted

        compile_wanted(sys.argv[2])
    elif sys.argv[1:2] == ["--part"]:
        from .warmup import run_part, share_cache

        share_cache()
        print(json.dumps(run_part(sys.argv[2], sys.argv[3])))
    else:
        from .warmup import warmup

        seconds = warmup(quiet="--quiet" in sys.argv[1:])
        if "--quiet" not in sys.argv[1:]:
            print(f"forgetkit's kernels are compiled into numba's cache ({seconds:.1f} s)")
