#!/bin/sh
# The cost of the one-object API (dt_trainer): dtrain-mnist as it is (on the trainer)
# against the hand-written loop it replaced (examples/mnist at REV, before the port,
# built against the same library), runs interleaved (hand, trainer, hand, ...), medians
# of the training loop's time (STATS train_loop_secs), of the whole run, and of the CPU
# time (user + system, children included: less sensitive to a loaded machine), and the
# median of the per-pair ratios (a pair runs back to back, under about the same load).
#
#   bench/trainer_overhead.sh [--runs N] [--procs P] [--limit N] [--rev REV]
#
# Both programs compute the same thing (same loss lines, same final CRC32C: checked).
set -eu
runs=5 procs=1 limit=12800 rev=13b76ea
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --rev) rev=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--procs P] [--limit N] [--rev REV]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
new=build/bin/dtrain-mnist lib=build/release/lib/libdtrain.a
[ -x $new ] && [ -f $lib ] || { echo "build first: make" >&2; exit 1; }
out=bench/out/trainer; mkdir -p $out/hand
for f in main.c guard.c guard.h; do git show "$rev:examples/mnist/$f" > $out/hand/$f; done
mpilibs=$(mpicc --showme:link 2>/dev/null || true)
gcc -std=c11 -D_GNU_SOURCE -O2 -Iinclude -pthread $out/hand/main.c $out/hand/guard.c $lib \
    $mpilibs -lopenblas -ldeflate -lz -lm -lpthread -o $out/hand/dtrain-mnist-hand
old=$out/hand/dtrain-mnist-hand
if [ "$procs" = 1 ]; then
    flags="--limit $limit --no-test --stats --threads 2"
else
    flags="--limit $limit --no-test --stats --threads 1 --num-processes $procs --batch-size $((128 / procs))"
fi
loop() { sed -n 's/.*"train_loop_secs": \([0-9.]*\).*/\1/p' "$1"; }
whole() { sed -n 's/^STATS {"secs": \([0-9.]*\).*/\1/p' "$1"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
: > $out/hand.txt; : > $out/trainer.txt
for i in $(seq "$runs"); do
    /usr/bin/time -f "%U %S" -o $out/h.cpu $old $flags > $out/h.log 2>&1 ||
        { echo "hand-written run $i failed:" >&2; cat $out/h.log >&2; exit 1; }
    /usr/bin/time -f "%U %S" -o $out/t.cpu $new $flags > $out/t.log 2>&1 ||
        { echo "trainer run $i failed:" >&2; cat $out/t.log >&2; exit 1; }
    echo "$(loop $out/h.log) $(whole $out/h.log) $(awk '{print $1 + $2}' $out/h.cpu)" >> $out/hand.txt
    echo "$(loop $out/t.log) $(whole $out/t.log) $(awk '{print $1 + $2}' $out/t.cpu)" >> $out/trainer.txt
    grep -v "Finished\|STATS" $out/h.log > $out/h.cmp; grep -v "Finished\|STATS" $out/t.log > $out/t.cmp
    cmp -s $out/h.cmp $out/t.cmp || { echo "outputs differ (run $i)" >&2; exit 1; }
done
hl=$(cut -d' ' -f1 $out/hand.txt | median) tl=$(cut -d' ' -f1 $out/trainer.txt | median)
hw=$(cut -d' ' -f2 $out/hand.txt | median) tw=$(cut -d' ' -f2 $out/trainer.txt | median)
echo "procs $procs, --limit $limit, $runs runs interleaved; all loops: hand [$(cut -d' ' -f1 $out/hand.txt | tr '\n' ' ')] trainer [$(cut -d' ' -f1 $out/trainer.txt | tr '\n' ' ')]"
printf "median train loop: hand %s s, trainer %s s, ratio %s\n" "$hl" "$tl" "$(echo "$tl $hl" | awk '{printf "%.3f", $1/$2}')"
hm=$(cut -d' ' -f1 $out/hand.txt | sort -n | head -1) tm=$(cut -d' ' -f1 $out/trainer.txt | sort -n | head -1)
printf "fastest train loop: hand %s s, trainer %s s, ratio %s\n" "$hm" "$tm" "$(echo "$tm $hm" | awk '{printf "%.3f", $1/$2}')"
printf "median whole run:  hand %s s, trainer %s s, ratio %s\n" "$hw" "$tw" "$(echo "$tw $hw" | awk '{printf "%.3f", $1/$2}')"
hc=$(cut -d' ' -f3 $out/hand.txt | median) tc=$(cut -d' ' -f3 $out/trainer.txt | median)
printf "median CPU time:   hand %s s, trainer %s s, ratio %s\n" "$hc" "$tc" "$(echo "$tc $hc" | awk '{printf "%.3f", $1/$2}')"
pl=$(paste -d' ' $out/hand.txt $out/trainer.txt | awk '{print $4 / $1}' | median)
pc=$(paste -d' ' $out/hand.txt $out/trainer.txt | awk '{print $6 / $3}' | median)
printf "median of paired ratios (trainer / hand): train loop %.3f, CPU time %.3f\n" "$pl" "$pc"
