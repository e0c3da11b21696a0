#!/bin/sh
# One epoch of Fashion-MNIST with the seed's ConvNet: dtrain against the PyTorch peer
# (../shared/bench/peer/ddp_convnet.py) in its best configuration on this machine,
# runs interleaved (dtrain, peer, dtrain, peer, ...), medians reported.
#
#   bench/train.sh [--runs N] [--procs 1|2|4] [--peer DIR]
#
# --procs 1: one process, batch 128 (dtrain: 2 threads; peer: 2 torch threads, 1 BLAS
#            thread, glibc malloc tuned, as its README's best single-process line).
# --procs P: P processes of batch 128/P (dtrain: --num-processes P, one thread each;
#            peer: --num-processes P --threads 1).
# PEER_PYTHON: the peer's interpreter (default Debian's /usr/bin/python3, torch 1.13);
# bench/peers.sh runs the newest PyTorch and torch.compile beside it.
set -eu
runs=3 procs=1
py=${PEER_PYTHON:-/usr/bin/python3}
peer=${DT_PEER_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared/bench/peer}
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--procs 1|2|4] [--peer DIR]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
bin=build/bin/dtrain-mnist
[ -x $bin ] || { echo "build first: make" >&2; exit 1; }
out=bench/out; mkdir -p $out
batch=$((128 / procs))
if [ "$procs" = 1 ]; then
    dt_cmd="$bin --stats"
    peer_cmd="$py $peer/ddp_convnet.py --undistributed --batch-size 128 --threads 2 --blas-threads 1"
else
    dt_cmd="$bin --stats --num-processes $procs --batch-size $batch --threads 1"
    peer_cmd="$py $peer/ddp_convnet.py --num-processes $procs --batch-size $batch --threads 1"
fi
have_peer=1
${py%% *} -c "import torch" 2>/dev/null || { have_peer=0; echo "(python3-torch missing: peer skipped)"; }

# field FILE KEY: a number from the STATS/PARENT JSON lines or the text lines
secs()  { sed -n 's/^Finished training in \([0-9.]*\) secs.*/\1/p' "$1" | tail -1; }
acc()   { sed -n 's/^Test accuracy: \([0-9.]*\)%.*/\1/p; s/^Test set:.*(\([0-9.]*\)%)$/\1/p' "$1" | tail -1; }
rss()   { sed -n 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/p' "$1" | sort -g | tail -1; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

i=1
while [ $i -le "$runs" ]; do
    $dt_cmd > $out/dtrain.$procs.$i.log 2>&1
    echo "run $i: dtrain $(secs $out/dtrain.$procs.$i.log) s"
    if [ $have_peer = 1 ]; then
        MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 $peer_cmd > $out/peer.$procs.$i.log 2>&1
        echo "run $i: peer   $(secs $out/peer.$procs.$i.log) s"
    fi
    i=$((i + 1))
done

report() {  # name prefix
    t=$(for f in $out/$2.$procs.*.log; do secs $f; done | median)
    a=$(for f in $out/$2.$procs.*.log; do acc $f; done | median)
    r=$(for f in $out/$2.$procs.*.log; do rss $f; done | median)
    sps=$(echo "60000 / $t" | bc -l)
    gf=$(echo "1.0851 * 1000 / $t" | bc -l)
    printf '%-8s %10.2f %10.0f %10.1f %10.2f %12.1f\n' "$1" "$t" "$sps" "$gf" "$a" "$r"
    echo "$t $r" > $out/$2.$procs.median
}
echo
echo "one epoch of Fashion-MNIST (60,000 samples), $procs process(es), medians of $runs runs"
printf '%-8s %10s %10s %10s %10s %12s\n' system epoch_s samples/s GFLOP/s accuracy peak_rss_MiB
report dtrain dtrain
if [ $have_peer = 1 ]; then
    report peer peer
    read -r td rd < $out/dtrain.$procs.median
    read -r tp rp < $out/peer.$procs.median
    printf 'ratio    dtrain time / peer time = %.2f, peer time / dtrain time = %.2f, dtrain RSS / peer RSS = %.2f\n' \
        "$(echo "$td / $tp" | bc -l)" "$(echo "$tp / $td" | bc -l)" "$(echo "$rd / $rp" | bc -l)"
fi
echo "(GFLOP/s: 1.0851 TFLOP per epoch over the whole 'Finished training' time, setup included)"
