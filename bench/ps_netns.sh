#!/bin/bash
# ps_netns.sh: the parameter server (--ps N, --ps-staleness K; docs/ps.md) against
# all-reduce on 2 namespace machines x 2 processes at 1 Gbit/s (issue 26, "Measure").
# The machines, the switch and the shaped links are bench/netns_scaling.sh's (its
# `setup`, `exec` and `teardown`: namespaces nbx-h0/nbx-h1 on the bridge of nbx-sw,
# 10.201.0.1-2, tc tbf at RATE on both ends of each link). On each machine one
#   dtrun --nnodes 2 --node-rank I --nproc-per-node L build/bin/dtrain-mnist --backend tcp
#         --ps N --ps-staleness K --batch-size GLOBAL/W --limit LIMIT ...
# so ranks 0..L-1 run on machine 0, L..2L-1 on machine 1, and the last N ranks (machine
# 1's) are the servers, the others W = 2L - N workers. Layouts, interleaved per round
# (ar, ps1-k0, ps1-k1, ..., ar, ps1-k0, ...):
#   ar           L=2, 4 workers, all-reduce (no --ps); the default --invariant's fixed
#                tree order, which on tcp runs recursive doubling (whole vectors)
#   arring       the same with --invariant 0: the ring (reduce-scatter + all-gather)
#   ps1-kK       L=2, 3 workers + 1 server (rank 3, machine 1)
#   ps2-kK       L=2, 2 workers (machine 0) + 2 servers (machine 1)
#   ps2x-kK      L=3, 4 workers (3 on machine 0, 1 on machine 1) + 2 servers (machine 1)
# for K in STALENESS (0: synchronous). The global batch is the same in every layout
# (GLOBAL, default 96 = 4 x 24 = 3 x 32 = 2 x 48), so every run has LIMIT / GLOBAL
# steps and the same samples. Per run: rank 0's STATS line (samples/s of the training
# loop, the workers' wait in the reduction), wall and CPU time (user + sys of each
# machine's dtrun and everything under it), the load average, and the tx bytes of both
# ends of each machine's link (/sys/class/net/*/statistics) before and after: the
# bytes that crossed between the machines (start-up and the end included; traffic
# between two ranks of one machine stays on its loopback and is not counted).
#
#   bench/ps_netns.sh                          # ROUNDS=3, every layout, K in 0 1 4
#   ROUNDS=1 LAYOUTS="ar ps2" STALENESS=0 bench/ps_netns.sh
#   bench/ps_netns.sh report                   # the table of the rows already there
#
# Needs root (ip netns). Rows go to build/bench/ps_netns/rows.tsv; each run's output
# to build/bench/ps_netns/<layout>.<round>.m<I>.out. Namespaces removed on exit (trap).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
LAYOUTS=${LAYOUTS:-"ar ps1 ps2 ps2x"}
STALENESS=${STALENESS:-"0 1 4"}
RATE=${RATE:-1gbit}
GLOBAL=${GLOBAL:-96}
LIMIT=${LIMIT:-9600}
SHORT=${SHORT:-960}
OUT=${OUT:-build/bench/ps_netns}
NETNS=bench/netns_scaling.sh
PORT=${PORT:-29710}
ROWS=$OUT/rows.tsv

# The table: medians over the "run" rows; bytes per step as the difference between the
# run and the "short" run of the same layout over the difference of their steps (what a
# step moves, without the start-up), and per rank over all processes, servers included.
report() {
    /usr/bin/python3 - "$ROWS" <<'EOF'
import statistics as st, sys
from collections import defaultdict
# tag round layout W N K steps sps wait wall user sys load up0 down0 up1 down1
runs, short, order = defaultdict(list), {}, []
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "short":
        short[f[2]] = f
    elif f[0] == "run":
        if f[2] not in order:
            order.append(f[2])
        runs[f[2]].append(f)
def per_step(r, s, i):  # bytes of column i a step moves (MB), and outside the steps
    b, n = st.median(float(x[i]) for x in r), float(r[0][6])
    if s is None:
        return b / n / 1e6, 0.0
    m = (b - float(s[i])) / (n - float(s[6]))
    return m / 1e6, (float(s[i]) - m * float(s[6])) / 1e6
print("| layout | workers + servers | samples/s median (range) | reduction wait s | wall s "
      "| CPU s user+sys | MB/step/rank | machine 0 out, in (MB/step) | outside steps (MB) | load |")
print("|---|---|---:|---:|---:|---:|---:|---|---:|---|")
for key in order:
    r, s = runs[key], short.get(key)
    c = lambda i: [float(x[i]) for x in r]
    sps, cpu, load = c(7), [u + v for u, v in zip(c(10), c(11))], c(12)
    procs = int(r[0][3]) + int(r[0][4])
    up0, fix0 = per_step(r, s, 13)
    dn0, _ = per_step(r, s, 14)
    up1, fix1 = per_step(r, s, 15)
    print(f"| {key} | {r[0][3]} + {r[0][4]} | {st.median(sps):.0f} ({min(sps):.0f}-{max(sps):.0f}) "
          f"| {st.median(c(8)):.2f} | {st.median(c(9)):.1f} | {st.median(cpu):.1f} "
          f"| {(up0 + up1) / procs:.2f} | {up0:.2f}, {dn0:.2f} | {fix0 + fix1:.1f} "
          f"| {min(load):.1f}-{max(load):.1f} |")
n = len(runs[order[0]]) if order else 0
print(f"({n} rounds, {int(float(runs[order[0]][0][6])) if order else 0} steps a run; "
      "MB = 1e6 bytes on the wire, headers included; MB/step/rank: both machines' "
      "outgoing bytes a step over all processes)")
EOF
}

if [ "${1:-run}" = report ]; then
    report
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "ps_netns: needs root (ip netns)" >&2; exit 1; }
if ip netns list | grep -q '^nbx-'; then
    echo "ps_netns: namespaces nbx-* exist (another netns_scaling.sh or ps_netns.sh running?)" >&2
    exit 1
fi
if [ ! -x build/bin/dtrun ] || [ ! -x build/bin/dtrain-mnist ]; then make -j2 NODEPS=1 programs >/dev/null; fi
mkdir -p "$OUT"
: >"$ROWS"
trap '$NETNS teardown' EXIT
trap 'exit 130' INT TERM
RATES=$RATE $NETNS setup
printf 'meta\tcpu\t%s\trate\t%s\tglobal\t%s\tlimit\t%s\n' \
    "$(lscpu | sed -n 's/^Model name: *//p') family $(sed -n 's/^cpu family\t: //p;' /proc/cpuinfo | head -1) model $(sed -n 's/^model\t\t: //p' /proc/cpuinfo | head -1)" \
    "$RATE" "$GLOBAL" "$LIMIT" >>"$ROWS"

# The tx bytes of machine I's end and of the switch's end towards it: "up down".
link_bytes() {
    local i=$1
    echo "$(ip netns exec nbx-h"$i" cat /sys/class/net/nbx-e"$i"/statistics/tx_bytes)" \
        "$(ip netns exec nbx-sw cat /sys/class/net/nbx-s"$i"/statistics/tx_bytes)"
}

# run_one LAYOUT K ROUND [LIMIT TAG]: both machines' dtrun, timed; appends a TAG row
# ("run" by default; "short" for the runs of SHORT samples that measure the bytes a
# run moves outside its steps).
run_one() {
    local layout=$1 k=$2 round=$3 limit=${4:-$LIMIT} tag=${5:-run} L=2 N=0 i pids=() name base
    local extra=()
    case $layout in
    ar) ;;
    arring) extra=(--invariant 0) ;;
    ps1) N=1 ;;
    ps2) N=2 ;;
    ps2x) L=3 N=2 ;;
    esac
    local W=$((2 * L - N)) ps=()
    [ "$N" -gt 0 ] && ps=(--ps "$N" --ps-staleness "$k")
    name=$layout
    [ "$N" -gt 0 ] && name=$layout-k$k
    base=$OUT/$name.$round
    PORT=$((PORT + 1))
    local load b0 b1
    load=$(cut -d' ' -f1 /proc/loadavg)
    b0="$(link_bytes 0) $(link_bytes 1)"
    for i in 0 1; do
        /usr/bin/time -f "%e %U %S" -o "$base.m$i.time" \
            $NETNS exec $i timeout 150 build/bin/dtrun --nnodes 2 --node-rank $i \
            --master-addr 10.201.0.1 --master-port $PORT --nproc-per-node $L \
            build/bin/dtrain-mnist --backend tcp --threads 1 --no-test --stats \
            --log-every 1000 --batch-size $((GLOBAL / W)) --limit "$limit" "${ps[@]}" "${extra[@]}" \
            >"$base.m$i.out" 2>&1 &
        pids+=($!)
    done
    local rc=0
    wait "${pids[0]}" || rc=1
    wait "${pids[1]}" || rc=1
    b1="$(link_bytes 0) $(link_bytes 1)"
    local stats
    stats=$(sed -n 's/^.*STATS //p' "$base.m0.out" | tail -1)
    if [ $rc != 0 ] || [ -z "$stats" ]; then
        echo "== $name round $round FAILED (load $load): $(tail -2 "$base.m0.out" | tr '\n' ' ')"
        return 0
    fi
    local sps wsec steps wall user sys u0 u1 s0 s1
    sps=$(echo "$stats" | sed -n 's/.*"samples_per_sec": \([0-9.]*\).*/\1/p')
    wsec=$(echo "$stats" | sed -n 's/.*"ddp_wait_secs": \([0-9.]*\).*/\1/p')
    steps=$(((limit + GLOBAL - 1) / GLOBAL))
    read -r wall u0 s0 <"$base.m0.time"
    read -r _ u1 s1 <"$base.m1.time"
    user=$(echo "$u0 + $u1" | bc)
    sys=$(echo "$s0 + $s1" | bc)
    # shellcheck disable=SC2086 # b0 and b1: four numbers each
    set -- $b0 $b1
    local d=("$(($5 - $1))" "$(($6 - $2))" "$(($7 - $3))" "$(($8 - $4))")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$round" \
        "$name" "$W" "$N" "$k" "$steps" "$sps" "$wsec" "$wall" "$user" "$sys" "$load" \
        "${d[0]}" "${d[1]}" "${d[2]}" "${d[3]}" >>"$ROWS"
    echo "== $name $tag $round: $sps samples/s, wait $wsec s, wall $wall s, CPU $user+$sys s," \
        "machine 0 out/in ${d[0]}/${d[1]} B, machine 1 out/in ${d[2]}/${d[3]} B (load $load)"
}

each_layout() { # ROUND [LIMIT TAG]
    local layout k
    for layout in $LAYOUTS; do
        if [ "${layout#ar}" != "$layout" ]; then
            run_one "$layout" 0 "$@"
        else
            for k in $STALENESS; do run_one "$layout" "$k" "$@"; done
        fi
    done
}
each_layout 0 "$SHORT" short # the bytes outside the steps (start-up, the end)
for round in $(seq 1 "$ROUNDS"); do each_layout "$round"; done
report
