#!/bin/sh
# ddp_compress_train.sh: the seed ConvNet trained for one epoch by 2 processes (one per
# "machine": two network namespaces joined by a veth pair, each end shaped by tc tbf to
# RATE, default 1gbit; tcp backend) with DDP's gradient all-reduce uncompressed, in bf16,
# in fp16 and by PowerSGD (rank 4): epoch time, bytes each rank sent (its interface's
# tx_bytes over the run, headers included) and the final test accuracy, modes
# interleaved per round. Needs root. Usage:
#   bench/ddp_compress_train.sh [RATE] [ROUNDS]      (defaults 1gbit, 1)
# Env: EXTRA (more dtrain-mnist flags, e.g. "--limit 12800").
set -e
cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
ROUNDS=${2:-1}
BIN=build/bin/dtrain-mnist
[ -x $BIN ] || { echo "build first: make" >&2; exit 1; }
A=dtct-$$-a B=dtct-$$-b VA=dtt$$a VB=dtt$$b
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
ip netns add $A
ip netns add $B
ip link add $VA type veth peer name $VB
ip link set $VA netns $A
ip link set $VB netns $B
ip -n $A addr add 10.202.0.1/24 dev $VA
ip -n $B addr add 10.202.0.2/24 dev $VB
ip -n $A link set $VA up
ip -n $B link set $VB up
ip -n $A link set lo up
ip -n $B link set lo up
[ "$RATE" = none ] || {
    tc -n $A qdisc add dev $VA root tbf rate $RATE burst 256kb latency 100ms
    tc -n $B qdisc add dev $VB root tbf rate $RATE burst 256kb latency 100ms
}
echo "# link: veth between two namespaces, tbf $RATE each way; tcp backend; 2 processes x 1 thread"
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
OUT=build/bench/ddp_compress_train
mkdir -p $OUT
PORT=29631
tx() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes"; }
echo "| round | mode | epoch s (Finished training) | MB sent by rank 0 | MB sent by rank 1 | test accuracy | test loss |"
echo "|---|---|---:|---:|---:|---:|---:|"
r=1
while [ $r -le "$ROUNDS" ]; do
    for mode in none bf16 fp16 powersgd; do
        PORT=$((PORT + 1))
        ta0=$(tx $A $VA) tb0=$(tx $B $VB)
        common="--batch-size 128 --threads 1 --backend tcp --ddp-compress $mode --powersgd-rank 4 ${EXTRA:-}"
        ip netns exec $B env RANK=1 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.202.0.1 MASTER_PORT=$PORT \
            DT_SOCKET_IFADDR=10.202.0.2 DT_HOST_ID=b DT_JOB_TOKEN=bench $BIN $common > $OUT/$mode.r1.log 2>&1 &
        ip netns exec $A env RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.202.0.1 MASTER_PORT=$PORT \
            DT_SOCKET_IFADDR=10.202.0.1 DT_HOST_ID=a DT_JOB_TOKEN=bench $BIN $common > $OUT/$mode.r0.log 2>&1 ||
            echo "rank 0 ($mode) failed: $(tail -3 $OUT/$mode.r0.log)"
        wait || echo "rank 1 ($mode) failed: $(tail -3 $OUT/$mode.r1.log)"
        ta1=$(tx $A $VA) tb1=$(tx $B $VB)
        secs=$(sed -n 's/^Finished training in \([0-9.]*\) secs.*/\1/p' $OUT/$mode.r0.log | head -1)
        acc=$(sed -n 's/.*Test accuracy: \([0-9.]*\)%.*/\1/p' $OUT/$mode.r0.log | head -1)
        loss=$(sed -n 's/.*average loss \([0-9.]*\).*/\1/p' $OUT/$mode.r0.log | head -1)
        awk -v r=$r -v m=$mode -v s="$secs" -v a0=$ta0 -v a1=$ta1 -v b0=$tb0 -v b1=$tb1 -v acc="$acc" -v l="$loss" \
            'BEGIN { printf "| %d | %s | %s | %.1f | %.1f | %s%% | %s |\n", r, m, s, (a1 - a0) / 1e6, (b1 - b0) / 1e6, acc, l }'
    done
    r=$((r + 1))
done
