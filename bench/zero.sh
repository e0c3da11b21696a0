#!/bin/sh
# zero.sh: ZeRO stages on dtrain-gpt, at 2 and 4 processes.
#
# Part 1, interleaved (for each round: every world size, every stage) so that every
# configuration sees the same machine load. One line per run: world, stage, the STATS
# loop seconds and tokens/s (rank 0), the steady tok/s of the last step line, the
# largest rank's parameters + gradients + optimizer state at their peak (`state`: the
# buffers' sizes, or under ZeRO-3 the resident pages measured during the steps, mincore)
# and its ratio to the whole state over the world size, the largest peak RSS, the
# collective payload per step per rank (`moved`), the 1-minute load average and the CPU
# seconds of the whole job; then the medians per world and stage.
#
# Part 2 (BUDGET=1, the default), the memory budget at each world size W: the budget is
# 1.2 x the whole state / W (the whole state read from plain DDP's refusal of a tiny
# budget); plain DDP and ZeRO-1 are refused at it (their messages printed), ZeRO-3 runs
# under it and its measured peak is printed with its ratio to the whole state / W.
#
#   bench/zero.sh [ROUNDS] [STEPS] [extra dtrain-gpt flags...]   (defaults 3 rounds, 10 steps)
#   bench/zero.sh 3 10                                             # the default GPT
#   STAGES="0 3" bench/zero.sh 1 2 --n-layer 8 --n-embd 512 --batch-size 8 --block-size 64
# Run from the repository root. Env: DTRAIN_GPT (default build/bin/dtrain-gpt), WORLDS
# (default "2 4"), STAGES (default "0 1 2 3"), BUDGET (default 1).
set -u
ROUNDS=${1:-3}
STEPS=${2:-10}
shift 2 2>/dev/null || shift $#
EXTRA="$*"
BIN=${DTRAIN_GPT:-build/bin/dtrain-gpt}
WORLDS=${WORLDS:-2 4}
STAGES=${STAGES:-0 1 2 3}
OUT=$(mktemp)
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184
field() { # name, text: the values of "name": in the STATS lines, one per line
    echo "$2" | grep '^STATS' | sed "s/.*\"$1\": \([0-9.]*\).*/\1/"
}
maxof() { sort -g | tail -1; }
# The whole state (parameters, gradients, Adam) of one rank of plain DDP, in MiB.
full=$("$BIN" --zero 0 --steps 1 --max-rank-memory 1K $EXTRA 2>&1 |
    sed -n 's/.*needs \([0-9.]*\) MiB per rank.*/\1/p' | head -1)
echo "whole state per rank (plain DDP): $full MiB; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
one() { # world stage [flags]
    w=$1 z=$2
    shift 2
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$( { /usr/bin/time -f "CPU %U %S" "$BIN" --num-processes "$w" --zero "$z" \
        --steps "$STEPS" --eval-every 0 --log-every 10 $EXTRA "$@"; } 2>&1 )
    loop=$(field loop_secs "$out" | head -1)
    tps=$(field tokens_per_sec "$out" | head -1)
    last=$(echo "$out" | grep '| tok/s' | tail -1 | sed 's/.*tok\/s //')
    state=$(field state_peak_mib "$out" | maxof)
    rss=$(field peak_rss_mib "$out" | maxof)
    moved=$(field moved_mib_per_step "$out" | maxof)
    cpu=$(echo "$out" | grep '^CPU' | tail -1 | awk '{print $2 + $3}')
    ratio=$(echo "$state $full $w" | awk '{ printf "%.3f", $1 / ($2 / $3) }')
    echo "world $w zero $z | loop_s $loop | tok/s $tps | last $last | state_mib $state" \
        "| x_full/N $ratio | rss_mib $rss | moved_mib $moved | load $load | cpu_s $cpu"
}
for r in $(seq "$ROUNDS"); do
    for w in $WORLDS; do
        for z in $STAGES; do one "$w" "$z" | tee -a "$OUT"; done
    done
done
echo "medians over $ROUNDS rounds:"
for w in $WORLDS; do
    for z in $STAGES; do
        grep "^world $w zero $z " "$OUT" | awk -v w="$w" -v z="$z" '
            { loop[NR] = $7; tps[NR] = $10; st[NR] = $16; x[NR] = $19; rss[NR] = $22
              mv[NR] = $25; cpu[NR] = $NF }
            function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
                if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
            END { printf "world %s zero %s | loop_s %.3f | tok/s %.0f | cpu_s %.2f | state_mib %.2f" \
                  " (x%.3f of full/N) | rss_mib %.1f | moved_mib/step %.2f\n", w, z, med(loop, NR),
                  med(tps, NR), med(cpu, NR), med(st, NR), med(x, NR), med(rss, NR), med(mv, NR) }'
    done
done
rm -f "$OUT"
[ "${BUDGET:-1}" = 1 ] || exit 0
echo "the budget: 1.2 x the whole state / world size"
for w in $WORLDS; do
    b=$(echo "$full $w" | awk '{ printf "%.2f", 1.2 * $1 / $2 }')
    for z in 0 1; do
        echo "world $w zero $z --max-rank-memory ${b}M: $("$BIN" --num-processes "$w" --zero "$z" \
            --steps 1 --max-rank-memory "${b}M" $EXTRA 2>&1 | grep -m1 'max-rank-memory' |
            sed 's/.*--max-rank-memory: //')"
    done
    one "$w" 3 --max-rank-memory "${b}M" | sed "s/^/budget ${b}M: /"
done
