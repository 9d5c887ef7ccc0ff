#!/bin/bash
# The L figures of bench/RESULTS.md (forgetting pass, KF fit, compare; 16 threads and 1) on
# two trees in one call of a lent host, e.g. main and the tree before a change:
#
#   mkdir -p lfig && git archive main | tar -x -C lfig/new && git archive OLD | tar -x -C lfig/old
#   cp bench/l_two_trees.sh lfig/ && cd lfig && bash l_two_trees.sh OUTDIR
#
# (each tree without data_samples; PY = the python, HI = the high thread count, default 16,
# LATE = seconds after which the 1-thread points are skipped.) Phase A, off the clock and in
# parallel: the suite's L run is written once (new tree's bench.common, 9 GB; about 110 s on
# a lent host) and each tree compiles its kernels into its own numba cache (bench_scaling's
# child warm-up of forgetting, kf_fit and compare on the tiny run, both builds). Phase B, one
# process at a time: `bench.compare_threads HI` per tree, then bench_scaling's measurement (a
# fresh process, kernels loaded off the clock, peak RssAnon) of the KF fit and the forgetting
# pass at HI threads and at 1, the trees alternating. One JSON line per figure in
# OUTDIR/lfig.jsonl.
set -u
OUT=$1
PY=${PY:-python3}
HI=${HI:-16}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*"; }
HERE=$PWD
log "host: $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo)"
$PY -c "import numba, numpy, sys; print('python', sys.version.split()[0], 'numba', numba.__version__, 'numpy', numpy.__version__, 'threads', numba.config.NUMBA_NUM_THREADS)"
mkdir -p new/bench/data
rm -rf old/bench/data && ln -s ../../new/bench/data old/bench/data
(cd new && $PY -c "from bench.common import warm_run; print(warm_run())") || exit 1
WARM=bench/data/warm_scaling.npy
L=bench/data/suite_L.npy

warm() {  # compile one tree's kernels into its cache (both builds, tiny run)
    cd "$HERE/$1" || return 1
    for task in forgetting kf_fit compare; do
        $PY -m bench.bench_scaling --child $task $WARM $HI >/dev/null || { echo "warm $1 $task failed"; return 1; }
    done
    log "warm $1 done"
}
log "phase A: write L, compile both trees"
(cd new && NUMBA_CACHE_DIR=$(mktemp -d) $PY -c "from bench.common import suite_run; print(suite_run('L'))" && echo "[$(el)s] L written") > "$OUT/gen.log" 2>&1 &
GEN=$!
warm new > "$OUT/warm_new.log" 2>&1 &
WN=$!
warm old > "$OUT/warm_old.log" 2>&1 &
WO=$!
wait $GEN; g=$?; wait $WN; n=$?; wait $WO; o=$?
cat "$OUT/gen.log" "$OUT/warm_new.log" "$OUT/warm_old.log"
[ $g = 0 ] && [ $n = 0 ] && [ $o = 0 ] || { log "phase A failed ($g $n $o)"; exit 1; }
cd "$HERE/new" && $PY -c "from bench.common import cat_seconds; import json; print(json.dumps({'cat_seconds': [round(cat_seconds('$L'), 3) for _ in range(2)]}))" | tee -a "$OUT/lfig.jsonl"

log "phase B: timed"
point() {  # tree task threads
    cd "$HERE/$1" && $PY -c "
import json, sys
from bench.bench_scaling import measure
r = measure(sys.argv[1], sys.argv[2], int(sys.argv[3]), 300)
print(json.dumps(dict(r, tree=sys.argv[4], task=sys.argv[1])))" "$2" "$L" "$3" "$1" | tee -a "$OUT/lfig.jsonl"
}
for tree in new old; do
    cd "$HERE/$tree" && $PY -m bench.compare_threads $HI | sed "s/}\$/, \"tree\": \"$tree\", \"task\": \"compare\"}/" | tee -a "$OUT/lfig.jsonl"
    log "compare $tree done"
done
for task in kf_fit forgetting; do point old $task $HI; point new $task $HI; done
lf() {  # tree threads: fk.load and the forgetting pass timed together (a verified float16
    # load computes the predictions with the checksums, so timing the pass alone after the
    # load would leave that part off the clock on trees that verify)
    cd "$HERE/$1" && $PY -c "
import json, sys, time
import numba
numba.set_num_threads(int(sys.argv[2]))
import forgetkit as fk
from bench.bench_scaling import _task
from bench.common import warm_run
from forgetkit.kernels import forced
for build in ('serial', 'parallel'):
    with forced(build):
        _task('forgetting', warm_run())
t = time.perf_counter()
run = fk.load(sys.argv[1])
fk.forget_fraction(run), fk.learn_fraction(run), fk.sample_dynamics(run)
print(json.dumps({'task': 'load_forgetting', 'tree': sys.argv[3], 'threads': numba.get_num_threads(), 'seconds': round(time.perf_counter() - t, 3)}))" "$L" "$2" "$1" | tee -a "$OUT/lfig.jsonl"
}
for r in 1 2; do lf old $HI; lf new $HI; done
if [ "$(el)" -lt "${LATE:-165}" ]; then lf new 1; lf old 1; point new forgetting 1; point old forgetting 1; else log "skipped 1 thread"; fi
log "end"
