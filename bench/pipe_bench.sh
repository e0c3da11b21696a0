#!/bin/sh
# pipe_bench.sh: a 2-stage pipeline (GPipe, 1F1B) against 2-way data parallelism and one
# process, on this machine, one thread per rank; ROUNDS interleaved rounds (each layout
# once per round), so load from other jobs hits every layout alike. Usage:
#   [MODES="gpipe 1f1b dp tp one"] bench/pipe_bench.sh [ROUNDS] [M]
set -e
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
M=${2:-4}
make -s NODEPS=1 lib >/dev/null
mkdir -p build/bench
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Werror -Wno-psabi -Iinclude -Isrc bench/pipe_bench.c \
    build/release/lib/libdtrain.a -lopenblas -ldeflate -lz -lm -lpthread \
    $(mpicc --showme:link 2>/dev/null || true) -o build/bench/pipe_bench
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
echo "# $ROUNDS rounds, M=$M micro-batches; each line: the median of 12 steps"
export OPENBLAS_NUM_THREADS=1
for r in $(seq "$ROUNDS"); do
    for mode in ${MODES:-gpipe 1f1b dp one}; do
        build/bench/pipe_bench $mode "$M"
    done
done
