#!/bin/sh
# bench/invariance_cost.sh: what gradient shards (--invariant) cost. One epoch of
# dtrain-mnist (or what the extra flags say, e.g. --limit 6400), 1 process of batch 128
# and 2 processes of batch 64, with --invariant 0 (threads and ranks sum as they come)
# and --invariant 8, interleaved, REPS times each. Prints each run's training-loop
# seconds (the STATS line) and user CPU seconds of all processes (/usr/bin/time), and
# the medians. On a shared machine the CPU seconds are the steadier figure.
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
            out=$(/usr/bin/time -f 'CPU %U' $bin --batch-size "$b" $np --invariant $v --stats \
                --no-test "$@" 2>&1)
            t=$(echo "$out" | sed -n 's/.*"train_loop_secs": *\([0-9.]*\).*/\1/p' | head -1)
            u=$(echo "$out" | sed -n 's/^CPU \([0-9.]*\)$/\1/p')
            echo "$w x $b --invariant $v: loop $t s, user CPU $u s"
            echo "$t" >>"$tmp/loop-$w-$v"
            echo "$u" >>"$tmp/cpu-$w-$v"
        done
    done
done
med() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for w in 1 2; do
    for v in 0 8; do
        printf 'median, %s process(es), --invariant %s: loop %s s, user CPU %s s\n' "$w" "$v" \
            "$(med "$tmp/loop-$w-$v")" "$(med "$tmp/cpu-$w-$v")"
    done
done
