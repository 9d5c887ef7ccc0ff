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

from ..errors import ForgetkitError
from ..kinds.summary import SUMMARY_DTYPE
from ._common import RecorderBase, check_class_counts

__all__ = ["LogitRecorder"]


class LogitRecorder(RecorderBase):
    """Append ``apply_fn(params, inputs)`` on ``batches`` to a forgetkit run per `record`.

    Parameters
    ----------
    path : str or Path
        ``.npy`` or ``.parquet``; an existing run is appended to (resumed training).
    batches : re-iterable of (inputs, labels) (e.g. a list), or a callable returning a fresh
        iterator; the same samples in the same order every epoch. Inputs may be sharded
        over several devices (``jax.sharding``): outputs are gathered with their sharding.
    apply_fn : callable (params, inputs) -> (batch, n_classes) logits.
    jit : bool, default True: wrap ``apply_fn`` (and the cast) in ``jax.jit``.
    **options
        The recorder options (`forgetkit.exporters._common.RecorderOptions`): ``dtype``
        ("float16" default, the stored precision), ``summary`` (computed on the device from
        the logits rounded to ``dtype``; float64: on the host), ``sample_ids`` (the id of
        each position), ``max_pending``, ``durable``, and ``kind``, ``format``, ``layout``,
        ``meta``, ``class_names``, ``mode`` for `forgetkit.RunWriter`.

    Outputs stay on the device(s) until the epoch is done; the device-to-host copy (one
    ``jax.device_get``) and the disk write run on a background thread. Accuracy and the
    finiteness check are reduced on the device. Outputs that span several processes
    (multi-host) are refused: record on each process's addressable data instead.
    """

    def __init__(self, path, batches, apply_fn, *, jit=True, **options):
        super().__init__(path, **options)
        self.batches = batches
        store = jnp.dtype(self.dtype.name)
        self._device_summary = self.summary and self.dtype != np.float64

        def logits(params, x):
            return apply_fn(params, x).astype(store)

        self._logits = jax.jit(logits) if jit else logits

    def record(self, params, epoch):
        """Evaluate on every batch with ``params`` and store the outputs as epoch ``epoch``;
        return the epoch's accuracy."""
        batches = self.batches() if callable(self.batches) else self.batches
        chunks, labels, shapes, stats = [], [], [], []
        for x, y in batches:
            out = self._logits(params, x)
            shapes.append(tuple(out.shape))
            check_class_counts(shapes[:1] + shapes[-1:], epoch)  # this batch vs the first
            if not getattr(out, "is_fully_addressable", True):
                raise ForgetkitError(f"epoch {epoch}: the outputs span several processes "
                                     f"(jax.process_count() = {jax.process_count()}); record "
                                     "each process's addressable data with its own recorder")
            y = np.asarray(y).reshape(-1)
            if len(y) != len(out):
                raise ForgetkitError(f"epoch {epoch}: a batch of {len(out)} outputs came with "
                                     f"{len(y)} labels")
            stats.append(_stats(out, y))
            chunks.append(_summary_rows(out, y) if self._device_summary else out)
            labels.append(y)
        if not chunks:
            raise ForgetkitError(f"epoch {epoch}: the data yielded no batch (an empty loader, "
                                 "or a used-up iterator: pass a list or a callable)")
        n_correct, n_bad = np.sum(jax.device_get(stats), axis=0)
        if n_bad:
            raise ForgetkitError(f"outputs of epoch {epoch} contain NaN or inf (in "
                                 f"{self.dtype}); not stored")
        labels = np.concatenate(labels)
        summary = self._device_summary

        def host():
            arr = np.concatenate([np.asarray(c) for c in jax.device_get(chunks)])
            return arr.view(SUMMARY_DTYPE).reshape(-1) if summary else arr

        self._commit(epoch, host, labels, shapes[0][-1])
        return float(n_correct / len(labels))


@jax.jit
def _stats(out, labels):
    """(correct count, non-finite count) of a batch of outputs."""
    return jnp.stack([jnp.sum(jnp.argmax(out, axis=1) == labels),
                      jnp.sum(~jnp.isfinite(out))])


@jax.jit
def _summary_rows(out, labels):
    """The summary of logits (B, C) as float32 (B, 4): label logit, largest other logit, its
    class (int32 bits), log-sum-exp (rows of SUMMARY_DTYPE when viewed as such)."""
    z = out.astype(jnp.float32)
    rows = jnp.arange(z.shape[0])
    label = z[rows, labels]
    masked = z.at[rows, labels].set(-jnp.inf)
    other_class = jnp.argmax(masked, axis=1).astype(jnp.int32)
    other = masked[rows, other_class]
    lse = jax.nn.logsumexp(z, axis=1)
    bits = jax.lax.bitcast_convert_type(other_class, jnp.float32)
    return jnp.stack([label, other, bits, lse], axis=1)
