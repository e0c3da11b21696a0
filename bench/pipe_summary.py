#!/usr/bin/env python3
"""pipe_summary.py: medians of bench/pipe_bench.sh's output (stdin). Per layout: the
median over rounds of rank 0's step time, the median per-round ratio to dp (the
rounds are interleaved, so a round's layouts share the machine's load), and for the
pipelines each stage's median measured bubble beside the theory."""
import re, statistics, sys

steps, bubbles, rounds = {}, {}, []
for line in sys.stdin:
    m = re.match(r"(\w+) M=(\d+) rank (\d): step ([\d.]+) ms.*?(?:bubble ([\d.]+) \(theory ([\d.]+)\))?$", line.strip())
    if not m:
        continue
    mode, M, rank, ms, bub, theory = m.groups()
    if rank == "0":
        steps.setdefault(mode, []).append(float(ms))
    if bub:
        bubbles.setdefault((mode, rank), []).append(float(bub))
        bubbles[(mode, "theory")] = [float(theory)]
n = min(len(v) for v in steps.values())
print(f"{'layout':8} {'step ms (median)':>17} {'vs dp (median of rounds)':>25} {'bubble s0':>10} {'bubble s1':>10} {'theory':>7}")
for mode in ["gpipe", "1f1b", "dp", "tp", "one"]:
    if mode not in steps:
        continue
    ratio = statistics.median(steps[mode][i] / steps["dp"][i] for i in range(n))
    b0 = bubbles.get((mode, "0")); b1 = bubbles.get((mode, "1")); th = bubbles.get((mode, "theory"))
    fmt = lambda b: f"{statistics.median(b):.3f}" if b else "-"
    print(f"{mode:8} {statistics.median(steps[mode]):17.1f} {ratio:25.2f} {fmt(b0):>10} {fmt(b1):>10} {fmt(th):>7}")
print(f"({n} rounds)")
