#!/bin/sh
# mesh_bench.sh: dtrain-gpt (its default model: 4 layers, C 128, T 128, global batch 32)
# on 2 processes of this machine as 2-way data, pipeline and tensor parallelism (one
# thread per rank), and in one process (1 thread), ROUNDS interleaved rounds; each run
# STEPS steps, no evaluation. Prints the runs, then medians (bench/mesh_summary.py):
# tokens/s (the program's STATS: the training loop), CPU seconds of the run (all ranks)
# and the median per-round ratio to dp. Usage:
#   [LAYOUTS="dp pp tp one"] [STEPS=12] bench/mesh_bench.sh [ROUNDS]
set -e
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
STEPS=${STEPS:-12}
make -s NODEPS=1 programs >/dev/null
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
echo "# $(date -u +%F) load: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of $STEPS steps"
export OPENBLAS_NUM_THREADS=1
G="build/bin/dtrain-gpt --steps $STEPS --eval-every 0 --threads 1 --log-every 1000"
for r in $(seq "$ROUNDS"); do
    for l in ${LAYOUTS:-dp pp tp one}; do
        case $l in
        dp) args="--num-processes 2" ;;
        pp) args="--num-processes 2 --pp 2 --micro-batches 8" ;;
        tp) args="--num-processes 2 --tp 2" ;;
        one) args="" ;;
        esac
        out=$(/usr/bin/time -f "CPU %U %S" $G $args 2>&1)
        tok=$(echo "$out" | sed -n 's/.*"rank": 0.*"tokens_per_sec": \([0-9.]*\).*/\1/p')
        cpu=$(echo "$out" | sed -n 's/^CPU \([0-9.]*\) \([0-9.]*\)$/\1 \2/p' | awk '{print $1 + $2}')
        echo "$l round $r: tokens/s $tok cpu_s $cpu"
    done
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
