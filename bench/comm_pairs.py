#!/usr/bin/python3
"""comm_pairs.py: one collective cell (collective, backend, size) of two dtrain-bench
builds, run as back-to-back pairs: old then new, new then old, alternating. Each pair
gives one ratio new/old, taken a second apart, so the drift of a shared machine (a 16 MiB
cell moves by 10-30% between runs on these vCPUs) falls on both halves of a pair alike;
the median of the pairs' ratios is the figure. comm_ab.sh compares the medians of each
build's passes instead, which that drift moves by more than the 3% its goal asks about.

    bench/comm_pairs.py OLD NEW PAIRS COLLECTIVE BACKEND SIZE [dtrain-bench flags]
    bench/comm_pairs.py /tmp/old/dtrain-bench build/bin/dtrain-bench 41 broadcast shm 16M \\
        --iters 50 --warmup 5

OLD: a build of an older commit (comm_ab.sh's header says how); hybrid runs 4 ranks on
2 hosts faked with DT_HOST_ID, the others 2 ranks. Prints each pair (old us, new us,
new/old, the CPU ratio: user + sys of the slowest rank), then the median ratio, its
quartiles and the median CPU ratio (< 1: the new build is faster).
"""
import statistics
import subprocess
import sys


def run(binary, coll, backend, size, flags):
    ranks = ["-n", "4", "--hosts", "2"] if backend == "hybrid" else ["-n", "2"]
    cmd = [binary, coll, "--backend", backend, *ranks, "--min", size, "--max", size, *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"comm_pairs: {' '.join(cmd)} failed: {done.stderr.strip()[-300:]}")
    last = done.stdout.strip().splitlines()[-1].split()
    return float(last[4]), float(last[7])  # time_us, cpu_us


def main():
    if len(sys.argv) < 7:
        sys.exit(__doc__)
    old, new, pairs, coll, backend, size = sys.argv[1:7]
    flags = sys.argv[7:]
    ratios, cpu = [], []
    for i in range(int(pairs)):
        if i % 2 == 0:
            o = run(old, coll, backend, size, flags)
            n = run(new, coll, backend, size, flags)
        else:
            n = run(new, coll, backend, size, flags)
            o = run(old, coll, backend, size, flags)
        ratios.append(n[0] / o[0])
        cpu.append(n[1] / o[1])
        print(f"{o[0]:10.1f} {n[0]:10.1f} {ratios[-1]:7.3f}  cpu {cpu[-1]:7.3f}", flush=True)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    print(f"{coll} {backend} {size}: {len(ratios)} pairs, new/old median {statistics.median(ratios):.3f} "
          f"(quartiles {q1:.3f}-{q3:.3f}), cpu {statistics.median(cpu):.3f}")


if __name__ == "__main__":
    main()
