"""Token runs (language models): surprisal, memorization and per-sequence tables.

A sample of a token run is a target token, identified by (sequence id, position): a top-k
run holds both (``run.sequence_ids``, ``run.positions``); any other run (full logits, a
summary) takes them as ``sequence_ids=`` / ``positions=`` arrays (N,). Everything here reads
a run only through its exact per-token reads, correctness (the target is the argmax, ties
to the lowest id) and the target's probability p (`forgetkit.Run.label_probs`), so every
kind of run gives the same results, and a top-k run those of the full-vocabulary run it
stores (surprisal up to the float32 rounding of the stored target logit and log-sum-exp).

Every per-sequence or per-epoch value is a sum over tokens, computed per chunk of tokens on
the run's executor (`forgetkit.execution`) and summed: counts as integers, and floats as
exact sums (`exact_sums`: integers in units of 2**-1074, the spacing of every float64), so a
sequence whose tokens fall into several chunks gets the same bits on every executor; a mean
is the exact mean rounded once to float64.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from .._progress import Progress
from .._validation import check_bool, check_option
from ..backends import epoch_chunks
from ..errors import ForgetkitError, InputTypeError
from ..execution import executor_for
from ..run import check_run
from .dynamics import trajectory

#: Every finite float64 is an integer multiple of 2**-UNIT_EXPONENT.
UNIT_EXPONENT = 1074
_LIMB_BITS = 32
_MASK = (1 << _LIMB_BITS) - 1
#: Values per step of `ExactSums.add`: each adds less than 2**33 to an int64 cell.
_SUM_BLOCK = 1 << 20
#: Values an accumulator takes before its int64 cells are moved into Python ints.
_FLUSH_AFTER = 1 << 29


def exact_sums(values, groups, n_groups):
    """Exact sums of finite float64 ``values`` per group.

    Parameters
    ----------
    values : array-like of float (n,)
    groups : array-like of int (n,), each in [0, n_groups)
    n_groups : int

    Returns
    -------
    ndarray of object (n_groups,)
        Python ints K: the sum of group g is exactly K[g] * 2**-1074. Sums of parts add up
        to the sum of the whole, whatever the parts (chunks on any executor).
    """
    acc = ExactSums(n_groups)
    acc.add(values, groups)
    return acc.result()


class ExactSums:
    """Exact sums per group of float64 values added in any number of steps: each value is
    an integer number of units 2**-1074, split into 32-bit limbs added into int64 cells
    (n_groups, limbs present), moved into Python ints every `_FLUSH_AFTER` values and at
    the end (`result`)."""

    def __init__(self, n_groups):
        self.n_groups = int(n_groups)
        self.total = np.zeros(self.n_groups, dtype=object)
        self.acc, self.base, self.added = None, 0, 0

    def add(self, values, groups):
        """Add ``values`` (n,) to their ``groups`` (n,); returns self."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        groups = np.asarray(groups, dtype=np.int64).reshape(-1)
        if not np.isfinite(values).all():
            raise ForgetkitError("exact_sums takes finite values; got NaN or inf")
        keep = values != 0
        values, groups = values[keep], groups[keep]
        for start in range(0, len(values), _SUM_BLOCK):
            self._add(values[start:start + _SUM_BLOCK], groups[start:start + _SUM_BLOCK])
        return self

    def _add(self, values, groups):
        frac, exp = np.frexp(values)
        mant = (frac * 2.0 ** 53).astype(np.int64)  # exact: |mant| < 2**53
        shift = exp.astype(np.int64) + (UNIT_EXPONENT - 53)  # value = mant * 2**shift units
        low = shift < 0  # subnormals: mant ends in at least -shift zero bits
        mant[low] >>= -shift[low]
        shift[low] = 0
        sign, mag = np.sign(mant), np.abs(mant)
        limb, offset = shift // _LIMB_BITS, shift % _LIMB_BITS
        lo, hi = (mag & _MASK) << offset, (mag >> _LIMB_BITS) << offset  # < 2**63, < 2**52
        self._cover(int(limb.min()), int(limb.max()) + 2)
        width = self.acc.shape[1]
        at = groups * width + (limb - self.base)
        flat = self.acc.reshape(-1)
        for j, part in enumerate((lo & _MASK, (lo >> _LIMB_BITS) + (hi & _MASK),
                                  hi >> _LIMB_BITS)):
            np.add.at(flat, at + j, sign * part)
        self.added += len(values)
        if self.added >= _FLUSH_AFTER:
            self._flush()

    def _cover(self, first, last):
        """Make the cells hold limbs first..last."""
        if self.acc is None:
            self.acc, self.base = np.zeros((self.n_groups, last - first + 1), np.int64), first
            return
        top = self.base + self.acc.shape[1] - 1
        if first >= self.base and last <= top:
            return
        base, top = min(first, self.base), max(last, top)
        acc = np.zeros((self.n_groups, top - base + 1), np.int64)
        acc[:, self.base - base:self.base - base + self.acc.shape[1]] = self.acc
        self.acc, self.base = acc, base

    def _flush(self):
        if self.acc is None:
            return
        for j in range(self.acc.shape[1]):
            col = self.acc[:, j]
            rows = np.flatnonzero(col)
            if rows.size:
                self.total[rows] += col[rows].astype(object) * (1 << (_LIMB_BITS * (self.base + j)))
        self.acc, self.added = None, 0

    def result(self):
        """The sums: object (n_groups,) of Python ints, in units of 2**-1074."""
        self._flush()
        return self.total


def exact_means(sums, counts):
    """float64 means of `exact_sums` over ``counts`` values each: the exact mean rounded
    once (NaN where a count is 0)."""
    return np.array([int(k) / (int(c) << UNIT_EXPONENT) if c else np.nan
                     for k, c in zip(sums, counts, strict=True)], dtype=np.float64)


# ------------------------------------------------------------------ the tokens
def _check_ids(name, values, n):
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise ForgetkitError(f"{name} must have shape ({n},) (one per token); got shape "
                             f"{arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InputTypeError(f"{name} must be integers; got dtype {arr.dtype}")
    return arr.astype(np.int64)


class Tokens:
    """The tokens of a run: dense sequence codes (N,) into ``sequences`` (S,) (sorted
    sequence ids), positions (N,) or None, and how to find a chunk's tokens (by sample id).
    Picklable: the chunks' steps carry it to the workers."""

    def __init__(self, run, *, sequence_ids=None, positions=None, need_positions=False):
        n = run.n_samples
        if sequence_ids is None:
            sequence_ids = run.sequence_ids
        if sequence_ids is None:
            raise ForgetkitError("this analysis needs each token's sequence id: a top-k run "
                                 "holds them (run.sequence_ids); for another run pass "
                                 f"sequence_ids= (an int array of its {n} tokens)")
        seq = _check_ids("sequence_ids", sequence_ids, n)
        if positions is None:
            positions = run.positions
        if positions is None and need_positions:
            raise ForgetkitError("spans need each token's position: a top-k run holds them "
                                 "(run.positions); for another run pass positions= (an int "
                                 f"array of its {n} tokens)")
        self.positions = None
        if positions is not None:
            pos = _check_ids("positions", positions, n)
            if pos.size and pos.min() < 0:
                raise ForgetkitError(f"positions must be >= 0; got {int(pos.min())}")
            order = np.lexsort((pos, seq))
            same = (np.diff(seq[order]) == 0) & (np.diff(pos[order]) == 0)
            if same.any():
                i = order[int(np.argmax(same))]
                raise ForgetkitError(f"each token must be one (sequence, position); sequence "
                                     f"{seq[i]} position {pos[i]} appears more than once")
            self.positions = pos
        self.codes, self.sequences = pd.factorize(seq, sort=True)
        self.codes = self.codes.astype(np.int64)
        self.sequences = np.asarray(self.sequences, dtype=np.int64)
        self.ids = None if run.sample_ids is None else pd.Index(run.sample_ids)
        self.n_tokens = n

    @property
    def n_sequences(self):
        return len(self.sequences)

    def rows(self, chunk):
        """Positions in the whole run of the samples of ``chunk`` (the run itself, or the
        Run of a block of its samples, whose sample ids are the run's, or its positions
        when the run has none)."""
        if chunk.sample_ids is None:
            return np.arange(chunk.n_samples)
        if self.ids is None:
            return np.asarray(chunk.sample_ids, dtype=np.int64)
        rows = self.ids.get_indexer(chunk.sample_ids)
        if (rows < 0).any():
            raise ForgetkitError("a chunk holds samples that the run does not")
        return rows.astype(np.int64)

    def code(self, value):
        """Dense codes of sequence ids ``value`` (-1 for ids no token has)."""
        pos = np.searchsorted(self.sequences, value)
        pos = np.minimum(pos, max(len(self.sequences) - 1, 0))
        return np.where(self.sequences[pos] == value, pos, -1)


def _epoch_blocks(run):
    """(start, stop) epoch ranges of about the forgetting pass's bytes of outputs."""
    return epoch_chunks(run.n_epochs, run.n_samples * run.n_classes * run.outputs.itemsize)


def _label_probs(run, start, stop):
    """p of epochs start..stop-1: float64 (stop - start, n_samples)."""
    part = run if (start, stop) == (0, run.n_epochs) else run.isel(
        epochs=np.arange(start, stop))
    return np.asarray(part.label_probs()).T


def _surprisal_sums(values):
    """(exact sums of the finite surprisals, count of infinite ones) of surprisals: those
    of p == 0 are +inf and counted apart."""
    inf = np.isinf(values)
    return np.where(inf, 0.0, values), inf


# ------------------------------------------------------------------ surprisal
def surprisal(run):
    """Surprisal of every target token at every epoch: -log p_y, float64 (E, N) (a dask
    array for a run on one); +inf where p_y is 0 in float64."""
    check_run("run", run)
    p = run.label_probs()
    with np.errstate(divide="ignore"):
        return -np.log(p.T)


def _surprisal_step(chunk, *, tokens=None, progress=False):
    """Exact sums (E * G,) of a chunk's finite surprisals and counts (E * G,) of infinite
    ones, per (epoch, group): G = 1, or the sequences of ``tokens``."""
    n_epochs, n = chunk.n_epochs, chunk.n_samples
    n_groups = 1 if tokens is None else tokens.n_sequences
    group = np.zeros(n, np.int64) if tokens is None else tokens.codes[tokens.rows(chunk)]
    sums = ExactSums(n_epochs * n_groups)
    n_inf = np.zeros(n_epochs * n_groups, dtype=np.int64)
    bar = Progress(n_epochs, "surprisal", enabled=progress)
    for start, stop in _epoch_blocks(chunk):
        with np.errstate(divide="ignore"):
            values, inf = _surprisal_sums(-np.log(_label_probs(chunk, start, stop)))
        at = (np.arange(start, stop)[:, None] * n_groups + group[None, :]).reshape(-1)
        sums.add(values, at)
        n_inf += np.bincount(at[inf.reshape(-1)], minlength=len(n_inf))
        bar.update(stop - start)
    return sums.result(), n_inf


def _means(sums, n_inf, counts):
    means = exact_means(sums, counts)
    means[n_inf > 0] = np.inf
    return means


def mean_surprisal(run, *, sequence_ids=None, by="token", progress=False):
    """Mean surprisal -log p_y per epoch: over all tokens, or per sequence.

    Parameters
    ----------
    run : Run
    sequence_ids : array-like of int (N,), optional
        Each token's sequence (a top-k run holds them); needed for ``by="sequence"``.
    by : {"token", "sequence"}
        "token": the mean over every token, float64 (E,); "sequence": the mean over each
        sequence's tokens, a DataFrame (one row per sequence id, one column per epoch
        number).

    Means are exact means of the tokens' float64 surprisals rounded once, the same on
    every executor; +inf where a token's p_y is 0.
    """
    check_run("run", run)
    check_option("by", by, ("token", "sequence"))
    check_bool("progress", progress)
    tokens = None if by == "token" else Tokens(run, sequence_ids=sequence_ids)
    sums, n_inf = executor_for(run).map_reduce(run, partial(_surprisal_step, tokens=tokens),
                                               progress=progress, desc="surprisal")
    if tokens is None:
        return _means(sums, n_inf, np.full(run.n_epochs, run.n_samples))
    counts = np.bincount(tokens.codes, minlength=tokens.n_sequences)
    means = _means(sums, n_inf, np.tile(counts, run.n_epochs)).reshape(run.n_epochs, -1)
    return pd.DataFrame(means.T, index=pd.Index(tokens.sequences, name="sequence"),
                        columns=pd.Index(run.epochs, name="epoch"))


# ------------------------------------------------------------------ memorization
def _correct_counts(chunk, *, tokens, progress=False):
    """(tokens (S,), tokens correct (S, E)) of a chunk, per sequence: int64."""
    correct = np.asarray(chunk.correctness(progress=progress))
    codes = tokens.codes[tokens.rows(chunk)]
    n_seq = tokens.n_sequences
    counts = np.empty((n_seq, chunk.n_epochs), dtype=np.int64)
    for e in range(chunk.n_epochs):  # float weights: exact counts
        counts[:, e] = np.bincount(codes, weights=correct[e], minlength=n_seq)
    return np.bincount(codes, minlength=n_seq).astype(np.int64), counts


def _memorization_counts(chunk, *, tokens, progress=False):
    """`_correct_counts` and, per epoch, the tokens memorized at an earlier epoch and not
    at this one: int64 (E,)."""
    n, counts = _correct_counts(chunk, tokens=tokens, progress=progress)
    correct = np.asarray(chunk.correctness())
    lost = np.zeros(chunk.n_epochs, dtype=np.int64)
    earlier = np.zeros(chunk.n_samples, dtype=bool)
    for e in range(chunk.n_epochs):
        lost[e] = np.count_nonzero(earlier & ~correct[e])
        earlier |= correct[e]
    return n, counts, lost


def check_spans(spans, tokens):
    """Spans as (codes, starts, stops) int64 (J,) each: the rows of a DataFrame with
    columns sequence, start, stop (or an int array (J, 3)), positions start <= p < stop."""
    if isinstance(spans, pd.DataFrame):
        missing = {"sequence", "start", "stop"} - set(spans.columns)
        if missing:
            raise ForgetkitError(f"spans must have columns sequence, start, stop; missing "
                                 f"{sorted(missing)}")
        arr = spans[["sequence", "start", "stop"]].to_numpy()
    else:
        arr = np.asarray(spans)
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] == 0:
        raise ForgetkitError(f"spans must be rows (sequence, start, stop), at least one; "
                             f"got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InputTypeError(f"spans must hold integers; got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    codes = tokens.code(arr[:, 0])
    if (codes < 0).any():
        j = int(np.argmax(codes < 0))
        raise ForgetkitError(f"span {j} names sequence {arr[j, 0]}, which holds no token")
    if (arr[:, 2] <= arr[:, 1]).any():
        j = int(np.argmax(arr[:, 2] <= arr[:, 1]))
        raise ForgetkitError(f"span {j} must have start < stop; got start {arr[j, 1]}, stop "
                             f"{arr[j, 2]}")
    return codes, arr[:, 1], arr[:, 2]


def _span_counts(chunk, *, tokens, spans):
    """(tokens (J,), tokens correct (J, E)) of a chunk in each span: int64."""
    codes, starts, stops = spans
    rows = tokens.rows(chunk)
    scale = int(max(tokens.positions.max(initial=0), stops.max()) + 1)
    key = tokens.codes[rows] * scale + tokens.positions[rows]
    order = np.argsort(key, kind="stable")
    lo = np.searchsorted(key[order], codes * scale + starts, side="left")
    hi = np.searchsorted(key[order], codes * scale + np.minimum(stops, scale), side="left")
    correct = np.asarray(chunk.correctness())
    counts = np.empty((len(codes), chunk.n_epochs), dtype=np.int64)
    for start, stop in epoch_chunks(chunk.n_epochs, 8 * len(order)):  # tokens in key order
        cum = np.zeros((stop - start, len(order) + 1), dtype=np.int64)
        np.cumsum(correct[start:stop, order], axis=1, out=cum[:, 1:])
        counts[:, start:stop] = (cum[:, hi] - cum[:, lo]).T
    return hi - lo, counts


def memorized_spans(run, spans, *, sequence_ids=None, positions=None):
    """Whether each span is memorized at each epoch: every target token stored in it is
    the argmax (Tirumala et al. 2022). bool (E, J).

    Parameters
    ----------
    run : Run
    spans : DataFrame with columns sequence, start, stop, or int array (J, 3)
        Windows of positions start <= position < stop of a sequence (a whole sequence:
        start 0, stop its length).
    sequence_ids, positions : array-like of int (N,), optional
        Each token's sequence and position (a top-k run holds them).
    """
    check_run("run", run)
    tokens = Tokens(run, sequence_ids=sequence_ids, positions=positions, need_positions=True)
    spans = check_spans(spans, tokens)
    n, correct = executor_for(run).map_reduce(run, partial(_span_counts, tokens=tokens,
                                                           spans=spans))
    if (n == 0).any():
        j = int(np.argmax(n == 0))
        raise ForgetkitError(f"span {j} (sequence {tokens.sequences[spans[0][j]]}, positions "
                             f"{spans[1][j]}..{spans[2][j] - 1}) holds no stored token")
    return (correct == n[:, None]).T


def memorization(run, *, sequence_ids=None, positions=None, spans=None, progress=False):
    """Memorization over training: per epoch, the shares of tokens, of sequences and (with
    ``spans``) of spans memorized, every target token in them being the argmax.

    Parameters
    ----------
    run : Run
    sequence_ids, positions : array-like of int (N,), optional
        Each token's sequence and position (a top-k run holds them); positions only with
        ``spans``.
    spans : DataFrame or int array (J, 3), optional
        Windows (sequence, start, stop), as in `memorized_spans`.

    Returns
    -------
    DataFrame, one row per epoch number, fractions: ``tokens``, ``sequences`` (and
    ``spans``) memorized at that epoch; ``tokens_forgotten`` and ``sequences_forgotten``,
    memorized at an earlier epoch and not at that one (forgotten after memorized). ``attrs``
    holds ``n_tokens``, ``n_sequences`` (and ``n_spans``).
    """
    check_run("run", run)
    check_bool("progress", progress)
    tokens = Tokens(run, sequence_ids=sequence_ids, positions=positions,
                    need_positions=spans is not None)
    n, correct, lost = executor_for(run).map_reduce(
        run, partial(_memorization_counts, tokens=tokens), progress=progress,
        desc="forgetting pass")
    memorized = correct == n[:, None]  # (S, E)
    earlier = np.logical_or.accumulate(memorized, axis=1)
    table = pd.DataFrame({"tokens": correct.sum(axis=0) / run.n_samples,
                          "sequences": memorized.mean(axis=0),
                          "tokens_forgotten": lost / run.n_samples,
                          "sequences_forgotten": (earlier & ~memorized).mean(axis=0)},
                         index=pd.Index(run.epochs, name="epoch"))
    table.attrs.update(n_tokens=run.n_samples, n_sequences=tokens.n_sequences)
    if spans is not None:
        memorized = memorized_spans(run, spans, sequence_ids=tokens.sequences[tokens.codes],
                                    positions=tokens.positions)
        table["spans"] = memorized.mean(axis=1)
        table.attrs["n_spans"] = memorized.shape[1]
    return table


# ------------------------------------------------------------------ sequences
def _sequence_step(chunk, *, tokens, progress=False):
    """A chunk's per-sequence sums: (tokens (S,), tokens correct (S, E), forgetting events
    (S,), and exact sums (4, S) of surprisal at the first and last epochs, confidence and
    variability, with counts (2, S) of infinite surprisals)."""
    n, correct = _correct_counts(chunk, tokens=tokens, progress=progress)
    codes = tokens.codes[tokens.rows(chunk)]
    n_seq = tokens.n_sequences
    t = trajectory(chunk)
    events = np.bincount(codes, weights=t.forgetfulness, minlength=n_seq).astype(np.int64)
    sums = np.zeros((4, n_seq), dtype=object)
    n_inf = np.zeros((2, n_seq), dtype=np.int64)
    for i, e in enumerate((0, chunk.n_epochs - 1)):
        with np.errstate(divide="ignore"):
            values, inf = _surprisal_sums(-np.log(_label_probs(chunk, e, e + 1)[0]))
        sums[i] = exact_sums(values, codes, n_seq)
        n_inf[i] = np.bincount(codes[inf], minlength=n_seq)
    sums[2] = exact_sums(t.confidence, codes, n_seq)
    sums[3] = exact_sums(t.variability, codes, n_seq)
    return n, correct, events, sums, n_inf


def sequence_dynamics(run, *, sequence_ids=None, progress=False):
    """Per-sequence training dynamics of a token run: one row per sequence.

    Parameters
    ----------
    run : Run
        A token run (one sample per target token).
    sequence_ids : array-like of int (N,), optional
        Each token's sequence (a top-k run holds them).
    progress : bool, default False

    Returns
    -------
    DataFrame, index ``sequence`` (sorted ids), columns:

    - ``n_tokens``: stored target tokens;
    - ``accuracy_final``: share of them that are the argmax at the final epoch;
    - ``memorized_final``: every one is (the sequence is memorized, Tirumala et al. 2022);
    - ``first_memorized``: the first epoch number at which the sequence is memorized
      (<NA> if never); ``epochs_memorized``: the epochs at which it is;
    - ``forgotten``: memorized at some epoch but not at the final one;
    - ``memorization_losses``: epochs at which it is memorized and not at the next stored
      one (the sequence's own forgetting events);
    - ``forgetting_events``: its tokens' forgetting events, summed;
    - ``surprisal_first`` / ``surprisal_last``: mean -log p_y over its tokens at the first
      and the final epoch;
    - ``confidence`` / ``variability``: mean over its tokens of their data-map confidence
      and variability (`data_map`).

    Means are exact means rounded once: the same on every executor.
    """
    check_run("run", run)
    check_bool("progress", progress)
    tokens = Tokens(run, sequence_ids=sequence_ids)
    n, correct, events, sums, n_inf = executor_for(run).map_reduce(
        run, partial(_sequence_step, tokens=tokens), progress=progress,
        desc="sequence dynamics")
    memorized = correct == n[:, None]  # (S, E)
    ever = memorized.any(axis=1)
    first = np.argmax(memorized, axis=1)
    table = pd.DataFrame(
        {
            "n_tokens": n,
            "accuracy_final": correct[:, -1] / n,
            "memorized_final": memorized[:, -1],
            "first_memorized": pd.arrays.IntegerArray(run.epochs[first], ~ever),
            "epochs_memorized": memorized.sum(axis=1),
            "forgotten": ever & ~memorized[:, -1],
            "memorization_losses": (memorized[:, :-1] & ~memorized[:, 1:]).sum(axis=1),
            "forgetting_events": events,
            "surprisal_first": _means(sums[0], n_inf[0], n),
            "surprisal_last": _means(sums[1], n_inf[1], n),
            "confidence": exact_means(sums[2], n),
            "variability": exact_means(sums[3], n),
        },
        index=pd.Index(tokens.sequences, name="sequence"),
    )
    return table
