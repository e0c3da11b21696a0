#!/bin/sh
# precision.sh: one epoch of the seed ConvNet (Fashion-MNIST, batch 128, one process,
# 2 threads) in dtrain fp32, dtrain --precision bf16 (and fp16 with --fp16), and the
# PyTorch peer ddp_convnet.py in fp32 and with --autocast-bf16, at the peer's best
# settings (../shared/bench/peer/README.md), runs interleaved per round. Per run: the
# training loop's wall time ("Finished training in"), the CPU time of the whole process
# (user + system: steadier on a loaded machine; it includes loading and the test pass),
# the test accuracy and loss. Medians at the end.
#
#   bench/precision.sh [--reps N] [--limit N] [--fp16] [--no-peer] [--peer DIR]
#
# --limit trains dtrain on the first N samples only (the peer has no such flag: its
# rows are then left out). --no-peer leaves the peer out too (dtrain's full epochs only:
# on a loaded machine the peer's epoch takes minutes; run it in fewer rounds apart).
set -eu
reps=3 limit="" fp16=0 nopeer=0 peer=${PEER:-../shared/bench/peer}
while [ $# -gt 0 ]; do
    case $1 in
    --reps) reps=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --fp16) fp16=1; shift ;;
    --no-peer) nopeer=1; shift ;;
    --peer) peer=$2; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--limit N] [--fp16] [--no-peer] [--peer DIR]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
bin=build/bin/dtrain-mnist
[ -x $bin ] || { echo "build first: make" >&2; exit 1; }
out=bench/out/precision; mkdir -p $out; rm -f $out/*.txt
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
echo "# flags: $(grep -o 'avx512_bf16\|amx_bf16\|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# DT_PRECISION_PATH=${DT_PRECISION_PATH:-auto}"
lim=${limit:+--limit $limit}
configs="dtrain-fp32 dtrain-bf16"
[ $fp16 = 1 ] && configs="$configs dtrain-fp16"
[ -z "$limit" ] && [ $nopeer = 0 ] && configs="$configs peer-fp32 peer-bf16"
cmd() { # the command line of a config
    case $1 in
    dtrain-*) echo "$bin $lim --threads 2 --batch-size 128 --precision ${1#dtrain-}" ;;
    peer-fp32 | peer-bf16)
        echo "env MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184" \
            "/usr/bin/python3 $peer/ddp_convnet.py --undistributed --batch-size 128 --threads 2" \
            "--blas-threads 1 $([ $1 = peer-bf16 ] && echo --autocast-bf16)" ;;
    esac
}
for c in $configs; do echo "# $c: $(cmd $c)"; done
for i in $(seq "$reps"); do
    for c in $configs; do
        /usr/bin/time -f "%U %S" -o $out/cpu sh -c "$(cmd $c)" > $out/$c.log 2>&1 ||
            { echo "$c run $i failed:" >&2; tail $out/$c.log >&2; exit 1; }
        secs=$(sed -n 's/^Finished training in \([0-9.]*\) secs.*/\1/p' $out/$c.log | head -1)
        cpu=$(awk '{print $1 + $2}' $out/cpu)
        acc=$(sed -n 's/.*Test accuracy: \([0-9.]*\)%.*/\1/p; s/.*accuracy [0-9]*\/[0-9]* (\([0-9.]*\)%).*/\1/p' $out/$c.log | head -1)
        loss=$(sed -n 's/.*average loss \([0-9.]*\).*/\1/p' $out/$c.log | head -1)
        echo "$secs $cpu $acc $loss" >> $out/$c.txt
        echo "round $i $c: train ${secs}s, cpu ${cpu}s, accuracy ${acc}%, test loss $loss"
    done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "| run | train loop wall s (median) | CPU s (median) | test accuracy % (median) | test loss (median) |"
echo "|---|---:|---:|---:|---:|"
for c in $configs; do
    f=$out/$c.txt
    echo "| $c | $(cut -d' ' -f1 $f | median) | $(cut -d' ' -f2 $f | median) | $(cut -d' ' -f3 $f | median) | $(cut -d' ' -f4 $f | median) |"
done
if [ -z "$limit" ] && [ $nopeer = 0 ]; then # the goals of issue 14 (train-loop wall time)
    bf=$(cut -d' ' -f1 $out/dtrain-bf16.txt | median)
    pf=$(cut -d' ' -f1 $out/peer-fp32.txt | median)
    pb=$(cut -d' ' -f1 $out/peer-bf16.txt | median)
    df=$(cut -d' ' -f1 $out/dtrain-fp32.txt | median)
    awk -v b="$bf" -v f="$pf" -v p="$pb" -v d="$df" 'BEGIN {
        printf "dtrain bf16 / peer fp32 = %.3fx (goal <= 0.35 on Zen 4, 0.25 with AMX), / peer bf16 = %.3fx (goal <= 0.5), / dtrain fp32 = %.3fx\n", b / f, b / p, b / d }'
fi
