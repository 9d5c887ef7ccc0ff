"""Record a JAX model's outputs on fixed evaluation batches once per epoch.

    from forgetkit.exporters.jax import LogitRecorder

    recorder = LogitRecorder("run.npy", test_batches, model.apply)   # apply_fn(params, x)
    for epoch in range(epochs):
        params = train_one_epoch(params)
        recorder.record(params, epoch)
    recorder.close()
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._common import RecorderBase, check_class_counts

__all__ = ["LogitRecorder"]


class LogitRecorder(RecorderBase):
    """Append ``apply_fn(params, inputs)`` on ``batches`` to a forgetkit run per `record`.

    Parameters
    ----------
    path : str or Path
        ``.npy`` or ``.parquet``; an existing run is appended to (resumed training).
    batches : re-iterable of (inputs, labels) (e.g. a list), or a callable returning a fresh
        iterator; the same samples in the same order every epoch.
    apply_fn : callable (params, inputs) -> (batch, n_classes) logits.
    dtype : "float16" (default), "float32" or "float64", the stored precision.
    jit : bool, default True: wrap ``apply_fn`` (and the cast) in ``jax.jit``.
    kind, format, layout, meta, class_names, mode : passed to `forgetkit.RunWriter`.

    Outputs stay on the device until the epoch is done; then one ``jax.device_get`` brings
    them to the host (one transfer per batch at most, no per-sample copies).
    """

    def __init__(self, path, batches, apply_fn, *, dtype="float16", jit=True, kind="logits",
                 format=None, layout="list", meta=None, class_names=None, mode="a"):
        super().__init__(path, dtype=dtype, kind=kind, format=format, layout=layout,
                         meta=meta, class_names=class_names, mode=mode)
        self.batches = batches
        store = jnp.dtype(self.dtype.name)

        def logits(params, x):
            return apply_fn(params, x).astype(store)

        self._logits = jax.jit(logits) if jit else logits

    def record(self, params, epoch):
        """Evaluate on every batch with ``params`` and store the outputs as epoch ``epoch``;
        return the epoch's accuracy."""
        batches = self.batches() if callable(self.batches) else self.batches
        chunks, labels = [], []
        for x, y in batches:
            chunks.append(self._logits(params, x))
            labels.append(np.asarray(y).reshape(-1))
        check_class_counts(chunks, epoch)
        host = jax.device_get(chunks)
        return self._store(epoch, np.concatenate([np.asarray(c) for c in host]),
                    np.concatenate(labels))
