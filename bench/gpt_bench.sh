#!/bin/sh
# gpt_bench.sh: dtrain-gpt against the PyTorch peer gpt_bytes.py, interleaved (A, B, A,
# B, ...) so both see the same machine load. One line per run: the configuration, the
# STATS tokens_per_sec (whole loop), the tok/s of the last printed step line (steady
# state), peak RSS, the 1-minute load average, and the process CPU seconds.
#   bench/gpt_bench.sh [ROUNDS] [STEPS]      (defaults 3 rounds of 20 steps)
#   bench/gpt_bench.sh val [SEEDS]           (validation loss after the default 300
#       steps at one process, peer and dtrain interleaved per seed; default seeds 0 1 2;
#       env VAL_THREADS (default 2: the best settings) sets both programs' threads,
#       VAL_STEPS (default 300) the steps)
# Run from the repository root. Env: DTRAIN_GPT (default build/bin/dtrain-gpt), PEER
# (the folder of gpt_bytes.py, default ../shared/bench/peer), PEER_PYTHON (the peer's
# interpreter, default /usr/bin/python3; bench/peers.sh runs the newest PyTorch too).
set -u
ROUNDS=${1:-3}
STEPS=${2:-20}
BIN=${DTRAIN_GPT:-build/bin/dtrain-gpt}
PEER=${PEER:-../shared/bench/peer}            # from the repository root
PY=${PEER_PYTHON:-/usr/bin/python3}
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184
COMMON="--steps $STEPS --eval-every 0 --log-every 10"
one() { # name, command...
    name=$1; shift
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$( { /usr/bin/time -f "CPU %U %S" "$@" $COMMON; } 2>&1 )
    tps=$(echo "$out" | grep '^STATS' | head -1 | sed 's/.*"tokens_per_sec": \([0-9.]*\).*/\1/')
    last=$(echo "$out" | grep '| tok/s' | tail -1 | sed 's/.*tok\/s //')
    rss=$(echo "$out" | grep '^STATS' | sed 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/' | tr '\n' '+')
    cpu=$(echo "$out" | grep '^CPU' | tail -1)
    echo "$name | tok/s $tps | last $last | rss $rss | load $load | $cpu"
}
if [ "${1:-}" = val ]; then
    shift
    for seed in ${*:-0 1 2}; do
        for prog in peer dtrain; do
            if [ $prog = peer ]; then
                set -- $PY "$PEER/gpt_bytes.py" --undistributed --threads "${VAL_THREADS:-2}" --blas-threads 1
            else
                set -- "$BIN" --threads "${VAL_THREADS:-2}"
            fi
            out=$( { /usr/bin/time -f "CPU %U %S" "$@" --seed "$seed" --steps "${VAL_STEPS:-300}"; } 2>&1 )
            val=$(echo "$out" | grep '^val loss' | tail -1)
            fin=$(echo "$out" | grep '^Finished' | tail -1)
            rss=$(echo "$out" | grep '^STATS' | sed 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/')
            cpu=$(echo "$out" | grep '^CPU' | tail -1)
            echo "$prog seed $seed | $val | $fin | rss $rss | $cpu"
        done
    done
    exit 0
fi
for r in $(seq "$ROUNDS"); do
    one "peer-1p-t2" $PY "$PEER/gpt_bytes.py" --undistributed --threads 2 --blas-threads 1
    one "dtrain-1p-t2" "$BIN" --threads 2
    one "peer-2p-t1" $PY "$PEER/gpt_bytes.py" --num-processes 2 --threads 1
    one "dtrain-2p-t1" "$BIN" --num-processes 2 --threads 1
    one "dtrain-1p-t1" "$BIN" --threads 1
done
