"""Past one machine: runs held as dask arrays, and sweeps of many runs on a cluster.

A run whose outputs are a dask array chunked along samples (``fk.Run(dask_array, labels)``,
or ``fk.load("shards/*.npy", chunks=...)``) stays distributed: every per-sample statistic is
local to a chunk of samples and every per-epoch count is a sum over chunks, so each pass runs
the in-memory code and kernels on the Run of each chunk, on the workers of the active dask
scheduler, and only counts, per-sample rows or per-chunk results travel. The results equal
the in-memory path's exactly. The algorithms are the core's (`forgetkit.execution`: per-chunk
steps and a combine); this package only runs them: importing it registers the dask executor
(`chunks.DaskExecutor`), which the core finds by the outputs' type, importing this package on
first use (``forgetkit.execution.PROVIDERS``). Knowledge Fusion's fit keeps one fit state per
chunk on the workers (futures of the active ``dask.distributed`` Client, if any).

Modules: ``chunks`` (the chunk Runs, the dask executor, per-sample dask results), ``parts``
(per-chunk results kept on the workers), ``topk`` (certified fusion of a top-k run held on
dask: each chunk of tokens fitted and certified on its worker), ``shards`` (loading NPY/
Parquet shards, local or fsspec URLs), ``sweep`` (the module of `forgetkit.sweep`:
`compare` on many runs, one task per run on a dask.distributed cluster).

dask (and distributed, for clusters and sweeps) is the optional extra ``forgetkit[dask]``;
``import forgetkit`` never imports this package, and no module of the core imports it.
"""

from __future__ import annotations

try:
    import dask  # noqa: F401
except ImportError as err:
    raise ImportError(f"forgetkit.distributed needs dask ({err}): pip install "
                      "'forgetkit[dask]'") from err

from .._deprecation import callable_module
from ..execution import register_loader
from . import sweep
from .chunks import map_reduce
from .shards import load_shards

register_loader("shards", load_shards)

__all__ = ["load_shards", "map_reduce", "sweep"]

# forgetkit.distributed.sweep is the module (the function is forgetkit.sweep, also
# forgetkit.distributed.sweep.sweep); calling the module, which the function used to shadow,
# still works with a FutureWarning
callable_module(sweep, sweep.sweep)
