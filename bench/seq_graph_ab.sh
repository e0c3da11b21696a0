#!/bin/sh
# bench/seq_graph_ab.sh: the Sequential dt_model before and after it became a dt_graph
# (issue 11). One epoch of dtrain-mnist --threads 2 --no-test (or what the extra flags
# say) with the OLD and the NEW binary, interleaved (the order alternates per pair),
# REPS pairs. Prints each run's user+system CPU seconds (/usr/bin/time) and training
# loop seconds (the STATS line), the medians and the new/old ratio of the medians, and
# whether the two binaries printed the same loss lines (they must: same kernels, same
# summation order).
#   usage: [OLD=bin | OLD_REV=rev] [NEW=bin] [REPS=3] bench/seq_graph_ab.sh [flags]
# Without OLD, the old binary is built from OLD_REV (default 6581e33, main before the
# change) in a temporary folder (git archive, make programs: a minute or two).
set -eu
reps=${REPS:-3}
new=${NEW:-build/bin/dtrain-mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "${OLD:-}" ]; then
    rev=${OLD_REV:-6581e33}
    mkdir "$tmp/old"
    git archive "$rev" | tar -x -C "$tmp/old"
    make -C "$tmp/old" -j2 NODEPS=1 programs >"$tmp/old-build.log" 2>&1 ||
        { tail -20 "$tmp/old-build.log"; exit 1; }
    OLD=$tmp/old/build/bin/dtrain-mnist
fi
[ $# -eq 0 ] && set -- --threads 2 --no-test
run() { # label binary flags...
    label=$1
    bin=$2
    shift 2
    out=$(/usr/bin/time -f 'CPU %U %S' "$bin" --stats "$@" 2>&1)
    cpu=$(echo "$out" | sed -n 's/^CPU \([0-9.]*\) \([0-9.]*\)$/\1 \2/p' | awk '{print $1 + $2}')
    loop=$(echo "$out" | sed -n 's/.*"train_loop_secs": *\([0-9.]*\).*/\1/p' | head -1)
    echo "$out" | grep -E '^epoch|^Test accuracy' >"$tmp/lines-$label" || true
    echo "$label: CPU $cpu s, loop $loop s"
    echo "$cpu" >>"$tmp/cpu-$label"
    echo "$loop" >>"$tmp/loop-$label"
}
for r in $(seq "$reps"); do
    if [ $((r % 2)) -eq 1 ]; then
        run old "$OLD" "$@"
        run new "$new" "$@"
    else
        run new "$new" "$@"
        run old "$OLD" "$@"
    fi
    cmp -s "$tmp/lines-old" "$tmp/lines-new" || echo "pair $r: the loss lines DIFFER"
done
med() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
co=$(med "$tmp/cpu-old")
cn=$(med "$tmp/cpu-new")
lo=$(med "$tmp/loop-old")
ln=$(med "$tmp/loop-new")
echo "median CPU s: old $co, new $cn, new/old $(echo "$cn $co" | awk '{printf "%.3f", $1 / $2}')"
echo "median loop s: old $lo, new $ln, new/old $(echo "$ln $lo" | awk '{printf "%.3f", $1 / $2}')"
cmp -s "$tmp/lines-old" "$tmp/lines-new" && echo "loss lines: identical" ||
    echo "loss lines: DIFFERENT"
