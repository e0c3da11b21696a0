#!/bin/sh
# ddp_compress.sh: DDP gradient compression over a shaped link. Two network namespaces
# joined by a veth pair, each end limited by tc (tbf) to RATE (default 1gbit), one rank
# of bench/ddp_compress.c in each, over tcp. Needs root. Usage:
#   bench/ddp_compress.sh [RATE]
set -e
cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
make -s NODEPS=1 lib >/dev/null
mkdir -p build/bench
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Werror -Wno-psabi -Iinclude -Isrc bench/ddp_compress.c \
    build/release/lib/libdtrain.a -lopenblas -ldeflate -lz -lm -lpthread \
    $(mpicc --showme:link 2>/dev/null || true) -o build/bench/ddp_compress
A=dtcmp-$$-a B=dtcmp-$$-b VA=dtc$$a VB=dtc$$b
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
ip netns add $A
ip netns add $B
ip link add $VA type veth peer name $VB
ip link set $VA netns $A
ip link set $VB netns $B
ip -n $A addr add 10.201.0.1/24 dev $VA
ip -n $B addr add 10.201.0.2/24 dev $VB
ip -n $A link set $VA up
ip -n $B link set $VB up
ip -n $A link set lo up
ip -n $B link set lo up
tc -n $A qdisc add dev $VA root tbf rate $RATE burst 256kb latency 100ms
tc -n $B qdisc add dev $VB root tbf rate $RATE burst 256kb latency 100ms
echo "# link: veth between two namespaces, tbf $RATE each way"
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
PORT=29611
ip netns exec $B env RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.201.0.1 MASTER_PORT=$PORT DT_TIMEOUT_MS=60000 \
    DT_SOCKET_IFADDR=10.201.0.2 DT_HOST_ID=b BENCH_DEV=$VB DT_JOB_TOKEN=bench build/bench/ddp_compress &
ip netns exec $A env RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.201.0.1 MASTER_PORT=$PORT DT_TIMEOUT_MS=60000 \
    DT_SOCKET_IFADDR=10.201.0.1 DT_HOST_ID=a BENCH_DEV=$VA DT_JOB_TOKEN=bench build/bench/ddp_compress || echo "rank 0 failed: $?"
wait || echo "rank 1 failed"
