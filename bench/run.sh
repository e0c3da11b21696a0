#!/bin/sh
# make bench: every benchmark in turn. The machine is shared and noisy: each script
# interleaves its contenders and reports medians (RUNS, default 3).
set -eu
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
echo "== training, 1 process: dtrain vs the PyTorch peer"
bench/train.sh --runs "$RUNS" --procs 1
echo; echo "== training, 2 processes: dtrain vs the PyTorch peer (DDP, Gloo)"
bench/train.sh --runs "$RUNS" --procs 2
echo; echo "== dtrain scaling: threads, processes, overlap, backends"
bench/scaling.sh --runs "$RUNS"
echo; echo "== all_reduce: dtrain shm/tcp/mpi vs Open MPI vs Gloo"
REPEATS=$RUNS bench/allreduce.sh
echo; echo "== checkpoints and failure handling"
make -s -j2 tests >/dev/null
build/release/tests/ckpt/test_ckpt 2>/dev/null | grep -i convnet || true
build/release/tests/e2e/test_dtrun_ckpt measure || true
