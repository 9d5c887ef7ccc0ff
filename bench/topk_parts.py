"""Where a top-k fit's record kernels spend their time on this machine: one thread, the
kernels and stripped copies of their loops on the unsettled tokens of a run's first
65,536 tokens, nanoseconds per record (best of 5).

    taskset -c 0 env NUMBA_NUM_THREADS=1 python -m bench.topk_parts RUN

The copies: the layout's id reads alone and with its bit-set insert; the record cache
without exps; its nine exps alone (the C library's); its exps by the kernels' polynomial exp
in vector lanes (a variant measured and not kept: bench/RESULTS.md); the records read epoch
by epoch. With new pages the record cache also pays the page faults of its array.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from numba import njit

import forgetkit as fk
from forgetkit import kernels
from forgetkit.fusion.topk import _rival
from forgetkit.kernels.softmax import _exp_nonpositive
from forgetkit.kernels.topk import _bitset_insert
from forgetkit.kinds.topk import TopKData


@njit(nogil=True)
def read_ids(ids, epochs, src):
    acc = 0
    for n in range(src.shape[0]):
        s = src[n]
        for i in range(epochs.shape[0]):
            e = epochs[i]
            for j in range(ids.shape[2]):
                acc += np.int64(ids[e, s, j])
    return acc


@njit(nogil=True)
def insert_only(ids, epochs, src, targets, vocab):
    bits = np.zeros(vocab // 64 + 1, dtype=np.int64)
    total = 0
    for n in range(src.shape[0]):
        count, first, last = _bitset_insert(ids, epochs, src[n], targets[n], bits)
        for w in range(first, last + 1):
            bits[w] = 0
        total += count
    return total


@njit(nogil=True)
def read_records(logits, ids, target, lse, epochs, src):
    acc = 0.0
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for n in range(src.shape[0]):
            s = src[n]
            for j in range(logits.shape[2]):
                acc += logits[e, s, j] + ids[e, s, j]
            acc += target[e, s] + lse[e, s]
    return acc


@njit(nogil=True)
def cache_no_exp(logits, ids, target, lse, epochs, src, targets, cache):
    k = logits.shape[2]
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for n in range(src.shape[0]):
            s, y = src[n], targets[n]
            top = np.float64(lse[e, s])
            total = 0.0
            stored_y = False
            p = 0.0
            for j in range(k):
                p = np.float64(logits[e, s, j]) - top
                cache[i, n, j] = p
                total += p
                stored_y = stored_y or ids[e, s, j] == y
            p_y = np.float64(target[e, s]) - top
            if not stored_y:
                total += p_y
            cache[i, n, k] = p_y
            cache[i, n, k + 1] = min(p, total)


@njit(nogil=True)
def exps_only(logits, target, lse, epochs, src):
    acc = 0.0
    k = logits.shape[2]
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for n in range(src.shape[0]):
            s = src[n]
            top = np.float64(lse[e, s])
            for j in range(k):
                acc += np.exp(np.float64(logits[e, s, j]) - top)
            acc += np.exp(np.float64(target[e, s]) - top)
    return acc



@njit(nogil=True)
def cache_vector_exp(logits, ids, target, lse, epochs, src, targets, cache):
    """The record cache with the kernels' polynomial exp in vector lanes: each block of 16
    tokens' exponents written into their cache rows (contiguous), exps in place, then the
    bound and the mass."""
    k = logits.shape[2]
    width = k + 2
    flat = cache.reshape(cache.shape[0], -1)
    for i in range(epochs.shape[0]):
        e = epochs[i]
        for n0 in range(0, src.shape[0], 16):
            n1 = min(n0 + 16, src.shape[0])
            for n in range(n0, n1):
                s = src[n]
                top = np.float64(lse[e, s])
                for j in range(k):
                    cache[i, n, j] = max(np.float64(logits[e, s, j]) - top, -700.0)
                cache[i, n, k] = max(np.float64(target[e, s]) - top, -700.0)
                cache[i, n, k + 1] = 0.0
            row = flat[i, n0 * width: n1 * width]
            for c in range(row.shape[0]):
                row[c] = _exp_nonpositive(min(row[c], 0.0))
            for n in range(n0, n1):
                s, y = src[n], targets[n]
                total = 0.0
                stored_y = False
                for j in range(k):
                    total += cache[i, n, j]
                    stored_y = stored_y or ids[e, s, j] == y
                if not stored_y:
                    total += cache[i, n, k]
                cache[i, n, k + 1] = min(cache[i, n, k - 1], max(0.0, 1.0 - total) + 1e-7)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    run = fk.load(argv[0])
    data = TopKData(run.outputs.records, run.labels, run.n_classes)
    rows = slice(0, 65536)
    fields = data.fields(rows)
    targets = data.targets[rows]
    ep = np.arange(fields[0].shape[0], dtype=np.int64)
    every = np.arange(targets.shape[0], dtype=np.int64)
    rival = _rival(fields[1][-1], targets)
    with kernels.forced("serial"):
        settled = kernels.topk_settle(fields, ep, every, targets, data.vocab_size, rival)
    src = np.flatnonzero(~settled).astype(np.int64)
    tg = targets[src]
    logits, ids, target, lse = fields
    cache = np.zeros((ep.size, src.size, data.top_k + 2))
    print(f"unsettled {src.size} of {targets.shape[0]}; one thread, ns per unsettled record")

    def timed(name, fn, rounds=5):
        fn()  # compiles
        best = np.inf
        for _ in range(rounds):
            start = time.process_time()
            fn()
            best = min(best, time.process_time() - start)
        print(f"  {name:36s} {best:.4f} s  {best / (src.size * ep.size) * 1e9:6.1f}")

    def new_pages():
        kernels.topk_record_cache(fields, ep, src, tg, data.vocab_size, np.empty_like(cache))

    with kernels.forced("serial"):
        timed("layout_fill", lambda: kernels.topk_layout(fields, ep, src, tg, data.vocab_size,
                                                         np.full(src.size, -1)))
        timed("layout: ids read token by token", lambda: read_ids(ids, ep, src))
        timed("layout: ids and bit-set insert",
              lambda: insert_only(ids, ep, src, tg, data.vocab_size))
        timed("record_cache (pages touched)",
              lambda: kernels.topk_record_cache(fields, ep, src, tg, data.vocab_size, cache))
        timed("record_cache without exps",
              lambda: cache_no_exp(logits, ids, target, lse, ep, src, tg, cache))
        timed("record_cache, polynomial exp",
              lambda: cache_vector_exp(logits, ids, target, lse, ep, src, tg, cache))
        timed("records read epoch by epoch",
              lambda: read_records(logits, ids, target, lse, ep, src))
        timed("nine exps per record alone", lambda: exps_only(logits, target, lse, ep, src))
        timed("record_cache (new pages)", new_pages)
        timed("settle_scan (every token)", lambda: kernels.topk_settle(
            fields, ep, every, targets, data.vocab_size, rival))


if __name__ == "__main__":
    main()
