#!/bin/sh
# gemm16.sh: builds and runs bench/gemm16.c (the bf16 GEMM against the VDPBF16PS peak and
# OpenBLAS sgemm, one thread). Usage: bench/gemm16.sh [--reps N]
set -e
cd "$(dirname "$0")/.."
make -s NODEPS=1 lib >/dev/null
mkdir -p build/bench
cc -O2 -std=c11 -Wall -Werror -Wno-psabi -D_GNU_SOURCE -Iinclude -Isrc bench/gemm16.c build/release/lib/libdtrain.a \
    -lopenblas -lm -lpthread -o build/bench/gemm16
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
exec build/bench/gemm16 "$@"
