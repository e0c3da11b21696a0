#!/bin/sh
# comm_ab.sh: did a change to src/comm change collective speed? Collectives of two
# builds of dtrain-bench, OLD and NEW, on the tcp, shm and hybrid backends at a few
# sizes, interleaved: every pass runs each (collective, backend, size) once with each
# binary, the order of old and new alternating between passes, so that a loaded
# machine's drift falls on both alike. 2 processes on this host; hybrid runs 4, on 2
# hosts faked with DT_HOST_ID (dtrain-bench --hosts).
#
#   OLD=/tmp/old/build/bin/dtrain-bench bench/comm_ab.sh
#   OLD=... NEW=build/bin/dtrain-bench REPEATS=7 SIZES="4K 1M 16M" BACKENDS="tcp shm hybrid" \
#       COLLS="allreduce broadcast allgather" bench/comm_ab.sh
#   OLD=... EXTRA=--bind bench/comm_ab.sh     # rank i pinned to CPU i (steadier small sizes)
#
# Prints, per collective, backend and size, the median time (us) of each binary over the
# passes, new/old (< 1: the new one is faster), and the median CPU time (us, user+sys of
# the slowest rank) of each. A build of an older commit for OLD, and the same bench
# source over this tree's library for NEW (both compiled alike):
#   mkdir /tmp/old && git archive <commit> | tar -x -C /tmp/old
#   make -C /tmp/old -j2 build/release/lib/libdtrain.a
#   cc -O2 -std=c11 -D_GNU_SOURCE -I/tmp/old/include bench/dtrain-bench/main.c \
#       /tmp/old/build/release/lib/libdtrain.a $(mpicc --showme:link) -ldeflate -lz -lm \
#       -lpthread -ldl -o /tmp/old/dtrain-bench   (this file's bench, the old library)
set -eu
cd "$(dirname "$0")/.."
OLD=${OLD:?set OLD to the dtrain-bench binary to compare with}
NEW=${NEW:-build/bin/dtrain-bench}
REPEATS=${REPEATS:-5}
SIZES=${SIZES:-4K 1M 16M}
BACKENDS=${BACKENDS:-tcp shm}
COLLS=${COLLS:-allreduce}
NPROCS=${NPROCS:-2}
EXTRA=${EXTRA:-} # more dtrain-bench flags for both, e.g. EXTRA=--bind (rank i on CPU i)
OUT=build/bench/comm_ab
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

rep=1
while [ "$rep" -le "$REPEATS" ]; do
    if [ $((rep % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for coll in $COLLS; do
        for be in $BACKENDS; do
            if [ "$be" = hybrid ]; then ranks="-n 4 --hosts 2"; else ranks="-n $NPROCS"; fi
            for size in $SIZES; do
                for which in $order; do
                    if [ "$which" = old ]; then bin=$OLD; else bin=$NEW; fi
                    f="$OUT/$which.$coll.$be.$size.$rep.txt"
                    # $ranks and $EXTRA are lists of flags: split on purpose
                    if ! "$bin" "$coll" --backend "$be" $ranks --min "$size" --max "$size" \
                        $EXTRA >"$f" 2>"$f.err"; then
                        echo "($which $coll $be $size failed: $(tail -1 "$f.err"))" >&2
                        rm -f "$f"
                    fi
                done
            done
        done
    done
    echo "pass $rep of $REPEATS done" >&2
    rep=$((rep + 1))
done

/usr/bin/python3 - "$OUT" "$COLLS" "$BACKENDS" "$SIZES" <<'EOF'
import glob, os, statistics, sys
out, colls, backends, sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
def times(which, coll, be, size, col=4):
    t = []
    for f in glob.glob(os.path.join(out, f"{which}.{coll}.{be}.{size}.*.txt")):
        for line in open(f):
            p = line.split()
            if len(p) > col and p[0].isdigit():
                t.append(float(p[col]))
    return t
def med(v):
    return statistics.median(v) if v else float("nan")
print(f"{'collective':14} {'backend':8} {'size':>5} {'old us':>10} {'new us':>10} {'new/old':>8}  "
      f"{'old cpu':>9} {'new cpu':>9}  passes")
for c in colls:
    for be in backends:
        for s in sizes:
            o, n = times("old", c, be, s), times("new", c, be, s)
            if not o or not n:
                print(f"{c:14} {be:8} {s:>5}  (missing)")
                continue
            mo, mn = statistics.median(o), statistics.median(n)
            co, cn = med(times("old", c, be, s, 7)), med(times("new", c, be, s, 7))
            print(f"{c:14} {be:8} {s:>5} {mo:10.1f} {mn:10.1f} {mn / mo:8.3f}  "
                  f"{co:9.1f} {cn:9.1f}  {len(o)}/{len(n)}")
EOF
