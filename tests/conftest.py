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
from forgetkit.kernels.warmup import share_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RUN = ROOT / "data_samples" / "fmnist_resnet18_clean_seed100.npz"


# The workers of ``pytest -n 2`` share numba's cache and start from the same empty one:
# saves must be locked (numba saves unlocked; two processes saving signatures of one
# function at once can corrupt its index), and two workers reaching the same kernel at once
# should compile it once, the second loading the first one's build. The warmup's part
# processes share it the same way.
share_cache()


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
def client():
    """A dask.distributed cluster of 2 worker processes (one thread each) and its client,
    for one test module."""
    distributed = import_real_part("distributed", "dask.distributed (the forgetkit[dask] extra)")
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       dashboard_address=":0")
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


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
