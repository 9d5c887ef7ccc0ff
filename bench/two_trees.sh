#!/bin/bash
# One benchmark command on two source trees, alternating, in one run of this machine:
#
#   bash bench/two_trees.sh OLD_TREE NEW_TREE OUTDIR ROUNDS -- python -m bench.bench_fusion --skip-large
#
# e.g. OLD_TREE from `git worktree add /tmp/before <commit>`. Each round runs the command in
# OLD_TREE, then in NEW_TREE (each tree imports its own forgetkit and keeps its own numba
# cache; the trees share NEW_TREE/bench/data, the synthetic runs, so both read the same
# files). Output: OUTDIR/<round>-old.log and OUTDIR/<round>-new.log. Compare the figures
# of the same round: the machine's speed drifts between rounds.
set -u
OLD=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd); OUT=$3; ROUNDS=$4
shift 4
[ "$1" = "--" ] && shift
mkdir -p "$OUT" "$NEW/bench/data"
OUT=$(cd "$OUT" && pwd)
if [ ! -L "$OLD/bench/data" ]; then  # an empty or missing folder becomes a link to NEW's
    rmdir "$OLD/bench/data" 2>/dev/null
    [ -e "$OLD/bench/data" ] || ln -s "$NEW/bench/data" "$OLD/bench/data"
fi
for round in $(seq 1 "$ROUNDS"); do
    for side in old new; do
        tree=$OLD; [ $side = new ] && tree=$NEW
        echo "[round $round, $side: $tree] $*"
        (cd "$tree" && PYTHONPATH="$tree" "$@") > "$OUT/$round-$side.log" 2>&1 \
            || echo "  failed: see $OUT/$round-$side.log"
    done
done
