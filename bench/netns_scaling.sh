#!/bin/bash
# netns_scaling.sh: multi-machine all_reduce and training measured on one box (issue 10,
# "Measure"). Four "machines" are network namespaces nbx-h0..3, each joined by a veth
# pair to a bridge in a fifth namespace (nbx-sw, the switch), addresses 10.201.0.1..4;
# every process of machine i runs in its own UTS namespace with hostname nbxnode<i>
# (dtrain and Open MPI tell hosts apart by name, so ranks of different machines never
# use shared memory). Each link is shaped by `tc tbf` in both directions (the host's
# end and the switch's end) to each rate of RATES. This kernel has no netem: no delay
# is added (the script says so when netem is missing, and adds DELAY when it is there).
#
#   bench/netns_scaling.sh                    # everything: REPEATS=3 interleaved passes
#   REPEATS=1 RATES=1gbit TOPOS=2x2 bench/netns_scaling.sh
#   PASS0=3 REPEATS=1 RATES="1gbit none" bench/netns_scaling.sh   # pass 3, rows appended
#                                             # (rate "none": no qdisc, the CPU's ceiling)
#   bench/netns_scaling.sh setup | teardown   # only build / remove the namespaces
#   bench/netns_scaling.sh exec I CMD...      # run CMD on machine I (after setup)
#
# Per pass, for each topology (2x2: 2 machines of 2 ranks; 4x1: 4 machines of 1 rank),
# each rate and each tool (2x2: dtrain hybrid, dtrain tcp, Open MPI, Gloo; 4x1: dtrain
# tcp, Open MPI, Gloo), in that interleaved order:
#   - all_reduce float32 sum, 4 KiB .. 16 MiB (factor 4), sizes' default iterations;
#   - all_reduce of 64 MiB, WARM + ITERS operations, with the bytes of every veth read
#     from /sys/class/net/*/statistics before and after: the busiest link direction's
#     bytes per operation over (operation time x link rate) is the fraction of the link
#     rate carried during the operation (wire bytes: Ethernet/IP/TCP headers included).
# Then, in every pass (MNIST=1), one epoch of the seed ConvNet (dtrain-mnist, 2 machines x 2 processes,
# batch 32 each, one thread) on hybrid and tcp, and the PyTorch peer (ddp_convnet.py,
# gloo) when torch is usable. The load average is recorded with every run.
# Rows go to build/bench/netns/rows.tsv; bench/netns_report.py prints the tables and
# the alpha-beta model. Namespaces, bridge and qdiscs are removed on exit (trap).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPEATS=${REPEATS:-3}
RATES=${RATES:-"1gbit 2500mbit"}
TOPOS=${TOPOS:-"2x2 4x1"}
MNIST=${MNIST:-1}
LIMIT=${LIMIT:-}
WARM=${WARM:-2}
ITERS=${ITERS:-8}
DELAY=${DELAY:-}
OUT=${OUT:-build/bench/netns}
NODES=4
P=nbx
PEER=${PEER:-$(cd .. && pwd)/shared/bench/peer}
PORT=29650

ns_host() { echo "$P-h$1"; }

RUNPIDS=()
teardown() {
    local i
    for i in "${RUNPIDS[@]}"; do pkill -TERM -P "$i" 2>/dev/null || true; done # the ranks
    for i in $(seq 0 $((NODES - 1))); do
        ip netns del "$(ns_host "$i")" 2>/dev/null || true # its veth end goes with it
        rm -rf "/etc/netns/$(ns_host "$i")"
    done
    ip netns del "$P-sw" 2>/dev/null || true # the bridge and the switch ends with it
}

shape() { # netns dev rate burst: tbf alone, or netem (DELAY) with tbf under it
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    if [ -n "$DELAY" ]; then
        tc -n "$1" qdisc add dev "$2" root handle 1: netem delay "$DELAY"
        tc -n "$1" qdisc add dev "$2" parent 1:1 handle 10: tbf rate "$3" burst "$4" latency 20ms
    else
        tc -n "$1" qdisc add dev "$2" root tbf rate "$3" burst "$4" latency 20ms
    fi
}

set_rate() { # rate: tbf on both ends of every link
    local rate=$1 i burst=100000
    # The bucket holds one whole 64 KiB GSO packet and little more (0.8 ms of a 1 Gbit/s
    # link): a larger one lets a few small all_reduces in a row pass at the veth's speed,
    # and the median over iterations then reports the burst, not the link.
    for i in $(seq 0 $((NODES - 1))); do
        if [ "$rate" = none ]; then # unshaped: the veths' own (CPU-bound) speed
            tc -n "$(ns_host "$i")" qdisc del dev "$P-e$i" root 2>/dev/null || true
            tc -n "$P-sw" qdisc del dev "$P-s$i" root 2>/dev/null || true
            continue
        fi
        shape "$(ns_host "$i")" "$P-e$i" "$rate" "$burst"
        shape "$P-sw" "$P-s$i" "$rate" "$burst"
    done
}

setup() {
    teardown
    [ "$(id -u)" = 0 ] || { echo "netns_scaling: needs root (ip netns)" >&2; exit 1; }
    ip netns add "$P-sw"
    if [ -n "$DELAY" ] && ! tc -n "$P-sw" qdisc add dev lo root netem delay 0ms 2>/dev/null; then
        echo "note: no netem qdisc in this kernel: DELAY=$DELAY not added" >&2
        DELAY=
    fi
    ip -n "$P-sw" link add "$P-br" type bridge
    ip -n "$P-sw" link set "$P-br" up
    local i h
    for i in $(seq 0 $((NODES - 1))); do
        h=$(ns_host "$i")
        ip netns add "$h"
        # `ip netns exec` mounts /etc/netns/NAME/hosts over /etc/hosts: every machine
        # resolves every machine's name, nothing on the real host changes.
        mkdir -p "/etc/netns/$h"
        {
            echo "127.0.0.1 localhost"
            for j in $(seq 0 $((NODES - 1))); do echo "10.201.0.$((j + 1)) ${P}node$j"; done
        } >"/etc/netns/$h/hosts"
        ip link add "$P-e$i" netns "$h" type veth peer name "$P-s$i" netns "$P-sw"
        ip -n "$h" addr add "10.201.0.$((i + 1))/24" dev "$P-e$i"
        ip -n "$h" link set lo up
        ip -n "$h" link set "$P-e$i" up
        ip -n "$P-sw" link set "$P-s$i" master "$P-br" up
    done
    set_rate "${RATES%% *}"
}

# node_exec I CMD...: CMD on machine I, in a UTS namespace named after it.
node_exec() {
    local i=$1
    shift
    ip netns exec "$(ns_host "$i")" unshare -u sh -c 'hostname "$0"; exec "$@"' "${P}node$i" "$@"
}

case "${1:-run}" in
setup)
    setup
    exit 0
    ;;
teardown)
    teardown
    exit 0
    ;;
exec)
    shift
    node_exec "$@"
    exit $?
    ;;
agent) # Open MPI's plm_rsh_agent: agent HOST COMMAND-STRING (as ssh would get it)
    host=$2
    shift 2
    node_exec "${host#"${P}"node}" sh -c "$*"
    exit $?
    ;;
run) ;;
*)
    sed -n '2,30p' "$0"
    exit 2
    ;;
esac

trap teardown EXIT
trap 'exit 130' INT TERM
mkdir -p "$OUT"
PASS0=${PASS0:-1}
[ "$PASS0" -gt 1 ] || : >"$OUT/rows.tsv"
ROWS=$ROOT/$OUT/rows.tsv
[ -x build/bin/dtrain-bench ] && [ -x build/bin/dtrain-mnist ] || make -j2 NODEPS=1 programs >/dev/null
HAVE_MPI=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c && HAVE_MPI=1
else
    echo "note: no mpicc/mpirun: Open MPI skipped"
fi
HAVE_TORCH=0
if /usr/bin/python3 -c "import torch" 2>/dev/null; then HAVE_TORCH=1
else echo "note: /usr/bin/python3 cannot import torch: Gloo and the PyTorch peer skipped"; fi
setup
HAVE_NETEM=0
if tc -n "$P-sw" qdisc add dev lo root netem delay 0ms 2>/dev/null; then
    HAVE_NETEM=1
    tc -n "$P-sw" qdisc del dev lo root 2>/dev/null || true
fi
if [ $HAVE_NETEM = 0 ]; then
    echo "note: no netem qdisc in this kernel: no delay added (links: tbf rate only)"
    DELAY=
fi
printf 'meta\tnetem\t%s\tdelay\t%s\tcpu\t%s\n' "$HAVE_NETEM" "${DELAY:-none}" \
    "$(lscpu | sed -n 's/^Model name: *//p')" >>"$ROWS"

load1() { cut -d' ' -f1 /proc/loadavg; }

# link_bytes: the tx bytes of every link end, "up0 down0 up1 down1 ..." (up: the
# machine's end, down: the switch's end towards the machine).
link_bytes() {
    local i s=""
    for i in $(seq 0 $((NODES - 1))); do
        s="$s $(ip netns exec "$(ns_host "$i")" cat "/sys/class/net/$P-e$i/statistics/tx_bytes")"
        s="$s $(ip netns exec "$P-sw" cat "/sys/class/net/$P-s$i/statistics/tx_bytes")"
    done
    echo "$s"
}

# launch TOOL H L MIN MAX ITERS WARMUP LOGBASE: one all_reduce run of H machines x L
# ranks; rank 0's table goes to LOGBASE.txt. Returns non-zero when a rank failed.
launch() {
    local tool=$1 H=$2 L=$3 min=$4 max=$5 iters=$6 warm=$7 log=$8
    local pids=() i l r rc=0 args
    PORT=$((PORT + 1))
    [ $PORT -gt 29900 ] && PORT=29651
    case $tool in
    hybrid | tcp)
        args=(--backend "$tool" --min "$min" --max "$max" --factor 4 --warmup "$warm")
        [ "$iters" != 0 ] && args+=(--iters "$iters")
        for i in $(seq 0 $((H - 1))); do
            for l in $(seq 0 $((L - 1))); do
                r=$((i * L + l))
                node_exec "$i" env RANK=$r WORLD_SIZE=$((H * L)) LOCAL_RANK=$l \
                    LOCAL_WORLD_SIZE=$L MASTER_ADDR=10.201.0.1 MASTER_PORT=$PORT \
                    DT_TIMEOUT_MS=120000 timeout 400 build/bin/dtrain-bench allreduce "${args[@]}" \
                    >"$log.r$r.out" 2>"$log.r$r.err" &
                pids+=($!)
            done
        done
        RUNPIDS=("${pids[@]}")
        ;;
    gloo)
        args=(--min "$min" --max "$max" --factor 4 --warmup "$warm" --iters "$iters")
        for i in $(seq 0 $((H - 1))); do
            for l in $(seq 0 $((L - 1))); do
                r=$((i * L + l))
                node_exec "$i" env RANK=$r WORLD_SIZE=$((H * L)) LOCAL_RANK=$l \
                    MASTER_ADDR=10.201.0.1 MASTER_PORT=$PORT GLOO_SOCKET_IFNAME=$P-e$i \
                    OMP_NUM_THREADS=1 timeout 400 /usr/bin/python3 bench/gloo_rank.py "${args[@]}" \
                    >"$log.r$r.out" 2>"$log.r$r.err" &
                pids+=($!)
            done
        done
        RUNPIDS=("${pids[@]}")
        ;;
    mpi)
        local hosts="$OUT/hostfile.$H"
        : >"$hosts"
        for i in $(seq 0 $((H - 1))); do echo "${P}node$i slots=$L" >>"$hosts"; done
        node_exec 0 timeout 400 mpirun --allow-run-as-root -np $((H * L)) --hostfile "$hosts" \
            --map-by "ppr:$L:node" --bind-to none --mca mpi_yield_when_idle 1 \
            --mca plm_rsh_agent "$ROOT/bench/netns_scaling.sh agent" \
            --mca oob_tcp_if_include 10.201.0.0/24 --mca btl tcp,vader,self \
            --mca btl_tcp_if_include 10.201.0.0/24 \
            "$ROOT/$OUT/mpi_allreduce" "$(numfmt --from=iec "$min")" \
            "$(numfmt --from=iec "$max")" "$iters" "$warm" 4 >"$log.r0.out" 2>"$log.r0.err" &
        pids+=($!)
        RUNPIDS=("${pids[@]}")
        ;;
    esac
    for r in "${pids[@]}"; do wait "$r" || rc=1; done
    cp "$log.r0.out" "$log.txt"
    return $rc
}

# Appends "ar rep topo rate tool size time_us load1 cpu_us" rows from a rank-0 table
# (cpu_us: CPU time of all ranks' processes per operation, when the tool prints it).
rows_from() {
    local rep=$1 topo=$2 rate=$3 tool=$4 load=$5 file=$6
    awk -v p="ar\t$rep\t$topo\t$rate\t$tool" -v l="$load" \
        '$1 ~ /^[0-9]+$/ && NF >= 7 {printf "%s\t%s\t%s\t%s\t%s\n", p, $1, $5, l, (NF >= 8 ? $8 : "")}' \
        "$file" >>"$ROWS"
}

tools_for() { # topo
    local t="tcp"
    [ "$1" = 2x2 ] && t="hybrid tcp"
    [ $HAVE_MPI = 1 ] && t="$t mpi"
    [ $HAVE_TORCH = 1 ] && t="$t gloo"
    echo "$t"
}

# One epoch of the seed ConvNet on 2 machines x 2 processes, per rate, interleaved.
mnist_run() { # tool rate run
    local tool=$1 rate=$2 run=$3 i pids=() base=$OUT/mnist.$1.$2.$3 l0
    local lim=()
    [ -n "$LIMIT" ] && lim=(--limit "$LIMIT")
    PORT=$((PORT + 1))
    l0=$(load1)
    for i in 0 1; do
        if [ "$tool" = peer ]; then
            node_exec $i env MASTER_ADDR=10.201.0.1 GLOO_SOCKET_IFNAME=$P-e$i timeout 600 \
                /usr/bin/python3 $PEER/ddp_convnet.py --num-machines 2 --machine-id $i \
                --num-processes 2 --batch-size 32 --threads 1 --port $PORT --no-test \
                >"$base.m$i.out" 2>&1 &
        else
            node_exec $i env DT_TIMEOUT_MS=300000 timeout 600 build/bin/dtrain-mnist --stats \
                --no-test --num-machines 2 --machine-id $i --num-processes 2 --batch-size 32 \
                --threads 1 --master-addr 10.201.0.1 --master-port $PORT --backend "$tool" \
                "${lim[@]}" >"$base.m$i.out" 2>&1 &
        fi
        pids+=($!)
    done
    RUNPIDS=("${pids[@]}")
    wait "${pids[0]}" || echo "   machine 0 of $tool failed: $(tail -1 "$base.m0.out")"
    wait "${pids[1]}" || [ "$tool" = peer ] || echo "   machine 1 of $tool failed"
    local secs
    secs=$(sed -n 's/^Finished training in \([0-9.]*\) secs.*/\1/p' "$base.m0.out" | tail -1)
    echo "== mnist $tool at $rate, run $run: ${secs:-?} s (load $l0)"
    [ -n "$secs" ] && printf 'mnist\t%s\t2x2\t%s\t%s\t%s\t%s\n' "$run" "$rate" "$tool" "$secs" \
        "$l0" >>"$ROWS"
    return 0
}
mtools="hybrid tcp"
[ $HAVE_TORCH = 1 ] && [ -f $PEER/ddp_convnet.py ] && [ -z "$LIMIT" ] && mtools="$mtools peer"
rep=$PASS0
while [ $rep -lt $((PASS0 + REPEATS)) ]; do
    for topo in $TOPOS; do
        H=${topo%x*} L=${topo#*x}
        for rate in $RATES; do
            set_rate "$rate"
            for tool in $(tools_for "$topo"); do
                base=$OUT/ar.$topo.$rate.$tool.$rep
                l0=$(load1)
                echo "== pass $rep: $topo at $rate, $tool (load $l0)"
                if launch "$tool" "$H" "$L" 4K 16M 0 5 "$base.sweep"; then
                    rows_from $rep "$topo" "$rate" "$tool" "$l0" "$base.sweep.txt"
                    tail -n +3 "$base.sweep.txt" | awk '{printf "   %10s B %10s us\n", $1, $5}'
                else
                    echo "   failed: $(tail -2 "$base.sweep.r0.err" | tr '\n' ' ')"
                fi
                l0=$(load1)
                b0=$(link_bytes)
                if launch "$tool" "$H" "$L" 64M 64M "$ITERS" "$WARM" "$base.big"; then
                    b1=$(link_bytes)
                    rows_from $rep "$topo" "$rate" "$tool" "$l0" "$base.big.txt"
                    ops=$((WARM + ITERS))
                    [ "$tool" = gloo ] && ops=$((ops + 1)) # its correctness check
                    t=$(awk '$1 ~ /^[0-9]+$/ {print $5}' "$base.big.txt")
                    printf 'link\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' $rep "$topo" "$rate" \
                        "$tool" "$t" "$ops" "$l0" "$b0" "$b1" >>"$ROWS"
                    echo "   64 MiB: $t us; link bytes $b0 -> $b1"
                else
                    echo "   64 MiB failed: $(tail -2 "$base.big.r0.err" | tr '\n' ' ')"
                fi
            done
        done
    done
    if [ "$MNIST" = 1 ]; then
        for rate in $RATES; do
            set_rate "$rate"
            for tool in $mtools; do mnist_run "$tool" "$rate" $rep; done
        done
    fi
    rep=$((rep + 1))
done

/usr/bin/python3 bench/netns_report.py "$ROWS"
