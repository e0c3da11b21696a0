#!/bin/sh
# cpu_ab.sh: commands run in turn (A, B, C, A, B, C, ...) for ROUNDS rounds, each timed
# by CPU time as well as wall time, for machines whose load swings: on a shared 2-vCPU
# host the wall time of a run mostly measures how long it waited for a core, while its
# CPU time (user + system of the whole process tree, workers included) is the work it
# did. Per run one line; then per command the medians and the ratios to the first.
#
#   ROUNDS=3 bench/cpu_ab.sh 'name=command ...' 'name=command ...' ...
#
# Per run: wall s, CPU s (user + sys), peak RSS of the largest process (MiB), the load
# average before it (1 minute), the program's own loop time ("Finished training in"),
# its test accuracy (the last "accuracy" or "Test set" figure, %), and tokens/s (STATS
# tokens_per_sec, the GPT's). Logs in build/bench/ab/NAME-ROUND.log.
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-build/bench/ab}
mkdir -p "$OUT"
rm -f "$OUT"/runs.tsv
[ $# -ge 1 ] || {
    echo "usage: ROUNDS=N $0 'name=command' ..." >&2
    exit 2
}
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; $(date -u +%Y-%m-%dT%H:%MZ)"
printf "name\tround\tload\twall_s\tcpu_s\trss_mib\tloop_s\tacc\ttok_s\n"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for spec in "$@"; do
        name=${spec%%=*} cmd=${spec#*=}
        log="$OUT/$name-$r.log"
        load=$(cut -d' ' -f1 /proc/loadavg)
        # shellcheck disable=SC2086 # the command is split into words on purpose
        /usr/bin/time -f "TIME wall %e user %U sys %S maxrss_kib %M" sh -c "$cmd" >"$log" 2>&1 || {
            echo "failed ($name): see $log" >&2
            exit 1
        }
        awk -v name="$name" -v r="$r" -v load="$load" '
            /Finished training in/ { for (i = 1; i <= NF; i++) if ($i == "in") loop = $(i + 1) }
            /^Test set:/ { acc = $NF; gsub(/[()%]/, "", acc) }
            /^Test accuracy:/ { acc = $3; gsub(/%/, "", acc) }
            /"tokens_per_sec":/ { t = $0; sub(/.*"tokens_per_sec": */, "", t); sub(/[,}].*/, "", t); tok = t }
            /^TIME/ { wall = $3; cpu = $5 + $7; rss = $9 / 1024 }
            END { printf "%s\t%s\t%s\t%.2f\t%.2f\t%.0f\t%s\t%s\t%s\n", name, r, load, wall, cpu, rss,
                         loop == "" ? "-" : loop, acc == "" ? "-" : acc, tok == "" ? "-" : tok }
        ' "$log" | tee -a "$OUT/runs.tsv"
    done
    r=$((r + 1))
done
echo
printf "name\tmedian_wall_s\tmedian_cpu_s\tmedian_rss_mib\tmedian_loop_s\tmedian_tok_s\tmean_acc\tloads\tcpu/first\n"
awk -F'\t' '
    function median(s,   a, n, i, j, t) {
        n = split(s, a, " ")
        if (n == 0 || a[1] == "-") return "-"
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { W[$1] = W[$1] " " $4; C[$1] = C[$1] " " $5; R[$1] = R[$1] " " $6; L[$1] = L[$1] " " $7
      T[$1] = T[$1] " " $9; LD[$1] = LD[$1] " " $3
      if ($8 != "-") { A[$1] += $8; NA[$1]++ }
      if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
    END {
        for (i = 1; i <= k; i++) {
            c = order[i]; mc = median(C[c])
            if (i == 1) first = mc
            printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\n", c, median(W[c]), mc, median(R[c]),
                   median(L[c]), median(T[c]), NA[c] ? sprintf("%.2f", A[c] / NA[c]) : "-",
                   LD[c], mc / first
        }
    }' "$OUT/runs.tsv"
