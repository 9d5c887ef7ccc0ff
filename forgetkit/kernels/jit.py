"""How the kernels are compiled, which build a call runs, and the compile notice.

Compiling is what a first run pays: numba compiles each kernel for each set of argument
types on its first call and keeps the result in its on-disk cache. A ``parallel=True``
build compiles 3-4x slower than the same function compiled serially (numba turns each
prange loop into a gufunc compiled on its own). So every kernel (``@kernel``) has two
builds, each compiled lazily and cached:

- the parallel one (the module's name: what large runs use, and what the tests of the
  kernels call directly);
- a serial one (``.serial``: the same function, prange read as range) for calls whose
  work is too small for threads to pay.

`choose` picks the build of a call from its work (about the number of stored values or
float64 entries it reads): below ``PARALLEL_WORK`` serial; from ``COMPILE_WORK`` on
parallel; in between parallel only where that build is already compiled for these
argument types (in this process or in numba's cache, e.g. by ``forgetkit warmup``), so
that a mid-sized run does not pay a parallel compile to save milliseconds. Both builds give
the same bits (the block-parallel kernels merge their blocks' sums in block order; tested).

The kernels of the Knowledge Fusion fit and of `compare` also have exact numpy twins
(``twins``): a call reading fewer than ``TWIN_WORK`` values whose build is not compiled
runs the twin instead (`use_twin`), so that a first run on a sample-sized run compiles
only the kernels without one (on the clean sample run, the forgetting pass's argmax).

`compile_notice` turns the pause of a first run into one line on a terminal, and
`warmup` (``forgetkit warmup``, ``python -m forgetkit.kernels``) compiles both builds of
every kernel into the cache, for images and CI.
"""

from __future__ import annotations

import sys
import time
import types
from contextlib import contextmanager

import numba
from numba import njit
from numba.core import event

#: Calls reading fewer values than this run the serial build (a serial pass over 2**18
#: float16 values takes about 1 ms).
PARALLEL_WORK = 1 << 18
#: Calls reading at least this many values run the parallel build even where it must be
#: compiled first (about 4 s of compiling per kernel saves more than that in a few calls).
COMPILE_WORK = 1 << 24

#: Calls reading fewer values than this whose kernel build is not compiled yet run the
#: kernel's exact numpy twin where it has one (``twins``): on a sample-sized run compiling
#: costs seconds, the twin milliseconds more than the kernel.
TWIN_WORK = 1 << 22

#: Every kernel's parallel build, in definition order (``warmup`` and the tests use it).
KERNELS = []


def kernel(fn):
    """Decorator: ``fn`` compiled with ``parallel=True`` and ``cache=True``, its serial
    twin (own cache files) as the ``.serial`` attribute."""
    parallel = njit(parallel=True, cache=True)(fn)
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    twin.__qualname__ = f"{fn.__qualname__}_serial"  # numba's cache files follow it
    twin.__module__, twin.__doc__ = fn.__module__, fn.__doc__
    parallel.serial = njit(cache=True)(twin)
    KERNELS.append(parallel)
    return parallel


#: (dispatcher, argument types) -> whether numba's on-disk cache had a build, looked up once
_IN_CACHE = {}


def _compiled(dispatcher, args):
    """Whether ``dispatcher`` holds, or its on-disk cache has, a build for these arguments."""
    try:
        sig = tuple(dispatcher.typeof_pyval(a) for a in args)
        if sig in dispatcher.overloads:
            return True
        if (dispatcher, sig) not in _IN_CACHE:
            cache = dispatcher._cache
            key = cache._index_key(sig, dispatcher.targetctx.codegen())
            _IN_CACHE[dispatcher, sig] = key in cache._cache_file._load_index()
        return _IN_CACHE[dispatcher, sig]
    except Exception:  # private numba API, or no compiler (NUMBA_DISABLE_JIT): decide so
        return False


#: "serial", "parallel" or "numpy": every call runs that build, "numpy" the kernels' numpy
#: twins where they have one and the serial build otherwise (`forced`); None: chosen.
_FORCED = None
_BUILDS = ("serial", "parallel", "numpy", None)


@contextmanager
def forced(build):
    """Within the block every kernel call runs ``build`` ("serial", "parallel" or "numpy":
    the numpy twins, the serial build where a kernel has none; None: chosen by work): for
    the tests, which compare the builds, and for `warmup`."""
    global _FORCED
    if build not in _BUILDS:
        raise ValueError(f"build must be 'serial', 'parallel', 'numpy' or None; got {build!r}")
    before, _FORCED = _FORCED, build
    try:
        yield
    finally:
        _FORCED = before


def choose(parallel, work, args):
    """The build of kernel ``parallel`` to run on ``args`` for a call reading ``work``
    values (see the module's docstring)."""
    if _FORCED is not None:
        return parallel if _FORCED == "parallel" else parallel.serial
    if work < PARALLEL_WORK or numba.get_num_threads() < 2:
        return parallel.serial
    if work >= COMPILE_WORK or _compiled(parallel, args):
        return parallel
    return parallel.serial


def use_twin(parallel, work, args):
    """Whether a call of kernel ``parallel`` that has a numpy twin runs the twin: forced
    "numpy", or (not forced) a call reading fewer than ``TWIN_WORK`` values for which the
    build `choose` picks is not compiled, in this process or in numba's cache. A first run
    on a small run so compiles nothing the twins cover; after ``forgetkit warmup`` (or a
    large call) the compiled kernels run."""
    if _FORCED is not None:
        return _FORCED == "numpy"
    return work < TWIN_WORK and not _compiled(choose(parallel, work, args), args)


def call(parallel, work, *args):
    """``choose(parallel, work, args)(*args)``."""
    return choose(parallel, work, args)(*args)


# ------------------------------------------------------------------ compile notice
def _is_ours(dispatcher):
    func = getattr(dispatcher, "py_func", None)
    return getattr(func, "__module__", "").startswith(__package__)


class _Notice(event.Listener):
    """numba:compile listener (cache misses only): announces the first compilation of a
    forgetkit kernel and adds up the seconds spent compiling them."""

    def __init__(self, stream):
        self.stream, self.depth, self.seconds, self.started = stream, 0, 0.0, None

    def on_start(self, event):
        if self.depth == 0 and _is_ours(event.data["dispatcher"]):
            if self.started is None:
                # a line of its own: progress lines (\r) may follow while it compiles
                self.stream.write("compiling forgetkit's kernels, once per installation ...\n")
                self.stream.flush()
            self.started = time.perf_counter()
        self.depth += 1

    def on_end(self, event):
        self.depth -= 1
        if self.depth == 0 and self.started is not None and _is_ours(event.data["dispatcher"]):
            self.seconds += time.perf_counter() - self.started

    def close(self):
        if self.started is not None:
            self.stream.write(f"compiling forgetkit's kernels, once per installation: "
                              f"{self.seconds:.1f} s\n")
            self.stream.flush()


@contextmanager
def compile_notice(*, enabled=True, stream=None):
    """While active, the first compilation of a forgetkit kernel writes "compiling
    forgetkit's kernels, once per installation ..." to ``stream`` (default stderr), and the
    exit a second line with the seconds spent compiling. Silent unless ``enabled`` and the
    stream is a terminal, and when nothing compiles (a warm cache)."""
    stream = stream or sys.stderr
    if not (enabled and hasattr(stream, "isatty") and stream.isatty()):
        yield
        return
    notice = _Notice(stream)
    event.register("numba:compile", notice)
    try:
        yield
    finally:
        event.unregister("numba:compile", notice)
        notice.close()
