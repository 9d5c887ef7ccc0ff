"""The benchmark suite: `python -m bench [--sizes S M L] [--out FILE]`.

Sizes (synthetic float16 NPY runs with realistic dynamics, seeded, cached in bench/data/):
S (E=200, N=10,000, C=100), M (E=200, N=10,000, C=200), L (E=90, N=50,000, C=1,000; 9 GB).
Every measurement runs in a fresh process (peak anonymous RSS is its own) and is compared
in the same run with a straightforward numpy implementation where that is practical, and
with the I/O floor (`cat file > /dev/null`, warm page cache) otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import DATA, SIZES, cat_seconds, machine, peak_rss_anon, suite_run, write_synthetic_npy


# ----------------------------------------------------------------- measurements
def _forgetting(path):
    import forgetkit as fk

    run = fk.load(path)
    fk.forget_fraction(run), fk.learn_fraction(run), fk.sample_dynamics(run)


def _forgetting_numpy(path):
    import forgetkit as fk

    from .bench_forgetting import numpy_pass

    run = fk.load(path)
    correct = numpy_pass(run)
    final = correct[-1]
    (correct & ~final).mean(1), (~correct & final).mean(1), correct.sum(0)


def _kf(path, max_windows):
    import forgetkit as fk

    run = fk.load(path)
    val, test = run.split(0.5, seed=0)
    t = time.perf_counter()
    kf = fk.KnowledgeFusion(max_windows=max_windows).fit(val)
    fit_seconds = time.perf_counter() - t
    kf.predict_proba(test)
    return {"k": kf.ensemble_size_, "steps": len(kf.plan_), "fit_seconds": fit_seconds}


def _kf_numpy(path, max_steps):
    import forgetkit as fk

    from .bench_fusion import numpy_kf

    val, _ = fk.load(path).split(0.5, seed=0)
    plan, times, setup = numpy_kf(val, max_steps=max_steps)
    return {"steps": len(plan), "step_seconds": float(np.mean(times)), "setup_seconds": setup}


def _compare(path, methods, seeds):
    import forgetkit as fk

    table = fk.compare(fk.load(path), methods=methods, seeds=tuple(seeds))
    return {"kf_gain": float(table.loc["kf", "gain"]) if "kf" in table.index else None}


def _read_parquet(path):
    """Decode every epoch (row group) into an (N, C) array."""
    import forgetkit as fk

    run = fk.load(path)
    for e in range(run.n_epochs):
        run.outputs[e]


def _read_npy(path):
    """Touch every byte of every epoch (a memmap slice alone reads nothing)."""
    import forgetkit as fk

    run = fk.load(path)
    for e in range(run.n_epochs):
        np.asarray(run.outputs[e]).view(np.int16).max()


def _save(src, dst, layout="binary"):
    import forgetkit as fk

    fk.save(fk.load(src), dst, layout=layout)


def _warm():
    """Compile every kernel into numba's on-disk cache (after an edit of forgetkit's
    kernels the first process would otherwise time the compilation): the suite's tasks on a
    tiny memory-mapped run, with the probability cache off as on L."""
    import forgetkit as fk
    from forgetkit.kernels import forced
    from forgetkit.run import DEFAULT_MEMORY_BUDGET

    path = write_synthetic_npy(DATA / "warm.npy", 6, 300, 20, seed=1, noise=0.1)
    for build in ("serial", "parallel"):  # a tiny run alone would take the serial build
        with forced(build):
            for budget in (DEFAULT_MEMORY_BUDGET, 0):
                run = fk.load(path)
                fk.compare(run, methods=list(fk.evaluate.METHODS), seeds=(0,),
                           memory_budget=budget)
                _forgetting(path)


TASKS = {"forgetting": _forgetting, "forgetting_numpy": _forgetting_numpy, "kf": _kf,
         "kf_numpy": _kf_numpy, "compare": _compare, "read_parquet": _read_parquet,
         "read_npy": _read_npy, "save": _save, "warm": _warm}


def child(task, args):
    from forgetkit import kernels

    kernels.argmax_rows(np.zeros((2, 3), np.float16), np.empty(2, np.int32))  # load the cache
    with peak_rss_anon() as mem:
        t = time.perf_counter()
        extra = TASKS[task](*json.loads(args))
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "peak_mb": mem["peak_mb"], "extra": extra}))


def measure(task, *args, timeout=3600):
    out = subprocess.run([sys.executable, "-m", "bench", "--child", task, json.dumps(args)],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{task} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ suite
def bench_size(name, rows, *, numpy_kf_steps, skip=(), seeds=(0, 1, 2)):
    n_epochs, n_samples, n_classes = SIZES[name]
    path, gb = suite_run(name)
    cat_seconds(path)
    floor = min(cat_seconds(path) for _ in range(2))

    def row(what, r, *, baseline=None, base_name="", note=""):
        ratio = ""
        if baseline is not None:
            ratio = f"{baseline / r['seconds']:.1f}x {base_name}"
        rows.append([name, what, f"{r['seconds']:.2f}", f"{gb / r['seconds']:.2f}",
                     ratio, f"{r['peak_mb']:.0f}", note])
        print("| " + " | ".join(rows[-1]) + " |", file=sys.stderr, flush=True)

    rows.append([name, f"cat (I/O floor), {gb:.2f} GB", f"{floor:.2f}", f"{gb / floor:.2f}",
                 "", "", ""])
    r = measure("forgetting", str(path))
    row("forgetting pass (F_e, L_e, per-sample stats)", r, baseline=floor,
        base_name="the floor's speed")
    if name != "L":
        rn = measure("forgetting_numpy", str(path))
        rows[-1][4] += f"; {rn['seconds'] / r['seconds']:.1f}x faster than numpy"
    for mw, label in ((1, "KF(1)"), (None, "KF(inf)")):
        r = measure("kf", str(path), mw)
        note = f"k={r['extra']['k']}, {r['extra']['steps']} steps"
        if mw is None:
            steps = r["extra"]["steps"]
            ref_steps = None if name != "L" else numpy_kf_steps
            rn = measure("kf_numpy", str(path), ref_steps)
            ref = rn["extra"]["setup_seconds"] + rn["extra"]["step_seconds"] * steps
            fit = dict(r, seconds=r["extra"]["fit_seconds"])
            row(f"{label} fit on the validation half", fit, baseline=ref,
                base_name="faster than brute-force numpy"
                + ("" if ref_steps is None else f" (extrapolated from {ref_steps} steps)"),
                note=note)
            row(f"{label} fit + apply on the test half", r, note=note)
        else:
            row(f"{label} fit + apply", r, note=note)
    methods = ["single", "kf1", "kf", "horizontal", "fixed_jumps", "early_stopping",
               "ensemble_selection", "likelihood"]
    if "compare" not in skip:
        r = measure("compare", str(path), methods, list(seeds))
        row(f"compare, {len(seeds)} seed(s), all baselines", r,
            note=f"KF gain {r['extra']['kf_gain']:.2f} pp (synthetic data: not meaningful)")
    for layout in [lay for lay in ("binary", "list") if f"parquet_{lay}" not in skip]:
        pq_path = DATA / f"suite_{name}_{layout}.parquet"
        rs = measure("save", str(path), str(pq_path), layout)
        row(f"save Parquet ({layout})", rs)
        cat_seconds(pq_path)
        rr = measure("read_parquet", str(pq_path))
        row(f"read Parquet ({layout}) epoch by epoch", rr, baseline=floor,
            base_name="the floor's speed")
        pq_path.unlink()
    npy_copy = DATA / f"suite_{name}_copy.npy"
    row("save NPY", measure("save", str(path), str(npy_copy)))
    npy_copy.unlink()
    npy_copy.with_name(npy_copy.stem + ".forgetkit.json").unlink(missing_ok=True)
    row("read NPY (memmap) epoch by epoch", measure("read_npy", str(path)), baseline=floor,
        base_name="the floor's speed")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["S", "M", "L"], choices=["S", "M", "L"])
    p.add_argument("--numpy-kf-steps", type=int, default=2,
                   help="brute-force KF steps timed on L (extrapolated to the full fit)")
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["compare", "parquet_binary", "parquet_list"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="splits of the compare measurement")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    measure("warm")
    rows = []
    for name in args.sizes:
        bench_size(name, rows, numpy_kf_steps=args.numpy_kf_steps, skip=args.skip,
                   seeds=args.seeds)
        print(f"size {name} done", file=sys.stderr, flush=True)
    head = ["size", "what", "wall s", "GB/s", "ratio", "peak RssAnon MB", "note"]
    lines = [f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; "
             f"command: python -m bench {' '.join(sys.argv[1:])}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
