#!/bin/sh
# dtrain alone, one epoch of the seed's ConvNet, in the configurations issue #4 asks
# about: 1 process with 1 and 2 threads, 2 processes (batch 64 each, one thread each)
# on shm with and without overlapping gradient reduction with backward, on tcp, and
# 4 processes on the 2 cores as the seed does. Runs interleaved; medians.
#
#   bench/scaling.sh [--runs N]
set -eu
runs=3
[ "${1:-}" = --runs ] && runs=$2
cd "$(dirname "$0")/.."
bin=build/bin/dtrain-mnist
out=bench/out; mkdir -p $out
set -- \
    "1p-1t|--threads 1" \
    "1p-2t|--threads 2" \
    "2p-shm|--num-processes 2 --batch-size 64 --threads 1 --backend shm" \
    "2p-shm-no-overlap|--num-processes 2 --batch-size 64 --threads 1 --backend shm --no-overlap" \
    "2p-tcp|--num-processes 2 --batch-size 64 --threads 1 --backend tcp" \
    "4p-shm|--num-processes 4 --batch-size 32 --threads 1 --backend shm"
field() { sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$1" | tail -1; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
i=1
while [ $i -le "$runs" ]; do
    for c in "$@"; do
        name=${c%%|*} flags=${c#*|}
        # shellcheck disable=SC2086
        $bin --stats $flags > $out/scale.$name.$i.log 2>&1
        echo "run $i: $name $(field $out/scale.$name.$i.log secs) s"
    done
    i=$((i + 1))
done
echo
echo "dtrain-mnist, one epoch of Fashion-MNIST, medians of $runs runs (total batch 128)"
printf '%-20s %9s %10s %13s %9s %9s\n' config epoch_s samples/s ddp_wait_s accuracy rss_MiB
for c in "$@"; do
    name=${c%%|*}
    med() { for f in $out/scale.$name.*.log; do field $f "$1"; done | median; }
    printf '%-20s %9.2f %10.0f %13.3f %9.2f %9.1f\n' "$name" "$(med secs)" \
        "$(echo "60000 / $(med secs)" | bc -l)" "$(med ddp_wait_secs)" "$(med accuracy)" "$(med peak_rss_mib)"
done
t1=$(for f in $out/scale.1p-1t.*.log; do field $f secs; done | median)
t2=$(for f in $out/scale.2p-shm.*.log; do field $f secs; done | median)
t2n=$(for f in $out/scale.2p-shm-no-overlap.*.log; do field $f secs; done | median)
printf 'speedup 1 -> 2 processes (one thread each, shm): %.2fx; overlap saves %.2f s per epoch\n' \
    "$(echo "$t1 / $t2" | bc -l)" "$(echo "$t2n - $t2" | bc -l)"
echo "(epoch_s: 'Finished training', setup and data loading included; ddp_wait_s: time"
echo " rank 0 spent waiting for gradient all-reduces after backward, summed over the epoch)"
