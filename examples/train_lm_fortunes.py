"""A small GPT-2-style language model trained on real text, recorded as top-k token runs.

The text: the quotes of Debian's ``fortunes`` package (/usr/share/games/fortunes) and the
reStructuredText sources of the Python 3.11 documentation (Debian's ``python3.11-doc``,
/usr/share/doc/python3.11/html/_sources). Documents are the quotes and the paragraphs of
the documentation; a random share of them is held out.

    # here, on the CPU: the corpus, a byte-level BPE tokenizer trained on the training
    # documents, and the token streams (uint16)
    python examples/train_lm_fortunes.py prepare data_lm --vocab 8192 --heldout 1050000

    # on a GPU: train from a GPT2Config (no download), record every --every steps with
    # forgetkit.exporters.torch.TokenRecorder at k = 16 on the held-out tokens (and on a
    # sample of the training tokens), then the figures
    python examples/train_lm_fortunes.py train data_lm out_lm --steps 1500 --every 30

    # weight averages of the saved checkpoints against output-space fusion (a GPU)
    python examples/train_lm_fortunes.py train data_lm out_lm --steps 1500 --every 60 \
        --heldout-blocks 500 --save-checkpoints ckpt_lm --no-figures
    python examples/train_lm_fortunes.py weights data_lm out_lm ckpt_lm

    # the figures of a recorded run (also run at the end of `train`)
    python examples/train_lm_fortunes.py figures out_lm --small small.npz

    # the small version as a top-k run (data_samples/lm_fortunes_gpt2_heldout_top8.npy)
    python examples/train_lm_fortunes.py sample small.npz lm_fortunes_gpt2_heldout_top8.npy
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import time
from pathlib import Path

import numpy as np

FORTUNES = "/usr/share/games/fortunes"
PYDOCS = "/usr/share/doc/python3.11/html/_sources"
EOS = "<|endoftext|>"


# ---------------------------------------------------------------- prepare (CPU)
def documents():
    """(source, text) of every document: each fortune, each paragraph of the docs."""
    docs = []
    for f in sorted(glob.glob(f"{FORTUNES}/*")):
        if f.endswith((".dat", ".u8")) or os.path.islink(f) or not os.path.isfile(f):
            continue
        text = Path(f).read_bytes().decode("utf-8", errors="replace")
        docs += [("fortunes/" + Path(f).name, q.strip("\n"))
                 for q in re.split(r"^%\n", text, flags=re.M) if q.strip()]
    for f in sorted(glob.glob(f"{PYDOCS}/**/*.rst.txt", recursive=True)):
        text = Path(f).read_text(errors="replace")
        name = "python3.11-doc/" + os.path.relpath(f, PYDOCS)
        docs += [(name, p.strip("\n")) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return docs


def prepare(out, *, vocab, heldout, seed=0, limit=None):
    """The tokenizer and the token streams in ``out``."""
    from tokenizers import ByteLevelBPETokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    docs = documents()
    if limit:
        docs = docs[:: max(1, len(docs) // limit)][:limit]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(docs))
    chars = np.array([len(docs[i][1]) for i in order])
    # held out: documents in random order until about ``heldout`` tokens (3.7 chars a token,
    # checked after tokenizing; more documents are taken if short)
    cut = int(np.searchsorted(np.cumsum(chars), heldout * 3.7))
    held_docs, train_docs = sorted(order[:cut]), sorted(order[cut:])
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator((docs[i][1] for i in train_docs), vocab_size=vocab,
                            min_frequency=2, special_tokens=[EOS], show_progress=False)
    tok.save(str(out / "tokenizer.json"))
    eos = tok.token_to_id(EOS)

    def stream(indices):
        enc = tok.encode_batch([docs[i][1] for i in indices])
        lengths = np.array([len(e.ids) + 1 for e in enc])
        ids = np.concatenate([np.array(e.ids + [eos], dtype=np.uint16) for e in enc])
        return ids, lengths

    held, held_len = stream(held_docs)
    train, train_len = stream(train_docs)
    np.save(out / "heldout.npy", held)
    np.save(out / "train.npy", train)
    info = {"vocab_size": tok.get_vocab_size(), "eos": eos, "documents": len(docs),
            "heldout_documents": len(held_docs), "train_documents": len(train_docs),
            "heldout_tokens": int(len(held)), "train_tokens": int(len(train)),
            "sources": {"fortunes": FORTUNES, "python3.11-doc": PYDOCS}, "seed": seed}
    (out / "corpus.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))
    return info


# ---------------------------------------------------------------- train (GPU)
def blocks(stream, length, count=None):
    """Consecutive blocks of ``length`` tokens (the tail dropped), at most ``count``."""
    n = len(stream) // length if count is None else min(count, len(stream) // length)
    return np.asarray(stream[: n * length], dtype=np.int64).reshape(n, length)


def heldout(data, context, count=None):
    """(ids, blocks) of the held-out blocks of ``context`` tokens: all, or ``count`` evenly
    spread over the held-out stream (its documents are sorted by source)."""
    held = blocks(np.load(Path(data) / "heldout.npy"), context)
    ids = np.arange(len(held))
    if count:
        ids = np.unique(np.linspace(0, len(held) - 1, count).astype(np.int64))
    return ids, held[ids]


def weights(data, out, checkpoints, *, last=(2, 5, 10, 20), decays=(0.5, 0.8, 0.9, 0.95),
            seeds=(0, 1, 2), eval_batch=256, device="cuda"):
    """Weight space against output space on the held-out tokens: the checkpoints saved by
    ``train --save-checkpoints`` averaged (the last n, EMA, the greedy soup) beside
    `forgetkit.compare`'s methods on the recorded run, by
    `forgetkit.exporters.torch.compare_weight_space`; writes out/weight_space.json."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import forgetkit as fk
    from forgetkit.exporters.torch import compare_weight_space

    out = Path(out)
    run = fk.load(out / "heldout.npy")
    meta = run.meta
    held_ids, held = heldout(data, meta["context"], meta["heldout_blocks"])
    model = GPT2LMHeadModel(GPT2Config.from_dict(meta["model"])).to(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    t = time.perf_counter()
    table = compare_weight_space(model, Path(checkpoints) / "step_*.pt",
                                 {"input_ids": torch.from_numpy(held)}, run,
                                 sequence_ids=held_ids, last=last, decays=decays, seeds=seeds,
                                 batch_size=eval_batch, device=device)
    seconds = time.perf_counter() - t
    record = {"tokens": run.n_samples, "checkpoints": run.n_epochs, "top_k": run.top_k,
              "device": torch.cuda.get_device_name() if "cuda" in str(device) else "cpu",
              "compare_seconds": round(seconds, 1),
              "table": json.loads(table.reset_index().to_json(orient="records"))}
    (out / "weight_space.json").write_text(json.dumps(record, indent=1))
    print(f"## GPT-2, {run.n_samples} held-out tokens, {run.n_epochs} checkpoints "
          f"(compare {seconds:.0f} s)")
    print(fk.format_table(table, fmt="markdown"))
    return table


def train(data, out, *, steps, every, context=128, batch=128, layers=6, width=384,
          heads=6, lr=1e-3, k=16, train_sample=2000, eval_batch=256, heldout_blocks=None,
          save_checkpoints=None, seed=0, device="cuda"):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from forgetkit.exporters.torch import TokenRecorder

    data, out = Path(data), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if save_checkpoints:
        Path(save_checkpoints).mkdir(parents=True, exist_ok=True)
    info = json.loads((data / "corpus.json").read_text())
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_blocks = torch.from_numpy(blocks(np.load(data / "train.npy"), context))
    held_ids, held = heldout(data, context, heldout_blocks)
    sample = np.sort(rng.choice(len(train_blocks), min(train_sample, len(train_blocks)),
                                replace=False))
    config = GPT2Config(vocab_size=info["vocab_size"], n_positions=context, n_embd=width,
                        n_layer=layers, n_head=heads, bos_token_id=info["eos"],
                        eos_token_id=info["eos"], resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).to(device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the recorded logits: plain float32
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + np.cos(np.pi * min(s, steps) / steps)))
    meta = {"model": config.to_dict(), "corpus": info, "steps": steps, "every": every,
            "batch": batch, "lr": lr, "context": context, "heldout_blocks": heldout_blocks}
    held_rec = TokenRecorder(out / "heldout.npy", {"input_ids": torch.from_numpy(held)},
                             top_k=k, batch_size=eval_batch, sequence_ids=held_ids,
                             meta=dict(meta, split="heldout"), mode="w", durable=False)
    train_rec = None if not len(sample) else TokenRecorder(
        out / "train.npy", {"input_ids": train_blocks[sample]}, top_k=k, batch_size=eval_batch,
        sequence_ids=sample, meta=dict(meta, split="train"), mode="w", durable=False)
    log = {"step": [], "loss": [], "heldout_accuracy": [], "train_accuracy": [],
           "record_seconds": []}
    n = len(train_blocks)
    perm, at = torch.randperm(n), 0
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for step in range(steps + 1):
        if step % every == 0:
            t = time.perf_counter()
            acc_h = held_rec.record(model, step)
            acc_t = float("nan") if train_rec is None else train_rec.record(model, step)
            log["step"].append(step)
            log["loss"].append(float(loss.detach()))
            log["heldout_accuracy"].append(acc_h)
            log["train_accuracy"].append(acc_t)
            log["record_seconds"].append(time.perf_counter() - t)
            if save_checkpoints:
                torch.save(model.state_dict(), Path(save_checkpoints) / f"step_{step:05d}.pt")
            print(f"step {step} loss {float(loss.detach()):.3f} heldout acc {acc_h:.4f} train acc "
                  f"{acc_t:.4f} record {time.perf_counter() - t:.2f}s "
                  f"elapsed {time.perf_counter() - t0:.0f}s", flush=True)
        if step == steps:
            break
        if at + batch > n:
            perm, at = torch.randperm(n), 0
        x = train_blocks[perm[at:at + batch]].to(device, non_blocking=True)
        at += batch
        model.train()
        with torch.autocast("cuda" if "cuda" in str(device) else "cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    held_rec.close()
    if train_rec is not None:
        train_rec.close()
    torch.save(model.state_dict(), out / "final.pt")
    log["train_seconds"] = time.perf_counter() - t0
    log["epochs_of_training_data"] = steps * batch / n
    (out / "train_log.json").write_text(json.dumps(log))
    return log


# ---------------------------------------------------------------- figures
def figures(out, *, small=None, small_tokens=24, small_every=2, small_k=8, seeds=(0, 1, 2),
            kf_sequences=None, only_kf=False):
    """The run's figures (numpy on the stored records) into ``out``/figures.json; with
    ``small``, a small version of the held-out run (``small_tokens`` sequences, every
    ``small_every``-th checkpoint, ``small_k`` logits) as arrays in an .npz. The training
    tokens first, then the held-out ones with Knowledge Fusion (``seeds``: its splits;
    ``kf_sequences``: fit on at most that many sequences of each validation half;
    ``only_kf``: Knowledge Fusion on the held-out tokens alone)."""
    import forgetkit as fk

    out = Path(out)
    res = {}
    for split in ("train", "heldout"):
        if not (out / f"{split}.npy").exists() or (only_kf and split != "heldout"):
            continue
        run = fk.load(out / f"{split}.npy")
        if only_kf:
            res[split] = {}
            _library_figures(run, None, into=res[split], seeds=seeds, kf_sequences=kf_sequences,
                             save=lambda: (out / "figures.json").write_text(json.dumps(res)),
                             only_kf=True)
            continue
        rec = np.load(out / f"{split}.npy", mmap_mode="r")
        y = np.asarray(run.labels)
        E, N = rec.shape
        correct = np.empty((E, N), dtype=bool)
        logp = np.empty(E)
        for e in range(E):
            r = rec[e]
            correct[e] = r["ids"][:, 0] == y
            logp[e] = float(np.mean(r["target"].astype(np.float64) - r["lse"]))
        final = correct[-1]
        forget = (correct & ~final).mean(axis=1)
        learn = (~correct & final).mean(axis=1)
        events = (correct[:-1] & ~correct[1:]).sum(axis=0)
        seq = np.asarray(run.sequence_ids)
        starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
        seq_all = np.logical_and.reduceat(correct, starts, axis=1)  # every target correct
        res[split] = {
            "epochs": [int(e) for e in run.epochs], "tokens": int(N),
            "sequences": int(len(starts)),
            "accuracy": correct.mean(axis=1).tolist(),
            "mean_log_likelihood": logp.tolist(),
            "forget_fraction": forget.tolist(), "learn_fraction": learn.tolist(),
            "max_forget_fraction": float(forget.max()),
            "max_forget_epoch": int(run.epochs[int(forget.argmax())]),
            "final_accuracy": float(final.mean()),
            "ever_correct_then_wrong_at_end": float((correct.any(0) & ~final).mean()),
            "tokens_with_forgetting_events": float((events > 0).mean()),
            "mean_forgetting_events": float(events.mean()),
            "sequences_fully_correct": seq_all.mean(axis=1).tolist(),
        }
        print(split, json.dumps({k: v for k, v in res[split].items()
                                 if not isinstance(v, list)}), flush=True)
        if split == "heldout" and small is not None:
            keep = np.isin(seq, np.unique(seq)[:small_tokens])
            epochs = np.arange(E)[::small_every]
            if epochs[-1] != E - 1:
                epochs = np.r_[epochs, E - 1]
            part = np.asarray(rec[epochs][:, keep])
            np.savez_compressed(small, target=part["target"], lse=part["lse"],
                                logits=part["logits"][..., :small_k],
                                ids=part["ids"][..., :small_k], targets=y[keep],
                                sequence_ids=seq[keep],
                                positions=np.asarray(run.positions)[keep],
                                epochs=np.asarray(run.epochs)[epochs],
                                vocab_size=run.n_classes, meta=json.dumps(run.meta))

        def save():
            (out / "figures.json").write_text(json.dumps(res))

        save()
        _library_figures(run, forget, into=res[split], save=save, seeds=seeds,
                         kf_sequences=kf_sequences)
    return res


def spans_of(run, width=32):
    """Windows of ``width`` target positions of every sequence: int (J, 3) (sequence id,
    start, stop)."""
    seq, pos = np.asarray(run.sequence_ids), np.asarray(run.positions)
    out = []
    stops = {int(s): int(p) + 1 for s, p in zip(seq, pos, strict=True)}  # last position + 1
    for s in np.unique(seq).tolist():
        for start in range(1, stops[s], width):
            out.append((s, start, min(start + width, stops[s])))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def _timed(fn, what, into):
    """``fn()``; its seconds into ``into[what + '_seconds']``, its error into
    ``into[what + '_error']`` (the figures go on without it)."""
    t = time.perf_counter()
    try:
        return fn()
    except Exception as err:  # a figure of the library that failed: say so, go on
        into[what + "_error"] = f"{type(err).__name__}: {err}"
        print(f"{what} failed: {into[what + '_error']}", flush=True)
        return None
    finally:
        into[what + "_seconds"] = time.perf_counter() - t


def _library_figures(run, forget, *, into, save=lambda: None, seeds=(0, 1, 2),
                     kf_sequences=None, only_kf=False):
    """The same figures through forgetkit (F_e checked against the numpy ones), memorization
    of 32-token spans, and Knowledge Fusion against the final checkpoint under the paper's
    protocol (fit on the tokens of a random half of the sequences, score on the others).
    Each figure goes into ``into`` as soon as it is known (then ``save()``)."""
    import forgetkit as fk

    res = into
    if only_kf:
        return _fusion_figures(run, res, save, seeds, kf_sequences)
    fe = _timed(lambda: np.asarray(fk.forget_fraction(run)), "forget_fraction", res)
    if fe is not None:
        res["forget_fraction_equal"] = bool(np.allclose(fe, forget, rtol=0, atol=1e-12))
    table = _timed(lambda: fk.memorization(run, spans=spans_of(run)), "memorization", res)
    if table is not None:
        res["memorization"] = {c: table[c].tolist() for c in table.columns}
        res["memorization_attrs"] = {k: int(v) for k, v in table.attrs.items()}
    save()
    if run.meta.get("split") != "heldout":
        return res
    return _fusion_figures(run, res, save, seeds, kf_sequences)


def _fusion_figures(run, res, save, seeds, kf_sequences):
    """Knowledge Fusion against the final checkpoint, one split per seed, into ``res``."""
    import forgetkit as fk

    seq = np.asarray(run.sequence_ids)
    uniq = np.unique(seq)
    kf = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(uniq)
        half = order[: len(uniq) // 2]
        in_val = np.isin(seq, half)
        fit_on = in_val if kf_sequences is None else np.isin(seq, half[:kf_sequences])
        val = run.isel(samples=np.flatnonzero(fit_on))
        test = run.isel(samples=np.flatnonzero(~in_val))

        def fused(val=val, test=test, seed=seed):
            fuser = fk.KnowledgeFusion().fit(val)
            low, high = fuser.certified_accuracy(test)
            frame = fuser.certified(test)
            prob = np.asarray(frame["label_prob"], dtype=np.float64)
            rec = test.outputs.records[-1]
            final_ll = float(np.mean(rec["target"].astype(np.float64) - rec["lse"]))
            return {"seed": seed, "val_tokens": int(val.n_samples),
                    "test_tokens": int(test.n_samples),
                    "checkpoints": [int(run.epochs[i]) for i in fuser.checkpoints_],
                    "certified_accuracy": [low, high],
                    "uncertain": float(np.mean(~frame["certified"].to_numpy(bool))),
                    "final_accuracy": float(np.mean(np.asarray(test.correctness())[-1])),
                    "fused_log_likelihood": float(np.mean(np.log(prob))),
                    "final_log_likelihood": final_ll}

        one = _timed(fused, f"kf_seed{seed}", res)
        if one is not None:
            kf.append(one)
            print("KF", json.dumps(one), flush=True)
        res["knowledge_fusion"] = kf
        save()
    return res


def warm(out, *, k=16, vocab=8192):
    """Compile the numba kernels of the figures (on a small synthetic top-k run of the same
    record type), so that they are cached when the real run's figures start."""
    import forgetkit as fk
    from forgetkit.kinds.topk import topk_records

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(0)
    n = 127 * 8
    y = g.integers(0, vocab, n)
    seq, pos = np.repeat(np.arange(8), 127), np.tile(np.arange(1, 128), 8).astype(np.int32)
    with fk.TopKWriter(out / "warm.npy", vocab_size=vocab, top_k=k, targets=y, sequence_ids=seq,
                       positions=pos, meta={"split": "heldout"}, mode="w") as w:
        for e in range(4):
            z = g.normal(size=(n, vocab)).astype(np.float32)
            z[np.arange(n), y] += 4 * e * (g.random(n) < 0.5)
            w.append(e * 10, topk_records(z, y, k))
    run = fk.load(out / "warm.npy")
    into = {}
    _library_figures(run, np.zeros(4), into=into, seeds=(0,))
    print("warm", {k: v for k, v in into.items() if "seconds" in k or "error" in k}, flush=True)


def ddp_check(data, out, *, blocks_n=1000, k=16, context=128):
    """Under torchrun: the final model's top-k run of the first ``blocks_n`` held-out
    sequences recorded by every rank (NCCL, a DistributedSampler), against rank 0's own
    recording of the same sequences on one GPU."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import GPT2Config, GPT2LMHeadModel

    import forgetkit as fk
    from forgetkit.exporters.torch import TokenRecorder

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    data, out = Path(data), Path(out)
    meta = fk.load(out / "heldout.npy").meta
    model = GPT2LMHeadModel(GPT2Config(**{k_: v for k_, v in meta["model"].items()
                                          if k_ not in ("architectures",)}))
    model.load_state_dict(torch.load(out / "final.pt", map_location="cpu"))
    model.to(device)
    held = torch.from_numpy(blocks(np.load(data / "heldout.npy"), context, blocks_n))
    rows = [{"input_ids": r} for r in held]
    loader = DataLoader(rows, batch_size=100, sampler=DistributedSampler(rows, shuffle=False))
    t = time.perf_counter()
    with TokenRecorder(out / "ddp.npy", loader, top_k=k, mode="w") as rec:
        acc = rec.record(model, 0)
    seconds = time.perf_counter() - t
    alone = dist.new_group([0])  # rank 0 by itself: a one-process recording
    if rank == 0:
        with TokenRecorder(out / "one.npy", {"input_ids": held}, top_k=k, batch_size=100,
                           mode="w", group=alone) as rec:
            acc1 = rec.record(model, 0)
        a, b = np.load(out / "ddp.npy")[0], np.load(out / "one.npy")[0]
        two, one = fk.load(out / "ddp.npy"), fk.load(out / "one.npy")
        res = {"world": dist.get_world_size(), "tokens": int(len(a)),
               "same_token_table": bool(np.array_equal(two.sequence_ids, one.sequence_ids)
                                        and np.array_equal(two.positions, one.positions)),
               "ids_equal": float(np.mean((a["ids"] == b["ids"]).all(axis=1))),
               "bitwise_equal": bool(a.tobytes() == b.tobytes()),
               "max_abs_logit_diff": float(np.abs(a["logits"] - b["logits"]).max()),
               "accuracy": [acc, acc1], "seconds": seconds}
        (out / "ddp_check.json").write_text(json.dumps(res))
        print("ddp", json.dumps(res), flush=True)
    dist.destroy_process_group()


def write_sample(npz, path):
    """The small version written by ``figures --small`` (an .npz of arrays) as a top-k run
    at ``path`` (what data_samples/lm_fortunes_gpt2_heldout_top8.npy holds)."""
    import forgetkit as fk
    from forgetkit.kinds.topk import topk_dtype

    z = np.load(npz)
    k, vocab = z["ids"].shape[-1], int(z["vocab_size"])
    source = json.loads(str(z["meta"]))
    meta = {"description": "held-out tokens of a GPT-2-style model trained on Debian's "
                           "fortunes and the Python 3.11 docs' reST sources, recorded by "
                           "TokenRecorder (examples/train_lm_fortunes.py); this sample: the "
                           f"first held-out sequences, every other checkpoint, top {k}",
            "tokenizer": "lm_fortunes_tokenizer.json",
            **{key: source.get(key) for key in ("model", "corpus", "steps", "every", "batch",
                                                "lr")}}
    with fk.TopKWriter(path, vocab_size=vocab, top_k=k, targets=z["targets"],
                       sequence_ids=z["sequence_ids"], positions=z["positions"], meta=meta,
                       mode="w") as w:
        for i, epoch in enumerate(z["epochs"]):
            r = np.empty(z["target"].shape[1], topk_dtype(k, vocab))
            r["target"], r["lse"] = z["target"][i], z["lse"][i]
            r["logits"], r["ids"] = z["logits"][i], z["ids"][i]
            w.append(int(epoch), r)
    return fk.load(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("out")
    a.add_argument("--vocab", type=int, default=8192)
    a.add_argument("--heldout", type=int, default=1_050_000)
    a.add_argument("--limit", type=int, default=None, help="documents (a quick test)")
    b = sub.add_parser("train")
    b.add_argument("data")
    b.add_argument("out")
    for name, default in (("steps", 1500), ("every", 30), ("context", 128), ("batch", 128),
                          ("layers", 6), ("width", 384), ("heads", 6), ("k", 16),
                          ("train_sample", 2000), ("eval_batch", 256), ("heldout_blocks", 0)):
        b.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    b.add_argument("--lr", type=float, default=1e-3)
    b.add_argument("--device", default="cuda")
    b.add_argument("--small", default=None, help="write the small version here (.npz)")
    b.add_argument("--save-checkpoints", metavar="DIR", default=None,
                   help="save the state dict at every recorded step (step_NNNNN.pt)")
    b.add_argument("--no-figures", action="store_true")
    ws = sub.add_parser("weights", help="weight averages against output-space fusion")
    ws.add_argument("data")
    ws.add_argument("out")
    ws.add_argument("checkpoints", help="the folder of train --save-checkpoints")
    ws.add_argument("--eval-batch", type=int, default=256)
    ws.add_argument("--device", default="cuda")
    d = sub.add_parser("ddp-check")
    d.add_argument("data")
    d.add_argument("out")
    d.add_argument("--blocks", type=int, default=1000)
    m = sub.add_parser("sample")
    m.add_argument("npz")
    m.add_argument("path")
    w = sub.add_parser("warm")
    w.add_argument("out")
    c = sub.add_parser("figures")
    c.add_argument("out")
    c.add_argument("--small", default=None)
    c.add_argument("--seeds", default="0,1,2", help="the splits of Knowledge Fusion")
    c.add_argument("--only-kf", action="store_true",
                   help="Knowledge Fusion on the held-out tokens alone")
    c.add_argument("--kf-sequences", type=int, default=None,
                   help="fit on at most this many sequences of each validation half")
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.out, vocab=args.vocab, heldout=args.heldout, limit=args.limit)
    elif args.cmd == "train":
        opts = {k: getattr(args, k) for k in ("steps", "every", "context", "batch", "layers",
                                              "width", "heads", "k", "train_sample",
                                              "eval_batch", "lr", "device", "heldout_blocks",
                                              "save_checkpoints")}
        opts["heldout_blocks"] = opts["heldout_blocks"] or None
        train(args.data, args.out, **opts)
        if not args.no_figures:
            figures(args.out, small=args.small)
    elif args.cmd == "ddp-check":
        ddp_check(args.data, args.out, blocks_n=args.blocks)
    elif args.cmd == "sample":
        print(write_sample(args.npz, args.path))
    elif args.cmd == "warm":
        warm(args.out)
    elif args.cmd == "weights":
        weights(args.data, args.out, args.checkpoints, eval_batch=args.eval_batch,
                device=args.device)
    else:
        figures(args.out, small=args.small, kf_sequences=args.kf_sequences, only_kf=args.only_kf,
                seeds=[int(x) for x in args.seeds.split(",") if x])


if __name__ == "__main__":
    main()
