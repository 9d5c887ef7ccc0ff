"""Weight space: averages of the same checkpoints that output-space fusion mixes, and the
comparison of the two under the paper's split-half protocol (PyTorch).

A weight average of checkpoints S with weights w: every floating parameter and buffer is
sum_s w_s theta_s (uniform by default; accumulated in float64, stored at the model's
dtype); integer buffers (BatchNorm's ``num_batches_tracked``) come from the last checkpoint
of S; BatchNorm running statistics are then re-estimated on training data in train mode
with a cumulative average, as ``torch.optim.swa_utils.update_bn`` does. EMA over the
checkpoint sequence with decay d: theta <- d theta + (1 - d) theta_e in epoch order,
starting from the first, i.e. the weights of `ema_weights`. The greedy soup (Wortsman et
al. 2022): checkpoints sorted by validation accuracy, start with the best, add the next if
the average's validation accuracy does not fall.

A weight average is one model: one forward pass per sample at inference, against k for an
output-space fusion of k checkpoints.
"""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pandas as pd
import torch

from .. import evaluate
from ..errors import ForgetkitError, InputTypeError
from ..probs import softmax
from ..run import check_run
from ..splits import split_indices
from ._checkpoints import hash_pool
from ._torch_devices import batches_of, default_output, forward, split_batch, to_device
from ._torch_replay import fit_keys, ordered_checkpoints, read_checkpoint

#: Uniform averages of the last n checkpoints that `compare_weight_space` adds by default.
DEFAULT_LAST = (2, 5, 10)
#: EMA decays that `compare_weight_space` adds by default.
DEFAULT_DECAYS = (0.5, 0.8, 0.9)


# ------------------------------------------------------------------ checkpoints
def checkpoint_list(checkpoints, *, epochs=None, trust_pickle=False):
    """The checkpoints of ``checkpoints`` (files, folders or glob patterns, as `replay` takes
    them) in the order of their epoch numbers: a list of `Checkpoint`."""
    pool = hash_pool()
    try:
        return ordered_checkpoints(checkpoints, epochs=epochs, trust_pickle=trust_pickle,
                                   pool=pool)
    finally:
        pool.shutdown(wait=False)


def ema_weights(n, decay):
    """The weights (n,) of EMA over a sequence of n checkpoints with ``decay`` d:
    d**(n-1) for the first, (1 - d) d**(n-1-i) for checkpoint i >= 1 (they sum to 1)."""
    if not 0.0 <= decay < 1.0:
        raise ForgetkitError(f"decay must be in [0, 1); got {decay!r}")
    i = np.arange(n)
    w = (1.0 - decay) * decay ** (n - 1 - i).astype(np.float64)
    w[0] = decay ** (n - 1)
    return w


def _check_weights(weights, n):
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ForgetkitError(f"weights must hold one number per checkpoint ({n}); got shape "
                             f"{w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ForgetkitError("weights must be finite and >= 0")
    if not np.isclose(w.sum(), 1.0, rtol=0, atol=1e-9):
        raise ForgetkitError(f"weights must sum to 1 (an average); they sum to {w.sum():.6g}")
    return w


def read_state_file(checkpoint, *, trust_pickle=False):
    """The state dict of a checkpoint file (`Checkpoint`), mapped into memory."""
    return read_checkpoint(checkpoint.file, trust_pickle=trust_pickle, mmap=True)[0]


def averaged_state(model, checkpoints, weights, *, read, device="cpu"):
    """The state dict of the average (see the module docstring) of ``checkpoints`` (in
    epoch order) with ``weights`` (n,), keys and dtypes the model's; ``read(checkpoint)``
    gives a checkpoint's state dict (`read_state_file`, a Hugging Face folder's). The
    float64 sums are kept on ``device`` (the model's GPU makes them fast; IEEE products and
    sums give the same bits there as on the CPU)."""
    reference = model.state_dict()
    keys = list(reference)
    acc, last = {}, None
    for ck, w in zip(checkpoints, weights, strict=True):
        if w == 0:
            continue
        state = fit_keys(read(ck), keys, ck.file)
        for k in keys:
            value = state[k]
            if value.shape != reference[k].shape:
                raise ForgetkitError(f"checkpoint {ck.file!r} does not fit the model: {k!r} "
                                     f"has shape {tuple(value.shape)}, the model's "
                                     f"{tuple(reference[k].shape)}")
            if value.is_floating_point():
                term = value.detach().to(device, torch.float64) * float(w)
                acc[k] = term if k not in acc else acc[k].add_(term)
        last = state
    if last is None:
        raise ForgetkitError("an average needs at least one checkpoint with a weight > 0")
    return {k: acc[k].to(reference[k].dtype) if k in acc else last[k].clone() for k in keys}


def batch_norm_layers(model):
    """{name: layer} of the model's BatchNorm layers that keep running statistics."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats}


def _device_of(model, device):
    if device is not None:
        return torch.device(device)
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


@torch.no_grad()
def update_batch_norm(model, batches, *, label_key="labels", device=None):
    """Re-estimate the BatchNorm running statistics of ``model`` on ``batches`` (a list of
    batches, `batches_of`): statistics reset, momentum None (a cumulative average), train
    mode for the passes, then the momenta and mode restored; what
    ``torch.optim.swa_utils.update_bn`` computes."""
    layers = list(batch_norm_layers(model).values())
    if not layers:
        return model
    momenta = {m: m.momentum for m in layers}
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
    was_training = model.training
    model.train()
    device = _device_of(model, device)
    try:
        for batch in batches:
            args, kwargs, _ = split_batch(to_device(batch, device), label_key)
            forward(model, args, kwargs, "bn_data")
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        model.train(was_training)
    return model


def average_weights(model, checkpoints, *, weights=None, epochs=None, bn_data=None,
                    batch_size=256, label_key="labels", device=None, trust_pickle=False):
    """Load into ``model`` the average of the checkpoints' weights, and return it.

    Parameters
    ----------
    model : torch.nn.Module
        An instance of the trained architecture (its weights are replaced).
    checkpoints : str, Path or list
        As `forgetkit.exporters.torch.replay` takes them: files, a folder, glob patterns;
        state dicts (Lightning's and DDP's prefixes matched), ``.safetensors``.
    weights : array-like of float (n_checkpoints,), optional
        Non-negative, summing to 1, in the order of the epoch numbers (default uniform).
    epochs : list of int, optional
        The checkpoints' epoch numbers (default: their own, else the last integer of the
        file name), which order them.
    bn_data : what `LogitRecorder` takes as data, optional
        Training data on which BatchNorm running statistics are re-estimated (train mode,
        cumulative average). Without it a model with BatchNorm layers keeps the averaged
        statistics, with a warning naming the layers.
    batch_size, label_key : for ``bn_data``, as for `replay`.
    device : where the BatchNorm passes run (default: where the model is).
    trust_pickle : bool, default False
        Load with ``weights_only=False`` (only for files you trust).

    Returns
    -------
    torch.nn.Module
        ``model``, holding the average.
    """
    if not isinstance(model, torch.nn.Module):
        raise InputTypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    order = checkpoint_list(checkpoints, epochs=epochs, trust_pickle=trust_pickle)
    return load_average(model, order, weights, read=partial(read_state_file,
                                                            trust_pickle=trust_pickle),
                        bn_data=bn_data, batch_size=batch_size, label_key=label_key,
                        device=device)


def load_average(model, checkpoints, weights, *, read, bn_data=None, batch_size=256,
                 label_key="labels", device=None):
    """`average_weights` of ``checkpoints`` (in epoch order) whose states ``read`` gives
    (see `averaged_state`): the average loaded into ``model``, BatchNorm re-estimated on
    ``bn_data``."""
    w = _check_weights(weights, len(checkpoints))
    model.load_state_dict(averaged_state(model, checkpoints, w, read=read,
                                         device=_device_of(model, device)))
    _batch_norm(model, None if bn_data is None else batches_of(
        bn_data, batch_size=batch_size, label_key=label_key), label_key, device)
    return model


def _batch_norm(model, bn_batches, label_key, device):
    if bn_batches is not None:
        update_batch_norm(model, bn_batches, label_key=label_key, device=device)
        return
    layers = list(batch_norm_layers(model))
    if layers:
        shown = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4
                                         else "")
        warnings.warn(f"the model has BatchNorm layers ({shown}) whose running statistics are "
                      "averaged, not re-estimated: pass bn_data= (training data) to "
                      "re-estimate them", stacklevel=3)


# ------------------------------------------------------------------ greedy soup
def greedy_soup(val_accuracy, soup_accuracy):
    """The greedy soup's ingredients, in the order added.

    Parameters
    ----------
    val_accuracy : array-like of float (n_checkpoints,)
        Each checkpoint's own validation accuracy: the order of the candidates (highest
        first; ties by position).
    soup_accuracy : callable
        ``soup_accuracy(indices)``: the validation accuracy of the uniform weight average of
        the checkpoints at ``indices``.

    Returns
    -------
    list of int
        The best checkpoint, then each next one whose addition does not lower the soup's
        validation accuracy.
    """
    order = np.argsort(-np.asarray(val_accuracy, dtype=np.float64), kind="stable")
    soup = [int(order[0])]
    best = soup_accuracy(soup)
    for c in order[1:]:
        acc = soup_accuracy(soup + [int(c)])
        if acc >= best:
            soup.append(int(c))
            best = acc
    return soup


# ------------------------------------------------------------------ comparison
@torch.no_grad()
def predict_proba(model, batches, *, label_key="labels", output_fn=None, device=None):
    """(softmax probabilities float64 (N, C), labels int64 (N,)) of ``model`` in eval mode
    on ``batches`` (`batches_of`)."""
    output_fn = output_fn or default_output
    was_training = model.training
    model.eval()
    device = _device_of(model, device)
    logits, labels = [], []
    try:
        for batch in batches:
            args, kwargs, y = split_batch(to_device(batch, device), label_key)
            out = output_fn(forward(model, args, kwargs, "data"))
            logits.append(out.detach().to("cpu", torch.float64))
            labels.append(torch.as_tensor(y).reshape(-1).to("cpu", torch.int64))
    finally:
        model.train(was_training)
    return softmax(torch.cat(logits).numpy()), torch.cat(labels).numpy()


class Scores:
    """A model's results on a run's samples: ``hit`` bool (N,) (the argmax is the label),
    ``label_prob`` float64 (N,) (the label's probability), and for a full run ``probs``
    float64 (N, C) with ``labels`` (N,) (None for a token run: its vocabulary-wide outputs
    are not kept)."""

    def __init__(self, hit, label_prob, probs=None, labels=None):
        self.hit, self.label_prob, self.probs, self.labels = hit, label_prob, probs, labels

    def metrics(self, rows):
        """(hit (R,), NLL, ECE) at ``rows``: `forgetkit.evaluate.prediction_metrics`, or
        for a token run the exact NLL of the targets and ECE nan (as `compare` gives)."""
        if self.probs is not None:
            return evaluate.prediction_metrics(self.probs[rows], self.labels[rows])
        nll = float(-np.mean(np.log(np.clip(self.label_prob[rows], 1e-12, None))))
        return self.hit[rows], nll, float("nan")


def _host(values):
    """``values`` (a tensor on any device, or array-like) as a numpy array."""
    return values.detach().cpu().numpy() if torch.is_tensor(values) else np.asarray(values)


class _Evaluator:
    """The model's `Scores` on the run's samples: a full run's from the softmax of its
    logits on ``data``; a top-k token run's from a one-checkpoint run that
    `TokenRecorder` writes (with the run's k) in a temporary folder, whose tokens must be
    the run's."""

    def __init__(self, run, data, *, batch_size, label_key, output_fn, device,
                 sequence_ids=None):
        self.run, self.label_key = run, label_key
        self.output_fn, self.device = output_fn, device
        self.tokens = run.top_k is not None
        if self.tokens:
            self.data, self.batch_size, self.sequence_ids = data, batch_size, sequence_ids
            return
        if sequence_ids is not None:
            raise ForgetkitError("sequence_ids is for a top-k token run; this run holds "
                                 f"{run.kind} outputs")
        self.batches = batches_of(data, batch_size=batch_size, label_key=label_key)
        labels = np.concatenate([_host(split_batch(b, label_key)[2]).reshape(-1)
                                 for b in self.batches])
        if labels.shape != run.labels.shape or not np.array_equal(labels, run.labels):
            raise ForgetkitError(f"data's {labels.shape[0]} labels are not the run's "
                                 f"{run.n_samples}: the run's samples, in its row order, are "
                                 "needed")

    def __call__(self, model):
        if not self.tokens:
            probs, labels = predict_proba(model, self.batches, label_key=self.label_key,
                                          output_fn=self.output_fn, device=self.device)
            return Scores(np.argmax(probs, axis=1) == labels,
                          probs[np.arange(len(labels)), labels], probs, labels)
        import tempfile

        from ..io import load
        from ._torch_tokens import TokenRecorder

        with tempfile.TemporaryDirectory() as tmp:
            recorder = TokenRecorder(f"{tmp}/average.npy", self.data, top_k=self.run.top_k,
                                     batch_size=self.batch_size, label_key=self.label_key,
                                     sequence_ids=self.sequence_ids,
                                     output_fn=self.output_fn, durable=False)
            try:
                recorder.record(model, 0)
            finally:
                recorder.close()
            one = load(f"{tmp}/average.npy")
            same = (one.n_samples == self.run.n_samples
                    and np.array_equal(one.labels, self.run.labels)
                    and np.array_equal(one.sequence_ids, self.run.sequence_ids)
                    and np.array_equal(one.positions, self.run.positions))
            if not same:
                raise ForgetkitError(f"data's {one.n_samples} target tokens are not the run's "
                                     f"{self.run.n_samples} (the same sequences, positions "
                                     "and targets, in the run's order, are needed)")
            return Scores(np.asarray(one.correctness()[0]), one.label_probs()[:, 0])


class _Averages:
    """`Scores` of the weight averages of ``order`` (read by ``read``), each computed once
    (BatchNorm statistics re-estimated on ``bn_batches`` when given)."""

    def __init__(self, model, order, read, evaluator, bn_batches, *, label_key, device):
        self.model, self.order, self.read, self.evaluator = model, order, read, evaluator
        self.bn_batches, self.label_key, self.device = bn_batches, label_key, device
        self._done = {}

    def scores(self, weights):
        key = tuple(np.round(weights, 15))
        if key not in self._done:
            self.model.load_state_dict(averaged_state(
                self.model, self.order, weights, read=self.read,
                device=_device_of(self.model, self.device)))
            if self.bn_batches is not None:
                update_batch_norm(self.model, self.bn_batches, label_key=self.label_key,
                                  device=self.device)
            self._done[key] = self.evaluator(self.model)
        return self._done[key]

    def uniform(self, indices):
        w = np.zeros(len(self.order))
        w[list(indices)] = 1.0 / len(indices)
        return self.scores(w)


def _labels(names):
    """Labels of the comparison table's rows: `forgetkit.evaluate.METHODS` and the weight
    averages ``names``."""
    labels = dict(evaluate.METHODS)
    for name in names:
        if name.startswith("last"):
            labels[name] = f"weights: mean of last {name[4:]}"
        elif name.startswith("ema"):
            labels[name] = f"weights: EMA {name[3:]}"
    labels["soup"] = "weights: greedy soup"
    return labels


def compare_weight_space(model, checkpoints, data, run, *, bn_data=None, val_frac=0.5,
                         seeds=(0, 1, 2), last=DEFAULT_LAST, decays=DEFAULT_DECAYS, soup=True,
                         epochs=None, batch_size=256, label_key="labels", output_fn=None,
                         device=None, window=1, sequence_ids=None, trust_pickle=False,
                         progress=False):
    """`forgetkit.compare`'s table for ``run`` with weight-space rows, on the same split halves.

    Parameters
    ----------
    model : torch.nn.Module
        The trained architecture (its weights are replaced while the averages are scored).
    checkpoints : as `average_weights` takes them: the checkpoints of ``run``'s epochs.
    data : what `LogitRecorder` takes (`TokenRecorder` for a top-k token run)
        The samples of ``run``, in its row order (their labels must be the run's; a token
        run's tokens, the same sequences, positions and targets).
    run : Run
        The checkpoints' outputs on ``data`` (recorded, or written by `replay`): one epoch
        per checkpoint, the same epoch numbers.
    bn_data : training data, optional
        Re-estimates BatchNorm statistics of every average (see `average_weights`).
    val_frac, seeds, window : as in `forgetkit.compare`.
    last : tuple of int
        Uniform averages of the last n checkpoints (n larger than the run is left out).
    decays : tuple of float
        EMA over the checkpoint sequence with these decays.
    soup : bool, default True
        The greedy soup, chosen on each split's validation half (checkpoints ordered by
        their own validation accuracy, read from ``run``).
    epochs, batch_size, label_key, output_fn, device, trust_pickle : as for `replay`.
    sequence_ids : array-like, optional
        A token run's: the ids of ``data``'s sequences as the run stores them (as
        `TokenRecorder` takes them); default 0, 1, ...

    Returns
    -------
    DataFrame
        `forgetkit.compare`'s columns, one row per method (output-space methods first), with
        ``space`` ("output" or "weight") and ``forward_passes``: forward passes per sample at
        inference (k for an output-space fusion of k checkpoints, 1 for a weight average).
    """
    check_run("run", run)
    if not isinstance(model, torch.nn.Module):
        raise InputTypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    order = checkpoint_list(checkpoints, epochs=epochs, trust_pickle=trust_pickle)
    return compare_averages(model, order, partial(read_state_file, trust_pickle=trust_pickle),
                            data, run, bn_data=bn_data, val_frac=val_frac, seeds=seeds,
                            last=last, decays=decays, soup=soup, batch_size=batch_size,
                            label_key=label_key, output_fn=output_fn, device=device,
                            window=window, sequence_ids=sequence_ids, progress=progress)


def compare_averages(model, order, read, data, run, *, bn_data=None, val_frac=0.5,
                     seeds=(0, 1, 2), last=DEFAULT_LAST, decays=DEFAULT_DECAYS, soup=True,
                     batch_size=256, label_key="labels", output_fn=None, device=None,
                     window=1, sequence_ids=None, progress=False):
    """`compare_weight_space` of the checkpoints ``order`` (`Checkpoint` list in epoch
    order) whose state dicts ``read(checkpoint)`` gives (PyTorch files, Hugging Face
    folders)."""
    check_run("run", run)
    numbers = [c.epoch for c in order]
    if numbers != [int(e) for e in run.epochs]:
        raise ForgetkitError(f"the checkpoints' epoch numbers {numbers[:6]}... are not the "
                             f"run's {list(map(int, run.epochs[:6]))}...: pass epochs= or the "
                             "run of these checkpoints")
    evaluator = _Evaluator(run, data, batch_size=batch_size, label_key=label_key,
                           output_fn=output_fn, device=device, sequence_ids=sequence_ids)
    bn_batches = None if bn_data is None else batches_of(bn_data, batch_size=batch_size,
                                                         label_key=label_key)
    if bn_batches is None:
        _batch_norm(model, None, label_key, device)
    averages = _Averages(model, order, read, evaluator, bn_batches, label_key=label_key,
                         device=device)
    n = len(order)
    candidates = {}
    for m in sorted({int(m) for m in last if 1 <= int(m) <= n}):
        w = np.zeros(n)
        w[n - m:] = 1.0 / m
        candidates[f"last{m}"] = w
    for d in decays:
        candidates[f"ema{d:g}"] = ema_weights(n, float(d))
    fixed = {name: averages.scores(w) for name, w in candidates.items()}

    long = evaluate.compare_splits(run, seeds=seeds, val_frac=val_frac, window=window,
                                   progress=progress)
    rows = []
    correct = run.correctness() if soup else None
    for s in seeds:
        val, test = split_indices(run.n_samples, val_frac, seed=s)
        single = evaluate.single_hit(run.isel(samples=test))
        scored = dict(fixed)
        if soup:
            own = correct[:, val].mean(axis=1)

            def soup_accuracy(indices, val=val):
                return float(np.mean(averages.uniform(indices).hit[val]))

            scored["soup"] = averages.uniform(greedy_soup(own, soup_accuracy))
        for name, scores in scored.items():
            hit, nll_, ece_ = scores.metrics(test)
            row = {"split": s, "method": name, "k": 1.0, "accuracy": 100 * hit.mean(),
                   "gain": 100 * (hit.mean() - single.mean()), "nll": nll_, "ece": ece_,
                   "p_value": evaluate.mcnemar(hit, single)}
            if "accuracy_low" in long:  # a top-k run: one model's accuracy is exact
                row.update(accuracy_low=row["accuracy"], accuracy_high=row["accuracy"])
            rows.append(row)
    long["space"] = "output"
    weight_rows = pd.DataFrame(rows).assign(space="weight")
    table = evaluate.table_of_splits(pd.concat([long, weight_rows], ignore_index=True),
                                     method_labels=_labels(candidates))
    table["space"] = ["weight" if m in set(weight_rows["method"]) else "output"
                      for m in table.index]
    table["forward_passes"] = table["k"]
    return table
