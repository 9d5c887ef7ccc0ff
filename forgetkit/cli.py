"""Command line: ``forgetkit analyze|convert|fuse|apply|compare ...``.

A thin layer: parse, load, one library call, write. Library errors become one line on stderr
and exit status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import forgetting
from .io import _write_json_atomic, convert, load


def _pct(x):
    return f"{100 * x:.2f}%"


def _cmd_analyze(args):
    run = load(args.run, labels=args.labels)
    s = forgetting.summary(run, progress=not args.quiet)
    dd = s["double_descent"]
    lines = [
        f"run: {args.run}  ({s['n_epochs']} epochs, {s['n_samples']} samples, "
        f"{s['n_classes']} classes)",
        f"final accuracy:        {_pct(s['final_accuracy'])}",
        f"best accuracy:         {_pct(s['best_accuracy'])} at epoch {s['best_epoch']}",
        f"max forget fraction:   {_pct(s['max_forget_fraction'])} at epoch "
        f"{s['max_forget_epoch']}",
        f"ever forgotten:        {_pct(s['ever_forgotten'])} of samples were correct at some "
        "epoch and wrong at the end",
    ]
    if dd["found"]:
        lines.append(
            f"double descent:        peak at epoch {dd['peak_epoch']} "
            f"({_pct(dd['peak_accuracy'])}), dip at {dd['dip_epoch']} "
            f"({_pct(dd['dip_accuracy'])}), second peak at {dd['second_peak_epoch']} "
            f"({_pct(dd['second_peak_accuracy'])}); forgotten in the dip "
            f"{_pct(dd['forgotten_in_dip'])}, never re-learned {_pct(dd['never_relearned'])}"
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
        _write_json_atomic(Path(args.json), record)
        if not args.quiet:
            print(f"wrote {args.json}")


def _cmd_convert(args):
    out = convert(args.src, args.dst, labels=args.labels, layout=args.layout)
    if not args.quiet:
        print(f"wrote {out}")


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

    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except BrokenPipeError:
        sys.stdout = None  # output piped into e.g. `head`: not an error
        return 0
    except (ValueError, TypeError, OSError) as err:
        print(f"forgetkit {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forgetkit: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
