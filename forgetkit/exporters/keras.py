"""Record a Keras 3 model's outputs on fixed data at the end of every epoch (any backend:
JAX, PyTorch or TensorFlow).

    from forgetkit.exporters.keras import LogitRecorderCallback

    model.fit(x_train, y_train, epochs=20,
              callbacks=[LogitRecorderCallback("run.npy", (x_test, y_test))])
"""

from __future__ import annotations

import keras
import numpy as np

from .._progress import Progress
from ..errors import CorruptFileError, ForgetkitError
from ._checkpoints import ReplayLog, checkpoint_files, content_hash, existing_run, ordered
from ._common import RecorderBase, check_class_counts

__all__ = ["LogitRecorderCallback", "replay"]

#: File suffixes read as Keras checkpoints (a folder given as ``checkpoints``).
SUFFIXES = (".keras", ".weights.h5", ".h5")


def as_labels(y):
    """Class labels (n,) of integer labels or one-hot / probability rows (n, C)."""
    y = np.asarray(y)
    return y.argmax(axis=1) if y.ndim == 2 and y.shape[1] > 1 else y.reshape(-1)


class KerasRecorder(RecorderBase):
    """The recorder behind `LogitRecorderCallback`: ``record(model, epoch)`` evaluates
    ``model`` on ``data`` and queues the outputs for writing."""

    def __init__(self, path, data, *, batch_size=1024, **options):
        super().__init__(path, **options)
        self.data = data
        self.batch_size = batch_size

    def record(self, model, epoch, *, meta=None):
        """Store ``model``'s outputs on the data as epoch ``epoch`` (with the run's metadata
        ``meta`` if given); return its accuracy."""
        if isinstance(self.data, tuple) and len(self.data) == 2:
            x, y = self.data
            outputs = [model.predict(x, batch_size=self.batch_size, verbose=0)]
            labels = [as_labels(y)]
        else:
            batches = self.data() if callable(self.data) else self.data
            outputs, labels = [], []
            for x, y in batches:
                outputs.append(model.predict_on_batch(x))
                labels.append(as_labels(y))
        outputs = [np.asarray(keras.ops.convert_to_numpy(o)) for o in outputs]
        if not outputs:
            raise ForgetkitError(f"epoch {epoch}: the data yielded no batch (pass a list or a "
                                 "callable returning a fresh iterator, not a used-up one)")
        check_class_counts([o.shape for o in outputs], epoch)
        with np.errstate(over="ignore"):  # overflow to inf is reported just below
            values = np.concatenate(outputs).astype(self.dtype)
        labels = np.concatenate(labels)
        if len(labels) != len(values):
            raise ForgetkitError(f"epoch {epoch}: {len(values)} outputs came with "
                                 f"{len(labels)} labels")
        if not np.isfinite(values).all():
            raise ForgetkitError(f"outputs of epoch {epoch} contain NaN or inf (in "
                                 f"{self.dtype}); not stored")
        self._commit(epoch, values, labels, values.shape[1], meta=meta)  # summarised there
        return float(np.mean(np.argmax(values, axis=1) == labels))


class LogitRecorderCallback(keras.callbacks.Callback):
    """A Keras 3 callback that stores the model's outputs on ``data`` after every epoch
    (epoch numbers as Keras counts them, from 0) and closes the run when training ends.

    Parameters
    ----------
    path : str or Path
        ``.npy`` or ``.parquet`` run file (``.npy`` with ``summary=True``); an existing run
        is appended to.
    data : (x, y) pair of arrays, or a re-iterable of (x, y) batches (a list, a
        ``keras.utils.PyDataset``, a torch DataLoader), or a callable returning a fresh
        iterator. ``y``: class labels, or one-hot rows.
    batch_size : int, default 1024, for an (x, y) pair.
    **options
        The recorder options (`forgetkit.exporters._common.RecorderOptions`: ``dtype``,
        ``summary``, ``sample_ids``, ``max_pending``, ``kind``, ``format``, ``layout``,
        ``meta``, ``class_names``, ``mode``, ``durable``), as for
        `forgetkit.exporters.torch.LogitRecorder`. ``kind="probs"`` for a model whose last
        layer is a softmax.

    Attributes
    ----------
    recorder : KerasRecorder
    accuracy_ : list of float, the recorded accuracy of each epoch
    """

    def __init__(self, path, data, *, batch_size=1024, **options):
        super().__init__()
        self.recorder = KerasRecorder(path, data, batch_size=batch_size, **options)
        self.accuracy_ = []

    def on_epoch_end(self, epoch, logs=None):
        self.accuracy_.append(self.recorder.record(self.model, epoch))

    def on_train_end(self, logs=None):
        self.recorder.close()


def weights_hash(model):
    """The SHA-256 content hash of a Keras model's weights (in the model's order)."""
    items = []
    for i, w in enumerate(model.get_weights()):
        w = np.ascontiguousarray(w)
        items.append((str(i), w.dtype.name, w.shape, w.reshape(-1).view(np.uint8)))
    return content_hash(items)


def replay(model, checkpoints, data, path, *, epochs=None, batch_size=1024,
           on_duplicate="warn", progress=True, **options):
    """Evaluate every saved checkpoint of a Keras 3 training on ``data`` and write the run
    that `LogitRecorderCallback` would have written while it trained.

    Parameters
    ----------
    model : keras.Model
        The trained architecture; each checkpoint's weights are loaded into it in turn
        (``model.load_weights``, which reads ``.keras`` and ``.weights.h5`` files).
    checkpoints : str, Path or list
        A glob pattern, a folder or a list of files (``ModelCheckpoint``'s, e.g.
        ``"ckpt/model_{epoch:02d}.weights.h5"``).
    data, batch_size : as for `LogitRecorderCallback`.
    path : str or Path, the run (``.npy`` or ``.parquet``).
    epochs : list of int, optional
        Epoch numbers in the order given. Default: the last integer of each file name (which
        Keras's ``{epoch}`` counts from 1; the callback records from 0).
    on_duplicate, progress, **options
        As for `forgetkit.exporters.torch.replay`; ``options`` are the recorder options.

    Returns
    -------
    Run, with ``meta["replay"]["checkpoints"]`` (file and content hash per epoch).
    """
    from ..io import load

    files = checkpoint_files(checkpoints, suffixes=SUFFIXES)
    order = ordered(files, epochs=epochs)
    log = ReplayLog(existing_run(path, options.get("mode", "a")), options.get("meta"),
                    on_duplicate, path)
    recorder = KerasRecorder(path, data, batch_size=batch_size, **options)
    bar = Progress(len(order), f"replay into {path}", enabled=progress, unit="checkpoints")
    written = 0

    def load_weights(checkpoint):
        try:
            model.load_weights(checkpoint.file)
        except Exception as err:
            message = " ".join(str(err).split())[:300]
            raise CorruptFileError(f"cannot load checkpoint {checkpoint.file!r} into the "
                                   f"model (truncated, or another architecture?): "
                                   f"{message}") from None
        return weights_hash(model)

    start = log.resume(order, load_weights)
    bar.update(start)
    with recorder:
        for checkpoint in order[start:]:
            digest = load_weights(checkpoint)
            if log.admit(checkpoint, digest):
                recorder.record(model, checkpoint.epoch, meta=log.meta_with(checkpoint, digest))
                written += 1
            bar.update()
    if written == 0 and not log.stored:
        raise ForgetkitError(f"no checkpoint was replayed into {str(path)!r}")
    return load(path)
