#!/bin/sh
# gpt_precision.sh: dtrain-gpt in fp32 and bf16 against the PyTorch peer gpt_bytes.py in
# fp32 and under --autocast-bf16, interleaved per round (dtrain fp32, dtrain bf16, peer
# fp32, peer bf16, ...), one process with 2 threads each (the peer's best setting, its
# README). One line per run: STATS tokens_per_sec (the whole loop), the last step
# line's tok/s (steady state), the final training loss, the 1-minute load average and
# the process CPU seconds. At the end the medians of tok/s and of CPU seconds (user +
# system; every run trains the same tokens, so CPU seconds compare cost per token: on a
# loaded machine the peer's OpenMP threads spin while waiting, which inflates its wall
# time and its CPU time alike, so THREADS=1 gives the fairest CPU comparison).
#   bench/gpt_precision.sh [ROUNDS] [STEPS]      (defaults 3 rounds of 20 steps)
# Run from the repository root. Env: DTRAIN_GPT (default build/bin/dtrain-gpt), PEER
# (the folder of gpt_bytes.py, default ../shared/bench/peer), THREADS (2: dtrain
# --threads 2, the peer --threads 2 --blas-threads 1; 1: both one thread).
set -u
ROUNDS=${1:-3}
STEPS=${2:-20}
BIN=${DTRAIN_GPT:-build/bin/dtrain-gpt}
PEER=${PEER:-../shared/bench/peer}
THREADS=${THREADS:-2}
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184
COMMON="--steps $STEPS --eval-every 0 --log-every 10"
OUT=$(mktemp -d)
one() { # name, command...
    name=$1; shift
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$( { /usr/bin/time -f "CPU %U %S" "$@" $COMMON; } 2>&1 )
    tps=$(echo "$out" | grep '^STATS' | head -1 | sed 's/.*"tokens_per_sec": \([0-9.]*\).*/\1/')
    last=$(echo "$out" | grep '| tok/s' | tail -1 | sed 's/.*tok\/s //')
    loss=$(echo "$out" | grep '| tok/s' | tail -1 | sed 's/.*| loss \([0-9.]*\).*/\1/')
    cpu=$(echo "$out" | grep '^CPU' | tail -1)
    echo "$name | tok/s $tps | last $last | loss $loss | load $load | $cpu"
    echo "$tps" >> "$OUT/$name"
    echo "$cpu" | awk '{print $2 + $3}' >> "$OUT/$name.cpu"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
r=1
while [ $r -le "$ROUNDS" ]; do
    one dtrain-fp32 "$BIN" --threads $THREADS --precision fp32
    one dtrain-bf16 "$BIN" --threads $THREADS --precision bf16
    one peer-fp32 /usr/bin/python3 "$PEER/gpt_bytes.py" --undistributed --threads $THREADS --blas-threads 1
    one peer-bf16 /usr/bin/python3 "$PEER/gpt_bytes.py" --undistributed --threads $THREADS --blas-threads 1 --autocast-bf16
    r=$((r + 1))
done
for c in dtrain-fp32 dtrain-bf16 peer-fp32 peer-bf16; do
    eval "m_$(echo $c | tr - _)=$(median < "$OUT/$c")"
    eval "c_$(echo $c | tr - _)=$(median < "$OUT/$c.cpu")"
done
echo "# threads $THREADS; CPU: $(lscpu | sed -n 's/^Model name: *//p'); load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians of tok/s (whole loop): dtrain fp32 $m_dtrain_fp32, dtrain bf16 $m_dtrain_bf16, peer fp32 $m_peer_fp32, peer bf16 $m_peer_bf16"
awk -v d="$m_dtrain_bf16" -v f="$m_peer_fp32" -v b="$m_peer_bf16" -v d32="$m_dtrain_fp32" 'BEGIN {
    printf "dtrain bf16 / peer fp32 = %.2fx (goal >= 3), / peer bf16 = %.2fx (goal >= 1.5), / dtrain fp32 = %.2fx\n", d / f, d / b, d / d32 }'
echo "medians of CPU s (user + system): dtrain fp32 $c_dtrain_fp32, dtrain bf16 $c_dtrain_bf16, peer fp32 $c_peer_fp32, peer bf16 $c_peer_bf16"
awk -v d="$c_dtrain_bf16" -v f="$c_peer_fp32" -v b="$c_peer_bf16" -v d32="$c_dtrain_fp32" 'BEGIN {
    printf "per CPU second: dtrain bf16 / peer fp32 = %.2fx (goal >= 3), / peer bf16 = %.2fx (goal >= 1.5), / dtrain fp32 = %.2fx\n", f / d, b / d, d32 / d }'
rm -rf "$OUT"
