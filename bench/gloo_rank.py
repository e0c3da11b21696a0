#!/usr/bin/python3
"""gloo_rank.py: one rank of a torch.distributed all_reduce benchmark (gloo, float32 sum,
in place), started by someone else with the torchrun-style environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT; GLOO_SOCKET_IFNAME to pick the interface), so
that each rank can live in its own network namespace (bench/netns_scaling.sh).

  RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29600 \\
      /usr/bin/python3 bench/gloo_rank.py --min 4K --max 64M --factor 4

Rank 0 prints the same columns as dtrain-bench allreduce (size count type redop time_us
algbw busbw cpu_us): time_us is the median over iterations of the slowest rank's time for
one call, algbw = size / time, busbw = algbw * 2(n-1)/n, in GB/s; cpu_us the CPU time of
all ranks' processes (every thread) per call.
"""
import argparse
import time

import numpy as np
import torch
import torch.distributed as dist


def size_arg(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def iters_for(nbytes):  # as dtrain-bench
    if nbytes <= 64 << 10:
        return 1000
    if nbytes <= 1 << 20:
        return 200
    if nbytes <= 16 << 20:
        return 30
    return 12


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min", type=size_arg, default=4 << 10)
    ap.add_argument("--max", type=size_arg, default=64 << 20)
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--iters", type=int, default=0, help="0 = by size")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# gloo_rank: torch {torch.__version__} gloo all_reduce, {n} ranks, float32 sum, "
              "in place; time_us = median over iterations of the slowest rank", flush=True)
        print(f"{'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'time_us':>12} "
              f"{'algbw':>8} {'busbw':>8} {'cpu_us':>10}", flush=True)
    nbytes = a.min
    while nbytes <= a.max:
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        for _ in range(a.warmup):
            dist.all_reduce(t)
        chk = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(chk)
        want = n * (n + 1) / 2
        if float(chk[0]) != want or float(chk[-1]) != want:
            raise SystemExit(f"gloo_rank: wrong sum {float(chk[0])}, expected {want}")
        dist.barrier()
        iters = a.iters or iters_for(nbytes)
        times = np.empty(iters)
        c0 = time.process_time()  # the whole process: Gloo's I/O threads too
        for i in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times[i] = time.perf_counter() - t0
        cpu = torch.tensor([time.process_time() - c0], dtype=torch.float64)
        tt = torch.from_numpy(times)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu)
        if rank == 0:
            med = float(np.median(tt.numpy()))
            alg = nbytes / med / 1e9
            print(f"{nbytes:>12} {nbytes // 4:>12} {'float32':>8} {'sum':>6} {med * 1e6:>12.1f} "
                  f"{alg:>8.3f} {alg * 2 * (n - 1) / n:>8.3f} {float(cpu) * 1e6 / iters:>10.1f}",
                  flush=True)
        nbytes *= a.factor
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
