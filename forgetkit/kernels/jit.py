"""How the kernels are compiled and run on threads, and the compile notice.

Compiling is what a first run pays: numba compiles each kernel for each set of argument
types on its first call and keeps the result in its on-disk cache. A ``parallel=True``
build compiles about twice as long as the same function compiled serially (numba's parfor
passes fuse and analyse the loop, then lower its body again as a gufunc of its own:
grid_correct_counts took 7.1 s of CPU against 3.9 s), and a kernel with both builds
compiled both. So every kernel (``@kernel``) has one build, serial and ``nogil``, over the
row blocks it claims (``schedule``), and the threads come from here:

- a call runs that build on the caller's thread and on ``threads - 1`` threads of one
  shared pool (`run`), or as the kernel's region (below), each thread claiming blocks
  from the call's shared counter until none is left; a thread that starts late finds none
  and returns at once;
- a kernel returns the integer sums of the blocks its thread ran (None, an int, an int
  array, or a tuple of them); `run` adds them up over the threads (integer sums: the same
  bits in any order) and passes the total to the kernel's ``finish`` (numpy steps after
  the loop). Per-row results are written in place, and the one float sum (the EM pass)
  is kept per block and added in block order by its wrapper. So a call gives the same bits
  for any number of threads and blocks (tested);
- a call of W seconds of one thread's work (its values times the kernel's cost per value,
  measured in CPU seconds on its last call in this process) takes sqrt(W / h) threads, up
  to ``numba.get_num_threads()``, h the cost of handing a call to one more thread
  (``THREAD_HANDOFF`` on the pool, ``REGION_HANDOFF`` as a region): the fewest seconds of
  W / t + h * t. Before a kernel's first call, one thread per ``THREAD_WORK`` values, so
  that calls reading fewer than ``PARALLEL_WORK`` values run on the caller's thread alone.
  Per value, a softmax over 10 classes with a grid of eps per row costs some 20 times a
  pass over the values, so a count of values alone left such calls on a few of 16 cores.
  `forced` "serial" runs every call on the caller's thread.

One compile serves every thread count, and a first run's compile is the warm run's build:
no kernel waits for a parallel build that a mid-sized run would never compile.

The pool's hand-off is serial: each pool thread takes the GIL to enter its kernel and to
leave it, a wake-up from thread to thread (some 17 us a thread on 16 cores), so a call
of a few milliseconds on 16 threads pays a tenth of its time to start. A kernel whose many
small calls pay it (the KF fit's window counts, the forgetting pass's argmax) also has a
region (`Kernel.on_threads`): a small ``parallel=True`` function whose loop over the
threads calls the serial build on each, so that numba's threading layer starts the
threads natively, with no GIL. A region runs where it is compiled (in this process or
numba's cache). Its compile costs about what the serial build's does (numba links the
build into it and generates its code again), so regions are compiled and run only where
numba has ``REGION_THREADS`` threads or more: by ``forgetkit warmup`` there, and after a
run whose calls took the pool for want of one (`compile_later`, with the kernels whose
twins ran). Until then the pool runs the calls.
numba's threading layer is OpenMP where the system has it: after a region its threads
spin a moment before they sleep (the process's CPU seconds count it), and a child forked
from a process that started them must not start a region (the layer terminates it), so
no forked child runs regions (`_after_fork`).

The kernels of the Knowledge Fusion fit and of `compare` also have exact numpy twins
(``twins``): a call reading fewer than ``TWIN_WORK`` values whose build is not compiled
runs the twin instead (`use_twin`), so that a first run on a sample-sized run compiles
only the kernels without one. The kernels whose twins ran are then compiled after the run,
in the background (`compile_later`: a detached process at exit, lowest priority), so that
the next run finds them compiled and runs them: the twins cost a first run milliseconds,
a later run several times the kernel's time.

`compile_notice` turns the pause of a first run into one line on a terminal, and
``forgetkit warmup`` (``python -m forgetkit.kernels``) compiles every kernel into the
cache, for images and CI.
"""

from __future__ import annotations

import atexit
import importlib
import math
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

import numba
import numpy as np
from numba import njit
from numba.core import event

#: Seconds that handing a call to one more pool thread adds to it: each thread takes the
#: GIL to enter the kernel and to leave it (on 16 cores of a lent host, 15 threads added
#: some 0.7 ms to a KF fit's grid call: ``python -m bench.bench_fit_calls``).
THREAD_HANDOFF = 40e-6
#: The same for a call run as its kernel's region (`Kernel.on_threads`): numba's threads
#: start natively, side by side (``python -m bench.bench_pool``).
REGION_HANDOFF = 1e-6
#: Regions are compiled (by the warmup, or after a run) and run where numba has this many
#: threads: below, the pool's hand-off is a few percent of a call, and a region's compile
#: (seconds: the serial build is compiled again into it) would not pay.
REGION_THREADS = 8
#: Values a call reads per thread it wakes, for a kernel not yet timed (a pass over 2**16
#: values takes some 50 microseconds); calls reading fewer than twice this run on the
#: caller's thread alone.
THREAD_WORK = 1 << 16
#: Calls reading fewer values than this run on the caller's thread alone.
PARALLEL_WORK = 2 * THREAD_WORK

#: Calls reading fewer values than this whose kernel is not compiled yet run the kernel's
#: exact numpy twin where it has one (``twins``): on a sample-sized run compiling costs
#: seconds, the twin milliseconds more than the kernel.
TWIN_WORK = 1 << 22

#: Row blocks per thread of a call (see ``schedule``): several per thread let the threads
#: that run faster take more of them, when rows cost unevenly or a core is slowed down.
BLOCKS_PER_THREAD = 8

#: Every kernel, in definition order (``warmup`` and the tests use it).
KERNELS = []


def n_blocks(threads=None):
    """Row blocks of a call on ``threads`` threads (default: numba's thread count)."""
    return BLOCKS_PER_THREAD * (numba.get_num_threads() if threads is None else threads)


class Kernel:
    """A kernel: ``build``, the function compiled with ``nogil=True, cache=True``, whose
    last two parameters are ``n_blocks`` (the blocks of rows, see ``schedule``) and
    ``counter`` (the call's block counter); ``finish(total, *args)`` turns the threads'
    summed results into the call's result (default: the total).

    Calling it with the function's arguments less ``counter`` (and less ``n_blocks`` too,
    for kernels whose rows need no knowledge of their blocks: then ``n_blocks()``) runs it
    on the threads `threads` gives and returns the result."""

    def __init__(self, fn, finish=None):
        self.py_func, self.finish = fn, finish
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        self.__module__ = fn.__module__
        self.build = njit(nogil=True, cache=True)(fn)
        self._arity = fn.__code__.co_argcount
        #: CPU seconds per value read of its last call through `call` (None: none yet)
        self.cost = None
        #: the kernel on numba's threads in one parallel region (`on_threads`), or None
        self.region = None
        #: whether its last call on several threads ran as its region (`run`)
        self.ran_region = False

    def on_threads(self, fn):
        """Decorator: ``fn`` (the kernel's arguments, counter included, then ``n_threads``)
        as this kernel's region, compiled ``parallel=True``: a ``prange`` over the threads
        whose body calls ``build`` once on each and keeps its result, returning what `run`
        would have summed (before ``finish``)."""
        self.region = njit(parallel=True, nogil=True, cache=True)(fn)
        return self.region

    def full_args(self, args, threads):
        """``args`` with the trailing ``n_blocks`` (where the caller leaves it out) and a new
        counter."""
        if len(args) == self._arity - 2:
            args = (*args, n_blocks(threads))
        return (*args, np.zeros(1, dtype=np.int64))

    def __call__(self, *args):
        return run(self, threads(None), args)

    def __repr__(self):
        return f"<kernel {self.__module__}.{self.__qualname__}>"

    def __reduce__(self):  # by name, as a function pickles
        return _kernel_named, (self.__module__, self.__name__)


def _kernel_named(module, name):
    """The kernel ``name`` of ``module`` (unpickling a `Kernel`)."""
    return getattr(importlib.import_module(module), name)


def kernel(fn=None, *, finish=None):
    """Decorator: ``fn`` as a `Kernel` (``@kernel`` or ``@kernel(finish=...)``)."""
    if fn is None:
        return lambda f: kernel(f, finish=finish)
    k = Kernel(fn, finish)
    KERNELS.append(k)
    return k


# ------------------------------------------------------------------ threads
class _Worker:
    """A pool thread: runs ``task`` = (function, arguments) each time ``go`` is released,
    then releases ``done`` (two locks: a hand-off costs a few microseconds, where a
    ThreadPoolExecutor's futures cost tens per thread and call)."""

    def __init__(self):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.task = self.result = self.error = None
        threading.Thread(target=self._loop, name="forgetkit-kernel", daemon=True).start()

    def _loop(self):
        while True:
            self.go.acquire()
            fn, args = self.task
            self.task = None
            try:
                self.result, self.error = fn(*args), None
            except BaseException as error:  # re-raised on the caller's thread
                self.result, self.error = None, error
            del fn, args  # else this frame keeps the call's arrays until the next call
            self.done.release()


class _Pool:
    """The pool's threads, grown on demand; ``busy`` is held by the call running on them."""

    def __init__(self):
        self.workers, self.busy = [], threading.Lock()

    def take(self, n):
        while len(self.workers) < n:
            self.workers.append(_Worker())
        return self.workers[:n]


_POOL = None
_POOL_LOCK = threading.Lock()


def _pool():
    """The shared pool, started on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _Pool()
        return _POOL


def _after_fork():
    """In a forked child: a new pool on first use (the parent's threads do not exist there,
    and a lock another thread held at the fork stays held), and no regions: numba's OpenMP
    threading layer terminates a child that starts a parallel region once its parent has
    started the layer's threads (which any ``numba.get_num_threads()`` does)."""
    global _POOL, _POOL_LOCK, _FORKED
    _POOL, _POOL_LOCK, _FORKED = None, threading.Lock(), True
    for k in KERNELS:
        k.ran_region = False


#: Whether this process is a forked child (it runs no regions)
_FORKED = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _add(results):
    """The element-wise sum of the threads' results (None, ints, int arrays or tuples)."""
    first = results[0]
    if first is None:
        return None
    if isinstance(first, tuple):
        return tuple(_add(list(parts)) for parts in zip(*results, strict=True))
    total = first
    for r in results[1:]:
        total = total + r
    return total


def run(k, n_threads, args):
    """Kernel ``k`` on ``args`` (its arguments less the counter) on ``n_threads`` threads:
    as its region where `region_ready` and numba has the threads, else on the caller's and
    ``n_threads - 1`` of the pool's; returns ``k.finish`` of the summed results. While
    another thread's call holds the pool, the call runs on its caller's thread alone (the
    cores are busy, and numba's workqueue threading layer takes one region at a time)."""
    full = k.full_args(args, n_threads)
    pool = _pool() if n_threads > 1 else None
    if pool is None or not pool.busy.acquire(blocking=False):
        total = k.build(*full)
    else:
        try:
            k.ran_region = region_ready(k, full) and n_threads <= numba.get_num_threads()
            if k.ran_region:
                total = k.region(*full, n_threads)
            else:
                total = _on_pool(pool, k, n_threads, full)
        finally:
            pool.busy.release()
    return total if k.finish is None else k.finish(total, *args)


def region_ready(k, full):
    """Whether calls of ``k`` on ``full`` (its arguments, counter included) on several
    threads run as its region: ``k`` has one, numba has ``REGION_THREADS`` threads or
    more, the process is not a forked child (`_after_fork`), and the region is compiled
    (or forced "parallel", as the warmup runs: that compiles it). A region not compiled is
    noted for the compile after the run (`_want`)."""
    if k.region is None or numba.get_num_threads() < REGION_THREADS or _FORKED:
        return False
    if _FORCED == "parallel":
        return True
    key = _args_key(k.region, full)
    ready, builds = _REGION_READY.get(key, (None, None))
    if ready is None or not ready and builds != len(k.region.overloads):
        ready = _compiled(k.region, (*full, 2))
        if key is not None:
            _REGION_READY[key] = ready, len(k.region.overloads)
        if not ready and _FORCED is None:
            _want(k, full)
    return ready


#: `_args_key` of a call -> (whether its kernel's region was found compiled, the region's
#: builds in this process then): looked up again only if a build was added since (a region
#: not compiled is compiled after the run, for the next process)
_REGION_READY = {}


def _on_pool(pool, k, n_threads, full):
    """The summed results of ``k.build`` on ``full``, run on the caller's thread and
    ``n_threads - 1`` of ``pool``'s (held by the caller)."""
    workers = pool.take(n_threads - 1)
    for w in workers:
        w.task = (k.build, full)
        w.go.release()
    try:
        results = [k.build(*full)]
    finally:  # the workers finish (or find no block left) before the pool is free
        for w in workers:
            w.done.acquire()
    for w in workers:
        if w.error is not None:
            error, w.error = w.error, None
            raise error
        results.append(w.result)
        w.result = None
    return _add(results)


# ------------------------------------------------------------------ which path a call takes
#: (dispatcher, argument types) -> whether numba's on-disk cache had a build, looked up once
_IN_CACHE = {}


def _compiled(dispatcher, args):
    """Whether ``dispatcher`` holds, or its on-disk cache has, a build for these arguments."""
    key = _args_key(dispatcher, args)
    if key is not None and key in _FOUND:
        return True
    try:
        sig = tuple(dispatcher.typeof_pyval(a) for a in args)
        if sig in dispatcher.overloads:
            found = True
        else:
            if (dispatcher, sig) not in _IN_CACHE:
                cache = dispatcher._cache
                index_key = cache._index_key(sig, dispatcher.targetctx.codegen())
                _IN_CACHE[dispatcher, sig] = index_key in cache._cache_file._load_index()
            found = _IN_CACHE[dispatcher, sig]
    except Exception:  # private numba API, or no compiler (NUMBA_DISABLE_JIT): decide so
        return False
    if found and key is not None:
        _FOUND.add(key)
    return found


#: `_args_key`s of the calls found compiled: numba's typing of each argument (some 100
#: microseconds a call) is then skipped. Only what was found is kept: a call whose twin
#: ran is looked up again, and takes the kernel once a larger call has compiled it.
_FOUND = set()


def _args_key(dispatcher, args):
    """(dispatcher, what decides numba's type of each argument: an array's dtype,
    dimensions, contiguity, writeability and alignment, a scalar's type), or None where
    some argument is neither."""
    key = [dispatcher]
    for a in args:
        if isinstance(a, np.ndarray):
            f = a.flags
            key.append((a.dtype, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable,
                        f.aligned))
        elif isinstance(a, (bool, int, float, np.generic)):
            key.append(type(a))
        else:
            return None
    return tuple(key)


#: "serial", "parallel" or "numpy": every call runs so, "numpy" the kernels' numpy twins
#: where they have one and the kernel on one thread otherwise (`forced`); None: chosen.
_FORCED = None
_BUILDS = ("serial", "parallel", "numpy", None)


@contextmanager
def forced(build):
    """Within the block every kernel call runs as ``build`` says: "serial" on the caller's
    thread alone, "parallel" on every thread whatever its size, "numpy" the numpy twins
    (one thread where a kernel has none); None: chosen by work. For the tests, which
    compare them."""
    global _FORCED
    if build not in _BUILDS:
        raise ValueError(f"build must be 'serial', 'parallel', 'numpy' or None; got {build!r}")
    before, _FORCED = _FORCED, build
    try:
        yield
    finally:
        _FORCED = before


def threads(work, cost=None, handoff=THREAD_HANDOFF):
    """The number of threads of a call reading ``work`` values (None: any size) of a kernel
    whose work costs ``cost`` CPU seconds per value (None: not known), each thread costing
    ``handoff`` seconds to start; see the module's docstring."""
    if _FORCED in ("serial", "numpy"):
        return 1
    if _FORCED is None and work is not None:
        n = work // THREAD_WORK if cost is None else math.sqrt(work * cost / handoff)
        return int(max(1, min(numba.get_num_threads(), n)))
    return numba.get_num_threads()


def use_twin(k, work, args):
    """Whether a call of kernel ``k`` that has a numpy twin runs the twin: forced "numpy",
    or (not forced) a call reading fewer than ``TWIN_WORK`` values for which the kernel is
    not compiled, in this process or in numba's cache. A first run on a small run so
    compiles nothing the twins cover; after a large call (or ``forgetkit warmup``) the
    compiled kernel runs."""
    if _FORCED is not None:
        return _FORCED == "numpy"
    if work >= TWIN_WORK:
        return False
    full = k.full_args(args, 1)
    if _compiled(k.build, full):
        return False
    _want(k, full)
    return True


def call(k, work, *args):
    """Kernel ``k`` on ``args`` for a call reading ``work`` values, on `threads` threads
    (each costing a region's thread to start where the call runs as one, else a pool's);
    its CPU seconds per value become ``k.cost`` for the next call. The process's CPU time
    is about the threads' work: pool threads wait on locks, a region's spin a moment."""
    cpu = time.process_time()
    region = k.region is not None and (k.ran_region  # known: no lookup
                                       or region_ready(k, k.full_args(args, 1)))
    out = run(k, threads(work, k.cost, REGION_HANDOFF if region else THREAD_HANDOFF), args)
    if work > 0:
        k.cost = (time.process_time() - cpu) / work
    return out


# ------------------------------------------------------------------ compiled after the run
def typeof(value):
    """numba's type of an argument, as a kernel's dispatcher sees it."""
    return numba.typeof(value, numba.core.typing.typeof.Purpose.argument)


#: Environment variable: "0" compiles nothing in the background (`compile_later`).
BACKGROUND = "FORGETKIT_BACKGROUND_COMPILE"
#: (module, kernel name, argument types) of the calls whose twin (or pool, where the kernel
#: has a region) ran in this process
_WANTED = set()


def _want(k, full_args):
    """Note that kernel ``k`` ran its twin (or the pool, not its region) on these arguments:
    `compile_later` compiles it and its region."""
    try:
        sig = tuple(typeof(a) for a in full_args)
    except Exception:  # no compiler (NUMBA_DISABLE_JIT)
        return
    if not _WANTED:
        atexit.register(compile_later)
    _WANTED.add((k.py_func.__module__, k.__name__, sig))


def compile_later():
    """At exit, where twins ran for kernels not compiled (or the pool for a region not
    compiled): start a detached process, at the lowest priority, that compiles those
    kernels for those argument types into numba's cache (``python -m forgetkit.kernels
    --later FILE``). Not under pytest, nor with FORGETKIT_BACKGROUND_COMPILE=0, nor off
    POSIX. Returns the process, or None."""
    if (not _WANTED or os.environ.get(BACKGROUND) == "0" or "pytest" in sys.modules
            or os.name != "posix"):
        return None
    fd, path = tempfile.mkstemp(prefix="forgetkit-compile-", suffix=".pkl")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(sorted(_WANTED, key=str), f)
    _WANTED.clear()
    # this forgetkit, however the process found it
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.Popen([sys.executable, "-m", "forgetkit.kernels", "--later", path],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def compile_wanted(path):
    """The background process of `compile_later`: compile (or load from the cache) each
    (module, kernel, argument types) of the pickle at ``path``, then remove it. One such
    process compiles at a time (a lock file in the temporary folder); the others wait and
    then load what it saved. A kernel's region is compiled too where numba has
    ``REGION_THREADS`` threads or more."""
    import fcntl  # POSIX: the background compile is started on POSIX only

    os.nice(19)
    with open(path, "rb") as f:
        wanted = pickle.load(f)
    os.remove(path)
    with open(os.path.join(tempfile.gettempdir(), "forgetkit-compile.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for module, name, sig in wanted:
            k = getattr(importlib.import_module(module), name)
            k.build.compile(sig)
            if k.region is not None and numba.get_num_threads() >= REGION_THREADS:
                k.region.compile((*sig, numba.types.int64))


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
