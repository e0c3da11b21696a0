#!/bin/sh
# resnet_bench.sh: dtrain-resnet against the PyTorch peer resnet_fmnist.py, interleaved
# (for each seed, every configuration once, in turn), on the first LIMIT training images
# (default 12000, one fifth of the epoch, as the peer README's own figures) or the whole
# epoch (LIMIT=0).
#
#   bench/resnet_bench.sh                   # seeds 0 1 2, LIMIT=12000
#   SEEDS="0 1 2 3 4" LIMIT=0 bench/resnet_bench.sh
#
# Configurations: dtrain 1 process x 2 threads, dtrain 2 processes x 1 thread, the peer's
# best single process (--undistributed --threads 2 --blas-threads 1 with the two MALLOC_
# variables of its README), the peer's 2 processes x 1 thread. Each run: the
# "Finished training" figure (training loop only, both programs), the wall time and the
# CPU time (user + sys) of the whole command from /usr/bin/time, its peak RSS (the
# largest process of the tree: wait4's ru_maxrss), and the test accuracy. Prints one
# line per run, then per configuration the medians and the mean accuracy over seeds,
# and the ratios dtrain / peer (time: < 1 means dtrain is faster).
#
# Then (PROFILE=0 skips it) the ceiling and where dtrain's time goes: this machine's fp32
# FMA peak (bench/fp32_peak.c: 24 independent 512-bit FMA chains per thread, best of 15
# runs by thread CPU time) on 1 and 2 threads, and one `--profile` run of dtrain-resnet
# at 1 process x 1 thread and at 1 x 2 threads (seed 0): time per node and per kind of
# layer, the convolutions' GFLOP/s (the operations they do, Winograd's transforms not
# counted as saved work: 2 x the direct convolution's multiply-adds) against that peak.
set -eu
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"0 1 2"}
LIMIT=${LIMIT:-12000}
PY=${PEER_PYTHON:-/usr/bin/python3} # the peer's interpreter (bench/peers.sh: the newest PyTorch)
PEER=${PEER:-../shared/bench/peer/resnet_fmnist.py}
if [ ! -f "$PEER" ] && common=$(git rev-parse --git-common-dir 2>/dev/null); then
    PEER=$(cd "$common/../.." && pwd)/shared/bench/peer/resnet_fmnist.py # from a worktree
fi
[ -f "$PEER" ] || {
    echo "resnet_bench.sh: expected the peer at $PEER (set PEER=.../resnet_fmnist.py)" >&2
    exit 1
}
OUT=build/bench/resnet
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/runs.tsv
[ -x build/bin/dtrain-resnet ] || make -j2 NODEPS=1 programs >/dev/null
LIM=""
[ "$LIMIT" -gt 0 ] && LIM="--limit $LIMIT"

run() { # config seed command...
    cfg=$1 seed=$2
    shift 2
    log="$OUT/$cfg-$seed.log"
    echo "== $cfg seed $seed: $*" >&2
    /usr/bin/time -f "TIME wall %e user %U sys %S maxrss_kib %M" "$@" >"$log" 2>&1 || {
        echo "failed: see $log" >&2
        exit 1
    }
    awk -v cfg="$cfg" -v seed="$seed" '
        /Finished training in/ { for (i = 1; i <= NF; i++) if ($i == "in") loop = $(i + 1) }
        /^Test set:/ { acc = $NF; gsub(/[()%]/, "", acc) }
        /^TIME/ { wall = $3; cpu = $5 + $7; rss = $9 / 1024 }
        END { printf "%s\t%s\t%.2f\t%.2f\t%.2f\t%.0f\t%s\n", cfg, seed, loop, wall, cpu, rss, acc }
    ' "$log" | tee -a "$OUT/runs.tsv"
}

echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%dT%H:%MZ)"
printf "config\tseed\tloop_s\twall_s\tcpu_s\tpeak_rss_mib\ttest_acc\n"
for s in $SEEDS; do
    run dtrain-1x2 "$s" build/bin/dtrain-resnet $LIM --seed "$s" --threads 2
    run peer-1x2 "$s" env MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 \
        $PY "$PEER" --undistributed --threads 2 --blas-threads 1 $LIM --seed "$s"
    run dtrain-2x1 "$s" build/bin/dtrain-resnet $LIM --seed "$s" --threads 1 --num-processes 2
    run peer-2x1 "$s" $PY "$PEER" --num-processes 2 --threads 1 $LIM --seed "$s"
done

echo
printf "config\tmedian_loop_s\tmedian_wall_s\tmedian_cpu_s\tmedian_rss_mib\tmean_acc\n"
awk -F'\t' '
    function median(s,   a, n, i, j, t) {
        n = split(s, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { L[$1] = L[$1] " " $3; W[$1] = W[$1] " " $4; C[$1] = C[$1] " " $5; R[$1] = R[$1] " " $6
      A[$1] += $7; N[$1]++; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
    END {
        for (i = 1; i <= k; i++) {
            c = order[i]
            ml[c] = median(L[c]); mw[c] = median(W[c]); mc[c] = median(C[c]); mr[c] = median(R[c])
            printf "%s\t%.2f\t%.2f\t%.2f\t%.0f\t%.2f\n", c, ml[c], mw[c], mc[c], mr[c], A[c] / N[c]
        }
        print ""
        split("1x2 2x1", cf, " ")
        for (i = 1; i <= 2; i++) {
            d = "dtrain-" cf[i]; p = "peer-" cf[i]
            if (!(d in ml) || !(p in ml)) continue
            printf "%s dtrain/peer: loop %.2fx, wall %.2fx, cpu %.2fx, rss %.2fx, accuracy %+.2f points\n",
                cf[i], ml[d] / ml[p], mw[d] / mw[p], mc[d] / mc[p], mr[d] / mr[p], A[d] / N[d] - A[p] / N[p]
        }
    }' "$OUT/runs.tsv"

[ "${PROFILE:-1}" = 0 ] && exit 0
echo
cc -O2 -std=c11 -pthread bench/fp32_peak.c -o build/bench/fp32_peak
build/bin/dtrain-resnet --help >/dev/null # built above
peak1=$(build/bench/fp32_peak 1 | tee /dev/stderr | awk '{print $4}')
build/bench/fp32_peak 2 >&2
for th in 1 2; do
    echo
    echo "== dtrain-resnet $LIM --threads $th --profile --no-test (peak $peak1 GFLOP/s per thread)"
    build/bin/dtrain-resnet $LIM --seed 0 --threads "$th" --profile --no-test 2>&1 |
        sed -n '/^Finished/,$p' | awk -v peak="$peak1" -v th="$th" '
            { print }
            $1 == "conv2d" && NF >= 6 {
                printf "  conv2d: forward %.1f%%, backward %.1f%% of the %d-thread peak (%.0f GFLOP/s)\n",
                    100 * $5 / (peak * th), 100 * $6 / (peak * th), th, peak * th
            }'
done
