"""Time and size of the token report (`forgetkit report` on a top-k run).

    python -m bench.bench_token_report [--tokens 1000000 --epochs 10 --seeds 0]

Two rows, each `forgetkit report RUN -o OUT` in a fresh process (loading included), CPU
seconds (user + system: the machine may be shared), wall seconds, the HTML's size, and as
the baseline `forgetkit analyze RUN` (loading and the forgetting pass) in a fresh process:

- the sample run data_samples/lm_fortunes_gpt2_heldout_top8.npy (3,048 tokens, 26
  checkpoints, vocabulary 8,192): every sequence shown;
- a synthetic top-k run of ``--tokens`` tokens in sequences of 512 (written once under
  bench/data/ by `bench.bench_topk_fusion.write_run`): beyond 100,000 tokens the report
  shows the galleries' sequences only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from .bench_topk_fusion import write_run
from .common import DATA, machine

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data_samples" / "lm_fortunes_gpt2_heldout_top8.npy"


def timed(args):
    """(CPU s, wall s) of ``forgetkit ARGS`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "forgetkit.cli", *args], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def report(run, out, seeds):
    """`forgetkit report` of ``run`` (CPU s, wall s, size), and its baseline in the same
    run: `forgetkit analyze` (loading and the forgetting pass) in a fresh process."""
    base_cpu, _ = timed(["analyze", str(run)])
    cpu, wall = timed(["report", str(run), "-o", str(out), "--quiet", "--seeds",
                       *map(str, seeds)])
    return {"run": run.name, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            "analyze_cpu_s": round(base_cpu, 2), "x_analyze": round(cpu / base_cpu, 1),
            "html_mb": round(out.stat().st_size / 2**20, 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    large = DATA / f"topk_{args.epochs}x{args.tokens}_k{args.k}.npy"
    write_run(large, args.epochs, args.tokens, args.vocab, args.k)
    rows = [report(SAMPLE, DATA / "token_report_sample.html", args.seeds),
            report(large, DATA / "token_report_large.html", args.seeds)]
    print(json.dumps({"machine": machine(), "seeds": args.seeds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
