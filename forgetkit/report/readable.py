"""A run's metadata as a person reads it: durations, rounded numbers, long lists summarised."""

from __future__ import annotations

import json
import math
import numbers

#: Longest text shown as it is; longer values are cut with "…".
TEXT_MAX = 120


def duration(seconds):
    """``409.31`` -> "6 min 49 s"; ``3.2`` -> "3.2 s"; ``7384`` -> "2 h 3 min"."""
    s = float(seconds)
    if not math.isfinite(s):
        return str(seconds)
    if abs(s) < 60:
        return f"{s:.3g} s" if abs(s) < 10 else f"{s:.0f} s"
    whole = round(s)
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    return f"{h} h {m} min" if h else f"{m} min {sec} s"


def _is_duration(key):
    k = key.lower()
    return k.endswith(("seconds", "_s", "_sec", "_secs")) or k in ("time", "elapsed", "duration")


def _number(v):
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    x = float(v)
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.4g}"
    return f"{x:.4f}".rstrip("0").rstrip(".") if abs(x) < 1 else f"{x:.4g}"


def value_text(key, value):
    """One metadata value as short readable text."""
    if value is None:
        return "—"
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and _is_duration(key):
        return duration(value)
    if isinstance(value, (bool, numbers.Real)):
        return _number(value)
    if isinstance(value, str):
        return value if len(value) <= TEXT_MAX else value[:TEXT_MAX] + "…"
    if isinstance(value, (list, tuple)):
        if len(value) <= 8 and all(isinstance(v, (str, numbers.Real)) for v in value):
            return ", ".join(v if isinstance(v, str) else _number(v) for v in value) or "(empty)"
        kind = "integers" if all(isinstance(v, numbers.Integral) for v in value) else "values"
        head = ", ".join(value_text(key, v) for v in value[:3])
        return f"{len(value):,} {kind} ({head}, …)"
    if isinstance(value, dict):
        text = json.dumps(value, default=str)
        return text if len(text) <= TEXT_MAX else f"{len(value)} entries: " + ", ".join(
            map(str, list(value)[:6])) + ("…" if len(value) > 6 else "")
    return value_text(key, str(value))


def meta_rows(meta):
    """[(name, readable value)] of a metadata dict, one level of nested dicts flattened as
    "outer · inner"."""
    rows = []
    for key, value in meta.items():
        if isinstance(value, dict) and 0 < len(value) <= 12:
            rows += [(f"{key} · {k}", value_text(str(k), v)) for k, v in value.items()]
        else:
            rows.append((str(key), value_text(str(key), value)))
    return [(k.replace("_", " "), v) for k, v in rows]


def run_html(run):
    """A short HTML table of a run for notebooks: shape, kind, epochs, final accuracy."""
    import html

    import numpy as np

    e, n, c = run.shape
    if run.is_distributed:
        final = "not computed (outputs on a dask cluster)"
    else:
        last = run.isel(epochs=[e - 1]) if e > 1 else run
        final = f"{100 * float(np.mean(np.asarray(last.correctness()))):.2f}%"
    names = run.class_names
    rows = [
        ("shape", f"{e:,} epochs × {n:,} samples × {c:,} classes"),
        ("kind", f"{run.kind} ({run.outputs.dtype})"),
        ("epochs", f"{run.epochs[0]}..{run.epochs[-1]}" if e > 1 else str(run.epochs[0])),
        ("final accuracy", f"{final} (epoch {run.epochs[-1]})"),
        ("classes", (", ".join(names) if len(names) <= 20 else value_text("classes", names))
         if names else f"{c} (no names)"),
    ]
    if run.sample_ids is not None:
        rows.append(("sample ids", value_text("sample ids", run.sample_ids.tolist())))
    if run.source is not None:
        rows.append(("source", str(run.source)))
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                   f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table><caption style='text-align:left'><b>forgetkit Run</b></caption>{body}</table>"
