#!/bin/sh
# The cost of --trace on one epoch of dtrain-mnist (the seed's ConvNet on 60,000
# Fashion-MNIST images): runs interleaved (plain, traced, plain, traced, ...), the
# median train_loop_secs of each from the STATS line, and their ratio.
#
#   bench/trace_cost.sh [--runs N] [--procs P]     (default: 3 runs, 2 processes)
set -eu
runs=3 procs=2
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--procs P]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
bin=build/bin/dtrain-mnist
[ -x $bin ] || { echo "build first: make" >&2; exit 1; }
out=bench/out; mkdir -p $out
if [ "$procs" = 1 ]; then cmd="$bin --stats --no-test"
else cmd="$bin --stats --no-test --num-processes $procs --batch-size $((128 / procs)) --threads 1"; fi
loop() { sed -n 's/^STATS .*"train_loop_secs": \([0-9.]*\).*/\1/p' "$1"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >$out/trace_plain.txt; : >$out/trace_on.txt
i=0
while [ $i -lt "$runs" ]; do
    $cmd >$out/trace_run.log 2>&1; loop $out/trace_run.log >>$out/trace_plain.txt
    $cmd --trace $out/trace.json >$out/trace_run.log 2>&1; loop $out/trace_run.log >>$out/trace_on.txt
    i=$((i + 1))
done
p=$(median <$out/trace_plain.txt); t=$(median <$out/trace_on.txt)
echo "command: $cmd [--trace $out/trace.json]"
echo "plain  train_loop_secs: $(tr '\n' ' ' <$out/trace_plain.txt) median $p"
echo "traced train_loop_secs: $(tr '\n' ' ' <$out/trace_on.txt) median $t"
echo "ratio traced/plain: $(echo "scale=4; $t / $p" | bc)  trace file: $(wc -c <$out/trace.json) bytes"
