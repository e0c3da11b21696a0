#!/bin/sh
# peers.sh: one workload, 1 process, dtrain against the PyTorch peer in each configuration
# at hand, interleaved (dtrain, peer 1, peer 2, ..., then again), medians and ratios
# against the FASTEST peer configuration (issue 22: the goals hold against it).
#
#   bench/peers.sh convnet|gpt|resnet [--runs N] [--peers "debian newest compiled"]
#   bench/peers.sh convnet|gpt|resnet --summary   (the table again, from the last run's
#                                                 build/bench/peers/WORKLOAD.tsv)
#
# Peer configurations (all with their README's best 1-process settings: --threads 2
# --blas-threads 1, the two MALLOC_ variables):
#   debian     Debian's /usr/bin/python3 and its PyTorch (python3-torch, 1.13)
#   newest     the newest PyTorch release, from the virtual environment of
#              bench/peer-venv.sh ($DT_PEER_VENV, default /work/venv-peer), eager
#   compiled   the same with the model under torch.compile (bench/peer_compile.py)
# A configuration whose interpreter or torch is missing is skipped with a note.
#
# Workloads: convnet = one epoch of the seed ConvNet, batch 128 (dtrain-mnist --stats,
# all cores; ddp_convnet.py --undistributed); gpt = STEPS (default 100) steps of the
# byte-level GPT, no intermediate evaluation (dtrain-gpt --threads 2; gpt_bytes.py);
# resnet = the ResNet on LIMIT (default 12000) images (dtrain-resnet --threads 2;
# resnet_fmnist.py). Each run: "Finished training" seconds (both programs print it; for
# ddp_convnet.py it includes start-up, for the others it is the training loop), wall and
# CPU seconds (user + sys) of the whole command, tokens/s (gpt), accuracy or val loss.
# Logs go to build/bench/peers/. The figures are only comparable within one run.
set -eu
cd "$(dirname "$0")/.."
work=${1:-}
[ $# -gt 0 ] && shift
runs=3 peers="debian newest compiled" summary=0
while [ $# -gt 0 ]; do
    case $1 in
    --summary) summary=1; shift ;;
    --runs) runs=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    *) work= ; break ;;
    esac
done
case $work in convnet | gpt | resnet) ;; *)
    echo "usage: $0 convnet|gpt|resnet [--runs N] [--peers \"debian newest compiled\"]" >&2
    exit 2 ;;
esac
peer=${DT_PEER_DIR:-../shared/bench/peer}
if [ ! -d "$peer" ] && common=$(git rev-parse --git-common-dir 2>/dev/null); then
    peer=$(cd "$common/../.." && pwd)/shared/bench/peer # from a worktree
fi
venv=${DT_PEER_VENV:-/work/venv-peer}
STEPS=${STEPS:-100} LIMIT=${LIMIT:-12000}
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184
best="--undistributed --threads 2 --blas-threads 1"
case $work in
convnet)
    dt="build/bin/dtrain-mnist --stats"
    script=$peer/ddp_convnet.py pargs="$best --batch-size 128" ;;
gpt)
    dt="build/bin/dtrain-gpt --threads 2 --steps $STEPS --eval-every 0 --log-every 10"
    script=$peer/gpt_bytes.py pargs="$best --steps $STEPS --eval-every 0 --log-every 10" ;;
resnet)
    dt="build/bin/dtrain-resnet --threads 2 --limit $LIMIT"
    script=$peer/resnet_fmnist.py pargs="$best --limit $LIMIT" ;;
esac
out=build/bench/peers
[ $summary = 1 ] || [ -x "${dt%% *}" ] || make -j2 NODEPS=1 programs >/dev/null

# the command of a configuration, or nothing when it cannot run here
cmd() {
    case $1 in
    dtrain) echo "$dt" ;;
    debian) /usr/bin/python3 -c "import torch" 2>/dev/null && echo "/usr/bin/python3 $script $pargs" ;;
    newest) "$venv/bin/python" -c "import torch" 2>/dev/null && echo "$venv/bin/python $script $pargs" ;;
    compiled) "$venv/bin/python" -c "import torch; torch.nn.Module.compile" 2>/dev/null &&
        echo "$venv/bin/python bench/peer_compile.py $script $pargs" ;;
    esac
}
configs=dtrain
[ $summary = 1 ] && peers= runs=$(grep -c '^dtrain' $out/$work.tsv)
for p in $peers; do
    if [ -n "$(cmd "$p" || true)" ]; then configs="$configs $p"; else echo "($p: cannot run here, skipped)"; fi
done
mkdir -p $out
[ $summary = 1 ] || rm -f $out/$work.*.log $out/$work.tsv
echo "$work: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '); configurations: $configs"
[ $summary = 1 ] && configs=
for r in $(seq "$runs"); do
    for c in $configs; do
        log=$out/$work.$c.$r.log
        load=$(cut -d' ' -f1 /proc/loadavg)
        # shellcheck disable=SC2046
        /usr/bin/time -f "TIME wall %e user %U sys %S" $(cmd $c) >"$log" 2>&1 || echo "($c run $r failed: $log)"
        fin=$(sed -n 's/^Finished training in \([0-9.]*\) secs.*/\1/p' "$log" | tail -1)
        wall=$(sed -n 's/^TIME wall \([0-9.]*\) .*/\1/p' "$log")
        cpu=$(sed -n 's/^TIME wall [0-9.]* user \([0-9.]*\) sys \([0-9.]*\)/\1 \2/p' "$log" | awk '{print $1 + $2}')
        tps=$(sed -n 's/.*"tokens_per_sec": \([0-9.]*\).*/\1/p' "$log" | head -1)
        q=$(sed -n 's/^val loss: \([0-9.]*\).*/\1/p; s/^Test accuracy: \([0-9.]*\)%.*/\1/p; s/^Test set:.*(\([0-9.]*\)%)$/\1/p' "$log" | tail -1)
        ver=$(sed -n 's/.*"torch": "\([^"]*\)".*/\1/p' "$log" | tail -1)
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "${fin:-nan}" "${wall:-nan}" "${cpu:-nan}" "${tps:--}" "${q:--}" "${ver:-}" >>$out/$work.tsv
        echo "run $r $c: finished ${fin:-?} s, wall ${wall:-?} s, cpu ${cpu:-?} s, tok/s ${tps:--}, quality ${q:--}, load $load ${ver:+(torch $ver)}"
    done
done
echo
echo "$work, medians of $runs interleaved runs (quality: accuracy % or val loss)"
awk -F'\t' '
function med(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j] + 0 < a[j-1] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } f[$1] = f[$1] " " $2; w[$1] = w[$1] " " $3; u[$1] = u[$1] " " $4; t[$1] = t[$1] " " $5; q[$1] = q[$1] " " $6; v[$1] = $7 }
END {
    printf "%-10s %11s %9s %9s %10s %8s %s\n", "config", "finished_s", "wall_s", "cpu_s", "tok/s", "quality", "torch"
    fast = ""
    for (i = 1; i <= k; i++) { c = order[i]; m[c] = med(f[c])
        printf "%-10s %11.2f %9.2f %9.2f %10s %8s %s\n", c, m[c], med(w[c]), med(u[c]), (t[c] ~ /[0-9]/ ? med(t[c]) : "-"), (q[c] ~ /[0-9]/ ? med(q[c]) : "-"), v[c]
        if (c != "dtrain" && (fast == "" || m[c] < m[fast])) fast = c }
    for (i = 1; i <= k; i++) { c = order[i]; if (c != "dtrain") printf "dtrain / %-8s = %.2fx (time)\n", c, m["dtrain"] / m[c] }
    if (fast != "") printf "fastest peer: %s; dtrain / fastest = %.2fx\n", fast, m["dtrain"] / m[fast]
}' $out/$work.tsv
