"""Kernels of fusion on top-k token runs (certified fusion): the per-token layout of the
classes a mixture can hold, each checkpoint's lower and upper bounds in that layout, and the
certificate of a mixture's bounds.

Layout of a token n (row n of ``cls``, ascending class ids): every class that some checkpoint
of the mixture stored among its top k, and the target; then, when these are fewer than the
vocabulary, one *unstored slot* standing for every other class (their common upper bound),
placed at the smallest such id that can reach that bound (ties with it follow the rule of
the lowest id): above each checkpoint's k-th stored id where its bound is its k-th
probability, since equal logits are stored by ascending id (the *tie floor*, the lowest
such id over the checkpoints, or -1: `token_floors`); then padding (id = vocabulary + 1,
value 0) up to the width.

The scans, the layout and the record cache read the records' fields in place (logits, ids
(E, N, k), target, lse (E, N), any strides), at the checkpoints ``epochs`` and tokens
``src`` (int64 indices): each token's candidate classes are gathered once per layout (a
bit set over the vocabulary, read back in order; beyond 2**16 classes a small hash set).
The fit and the selection first leave out the tokens no mixture gets right (`settle_scan`),
then keep the probabilities of every record of the others (`record_cache`: k + 2 float64
each, the exps made once; where a process has no room for them, each window makes its
own). The window kernels read only those probabilities: a window's mean of bounds is made
row by row (`window_bounds`), and the fit's passes use each row at once
(`window_grid_counts`, `window_into`) or, where bounds on a few of its values answer, not at
all (the eps search's early answers, the selection's argmax: `selection_counts`).

See docs/definitions.md ("Certified fusion on top-k runs").
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .eps_search import grid_counts, grid_row, label_lead_into, mix_row
from .jit import kernel
from .schedule import claim, span
from .views import borrow, row


@njit(cache=True, nogil=True)
def exp_into(x, out):
    """out[i] = exp(x[i]) for float64 x (n,), with the C library's exp: the one every
    kernel here calls, so that probabilities computed outside the kernels agree with theirs
    bit for bit."""
    for i in range(x.size):
        out[i] = math.exp(x[i])


@kernel
def label_probs(target, lse, out, n_blocks, counter):
    """out[n, e] = exp(target[e, n] - lse[e, n]), the float32 fields in float64 with the C
    library's exp (`exp_into`'s bits): target, lse (E, N) any strides; out (N, E), each
    token's probabilities together, as the likelihood fit reads them."""
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, out.shape[0], n_blocks)
        for e in range(target.shape[0]):
            for n in range(lo, hi):
                out[n, e] = math.exp(np.float64(target[e, n]) - np.float64(lse[e, n]))
        blk = claim(counter)


#: The slack of the unstored mass, relative to max(|lse|, |largest logit|, 1): the records'
#: probabilities exp(z - lse) sum over the vocabulary to 1 only up to the float32 rounding of
#: lse and of the logits (half a float32 step each, 2**-24 relative); four times that.
MASS_SLACK = 2.0 ** -21


@njit(inline="always")
def _record_probs(logits, ids, target, lse, e, s, y, out, r, t):
    """The probabilities of record (e, s) of a token of target y into rec = out[r, t]
    (k + 2,): rec[:k] the stored ones exp(z - lse), rec[k] = p_y, rec[k + 1] = u, the bound
    of the classes it did not store: min(p_k, max(0, 1 - mass) + slack), the mass summing
    the k stored probabilities and p_y where the target is not stored.
    Here and below, kernels pass arrays with indices rather than views made per token or
    record: each view costs reference counts, which both threads' atomic updates make
    slow."""
    k = logits.shape[2]
    top = np.float64(lse[e, s])
    total = 0.0
    stored_y = False
    p = 0.0
    for j in range(k):
        p = np.exp(np.float64(logits[e, s, j]) - top)
        out[r, t, j] = p
        total += p
        stored_y = stored_y or ids[e, s, j] == y
    p_y = np.exp(np.float64(target[e, s]) - top)
    if not stored_y:
        total += p_y
    out[r, t, k] = p_y
    # p: the k-th stored probability
    out[r, t, k + 1] = min(p, _room(total, _mass_slack(logits, e, s, top)))


@njit(inline="always")
def _mass_slack(logits, e, s, top):
    """`MASS_SLACK` of record (e, s) whose log-sum-exp is ``top``, in absolute terms."""
    return MASS_SLACK * max(abs(top), abs(np.float64(logits[e, s, 0])), 1.0)


@njit(inline="always")
def _room(mass, slack):
    """The unstored bound's mass term of a record whose stored mass (with p_y where the
    target is unstored) sums to ``mass``: max(0, 1 - mass) + slack (`_record_probs`)."""
    return max(0.0, 1.0 - mass) + slack


@njit(inline="always")
def _hash_slot(keys, stamps, stamp, c):
    """Insert class c into the open-addressed set (keys, stamps) of the entries marked
    ``stamp``; returns (its slot, whether it was new)."""
    mask = keys.shape[0] - 1
    h = (c * np.int64(0x9E3779B1)) & mask
    while stamps[h] == stamp and keys[h] != c:  # one exit: returns in loops compile slower
        h = (h + 1) & mask
    new = stamps[h] != stamp
    stamps[h] = stamp
    keys[h] = c
    return h, new


@njit(inline="always")
def _hash_size(n_epochs, k):
    """Slots of a set of up to n_epochs * k + 1 classes: a power of two, at most half full."""
    size = 16
    while size < 2 * (n_epochs * k + 1):
        size *= 2
    return size


#: Relative margin by which a class's bound must beat the target's probability at every
#: checkpoint for a token to be *settled* (wrong under every mixture the fit can make):
#: the rounding of a mixture's sums and mixing steps is some 2**-45 at most.
SETTLE_MARGIN = 2.0 ** -20
#: Smallest bound a settling class may take at a checkpoint: a mixture of such values
#: stays far above the underflow of its products with any eps.
SETTLE_FLOOR = 2.0 ** -900


@njit(inline="always")
def _tie_floor(ids, e, s, out, r, t):
    """A record's tie floor (`token_floors`) from its probabilities out[r, t]
    (`_record_probs`)."""
    k = ids.shape[2]
    return np.int64(ids[e, s, k - 1]) if out[r, t, k + 1] == out[r, t, k - 1] \
        else np.int64(-1)


@kernel
def token_floors(logits, ids, target, lse, epochs, src, targets, vocab, floor, hits,
                 n_blocks, counter):
    """floor[n] = min(vocab, the tie floor of each record of token src[n] at ``epochs``:
    its k-th stored id where its unstored bound is its k-th probability, else -1); where
    ``hits`` has rows (bool (W, n), else (0, 0)), hits[i, n] = the target is the argmax
    of record (epochs[i], src[n]) (its first stored id: ties go to the lowest id).

    logits, ids (E, N, k), target, lse (E, N): the records' fields, any strides; epochs,
    src: int64 indices."""
    k = logits.shape[2]
    keep_hits = hits.shape[0] > 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        rec = np.empty((1, 1, k + 2))
        for n in range(lo, hi):
            s, y = src[n], targets[n]
            low = np.int64(vocab)
            for i in range(epochs.shape[0]):
                _record_probs(logits, ids, target, lse, epochs[i], s, y, rec, 0, 0)
                low = min(low, _tie_floor(ids, epochs[i], s, rec, 0, 0))
                if keep_hits:
                    hits[i, n] = np.int64(ids[epochs[i], s, 0]) == y
            floor[n] = low
        blk = claim(counter)


@kernel
def record_cache(logits, ids, target, lse, epochs, src, targets, vocab, cache, floor, hits,
                 n_blocks, counter):
    """`token_floors` (floor, and hits where it has rows) that also keeps every record's
    probabilities: cache[i, n] = those of record (epochs[i], src[n]) (`_record_probs`: k
    stored, p_y, u; cache (W, n, k + 2), laid out by epoch as the records are, so that a
    window streams its epochs' planes)."""
    keep_hits = hits.shape[0] > 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        for n in range(lo, hi):
            floor[n] = vocab
        for i in range(epochs.shape[0]):
            e = epochs[i]
            for n in range(lo, hi):
                s = src[n]
                _record_probs(logits, ids, target, lse, e, s, targets[n], cache, i, n)
                floor[n] = min(floor[n], _tie_floor(ids, e, s, cache, i, n))
                if keep_hits:
                    hits[i, n] = np.int64(ids[e, s, 0]) == targets[n]
        blk = claim(counter)


#: A stored logit this far above the target's (same log-sum-exp) settles a checkpoint
#: without exps: exp(z - lse) > exp(t - lse) * (1 + `SETTLE_MARGIN`) and >= `SETTLE_FLOOR`
#: where z - t >= 2**-19 and -620 <= z - lse <= 1, since the differences' and exps'
#: roundings (some 2**-43 relative there) are far below the gap 2**-19 - log1p(2**-20).
SURE_GAP = 2.0 ** -19


@njit(inline="always")
def _beats(up, p_y):
    """Whether a bound ``up`` beats the target's probability p_y as settling needs."""
    return up > p_y * (1.0 + SETTLE_MARGIN) and up >= SETTLE_FLOOR


@njit(inline="always")
def _logit_beats(z, t, top):
    """`_beats` of exp(z - top) over exp(t - top) (a stored logit z and the target's t of
    one record, log-sum-exp top), without exps where the logits decide it: never where
    z <= t (exp is monotone, and a bound of at least `SETTLE_FLOOR` is normal, so within
    an ulp of its order), always where z - t >= `SURE_GAP` in the range that constant
    names."""
    if z <= t:
        return False
    if z - t >= SURE_GAP and -620.0 <= z - top <= 1.0:
        return True
    return _beats(np.exp(z - top), np.exp(t - top))


#: Relative slack of `_room_beats`'s upper bound on a record's mass over the float sum
#: `_record_probs` makes: the rounding of either sum (k + 1 terms) and the last ulp of exp
#: on descending logits are far below it.
MASS_ROOM = 1.0 + 2.0 ** -40


@njit(inline="always")
def _room_beats(logits, ids, target, lse, e, s, y):
    """`_beats` of the mass term of record (e, s)'s unstored bound u = min(p_k, room),
    room = max(0, 1 - mass) + slack (`_record_probs`), over the target's probability p_y,
    bit for bit, from the fewest exps: p_y, then the stored probabilities in order (they
    descend), each step bounding the mass from below (the sum so far: room at most) and
    from above (each probability left at most the last one made: room at least), until a
    bound decides; with every one made the mass is `_record_probs`'s own sum."""
    k = logits.shape[2]
    top = np.float64(lse[e, s])
    p_y = np.exp(np.float64(target[e, s]) - top)
    stored_y = False
    for j in range(k):
        stored_y = stored_y or ids[e, s, j] == y
    rest = 0.0 if stored_y else p_y
    slack = _mass_slack(logits, e, s, top)
    head = 0.0
    for m in range(k):
        p = np.exp(np.float64(logits[e, s, m]) - top)
        head += p  # the first m + 1 terms of `_record_probs`'s sum, in its order
        most = _room(head + rest, slack)
        if m == k - 1 or not _beats(most, p_y):
            break
        least = _room((head + (k - 1 - m) * p + rest) * MASS_ROOM, slack)
        if _beats(least, p_y):
            return True
    return _beats(most, p_y)


@njit(inline="always")
def _class_fails(logits, ids, target, lse, epochs, s, y, c, first):
    """The first position in ``epochs`` where class c's bound (its probability where
    stored, else the unstored bound u) does not beat the target's probability as settling
    needs (`_beats`), for the records of token s (target y), trying position ``first``
    before the others (-1: none) and the others in ascending order; -1 where it beats at
    every one. The logits decide most checkpoints with no exp (`_logit_beats`: c's stored logit,
    or the k-th, which bounds u, against the target's), two exps most others; where the
    bound is u and p_k beats, `_room_beats` decides the rest from the fewest exps."""
    k = logits.shape[2]
    lead = 1 if first >= 0 else 0
    for step in range(epochs.shape[0] + lead):
        i = first if step < lead else step - lead
        if step >= lead and i == first:
            continue
        e = epochs[i]
        top = np.float64(lse[e, s])
        at = -1
        for j in range(k):
            if np.int64(ids[e, s, j]) == c:
                at = j
        t = np.float64(target[e, s])
        if at >= 0:
            beats = _logit_beats(np.float64(logits[e, s, at]), t, top)
        else:  # u = min(p_k, room): both must beat
            beats = _logit_beats(np.float64(logits[e, s, k - 1]), t, top) and \
                _room_beats(logits, ids, target, lse, e, s, y)
        if not beats:
            return i
    return -1


@kernel
def settle_scan(logits, ids, target, lse, epochs, src, targets, vocab, rival, settled,
                n_blocks, counter):
    """settled[n] = some column beats the target's probability at every checkpoint of
    ``epochs`` by `SETTLE_MARGIN` (relative) and is at least `SETTLE_FLOOR`, for the token
    src[n] (rival[n] < 0: not settled). Tried in turn, each test stopping at the first
    checkpoint that fails it (`_class_fails`): class rival[n]; then each class stored above
    the target (by logit) at the checkpoint where the rival failed, as any class that beats
    the target there must be unless it is unstored there; then the unstored slot (bound u;
    where the epochs' ids and the target cannot fill the vocabulary).

    logits, ids (E, N, k), target, lse (E, N): the records' fields, any strides; epochs,
    src: int64 indices."""
    k = logits.shape[2]
    has_slot = epochs.shape[0] * k + 1 < vocab
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        for n in range(lo, hi):
            s, y, c = src[n], targets[n], rival[n]
            beats = False
            # the rival (try 0), then the classes stored above the target where it failed
            # (try j + 1: the j-th stored there), each from one call site (one inlined copy)
            e_f, t_f = np.int64(0), 0.0
            for attempt in range(k + 1 if c >= 0 else 0):
                d, first = c, np.int64(-1)
                if attempt > 0:
                    d = np.int64(ids[e_f, s, attempt - 1])
                    if d == y or d == c or np.float64(logits[e_f, s, attempt - 1]) <= t_f:
                        continue
                    first = epochs.shape[0] - 1  # the last checkpoint first: most fail there
                fail = _class_fails(logits, ids, target, lse, epochs, s, y, d, first)
                if fail < 0:
                    beats = True
                    break
                if attempt == 0:
                    e_f = epochs[fail]
                    t_f = np.float64(target[e_f, s])
            if not beats and has_slot and c >= 0:
                beats = True
                for i in range(epochs.shape[0]):  # u <= p_k: p_k must beat p_y first
                    if not beats:
                        break
                    e = epochs[i]
                    beats = _logit_beats(np.float64(logits[e, s, k - 1]),
                                         np.float64(target[e, s]), np.float64(lse[e, s]))
                for i in range(epochs.shape[0]):
                    if not beats:
                        break
                    beats = _room_beats(logits, ids, target, lse, epochs[i], s, y)
            settled[n] = beats
        blk = claim(counter)


@njit(inline="always")
def _place_class(cls, n, col, c, y, slot, slot_col, y_col):
    """Lay class c, the next in ascending order, into row n of ``cls`` from column ``col``,
    the unstored slot first where c is the first class above it. Returns (c's column, the
    next column, the slot's column, the target's column), the last two -1 until placed."""
    if slot >= 0 and slot_col < 0 and c > slot:
        slot_col = col
        cls[n, col] = slot
        col += 1
    if c == y:
        y_col = col
    cls[n, col] = c
    return col, col + 1, slot_col, y_col


@njit(inline="always")
def _place_slot_last(cls, n, col, slot, slot_col, vocab):
    """After the last class of row n: the unstored slot at column ``col`` where no class
    came above it (its id at most the vocabulary). Returns (the row's width, the slot's
    column)."""
    if slot >= 0 and slot_col < 0:
        slot_col = col
        cls[n, col] = min(slot, vocab)
        col += 1
    return col, slot_col


@njit(inline="always")
def _bit_index(low):
    """The index of the one bit set in the int64 ``low`` (a power of two, or -2**63): the
    exponent of its float64 value, which holds it exactly."""
    return ((np.float64(low).view(np.int64) >> 52) & 0x7FF) - 1023


@njit(inline="always")
def _layout_width(count, vocab):
    """Columns of the layout of a token of ``count`` classes: them, and the unstored slot
    where they are fewer than the vocabulary."""
    return count + 1 if count < vocab else count


@njit(inline="always")
def _bitset_insert(ids, epochs, s, y, bits):
    """Mark the target y and every class stored at ``epochs`` for token s in the bit set
    ``bits`` (int64 words, zero before): (the classes, the first and last word marked)."""
    first, last = y >> 6, y >> 6
    bits[y >> 6] |= np.int64(1) << (y & 63)
    count = 1
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for j in range(ids.shape[2]):
            c = np.int64(ids[e, s, j])
            w, bit = c >> 6, np.int64(1) << (c & 63)
            if bits[w] & bit == 0:
                bits[w] |= bit
                count += 1
                first, last = min(first, w), max(last, w)
    return count, first, last


@njit(inline="always")
def _bitset_layout(ids, epochs, s, y, vocab, floor, bits, where, cls, cols, n):
    """`_token_layout` for vocabularies up to `DIRECT_CLASSES`: the token's classes are
    marked in the bit set ``bits`` (int64 (vocab // 64 + 1,), zero, and left zero), read
    back in ascending order word by word (no sort), each one's column kept in ``where``
    (int32 (vocab + 1,)) for the stored ids: 33 KiB for 8,192 classes, within a core's
    first-level cache."""
    k = ids.shape[2]
    count, first, last = _bitset_insert(ids, epochs, s, y, bits)
    width = _layout_width(count, vocab)
    if width > cls.shape[1]:  # too wide for cls: left for a wider one
        for w in range(first, last + 1):
            bits[w] = 0
        return -width, np.int64(-1), np.int64(-1)
    slot = np.int64(-1)
    if count < vocab:  # the smallest class above floor not in the set
        slot = max(floor + 1, 0)
        while slot < vocab and (bits[slot >> 6] >> (slot & 63)) & 1:
            slot += 1
    slot_col, y_col = np.int64(-1), np.int64(-1)
    col = 0
    for w in range(first, last + 1):
        x = bits[w]
        bits[w] = 0
        while x != 0:
            low = x & -x
            x ^= low
            c = w * 64 + _bit_index(low)
            where[c], col, slot_col, y_col = _place_class(cls, n, col, c, y, slot, slot_col,
                                                          y_col)
    col, slot_col = _place_slot_last(cls, n, col, slot, slot_col, vocab)
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for j in range(k):
            cols[n, i, j] = where[np.int64(ids[e, s, j])]
    return col, y_col, slot_col


@njit(inline="always")
def _token_layout(ids, epochs, s, y, vocab, floor, keys, stamps, stamp, where, buf, cls,
                  cols, n):
    """The layout of one token (records at token s, target y; see the module): cls[n, :w]
    its classes and unstored slot (above ``floor``), cols[n, i, j] the column of the j-th
    id stored at epochs[i]; returns (w, the target's column, the slot's column or -1), or
    (-w, -1, -1) with nothing written where w is more than cls's columns.
    Scratch (`_layout_scratch`): for vocabularies up to `DIRECT_CLASSES` a bit set of the
    classes (keys) and each class's column (where): `_bitset_layout`; else the hash set
    (keys, stamps) marked ``stamp``, where (its size), buf (3, W * k + 1): the classes,
    their slots in the set, each stored id's slot."""
    if stamps.shape[0] == 0:
        return _bitset_layout(ids, epochs, s, y, vocab, floor, keys, where, cls, cols, n)
    k = ids.shape[2]
    h, _ = _hash_slot(keys, stamps, stamp, y)
    buf[0, 0], buf[1, 0] = y, h
    count = 1
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for j in range(k):
            c = np.int64(ids[e, s, j])
            h, new = _hash_slot(keys, stamps, stamp, c)
            buf[2, i * k + j] = h
            if new:
                buf[0, count], buf[1, count] = c, h
                count += 1
    width = _layout_width(count, vocab)
    if width > cls.shape[1]:  # too wide for cls: left for a wider one
        return -width, np.int64(-1), np.int64(-1)
    for i in range(1, count):  # insertion sort: a few dozen classes
        c, h = buf[0, i], buf[1, i]
        m = i
        while m > 0 and buf[0, m - 1] > c:
            buf[0, m], buf[1, m] = buf[0, m - 1], buf[1, m - 1]
            m -= 1
        buf[0, m], buf[1, m] = c, h
    slot = np.int64(-1)
    if count < vocab:  # the smallest class above floor not in buf
        slot = max(floor + 1, 0)
        for i in range(count):
            if buf[0, i] == slot:
                slot += 1
            elif buf[0, i] > slot:
                break
    slot_col, y_col = np.int64(-1), np.int64(-1)
    col = 0
    for i in range(count):
        where[buf[1, i]], col, slot_col, y_col = _place_class(cls, n, col, buf[0, i], y, slot,
                                                              slot_col, y_col)
    col, slot_col = _place_slot_last(cls, n, col, slot, slot_col, vocab)
    for i in range(epochs.shape[0]):
        for j in range(k):
            cols[n, i, j] = where[buf[2, i * k + j]]
    return col, y_col, slot_col


#: Vocabularies up to this size make a token's set of classes a bit set and a column per
#: class (`_bitset_layout`; 33 KiB per thread for 8,192 classes, 264 KiB at most), no
#: hashing and no sort.
DIRECT_CLASSES = 1 << 16


@njit(inline="always")
def _layout_scratch(n_epochs, k, vocab):
    """(keys, stamps, where, buf) of `_token_layout`: for vocabularies up to
    `DIRECT_CLASSES` a bit set of the classes and their columns (stamps and buf empty),
    else a hash set (its stamps: one per token)."""
    if vocab <= DIRECT_CLASSES:
        return (np.zeros(vocab // 64 + 1, dtype=np.int64), np.empty(0, dtype=np.int64),
                np.empty(vocab + 1, dtype=np.int32), np.empty((3, 0), dtype=np.int64))
    size = _hash_size(n_epochs, k)
    return (np.empty(size, dtype=np.int64), np.zeros(size, dtype=np.int64),
            np.empty(size, dtype=np.int32), np.empty((3, n_epochs * k + 1), dtype=np.int64))


@kernel
def layout_fill(ids, epochs, src, targets, vocab, floor, cls, ends, label_col, unstored_col,
                cols, n_blocks, counter):
    """Fill the layout of tokens src (`_token_layout`): cls[n, :ends[n]] (cls (n, M) int32
    or int64, the rest left as it is: the caller's padding), label_col[n] = the target's column,
    unstored_col[n] = the unstored slot's column (-1: none), cols[n, i, j] = the column of
    the j-th id stored at epochs[i] (cols (n, W, k): a token's columns together, as the
    selection and a window read them). A token whose layout is wider than M gets
    ends[n] = -(its width) and nothing else. ids (E, N, k), any strides."""
    keys, stamps, where, buf = _layout_scratch(epochs.shape[0], ids.shape[2], vocab)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        for n in range(lo, hi):
            ends[n], label_col[n], unstored_col[n] = _token_layout(
                ids, epochs, src[n], targets[n], vocab, floor[n], keys, stamps, n + 1, where,
                buf, cls, cols, n)
        blk = claim(counter)


@njit(inline="always")
def _window_row(cols, n, pos, rpos, p0, p1, recs, t, y_col, end, upper, lower, both, pre,
                pre_low):
    """The mean over the epochs at pos[p0:p1] of ``cols`` (rpos[p0:p1] of ``recs``) of
    token t's record probabilities ``recs`` (`record_cache`: (W, n, k + 2)) of each one's
    bounds in layout row n up to ``end``: for the classes a checkpoint stored and the
    target, the exact p (upper = lower); for every other column upper = u, lower = 0.

    Each column sums its values in epoch order and is then divided by their number where
    it is above 1, the arithmetic of numpy's ``out += bounds``, ``out /= W`` over rows of
    each epoch's bounds: an epoch adds its u to every column at once, and the stored
    columns and the target's then take what they held before plus their own value (the
    lower bounds add 0 to the others, which leaves them as they are).

    cols[n, r, j]: the column of the j-th id stored at layout epoch r (-1: none); upper,
    lower: rows (M,); scratch: pre, pre_low (k + 1,) (`_window_scratch`)."""
    n_epochs, k = p1 - p0, recs.shape[2] - 2
    for i in range(n_epochs):
        r, q = pos[p0 + i], rpos[p0 + i]
        if i > 0:  # the values the stored columns and the target's hold before this epoch
            for j in range(k):
                col = np.int64(cols[n, r, j])
                if col >= 0:
                    pre[j] = upper[col]
                    if both:
                        pre_low[j] = lower[col]
            pre[k] = upper[y_col]
            if both:
                pre_low[k] = lower[y_col]
        u = recs[q, t, k + 1]
        if i == 0:
            for c in range(end):
                upper[c] = u
            if both:
                for c in range(end):
                    lower[c] = 0.0
        else:
            for c in range(end):
                upper[c] += u
        for j in range(k):
            col = np.int64(cols[n, r, j])
            if col >= 0:
                p = recs[q, t, j]
                upper[col] = p if i == 0 else pre[j] + p
                if both:
                    lower[col] = p if i == 0 else pre_low[j] + p
        p_y = recs[q, t, k]  # the target's column holds p_y, stored or not
        upper[y_col] = p_y if i == 0 else pre[k] + p_y
        if both:
            lower[y_col] = p_y if i == 0 else pre_low[k] + p_y
    if n_epochs > 1:
        for c in range(end):
            upper[c] /= n_epochs
        if both:
            for c in range(end):
                lower[c] /= n_epochs


@njit(inline="always")
def _lead_columns(a, end):
    """The columns of a window row ``a`` (`_window_row`) that a lead or a grid count reads:
    those before its padding (``end``), or, where they are fewer than two (a lead reads two
    at least), the whole row, its padding set to 0."""
    if end >= 2:
        return end
    for c in range(end, a.shape[0]):
        a[c] = 0.0
    return a.shape[0]


@njit(inline="always")
def _window_scratch(k):
    """(pre, pre_low) of `_window_row` for records of k stored ids: (k + 1,) each."""
    return np.empty(k + 1), np.empty(k + 1)


@kernel
def window_bounds(cache, cols, pos, rpos, ends, label_col, upper, lower, n_blocks, counter):
    """The mean over a window of checkpoints of each one's bounds in the layout (see
    `_window_row`; padding 0): upper, lower float64 (n, M) (lower (0, 0): upper only).
    cache: the probabilities of the layout's records (`record_cache`, (W, n, k + 2)), the
    window's at rows ``rpos``; cols (n, layout epochs, k) the stored ids' columns, the
    window's at ``pos``; ends (n,) each row's columns before its padding, label_col
    (n,) its target's column."""
    width = upper.shape[1]
    both = lower.shape[0] > 0
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, ends.shape[0], n_blocks)
        pre, pre_low = _window_scratch(cache.shape[2] - 2)
        mean_up, mean_low = np.empty(width), np.empty(width)
        for n in range(lo, hi):
            end = ends[n]
            _window_row(cols, n, pos, rpos, 0, pos.shape[0], cache, n, label_col[n], end,
                        mean_up, mean_low, both, pre, pre_low)
            for c in range(end):
                upper[n, c] = mean_up[c]
            for c in range(end, width):
                upper[n, c] = 0.0
            if both:
                for c in range(end):
                    lower[n, c] = mean_low[c]
                for c in range(end, width):
                    lower[n, c] = 0.0
        blk = claim(counter)


@kernel(finish=grid_counts)
def window_grid_counts(cache, cols, pos, rpos, ends, label_col, prob, b_lead, b_magnitude,
                       b_top, grid, rel_band, n_blocks, counter):
    """``eps_search.grid_correct_counts`` of a = the window mean of the upper bounds
    (`window_bounds`, whose arguments come first) mixed into prob, each row read up to its
    padding (which holds 0 in both: it never changes which column is the first argmax, so
    the counts are the padded rows'). Returns int64 (G,).

    `grid_row` first answers the tokens whose row's lead of the target (and band) settle
    every eps at once; these are answered here without the row, from bounds: at each
    epoch no column other than the target's exceeds the largest stored probability not
    the target's (u is at most the k-th stored), and sums and quotients of floats are
    monotone in each term, so the mean of those maxima (summed in the same order) bounds
    the row's largest other value, hence its lead from below and its band from above;
    the target's value and that of b's top class are the row's, bit for bit."""
    k, width, n_window = cache.shape[2] - 2, prob.shape[1], pos.shape[0]
    n_grid = grid.shape[0]
    diff = np.zeros(n_grid + 1, dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, ends.shape[0], n_blocks)
        pre, pre_low = _window_scratch(k)
        a = np.zeros(width)
        for n in range(lo, hi):
            end, y = ends[n], label_col[n]
            if end >= 2:
                a_y, high = 0.0, 0.0
                for i in range(n_window):
                    r, q = pos[i], rpos[i]
                    best = cache[q, n, 1] if k > 1 else cache[q, n, k + 1]
                    if np.int64(cols[n, r, 0]) != y:
                        best = cache[q, n, 0]
                    if i == 0:
                        a_y, high = cache[q, n, k], best
                    else:
                        a_y += cache[q, n, k]
                        high += best
                if n_window > 1:
                    a_y /= n_window
                    high /= n_window
                lead_b = b_lead[n]
                band = rel_band * max(max(a_y, high), b_magnitude[n])  # values >= 0
                if a_y - high > band and lead_b > band:  # the lead is >= a_y - high
                    diff[0] += 1
                    diff[n_grid] -= 1
                    continue
                if lead_b < -band:  # the lead is <= a_y - (the row's value of b's top)
                    top_b, at_top = b_top[n], 0.0
                    for i in range(n_window):
                        r, q = pos[i], rpos[i]
                        value_top = cache[q, n, k + 1]
                        for j in range(k):
                            if np.int64(cols[n, r, j]) == top_b:
                                value_top = cache[q, n, j]
                        at_top = value_top if i == 0 else at_top + value_top
                    if n_window > 1:
                        at_top /= n_window
                    if at_top - a_y > band:
                        continue
            _window_row(cols, n, pos, rpos, 0, n_window, cache, n, y, end, a, a, False, pre,
                        pre_low)
            m = _lead_columns(a, end)
            grid_row(borrow(a)[:m], row(prob, n)[:m], y, b_lead[n], b_magnitude[n], b_top[n],
                     borrow(grid), rel_band, borrow(diff))
        blk = claim(counter)
    return diff


@kernel
def window_into(cache, cols, pos, rpos, ends, label_col, rows, mix, eps, lead, magnitude, top,
                correct, n_blocks, counter):
    """Each token's window mean a of the upper bounds (`window_bounds`, whose arguments come
    first), made in a scratch row, into its row of ``rows`` (n, M) at once: with ``mix``,
    ``eps_search.mix_into``'s step (rows[n] <- eps * a + (1 - eps) * rows[n], its padding,
    0 in both, left as it is; lead, magnitude, top and correct as mix_into leaves them);
    else rows[n] += a (numpy's ``total += mean``; padding adds 0; the lead arrays
    unused)."""
    width = rows.shape[1]
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, ends.shape[0], n_blocks)
        pre, pre_low = _window_scratch(cache.shape[2] - 2)
        a = np.zeros(width)
        for n in range(lo, hi):
            end = ends[n]
            _window_row(cols, n, pos, rpos, 0, pos.shape[0], cache, n, label_col[n], end, a,
                        a, False, pre, pre_low)
            if mix:  # up to the padding, whose 0s a mix keeps and leads never need
                m = _lead_columns(a, end)
                row_n = row(rows, n)[:m]
                mix_row(borrow(a)[:m], row_n, eps)
                label_lead_into(row_n, label_col[n], n, lead, magnitude, top, correct)
            else:
                for c in range(end):
                    rows[n, c] += a[c]
        blk = claim(counter)


@kernel
def selection_counts(cache, cols, ends, label_col, total, spans, n_blocks, counter):
    """For each epoch i of the layout, the tokens whose argmax of total[n] + that
    checkpoint's upper bounds (`window_bounds` of one epoch: cache (E, n, k + 2) and cols
    (n, E, k) of every epoch of the layout) is their target's column (the first argmax,
    numpy's rule: ``argmax.sum_correct_count_rows``), each row read up to its padding (which
    holds 0 in both: never the first argmax). Returns int64 (E,).

    spans (n, 4) float64: each token's least u, largest and least p_y, and largest value
    not the target's over every epoch, which no round changes: made where a row holds NaN
    (its first round) and read in the rounds after.

    The rows are not made: the target must beat every column before it and match every
    one after. The stored columns are checked one by one (and marked); every other column
    adds u, at most any stored probability, and sums are monotone, so a column of a side
    beats the target only where the column of the largest total on that side (the first
    of equals) does: where that one is stored it was checked, else it adds u too."""
    n_epochs, k, width = cols.shape[1], cache.shape[2] - 2, total.shape[1]
    counts = np.zeros(n_epochs, dtype=np.int64)
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, ends.shape[0], n_blocks)
        marks = np.zeros(width, dtype=np.int64)
        for n in range(lo, hi):
            y, end = label_col[n], ends[n]
            # a column whose total plus the least u beats the target's total plus its
            # largest p beats it at every epoch (each value is at least u; sums monotone);
            # the target's total plus its least p beats every column at every epoch where it
            # beats the largest other total plus the largest value not the target's (the
            # largest stored one not the target's: u is at most the k-th stored)
            if np.isnan(spans[n, 0]):
                low_u, high_y = np.inf, -np.inf
                low_y, high_other = np.inf, -np.inf
                for r in range(n_epochs):
                    low_u = min(low_u, cache[r, n, k + 1])
                    high_y = max(high_y, cache[r, n, k])
                    low_y = min(low_y, cache[r, n, k])
                    other = cache[r, n, 0] if np.int64(cols[n, r, 0]) != y else \
                        (cache[r, n, 1] if k > 1 else cache[r, n, k + 1])
                    high_other = max(high_other, other)
                spans[n, 0], spans[n, 1], spans[n, 2], spans[n, 3] = \
                    low_u, high_y, low_y, high_other
            low_u, high_y, low_y, high_other = spans[n, 0], spans[n, 1], spans[n, 2], spans[n, 3]
            before, after = -1, -1  # each side's column of the largest total
            for c in range(end):
                if c < y:
                    if before < 0 or total[n, c] > total[n, before]:
                        before = c
                elif c > y and (after < 0 or total[n, c] > total[n, after]):
                    after = c
            top = -np.inf
            if before >= 0:
                top = total[n, before]
            if after >= 0:
                top = max(top, total[n, after])
            if top + low_u > total[n, y] + high_y:
                continue
            if total[n, y] + low_y > top + high_other:
                for r in range(n_epochs):
                    counts[r] += 1
                continue
            for r in range(n_epochs):
                stamp = n * n_epochs + r + 1
                v_y = total[n, y] + cache[r, n, k]
                first = True
                for j in range(k):
                    c = np.int64(cols[n, r, j])
                    marks[c] = stamp
                    if c != y:
                        v = total[n, c] + cache[r, n, j]
                        if v > v_y or (v == v_y and c < y):
                            first = False
                            break
                u = cache[r, n, k + 1]
                if first and before >= 0 and marks[before] != stamp:
                    first = total[n, before] + u < v_y  # before the target: beaten
                if first and after >= 0 and marks[after] != stamp:
                    first = total[n, after] + u <= v_y  # after it: matched
                counts[r] += first
        blk = claim(counter)
    return counts


@njit(inline="always")
def _certify_row(upper, lower, row_cls, width, vocab, slot_col, y_col):
    """(prediction, certified, state) of one token's mixture bounds in its layout row
    (columns of ids > vocab: padding): see `certify_rows`."""
    best = -1
    for c in range(width):
        if row_cls[c] > vocab or c == slot_col:
            continue
        if best < 0 or lower[c] > lower[best]:
            best = c
    sure = True
    for c in range(width):
        if c == best or row_cls[c] > vocab:
            continue
        if row_cls[c] < row_cls[best]:
            sure = sure and lower[best] > upper[c]
        else:
            sure = sure and lower[best] >= upper[c]
    q = upper[y_col]
    wrong = False
    for c in range(width):
        if c == y_col or row_cls[c] > vocab:
            continue
        if row_cls[c] < row_cls[y_col]:
            wrong = wrong or lower[c] >= q
        else:
            wrong = wrong or lower[c] > q
    state = 1 if sure and best == y_col else (0 if wrong else -1)
    return row_cls[best], sure, state


@kernel
def certify_rows(upper, lower, cls, label_col, unstored_col, vocab, pred, certified, state,
                 n_blocks, counter):
    """The certificate of a mixture's bounds, row by row (upper, lower float64 (N, M) in the
    layout): pred[n] = the class of largest lower bound (ties: the lowest id); certified[n]
    = its lower bound beats every other column's upper bound (>= a higher id, > a lower
    one); state[n] = 1 certified correct (the target beats every upper bound), 0 certified
    wrong (some class's lower bound beats the target's exact value), -1 uncertain."""
    n_tokens, width = upper.shape
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, n_tokens, n_blocks)
        for n in range(lo, hi):
            pred[n], certified[n], state[n] = _certify_row(
                upper[n], lower[n], cls[n], width, vocab, unstored_col[n], label_col[n])
        blk = claim(counter)


#: The slack of `_other_bound`'s bound over a stored probability whose logit is not above
#: its own (exp is within one unit in the last place; 2**-1000 covers subnormal results).
OTHER_SLACK = 1.0 + 2.0 ** -40
OTHER_FLOOR = 2.0 ** -1000


@njit(inline="always")
def _other_bound(logits, ids, lse, e, s, y):
    """A bound, at least the upper bound of every class other than y in record (e, s)
    (`_record_probs`: each stored p_c, and the unstored u, which is at most the k-th stored
    probability), from one exp: that of the largest stored logit not the target's (or the
    k-th's, if larger)."""
    k = logits.shape[2]
    z = np.float64(logits[e, s, k - 1])
    for j in range(k):
        if ids[e, s, j] != y:
            z = max(z, np.float64(logits[e, s, j]))
    return np.exp(z - np.float64(lse[e, s])) * OTHER_SLACK + OTHER_FLOOR


@njit(cache=True, nogil=True)  # called three times per token: compiled once, not inlined
def _recipe_value(vals, kinds, starts, pos, values):
    """A recipe's mixture (see `certify_recipe`) of one column whose value at epochs[r] is
    vals[r], in `certify_recipe`'s arithmetic operation for operation (the same bits)."""
    out = 0.0
    for step in range(kinds.shape[0]):
        p0, p1 = starts[step], starts[step + 1]
        if kinds[step] == 1:  # WEIGHTED
            out = 0.0
            for i in range(p0, p1):
                out += values[i] * vals[pos[i]]
            continue
        mean = vals[pos[p0]]
        for i in range(p0 + 1, p1):
            mean += vals[pos[i]]
        if p1 - p0 > 1:
            mean /= p1 - p0
        if kinds[step] == 0:  # MEAN
            out = mean
        else:  # MIX
            eps = values[p0]
            out = eps * mean + (1.0 - eps) * out
    return out


@kernel
def certify_recipe(logits, ids, target, lse, epochs, src, targets, vocab, kinds, starts, pos,
                   values, quick, lead, pred, certified, state, label_prob, n_blocks, counter):
    """The certificate of a recipe's mixture (`certify_rows`) of tokens src, each token's
    layout (over ``epochs``, ascending), bounds and mixture made in scratch rows from its
    records' probabilities, each computed once. The recipe: step s of kind kinds[s]
    (``recipes``: MEAN, WEIGHTED, MIX) over the epochs at positions pos[starts[s]:
    starts[s + 1]] of ``epochs``, with values[starts[s]:...] (WEIGHTED: the weights; MIX:
    eps, at the step's first position), in the fusers' arithmetic: a mean is summed in
    order and then divided, a weighted sum starts from 0 and adds w * bounds, a mix is
    eps * mean + (1 - eps) * b. label_prob[n]: the target's exact fused probability.

    With ``quick`` >= 1 (the recipe's weights and eps in [0, 1], its first step not a
    MIX) most tokens are answered from two or three exps per record rather than k + 1 and
    no layout: the target's mixture q, and the mixture of a bound on every other class
    (`_other_bound`); the operations of a mixture are monotone in each value, so where q
    beats that mixture it beats every other column's upper bound (certified correct,
    predicting the target). With ``quick`` 2 (only ``state`` and ``label_prob`` wanted) a
    token is also answered certified wrong where the lower mixture of its rival (the class
    other than the target with the largest stored logit at position ``lead``) beats q as
    `certify_rows` asks; pred and certified are then not computed (-1, False)."""
    n_epochs, k = epochs.shape[0], logits.shape[2]
    width = n_epochs * k + 2
    blk = claim(counter)
    while blk < n_blocks:
        lo, hi = span(blk, src.shape[0], n_blocks)
        keys, stamps, where, buf = _layout_scratch(n_epochs, k, vocab)
        recs = np.empty((n_epochs, 1, k + 2))
        pre, pre_low = _window_scratch(k)
        one_cls = np.empty((1, width), dtype=np.int64)  # the token's layout, as row 0
        row_cls = one_cls[0]
        tcols = np.empty((1, n_epochs, k), dtype=np.int64)
        upper, lower, tmp, tmp_low = (np.empty(width), np.empty(width), np.empty(width),
                                      np.empty(width))
        vals = np.empty(n_epochs)
        # borrowed: `_recipe_value` is called, not inlined (see views.borrow)
        recipe = (borrow(vals), borrow(kinds), borrow(starts), borrow(pos), borrow(values))
        for n in range(lo, hi):
            s, y = src[n], targets[n]
            if quick > 0:
                for i in range(n_epochs):
                    e = epochs[i]
                    vals[i] = np.exp(np.float64(target[e, s]) - np.float64(lse[e, s]))
                q = _recipe_value(*recipe)
                # the likelier answer first: correct where the target leads at ``lead``
                leads, answered = ids[epochs[lead], s, 0] == y, False
                for test in range(2):
                    if (test == 0) == leads:  # certified correct?
                        for i in range(n_epochs):
                            vals[i] = _other_bound(logits, ids, lse, epochs[i], s, y)
                        if q > _recipe_value(*recipe):
                            pred[n], certified[n], state[n], label_prob[n] = y, True, 1, q
                            answered = True
                            break
                    elif quick > 1:  # certified wrong, by the rival?
                        e = epochs[lead]
                        c = np.int64(ids[e, s, 0]) if not leads \
                            else np.int64(ids[e, s, min(1, k - 1)])
                        for i in range(n_epochs):
                            e = epochs[i]
                            vals[i] = 0.0
                            for j in range(k):
                                if ids[e, s, j] == c:
                                    vals[i] = np.exp(np.float64(logits[e, s, j])
                                                     - np.float64(lse[e, s]))
                        low = _recipe_value(*recipe)
                        if c != y and (low >= q if c < y else low > q):
                            pred[n], certified[n], state[n], label_prob[n] = -1, False, 0, q
                            answered = True
                            break
                if answered:
                    continue
            floor = np.int64(vocab)
            for i in range(n_epochs):
                _record_probs(logits, ids, target, lse, epochs[i], s, y, recs, i, 0)
                floor = min(floor, _tie_floor(ids, epochs[i], s, recs, i, 0))
            end, y_col, slot_col = _token_layout(ids, epochs, s, y, vocab, floor, keys, stamps,
                                                 n + 1, where, buf, one_cls, tcols, 0)
            for step in range(kinds.shape[0]):
                p0, p1 = starts[step], starts[step + 1]
                weighted = kinds[step] == 1
                if weighted:
                    for c in range(end):
                        upper[c] = 0.0
                        lower[c] = 0.0
                # one call site of the (inlined) window row: a MEAN or MIX step's window
                # p0..p1 once, a WEIGHTED step's epochs one by one
                for i in range(p0, p1 if weighted else p0 + 1):
                    w0, w1 = (i, i + 1) if weighted else (p0, p1)
                    _window_row(tcols, 0, pos, pos, w0, w1, recs, 0, y_col, end, tmp, tmp_low,
                                True, pre, pre_low)
                    if kinds[step] == 0:  # MEAN
                        for c in range(end):
                            upper[c] = tmp[c]
                            lower[c] = tmp_low[c]
                    elif weighted:
                        w = values[i]
                        for c in range(end):
                            upper[c] += w * tmp[c]
                            lower[c] += w * tmp_low[c]
                    else:  # MIX
                        eps = values[p0]
                        one_minus = 1.0 - eps
                        for c in range(end):
                            upper[c] = eps * tmp[c] + one_minus * upper[c]
                            lower[c] = eps * tmp_low[c] + one_minus * lower[c]
            pred[n], certified[n], state[n] = _certify_row(upper, lower, row_cls, end, vocab,
                                                           slot_col, y_col)
            label_prob[n] = upper[y_col]
        blk = claim(counter)
