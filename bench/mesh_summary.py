#!/usr/bin/env python3
"""mesh_summary.py: medians of bench/mesh_bench.sh's output (stdin): per layout the
median tokens/s, CPU seconds, and the median over rounds of tokens/s against dp (the
layouts of a round ran one after the other, so they share the machine's load)."""
import re, statistics, sys

runs = {}
for line in sys.stdin:
    m = re.match(r"(\w+) round (\d+): tokens/s ([\d.]+) cpu_s ([\d.]+)", line.strip())
    if m:
        runs.setdefault(m.group(1), {})[int(m.group(2))] = (float(m.group(3)), float(m.group(4)))
print(f"{'layout':6} {'tokens/s':>9} {'CPU s':>7} {'vs dp (tokens/s, median of rounds)':>36}")
for l in ["dp", "pp", "tp", "one"]:
    if l not in runs:
        continue
    r = runs[l]
    ratio = [r[k][0] / runs["dp"][k][0] for k in r if "dp" in runs and k in runs["dp"]]
    print(f"{l:6} {statistics.median(v[0] for v in r.values()):9.0f} "
          f"{statistics.median(v[1] for v in r.values()):7.1f} "
          f"{statistics.median(ratio) if ratio else float('nan'):36.3f}")
