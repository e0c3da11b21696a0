#!/bin/bash
# tools/gpu/check.sh: the one run on a GPU machine (docs/gpu.md). From the repository root,
# with .gpu-carry/ made here by tools/gpu/pack.sh:
#
#     bash tools/gpu/check.sh          # logs under $OUT (default ./gpu-out)
#
# Tiers, each under its own timeout and with its own log, so that a failure or an
# overrun late in the run still leaves the earlier logs (and the summary) behind:
#   0 env        nvidia-smi, nvcc, the cuBLAS / NCCL libraries found, PyTorch's version
#   1 build      make CUDA=1 CUDA_ARCH=90 there (else the prebuilt set), then
#                every GPU test (tests/gpu/test_*)
#   2 sanitizer  compute-sanitizer memcheck, then racecheck, on the GPU tests' kernels
#   3 convnet    the seed ConvNet, one epoch on the GPU, against PyTorch on the same GPU,
#                interleaved; then 2 processes sharing the GPU (both programs)
#   4 gpt        dtrain-gpt 300 steps on the GPU against the peer, fp32 and bf16
#   5 ncu        Nsight Compute (clock control off) on the ConvNet's two costliest kernels
# and summary.txt: one table. About 9 minutes in all (CHECK_SECONDS, default 540): a tier
# that would start with too little time left is skipped, and says so. CHECK_PREBUILT=1
# skips the build and runs the prebuilt set (a rerun after the build was seen to fail);
# CHECK_TIERS="1 2" runs those tiers only (a short first run, then the rest).
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
CARRY=$ROOT/.gpu-carry
TOTAL=${CHECK_SECONDS:-540}
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
JOBS=$(nproc 2>/dev/null || echo 8)

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((TOTAL - ($(date +%s) - START))); }

# ------------------------------------------------------------------ the environment
# CUDA's own folder, and the libraries the Python wheels bring (cuBLAS, NCCL, ...).
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}
PYSITE=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null ||
    echo /opt/torch/.venv/lib/python3.12/site-packages)
LIBDIRS="$CARRY/lib:$CUDA_HOME/lib64"
for d in "$PYSITE"/nvidia/*/lib; do [ -d "$d" ] && LIBDIRS="$LIBDIRS:$d"; done
export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1

# A folder of unversioned links (what -lcublas and -lnccl look for) to the first of each
# library found, and the header folders CUDA_HOME lacks.
LINKS=$ROOT/.gpu-link
rm -rf "$LINKS" && mkdir -p "$LINKS"
first_of() { # name: the first file of that name in the library folders
    local IFS=:
    for d in $LIBDIRS; do [ -e "$d/$1" ] && { echo "$d/$1"; return; }; done
}
for l in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    f=$(first_of $l)
    [ -n "$f" ] && ln -sf "$f" "$LINKS/${l%%.so*}.so"
done
INCS=""
[ -f "$CUDA_HOME/include/cublas_v2.h" ] || INCS="$INCS $PYSITE/nvidia/cublas/include"
if [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
    if [ -f "$PYSITE/nvidia/nccl/include/nccl.h" ]; then INCS="$INCS $PYSITE/nvidia/nccl/include"
    else INCS="$INCS $CARRY/include"; fi
fi

tier_env() {
    echo "== date"; date -u
    echo "== nvidia-smi"; nvidia-smi
    echo "== nvcc"; "$NVCC" --version
    echo "== gcc"; gcc --version | head -1
    echo "== compute-sanitizer, ncu"; command -v compute-sanitizer ncu
    echo "== CUDA_HOME $CUDA_HOME, site-packages $PYSITE"
    echo "== libraries (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    for l in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9 libcudart.so.13; do
        echo "$l: $(first_of $l)"
    done
    echo "== links for the build"; ls -l "$LINKS"
    echo "== extra header folders:$INCS"
    echo "== python"; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
    echo "== carry"; du -sh "$CARRY"/* 2>&1
}

# ------------------------------------------------------------------------ tiers

# tier NAME SECONDS FUNCTION: runs FUNCTION under a timeout into $OUT/NAME.log, when
# CHECK_TIERS (default: all) names its number.
TIERS=${CHECK_TIERS:-0 1 2 3 4 5}
tier() {
    local name=$1 limit=$2 fn=$3 l
    case " $TIERS " in *" ${name%%-*} "*) ;; *) return ;; esac
    l=$(left)
    if [ "$l" -lt 30 ]; then
        say "tier $name: skipped ($l s left of $TOTAL)"
        return
    fi
    [ "$limit" -gt $((l - 10)) ] && limit=$((l - 10))
    local t0 rc
    t0=$(date +%s)
    say "tier $name: up to ${limit}s"
    timeout -k 10 "$limit" bash -c "$fn" >"$OUT/$name.log" 2>&1
    rc=$?
    local secs=$(($(date +%s) - t0))
    case $rc in
    0) say "tier $name: done in ${secs}s" ;;
    124 | 137) say "tier $name: CUT at its limit (${limit}s); the log holds what ran" ;;
    *) say "tier $name: FAILED (exit $rc) after ${secs}s" ;;
    esac
}

# 1: build here; else the prebuilt set. Warnings stay warnings here (this machine's
# compilers may be newer than CI's, which holds the code to -Werror).
build() {
    echo "== make (CUDA_ARCH=90,, $JOBS jobs)"
    make -j"$JOBS" NODEPS=1 CUDA=1 CUDA_ARCH=90 MPI=0 \
        CUDA_HOME="$CUDA_HOME" CUDA_INC_DIRS="$INCS" CUDA_LIB_DIRS="$LINKS" \
        EXTRA_CFLAGS="-I$CARRY/include -Wno-error" EXTRA_LDFLAGS="-L$CARRY/lib" \
        NVCC_WERROR= NVCC_HOST_WARN=-Wall,-Wextra lib programs gpu-tests
}
export -f build
export JOBS CUDA_HOME INCS LINKS CARRY

tier_tests() {
    echo "== plugin $PLUGIN"; ldd "$PLUGIN"
    "$TESTS/test_device" --probe || { echo "no GPU seen by the plugin"; exit 1; }
    local bad=0
    for t in "$TESTS"/test_device "$TESTS"/test_ops "$TESTS"/test_convnet "$TESTS"/test_gpt \
        "$TESTS"/test_ddp "$TESTS"/test_nccl; do
        [ -x "$t" ] || continue
        echo "===== $(basename "$t")"
        timeout -k 5 90 "$t" >"/tmp/dtrain-$$.out" 2>&1
        local rc=$?
        cat "/tmp/dtrain-$$.out"
        echo "RESULT $(basename "$t"): $(grep -E '^[0-9]+ passed, [0-9]+ failed' "/tmp/dtrain-$$.out" | tail -1) (exit $rc)"
        [ $rc -eq 0 ] || bad=1
    done
    rm -f "/tmp/dtrain-$$.out"
    exit $bad
}

tier_sanitizer() {
    local cs="compute-sanitizer --error-exitcode 9 --print-limit 20"
    echo "===== memcheck: test_ops"
    timeout -k 5 40 $cs --tool memcheck --leak-check full "$TESTS/test_ops" 2>&1 | tail -40
    echo "===== memcheck: test_convnet one step"
    timeout -k 5 20 $cs --tool memcheck --leak-check full "$TESTS/test_convnet" one_step 2>&1 | tail -20
    echo "===== memcheck: test_gpt one step"
    timeout -k 5 15 $cs --tool memcheck --leak-check full "$TESTS/test_gpt" step 2>&1 | tail -20
    echo "===== racecheck: the kernels with shared memory (attention, norms, losses)"
    timeout -k 5 20 $cs --tool racecheck "$TESTS/test_ops" attention 2>&1 | tail -20
    timeout -k 5 10 $cs --tool racecheck "$TESTS/test_ops" norms 2>&1 | tail -20
}

FM=$CARRY/data/fashion-mnist
tier_convnet() {
    local peer="python3 $CARRY/peer/ddp_convnet.py --data-dir $FM"
    for round in 1 2; do
        echo "===== round $round: dtrain-mnist --device cuda (batch 128)"
        "$BIN/dtrain-mnist" --device cuda --data-dir "$FM" --stats 2>&1 | grep -v "training loss"
        echo "===== round $round: PyTorch ddp_convnet.py --undistributed --device cuda --batch-size 128"
        $peer --undistributed --device cuda --batch-size 128 2>&1 | grep -v "training loss"
    done
    echo "===== dtrain-mnist --num-gpu-processes 2 (batch 64 each, one GPU, shm DDP)"
    "$BIN/dtrain-mnist" --num-gpu-processes 2 --batch-size 64 --data-dir "$FM" --stats 2>&1 |
        grep -v "training loss"
    echo "===== PyTorch ddp_convnet.py --num-processes 2 --device cuda --batch-size 64"
    $peer --num-processes 2 --device cuda --batch-size 64 2>&1 | grep -v "training loss"
}

FT=$CARRY/data/fortunes
tier_gpt() {
    local peer="python3 $CARRY/peer/gpt_bytes.py --data $FT --undistributed --device cuda"
    echo "===== dtrain-gpt --device cuda (fp32, 300 steps)"
    "$BIN/dtrain-gpt" --device cuda --data "$FT" --log-every 50 2>&1 || echo "(exit $?)"
    echo "===== PyTorch gpt_bytes.py --device cuda (fp32)"
    $peer --log-every 50 2>&1 || echo "(exit $?)"
    echo "===== dtrain-gpt --device cuda --precision bf16"
    "$BIN/dtrain-gpt" --device cuda --precision bf16 --data "$FT" --log-every 50 2>&1 || echo "(exit $?)"
    echo "===== PyTorch gpt_bytes.py --device cuda --autocast-bf16"
    $peer --autocast-bf16 --log-every 50 2>&1 || echo "(exit $?)"
}

tier_ncu() {
    local run="$BIN/dtrain-mnist --device cuda --data-dir $FM --limit 2560 --max-steps 12 --no-test"
    echo "===== every kernel's time over 12 steps (ncu, clock control off)"
    local tmp=/tmp/dtrain-ncu-$$
    timeout -k 5 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv $run \
        >"$tmp.csv" 2>&1
    python3 - "$tmp.csv" >"$tmp.top" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0] if rows else []
tot = collections.Counter()
if "Kernel Name" in head and "Metric Value" in head:
    k, v = head.index("Kernel Name"), head.index("Metric Value")
    for r in rows[1:]:
        try: tot[r[k]] += float(r[v].replace(",", ""))
        except ValueError: pass
for name, ns in tot.most_common(8):
    print(f"{ns / 1e3:10.1f} us  {name}")
if not tot:
    print("(no kernel times read: the CSV's first lines follow)")
    print("".join(open(sys.argv[1]).readlines()[:15]))
PY
    sed 's/^/TOP /' "$tmp.top"
    grep -E '^ *[0-9.]+ us  ' "$tmp.top" | head -2 | sed 's/^ *[0-9.]* us  //' | sed 's/(.*//' |
        while read -r k; do
        [ -n "$k" ] || continue
        echo "===== ncu SpeedOfLight + Occupancy + LaunchStats: $k"
        timeout -k 5 60 ncu --clock-control none --section SpeedOfLight --section Occupancy \
            --section LaunchStats -k "regex:^${k}" --launch-skip 4 --launch-count 1 $run 2>&1 |
            grep -v "^==PROF==" | tail -60
    done
    rm -f "$tmp.csv" "$tmp.top"
}
export -f tier_tests tier_sanitizer tier_convnet tier_gpt tier_ncu
export FM FT OUT

# ---------------------------------------------------------------------------- run
say "dtrain GPU check, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || cat "$CARRY/prebuilt/commit" 2>/dev/null | head -1)"
export LIBDIRS NVCC PYSITE
export -f tier_env first_of
tier 0-env 30 tier_env

# The build, in this shell (its result decides what the later tiers run).
t0=$(date +%s)
[ "${CHECK_PREBUILT:-0}" = 1 ] && echo "CHECK_PREBUILT=1: no build" >"$OUT/1-build.log"
if [ "${CHECK_PREBUILT:-0}" != 1 ] &&
    timeout -k 10 $(($(left) < 170 ? $(left) - 20 : 150)) bash -c build >"$OUT/1-build.log" 2>&1; then
    BIN=$ROOT/build/bin PLUGIN=$ROOT/build/release/lib/libdtrain_cuda.so
    TESTS=$ROOT/build/release/tests/gpu
    say "tier 1-build: built here in $(($(date +%s) - t0))s"
else
    BIN=$CARRY/prebuilt/bin PLUGIN=$CARRY/prebuilt/lib/libdtrain_cuda.so
    TESTS=$CARRY/prebuilt/tests
    say "tier 1-build: FAILED here after $(($(date +%s) - t0))s (1-build.log); the prebuilt set runs"
    tail -25 "$OUT/1-build.log" | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
fi
export BIN PLUGIN TESTS DT_CUDA_PLUGIN=$PLUGIN
tier 1-tests 120 tier_tests
tier 2-sanitizer 110 tier_sanitizer
tier 3-convnet 110 tier_convnet
tier 4-gpt 100 tier_gpt
tier 5-ncu 80 tier_ncu

# ------------------------------------------------------------------------ summary
{
    echo
    echo "== summary ($(($(date +%s) - START))s in all)"
    printf '%-44s %s\n' "GPU" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    grep "^RESULT" "$OUT/1-tests.log" 2>/dev/null | sed 's/^RESULT /    /'
    printf '%-44s %s\n' "memcheck / racecheck errors" \
        "$(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/2-sanitizer.log" 2>/dev/null | tr '\n' ';')"
    grep -E "^=====|Finished training|Test accuracy|Test set|accuracy" "$OUT/3-convnet.log" 2>/dev/null |
        sed 's/^/    /'
    grep -E "^=====|tok/s|val loss|Finished training" "$OUT/4-gpt.log" 2>/dev/null | grep -E "^=====|step 300|val loss|Finished" |
        sed 's/^/    /'
    echo "    costliest kernels (ncu, 12 ConvNet steps):"
    grep "^TOP" "$OUT/5-ncu.log" 2>/dev/null | head -4 | sed 's/^TOP /      /'
} | tee -a "$SUMMARY"
