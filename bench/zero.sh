#!/bin/sh
# zero.sh: ZeRO stages 0 (plain DDP), 1 and 2 on dtrain-gpt at 2 processes, interleaved
# (0, 1, 2, 0, 1, 2, ...) so every stage sees the same machine load. One line per run:
# the stage, the STATS loop seconds and tokens/s (rank 0), the steady tok/s of the last
# step line, the optimizer state per rank that dtrain-gpt prints, peak RSS of each rank,
# the 1-minute load average and the CPU seconds (user, system) of the whole job; then
# the medians per stage.
#   bench/zero.sh [ROUNDS] [STEPS] [extra dtrain-gpt flags...]   (defaults 5 rounds, 30 steps)
# Run from the repository root. Env: DTRAIN_GPT (default build/bin/dtrain-gpt).
set -u
ROUNDS=${1:-5}
STEPS=${2:-30}
shift 2 2>/dev/null || shift $#
EXTRA="$*"
BIN=${DTRAIN_GPT:-build/bin/dtrain-gpt}
OUT=$(mktemp)
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184
one() { # stage
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$( { /usr/bin/time -f "CPU %U %S" "$BIN" --num-processes 2 --zero "$1" --steps "$STEPS" \
        --eval-every 0 --log-every 10 $EXTRA; } 2>&1 )
    loop=$(echo "$out" | grep '^STATS' | head -1 | sed 's/.*"loop_secs": \([0-9.]*\).*/\1/')
    tps=$(echo "$out" | grep '^STATS' | head -1 | sed 's/.*"tokens_per_sec": \([0-9.]*\).*/\1/')
    last=$(echo "$out" | grep '| tok/s' | tail -1 | sed 's/.*tok\/s //')
    state=$(echo "$out" | grep '^optimizer state' | sed 's/optimizer state: \([0-9.]*\) MiB.*/\1/')
    rss=$(echo "$out" | grep '^STATS' | sed 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/' | tr '\n' ' ')
    cpu=$(echo "$out" | grep '^CPU' | tail -1 | awk '{print $2 + $3}')
    echo "zero $1 | loop_s $loop | tok/s $tps | last $last | state_mib $state | rss $rss| load $load | cpu_s $cpu" |
        tee -a "$OUT"
}
for r in $(seq "$ROUNDS"); do
    for z in 0 1 2; do one "$z"; done
done
echo "medians over $ROUNDS rounds:"
for z in 0 1 2; do
    grep "^zero $z " "$OUT" | awk -v z="$z" '
        { loop[NR] = $5; tps[NR] = $8; cpu[NR] = $NF; state = $14
          rss[NR] = $17 > $18 ? $17 : $18 }
        function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
            if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        END { printf "zero %s | loop_s %.3f | tok/s %.0f | cpu_s %.2f | peak_rss_mib %.1f | state_mib %s\n",
              z, med(loop, NR), med(tps, NR), med(cpu, NR), med(rss, NR), state }'
done
rm -f "$OUT"
