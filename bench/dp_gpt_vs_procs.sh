#!/bin/sh
# DataParallel threads against processes on dtrain-gpt's model (the byte-level GPT,
# default size): build/bench/dp_gpt (the example's loop on dt_dp, --data-parallel N)
# against `dtrain-gpt --num-processes N --backend shm` and one process with --threads N,
# the same global batch (32 sequences of 128 bytes). Interleaved runs; medians of the
# training loop's wall time, of the CPU time (user + system, children included) and of
# tokens/s. The loss lines of dp_gpt and of the processes agree (checked on each run).
#
#   bench/dp_gpt_vs_procs.sh [--runs R] [--n N] [--steps S]
set -eu
runs=5 n=2 steps=10
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 [--runs R] [--n N] [--steps S]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
gptbin=build/bin/dtrain-gpt lib=build/release/lib/libdtrain.a
[ -x $gptbin ] && [ -f $lib ] || { echo "build first: make" >&2; exit 1; }
mkdir -p build/bench
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Werror -Wno-psabi -Wno-unused-function -Iinclude -Isrc \
    bench/dp_gpt.c $lib -lopenblas -ldeflate -lz -lm -lpthread \
    $(mpicc --showme:link 2>/dev/null || true) -o build/bench/dp_gpt
out=bench/out/dp_gpt; mkdir -p $out
common="--steps $steps --eval-every 0 --log-every 1"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
loop() { grep '^STATS' "$1" | head -1 | sed 's/.*"\(train_\)\{0,1\}loop_secs": \([0-9.]*\).*/\2/'; }
for m in threads dp procs; do : > $out/$m.txt; done
for i in $(seq "$runs"); do
    for m in threads dp procs; do
        case $m in
        threads) cmd="$gptbin --threads $n" ;;
        dp) cmd="build/bench/dp_gpt --data-parallel $n --threads $n" ;;
        procs) cmd="$gptbin --num-processes $n --threads 1 --backend shm" ;;
        esac
        # shellcheck disable=SC2086
        /usr/bin/time -f "%U %S" -o $out/$m.cpu $cmd $common > $out/$m.log 2>&1 ||
            { echo "$m run $i failed:" >&2; cat $out/$m.log >&2; exit 1; }
        echo "$(loop $out/$m.log) $(awk '{print $1 + $2}' $out/$m.cpu)" >> $out/$m.txt
        grep -o '^step [0-9/]* | loss [0-9.]*' $out/$m.log > $out/$m.loss
    done
    cmp -s $out/dp.loss $out/procs.loss || { echo "dp and procs losses differ (run $i):" >&2; paste $out/dp.loss $out/procs.loss >&2; }
done
echo "N $n, $steps steps of 32 x 128 tokens, $runs runs interleaved"
printf "%-8s %12s %12s %12s\n" mode "loop s" "CPU s" "tok/s"
for m in threads dp procs; do
    l=$(cut -d' ' -f1 $out/$m.txt | median)
    printf "%-8s %12s %12s %12.0f\n" $m "$l" "$(cut -d' ' -f2 $out/$m.txt | median)" \
        "$(echo "$l" | awk -v s="$steps" '{print 32 * 128 * s / $1}')"
    echo "  loops: $(cut -d' ' -f1 $out/$m.txt | tr '\n' ' ')"
done
pr() { paste -d' ' $out/$1.txt $out/$2.txt | awk -v c="$3" '{print $(c + 2) / $c}' | median; }
printf "median paired ratios dp/procs: loop %.3f, CPU %.3f; dp/threads: loop %.3f, CPU %.3f\n" \
    "$(pr procs dp 1)" "$(pr procs dp 2)" "$(pr threads dp 1)" "$(pr threads dp 2)"
