#!/bin/sh
# Per-op forward/backward time, dtrain (bench/ops-bench) against PyTorch
# (bench/ops_peer.py), one thread each, on the ResNet and GPT shapes of bench/peer.
# The two alternate RUNS times (default 3); the table holds the medians over the runs
# of each side's per-run medians, and torch/dtrain (> 1: dtrain is faster).
#
#   bench/ops.sh [RUNS]          (after `make programs`; torch: apt-get install python3-torch)
set -eu
cd "$(dirname "$0")/.."
RUNS=${1:-${RUNS:-3}}
REPS=${REPS:-11}
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 # the peer's best
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=1
while [ "$i" -le "$RUNS" ]; do
    build/bin/ops-bench --reps "$REPS" >"$tmp/dtrain.$i"
    /usr/bin/python3 bench/ops_peer.py --reps "$REPS" >"$tmp/torch.$i"
    i=$((i + 1))
done
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(grep -m1 '^#' "$tmp/dtrain.1" | sed 's/^# //')"
/usr/bin/python3 - "$tmp" "$RUNS" <<'PY'
import statistics, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
def load(side):
    t = {}
    for i in range(1, runs + 1):
        for line in open(f"{tmp}/{side}.{i}"):
            if line.startswith("#") or line.startswith("op "):
                continue
            *name, f, b = line.split()
            t.setdefault(" ".join(name), []).append((float(f), float(b)))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
            for k, v in t.items()}
d, p = load("dtrain"), load("torch")
print("| op | dtrain fwd (us) | torch fwd (us) | torch/dtrain | dtrain bwd (us) | torch bwd (us) | torch/dtrain |")
print("|---|---:|---:|---:|---:|---:|---:|")
for k, (f, b) in d.items():
    if k not in p:
        continue
    pf, pb = p[k]
    print(f"| {k} | {f:,.0f} | {pf:,.0f} | {pf / f:.2f} | {b:,.0f} | {pb:,.0f} | {pb / b:.2f} |")
PY
