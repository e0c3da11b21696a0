#!/bin/sh
# bench/invariance_cost.sh: what gradient shards (--invariant) cost. One epoch of
# dtrain-mnist, 1 process (threads: cores) and 2 processes of batch 64, with
# --invariant 0 (threads and ranks sum as they come) and the default (--invariant 8),
# interleaved, REPS times each; prints each run's training seconds (the STATS line's
# "train_loop_secs") and the medians.
#   usage: bench/invariance_cost.sh [REPS] [extra dtrain-mnist flags]
set -eu
reps=${1:-3}
[ $# -gt 0 ] && shift
bin=${DTRAIN_MNIST:-build/bin/dtrain-mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$reps"); do
    for w in 1 2; do
        b=$((128 / w))
        for v in 0 8; do
            np=""
            [ "$w" -gt 1 ] && np="--num-processes $w"
            t=$($bin --batch-size "$b" $np --invariant $v --stats --no-test "$@" 2>&1 |
                sed -n 's/.*"train_loop_secs": *\([0-9.]*\).*/\1/p' | head -1)
            echo "$w x $b --invariant $v: $t s"
            echo "$t" >>"$tmp/$w-$v"
        done
    done
done
for w in 1 2; do
    for v in 0 8; do
        printf 'median %s process(es), --invariant %s: %s s\n' "$w" "$v" \
            "$(sort -n "$tmp/$w-$v" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
    done
done
