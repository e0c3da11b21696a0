#!/usr/bin/python3
"""netns_report.py ROWS.tsv: the tables of bench/netns_scaling.sh and its alpha-beta model.

Medians over passes. busbw = 2(p-1)/p * size / time (GB/s, nccl-tests convention). The
link fraction: the busiest link direction's wire bytes per 64 MiB operation over (median
operation time x link rate).

The model, per link rate, with n the all_reduce's bytes:
  ring over P ranks, placed host by host (dtrain tcp, 1 rank per host or L):
      t = 2(P-1) alpha + [2(P-1)/P n] beta          (bracket: bytes on the busiest link)
  hybrid, H hosts of L ranks (shm inside a host, L parallel cross rings of n/L):
      t = 2(H-1) alpha + [2(H-1)/H n] beta + s n    (s: the shm phases and copies, serial)
alpha and beta are fitted (least squares, relative error) on the 2-machine runs of dtrain
tcp, s on dtrain hybrid's 2x2 at >= 1 MiB given alpha and beta; the 4-machine tcp run
checks the prediction.
"""
import glob
import json
import math
import os
import statistics as st
import sys
from collections import defaultdict

RATE_BPS = {"1gbit": 1e9, "2500mbit": 2.5e9, "2.5gbit": 2.5e9, "10gbit": 10e9}
NAMES = {"hybrid": "dtrain hybrid", "tcp": "dtrain tcp", "mpi": "Open MPI", "gloo": "Gloo",
         "peer": "PyTorch peer"}


def med(v):
    return st.median(v) if v else float("nan")


def rate_bps(r):
    if r == "none":  # unshaped veths
        return float("inf")
    return RATE_BPS.get(r) or float(r.rstrip("bit").replace("g", "e9").replace("m", "e6"))


def main():
    ar = defaultdict(list)      # (topo, rate, tool, size) -> [time_us]
    loads = defaultdict(list)   # (topo, rate, tool) -> [load1]
    link = defaultdict(list)    # (topo, rate, tool) -> [(t_us, bytes/op busiest, frac)]
    mnist = defaultdict(list)   # (rate, tool) -> [secs]
    mload = defaultdict(list)
    meta = {}
    out = os.path.dirname(os.path.abspath(sys.argv[1]))
    cpu = defaultdict(list)     # (topo, rate, tool, size) -> [cpu_us per op, all ranks]
    for f in glob.glob(os.path.join(out, "ar.*.txt")):
        _, topo, rate, tool, rep, part, _ = os.path.basename(f).split(".")
        for line in open(f):
            w = line.split()
            if len(w) >= 8 and w[0].isdigit():
                cpu[topo, rate, tool, int(w[0])].append(float(w[7]))
    wait = defaultdict(list)    # (rate, tool) -> [ddp_wait_secs of rank 0]
    for f in glob.glob(os.path.join(out, "mnist.*.m0.out")):
        _, tool, rate, rep, _, _ = os.path.basename(f).split(".")
        for line in open(f):
            if line.startswith("STATS "):
                wait[rate, tool].append(json.loads(line[6:]).get("ddp_wait_secs", float("nan")))
    for line in open(sys.argv[1]):
        w = line.rstrip("\n").split("\t")
        if w[0] == "meta":
            meta = dict(zip(w[1::2], w[2::2]))
        elif w[0] == "ar":
            _, rep, topo, rate, tool, size, t, load = w[:8]
            ar[topo, rate, tool, int(size)].append(float(t))
            loads[topo, rate, tool].append(float(load))
        elif w[0] == "link":
            _, rep, topo, rate, tool, t, ops, load, b0, b1 = w
            d = [int(b) - int(a) for a, b in zip(b0.split(), b1.split())]
            per_op = max(d) / int(ops)
            frac = per_op * 8 / (float(t) * 1e-6) / rate_bps(rate)
            link[topo, rate, tool].append((float(t), per_op, frac))
        elif w[0] == "mnist":
            _, rep, topo, rate, tool, secs, load = w
            mnist[rate, tool].append(float(secs))
            mload[rate, tool].append(float(load))
    topos = sorted({k[0] for k in ar}, key=lambda t: (t != "2x2", t))
    rates = sorted({k[1] for k in ar}, key=rate_bps)
    print(f"netem: {'yes' if meta.get('netem') == '1' else 'no (no delay added)'}; "
          f"CPU: {meta.get('cpu', '?')}")

    def p_of(topo):
        h, l = topo.split("x")
        return int(h) * int(l), int(h), int(l)

    for topo in topos:
        P, H, L = p_of(topo)
        for rate in [r for r in rates if any(k[:2] == (topo, r) for k in ar)]:
            tools = [t for t in ("hybrid", "tcp", "mpi", "gloo")
                     if any(k[:3] == (topo, rate, t) for k in ar)]
            sizes = sorted({k[3] for k in ar if k[:2] == (topo, rate)})
            npass = max(len(v) for k, v in ar.items() if k[:2] == (topo, rate))
            print(f"\n### {topo} ({H} machines x {L} ranks), links {rate}: all_reduce, "
                  f"median of {npass} pass(es); time us / busbw GB/s")
            ratios = [(a, b) for a, b in (("hybrid", "mpi"), ("hybrid", "gloo"), ("tcp", "mpi"),
                                          ("tcp", "gloo"), ("hybrid", "tcp")) if a in tools and b in tools]
            print("| size | " + " | ".join(NAMES[t] for t in tools) + " | " +
                  " | ".join(f"{a}/{b}" for a, b in ratios) + " |")
            print("|---:|" + "---:|" * (len(tools) + len(ratios)))
            for s in sizes:
                cells, tm = [], {}
                for t in tools:
                    v = ar.get((topo, rate, t, s))
                    if v:
                        tm[t] = med(v)
                        cells.append(f"{tm[t]:.0f} / {2 * (P - 1) / P * s / tm[t] / 1e3:.3f}")
                    else:
                        cells.append("-")
                rc = [f"{tm[b] / tm[a]:.2f}x" if a in tm and b in tm else "-" for a, b in ratios]
                sz = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
                print(f"| {sz} | " + " | ".join(cells) + " | " + " | ".join(rc) + " |")
            print("load average (1 min) at the runs' starts: " + ", ".join(
                f"{t} {min(loads[topo, rate, t]):.1f}-{max(loads[topo, rate, t]):.1f}"
                for t in tools if loads[topo, rate, t]))
    print("\n### Link rate carried during the 64 MiB all_reduce (busiest direction, wire bytes)")
    print("| topology | rate | tool | time ms | MB per op on the busiest link | fraction of the rate "
          "(median, range) | CPU s per op, all ranks (2 vCPUs: at most 2 x time) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (topo, rate, tool), v in sorted(link.items(), key=lambda kv: (kv[0][0] != "2x2", rate_bps(kv[0][1]))):
        fr = [x[2] for x in v]
        frs = (f"{med(fr) * 100:.0f}% ({min(fr) * 100:.0f}-{max(fr) * 100:.0f}%)"
               if rate != "none" else
               f"unshaped: {med([x[1] * 8 / x[0] / 1e3 for x in v]):.2f} Gbit/s")
        c = cpu.get((topo, rate, tool, 64 << 20))
        cs = f"{med(c) / 1e6:.2f}" if c else "-"
        print(f"| {topo} | {rate} | {NAMES[tool]} | {med([x[0] for x in v]) / 1e3:.0f} | "
              f"{med([x[1] for x in v]) / 1e6:.1f} | {frs} | {cs} |")
    if mnist:
        print("\n### Seed ConvNet, one epoch, 2 machines x 2 processes (batch 32 each, 1 thread)")
        print("| rate | tool | epoch s (median) | runs | rank 0's wait for gradients s | load at start |")
        print("|---|---|---:|---:|---:|---|")
        for (rate, tool), v in sorted(mnist.items(), key=lambda kv: (rate_bps(kv[0][0]), kv[0][1])):
            wt = f"{med(wait[rate, tool]):.1f}" if wait[rate, tool] else "-"
            print(f"| {rate} | {NAMES[tool]} | {med(v):.2f} | {len(v)} | {wt} | "
                  f"{min(mload[rate, tool]):.1f}-{max(mload[rate, tool]):.1f} |")
    model(ar, link, mnist, rates)


def fit_ab(pts):
    """least squares of t = a*x1 + b*x2, relative error: rows divided by t."""
    s11 = s12 = s22 = r1 = r2 = 0.0
    for x1, x2, t in pts:
        w = 1 / t
        x1, x2, t = x1 * w, x2 * w, 1.0
        s11 += x1 * x1
        s12 += x1 * x2
        s22 += x2 * x2
        r1 += x1 * t
        r2 += x2 * t
    det = s11 * s22 - s12 * s12
    return (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det


GRAD_BYTES = 4 * 300_426  # the seed ConvNet's 300426 float32 parameters (RESULTS.md)
EPOCH_SAMPLES = 60000
SAMPLE_S = 9.22 / 60000  # one process, one thread: 1p-1t epoch of this instance


def model(ar, link, mnist, rates):
    print("\n### alpha-beta model (fit on the 2-machine runs; the 4-machine run checks it)")
    print("| rate | alpha us | beta ns/B (link: 8/rate) | s ns/B (hybrid's serial shm phases) | "
          "4x1 tcp 4 KiB predicted / measured us | 4x1 tcp 16 MiB predicted / measured ms | "
          "4x1 tcp 64 MiB predicted / measured ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    fits = {}
    for rate in rates:
        pts = []
        for (topo, r, tool, s), v in ar.items():
            if r == rate and topo == "2x2" and tool == "tcp":
                P = 4
                pts.append((2 * (P - 1), 2 * (P - 1) / P * s, med(v)))
        if len(pts) < 2:
            continue
        a, b = fit_ab(pts)
        # hybrid's extra per-byte cost, given alpha and beta (sizes from 1 MiB).
        ex = [(med(v) - (2 * a + s * b)) / s for (topo, r, tool, s), v in ar.items()
              if r == rate and topo == "2x2" and tool == "hybrid" and s >= 1 << 20]
        sh = med(ex) if ex else 0.0
        fits[rate] = (a, b, sh)

        def ring(P, n):
            return 2 * (P - 1) * a + 2 * (P - 1) / P * n * b

        def meas(s):
            v = ar.get(("4x1", rate, "tcp", s))
            return med(v) if v else float("nan")

        print(f"| {rate} | {a:.1f} | {b * 1e3:.2f} ({8e9 / rate_bps(rate):.2f}) | {sh * 1e3:.2f} | "
              f"{ring(4, 4096):.0f} / {meas(4096):.0f} | {ring(4, 16 << 20) / 1e3:.0f} / "
              f"{meas(16 << 20) / 1e3:.0f} | {ring(4, 64 << 20) / 1e3:.0f} / {meas(64 << 20) / 1e3:.0f} |")
    if not fits:
        return
    print("\nPredicted all_reduce time (ms) at N machines of 2 ranks: dtrain tcp (flat ring over "
          "P = 2N ranks), hybrid as measured here (shm phases serial, the fitted s n added) and "
          "hybrid with the shm phases hidden (s = 0, pipelined); the ConvNet's gradient is "
          "%.2f MB" % (GRAD_BYTES / 1e6))
    print("| rate | size | N=8 tcp | hybrid | hybrid s=0 | N=64 tcp | hybrid | hybrid s=0 | "
          "N=512 tcp | hybrid | hybrid s=0 |")
    print("|---|---|" + "---:|" * 9)

    def t_tcp(a, b, N, n):
        P = 2 * N
        return 2 * (P - 1) * a + 2 * (P - 1) / P * n * b

    def t_hyb(a, b, sh, N, n):
        return 2 * (N - 1) * a + 2 * (N - 1) / N * n * b + sh * n

    for rate, (a, b, sh) in fits.items():
        for n, label in ((GRAD_BYTES, "ConvNet grad"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB")):
            cells = []
            for N in (8, 64, 512):
                cells += [f"{t_tcp(a, b, N, n) / 1e3:.1f}", f"{t_hyb(a, b, sh, N, n) / 1e3:.1f}",
                          f"{t_hyb(a, b, 0, N, n) / 1e3:.1f}"]
            print(f"| {rate} | {label} | " + " | ".join(cells) + " |")
    print("\nPredicted ConvNet epoch (s) at N machines x 2 ranks (batch 32 per rank, 60000 "
          "samples: ceil(60000 / 64N) steps), one core per rank (compute %.3f ms per sample: "
          "this VM's 1-process 1-thread epoch, 9.22 s), one gradient all_reduce per step; "
          "not overlapped (upper bound) / hidden behind backward (lower bound):"
          % (SAMPLE_S * 1e3))
    print("| rate | backend | N=2 | N=8 | N=64 | N=512 |")
    print("|---|---|---:|---:|---:|---:|")
    for rate, (a, b, sh) in fits.items():
        for name, f in (("tcp", lambda N: t_tcp(a, b, N, GRAD_BYTES)),
                        ("hybrid", lambda N: t_hyb(a, b, sh, N, GRAD_BYTES)),
                        ("hybrid s=0", lambda N: t_hyb(a, b, 0, N, GRAD_BYTES))):
            cells = []
            for N in (2, 8, 64, 512):
                steps = math.ceil(EPOCH_SAMPLES / (32 * 2 * N))
                comp = steps * 32 * SAMPLE_S
                comm = steps * f(N) * 1e-6
                cells.append(f"{comp + comm:.2f} / {max(comp, comm):.2f}")
            print(f"| {rate} | {name} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
