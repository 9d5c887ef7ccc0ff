import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# OpenMP threads (numba's threading layer here) spin for a while after each parallel region
# before they sleep. The test processes of ``pytest -n 2`` share the cores, so that spinning
# takes CPU from the other process: set before numba starts its threads (the subprocesses
# the tests start inherit it). Results do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import forgetkit as fk  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RUN = ROOT / "data_samples" / "fmnist_resnet18_clean_seed100.npz"


def _lock_numba_cache_saves():
    """numba saves a compiled function by reading its cache index, taking a data file name
    free in it and writing both, unlocked: two processes saving two signatures of one
    function at once can leave the index pairing one signature with the other's code (numba
    issues 4807 and 10128: segfaults). The workers of ``pytest -n 2`` (pytest-xdist) share
    the cache, so each save holds a lock file beside the index."""
    import fcntl

    from numba.core import caching

    save = caching.IndexDataCacheFile.save
    if getattr(save, "locked", False):
        return

    def locked_save(self, key, data):
        with open(self._index_path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return save(self, key, data)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    locked_save.locked = True
    caching.IndexDataCacheFile.save = locked_save


_lock_numba_cache_saves()


def compile_lock_path(dispatcher, args):
    """The lock file of compiling cached function ``dispatcher`` for argument types
    ``args``, beside its cache index; None for a function numba does not cache."""
    import hashlib

    index = getattr(getattr(dispatcher._cache, "_cache_file", None), "_index_path", None)
    if index is None:
        return None
    return f"{index}.{hashlib.sha1(str(tuple(args)).encode()).hexdigest()[:16]}.compiling"


def _compile_each_signature_once_across_processes():
    """The workers of ``pytest -n 2`` start from the same empty cache and often reach the
    same kernel at about the same time: both would compile it (seconds each). A compile of a
    cached function's signature holds a lock file named after the signature beside the
    cache index, so the process that comes second waits and then loads the first one's
    build from the cache instead of compiling it again. A lock this process already holds
    is not taken again; the functions a kernel calls are locked under it, along the call
    graph, so no two processes wait on each other."""
    import fcntl

    from numba.core import dispatcher, sigutils

    compile_ = dispatcher.Dispatcher.compile
    if getattr(compile_, "original", None):
        return
    held = set()

    def compile_once(self, sig):
        args, _ = sigutils.normalize_signature(sig)
        path = None if tuple(args) in self.overloads else compile_lock_path(self, args)
        if path is None or path in held:
            return compile_(self, sig)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held.add(path)
            try:
                return compile_(self, sig)  # loads the other process's build if it saved one
            finally:
                held.discard(path)
                fcntl.flock(lock, fcntl.LOCK_UN)

    compile_once.original = compile_
    dispatcher.Dispatcher.compile = compile_once


_compile_each_signature_once_across_processes()


def require_real_part(what, available):
    """Skip a test whose real part (a system package, an optional framework) is missing, or
    fail it on CI (environment variable CI=true), where `.ci/run` installs every real part:
    there a missing one is a broken setup, not a reason to pass quietly."""
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing on CI; .ci/run should have installed it", pytrace=False)
    pytest.skip(f"{what} not installed", allow_module_level=True)


def import_real_part(module, what):
    """``importlib.import_module(module)``, or `require_real_part` when it cannot be imported
    (pytest.importorskip that fails on CI)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    require_real_part(what, False)


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium through Playwright (the explorer's and reports' tests)."""
    require_real_part("Debian chromium (headless browser)", Path("/usr/bin/chromium").exists())
    sync_api = import_real_part("playwright.sync_api", "playwright (the test extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture(scope="session")
def real_run():
    """The real ResNet-18 / Fashion-MNIST run (60 epochs, 10,000 test images)."""
    return fk.load(SAMPLE_RUN)


@pytest.fixture(scope="session")
def real_small(real_run):
    """2,000 samples of the real run (fast format and dtype sweeps)."""
    return real_run.isel(samples=np.arange(2000))


def make_run(n_epochs=12, n_samples=300, n_classes=5, seed=0, dtype=np.float32, ties=False):
    """A random run; with ties=True values are multiples of 1/4 (many exact ties)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n_samples)
    out = rng.normal(size=(n_epochs, n_samples, n_classes))
    # make later epochs more often right, with some forgetting
    out[:, np.arange(n_samples), labels] += np.linspace(0, 2, n_epochs)[:, None]
    if ties:
        out = np.round(out * 4) / 4
    return fk.Run(out.astype(dtype), labels)


def kill_when_ready(script, path, *, settle=0.2):
    """Run ``script`` (python source, argv[1] = path) until it prints "ready", let it work
    ``settle`` seconds more, then SIGKILL it mid-write."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(settle)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
