"""The built-in file formats, one module each (`forgetkit.io.registry.Format`): ``npy``
(NPY + sidecar), ``npz``, ``parquet`` and ``cartography`` (Dataset Cartography folders,
read only); the shard readers of NPY and Parquet files sit beside them (``npy_shards``,
``parquet_shards``). `forgetkit.io` registers them."""
