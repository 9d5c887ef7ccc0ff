"""Past one machine: runs held as dask arrays, and sweeps of many runs on a cluster.

A run whose outputs are a dask array chunked along samples (``fk.Run(dask_array, labels)``,
or ``fk.load("shards/*.npy", chunks=...)``) stays distributed: every per-sample statistic is
local to a chunk of samples and every per-epoch count is a sum over chunks, so each pass runs
the in-memory code and kernels on the Run of each chunk, on the workers of the active dask
scheduler, and only counts, per-sample rows or per-chunk results travel. The results equal
the in-memory path's exactly. Knowledge Fusion's fit keeps one fit state per chunk on the
workers of the active ``dask.distributed`` Client (`knowledge`).

Modules: ``chunks`` (the chunk Runs, `map_reduce`, per-sample dask results), ``shards``
(loading NPY/Parquet shards, local or fsspec URLs), ``knowledge`` (the distributed Knowledge
Fusion fit), ``label_issues`` (label issues' passes over the chunks), ``sweep`` (the module
of `forgetkit.sweep`: `compare` on many runs, one task per run).

dask and distributed are the optional extra ``forgetkit[dask]``; ``import forgetkit`` never
imports this package.
"""

from __future__ import annotations

try:
    import dask  # noqa: F401
    import distributed  # noqa: F401
except ImportError as err:
    raise ImportError(f"forgetkit.distributed needs dask and distributed ({err}): pip install "
                      "'forgetkit[dask]'") from err

from .._deprecation import callable_module
from . import sweep
from .chunks import map_reduce
from .shards import load_shards

__all__ = ["load_shards", "map_reduce", "sweep"]

# forgetkit.distributed.sweep is the module (the function is forgetkit.sweep, also
# forgetkit.distributed.sweep.sweep); calling the module, which the function used to shadow,
# still works with a FutureWarning
callable_module(sweep, sweep.sweep)
