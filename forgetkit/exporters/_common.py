"""Framework-free part of the recorders: the RunWriter they feed and the label checks."""

from __future__ import annotations

import numpy as np

from ..io import RunWriter


class RecorderBase:
    """Opens the RunWriter on the first epoch (when N and C are known) and checks that later
    epochs see the same samples in the same order."""

    def __init__(self, path, *, dtype, kind, format, layout, meta, class_names, mode):
        self.path = path
        self.dtype = np.dtype(dtype)
        self._writer_options = dict(kind=kind, dtype=self.dtype, format=format, layout=layout,
                                    meta=meta, class_names=class_names, mode=mode)
        self._writer = None
        self._labels = None

    def _store(self, epoch, outputs, labels):
        """Append ``outputs`` (N, C) numpy of epoch ``epoch`` with the loader's labels (N,);
        return the epoch's accuracy."""
        labels = np.asarray(labels).astype(np.int64).reshape(-1)
        if self._labels is None:
            self._labels = labels
            self._writer = RunWriter(self.path, outputs.shape[0], outputs.shape[1],
                                     labels=labels, **self._writer_options)
        elif labels.shape != self._labels.shape or not np.array_equal(labels, self._labels):
            raise ValueError(
                f"epoch {epoch}: the data yielded other labels than at the first recorded "
                "epoch; the evaluation data must come in the same order every epoch "
                "(shuffle=False)"
            )
        self._writer.append(epoch, outputs)
        return float(np.mean(np.argmax(outputs, axis=1) == labels))

    @property
    def epochs(self):
        """Epoch numbers stored so far."""
        return [] if self._writer is None else list(self._writer.epochs)

    def close(self):
        """Finish the run file (Parquet: merge the staged epochs)."""
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            self._writer.abort()


def check_class_counts(chunks, epoch):
    """Raise if the batches of one epoch disagree on the number of classes."""
    counts = sorted({int(c.shape[-1]) for c in chunks})
    if len(counts) > 1:
        raise ValueError(f"epoch {epoch}: the model returned {counts} classes in different "
                         "batches; every batch must give (batch, n_classes) outputs")
    if chunks and chunks[0].ndim != 2:
        raise ValueError(f"epoch {epoch}: model outputs must have shape (batch, n_classes); "
                         f"got {tuple(chunks[0].shape)} (use output_fn to pick the logits)")
