#!/bin/sh
# bench/seq_graph_ab.sh: the models before and after the Sequential dt_model became a
# dt_graph and the graph ran each pass as one thread task (issue 11). Runs one program
# with the OLD and the NEW build, interleaved (the order alternates per pair), REPS
# pairs, and prints each run's user+system CPU seconds (/usr/bin/time) and training
# loop seconds (the STATS line), the medians, the new/old ratio of the medians, and
# whether the two builds printed the same losses (they must: same kernels, same
# summation order).
#   usage: [PROG=mnist|gpt|resnet] [OLD=bin-dir | OLD_REV=rev] [NEW=bin-dir] [REPS=3]
#          bench/seq_graph_ab.sh [flags]
# Default flags: mnist: one epoch, --threads 2 --no-test; gpt: --threads 2 --steps 10
# --eval-every 0; resnet: --threads 2 --limit 4096 --no-test. Without OLD, the old
# programs are built from OLD_REV (default 6581e33, main before the change) in a
# temporary folder (git archive, make programs: a minute or two).
set -eu
prog=${PROG:-mnist}
reps=${REPS:-3}
new=${NEW:-build/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "${OLD:-}" ]; then
    rev=${OLD_REV:-6581e33}
    mkdir "$tmp/old"
    git archive "$rev" | tar -x -C "$tmp/old"
    make -C "$tmp/old" -j2 NODEPS=1 programs >"$tmp/old-build.log" 2>&1 ||
        { tail -20 "$tmp/old-build.log"; exit 1; }
    OLD=$tmp/old/build/bin
fi
if [ $# -eq 0 ]; then
    case $prog in
    mnist) set -- --threads 2 --no-test ;;
    gpt) set -- --threads 2 --steps 10 --eval-every 0 --log-every 1 ;;
    resnet) set -- --threads 2 --limit 4096 --no-test ;;
    *) echo "PROG: expected mnist, gpt or resnet, found $prog" >&2; exit 2 ;;
    esac
fi
run() { # label bin-dir flags...
    label=$1
    bin=$2/dtrain-$prog
    shift 2
    stats=--stats
    [ "$prog" = gpt ] && stats= # it always prints its STATS line
    out=$(/usr/bin/time -f 'CPU %U %S' "$bin" $stats "$@" 2>&1) ||
        { echo "$label failed: $(echo "$out" | tail -3)"; exit 1; }
    cpu=$(echo "$out" | sed -n 's/^CPU \([0-9.]*\) \([0-9.]*\)$/\1 \2/p' | awk '{print $1 + $2}')
    loop=$(echo "$out" | sed -n 's/.*"\(train_\)\{0,1\}loop_secs": *\([0-9.]*\).*/\2/p' | head -1)
    echo "$out" | grep -v '^STATS' | grep -oE 'loss:? [0-9.]+' >"$tmp/lines-$label" || true
    echo "$label: CPU $cpu s, loop ${loop:-?} s, $(wc -l <"$tmp/lines-$label") losses"
    echo "$cpu" >>"$tmp/cpu-$label"
    echo "${loop:-0}" >>"$tmp/loop-$label"
}
for r in $(seq "$reps"); do
    if [ $((r % 2)) -eq 1 ]; then
        run old "$OLD" "$@"
        run new "$new" "$@"
    else
        run new "$new" "$@"
        run old "$OLD" "$@"
    fi
    cmp -s "$tmp/lines-old" "$tmp/lines-new" || echo "pair $r: the losses DIFFER"
done
med() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
co=$(med "$tmp/cpu-old")
cn=$(med "$tmp/cpu-new")
lo=$(med "$tmp/loop-old")
ln=$(med "$tmp/loop-new")
echo "dtrain-$prog $*"
echo "median CPU s: old $co, new $cn, new/old $(echo "$cn $co" | awk '{printf "%.3f", $1 / $2}')"
echo "median loop s: old $lo, new $ln, new/old $(echo "$ln $lo" | awk '{printf "%.3f", $1 / $2}')"
cmp -s "$tmp/lines-old" "$tmp/lines-new" && echo "losses: identical" || echo "losses: DIFFERENT"
