#!/bin/sh
# DataParallel threads (--data-parallel N, one process) against N processes with DDP
# over shared memory (--num-processes N --backend shm), and one process whose model
# splits each batch over its own threads (--threads N), on dtrain-dataparallel's MLP
# (examples/dataparallel; the figures in RESULTS.md before issue 25 ran dtrain-mnist's
# ConvNet, whose example now keeps to the plain loop), the same global batch (128) in
# every mode. Runs interleaved (threads, dp, procs,
# threads, ...); medians of the training loop (STATS train_loop_secs), of the whole run,
# of the CPU time (user + system, children included: steadier on a loaded machine) and
# of the peak RSS (the largest rank's; processes hold N of them).
#
#   bench/dp_vs_procs.sh [--runs R] [--n N] [--limit SAMPLES]
set -eu
runs=7 n=2 limit=6400
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    *) echo "usage: $0 [--runs R] [--n N] [--limit SAMPLES]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
bin=build/bin/dtrain-dataparallel
[ -x $bin ] || { echo "build first: make" >&2; exit 1; }
out=bench/out/dp; mkdir -p $out
common="--limit $limit --no-test --stats"
mode_threads="--threads $n --batch-size 128"
mode_dp="--threads $n --data-parallel $n --batch-size 128"
mode_procs="--threads 1 --num-processes $n --backend shm --batch-size $((128 / n))"
loop() { sed -n 's/.*"train_loop_secs": \([0-9.]*\).*/\1/p' "$1"; }
whole() { sed -n 's/^STATS {"secs": \([0-9.]*\).*/\1/p' "$1"; }
rss() { sed -n 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/p' "$1"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for m in threads dp procs; do : > $out/$m.txt; done
for i in $(seq "$runs"); do
    for m in threads dp procs; do
        eval "flags=\$mode_$m"
        # shellcheck disable=SC2086
        /usr/bin/time -f "%U %S" -o $out/$m.cpu $bin $common $flags > $out/$m.log 2>&1 ||
            { echo "$m run $i failed:" >&2; cat $out/$m.log >&2; exit 1; }
        echo "$(loop $out/$m.log) $(whole $out/$m.log) $(awk '{print $1 + $2}' $out/$m.cpu) $(rss $out/$m.log)" >> $out/$m.txt
    done
done
echo "N $n, --limit $limit, batch 128, $runs runs interleaved"
printf "%-8s %12s %12s %12s %12s\n" mode "loop s" "whole s" "CPU s" "RSS MiB"
for m in threads dp procs; do
    printf "%-8s %12s %12s %12s %12s\n" $m "$(cut -d' ' -f1 $out/$m.txt | median)" \
        "$(cut -d' ' -f2 $out/$m.txt | median)" "$(cut -d' ' -f3 $out/$m.txt | median)" \
        "$(cut -d' ' -f4 $out/$m.txt | median)"
    echo "  loops: $(cut -d' ' -f1 $out/$m.txt | tr '\n' ' ')"
done
pr() { paste -d' ' $out/$1.txt $out/$2.txt | awk -v c="$3" '{print $(c + 4) / $c}' | median; }
printf "median paired ratios dp/procs: loop %.3f, CPU %.3f; dp/threads: loop %.3f, CPU %.3f\n" \
    "$(pr procs dp 1)" "$(pr procs dp 3)" "$(pr threads dp 1)" "$(pr threads dp 3)"
