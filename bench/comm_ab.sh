#!/bin/sh
# comm_ab.sh: did a change to src/comm change collective speed? all_reduce (float32
# sum, in place, 2 processes on this host) of two builds of dtrain-bench, OLD and NEW,
# on the tcp and shm backends at a few sizes, interleaved: every pass runs each
# (backend, size) once with each binary, the order of old and new alternating between
# passes, so that a loaded machine's drift falls on both alike.
#
#   OLD=/tmp/old/build/bin/dtrain-bench bench/comm_ab.sh
#   OLD=... NEW=build/bin/dtrain-bench REPEATS=7 SIZES="4K 1M 16M" BACKENDS="tcp shm" bench/comm_ab.sh
#   OLD=... EXTRA=--bind bench/comm_ab.sh     # rank i pinned to CPU i (steadier small sizes)
#
# Prints, per backend and size, the median time (us) of each binary over the passes
# and new/old (< 1: the new one is faster). A build of an older commit for OLD:
#   mkdir /tmp/old && git archive <commit> | tar -x -C /tmp/old && make -C /tmp/old -j2 programs
set -eu
cd "$(dirname "$0")/.."
OLD=${OLD:?set OLD to the dtrain-bench binary to compare with}
NEW=${NEW:-build/bin/dtrain-bench}
REPEATS=${REPEATS:-5}
SIZES=${SIZES:-4K 1M 16M}
BACKENDS=${BACKENDS:-tcp shm}
NPROCS=${NPROCS:-2}
EXTRA=${EXTRA:-} # more dtrain-bench flags for both, e.g. EXTRA=--bind (rank i on CPU i)
OUT=build/bench/comm_ab
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

rep=1
while [ "$rep" -le "$REPEATS" ]; do
    if [ $((rep % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for be in $BACKENDS; do
        for size in $SIZES; do
            for which in $order; do
                if [ "$which" = old ]; then bin=$OLD; else bin=$NEW; fi
                f="$OUT/$which.$be.$size.$rep.txt"
                if ! "$bin" allreduce --backend "$be" -n "$NPROCS" --min "$size" --max "$size" \
                    $EXTRA >"$f" 2>"$f.err"; then
                    echo "($which $be $size failed: $(tail -1 "$f.err"))" >&2
                    rm -f "$f"
                fi
            done
        done
    done
    echo "pass $rep of $REPEATS done" >&2
    rep=$((rep + 1))
done

/usr/bin/python3 - "$OUT" "$BACKENDS" "$SIZES" <<'EOF'
import glob, os, statistics, sys
out, backends, sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def times(which, be, size):
    t = []
    for f in glob.glob(os.path.join(out, f"{which}.{be}.{size}.*.txt")):
        for line in open(f):
            p = line.split()
            if len(p) >= 7 and p[0].isdigit():
                t.append(float(p[4]))
    return t
print(f"{'backend':8} {'size':>5} {'old us':>10} {'new us':>10} {'new/old':>8}  passes")
for be in backends:
    for s in sizes:
        o, n = times("old", be, s), times("new", be, s)
        if not o or not n:
            print(f"{be:8} {s:>5}  (missing)")
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"{be:8} {s:>5} {mo:10.1f} {mn:10.1f} {mn / mo:8.3f}  {len(o)}/{len(n)}")
EOF
