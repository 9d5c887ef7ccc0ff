#!/bin/bash
# Issue 35's figures on a lent host, two trees in one call: the round-2 tree (OLD) and this
# one (NEW), laid out beside each other (each without data_samples), e.g. from the
# repository's root:
#
#   mkdir -p .wt_warm2/old .wt_warm2/new
#   git archive 66b1f06 forgetkit | tar -x -C .wt_warm2/old
#   git archive HEAD forgetkit bench pyproject.toml | tar -x -C .wt_warm2/new
#   bash .wt_warm2/new/bench/warm_device.sh OUTDIR [SIZES] [REPEAT]
#
# 1. bench.bench_warm --tree OLD --tree NEW --sizes SIZES (default "cifar sample") --repeat
#    REPEAT (default 3), the tasks TASKS (default: every one): first-run and warm seconds
#    per size and tree, each in a new numba cache (OUTDIR/warm.json, the table in
#    OUTDIR/warm.md);
# 2. unless POOL=0, bench.bench_pool on NEW: a call's hand-off cost on the pool's threads,
#    by thread count (OUTDIR/pool.json);
# 3. unless WARMUP=0, on two of the cores (taskset -c 0,1, 2 numba threads), each with an
#    empty cache, NEW's first KF fit of the cifar-sized run, the background compile off
#    (OUTDIR/first_fit.json), and `python -m forgetkit.kernels`, the warmup
#    (OUTDIR/warmup.txt): issue 35's 2-core goals (10 s and 60 s) on an idle machine.
# The repository's data_samples (the clean sample run) is linked into NEW. PY: the python.
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
SIZES=${2:-"cifar sample"}
REPEAT=${3:-3}
TASKS=${TASKS:-"kf_fit forgetting data_map label_issues compare"}
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
NEW=$HERE/new
OLD=$HERE/old
REPO=$(cd "$HERE/.." && pwd)
T0=$(date +%s)
[ -e "$NEW/data_samples" ] || ln -s "$REPO/data_samples" "$NEW/data_samples"
{
    echo "host: $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo)"
    $PY -c "import sys, numba, numpy; print('python', sys.version.split()[0], 'numba', numba.__version__, 'numpy', numpy.__version__, 'threads', numba.config.NUMBA_NUM_THREADS)"
    uptime
} > "$OUT/host.txt" 2>&1
cd "$NEW" || exit 1
export PYTHONPATH=$NEW
# shellcheck disable=SC2086  # SIZES, TASKS: lists of words
$PY -m bench.bench_warm --tree "$OLD" --tree "$NEW" --sizes $SIZES --repeat "$REPEAT" \
    --tasks $TASKS --json "$OUT/warm.json" > "$OUT/warm.md" 2> "$OUT/warm.log"
echo "bench_warm: rc $?, $(( $(date +%s) - T0 )) s" >> "$OUT/host.txt"
if [ "${POOL:-1}" != 0 ]; then
    timeout 150 $PY -m bench.bench_pool --json "$OUT/pool.json" > /dev/null 2> "$OUT/pool.log"
    echo "bench_pool: rc $?, $(( $(date +%s) - T0 )) s" >> "$OUT/host.txt"
fi
if [ "${WARMUP:-1}" != 0 ] && command -v taskset > /dev/null; then
    two() { taskset -c 0,1 env NUMBA_NUM_THREADS=2 NUMBA_CACHE_DIR="$1" "${@:2}"; }
    CACHE=$(mktemp -d)
    [ -e bench/data/cifar_f32.npy ] && two "$CACHE" env FORGETKIT_BACKGROUND_COMPILE=0 \
        timeout 100 $PY -c "
import json, time, numpy as np, forgetkit as fk
v, l = np.load('bench/data/cifar_f32.npy'), np.load('bench/data/cifar_labels.npy')
run = fk.Run(v, l)
t, c = time.perf_counter(), time.process_time()
fk.KnowledgeFusion().fit(run)
print(json.dumps({'first_fit_s': time.perf_counter() - t, 'cpu_s': time.process_time() - c}))
" > "$OUT/first_fit.json" 2> "$OUT/first_fit.log"
    echo "first fit, 2 cores: rc $?, $(( $(date +%s) - T0 )) s" >> "$OUT/host.txt"
    rm -rf "$CACHE"
    CACHE=$(mktemp -d)
    two "$CACHE" timeout 150 $PY -m forgetkit.kernels > "$OUT/warmup.txt" 2>&1
    echo "warmup, 2 cores: rc $?, $(( $(date +%s) - T0 )) s" >> "$OUT/host.txt"
    rm -rf "$CACHE"
fi
