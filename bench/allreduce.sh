#!/bin/sh
# allreduce.sh: all_reduce (float32 sum, in place, 2 processes on this host) of dtrain's
# tcp, shm and mpi backends (mpi also without fingerprint checks), Open MPI's
# MPI_Allreduce (shared memory, and TCP over loopback)
# and Gloo through PyTorch, side by side in one run, 4 KiB .. 64 MiB.
#
#   bench/allreduce.sh                 # one pass of each
#   REPEATS=3 bench/allreduce.sh       # 3 interleaved passes, medians per size
#   NPROCS=4 MAX=16M bench/allreduce.sh
#
# Prints each tool's table, then one table: time (us) and bus bandwidth (GB/s) per size
# and tool, with the ratios dtrain tcp / Gloo, dtrain shm / Open MPI and dtrain mpi /
# Open MPI (bus bandwidth; > 1 means dtrain is faster). Tools that are missing are
# skipped with a note.
# "tcp --bind" pins rank i to CPU i, as mpirun does by default (Gloo runs unpinned: the
# tcp/Gloo ratio uses the unpinned dtrain run).
set -eu
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-1}
NPROCS=${NPROCS:-2}
MIN=${MIN:-4K}
MAX=${MAX:-64M}
OUT=build/bench
mkdir -p "$OUT"
rm -f "$OUT"/ar_*.txt

bytes() {  # 4K -> 4096
    echo "$1" | awk '{n=$1+0; u=substr($1,length($1)); if(u=="K")n*=1024; if(u=="M")n*=1048576; if(u=="G")n*=1073741824; print n}'
}
MINB=$(bytes "$MIN")
MAXB=$(bytes "$MAX")

[ -x build/bin/dtrain-bench ] || make -j2 programs >/dev/null
HAVE_MPI=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c && HAVE_MPI=1
else
    echo "note: mpicc/mpirun not found (apt-get install libopenmpi-dev openmpi-bin): Open MPI skipped"
fi
GLOO=${PEER:-../shared/bench/peer}/gloo_allreduce.py
[ -n "${GLOO_SCRIPT:-}" ] && GLOO=$GLOO_SCRIPT
HAVE_GLOO=0
if [ -f "$GLOO" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then HAVE_GLOO=1
else echo "note: $GLOO or python3-torch missing: Gloo skipped"; fi
SIZES=$(awk -v a="$MINB" -v b="$MAXB" 'BEGIN{for(s=a;s<=b;s*=2){printf "%s%d", sep, s; sep=","}}')

MPIRUN="mpirun --allow-run-as-root --oversubscribe -np $NPROCS"
run() {  # name command...
    name=$1; shift
    echo "== $name: $*" >&2
    if "$@" >"$OUT/ar_$name.$rep.txt" 2>"$OUT/ar_$name.$rep.err"; then
        cat "$OUT/ar_$name.$rep.txt" >&2
    else
        echo "   ($name failed: $(tail -1 "$OUT/ar_$name.$rep.err"))" >&2
        rm -f "$OUT/ar_$name.$rep.txt"
    fi
}
rep=1
while [ "$rep" -le "$REPEATS" ]; do
    run dtrain_tcp build/bin/dtrain-bench allreduce --backend tcp -n "$NPROCS" --min "$MIN" --max "$MAX"
    run dtrain_tcp_bound build/bin/dtrain-bench allreduce --backend tcp -n "$NPROCS" --min "$MIN" --max "$MAX" --bind
    run dtrain_shm build/bin/dtrain-bench allreduce --backend shm -n "$NPROCS" --min "$MIN" --max "$MAX"
    if [ $HAVE_MPI = 1 ]; then
        run dtrain_mpi build/bin/dtrain-bench allreduce --backend mpi -n "$NPROCS" --min "$MIN" --max "$MAX"
        run dtrain_mpi_nofp env DT_MPI_FINGERPRINT=off build/bin/dtrain-bench allreduce --backend mpi -n "$NPROCS" --min "$MIN" --max "$MAX"
        run mpi_sm $MPIRUN "$OUT/mpi_allreduce" "$MINB" "$MAXB"
        run mpi_tcp $MPIRUN --mca btl tcp,self --mca btl_tcp_if_include lo "$OUT/mpi_allreduce" "$MINB" "$MAXB"
    fi
    if [ $HAVE_GLOO = 1 ]; then
        # The Gloo script prints JSON rows; keep bytes, median of the slowest rank.
        run gloo_json /usr/bin/python3 "$GLOO" --nprocs "$NPROCS" --sizes "$SIZES"
        if [ -f "$OUT/ar_gloo_json.$rep.txt" ]; then
            /usr/bin/python3 - "$OUT/ar_gloo_json.$rep.txt" "$NPROCS" >"$OUT/ar_gloo.$rep.txt" <<'EOF'
import json, sys
n = int(sys.argv[2])
print("# gloo (PyTorch), converted")
print("size count type redop time_us algbw busbw")
for line in open(sys.argv[1]):
    if line.startswith("ROW "):
        r = json.loads(line[4:])
        t = r["median_us_rankmax"]
        alg = r["bytes"] / (t * 1e-6) / 1e9
        print(r["bytes"], r["bytes"] // 4, "float32", "sum", t, alg, alg * 2 * (n - 1) / n)
EOF
        fi
    fi
    rep=$((rep + 1))
done

/usr/bin/python3 - "$OUT" "$NPROCS" <<'EOF'
import glob, os, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
tools = [("dtrain_tcp", "dtrain tcp"), ("dtrain_tcp_bound", "tcp --bind"),
         ("dtrain_shm", "dtrain shm"), ("dtrain_mpi", "dtrain mpi"),
         ("dtrain_mpi_nofp", "mpi no-fp"), ("mpi_sm", "Open MPI sm"),
         ("mpi_tcp", "Open MPI tcp"), ("gloo", "Gloo")]
data = {}
for key, _ in tools:
    per = {}
    for f in sorted(glob.glob(os.path.join(out, f"ar_{key}.*.txt"))):
        cols = None
        for line in open(f):
            w = line.split()
            if not w or line.startswith("#"):
                continue
            if "busbw" in w:
                cols = w
                continue
            if cols and w[0].isdigit():
                row = dict(zip(cols, w))
                per.setdefault(int(w[0]), []).append(float(row["time_us"]))
    if per:
        data[key] = {s: statistics.median(v) for s, v in per.items()}
present = [(k, name) for k, name in tools if k in data]
sizes = sorted({s for k, _ in present for s in data[k]})
bus = lambda s, t: 2 * (n - 1) / n * s / (t * 1e-6) / 1e9
print()
print(f"all_reduce float32 sum, {n} processes, medians of {len(glob.glob(os.path.join(out, 'ar_dtrain_tcp.*.txt')))} pass(es); time in us, busbw in GB/s")
hdr = f"{'size':>10}"
for k, name in present:
    hdr += f" | {name:>12} {'busbw':>6}"
if "dtrain_tcp" in data and "gloo" in data:
    hdr += " | tcp/Gloo"
if "dtrain_shm" in data and "mpi_sm" in data:
    hdr += " | shm/MPI"
if "dtrain_mpi" in data and "mpi_sm" in data:
    hdr += " | mpi/MPI"
print(hdr)
for s in sizes:
    line = f"{s:>10}"
    for k, _ in present:
        t = data[k].get(s)
        line += f" | {t:>12.1f} {bus(s, t):>6.2f}" if t else f" | {'-':>12} {'-':>6}"
    if "dtrain_tcp" in data and "gloo" in data:
        a, b = data["dtrain_tcp"].get(s), data["gloo"].get(s)
        line += f" | {b / a:>8.2f}" if a and b else f" | {'-':>8}"
    if "dtrain_shm" in data and "mpi_sm" in data:
        a, b = data["dtrain_shm"].get(s), data["mpi_sm"].get(s)
        line += f" | {b / a:>7.2f}" if a and b else f" | {'-':>7}"
    if "dtrain_mpi" in data and "mpi_sm" in data:
        a, b = data["dtrain_mpi"].get(s), data["mpi_sm"].get(s)
        line += f" | {b / a:>7.2f}" if a and b else f" | {'-':>7}"
    print(line)
EOF
