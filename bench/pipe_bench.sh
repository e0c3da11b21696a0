#!/bin/sh
# pipe_bench.sh: a 2-stage pipeline (GPipe, 1F1B; the cut fixed after two blocks, and
# balanced by measured layer cost) against 2-way data and tensor parallelism and one
# process, on this machine, one thread per rank; ROUNDS interleaved rounds (each layout
# once per round), so load from other jobs hits every layout alike. Usage:
#   [MODES="gpipe 1f1b dp tp one"] [MS="4 8"] [CUTS="h.1.out auto"] [VOCABS="256 2048"]
#   bench/pipe_bench.sh [ROUNDS]     then: bench/pipe_summary.py < the output.
# The pipelines run with the model's 256-byte head and with a 2048-wide one (a real
# tokenizer's head outweighs a block here: what the balanced cut moves; 1F1B only).
set -e
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
make -s NODEPS=1 lib >/dev/null
mkdir -p build/bench
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Werror -Wno-psabi -Iinclude -Isrc bench/pipe_bench.c \
    build/release/lib/libdtrain.a -lopenblas -ldeflate -lz -lm -lpthread \
    $(mpicc --showme:link 2>/dev/null || true) -o build/bench/pipe_bench
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
echo "# $(date -u +%F) load: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds; each line: the median of 12 steps"
export OPENBLAS_NUM_THREADS=1
for r in $(seq "$ROUNDS"); do
    for mode in ${MODES:-gpipe 1f1b dp tp one}; do
        case $mode in
        gpipe | 1f1b)
            for v in ${VOCABS:-256 2048}; do
                [ "$v" != 256 ] && [ "$mode" = gpipe ] && continue
                for m in ${MS:-4 8}; do
                    for cut in ${CUTS:-h.1.out auto}; do
                        build/bench/pipe_bench "$mode" "$m" "$cut" "$v"
                    done
                done
            done
            ;;
        *) build/bench/pipe_bench "$mode" ;;
        esac
    done
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
