"""Choosing the data to keep, measured by retraining: ResNet-18 on Fashion-MNIST.

End to end, on one machine with one or more GPUs:

1. **Dynamics, once.** Train ResNet-18 on all 60,000 training images for ``--record-epochs``
   epochs and record the training set's logits after every epoch with forgetkit's
   ``LogitRecorder`` (float16, eval mode, no augmentation).
2. **Scores.** ``fk.data_scores`` on that run (el2n, forgetting, aum, variability,
   aleatoric, dynamic_uncertainty).
3. **Retraining.** For every keep fraction (``--keep``, default 0.7 0.5 0.3 0.1) and every
   selection (a spec ``METHOD[:SCORE[:CUTOFF[:balanced]]]``: ``--default``,
   ``--candidates``, ``--compare``; default: CCS with ``hard_cutoff="auto"`` and "hardest"
   for every score), against ``method="random"`` and the full training set, for every
   seed (``--seeds``): a fresh ResNet-18 trained from scratch on the kept samples for the
   same number of optimizer steps whatever the subset's size (``--steps``, default the
   steps of an ``--epochs``-epoch training on the full set, 936): the protocol of Zheng
   et al. 2023 (CCS) and DeepCore, which train every coreset for as many iterations as
   the full data; a small subset is passed over many times (`batch_stream`: full batches,
   one permutation after another). ``--fixed-epochs`` is the earlier protocol (every
   subset ``--epochs`` epochs, so smaller subsets take fewer steps: 88 at keep 10%; no last
   partial batch). The one-cycle learning rate spans the training's steps. Then its test
   accuracy on the 10,000 test images (bf16 autocast, as trained; with diagnostics: the
   loss trace, the float32 accuracy and the accuracy after BatchNorm's statistics are
   estimated again). The selection seed is the training seed. Two specs that keep the same
   samples for a fraction and seed (e.g. the "auto" and "gentle" cutoffs at keep 0.7,
   where both are 0) share one training: the JSON marks the copy ``same_training_as``.

With ``--choose-seeds``, two phases in one run: random and the candidate defaults
(``--default`` and ``--candidates``) on the choosing seeds; the default chosen by a rule
fixed beforehand (`choose_default`: the best mean over the fractions among those at least
random at every fraction, else the best mean); then random, the chosen one and
``--compare`` on the fresh ``--seeds``, which confirm it (or not); random's confirming
trainings are queued behind the candidates, filling the GPUs while the choice waits.
``--scores-csv`` reuses the scores of an earlier recording (``forgetkit scores`` output,
.csv or .csv.gz) instead of recording again.

The trainings run side by side: ``--workers`` processes per GPU, each holding the data on
its GPU, taking jobs from one queue (most important first: random, the default, then the
others, one selection at a time), with bf16 autocast, channels-last, batch
``--batch-size``. New jobs stop starting after ``--budget`` seconds; the JSON says which
ran.

    python bench/gpu_coreset_retrain.py --out out/coreset              # the GPU run
    python bench/gpu_coreset_retrain.py --device cpu --width 8 --train-subset 600 \
        --test-subset 200 --record-epochs 3 --steps 4 --window 2 --workers 2 \
        --keep 0.5 --seeds 0 --out out/smoke                           # a check that it runs
    python bench/gpu_coreset_retrain.py --table out/coreset/coreset_retrain.json
    python bench/gpu_coreset_retrain.py --table first.json second.json   # pooled

Writes ``<out>/coreset_retrain.json`` (configuration, every job's accuracy, the tables,
the choice), and when it records, ``<out>/scores.csv`` and the training run
``<out>/train_run.npy``.

Recorded results: ``bench/gpu_results/coreset_aleatoric_choose_confirm_4xh200.json`` and
``bench/gpu_results/coreset_aleatoric_confirm_more_seeds_4xh200.json`` (4 x H200, equal
steps, the README's table, pooled by ``--table FIRST SECOND``: ``--scores-csv
scores.csv.gz --no-full --choose-seeds 70 71 --seeds 80 81 82 83 84 85 --budget 465``
with CCS on every score as candidates, then ``--seeds 90 ... 99 --default
ccs:aleatoric:0:balanced``; the full commands in their configs);
``bench/gpu_results/coreset_aleatoric_new_recording_4xh200.json`` (4 x H200, the same
check on scores of a second recording: ``--record-seed 2000 --no-full --seeds 100 ...
107``);
``bench/gpu_results/coreset_hardest_equal_steps_4xh200.json`` (4 x H200, "hardest" on
every score, seeds 70 71, random and the default beside them);
``bench/gpu_results/coreset_equal_steps_choose_confirm_2xh100.json`` (2 x H100, equal
steps, the round before: ``--scores-csv scores.csv.gz --no-full
--choose-seeds 50 51 --seeds 60 61 62 63 --budget 290``, the candidates and comparison in
its config); ``bench/gpu_results/coreset_gentle_choose_confirm_2xh200.json`` (2 x H200,
fixed epochs, the round before: ``--scores-csv`` (the aum and dynamic_uncertainty columns) of the
2 x H200 recording below, ``--no-full --choose-seeds 30 31 --seeds 40 41 42 43 44 --budget
300``, the candidates and comparisons listed in its config);
``bench/gpu_results/coreset_choose_confirm_2xh100.json`` (2 x H100, the round before:
``--choose-seeds 0 1 --seeds 20 21 22 --budget 320``);
``bench/gpu_results/coreset_retrain_2xh200.json`` (2 x H200, before specs, the auto cutoff
and the partial-batch fix: every score with CCS, cutoff 0, and hardest, seeds 10 11 12)
and ``bench/gpu_results/coreset_retrain_explore_2xh200.json`` (its exploration run,
``--epochs 6 --lr 0.2 --seeds 0 1 --budget 420``).
Needs torch; Fashion-MNIST's IDX files (``--data``, default /usr/share/datasets/fashion-mnist).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

SCORES = ("el2n", "forgetting", "aum", "variability", "aleatoric", "dynamic_uncertainty")
HARD_CUTOFF_SCHEDULES = ("auto", "gentle")  # forgetkit.analysis.scores.HARD_CUTOFF_SCHEDULES
#: forgetkit's recommended default (README "Choosing the data to keep"), as a selection
#: spec (see `parse_spec`): chosen under equal steps among CCS on every score on seeds 70
#: and 71, confirmed on seeds 80-85 and again on 90-99
#: (bench/gpu_results/coreset_aleatoric_*_4xh200.json).
DEFAULT = "ccs:aleatoric:0:balanced"


def parse_spec(spec):
    """A selection spec ``METHOD[:SCORE[:CUTOFF[:balanced]]]`` as (method, score or None,
    hard_cutoff (float, "auto" or "gentle"), balanced): "random", "ccs:aum:auto:balanced",
    "hardest:el2n", "ccs:variability:0.1"."""
    parts = spec.split(":")
    if len(parts) > 4 or parts[0] not in ("random", "ccs", "hardest", "easiest") \
            or (len(parts) == 4 and parts[3] != "balanced"):
        raise ValueError(f"bad selection spec {spec!r}: METHOD[:SCORE[:CUTOFF[:balanced]]]")
    method = parts[0]
    score = parts[1] if len(parts) > 1 and parts[1] else None
    if (score is None) != (method == "random") or (score is not None and score not in SCORES):
        raise ValueError(f"bad selection spec {spec!r}: the score must be one of {SCORES} "
                         "(none for random)")
    cutoff = parts[2] if len(parts) > 2 and parts[2] else "0"
    try:
        cutoff = cutoff if cutoff in HARD_CUTOFF_SCHEDULES else float(cutoff)
    except ValueError:
        raise ValueError(f"bad selection spec {spec!r}: the cutoff must be a number or one "
                         f"of {tuple(HARD_CUTOFF_SCHEDULES)}") from None
    return method, score, cutoff, len(parts) == 4


def spec_label(spec):
    """The table's row name of a spec: "ccs aum cut=auto balanced"."""
    method, score, cutoff, balanced = parse_spec(spec)
    words = [method] + ([score] if score else []) + ([f"cut={cutoff:g}" if isinstance(
        cutoff, float) else f"cut={cutoff}"] if cutoff != 0 else []) \
        + (["balanced"] if balanced else [])
    return " ".join(words)


def default_candidates():
    """Every score with CCS (the auto cutoff) and with "hardest"."""
    return ([f"ccs:{s}:auto" for s in SCORES] + [f"hardest:{s}" for s in SCORES])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder")
    p.add_argument("--table", metavar="JSON", nargs="+",
                   help="print the README table of result files (several: their confirming "
                        "trainings pooled, see `pool`)")
    p.add_argument("--data", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--record-epochs", type=int, default=12)
    p.add_argument("--record-seed", type=int, default=1000,
                   help="seed of the full training whose dynamics give the scores")
    p.add_argument("--epochs", type=int, default=8,
                   help="epochs of the full-data training whose optimizer steps every "
                        "retraining takes (with --fixed-epochs: epochs of every retraining)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps of every retraining, whatever its subset's size "
                        "(the authors' protocol; default: the steps of --epochs epochs on "
                        "the full training set, 60000 // 512 * 8 = 936)")
    p.add_argument("--fixed-epochs", action="store_true",
                   help="the earlier protocol: every subset trained for --epochs epochs "
                        "(smaller subsets take fewer steps)")
    p.add_argument("--window", type=int, default=10, help="dynamic uncertainty's J")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--wd", type=float, default=5e-4)
    p.add_argument("--keep", type=float, nargs="+", default=[0.7, 0.5, 0.3, 0.1])
    p.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12])
    p.add_argument("--candidates", nargs="+", default=None, metavar="SPEC",
                   help="selections to train besides random and the default, as "
                        "METHOD[:SCORE[:CUTOFF[:balanced]]] (default: CCS with the auto "
                        "cutoff and hardest, for every score)")
    p.add_argument("--default", default=DEFAULT, metavar="SPEC",
                   help="the selection marked as the default (trained first, after random)")
    p.add_argument("--choose-seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="first train random and the candidates (--default, --candidates) on "
                        "these seeds and choose the default by `choose_default`'s rule; then "
                        "train random, the chosen one and --compare on --seeds")
    p.add_argument("--compare", nargs="+", default=[], metavar="SPEC",
                   help="more selections, trained on --seeds only")
    p.add_argument("--scores-csv", default=None, metavar="CSV",
                   help="scores of an earlier recording (forgetkit scores; .csv or .csv.gz): "
                        "skip the recording")
    p.add_argument("--no-full", action="store_true", help="do not train on the full set")
    p.add_argument("--workers", type=int, default=4, help="training processes per GPU")
    p.add_argument("--budget", type=float, default=420.0,
                   help="seconds after which no new training starts")
    p.add_argument("--train-subset", type=int, default=None)
    p.add_argument("--test-subset", type=int, default=None)
    args = p.parse_args(argv)
    if args.table is None and args.out is None:
        p.error("--out is required (or --table JSON)")
    if any(not 0 < k <= 1 for k in args.keep):
        p.error(f"--keep fractions must lie in (0, 1]; got {args.keep}")
    if args.candidates is None:
        args.candidates = default_candidates()
    try:
        for spec in [args.default, *args.candidates, *args.compare]:
            parse_spec(spec)
    except ValueError as err:
        p.error(str(err))
    if args.choose_seeds and set(args.choose_seeds) & set(args.seeds):
        p.error("--choose-seeds and --seeds must differ: the default is confirmed on fresh "
                "seeds")
    if args.epochs < 1 or args.record_epochs < 1 or args.workers < 1 or args.batch_size < 1:
        p.error("--epochs, --record-epochs, --workers and --batch-size must be >= 1")
    if args.fixed_epochs and args.steps is not None:
        p.error("--steps and --fixed-epochs exclude each other: equal steps for every "
                "subset, or equal epochs")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1; got {args.steps}")
    if not args.fixed_epochs and args.steps is None:
        args.steps = full_data_steps(args.train_subset or 60000, args.batch_size,
                                     args.epochs)
    args.protocol = "fixed_epochs" if args.fixed_epochs else "equal_steps"
    return args


def full_data_steps(n_train, batch_size, epochs):
    """Optimizer steps of ``epochs`` epochs on ``n_train`` samples without each epoch's last
    partial batch: 60000 // 512 * 8 = 936."""
    return max(1, n_train // batch_size) * epochs


def batch_stream(n, batch_size, steps, rng):
    """The equal-steps protocol's batches: positions into a kept subset of ``n`` samples,
    shape (steps, batch_size). Every batch is full; the stream runs through one random
    permutation after another, so every sample is seen once per pass, a pass's tail
    continues into the next batch (none is dropped), and the number of passes,
    ``steps * batch_size / n``, is fractional. ``rng``: a numpy Generator."""
    need = steps * batch_size
    passes = -(-need // n)
    return np.concatenate([rng.permutation(n) for _ in range(passes)])[:need].reshape(
        steps, batch_size)


# ------------------------------------------------------------------ training
def load_data(args, device):
    import torch
    from train_fmnist import to_tensor

    from forgetkit.datasets import load_fashion_mnist

    x_train, y_train = load_fashion_mnist("train", args.data)
    x_test, y_test = load_fashion_mnist("test", args.data)
    if args.train_subset:
        x_train, y_train = x_train[:args.train_subset], y_train[:args.train_subset]
    if args.test_subset:
        x_test, y_test = x_test[:args.test_subset], y_test[:args.test_subset]
    return (to_tensor(x_train, device), torch.as_tensor(y_train, device=device),
            to_tensor(x_test, device), torch.as_tensor(y_test, device=device))


def train(args, data, idx, seed, *, epochs=None, steps=None, recorder=None):
    """A fresh ResNet-18 trained on the samples ``idx`` (positions) for ``steps`` optimizer
    steps (`batch_stream`; the equal-steps protocol) or, with ``steps=None``, for
    ``epochs`` epochs without each epoch's last partial batch; the one-cycle learning rate
    spans the training's steps. ``recorder(model, epoch)`` after every epoch (epochs only).
    Returns (test accuracy, seconds, diagnostics): the accuracy with bf16 autocast as
    trained; the diagnostics hold the training loss (``loss_trace``: means over 24 equal
    spans of the steps; ``loss_final``: the last 5% of the steps), the test accuracy in
    float32 and after BatchNorm's statistics are estimated again in float32 over 20
    training batches, at most the training's steps (``accuracy_fp32``,
    ``accuracy_bn_reestimated``), to tell a training that failed from an evaluation that
    did."""
    import torch
    import torch.nn.functional as F
    from train_fmnist import ResNet18, augment

    xtr, ytr, xte, yte = data
    dev = xtr.device
    torch.manual_seed(seed)
    np.random.seed(seed)  # noqa: NPY002  (augment's crop offsets)
    idx_np = np.asarray(idx, dtype=np.int64)
    idx = torch.as_tensor(idx_np, device=dev)
    model = ResNet18(args.width).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.wd,
                          nesterov=True)
    if steps is None:
        steps_per_epoch = max(1, len(idx) // args.batch_size)
        total = epochs * steps_per_epoch

        def batches():
            for epoch in range(epochs):
                perm = idx[torch.randperm(len(idx), device=dev)]
                if len(perm) > args.batch_size:  # no last partial batch: BatchNorm's
                    perm = perm[:len(perm) - len(perm) % args.batch_size]  # stats steady
                for i in range(0, len(perm), args.batch_size):
                    yield perm[i:i + args.batch_size]
                if recorder is not None:
                    yield epoch  # the epoch's end
    else:
        total = steps
        stream = torch.as_tensor(idx_np[batch_stream(len(idx_np), args.batch_size, steps,
                                                     np.random.default_rng(seed))],
                                 device=dev)

        def batches():
            yield from stream
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=total)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    t0 = time.time()
    losses = []
    model.train()
    for b in batches():
        if isinstance(b, int):
            recorder(model, b)
            model.train()
            continue
        with autocast:
            loss = F.cross_entropy(model(augment(xtr[b])), ytr[b])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())

    def accuracy(cast):
        model.eval()
        correct = 0
        with torch.no_grad(), cast:
            for i in range(0, len(xte), 4096):
                correct += (model(xte[i:i + 4096]).argmax(1) == yte[i:i + 4096]).sum().item()
        return correct / len(xte)

    acc = accuracy(autocast)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.time() - t0
    trace = torch.stack(losses).float().cpu().numpy()
    spans = np.array_split(trace, min(24, len(trace)))
    diag = dict(steps=len(trace), passes=len(trace) * args.batch_size / len(idx_np),
                loss_trace=[round(float(s.mean()), 4) for s in spans],
                loss_final=float(trace[-max(1, len(trace) // 20):].mean()),
                accuracy_fp32=accuracy(torch.autocast(dev.type, enabled=False)))
    for m in model.modules():  # BatchNorm's statistics again: plain averages, float32
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for b in batch_stream(len(idx_np), args.batch_size, min(20, len(trace)),
                              np.random.default_rng(seed + 1)):
            model(augment(xtr[torch.as_tensor(idx_np[b], device=dev)]))
    diag["accuracy_bn_reestimated"] = accuracy(torch.autocast(dev.type, enabled=False))
    return acc, seconds, diag


def worker(rank, device, args, jobs, results):
    """Take jobs from ``jobs`` until a None; put one result per job into ``results`` (one
    marked ``skipped``, not trained, for a job taken after its ``deadline``)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    data = load_data(args, torch.device(device))
    results.put({"ready": rank, "device": device})
    while True:
        job = jobs.get()
        if job is None:
            return
        idx = job.pop("idx")
        if time.time() > job.pop("deadline"):  # the budget is spent: not started
            results.put(dict(job, skipped=True))
            continue
        try:
            acc, seconds, diag = train(args, data, idx, job["seed"], epochs=args.epochs,
                                       steps=args.steps)
            results.put(dict(job, accuracy=acc, seconds=seconds, worker=rank, device=device,
                             **diag))
        except Exception as err:  # reported in the JSON, the other jobs go on
            results.put(dict(job, error=f"{type(err).__name__}: {err}", worker=rank))


def record_dynamics(args, out):
    """Phase 1: the full training run, the training set's logits recorded every epoch."""
    import torch

    from forgetkit.datasets import FASHION_MNIST_CLASSES
    from forgetkit.exporters.torch import LogitRecorder

    device = torch.device(args.device if args.device == "cpu" else "cuda:0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    data = load_data(args, device)
    path = out / "train_run.npy"
    meta = dict(model=f"ResNet18(width={args.width})", epochs=args.record_epochs,
                seed=args.record_seed,
                batch_size=args.batch_size, lr=args.lr, dataset="fashion-mnist train")
    rec = LogitRecorder(path, (data[0], data[1]), batch_size=4096, meta=meta, mode="w",
                        class_names=FASHION_MNIST_CLASSES)
    try:
        acc, seconds, _ = train(args, data, np.arange(len(data[0])), args.record_seed,
                                epochs=args.record_epochs, recorder=rec.record)
    finally:
        rec.close()
    return path, acc, seconds


# ------------------------------------------------------------------- the run
def job_list(args, specs, seeds, scores_df, n_train, labels=None, *, phase="confirm"):
    """The retraining jobs of ``specs`` (selection specs, or "full") for ``seeds``, in
    that order: a budget stop loses whole selections, not one fraction of each.
    ``scores_df`` may be None for "random" and "full"; ``labels``: the training labels in
    the scores' row order (for balanced specs)."""
    import forgetkit as fk
    from forgetkit.analysis.scores import HARD_CUTOFF_SCHEDULES as schedules

    jobs = []
    for spec in specs:
        for keep in sorted(args.keep, reverse=True):
            for seed in seeds:
                if spec == "full":
                    if keep != max(args.keep):
                        continue
                    idx, frac, method, score = np.arange(n_train), 1.0, "full", None
                    cutoff, balanced = 0, False
                else:
                    method, score, cutoff, balanced = parse_spec(spec)
                    frac = keep
                    by_score = method != "random"  # random: positions, no score
                    ids = fk.select_coreset(scores_df if by_score else np.zeros(n_train),
                                            keep, score=score, method=method,
                                            hard_cutoff=cutoff, seed=seed,
                                            labels=labels if balanced else None)
                    idx = scores_df.index.get_indexer(ids) if by_score else ids
                used = (schedules[cutoff](frac) if method == "ccs" else 0.0) \
                    if isinstance(cutoff, str) else cutoff
                jobs.append(dict(spec=spec, label="full" if spec == "full" else
                                 spec_label(spec), phase=phase, method=method, score=score,
                                 hard_cutoff=cutoff, cutoff_used=used, balanced=balanced,
                                 keep=frac,
                                 seed=seed, n=int(len(idx)),
                                 idx=np.asarray(idx, dtype=np.int64)))
    return jobs


def selection_key(job):
    """What a training depends on besides the configuration: (keep, seed, digest of the
    kept positions). Two specs that keep the same samples (e.g. the "auto" and "gentle"
    cutoffs at keep 0.7) share one training."""
    import hashlib

    return (job["keep"], job["seed"], hashlib.sha1(
        np.ascontiguousarray(job["idx"], dtype=np.int64).tobytes()).hexdigest())


def split_repeats(new, trained):
    """Split the jobs ``new`` into those to train and the repeats of a selection already
    in ``trained`` (a dict selection key -> the label of the job that trains it, updated
    here). Every job gets its ``key``; a repeat also ``same_training_as``."""
    to_train, repeats = [], []
    for job in new:
        job["key"] = "/".join(map(str, selection_key(job)))
        if job["key"] in trained:
            repeats.append(dict(job, same_training_as=trained[job["key"]]))
        else:
            trained[job["key"]] = job["label"]
            to_train.append(job)
    return to_train, repeats


def choose_default(record, candidates):
    """The pre-registered choice on the choosing seeds: among ``candidates`` measured at
    every fraction, those at least random's mean at every fraction, the best mean over
    the fractions; if none is, the best mean. Returns (spec, reason)."""
    t = table(record, phase="choose")
    keeps = [f"{k:g}" for k in record["config"]["keep"]]
    rnd = t.get("random", {})

    def mean(row):
        return statistics.fmean(row[k][0] for k in keeps)

    measured = [c for c in candidates if all(k in t.get(spec_label(c), {}) for k in keeps)]
    if not measured:
        return candidates[0], "nothing measured: the first candidate"
    safe = [c for c in measured if all(k in rnd and t[spec_label(c)][k][0] >= rnd[k][0]
                                       for k in keeps)]
    pool = safe or measured
    best = max(pool, key=lambda c: mean(t[spec_label(c)]))
    why = ("best mean among those at least random at every fraction" if safe else
           "none at least random at every fraction: the best mean")
    return best, f"{why} ({mean(t[spec_label(best)]):.2f})"


def run(args):
    import torch
    import torch.multiprocessing as mp

    import forgetkit as fk

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    devices = ([f"cuda:{i}" for i in range(torch.cuda.device_count())]
               if args.device == "cuda" else [args.device])
    if not devices:
        raise SystemExit("no CUDA device: pass --device cpu")
    n_train = args.train_subset or 60000
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    first_seeds = args.choose_seeds or args.seeds
    first_phase = "choose" if args.choose_seeds else "confirm"
    # random needs no scores: queued before the recording
    all_jobs = job_list(args, ["random"], first_seeds, None, n_train, phase=first_phase)
    deadline = t_start + args.budget  # no training starts after it
    for job in all_jobs:
        jobs.put(dict(job, deadline=deadline))
    procs = []

    def start(device, n):
        for _ in range(n):
            p = ctx.Process(target=worker, args=(len(procs), device, args, jobs, results),
                            daemon=True)
            p.start()
            procs.append(p)

    record = dict(
        config={k: v for k, v in vars(args).items() if k != "table"},
        device=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if args.device == "cuda" else "cpu",
        torch=torch.__version__, forgetkit=fk.__version__, default=args.default,
        default_label=spec_label(args.default), jobs=[])
    t1 = time.time()
    if args.scores_csv:  # dynamics recorded earlier: every GPU trains from the start
        for d in devices:
            start(d, args.workers)
        from forgetkit.analysis.scores import read_scores_csv

        scores_df = read_scores_csv(args.scores_csv)
        record["record"] = dict(scores_csv=str(args.scores_csv), n_train=len(scores_df))
    else:
        # the first GPU records the dynamics first; the others train meanwhile
        if len(devices) > 1:
            for d in devices[1:]:
                start(d, args.workers)
        else:
            start(devices[0], max(1, args.workers - 1))
        path, rec_acc, rec_seconds = record_dynamics(args, out)
        print(f"recorded {args.record_epochs} epochs in {rec_seconds:.1f}s, test acc "
              f"{rec_acc:.4f}", flush=True)
        start(devices[0], args.workers if len(devices) > 1 else 1)
        t1 = time.time()
        train_run = fk.load(path)
        scores_df = fk.data_scores(train_run, window=args.window)
        scores_df.to_csv(out / "scores.csv")
        record["record"] = dict(seconds=rec_seconds, test_accuracy=rec_acc,
                                n_train=train_run.n_samples, epochs=train_run.n_epochs)
    if len(scores_df) != n_train:
        raise SystemExit(f"the scores hold {len(scores_df)} samples; the training set "
                         f"{n_train}")
    record["record"]["scores_seconds"] = time.time() - t1
    print(f"scores of {len(scores_df)} samples in {time.time() - t1:.1f}s", flush=True)
    from forgetkit.datasets import load_fashion_mnist

    labels = load_fashion_mnist("train", args.data)[1][scores_df.index.to_numpy()]
    skipped = []  # jobs not started by the budget
    trained, results_of, repeats_of = {}, {}, {}  # selection key -> label / result / repeats

    def add_result(r):
        record["jobs"].append(r)
        print(f"[{time.time() - t_start:6.0f}s] {r['phase']:>7} {r['label']:>40} "
              f"keep {r['keep']:.1f} seed {r['seed']}: "
              + (f"acc {r['accuracy']:.4f} ({r['seconds']:.0f}s)" if "accuracy" in r
                 else r.get("error", ""))
              + (f" (the training of {r['same_training_as']})" if "same_training_as" in r
                 else ""), flush=True)

    def repeat_result(repeat, r):
        """A repeated selection's result: its own labels, the training's outcome."""
        return dict(r, **{k: v for k, v in repeat.items() if k != "idx"})

    def queue_and_wait(new, also=(), *, phase=None):
        """Queue ``new``, then ``also``, and wait until every queued job of ``phase`` (of
        any phase if None) is done (jobs not started by the budget are dropped and
        reported as not run). A selection already trained in this run is not trained
        again: it gets that training's result."""
        for batch in (new, also):
            to_train, repeats = split_repeats(batch, trained)
            for job in to_train:
                jobs.put(dict(job, deadline=deadline))
            all_jobs.extend(batch)
            for rep in repeats:
                if rep["key"] in results_of:
                    add_result(repeat_result(rep, results_of[rep["key"]]))
                else:
                    repeats_of.setdefault(rep["key"], []).append(rep)

        def pending():
            def of(items):
                return sum(1 for j in items if phase in (None, j["phase"]))
            return of(all_jobs) - of(record["jobs"]) - of(skipped)

        while pending() > 0:
            try:
                r = results.get(timeout=5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if "ready" in r:
                continue
            if r.get("skipped"):  # not run: listed in the JSON's not_run
                skipped.extend([r, *repeats_of.pop(r.get("key"), [])])
                continue
            add_result(r)
            if r.get("key") is not None:
                results_of[r["key"]] = r
                for rep in repeats_of.pop(r["key"], []):
                    add_result(repeat_result(rep, r))
            write(record, all_jobs, out, t_start)

    if args.choose_seeds:  # phase 1: choose the default among the candidates
        candidates = [c for c in dict.fromkeys([args.default, *args.candidates])
                      if c != "random"]
        # random's confirming trainings need no choice: queued behind the candidates,
        # they fill the GPUs while the last candidates train
        queue_and_wait(job_list(args, candidates, args.choose_seeds, scores_df, n_train,
                                labels, phase="choose"),
                       job_list(args, ["random"], args.seeds, None, n_train),
                       phase="choose")
        chosen, why = choose_default(record, candidates)
        record.update(default=chosen, default_label=spec_label(chosen),
                      choice=dict(seeds=args.choose_seeds, candidates=candidates,
                                  chosen=chosen, reason=why))
        print(f"chosen default: {spec_label(chosen)}: {why}", flush=True)
        confirm = [chosen, *args.compare]
    else:
        confirm = [args.default, *args.candidates, *args.compare]
    # random is queued already
    confirm = [c for c in dict.fromkeys(confirm + ([] if args.no_full else ["full"]))
               if c != "random"]
    queue_and_wait(job_list(args, confirm, args.seeds, scores_df, n_train, labels))
    for _ in procs:
        jobs.put(None)
    for p in procs:
        p.join(timeout=30)
    write(record, all_jobs, out, t_start)
    print(markdown(record))
    return record


def write(record, all_jobs, out, t_start):
    """The result file as it stands (rewritten after every job, so that a run stopped
    early leaves what it measured)."""
    key = ("phase", "label", "keep", "seed")
    ran = {tuple(r[k] for k in key) for r in record["jobs"]}
    record["not_run"] = [{k: j[k] for k in key} for j in all_jobs
                         if tuple(j[k] for k in key) not in ran]
    record["wall_seconds"] = time.time() - t_start
    record["table"] = table(record)
    if any(r.get("phase") == "choose" for r in record["jobs"]):
        record["table_choose"] = table(record, phase="choose")
    tmp = out / "coreset_retrain.json.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, out / "coreset_retrain.json")


# ------------------------------------------------------------------- tables
def label(job):
    """A job's row name (records written before specs carry method and score only)."""
    if "label" in job:
        return job["label"]
    return job["method"] if job["score"] is None else f"{job['method']} {job['score']}"


def accuracies(record, phase="confirm"):
    """{row label: {keep: {seed: test accuracy in percent}}} of a result record's
    ``phase``."""
    acc = {}
    for r in record["jobs"]:
        if "accuracy" in r and r.get("phase", "confirm") == phase:
            acc.setdefault(label(r), {}).setdefault(f"{r['keep']:g}", {})[r["seed"]] = \
                100 * r["accuracy"]
    return acc


def table(record, phase="confirm"):
    """{row label: {keep: [mean, std, n_seeds]}} of a result record's ``phase`` (test
    accuracy in percent; std with ddof 1 over the seeds, 0 for one seed)."""
    out = {}
    for row, by_keep in accuracies(record, phase).items():
        out[row] = {}
        for k, by_seed in by_keep.items():
            v = list(by_seed.values())
            out[row][k] = [statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0,
                           len(v)]
    return out


def markdown(record, phase="confirm"):
    """The README table of a record's ``phase`` (after it, the choosing phase's, if any)."""
    keeps = [f"{k:g}" for k in sorted(record["config"]["keep"], reverse=True)]
    t = table(record, phase)
    rows = []
    for row, cells in t.items():
        if row == "full":
            continue
        means = [cells[k][0] for k in keeps if k in cells]
        rows.append((statistics.fmean(means) if len(means) == len(keeps) else -1, row))
    rows.sort(reverse=True)
    head = "| method | " + " | ".join(f"keep {float(k):.0%}" for k in keeps) + " | mean |"
    lines = [head, "|" + " --- |" * (len(keeps) + 2)]
    default = record.get("default_label") or " ".join(record["default"])
    for mean, row in rows:
        cells = t[row]
        shown = [f"{cells[k][0]:.2f} ± {cells[k][1]:.2f}" if k in cells else "–"
                 for k in keeps]
        name = f"**{row}** (default)" if row == default else row
        tail = f" | {mean:.2f} |" if mean >= 0 else " | – |"
        lines.append(f"| {name} | " + " | ".join(shown) + tail)
    paired = against_random(record, default, phase) if default in t else {}
    if paired and default != "random":
        lines.append(f"\n{default} against random, seed by seed: " + "; ".join(
            f"keep {float(k):.0%} {m:+.2f} (median {md:+.2f}, above on {a} of {n})"
            for k in keeps if k in paired for m, md, a, n in [paired[k]]) + ".")
    if "full" in t:
        full = next(iter(t["full"].values()))
        lines.append(f"\nFull training set: {full[0]:.2f} ± {full[1]:.2f} "
                     f"({full[2]} seeds).")
    if phase == "confirm" and "choice" in record:
        c = record["choice"]
        lines.append(f"\nChosen on seeds {c['seeds']}: {spec_label(c['chosen'])} "
                     f"({c['reason']}):\n")
        lines.append(markdown(record, "choose"))
    return "\n".join(lines)


def pool(records):
    """One record of several runs' confirming trainings (the first run's configuration
    and choice): the runs must share the training protocol and fractions, and no
    (selection, fraction, seed) may be trained twice."""
    same = ("protocol", "steps", "epochs", "batch_size", "lr", "wd", "width", "keep",
            "window")
    first = records[0]
    for r in records[1:]:
        diff = [k for k in same if r["config"].get(k) != first["config"].get(k)]
        if diff:
            raise SystemExit(f"cannot pool runs whose {', '.join(diff)} differ")
    jobs = [j for r in records for j in r["jobs"] if j.get("phase", "confirm") == "confirm"]
    seen = set()
    for j in jobs:
        key = (label(j), j["keep"], j["seed"])
        if key in seen:
            raise SystemExit(f"cannot pool: {key[0]} at keep {key[1]:g}, seed {key[2]} "
                             "was trained in two runs")
        seen.add(key)
    choose = [j for j in first["jobs"] if j.get("phase") == "choose"]
    return dict(first, jobs=choose + jobs)


def against_random(record, row, phase="confirm"):
    """``row`` against random on the seeds both trained, per fraction: {keep: (mean
    difference, median difference, seeds where ``row`` is above, seeds)} in points."""
    acc = accuracies(record, phase)
    out = {}
    for keep, mine in acc.get(row, {}).items():
        theirs = acc.get("random", {}).get(keep, {})
        d = [mine[s] - theirs[s] for s in sorted(set(mine) & set(theirs))]
        if d:
            out[keep] = (statistics.fmean(d), statistics.median(d), sum(x > 0 for x in d),
                         len(d))
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.table:
        records = []
        for path in args.table:
            with open(path) as f:
                records.append(json.load(f))
        print(markdown(records[0] if len(records) == 1 else pool(records)))
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    run(args)


if __name__ == "__main__":
    main()
