"""Certified fusion on top-k token runs: every fuser's prediction is a mixture
q = sum_e w_e p_e of checkpoints, and a top-k run holds each checkpoint's k largest
probabilities and the target's, not the others. For each token this module bounds q for
every class (exact for the target), and certifies the fused prediction where it holds for
every completion of the unstored probabilities.

For checkpoint e and a class c it did not store, 0 <= p_e(c) <= u_e = min(p_e(its k-th
stored class), max(0, 1 - the sum of its stored probabilities)) (the k top ones and the
target's). Each fuser's recipe (`Fuser.recipe`: means, weighted sums and Knowledge Fusion's
mixing steps, all with nonnegative coefficients) applied to the upper values (p_e(c) where
stored, else u_e) and to the lower values (p_e(c) where stored, else 0) gives U(c) and L(c)
for the classes some checkpoint stored, B (the upper bound of every class stored by none),
and the target's q(y) exactly. The prediction is the class of largest lower bound (ties: the
lowest id); it is *certified* when that bound beats every other class's upper bound and B;
the token is *certified correct* when q(y) beats every other upper bound, *certified wrong*
when some class's lower bound beats q(y), else *uncertain*. Accuracy is then the interval
[certified correct, N - certified wrong] / N.

With k equal to the vocabulary every class is stored, the values are the softmax of the
stored logits (the arithmetic of a logits run), and every result equals the full run's.

See docs/definitions.md ("Certified fusion on top-k runs").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import kernels
from ..errors import ForgetkitError
from ..kinds.topk import (  # noqa: F401 (TopKData: its old home)
    CHUNK_TOKENS,
    FIT_CHUNK_TOKENS,
    TopKData,
    cache_array,
    correct,
    token_ids,
)
from .fitstate import REL_BAND, FitChunk

#: What a top-k run cannot give, for the errors of the methods that need every class.
TOPK_HOLDS = ("a top-k run holds, per checkpoint and token, the k largest logits with their "
              "ids, the target's logit and the log-sum-exp: the probabilities of the other "
              "classes are bounded, not known")


#: A layout's record cache where it keeps none (each window makes its own).
NO_CACHE = np.empty((0, 0, 0))


class Layout:
    """The classes of tokens ``rows`` (a slice) that a mixture of checkpoints ``epochs`` can
    hold: ``cls`` (n, M) ascending class ids per token (every class stored by one of the
    epochs, the target, the unstored slot, padding; ``classes`` the same before each row's
    padding), ``ends`` (n,) the columns before each row's padding, ``label_col`` and
    ``unstored_col`` (n,); ``cols`` (n, E, k) the column of
    each stored id; the tokens ``src`` (int64 (n,), of ``rows``), whose targets are
    ``targets``.

    With ``settle`` (``epochs`` every epoch, k < vocabulary), the tokens that one class
    beats at every checkpoint by a margin (`kernels.topk.settle_scan`: the final
    checkpoint's largest class other than the target, a class stored above the target where
    that one fails, or the unstored slot) are left out: no sum or mixture of their bounds
    with nonnegative weights ranks the target first. ``settled`` (bool, one per token of
    ``rows``) marks them; ``src`` holds the others.

    With ``cache`` (default: ``settle``), the layout keeps the probabilities of the records
    of its tokens (``cache``, `kernels.topk_record_cache`: (k + 2) float64 per record)
    where `forgetkit.kinds.topk.CACHE_BYTES` has room for them in this process, so that
    its windows read no record twice; otherwise ``cache`` is `NO_CACHE` and each
    window makes its records' probabilities (`read`). The layout keeps views of the records
    only for that, and only where they are an array here (`TopKData.holds_records`): on a
    worker it keeps no record, so that what it read can be freed. ``spans`` holds each
    token's bounds over every epoch that a selection's first round makes and its other
    rounds read (`selection_scores`).

    ``hits`` (bool (W, n), with ``hits=True``): whether the target is the argmax of each
    record of the tokens ``src`` at ``epochs``, read in the pass that makes the cache (or
    the floors), as the fit needs them; a settled token's are all False (its settling
    class beats the target at every checkpoint)."""

    def __init__(self, data, epochs, rows, *, settle=False, cache=None, hits=False):
        self.rows, self.vocab = rows, data.vocab_size
        self.spans = None
        targets = data.targets[rows]
        n = targets.shape[0]
        self.targets, self.settled = targets, np.zeros(n, dtype=bool)
        self.cache, self.hits = NO_CACHE, None
        if data.exact:
            if hits:
                self.hits = correct(np.asarray(data.records[_indices(epochs), rows]), targets)
            self.classes = np.ascontiguousarray(np.broadcast_to(
                np.arange(data.vocab_size, dtype=np.int32), (n, data.vocab_size)))
            self._cls = self.classes
            self.label_col = targets.copy()
            self.unstored_col = np.full(n, -1, dtype=np.int64)
            self.ends = np.full(n, data.vocab_size, dtype=np.int64)
        else:
            fields, self.epochs = data.fields(rows), _indices(epochs)
            if settle:
                self.settled = kernels.topk_settle(
                    fields, self.epochs, np.arange(n, dtype=np.int64), targets,
                    data.vocab_size, _rival(fields[1][-1], targets))
            self.src = np.flatnonzero(~self.settled)
            self.targets = targets[self.src]
            args = (fields, self.epochs, self.src, self.targets, data.vocab_size)
            kept = cache_array((self.epochs.size, self.src.size, data.top_k + 2)) \
                if (settle if cache is None else cache) else None
            if hits:
                self.hits = np.empty((self.epochs.size, self.src.size), dtype=bool)
            if kept is not None:
                self.cache, floor = kept, kernels.topk_record_cache(*args, kept, self.hits)
            else:
                floor = kernels.topk_floors(*args, self.hits)
            self.classes, self.ends, self.label_col, self.unstored_col, self.cols = \
                kernels.topk_layout(*args, floor)
            self._cls = None
            self.fields = fields if kept is None and data.holds_records else None
        self.width = self.classes.shape[1] if data.exact else \
            (int(self.ends.max()) if self.ends.size else 0)

    @property
    def cls(self):
        """int32 (n, M): each token's classes, its unstored slot and padding (made on first
        use, `kernels.topk_padded`: the certificates read it; the fit and the selection read
        only the columns)."""
        if self._cls is None:
            self._cls = kernels.topk_padded(self.classes, self.ends, self.vocab)
        return self._cls

    def read(self, data, epochs):
        """What the window kernels read for the checkpoints ``epochs`` (int64 (W,),
        ascending, of the layout's): (the records' probabilities (`kernels.topk_record_cache`),
        ``cols``, the epochs' rows in ``cols``, their rows in those probabilities). Where the
        layout keeps no cache, the window's are made here, from its views of the records or
        from those epochs read here."""
        pos = np.searchsorted(self.epochs, epochs)  # the layout's epochs ascend
        if self.cache.shape[2]:  # a kept cache (`NO_CACHE` has no columns, also unpickled)
            return self.cache, self.cols, pos, pos
        if self.fields is not None:
            fields, at = self.fields, epochs
        elif epochs.size == data.n_epochs:
            fields, at = data.fields(self.rows), epochs
        else:
            fields, at = data.fields(self.rows, epochs), np.arange(epochs.size, dtype=np.int64)
        probs = np.empty((epochs.size, self.src.size, data.top_k + 2))
        kernels.topk_record_cache(fields, at, self.src, self.targets, data.vocab_size, probs)
        return probs, self.cols, pos, np.arange(epochs.size, dtype=np.int64)

    def window(self, data, epochs, upper, lower=None):
        """The mean of the bounds of ``epochs`` (epochs of the layout) into ``upper`` (and
        ``lower``): `kernels.topk_window`."""
        return kernels.topk_window(*self.read(data, _indices(epochs)), self.extent, upper,
                                   lower)

    def grid_counts(self, data, epochs, prob, leads, grid):
        """`kernels.topk_window_grid_counts` of the window ``epochs``."""
        return kernels.topk_window_grid_counts(*self.read(data, _indices(epochs)),
                                               self.extent, prob, leads, grid, REL_BAND)

    def add_into(self, data, epochs, total):
        """`kernels.topk_window_add_into` of the window ``epochs``."""
        kernels.topk_window_add_into(*self.read(data, _indices(epochs)), self.extent, total)

    def mix_into(self, data, epochs, prob, eps, leads, correct):
        """`kernels.topk_window_mix_into` of the window ``epochs``."""
        kernels.topk_window_mix_into(*self.read(data, _indices(epochs)), self.extent, prob,
                                     eps, leads, correct)

    @property
    def parts(self):
        """(cls, label_col, unstored_col): what the certificate kernels read."""
        return self.cls, self.label_col, self.unstored_col

    @property
    def extent(self):
        """(ends, label_col): what the window kernels read of the layout."""
        return self.ends, self.label_col

    @property
    def shape(self):
        """(n, M): the tokens and the columns of the widest row."""
        return self.targets.shape[0], self.width


def _indices(epochs):
    """Epoch positions as the kernels take them: int64 (W,)."""
    return np.asarray(list(epochs), dtype=np.int64).reshape(-1)


def epoch_values(data, e, layout, upper, lower=None):
    """Checkpoint ``e``'s upper (and lower) bounds in ``layout``, written into the float64
    arrays (n, M). With k == vocabulary: the softmax of its logits (upper and lower equal;
    ``lower`` is then filled with a copy)."""
    if data.exact:
        records = data.rows(e, layout.rows)
        n = layout.targets.shape[0]
        dense = np.empty((n, data.vocab_size), dtype=np.asarray(records["logits"]).dtype)
        np.put_along_axis(dense, np.asarray(token_ids(records), dtype=np.int64),
                          np.asarray(records["logits"]), axis=1)
        if kernels.softmax_rows(dense, upper):
            raise ForgetkitError(f"the records of epoch index {e} hold NaN or inf")
        if lower is not None:
            lower[...] = upper
        return upper, lower
    return window_mean(data, [e], layout, upper, lower)


def window_mean(data, epochs, layout, out, lower_out=None):
    """The mean of the bounds of ``epochs`` (summed in order, then divided: a logits run's
    `Run.mean_probs` arithmetic) into ``out`` (and ``lower_out``)."""
    epochs = list(epochs)
    if not data.exact:
        return layout.window(data, epochs, out, lower_out)
    epoch_values(data, epochs[0], layout, out, lower_out)
    if len(epochs) > 1:
        tmp = np.empty_like(out)
        tmp_low = None if lower_out is None else np.empty_like(out)
        for e in epochs[1:]:
            epoch_values(data, e, layout, tmp, tmp_low)
            out += tmp
            if lower_out is not None:
                lower_out += tmp_low
        out /= len(epochs)
        if lower_out is not None:
            lower_out /= len(epochs)
    return out, lower_out


def recipe_bounds(data, recipe, layout):
    """(upper, lower) float64 (n, M) of the mixture that ``recipe`` (`Fuser.recipe`: steps
    (kind, epoch positions, value)) makes of the checkpoints, at the tokens of ``layout``,
    with the arithmetic of each fuser's predict_proba."""
    shape = layout.shape
    upper, lower = np.empty(shape), np.empty(shape)
    for kind, pos, value in recipe:
        if kind == kernels.MEAN:
            window_mean(data, pos, layout, upper, lower)
        elif kind == kernels.WEIGHTED:
            upper[...] = 0.0
            lower[...] = 0.0
            tmp, tmp_low = np.empty(shape), np.empty(shape)
            for e, w in zip(pos, value, strict=True):
                epoch_values(data, e, layout, tmp, tmp_low)
                upper += w * tmp
                lower += w * tmp_low
        else:  # MIX: b <- eps * mean(window) + (1 - eps) * b
            a, a_low = window_mean(data, pos, layout, np.empty(shape), np.empty(shape))
            kernels.mix(a, upper, value)
            kernels.mix(a_low, lower, value)
    return upper, lower


def recipe_epochs(recipe):
    """Every epoch position a recipe reads, ascending."""
    return sorted({int(e) for _, pos, _ in recipe for e in pos})


def on_workers(data):
    """Whether ``data`` (what `TopKKind.certified_bounds` gives) is a run's records on an
    executor's workers (`forgetkit.execution.Executor.certified_bounds`, such as
    `forgetkit.distributed.topk.DaskTopK`), which runs each step of this module there
    itself, rather than a `TopKData` read here."""
    return not isinstance(data, TopKData)


def certify(data, recipe, *, chunk=CHUNK_TOKENS, states_only=False):
    """The certificate of the mixture ``recipe`` on every token of ``data``: (prediction
    int64 (N,), certified bool (N,), state int8 (N,) (1 certified correct, 0 certified
    wrong, -1 uncertain), label_prob float64 (N,): the exact q(y)). Streams tokens in
    chunks; with k < vocabulary each token's layout, bounds and mixture are made in one
    pass over its records (`kernels.topk_certify_recipe`), most tokens from the target's
    and two other bounds. With ``states_only`` (what `Fuser.certified_accuracy` needs)
    tokens certified wrong may have no prediction (-1, not certified)."""
    if on_workers(data):
        return data.certify(recipe, states_only=states_only)
    n = data.n_tokens
    pred, certified = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    state, label_prob = np.empty(n, dtype=np.int8), np.empty(n)
    epochs = recipe_epochs(recipe)
    steps = None if data.exact else _steps(recipe, _indices(epochs))
    for rows in data.chunks(chunk):
        if steps is not None:
            targets = data.targets[rows]
            pred[rows], certified[rows], state[rows], label_prob[rows] = \
                kernels.topk_certify_recipe(data.fields(rows), _indices(epochs),
                                            np.arange(len(targets), dtype=np.int64), targets,
                                            data.vocab_size, steps, states_only=states_only)
            continue
        layout = Layout(data, epochs, rows)
        upper, lower = recipe_bounds(data, recipe, layout)
        pred[rows], certified[rows], state[rows] = kernels.topk_certify(
            upper, lower, layout.parts, data.vocab_size)
        label_prob[rows] = upper[np.arange(upper.shape[0]), layout.label_col]
    return pred, certified, state, label_prob


def _steps(recipe, epochs):
    """A recipe as `kernels.topk_certify_recipe` takes it: (kinds int64 (S,), starts int64
    (S+1,), positions in ``epochs`` int64, values float64: a WEIGHTED step's weights, a MIX
    step's eps at its first position)."""
    kinds, starts, pos, values = [], [0], [], []
    for kind, at, value in recipe:
        kinds.append(kind)
        pos += np.searchsorted(epochs, _indices(at)).tolist()
        values += (list(value) if kind == kernels.WEIGHTED
                   else [0.0 if value is None else value] * len(at))
        starts.append(len(pos))
    return (np.asarray(kinds, dtype=np.int64), np.asarray(starts, dtype=np.int64),
            np.asarray(pos, dtype=np.int64), np.asarray(values, dtype=np.float64))


def label_probs(data):
    """The targets' probabilities at every epoch, float64 (N, E): exp(target - lse), or with
    k == vocabulary the softmax of the logits (the arithmetic of a logits run); a lazy dask
    array for records on workers."""
    if on_workers(data):
        return data.label_probs()
    if not data.exact:
        records = np.asarray(data.records[:, :])
        return kernels.topk_label_probs(records["target"], records["lse"])
    out = np.empty((data.n_tokens, data.n_epochs))
    for rows in data.chunks():
        layout = Layout(data, (), rows)
        values = np.empty(layout.shape)
        for e in range(data.n_epochs):
            epoch_values(data, e, layout, values)
            out[rows, e] = values[np.arange(values.shape[0]), layout.label_col]
    return out


def exact_probs(data, recipe):
    """The fused probabilities (N, V) of a top-k run whose records hold every class (a lazy
    dask array for records on workers)."""
    if on_workers(data):
        return data.exact_probs(recipe)
    if not data.exact:
        raise ForgetkitError(f"predict_proba needs every class's probability; {TOPK_HOLDS} "
                             f"(k={data.top_k} of {data.vocab_size}); use certified(run) for "
                             "the predictions with their certificates and the target's exact "
                             "probability")
    layout = Layout(data, recipe_epochs(recipe), slice(None))
    return recipe_bounds(data, recipe, layout)[0]


def certificate_frame(pred, certified, state, label_prob, targets, index=None, name="token"):
    """The per-token (per-sample: ``name``) table of `Fuser.certified`."""
    correct = np.full(state.shape, None, dtype=object)
    correct[state == 1] = True
    correct[state == 0] = False
    index = np.arange(len(pred)) if index is None else index
    return pd.DataFrame({"target": targets, "prediction": pred, "certified": certified,
                         "correct": correct, "label_prob": label_prob},
                        index=pd.Index(index, name=name))


class TopKFitChunk(FitChunk):
    """Knowledge Fusion's `FitChunk` on a chunk of tokens ``rows`` of a top-k run: the
    current fusion's upper bounds ``prob`` (n, M) in the layout of every epoch (the target's
    column exact) and its certified correctness; the run's correctness at each epoch is
    read with the layout (`Layout.hits`). The kernels of the full-vocabulary fit run on
    these rows with the target's column as the label, so a token counts as correct exactly
    when it is certified correct (uncertain tokens count as wrong: the fit maximises the
    lower end of the accuracy interval).

    With ``settle`` (an eps grid, whose counts are the brute-force grid's) the settled
    tokens (`Layout`) are wrong under every mixture the fit can make and at every epoch:
    they add nothing to the counts, and no window's bounds are made for them. The
    continuous search (``settle`` False, the default) sweeps every token's interval, as
    the full-vocabulary fit does: its candidates come from those intervals."""

    def __init__(self, data, rows, *, settle=False):
        self.data, self.rows = data, rows
        self.layout = layout = Layout(data, range(data.n_epochs), rows, settle=settle,
                                      cache=True, hits=True)
        prob = epoch_values(data, data.n_epochs - 1, layout, np.empty(layout.shape))[0]
        super().__init__(layout.hits, prob, layout.label_col)

    def window_mean(self, window):
        if self.window != window:
            window_mean(self.data, window, self.layout, self.mean)
            self.window = window
        return self.mean

    def _window_counts(self, window, grid):
        if self.data.exact:
            return None
        # the mean is not kept: `_mix_window` makes it again for the windows mixed in
        return self.layout.grid_counts(self.data, window, self.prob, self.stats, grid)

    def _mix_window(self, window, eps):
        if self.data.exact or self.window == window:  # the mean is made, or kept
            return False
        self.layout.mix_into(self.data, window, self.prob, eps, self.stats, self.cur)
        return True


def _rival(ids, targets):
    """The largest class other than the target of records' ids (n, k) (-1 where k = 1 and
    the target is stored first): int64 (n,)."""
    first = ids[:, 0].astype(np.int64)
    if ids.shape[1] < 2:
        return np.where(first != targets, first, -1)
    return np.where(first != targets, first, ids[:, 1].astype(np.int64))


def topk_selection(data, k):
    """Greedy ensemble selection with replacement on a top-k run: k rounds, each adding the
    checkpoint whose inclusion gives the most tokens certified correct by the sum of the
    picks' bounds (ties: the earlier epoch), the arithmetic of the full-vocabulary
    selection; settled tokens (`Layout`) are certified by no sum. Returns the picks (epoch
    indices). Each round reads every epoch's records."""
    if on_workers(data):
        return data.selection(k)
    everything = range(data.n_epochs)
    parts = []
    for rows in data.chunks(FIT_CHUNK_TOKENS):
        layout = Layout(data, everything, rows, settle=True)
        parts.append((layout, np.zeros(layout.shape)))
    picks = []
    for i in range(k):
        scores = np.zeros(data.n_epochs, dtype=np.int64)
        for layout, total in parts:
            scores += selection_scores(data, layout, total)
        picks.append(int(np.argmax(scores)))
        if i + 1 < k:
            for layout, total in parts:
                add_pick(data, layout, picks[-1], total)
    return picks


def add_pick(data, layout, e, total):
    """total += checkpoint ``e``'s upper bounds in ``layout`` (a selection round's pick),
    float64 (n, M) in place: with k < vocabulary in one pass, the bounds not stored."""
    if data.exact:
        kernels.add_into(total, epoch_values(data, e, layout, np.empty(layout.shape))[0])
    else:
        layout.add_into(data, [e], total)


def selection_scores(data, layout, total):
    """For each epoch, the tokens of ``layout`` whose argmax of total + its bounds is the
    target: int64 (E,)."""
    if not data.exact:
        probs, cols, _, _ = layout.read(data, layout.epochs)
        if layout.spans is None:  # made in the first round, read in the others
            layout.spans = np.full((layout.shape[0], 4), np.nan)
        return kernels.topk_selection_counts(probs, cols, layout.extent, total, layout.spans)
    every, tmp = np.arange(layout.shape[0]), np.empty(layout.shape)
    return np.array([kernels.sum_correct_count_rows(
        total, epoch_values(data, e, layout, tmp)[0], layout.label_col, every)
        for e in range(data.n_epochs)], dtype=np.int64)
