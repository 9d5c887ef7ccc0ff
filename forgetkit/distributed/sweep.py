"""Sweeps: `forgetkit.compare` on many runs, one task per run on a dask.distributed cluster."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

import numba
import pandas as pd

from .._progress import Progress
from .._validation import check_int, check_ints, check_option, check_path
from ..errors import ForgetkitError, InputTypeError, MissingFileError
from ..evaluate import DEFAULT_METHODS, METHODS, compare
from ..io import load
from ..splits import check_val_frac


def run_paths(paths):
    """Run files named by ``paths``: a path or glob pattern, or a sequence of them (glob
    matches in sorted order). MissingFileError naming a path or pattern that names none."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif isinstance(paths, Iterable) and not isinstance(paths, (bytes, dict)):
        paths = [check_path(f"paths[{i}]", p) for i, p in enumerate(paths)]
    else:
        raise InputTypeError(f"paths must be a path, a glob pattern or a list of them; got "
                             f"{type(paths).__name__} {paths!r}"[:200])
    if not paths:
        raise ForgetkitError("paths names no run: got an empty list")
    out = []
    for p in map(os.fspath, paths):
        if glob.has_magic(p):
            found = sorted(glob.glob(p))
            if not found:
                raise MissingFileError(f"no run matches {p!r}")
            out += found
        elif os.path.exists(p):
            out.append(p)
        else:
            raise MissingFileError(f"no such run: {p!r}")
    return out


class RunFailed(str):
    """The one-line error of a run that `compare_run` could not compare (a bad or missing
    file, an input compare refuses): returned, not raised, so that the worker does not log
    the traceback of an error the sweep reports itself."""


def compare_run(path, *, threads, **options):
    """`compare` of the run at ``path`` as rows: columns run, method, then compare's; or the
    `RunFailed` message naming the run. Runs on a worker; ``threads``: numba threads of its
    kernels (None: numba's default)."""
    if threads is not None:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        table = compare(load(path), **options)
    except (ForgetkitError, OSError) as err:
        return RunFailed(" ".join(f"run {path!r}: {err}".split()))
    table = table.reset_index()
    table.insert(0, "run", path)
    return table


def cluster_api():
    """(Client, LocalCluster, as_completed) of dask.distributed; ImportError saying how to
    install it when missing (dask alone runs the chunked passes, not sweeps)."""
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError as err:
        raise ImportError(f"sweeps need dask.distributed ({err}): pip install "
                          "'forgetkit[dask]'") from err
    return Client, LocalCluster, as_completed


def sweep(paths, *, methods=DEFAULT_METHODS, client=None, n_workers=None, seeds=(0, 1, 2),
          val_frac=0.5, window=1, progress=False, errors="raise"):
    """`forgetkit.compare` on many runs, one task per run on a dask.distributed cluster.

    Parameters
    ----------
    paths : str, Path or sequence of them
        Run files (any format `forgetkit.load` reads) or glob patterns, matched here in sorted
        order; the workers must see the same files.
    methods, seeds, val_frac, window
        As in `forgetkit.compare`.
    client : distributed.Client, optional
        The cluster to run on. Default: a LocalCluster of ``n_workers`` worker processes (one
        task at a time each, its kernels on cores // n_workers threads), closed at the end.
    n_workers : int, optional
        Workers of that LocalCluster; default: one per core.
    progress : bool
        Show runs done / total on a terminal.
    errors : {"raise", "record"}
        A run that forgetkit refuses (a corrupt file, bad labels...): "raise" raises its
        error; "record" keeps every other run's rows and gives it one row whose ``error``
        column says why (the table then has an ``error`` column, empty for good rows).

    Returns
    -------
    pandas.DataFrame with one row per (run, method), in the order of the runs then the
    methods: ``run`` (the path), ``method``, then the columns of `forgetkit.compare`.
    """
    Client, LocalCluster, as_completed = cluster_api()
    check_int("n_workers", n_workers, minimum=1, allow_none=True)
    check_option("errors", errors, ("raise", "record"))
    # every option checked before a cluster starts or a run is read
    for m in methods:
        check_option("method", m, tuple(METHODS))
    seeds = check_ints("seeds", seeds, minimum=0)
    check_int("window", window, minimum=0)
    check_val_frac(val_frac)
    paths = run_paths(paths)
    options = dict(methods=list(methods), seeds=tuple(seeds), val_frac=val_frac, window=window)
    cluster, threads = None, None
    if client is None:
        n_workers = n_workers or os.cpu_count()
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0")
        client = Client(cluster)
        threads = max(1, (os.cpu_count() or 1) // n_workers)
    try:
        futures = [client.submit(compare_run, p, threads=threads, pure=False, **options)
                   for p in paths]
        bar = Progress(len(paths), "sweep", enabled=progress, unit="runs")
        results = {}
        for future in as_completed(futures):
            result = future.result()  # an unexpected error (a bug) raises here
            if isinstance(result, RunFailed) and errors == "raise":
                raise ForgetkitError(str(result))
            results[future.key] = result
            bar.update(1)
        tables = [pd.DataFrame({"run": [p], "error": [str(r)]}) if isinstance(r, RunFailed)
                  else r for p, r in ((p, results[f.key]) for p, f in
                                      zip(paths, futures, strict=True))]
    finally:
        if cluster is not None:
            client.close()
            cluster.close()
    table = pd.concat(tables, ignore_index=True)
    if errors == "record":
        table["error"] = table["error"].fillna("") if "error" in table else ""
    return table
