"""numba kernels, private to forgetkit, by domain:

- ``argmax``: the forgetting pass (row-wise argmax) and correct counts of mixed rows;
- ``checked``: the forgetting pass of float16 outputs that also checksums (CRC32C) what it
  reads, so that verifying a stored run costs no second read;
- ``simd``: their float16 row loop in explicit LLVM vectors (four rows per step), with or
  without the CRC chains;
- ``softmax``: softmax rows, window means and weighted sums of softmaxes, label probabilities;
- ``eps_search``: Knowledge Fusion's exact epsilon search and fusion update;
- ``selection``: greedy ensemble selection on logits;
- ``mixture``: likelihood fusion's EM pass on large validation sets;
- ``recipes``: every fuser's prediction of a row from one softmax per epoch, scored at once;
- ``topk``: certified fusion on top-k token runs (each token's class layout, each
  checkpoint's bounds in it, the certificate of a mixture);
- ``dynamics``: per-sample label probability, margin and correctness of an epoch (data
  maps, AUM, label issues);
- ``floats``: float16-bit and float64-key helpers shared by the others;
- ``schedule``: the block counter from which the threads of a call claim their blocks of
  rows;
- ``views``: rows of arrays, and arrays passed to helpers that are not inlined, as views
  that hold no reference (no atomic count per row, which the threads would share);
- ``jit``: each kernel's one build (serial, ``nogil``), the threads a call runs it on (the
  caller's and a shared pool's), and the compile notice;
- ``twins``: exact numpy twins of the kernels of the Knowledge Fusion fit and `compare`,
  which small calls run while the kernel is not compiled (``jit.use_twin``);
- ``warmup``: compiles every kernel into numba's cache (``forgetkit warmup``).

The functions below are the one layer the rest of the package calls: they pass float16 data
as its raw int16 bits (numba has no float16 arithmetic), hand the float16 exp table to the
softmax kernels, choose the number of thread blocks and, from the work of the call and the
kernel's measured cost, the number of threads (``jit.threads``) or the kernel's numpy twin
(``jit.use_twin``). The kernels themselves take plain contiguous arrays and do not
validate their inputs.
"""

from __future__ import annotations

import numpy as np

from . import argmax as _argmax
from . import checked as _checked
from . import dynamics as _dynamics
from . import eps_search as _eps
from . import jit
from . import mixture as _mixture
from . import recipes as _recipes
from . import selection as _selection
from . import softmax as _softmax
from . import topk as _topk
from . import twins as _twins
from .jit import KERNELS, call, compile_notice, forced, n_blocks, use_twin  # noqa: F401
from .softmax import f16_exp_table


def _run(k, work, args, twin):
    """Kernel ``k`` on ``args`` (on the threads `jit.threads` gives), or where
    `jit.use_twin` says so its exact numpy twin on the same arguments (``twins``); a twin
    that does not apply to them (returns None) leaves the call to the kernel."""
    if use_twin(k, work, args):
        result = twin(*args)
        if result is not None:
            return result
    return call(k, work, *args)


def stored(values):
    """The array the kernels take: float16 as its raw int16 bits, other floats as they are."""
    return values.view(np.int16) if values.dtype == np.float16 else values


def source(values):
    """`stored` as a read-only view, for data the kernels only read: a memory-mapped run
    and one held in memory then share one compiled specialization (numba types read-only
    arrays apart)."""
    view = values.view(np.int16) if values.dtype == np.float16 else values.view()
    view.flags.writeable = False
    return view


def argmax_rows(values, out):
    """out[r] = first argmax of values[r] (rows, C) C-contiguous; -1 for a row holding inf
    or nan. out: int32 (rows,)."""
    if values.dtype == np.float16:
        call(_argmax.argmax_f16, values.size, source(values), out)
    else:
        call(_argmax.argmax_float, values.size, source(values), out)
    return out


def argmax_crc(values, out):
    """``argmax_rows`` of every row of float16 outputs values (E, N, C) (C-contiguous, at
    most 0xFFFF classes) into out int32 (E, N), and the CRC32C of the bytes it read: returns
    (parts uint32 (E, K), lengths int64 (K,)), the CRCs and byte counts of K consecutive
    pieces of each epoch's bytes, in order (combine them with
    `forgetkit.io.integrity.combine_lanes`)."""
    n_epochs, n_rows, n_classes = values.shape
    blocks = max(1, min(-(-n_blocks() // max(n_epochs, 1)), n_rows // _checked.LANES or 1))
    parts = np.empty((n_epochs, blocks, _checked.LANES), dtype=np.uint32)
    call(_checked.argmax_crc_f16, values.size, source(values), out, blocks, parts)
    return (parts.reshape(n_epochs, -1),
            _checked.lane_bytes(n_rows, n_classes, blocks).reshape(-1))


def read_order(src):
    """The order in which to read rows src (R,) of stored outputs: ascending src, so that
    neighbouring rows are read together (int64 (R,); identity for ascending src)."""
    src = np.asarray(src, dtype=np.int64)
    if src.size < 2 or np.all(src[1:] >= src[:-1]):
        return np.arange(src.size)
    return np.argsort(src, kind="stable")


def argmax_rows_at(values, src, out, order=None):
    """out[e, i] = first argmax of values[e, src[i]] for stored outputs (E, M, C) read in
    place (float16 as bits; at most 0xFFFF classes), rows read in ``order`` (default
    `read_order`); -1 for a row holding inf or nan. out: int32 (E, R)."""
    src = np.asarray(src, dtype=np.int64)
    order = read_order(src) if order is None else order
    if values.dtype == np.float16 and values.shape[2] > 0xFFFF:  # gathered: the 2-pass kernel
        block = np.ascontiguousarray(values[:, src]).reshape(-1, values.shape[2])
        argmax_rows(block, out.reshape(-1))
    elif values.dtype == np.float16:
        call(_argmax.argmax_f16_at, out.size * values.shape[2], source(values), src, order, out)
    else:
        call(_argmax.argmax_float_at, out.size * values.shape[2], source(values), src, order,
             out)
    return out


def row_top(p, labels):
    """(first argmax int64, max, p[label]) of each row of finite float64 p (N, C), (N,) each,
    in one parallel pass."""
    n = p.shape[0]
    pred, top, at_label = np.empty(n, dtype=np.int64), np.empty(n), np.empty(n)
    _run(_argmax.row_top, p.size, (np.ascontiguousarray(p),
                                   np.asarray(labels, dtype=np.int64), pred, top, at_label),
         _twins.row_top)
    return pred, top, at_label


def softmax_rows(values, out):
    """out = row-wise float64 softmax of values (rows, C); returns the number of rows that
    hold inf or nan. Where its twin runs but does not apply (not float16 within the exp
    table) and the kernel is not compiled, ``combine_softmax`` of one epoch: the same bits,
    from a kernel the fit and `compare` compile anyway."""
    args = (source(values), f16_exp_table(), out)
    if use_twin(_softmax.softmax_rows, values.size, args):
        n_bad = _twins.softmax_rows(*args)
        if n_bad is not None:
            return n_bad
        if jit._FORCED is None:
            return combine_softmax(values[None], [0], np.arange(values.shape[0]), out)
    return call(_softmax.softmax_rows, values.size, *args)


def combine_softmax(values, epochs, rows, out, weights=None, accumulate=False, order=None):
    """out[i] = mean (``weights`` None) or weighted sum over e in ``epochs`` of the softmax of
    values[e, rows[i]] (``accumulate``: the weighted sum added to out); values (E, M, C)
    read in place, rows in ``order`` (default `read_order`). Returns the number of (epoch,
    row) pairs holding inf or nan."""
    w = np.empty(0) if weights is None else np.asarray(weights, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    order = read_order(rows) if order is None else order
    epochs = np.asarray(epochs, dtype=np.int64)
    return _run(_softmax.combine_softmax, out.size * epochs.size,
                (source(values), epochs, w, rows, order, f16_exp_table(), out,
                 bool(accumulate and weights is not None), n_blocks()), _twins.combine_softmax)


def label_probs(values, rows, labels, out):
    """out[i] = softmax(values[rows[i]])[labels[i]] for values (M, C); returns the number of
    rows holding inf or nan."""
    return _run(_softmax.label_probs, len(rows) * values.shape[1],
                (source(values), rows, labels, f16_exp_table(), out, n_blocks()),
                _twins.label_probs)


def softmax_stats(values, src, labels, shift, inv, pred, label_prob, class_max=None):
    """Per (epoch, row) of stored outputs values[e, src[i]] (E, M, C): the softmax's shift
    and 1/sum, first argmax and label probability, written into the (E, R) arrays, and each
    class's largest probability raised into ``class_max`` (R, C) if given; see
    ``softmax.softmax_stats``. Returns the number of rows holding inf or nan per epoch."""
    keep = np.empty((0, 0)) if class_max is None else class_max
    return call(_softmax.softmax_stats, shift.size * values.shape[2], source(values),
                np.asarray(src, dtype=np.int64), labels, f16_exp_table(), shift, inv, pred,
                label_prob, keep, n_blocks())


def take_samples(stats, idx):
    """The (shift, inv, pred, label_prob, class_max) arrays of ``softmax_stats`` for samples
    ``idx`` (int64 (R,)), gathered in parallel: ((E, R) x 4, (R, C) or None)."""
    shift, inv, pred, label_prob, class_max = stats
    idx = np.asarray(idx, dtype=np.int64)
    n_epochs, n = shift.shape[0], idx.shape[0]
    out = (np.empty((n_epochs, n)), np.empty((n_epochs, n)),
           np.empty((n_epochs, n), dtype=pred.dtype), np.empty((n_epochs, n)),
           None if class_max is None else np.empty((n, class_max.shape[1])))
    none = np.empty((0, 0))
    call(_softmax.take_samples, 4 * out[0].size + (0 if out[4] is None else out[4].size),
         shift, inv, pred, label_prob, none if class_max is None else class_max, idx,
         *out[:4], none if class_max is None else out[4])
    return out


def label_margins(values, labels, p, margin, correct, *, softmax=True, total=None,
                  total_log=None):
    """Epochs' outputs (E, N, C), or one epoch's (N, C), to the label's probability ``p``,
    its margin over the largest other class ``margin`` (float64 (E, N) or (N,)) and
    ``correct`` (bool, same shape), adding the rows' probabilities to ``total`` and their
    logs to ``total_log`` (float64 (N, C)) if given, epoch after epoch; ``softmax``: the
    values are logits. See ``dynamics.label_margins``. Returns the number of (epoch, row)
    pairs holding inf or nan."""
    if values.ndim == 2:
        values, p, margin, correct = values[None], p[None], margin[None], correct[None]
    none = np.empty((0, 0))
    return _run(_dynamics.label_margins, values.size,
                (source(values), labels, f16_exp_table(), softmax, p, margin, correct,
                 none if total is None else total, none if total_log is None else total_log,
                 n_blocks()), _twins.label_margins)


def mean_first_axis(stack, out):
    """out = mean of float64 stack (k, rows, C) over its first axis, summed in order."""
    _run(_softmax.mean_first_axis, stack.size, (stack, out), _twins.mean_first_axis)
    return out


def label_leads(p, labels):
    """The current fusion's state for the eps search, for float64 p (N, C): (lead,
    magnitude, top) of ``eps_search.label_leads`` and the correctness of each row."""
    n = len(labels)
    lead, magnitude = np.empty(n), np.empty(n)
    top, correct = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    _run(_eps.label_leads, p.size, (p, labels, lead, magnitude, top, correct),
         _twins.label_leads)
    return (lead, magnitude, top), correct


def grid_correct_counts(a, b, labels, leads, grid, rel_band):
    """Correct counts of eps*a + (1-eps)*b for every eps of ``grid``; ``leads``: the first
    value of ``label_leads(b, labels)``. int64 (G,)."""
    return _run(_eps.grid_correct_counts, a.size,
                (a, b, labels, *leads, grid, rel_band, n_blocks()), _twins.grid_correct_counts)


def window_grid_counts(values, epochs, src, b, labels, leads, correct, grid, rel_band, mean,
                       spans, order=None, *, mix_eps=None):
    """``grid_correct_counts`` with a = the mean softmax of stored outputs values (E, M, C)
    at ``epochs`` and rows src (N,), made row by row into ``mean`` (N, C) float64; rows
    read in ``order`` (default `read_order`). Where ``mix_eps`` is given, b first has the
    mean that ``mean`` held mixed in by it in the same pass, as `mix_into` does, its
    ``leads`` and ``correct`` (bool (N,), b's correctness) updated. ``spans`` (int32 (4, N))
    receives each row's grid spans (see ``eps_search.window_grid_counts``). Returns (counts
    int64 (G,), number of (epoch, row) pairs holding inf or nan, number of rows whose
    correctness the mix changed)."""
    src = np.asarray(src, dtype=np.int64)
    epochs = np.asarray(epochs, dtype=np.int64)
    counts, bad, changed = call(
        _eps.window_grid_counts, b.size * epochs.size, source(values), epochs, src,
        read_order(src) if order is None else order, f16_exp_table(), b, labels, *leads,
        correct, mean, mix_eps is not None, float(mix_eps or 0.0), grid, rel_band, spans,
        n_blocks())
    return counts, int(bad), int(changed)


def mix(a, b, eps):
    """b <- eps*a + (1-eps)*b in place (float64 (N, C))."""
    _run(_eps.mix, a.size, (a, b, eps), _twins.mix)


def mix_into(a, b, eps, labels, leads, correct):
    """``mix``, then ``label_leads`` of the new b into ``leads`` and ``correct``."""
    _run(_eps.mix_into, a.size, (a, b, eps, labels, *leads, correct), _twins.mix_into)


def win_intervals(a, b, labels):
    """Per sample, the interval of eps where eps*a + (1-eps)*b ranks the label first; see
    ``eps_search.win_intervals``."""
    n = a.shape[0]
    out = (np.zeros(n), np.ones(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool),
           np.ones(n, dtype=bool))
    call(_eps.win_intervals, a.size, a, b, labels, *out)
    return out


def mixture_correct_count(a, b, labels, eps):
    """Number of samples that eps*a + (1-eps)*b classifies correctly (float64 (N, C))."""
    return _run(_argmax.mixture_correct_count, a.size, (a, b, labels, eps),
                _twins.mixture_correct_count)


def sum_correct_count_rows(s, p, labels, rows):
    """Number of ``rows`` whose argmax of s[r] + p[r] is labels[r] (float64 (N, C))."""
    return call(_argmax.sum_correct_count_rows, len(rows) * s.shape[1], s, p, labels, rows)


def add_into(total, p):
    """total += p (float64 (N, C)), numpy's arithmetic."""
    _run(_selection.add_into, total.size, (total, source(p)), _twins.add_into)


def class_max(probs):
    """The largest value of each class of each row over every epoch of float64 probs
    (E, N, C): (N, C)."""
    out = np.empty(probs.shape[1:])
    _run(_selection.class_max, probs.size, (source(probs), out), _twins.class_max)
    return out


def selection_cached_counts(probs, total, rows, labels, cand_ptr, cand):
    """Per epoch of float64 probs (E, N, C): the ``rows`` of total whose argmax of total +
    probs[e] is the label, comparing each row's candidate classes only; see
    ``selection.selection_cached_counts``. int64 (E,)."""
    return _run(_selection.selection_cached_counts,
                probs.shape[0] * len(rows) * total.shape[1],
                (source(probs), total, rows, labels, cand_ptr, cand, n_blocks()),
                _twins.selection_cached_counts)


def live_rows(total, labels, bound, slack, order=None):
    """The rows of float64 total (N, C) that an added vector bounded by ``bound`` ((N, C),
    or (N, 1): one bound per row) can make right or wrong, and their candidate classes:
    (rows int64 (R,) in the order of ``order`` (default ascending), cand_ptr (R+1,), cand),
    and the number of the other rows that stay right; see ``selection.live_rows``."""
    order = np.arange(total.shape[0]) if order is None else np.asarray(order, dtype=np.int64)
    work = order.size * total.shape[1]
    n_cand = np.empty(order.size, dtype=np.int64)
    args = (total, labels, bound, slack, order, n_cand)
    if use_twin(_selection.live_rows, work, args):
        rows, ptr, cand, n_right = _twins.live_rows(*args[:5])
        return rows, ptr, cand, int(n_right)
    n_right = call(_selection.live_rows, work, *args)
    return (*_live_candidates(total, bound, slack, order, n_cand, work), int(n_right))


def _live_candidates(total, bound, slack, order, n_cand, work):
    """(rows, cand_ptr, cand) of the live rows, those of ``order`` with n_cand > 0."""
    live = np.flatnonzero(n_cand)
    rows = order[live]
    ptr = np.zeros(live.size + 1, dtype=np.int64)
    np.cumsum(n_cand[live], out=ptr[1:])
    cand = np.empty(ptr[-1], dtype=np.int64)
    call(_selection.live_candidates, work, total, bound, slack, rows, ptr, cand)
    return rows, ptr, cand


def add_softmax_live_rows(values, picks, src, total, labels, bound, slack, order, state,
                          shift, inv):
    """The next round of ensemble selection on stored outputs values (E, M, C) at rows src
    (N,): each row's total brought up to the ``picks`` so far (the bits of ``total +=
    probs`` pick by pick), then ``live_rows``, with rows settled lazily; ``state`` = (due,
    added, right) (N,) each, kept between rounds; shift, inv (E, N): the softmaxes' m and
    inv where known (inv > 0), else nan. Returns (rows, cand_ptr, cand, number
    right for every vector, number of rows holding inf or nan); see
    ``selection.add_softmax_live_rows``."""
    order = np.asarray(order, dtype=np.int64)
    work = order.size * total.shape[1]
    n_cand = np.empty(order.size, dtype=np.int64)
    n_right, n_bad = call(
        _selection.add_softmax_live_rows, work, source(values),
        np.asarray(picks, dtype=np.int64), np.asarray(src, dtype=np.int64), total, labels,
        bound, slack, order, *state, shift, inv, f16_exp_table(), n_cand, n_blocks())
    return (*_live_candidates(total, bound, slack, order, n_cand, work), int(n_right),
            int(n_bad))


def selection_correct_counts(values, src, total, rows, labels, shift, inv, top, ptr, cand,
                             class_max_out=None):
    """Per epoch of values (E, M, C): the ``rows`` of total whose argmax of total + softmax
    is the label, raising ``class_max_out`` (N, C) to the probabilities of rows scored whole;
    see ``selection.selection_correct_counts``. Returns (counts, bad) (E,)."""
    keep = np.empty((0, 0)) if class_max_out is None else class_max_out
    return call(_selection.selection_correct_counts, values.shape[0] * len(rows) * total.shape[1],
                source(values), src, total, rows, labels, f16_exp_table(), shift, inv, top,
                keep, ptr, cand, n_blocks())


def entry_needs(rows, ptr, cand, offset, size, cls):
    """need (R,) of the live rows of a round: 0 where a row's gathered entry holds its
    candidates, else the size of its new entry; see ``selection.entry_needs``."""
    need = np.empty(rows.shape[0], np.int64)
    call(_selection.entry_needs, rows.size + cand.size, rows, ptr, cand, offset, size, cls,
         need, n_blocks())
    return need


def move_entries(rows, need, offset, size, cls, values, new_offset, new_cls, new_values, at,
                 n_epochs):
    """Move the kept gathered entries to new buffers; see ``selection.move_entries``."""
    call(_selection.move_entries, rows.size + new_values.size, rows, need, offset, size, cls,
         source(values), new_offset, new_cls, stored(new_values), at, n_epochs, n_blocks())


def fill_entries(values, src, rows, ptr, cand, need, at, old, offset, size, cls, out):
    """Gather the new entries of stored outputs values (E, M, C) at rows src, keeping what
    the previous entries ``old`` = (offset, size, cls, values) hold; see
    ``selection.fill_entries``."""
    old_offset, old_size, old_cls, old_values = old
    call(_selection.fill_entries, rows.size + out.size, source(values), src, rows, ptr, cand,
         need, at, old_offset, old_size, old_cls, source(old_values), offset, size, cls,
         stored(out), n_blocks())


def selection_gathered_counts(gathered, cls, offset, size, total, rows, labels, shift, inv,
                              ptr, cand):
    """Per epoch: the ``rows`` of total whose argmax of total + softmax is the label, from
    their candidates' gathered values; see ``selection.selection_gathered_counts``."""
    return call(_selection.selection_gathered_counts, shift.shape[0] * (rows.size + cand.size),
                source(gathered), cls, offset, size, total, rows, labels, f16_exp_table(),
                shift, inv, ptr, cand, shift.shape[0], n_blocks())


MEAN, WEIGHTED, MIX = _recipes.MEAN, _recipes.WEIGHTED, _recipes.MIX


def score_recipes(values, src, labels, recipes, order=None):
    """(pred int64, top, at_label), each (len(recipes), R), of the fused probabilities of
    every recipe for the rows values[:, src[i]] of stored outputs (E, M, C): the first
    argmax, max and label probability; and the number of rows holding inf or nan per epoch
    of ``needed`` (sorted epochs read). A recipe is a list of steps (kind, epochs, value):
    (MEAN, epochs, None), (WEIGHTED, epochs, weights) or (MIX, epochs, eps); see
    ``recipes.score_recipes``. Returns (pred, top, at_label, needed, bad)."""
    needed = np.unique(np.concatenate([np.asarray(ep, dtype=np.int64)
                                       for recipe in recipes for _, ep, _ in recipe]))
    method_ptr, kinds, step_ptr, slots, step_values = [0], [], [0], [], []
    for recipe in recipes:
        for kind, epochs, value in recipe:
            epochs = np.asarray(epochs, dtype=np.int64)
            kinds.append(kind)
            slots.extend(np.searchsorted(needed, epochs).tolist())
            if kind == WEIGHTED:
                step_values.extend(np.asarray(value, dtype=np.float64).tolist())
            else:
                step_values.extend([value if kind == MIX else 1.0] * len(epochs))
            step_ptr.append(len(slots))
        method_ptr.append(len(kinds))
    n, m = len(src), len(recipes)
    pred, top, at_label = np.empty((m, n), np.int64), np.empty((m, n)), np.empty((m, n))
    src = np.asarray(src, dtype=np.int64)
    bad = call(_recipes.score_recipes, n * needed.size * values.shape[2], source(values), src,
               read_order(src) if order is None else order, np.asarray(labels, dtype=np.int64),
               f16_exp_table(), needed, np.array(method_ptr, np.int64),
               np.array(kinds, np.int64), np.array(step_ptr, np.int64),
               np.array(slots, np.int64), np.array(step_values, np.float64), pred, top,
               at_label, n_blocks())
    return pred, top, at_label, needed, bad


def em_pass(q, w):
    """(mean_n log(q[n] @ w), the sums of the EM update sum_n q[n] / (q[n] @ w) (k,)) of
    mixture weights w (k,) over components q (N, k) > 0, C-contiguous, from one parallel
    pass; the same bits for any number of threads (``mixture.em_pass``)."""
    blocks = -(-q.shape[0] // _mixture.EM_BLOCK)
    parts, logs, grad = np.empty((blocks, q.shape[1])), np.empty(blocks), np.empty(q.shape[1])
    call(_mixture.em_pass, q.size, q, np.ascontiguousarray(w, dtype=np.float64), parts, logs,
         blocks)
    return _mixture.merge_blocks(parts, logs, grad) / q.shape[0], grad


# ------------------------------------------------------------- certified fusion (top-k runs)
def exp(x):
    """exp of float64 ``x`` (any shape) with the C library's exp, the one the kernels call.
    numpy's SIMD exp differs from it in the last bit on some CPUs (AVX-512), and a top-k
    run's probabilities must agree bit for bit between the kernels and numpy code."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    _topk.exp_into(x.reshape(-1), out.reshape(-1))
    return out


def topk_label_probs(target, lse):
    """The targets' probabilities exp(target - lse) of a top-k run's record fields target,
    lse (E, N) (any strides), in float64 with the C library's exp (`exp`'s bits): (N, E),
    C-contiguous; ``topk.label_probs``. Read as read-only views, as every top-k kernel
    reads records (`forgetkit.kinds.topk.TopKData.fields`): one compiled specialization for
    records in memory and memory-mapped."""
    target, lse = target.view(), lse.view()
    target.flags.writeable = lse.flags.writeable = False
    out = np.empty(target.shape[::-1])
    call(_topk.label_probs, target.size, target, lse, out)
    return out


def topk_settle(fields, epochs, src, targets, vocab, rival):
    """Whether each token ``src`` is settled over the checkpoints ``epochs`` (int64 indices)
    of a top-k run's record ``fields`` (logits, ids (E, N, k), target, lse (E, N):
    `forgetkit.kinds.topk.TopKData.fields`, any strides): never correct under any mixture,
    trying class ``rival`` (int64 (n,), -1 none), the classes stored above the target
    where it fails, and the unstored slot. bool (n,); see ``topk.settle_scan``."""
    settled = np.empty(len(src), dtype=bool)
    call(_topk.settle_scan, len(src) * len(epochs) * 2, *fields, epochs, src, targets, vocab,
         rival, settled)
    return settled


#: The ``hits`` of the record kernels where none are asked for.
_NO_HITS = np.empty((0, 0), dtype=bool)


def topk_floors(fields, epochs, src, targets, vocab, hits=None):
    """Each token's tie floor (int64 (n,), `topk_settle`'s arguments): ``topk.token_floors``;
    with ``hits`` (bool (W, n)), whether the target is each record's argmax, written there."""
    floor = np.empty(len(src), dtype=np.int64)
    call(_topk.token_floors, len(src) * len(epochs) * fields[0].shape[2], *fields, epochs, src,
         targets, vocab, floor, _NO_HITS if hits is None else hits)
    return floor


def topk_record_cache(fields, epochs, src, targets, vocab, cache, hits=None):
    """`topk_floors` (and its ``hits``), every record's probabilities (k stored, the
    target's, the unstored bound) written to ``cache`` (float64 (W, n, k + 2));
    ``topk.record_cache``."""
    n, k = len(src), fields[0].shape[2]
    floor = np.empty(n, dtype=np.int64)
    call(_topk.record_cache, n * len(epochs) * k, *fields, epochs, src, targets, vocab, cache,
         floor, _NO_HITS if hits is None else hits)
    return floor


def topk_layout(fields, epochs, src, targets, vocab, floor):
    """The class layout of tokens ``src`` over the checkpoints ``epochs`` (int64 indices)
    of a top-k run's record ``fields`` (as `topk_settle` takes them; ``targets`` int64 (n,)),
    the unstored slot above ``floor`` (`topk_floors`): (classes int32 (n, W) (int64 for
    vocabularies beyond int32): each row's classes and unstored slot in its first ends[n]
    columns, the rest unset (`topk_padded` makes the padded rows), ends int64 (n,),
    label_col int64 (n,), unstored_col int64 (n,), -1 where none, cols (n, W, k) the column
    of each stored id: uint8, or uint16 / int32 for wider layouts); see ``topk``'s module
    docstring. The fit and the selection read no class id, only the columns: no padded
    copy is made for them."""
    k = fields[1].shape[2]
    wide = len(epochs) * k + 2  # every stored id, the target and the slot
    cls, ends, label_col, unstored_col, cols = _layout_fill(
        fields[1], epochs, src, targets, vocab, floor, min(wide, LAYOUT_COLUMNS))
    over = np.flatnonzero(ends < 0)
    if over.size:  # the tokens wider than LAYOUT_COLUMNS, again at full width
        wider = _layout_fill(fields[1], epochs, src[over], targets[over], vocab, floor[over],
                             wide)
        width = int(wider[1].max())
        narrow, cls = cls, np.empty((len(src), width), dtype=cls.dtype)
        cls[:, :narrow.shape[1]] = narrow
        cols = cols.astype(_col_type(width))
        cls[over] = wider[0][:, :width]
        ends[over], label_col[over], unstored_col[over] = wider[1:4]
        cols[over] = wider[4]
    width = int(ends.max()) if len(src) else 0
    return cls, ends, label_col, unstored_col, cols.astype(_col_type(width), copy=False)


def topk_padded(classes, ends, vocab):
    """The layout's class ids as the certificate kernels read them: (n, M) contiguous, M
    the widest row, each row padded from ends[n] with vocab + 1 (``classes``, ``ends``:
    `topk_layout`'s)."""
    width = int(ends.max()) if len(ends) else 0
    cls = np.ascontiguousarray(classes[:, :width])
    cls[np.arange(width) >= ends[:, None]] = vocab + 1
    return cls


#: Columns of the layout rows first made (`topk_layout`): a token with more classes (rare:
#: 97 at most on a GPT-2 run's 51 checkpoints of 8) is made again in rows of every
#: checkpoint's k ids. Narrow rows touch fewer new pages and fit uint8 columns.
LAYOUT_COLUMNS = 128


def _layout_fill(ids, epochs, src, targets, vocab, floor, width):
    """``topk.layout_fill`` into new arrays whose rows hold ``width`` columns, each row's
    classes in its first ends[n]: (cls, ends, label_col, unstored_col, cols); ends[n] < 0
    for the tokens wider than that."""
    n = len(src)
    cls = np.empty((n, width), dtype=np.int32 if vocab < 2**31 - 1 else np.int64)
    ends, label_col, unstored_col = (np.empty(n, dtype=np.int64) for _ in range(3))
    cols = np.empty((n, len(epochs), ids.shape[2]), dtype=_col_type(width))
    call(_topk.layout_fill, n * len(epochs) * ids.shape[2], ids, epochs, src, targets, vocab,
         floor, cls, ends, label_col, unstored_col, cols)
    return cls, ends, label_col, unstored_col, cols


def _col_type(width):
    """The narrowest of uint8, uint16, int32 that holds the columns of rows ``width`` wide."""
    return next(t for t in (np.uint8, np.uint16, np.int32) if width <= np.iinfo(t).max)


def topk_window(cache, cols, pos, rpos, extent, upper, lower=None):
    """The mean over a window of checkpoints of each one's upper and lower bounds (float64
    (n, M)) in a layout (``lower`` None: upper only), summed in order and then divided
    (numpy's ``out += tmp``, ``out /= len(window)``). The window's records: the rows
    ``rpos`` of ``cache`` (`topk_record_cache`: (W, n, k + 2)), their stored ids' columns
    ``cols[:, pos]`` (`topk_layout`: (n, W, k)); ``extent`` = (ends, label_col): each
    layout row's columns before its padding and its target's column (`topk_layout`)."""
    call(_topk.window_bounds, upper.size * len(pos), cache, cols, pos, rpos, *extent, upper,
         np.empty((0, 0)) if lower is None else lower)
    return upper, lower


def topk_window_grid_counts(cache, cols, pos, rpos, extent, prob, leads, grid, rel_band):
    """`grid_correct_counts` of the window mean (`topk_window`'s upper bounds, whose
    arguments come first) mixed into ``prob``, in one pass, the mean not stored: int64
    (G,)."""
    return call(_topk.window_grid_counts, prob.size * len(pos), cache, cols, pos, rpos,
                *extent, prob, *leads, grid, rel_band)


def topk_window_mix_into(cache, cols, pos, rpos, extent, prob, eps, leads, correct):
    """`mix_into` of the window mean (`topk_window`'s upper bounds, whose arguments come
    first) into ``prob``, in one pass, the mean not stored: prob, ``leads`` (lead,
    magnitude, top) and ``correct`` updated in place."""
    call(_topk.window_into, prob.size * len(pos), cache, cols, pos, rpos, *extent, prob, True,
         eps, *leads, correct)


def topk_window_add_into(cache, cols, pos, rpos, extent, total):
    """total += the window mean (`topk_window`'s upper bounds, whose arguments come first),
    in one pass, the mean not stored (numpy's ``total += mean``)."""
    no_leads = (np.empty(0), np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=bool))
    call(_topk.window_into, total.size * len(pos), cache, cols, pos, rpos, *extent, total,
         False, 0.0, *no_leads)


def topk_selection_counts(cache, cols, extent, total, spans):
    """For each epoch of a layout (the records' probabilities ``cache`` (E, n, k + 2) and
    columns ``cols`` (n, E, k) of every one; ``extent`` as `topk_window` takes it), the
    tokens whose first argmax of total + that checkpoint's upper bounds is the target's
    column: int64 (E,) (`sum_correct_count_rows` of each epoch's bounds). ``spans`` (n, 4)
    float64, NaN before the first round: each token's bounds over every epoch, which the
    first round makes and the others read (``topk.selection_counts``)."""
    return call(_topk.selection_counts, total.size * cols.shape[1], cache, cols, *extent,
                total, spans)


def topk_certify_recipe(fields, epochs, src, targets, vocab, steps, *, states_only=False):
    """`topk_certify` of a recipe's mixture (``steps`` = (kinds, starts, positions into
    ``epochs``, values), see ``topk.certify_recipe``) of tokens ``src``, each token's layout
    over ``epochs`` (ascending) and bounds made in one pass over its records:
    (prediction int64, certified bool, state int8, label_prob float64), each (n,). With
    ``states_only`` the tokens answered certified wrong from their rival's bounds have no
    prediction (-1, not certified): what ``state`` alone needs."""
    n = len(src)
    pred, certified = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    state, label_prob = np.empty(n, dtype=np.int8), np.empty(n)
    weights = recipe_weights(steps, len(epochs))
    quick = 0 if weights is None else (2 if states_only else 1)
    lead = 0 if weights is None else int(np.argmax(weights))
    call(_topk.certify_recipe, n * len(epochs) * fields[0].shape[2], *fields, epochs, src,
         targets, vocab, *steps, quick, lead, pred, certified, state, label_prob)
    return pred, certified, state, label_prob


def recipe_weights(steps, n_epochs):
    """The weight of each of ``n_epochs`` epochs in a recipe's mixture (``steps`` as
    `topk_certify_recipe` takes them), float64 (n_epochs,); None where a step could weigh
    some epoch below 0 (a weight below 0, eps outside [0, 1], a first step that mixes into
    nothing), where the monotone bounds of ``topk.certify_recipe``'s quick answers fail."""
    kinds, starts, pos, values = steps
    if len(kinds) == 0 or kinds[0] == MIX or not np.all(np.isfinite(values)):
        return None
    out = np.zeros(n_epochs)
    for step, kind in enumerate(kinds):
        at, value = pos[starts[step]:starts[step + 1]], values[starts[step]:starts[step + 1]]
        if kind == WEIGHTED:
            if np.any(value < 0):
                return None
            out = np.zeros(n_epochs)
            np.add.at(out, at, value)
            continue
        mean = np.zeros(n_epochs)
        np.add.at(mean, at, 1.0 / len(at))
        if kind == MEAN:
            out = mean
        elif 0.0 <= value[0] <= 1.0:
            out = value[0] * mean + (1.0 - value[0]) * out
        else:
            return None
    return out


def topk_bounds(fields, targets, vocab, layout, upper, lower=None):
    """One checkpoint's upper and lower bounds (float64 (N, M)) in ``layout`` from its
    records' ``fields`` (logits (N, k), ids (N, k), target (N,), lse (N,):
    `forgetkit.kinds.topk.record_fields`); ``layout``: (cls, label_col, unstored_col) as
    `topk_layout` gives them; ``lower`` None: upper only."""
    cls, label_col = layout[:2]
    n, width = cls.shape
    # each stored id's column: rows laid end to end ascend (padding vocab + 1 < vocab + 2)
    shift = np.arange(n, dtype=np.int64)[:, None] * (vocab + 2)
    flat = (cls + shift).ravel()
    key = np.asarray(fields[1], dtype=np.int64) + shift
    at = np.minimum(np.searchsorted(flat, key), flat.size - 1)
    cols = np.where(flat[at] == key, at - np.arange(n)[:, None] * width, -1)
    one, src = np.zeros(1, dtype=np.int64), np.arange(n, dtype=np.int64)
    cache = np.empty((1, n, fields[0].shape[1] + 2))
    topk_record_cache(tuple(f[None] for f in fields), one, src, targets, vocab, cache)
    ends = np.count_nonzero(cls <= vocab, axis=1)  # the padding's ids are above vocab
    return topk_window(cache, cols[:, None], one, one, (ends, label_col), upper, lower)


def topk_certify(upper, lower, layout, vocab):
    """(prediction int64 (N,), certified bool (N,), state int8 (N,): 1 certified correct, 0
    certified wrong, -1 uncertain) of a mixture's bounds in ``layout``."""
    cls, label_col, unstored_col = layout
    n = upper.shape[0]
    pred, certified = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    state = np.empty(n, dtype=np.int8)
    call(_topk.certify_rows, upper.size, upper, lower, cls, label_col, unstored_col, vocab,
         pred, certified, state)
    return pred, certified, state
