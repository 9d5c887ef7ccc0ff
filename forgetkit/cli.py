"""Command line: ``forgetkit analyze|convert|datamap|fuse|apply|compare|sweep|distill|report ...``
(and ``scores|coreset``, ``sequences``, ``replay``, ``compare-weights``, ``warmup``).

A thin layer: parse, refuse an output that is an input, load, one library call, write.
Errors the user's input causes (`forgetkit.ForgetkitError`, and OSError such as a missing or
unwritable file) become one line on stderr and exit status 1 (2 for usage errors); anything
else is a bug in forgetkit: its traceback is shown with a line saying so, exit status 70.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ._validation import check_indices, check_int
from .analysis import REGIONS, data_map, data_scores, forgetting, select, select_coreset
from .analysis.scores import (
    HARD_CUTOFF_SCHEDULES,
    SCORES,
    check_coreset_options,
    read_scores_csv,
)
from .analysis.scores import METHODS as CORESET_METHODS
from .analysis.tokens import memorization, sequence_dynamics
from .errors import ForgetkitError
from .evaluate import DEFAULT_METHODS, METHODS, compare, format_table, percent, single_hit
from .fusion import KnowledgeFusion, load_fuser
from .fusion.distill import write_soft_targets
from .io import atomic_write, convert, load
from .io.atomic import write_json_atomic
from .io.guard import refuse_overwrite
from .io.record import load_labels_file
from .kernels import compile_notice
from .kinds import kind_of
from .report import plots, write_report
from .splits import split_indices

#: Exit status of an internal error (a bug), sysexits' EX_SOFTWARE.
EXIT_BUG = 70


def _cmd_analyze(args):
    refuse_overwrite({"--json": args.json}, [args.run, args.labels])
    run = load(args.run, labels=args.labels)
    s = forgetting.summary(run, progress=not args.quiet)
    dd = s["double_descent"]
    lines = [
        f"run: {args.run}  ({s['n_epochs']} epochs, {s['n_samples']} samples, "
        f"{s['n_classes']} classes)",
        f"final accuracy:        {percent(s['final_accuracy'])}",
        f"best accuracy:         {percent(s['best_accuracy'])} at epoch {s['best_epoch']}",
        f"max forget fraction:   {percent(s['max_forget_fraction'])} at epoch "
        f"{s['max_forget_epoch']}",
        f"ever forgotten:        {percent(s['ever_forgotten'])} of samples were correct at some "
        "epoch and wrong at the end",
    ]
    if dd["found"]:
        lines.append(
            f"double descent:        peak at epoch {dd['peak_epoch']} "
            f"({percent(dd['peak_accuracy'])}), dip at {dd['dip_epoch']} "
            f"({percent(dd['dip_accuracy'])}), second peak at {dd['second_peak_epoch']} "
            f"({percent(dd['second_peak_accuracy'])}); forgotten in the dip "
            f"{percent(dd['forgotten_in_dip'])}, never re-learned {percent(dd['never_relearned'])}"
        )
    else:
        lines.append("double descent:        none found")
    print("\n".join(lines))
    if args.json:
        record = dict(
            s,
            epochs=run.epochs.tolist(),
            accuracy=forgetting.accuracy(run).tolist(),
            forget_fraction=forgetting.forget_fraction(run).tolist(),
            learn_fraction=forgetting.learn_fraction(run).tolist(),
        )
        write_json_atomic(Path(args.json), record)
        if not args.quiet:
            print(f"wrote {args.json}")


def _cmd_convert(args):
    out = convert(args.src, args.dst, labels=args.labels, layout=args.layout)
    if not args.quiet:
        print(f"wrote {out}")


def _cmd_verify(args):
    """Exit status 0 when every epoch of every run holds, 1 naming each bad one."""
    from .io import verify

    status = 0
    for path in args.runs:
        try:
            result = verify(path)
        except ForgetkitError as err:
            print(f"{path}: bad: {' '.join(str(err).split())}", file=sys.stderr)
            status = 1
            continue
        if not result["verifiable"]:
            print(f"{path}: cannot be verified: it was written without checksums")
        elif result["bad"]:
            status = 1
            for epoch in result["bad"]:
                print(f"{path}: bad: epoch {epoch} does not match its checksum",
                      file=sys.stderr)
        elif not args.quiet:
            print(f"{path}: ok ({result['epochs']} epochs)" + (
                "" if result.get("metadata", True) else
                "; its metadata cannot be verified: written before it was checksummed"))
    return status


def _cmd_datamap(args):
    refuse_overwrite({"--plot": args.plot, "--out": args.out}, [args.run, args.labels])
    if bool(args.select) != bool(args.out):
        raise ForgetkitError("--select REGION and --out IDS.csv go together; got "
                             + ("--select without --out" if args.select
                                else "--out without --select"))
    if args.frac is not None and not args.select:
        raise ForgetkitError("--frac needs --select REGION")
    if args.frac is not None and not 0.0 < args.frac <= 1.0:  # checked before any work
        raise ForgetkitError(f"--frac must lie in (0, 1]; got {args.frac}")
    if args.burn_out is not None and args.burn_out < 1:
        raise ForgetkitError(f"--burn-out must be >= 1; got {args.burn_out}")
    run = load(args.run, labels=args.labels)
    if args.frac is not None and int(args.frac * run.n_samples) == 0:
        raise ForgetkitError(f"--frac {args.frac} of {run.n_samples} samples selects none")
    dm = data_map(run, burn_out=args.burn_out, progress=not args.quiet)
    counts = dm["region"].value_counts()
    print(f"data map of {args.run}: {len(dm)} samples, {dm.attrs['n_epochs']} epochs")
    for region in REGIONS:
        print(f"  {region:<15}{counts[region]:>8} samples")
    print(f"  {'never learned':<15}{int(dm['never_learned'].sum()):>8} samples")
    if args.plot:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7.0, 5.2), layout="constrained")
        plots.confidence_variability(dm, ax=fig.add_subplot())
        with atomic_write(Path(args.plot)) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        if not args.quiet:
            print(f"wrote {args.plot}")
    if args.select:
        ids = select(dm, region=args.select, frac=args.frac)
        rows = dm.loc[ids, ["label", "region", "confidence", "variability", "correctness"]]
        with atomic_write(Path(args.out)) as tmp:
            rows.to_csv(tmp)
        if not args.quiet:
            print(f"wrote {args.out}: {len(ids)} {args.select} samples")


def _cmd_scores(args):
    out = Path(args.out)
    refuse_overwrite({"--out": out}, [args.run, args.labels, args.second_split])
    if out.suffix != ".csv":
        raise ForgetkitError(f"--out must be a .csv file; got {args.out!r}")
    check_int("--window", args.window, minimum=1)
    check_int("--el2n-epochs", args.el2n_epochs, minimum=1, allow_none=True)
    run = load(args.run, labels=args.labels)
    second = load(args.second_split) if args.second_split else None
    df = data_scores(run, scores=args.scores, epochs=args.epochs, window=args.window,
                     el2n_epochs=args.el2n_epochs, second_split=second)
    with atomic_write(out) as tmp:
        df.to_csv(tmp)
    if not args.quiet:
        for reason in df.attrs["left_out"].values():
            print(f"left out: {reason}")
        print(f"wrote {out}: {', '.join(df.columns)} of {len(df)} samples "
              f"({df.attrs['n_epochs']} epochs)")


def _cmd_coreset(args):
    out = Path(args.out)
    refuse_overwrite({"--out": out}, [args.scores, args.labels])
    if out.suffix != ".npy":
        raise ForgetkitError(f"--out must be a .npy file; got {args.out!r}")
    check_coreset_options(args.keep, method=args.method, hard_cutoff=args.hard_cutoff,
                          strata=args.strata, seed=args.seed)
    table = read_scores_csv(args.scores)
    labels = None if args.labels is None else load_labels_file(args.labels)
    ids = select_coreset(table, args.keep, score=args.score, method=args.method,
                         hard_cutoff=args.hard_cutoff, strata=args.strata, seed=args.seed,
                         labels=labels)
    if len(ids) == 0:
        raise ForgetkitError(f"--keep {args.keep} of {len(table)} samples keeps none "
                             f"(round({args.keep} * {len(table)}) = 0); keep at least "
                             f"{0.5 / len(table):.3g} to keep one")
    with atomic_write(out) as tmp, open(tmp, "wb") as f:
        np.save(f, ids)
    if not args.quiet:
        print(f"wrote {out}: {len(ids)} of {len(table)} sample ids ({args.method} on "
              f"{args.score})")


def _cmd_sequences(args):
    outs = {"--out": Path(args.out), "--memorization": args.memorization}
    refuse_overwrite(outs, [args.run, args.sequence_ids])
    for option, path in outs.items():
        if path is not None and Path(path).suffix != ".csv":
            raise ForgetkitError(f"{option} must be a .csv file; got {str(path)!r}")
    ids = np.load(args.sequence_ids, allow_pickle=False) if args.sequence_ids else None
    run = load(args.run)
    if ids is None and run.sequence_ids is None:
        raise ForgetkitError(f"{args.run!r} holds no sequence ids (a top-k run does): pass "
                             "--sequence-ids IDS.npy, each token's sequence id")
    table = sequence_dynamics(run, sequence_ids=ids, progress=not args.quiet)
    with atomic_write(outs["--out"]) as tmp:
        table.to_csv(tmp)
    if args.memorization:
        with atomic_write(Path(args.memorization)) as tmp:
            memorization(run, sequence_ids=ids).to_csv(tmp)
    if not args.quiet:
        print(f"{args.run}: {run.n_samples} tokens in {len(table)} sequences, "
              f"{run.n_epochs} epochs; memorized at the final epoch: "
              f"{percent(table['memorized_final'].mean())} of sequences, "
              f"{percent(table['forgotten'].mean())} memorized earlier and forgotten")
        print(f"wrote {args.out}" + (f" and {args.memorization}" if args.memorization else ""))


def _validation_split(args, run):
    """(validation run, test run or None, description) from the fuse options."""
    if args.val_run:
        return load(args.val_run), None, f"validation run {args.val_run}"
    if args.val_indices:
        idx = check_indices(f"the validation indices in {args.val_indices}",
                            load_labels_file(args.val_indices, "validation indices"),
                            run.n_samples)
        rest = np.setdiff1d(np.arange(run.n_samples), idx)
        test = run.isel(samples=rest) if rest.size else None
        return run.isel(samples=idx), test, f"{idx.size} validation indices from {args.val_indices}"
    val, test = split_indices(run.n_samples, args.val_frac, seed=args.seed)
    return run.isel(samples=val), run.isel(samples=test), \
        f"split-half protocol (val_frac={args.val_frac}, seed={args.seed})"


def _cmd_fuse(args):
    refuse_overwrite({"--plan": args.plan}, [args.run, args.val_run, args.val_indices])
    run = load(args.run)
    val, test, how = _validation_split(args, run)
    kf = KnowledgeFusion(window=args.window, grid=None if args.grid == 0 else args.grid,
                         rule=args.rule, max_windows=args.max_windows,
                         progress=not args.quiet).fit(val)
    kf.to_json(args.plan)
    used = [(a, eps) for a, eps in kf.plan_ if eps > 0]
    print(f"fitted on {how}: {val.n_samples} samples, {val.n_epochs} epochs")
    certified = ", certified" if kind_of(val).bounded else ""
    print(f"validation accuracy: {percent(kf.initial_accuracy_)} (final epoch) -> "
          f"{percent(kf.val_accuracy_[-1] if kf.val_accuracy_ else kf.initial_accuracy_)} "
          f"(fused{certified})")
    print(f"windows used: {len(used)} of {len(kf.plan_)} tried; ensemble size k = "
          f"{kf.ensemble_size_} checkpoints")
    for a, eps in used:
        print(f"  epoch {kf.epochs_[a]} (window {args.window}): eps = {eps:.4g}")
    if test is not None:
        single = np.mean(single_hit(test))
        if kind_of(test).bounded:  # bounded probabilities: the certified interval
            low, high = kf.certified_accuracy(test)
            fused = f"[{percent(low)}, {percent(high)}] (fused, certified interval)"
        else:
            fused = f"{percent(np.mean(kf.predict(test) == test.labels))} (fused)"
        print(f"held-out accuracy: {percent(single)} (final epoch) -> {fused}, "
              f"{test.n_samples} samples")
    print(f"wrote {args.plan}")


def _cmd_apply(args):
    out = Path(args.out)
    refuse_overwrite({"--out": out}, [args.run, args.plan])
    if out.suffix != ".npy":
        raise ForgetkitError(f"--out must be a .npy file; got {args.out!r}")
    fuser = load_fuser(Path(args.plan))
    probs = fuser.predict_proba(load(args.run))
    with atomic_write(out) as tmp, open(tmp, "wb") as f:
        np.save(f, probs)  # on an open file np.save adds no .npy suffix
    if not args.quiet:
        print(f"wrote {out}: fused probabilities {probs.shape} from "
              f"{fuser.ensemble_size_} checkpoints")


def _cmd_compare(args):
    refuse_overwrite({"--json": args.json}, [args.run, args.val_run])
    run = load(args.run)
    val_run = load(args.val_run) if args.val_run else None
    table = compare(run, methods=args.methods, seeds=tuple(args.seeds), val_frac=args.val_frac,
                    val_run=val_run, window=args.window, progress=not args.quiet)
    print(format_table(table, fmt="markdown" if args.markdown else "text"))
    if args.json:
        write_json_atomic(Path(args.json), table.reset_index().to_dict(orient="records"))


def _cmd_sweep(args):
    refuse_overwrite({"--out": args.out}, args.runs)
    try:  # the optional dask extra; the error says how to install it
        from .distributed.sweep import cluster_api, sweep

        Client = cluster_api()[0]  # noqa: N806
    except ImportError as err:
        raise ForgetkitError(str(err)) from None

    client = Client(args.scheduler) if args.scheduler else None
    try:
        table = sweep(args.runs, methods=args.methods, client=client, n_workers=args.workers,
                      seeds=tuple(args.seeds), val_frac=args.val_frac, window=args.window,
                      progress=not args.quiet, errors="record")
    finally:
        if client is not None:
            client.close()
    with atomic_write(Path(args.out)) as tmp:
        table.to_csv(tmp, index=False)
    failed = table.loc[table["error"] != "", "error"]
    if not args.quiet:
        print(f"wrote {args.out}: {table['run'].nunique() - len(failed)} runs x "
              f"{len(args.methods)} methods" + (f", {len(failed)} failed" if len(failed) else ""))
    for message in failed:  # after the table: every good run's rows are kept
        print(f"forgetkit sweep: error: {message}", file=sys.stderr)
    return 1 if len(failed) else 0


def _cmd_distill(args):
    refuse_overwrite({"--out": args.out}, [args.plan, args.train_run])
    fuser = load_fuser(Path(args.plan))
    out = write_soft_targets(args.out, fuser, load(args.train_run), temperature=args.temperature)
    if not args.quiet:
        print(f"wrote {out}: soft targets from {fuser.ensemble_size_} checkpoints")


def _noise_mask(train_run, path):
    """The boolean mask of noisy labels from meta['noise_mask'] (their indices), or None
    when the run does not know which labels are noisy."""
    flipped = train_run.meta.get("noise_mask")
    if flipped is None:
        return None
    if not isinstance(flipped, list):
        raise ForgetkitError(f"{path}: meta['noise_mask'] must be a list of the indices of the "
                             f"noisy labels; got {type(flipped).__name__}")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in flipped):
        raise ForgetkitError(f"{path}: meta['noise_mask'] must list sample indices (integers)")
    mask = np.zeros(train_run.n_samples, dtype=bool)
    if flipped:
        mask[check_indices(f"meta['noise_mask'] of {path}", flipped, train_run.n_samples)] = True
    return mask


def _cmd_report(args):
    refuse_overwrite({"-o": args.out}, [args.run, args.train_run, args.tokenizer])
    if args.train_inputs and not args.train_run:
        raise ForgetkitError("--train-inputs needs --train-run")
    run = load(args.run)
    train_run, mask = None, None
    if args.train_run:
        train_run = load(args.train_run)
        mask = _noise_mask(train_run, args.train_run)
    paths = write_report(run, args.out, fmt=args.format, source=Path(args.run).name,
                         val_frac=args.val_frac, seeds=tuple(args.seeds), window=args.window,
                         train_run=train_run, noise_mask=mask, progress=not args.quiet,
                         inputs=args.inputs, train_inputs=args.train_inputs,
                         class_names=args.class_names, tokenizer=args.tokenizer,
                         sequences=args.sequences)
    if not args.quiet:
        print(f"wrote {paths[0]}" if args.format == "html"
              else f"wrote {len(paths)} figures to {args.out}")


def _factory(spec, option):
    """What the callable ``MODULE:CALLABLE`` (a module name importable from the current
    folder, or a ``.py`` file) returns when called with no arguments."""
    import importlib
    import importlib.util
    import os

    module, _, name = spec.rpartition(":")
    if not module or not name:
        raise ForgetkitError(f"{option} must be MODULE:CALLABLE; got {spec!r}")
    try:
        if module.endswith(".py"):
            where = importlib.util.spec_from_file_location(Path(module).stem, module)
            if where is None:
                raise ImportError(f"not a Python file: {module}")
            mod = importlib.util.module_from_spec(where)
            where.loader.exec_module(mod)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            mod = importlib.import_module(module)
    except Exception as err:
        raise ForgetkitError(f"{option} {spec!r}: cannot import {module!r}: "
                             f"{type(err).__name__}: {err}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ForgetkitError(f"{option} {spec!r}: {module!r} has no callable {name!r}")
    try:
        return fn()
    except Exception as err:
        raise ForgetkitError(f"{option} {spec!r} raised {type(err).__name__}: {err}") from None


def _replay_data(spec, *, trainer, tokens=False):
    """The --data of a replay: a MODULE:CALLABLE, arrays in a .npz (inputs and labels, or
    named model inputs and labels; token runs: input_ids, optionally attention_mask and
    labels), or (a Trainer's checkpoints) a datasets folder."""
    path = Path(spec)
    if path.suffix == ".npz" and path.is_file():
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        if tokens:
            if "input_ids" not in arrays:
                raise ForgetkitError(f"--data {spec!r} must hold the token ids as 'input_ids' "
                                     f"for a token run; it holds {sorted(arrays)}")
            return arrays
        labels = next((k for k in ("labels", "label", "y") if k in arrays), None)
        if labels is None:
            raise ForgetkitError(f"--data {spec!r} must hold the labels as 'labels' (or "
                                 f"'y'); it holds {sorted(arrays)}")
        if labels != "labels":
            arrays["labels"] = arrays.pop(labels)
        rest = [k for k in arrays if k != "labels"]
        if len(rest) == 1 and not trainer:
            return arrays[rest[0]], arrays["labels"]
        return arrays
    if path.is_dir():
        try:
            from datasets import load_from_disk
        except ImportError:
            raise ForgetkitError(f"--data {spec!r} is a folder: reading a dataset saved by "
                                 "save_to_disk needs: pip install datasets") from None
        return load_from_disk(str(path))
    if ":" in spec and not path.exists():
        return _factory(spec, "--data")
    raise ForgetkitError(f"--data must be MODULE:CALLABLE, an .npz file or a datasets "
                         f"folder; got {spec!r}")


def _int_list(text, option, what):
    """The integers of a comma-separated option (None when not given)."""
    if not text:
        return None
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise ForgetkitError(f"{option} must list {what}; got {text!r}") from None


def _torchrun_group():
    """Under torchrun (``WORLD_SIZE`` above 1, no process group yet): torch.distributed
    with the process group initialised here (NCCL on the local rank's GPU, else gloo), for
    `_cmd_replay` to destroy; otherwise None."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return None
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist


@contextmanager
def warnings_to_stderr(command):
    """The warnings raised in the block, printed one line each on stderr as ``forgetkit
    COMMAND: warning: ...`` when it ends, also when it fails."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                print(f"forgetkit {command}: warning: {' '.join(str(w.message).split())}",
                      file=sys.stderr)


def _one_line(err):
    """An exception as one line: its type and its first 300 characters."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def _cmd_replay(args):
    """Replay checkpoints into a run; under torchrun every rank replays its share of the
    checkpoints and rank 0 writes (and prints)."""
    if args.out in args.checkpoints:
        raise ForgetkitError(f"--out {args.out!r} is one of the checkpoints")
    devices = _int_list(args.devices, "--devices", "CUDA device numbers such as 0,1")
    epochs = _int_list(args.epochs, "--epochs", "epoch numbers such as 1,2,3")
    options = dict(epochs=epochs, device=args.device, devices=devices,
                   batch_size=args.batch_size, on_duplicate=args.on_duplicate,
                   autocast=args.autocast, progress=not args.quiet, mode=args.mode)
    tokens = args.tokens or args.top_k is not None
    if tokens:
        if args.dtype is not None:
            raise ForgetkitError("--dtype does not apply to a token run (--tokens, --top-k): "
                                 "its logits are stored as float32")
        options.update(tokens=True, top_k=args.top_k)
    elif args.dtype is not None:
        options["dtype"] = args.dtype
    trainer = args.model is None
    try:
        if trainer:
            if len(args.checkpoints) != 1 or not Path(args.checkpoints[0]).is_dir():
                raise ForgetkitError("--model MODULE:CALLABLE is needed for checkpoint files "
                                     "(without it, CHECKPOINT is a Trainer's output folder)")
            from .exporters.huggingface import replay
        else:
            from .exporters.torch import replay
    except ImportError as err:
        raise ForgetkitError(f"replay needs {err.name or 'a framework'}: pip install "
                             f"forgetkit[{'huggingface' if trainer else 'torch'}]") from None
    group = _torchrun_group()
    with warnings_to_stderr("replay"):
        try:
            if trainer:
                model_class = None
                if args.model_class:
                    import transformers

                    model_class = getattr(transformers, args.model_class, None)
                    if model_class is None:
                        raise ForgetkitError(f"--model-class: transformers has no "
                                             f"{args.model_class!r}")
                data = _replay_data(args.data, trainer=True, tokens=tokens)
                run = replay(args.checkpoints[0], data, args.out, model_class=model_class,
                             **options)
            else:
                model = _factory(args.model, "--model")
                data = _replay_data(args.data, trainer=False, tokens=tokens)
                run = replay(model, args.checkpoints, data, args.out,
                             trust_pickle=args.trust_pickle, **options)
        except RuntimeError as err:  # torch's: --data of another shape or dtype than --model
            raise ForgetkitError(f"the model failed on --data: {_one_line(err)}") from None
        finally:
            if group is not None:
                group.destroy_process_group()
    if run is not None and not args.quiet:  # (None: a rank other than 0)
        n = len(run.meta.get("replay", {}).get("checkpoints", []))
        print(f"wrote {args.out}: {run.n_epochs} epochs from {n} checkpoints")


def _add_replay_command(sub):
    p = sub.add_parser("replay", help="evaluate saved checkpoints on a dataset into a run")
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoint files, folders or glob patterns (state dicts: .pt, .pth, "
                        ".bin, .ckpt, .safetensors), or one Trainer output folder "
                        "(checkpoint-N folders) without --model")
    p.add_argument("--model", metavar="MODULE:CALLABLE",
                   help="returns the model (an instance of the architecture)")
    p.add_argument("--data", required=True, metavar="MODULE:CALLABLE|ARRAYS.npz|DATASET",
                   help="returns the data; or arrays (inputs and labels, or model inputs by "
                        "name and labels); or a folder saved by datasets' save_to_disk")
    p.add_argument("--out", required=True, metavar="RUN", help="run file (.npy, .parquet)")
    p.add_argument("--device", help="e.g. cuda, cuda:1, cpu (default: where the model is)")
    p.add_argument("--devices", metavar="0,1", help="several GPUs: whole checkpoints each")
    p.add_argument("--dtype", choices=("float16", "float32", "float64"),
                   help="stored precision of the outputs (default float16)")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="a causal language model's top-k token run: per target token the "
                        "target's logit, the log-sum-exp and the K largest logits (implies "
                        "--tokens)")
    p.add_argument("--tokens", action="store_true",
                   help="write a top-k token run (K = 8 unless --top-k); --data holds "
                        "input_ids (and optionally attention_mask and labels)")
    p.add_argument("--autocast", choices=("bfloat16", "float16"),
                   help="evaluate under torch.autocast (default: the model's precision)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", metavar="E,E,...", help="epoch numbers, one per checkpoint")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load with weights_only=False (only for files you trust)")
    p.add_argument("--on-duplicate", choices=("warn", "skip", "error"), default="warn")
    p.add_argument("--model-class", help="transformers class for a Trainer folder (default: "
                                         "the checkpoint config's architecture)")
    p.add_argument("--mode", choices=("a", "w"), default="a",
                   help="a: continue a replay into RUN (default); w: replace RUN")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_replay)


def _cmd_compare_weights(args):
    refuse_overwrite({"--json": args.json}, [args.run, *args.checkpoints])
    try:
        from .exporters.torch import compare_weight_space
    except ImportError as err:
        raise ForgetkitError(f"compare-weights needs {err.name or 'PyTorch'}: pip install "
                             "forgetkit[torch]") from None
    run = load(args.run)
    model = _factory(args.model, "--model")
    data = _replay_data(args.data, trainer=False)
    bn_data = _replay_data(args.bn_data, trainer=False) if args.bn_data else None
    epochs = _int_list(args.epochs, "--epochs", "epoch numbers such as 1,2,3")
    with warnings_to_stderr("compare-weights"):
        table = compare_weight_space(
            model, args.checkpoints, data, run, bn_data=bn_data, val_frac=args.val_frac,
            seeds=tuple(args.seeds), last=tuple(args.last), decays=tuple(args.decays),
            soup=not args.no_soup, epochs=epochs, batch_size=args.batch_size,
            device=args.device, window=args.window, trust_pickle=args.trust_pickle,
            progress=not args.quiet)
    print(format_table(table, fmt="markdown" if args.markdown else "text"))
    if args.json:
        write_json_atomic(Path(args.json), table.reset_index().to_dict(orient="records"))


def _add_weight_command(sub):
    p = sub.add_parser("compare-weights",
                       help="weight averages of the checkpoints beside output-space fusion")
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoint files, folders or glob patterns, as replay takes them")
    p.add_argument("--model", required=True, metavar="MODULE:CALLABLE",
                   help="returns the model (an instance of the architecture)")
    p.add_argument("--data", required=True, metavar="MODULE:CALLABLE|ARRAYS.npz",
                   help="the samples of RUN in its row order, as replay takes them")
    p.add_argument("--run", required=True, metavar="RUN",
                   help="the checkpoints' outputs on --data (recorded or replayed)")
    p.add_argument("--bn-data", metavar="MODULE:CALLABLE|ARRAYS.npz",
                   help="training data on which BatchNorm statistics are re-estimated")
    p.add_argument("--last", type=int, nargs="+", default=[2, 5, 10],
                   help="uniform averages of the last n checkpoints")
    p.add_argument("--decays", type=float, nargs="+", default=[0.5, 0.8, 0.9],
                   help="EMA decays over the checkpoint sequence")
    p.add_argument("--no-soup", action="store_true", help="leave out the greedy soup")
    p.add_argument("--val-frac", type=float, default=0.5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--device", help="e.g. cuda, cpu (default: where the model is)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", metavar="E,E,...", help="epoch numbers, one per checkpoint")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load with weights_only=False (only for files you trust)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_compare_weights)


def _cmd_warmup(args):
    from .kernels.warmup import warmup

    seconds = warmup(quiet=args.quiet)
    if not args.quiet:
        print(f"forgetkit's kernels are compiled into numba's cache ({seconds:.1f} s)")


def _add_fusion_commands(sub):
    p = sub.add_parser("fuse", help="fit a Knowledge Fusion plan on validation data")
    p.add_argument("run")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--val-indices", metavar="FILE", help="text file of validation indices")
    how.add_argument("--val-run", metavar="RUN", help="a separate validation run")
    p.add_argument("--val-frac", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--grid", type=int, default=101,
                   help="eps grid points (0: exact search over [0, 1])")
    p.add_argument("--rule", choices=("best", "paper"), default="best")
    p.add_argument("--max-windows", type=int, default=None)
    p.add_argument("--plan", required=True, metavar="OUT.json")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_fuse)

    p = sub.add_parser("apply", help="apply a fitted plan to a run; write fused probabilities")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("run")
    p.add_argument("--out", required=True, metavar="FUSED.npy")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_apply)

    p = sub.add_parser("compare", help="KF against the baselines (the paper's protocol)")
    p.add_argument("run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--val-frac", type=float, default=0.5)
    p.add_argument("--val-run", metavar="RUN", help="fit on this run, score on RUN")
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(METHODS))
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("sweep", help="compare on many runs, one task per run on a dask cluster")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run files or glob patterns")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None,
                       help="worker processes of a local cluster (default: one per core)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on this dask.distributed scheduler (e.g. tcp://host:8786)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--val-frac", type=float, default=0.5)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(METHODS))
    p.add_argument("--out", required=True, metavar="SWEEP.csv")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("distill", help="write fused soft targets of a training-set run")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("train_run", metavar="TRAIN_RUN")
    p.add_argument("--out", required=True, metavar="targets.parquet|targets.npy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_distill)

    p = sub.add_parser("report", help="HTML report: summary, comparison, plan and figures")
    p.add_argument("run")
    p.add_argument("-o", "--out", required=True, help="report.html, or a folder with --format png")
    p.add_argument("--format", choices=("html", "png"), default="html")
    p.add_argument("--val-frac", type=float, default=0.5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--train-run", metavar="RUN",
                   help="training-set run: adds its data map and label issues, and with "
                        "meta['noise_mask'] (indices of noisy labels) the label-noise figure")
    p.add_argument("--inputs", metavar="INPUTS",
                   help="the samples behind RUN's rows, shown by the sample explorer: images "
                        "(.npy/.npz, (N, H, W) or (N, H, W, 3)) or texts (.txt one per line, "
                        ".parquet/.csv column, FILE:COLUMN); row i is sample id i")
    p.add_argument("--train-inputs", metavar="INPUTS", help="the same for --train-run")
    p.add_argument("--class-names", metavar="NAMES",
                   help="comma-separated class names, or a file with one per line "
                        "(default: the run's own)")
    p.add_argument("--tokenizer", metavar="FILE_OR_DIR",
                   help="a token run's tokenizer (a tokenizers JSON file or a Hugging Face "
                        "tokenizer folder), to show its tokens as text (default: the one the "
                        "run's metadata names)")
    p.add_argument("--sequences", type=int, nargs="+", metavar="ID",
                   help="a token run of more than 100,000 tokens: sequences shown beside the "
                        "galleries' (smaller runs show every sequence)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_report)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="forgetkit",
        description="Forgetting analysis and Knowledge Fusion on stored training runs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("analyze", help="forgetting analysis of a run (F_e, L_e, double descent)")
    p.add_argument("run", help="run file (.npz, .npy, .parquet) or cartography folder")
    p.add_argument("--labels", help="labels (.npy or text) for a bare .npy run")
    p.add_argument("--json", metavar="OUT", help="write the full per-epoch arrays as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_analyze)

    p = sub.add_parser("convert", help="convert a run between .npz, .npy and .parquet")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--labels", help="labels (.npy or text) for a bare .npy run")
    p.add_argument("--layout", choices=("list", "binary"), default="list",
                   help="Parquet outputs column: FixedSizeList (default) or raw binary")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("verify", help="check every stored epoch of runs against their checksums")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--quiet", action="store_true", help="print only runs that fail")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("datamap", help="data map (confidence, variability) of a training run")
    p.add_argument("run")
    p.add_argument("--labels", help="labels (.npy or text) for a bare .npy run")
    p.add_argument("-o", "--plot", metavar="PNG", help="write the data map figure here")
    p.add_argument("--burn-out", type=int, default=None, metavar="N",
                   help="use only the first N epochs")
    p.add_argument("--select", choices=REGIONS + ("easy", "hard"),
                   help="write the samples of this region (with --out)")
    p.add_argument("--frac", type=float, default=None,
                   help="select this share of all samples, at the region's end of its metric")
    p.add_argument("--out", metavar="IDS.csv", help="CSV of the selected samples")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_datamap)

    _add_score_commands(sub)
    _add_token_commands(sub)
    _add_fusion_commands(sub)
    _add_replay_command(sub)
    _add_weight_command(sub)

    p = sub.add_parser("warmup", help="compile every kernel into numba's cache (images, CI)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_warmup)
    return parser


def _hard_cutoff(text):
    """``--hard-cutoff``: a number or a schedule's name ("auto", "gentle")."""
    if text in HARD_CUTOFF_SCHEDULES:
        return text
    try:
        return float(text)
    except ValueError:
        names = " or ".join(repr(name) for name in HARD_CUTOFF_SCHEDULES)
        raise argparse.ArgumentTypeError(f"expected a number, {names}; got {text!r}") from None


def _add_score_commands(sub):
    p = sub.add_parser("scores", help="per-sample pruning scores of a training run (CSV)")
    p.add_argument("run", metavar="TRAIN_RUN")
    p.add_argument("--out", required=True, metavar="SCORES.csv")
    p.add_argument("--labels", help="labels (.npy or text) for a bare .npy run")
    p.add_argument("--scores", nargs="+", choices=SCORES, default=None,
                   help="the scores to compute (default: all the run can give)")
    p.add_argument("--epochs", type=int, nargs="+", default=None, metavar="EPOCH",
                   help="stored epoch numbers to use (default: all)")
    p.add_argument("--window", type=int, default=10, help="dynamic uncertainty's window J")
    p.add_argument("--el2n-epochs", type=int, default=None, metavar="K",
                   help="EL2N's first epochs (default: ceil(0.1 E))")
    p.add_argument("--second-split", metavar="RUN",
                   help="run on the same samples while training on the second split: adds "
                        "second_split_forgetting")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_scores)

    p = sub.add_parser("coreset", help="the sample ids to keep, chosen by one score")
    p.add_argument("scores", metavar="SCORES.csv", help="written by forgetkit scores")
    p.add_argument("--score", required=True,
                   help="the column to select by (recommended: aleatoric, with --method ccs "
                        "and --labels; README, 'Choosing the data to keep')")
    p.add_argument("--keep", type=float, required=True, help="fraction to keep, in (0, 1]")
    p.add_argument("--method", choices=CORESET_METHODS, default="ccs")
    p.add_argument("--hard-cutoff", type=_hard_cutoff, default=0.0,
                   help="CCS: share of hardest samples removed first, or 'auto' (grows with "
                        "the pruning rate from keep 0.4) or 'gentle' (from keep 0.3)")
    p.add_argument("--strata", type=int, default=50, help="CCS: number of bins")
    p.add_argument("--labels", metavar="LABELS",
                   help="class of each row of the scores (.npy or text): class-balanced "
                        "selection")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, metavar="KEEP.npy")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_coreset)


def _add_token_commands(sub):
    p = sub.add_parser("sequences", help="per-sequence table of a token run (CSV)")
    p.add_argument("run", metavar="RUN", help="a token run (top-k, or any run with "
                                              "--sequence-ids)")
    p.add_argument("--out", required=True, metavar="SEQUENCES.csv")
    p.add_argument("--memorization", metavar="EPOCHS.csv",
                   help="also write the shares of tokens and sequences memorized per epoch")
    p.add_argument("--sequence-ids", metavar="IDS.npy",
                   help="each token's sequence id, for a run that does not hold them")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_sequences)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with compile_notice(enabled=not getattr(args, "quiet", False)
                            and args.func is not _cmd_warmup):
            status = args.func(args)
    except BrokenPipeError:
        sys.stdout = None  # output piped into e.g. `head`: not an error
        return 0
    except (ForgetkitError, OSError, MemoryError) as err:
        message = " ".join(str(err).split()) or "out of memory"
        print(f"forgetkit {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forgetkit: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"forgetkit {args.command}: internal error: the traceback above is a bug in "
              "forgetkit, not a problem with your input; please report it", file=sys.stderr)
        return EXIT_BUG
    return status if isinstance(status, int) and not isinstance(status, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
