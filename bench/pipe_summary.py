#!/usr/bin/env python3
"""pipe_summary.py: medians of bench/pipe_bench.sh's output (stdin). Per layout: the
median over rounds of rank 0's step time and the median per-round ratio to dp (the
rounds are interleaved, so a round's layouts share the machine's load); for the
pipelines, per schedule, M and cut, each stage's median measured bubble beside the
theory of equal stages, (P-1)/(M+P-1), and the theory of the measured stages."""
import re, statistics, sys

steps, pipes, rounds = {}, {}, {}
pat = re.compile(r"(\w+) M=(\d+) V=(\d+) rank (\d): step ([\d.]+) ms, \d+ tokens/s"
                 r"(?:, bubble ([\d.]+) \(theory ([\d.]+)\), stage ([\d.]+) ms per micro-batch, "
                 r"these stages' theory ([-\d.]+), cut (\S+))?")
cut_of = {}
for line in sys.stdin:
    m = pat.match(line.strip())
    if not m:
        continue
    mode, M, V, rank, ms, bub, th, st, sth, cut = m.groups()
    if bub:
        key = (mode, int(M), int(V), rank)
        if rank == "0":
            cut_of.setdefault(key, []).append(cut)
        pipes.setdefault(key, []).append((float(ms), float(bub), float(th), float(st), float(sth)))
    elif rank == "0":
        steps.setdefault(mode, []).append(float(ms))

def med(v):
    return statistics.median(v) if v else float("nan")

print(f"{'layout':8} {'step ms (median)':>17} {'vs dp':>7}")
for mode in ["dp", "tp", "one"]:
    if mode in steps:
        n = min(len(steps[mode]), len(steps.get("dp", steps[mode])))
        r = med([steps[mode][i] / steps["dp"][i] for i in range(n)]) if "dp" in steps else float("nan")
        print(f"{mode:8} {med(steps[mode]):17.1f} {r:7.3f}")
if "tp" in steps and "dp" in steps:
    n = min(len(steps["tp"]), len(steps["dp"]))
    r = med([steps["tp"][i] / steps["dp"][i] for i in range(n)])
    print(f"tp throughput / dp throughput: {1 / r:.3f} (goal >= 0.8)")
print()
print("pipelines, 2 stages, by cut (auto:X: balanced by measured cost, which chose X); "
      "bubbles measured (1 - compute / step) beside the theory of equal stages and of the "
      "measured ones")
print(f"{'schedule':8} {'M':>2} {'V':>5} {'cut':>14} {'step ms':>8} {'bubble s0':>9} {'bubble s1':>9} "
      f"{'theory':>7} {'stages th s0':>12} {'s1':>6} {'s0 ms/mb':>9} {'s1 ms/mb':>9}")
for (mode, M, V) in sorted({k[:3] for k in pipes}, key=lambda x: (x[2], x[0] != "gpipe", x[1])):
    r0, r1 = pipes.get((mode, M, V, "0"), []), pipes.get((mode, M, V, "1"), [])
    cuts = cut_of.get((mode, M, V, "0"), [])
    for cut in sorted(set(cuts)):
        idx = [i for i, c in enumerate(cuts) if c == cut]
        a = [r0[i] for i in idx if i < len(r0)]
        b = [r1[i] for i in idx if i < len(r1)]
        col = lambda rows, j: med([x[j] for x in rows])
        print(f"{mode:8} {M:2d} {V:5d} {cut:>14} {col(a, 0):8.1f} {col(a, 1):9.3f} {col(b, 1):9.3f} "
              f"{col(a, 2):7.3f} {col(a, 4):12.3f} {col(b, 4):6.3f} {col(a, 3):9.2f} {col(b, 3):9.2f}")
