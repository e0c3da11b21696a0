#!/usr/bin/env python3
"""layout_model.py: which mesh layout (dp x pp x tp, ZeRO-1 on the data dimension) to
pick for which GPT, from the alpha-beta model of the comm issue (bench/RESULTS.md,
"Alpha-beta model") extended to the pipeline's and tensor parallelism's messages, and
the compute rate, tensor-parallel efficiency and pipeline bubble measured on this
machine (bench/pipe_bench.sh, bench/mesh_bench.sh).

    bench/layout_model.py                      # the table at 1, 8 and 64 nodes
    bench/layout_model.py --check MEASURED.txt # the model against pipe_bench's medians

The model, per optimizer step of a global batch of B sequences of T tokens, on N nodes
of R ranks (tp inside a node, then pp, then dp, as the mesh places them):

  compute   6 P_eff B T / (world F eta_tp) x (M + pp - 1) / M       (the 1F1B bubble)
  tp        each block's 4 all-reduces (2 forward, 2 backward) of the micro-batch's
            activations (b T C floats) per micro-batch, over shared memory:
            2 (tp-1) a_s + 2 (tp-1)/tp n b_s
  pp        per micro-batch, an activation forward and its gradient back across each
            stage boundary: 2 (a + n b) on the network once stages span nodes
  dp        the stage's gradient (4 P / (pp tp) bytes) all-reduced over the dp ranks
            (a ring on the network, or shared memory inside a node), overlapped with
            the last micro-batch's backward (2/3 of its compute), the rest exposed
  memory    16 bytes per parameter of the part (weights, gradients, Adam's m and v;
            ZeRO-1 divides Adam's 8 bytes by dp) + activations: per layer and sequence
            2 (T C (10 + 24/tp) + 5 h T^2 / tp) bytes (Megatron's estimate, fp32), for
            L/pp layers and the micro-batches in flight (1F1B: min(pp, M) on stage 0)

Every layout with a micro-batch size that fits the memory per rank is tried; the
fastest is printed with its step time, its throughput per rank against one rank with
the whole model (when that fits), and the runner-up. Constants: --help.
"""
import argparse, math, sys

V = 256  # dtrain-gpt's byte vocabulary


def gpt_params(L, C, T):
    return 12 * L * C * C + 13 * L * C + V * C + T * C + 2 * C


def flops_per_token(L, C, T):  # dtrain-gpt's: forward + backward, attention included
    return 3.0 * (2.0 * (12.0 * L * C * C + C * V) + 4.0 * L * T * C)


def ring(n, bytes_, a, b):  # all_reduce of n ranks on a ring, alpha-beta
    return 0.0 if n <= 1 else 2 * (n - 1) * a + 2 * (n - 1) / n * bytes_ * b


def step_time(m, lay, a):
    L, C, T, B = m["L"], m["C"], m["T"], a.batch
    dp, pp, tp, mb = lay
    world = dp * pp * tp
    b = B // dp  # sequences per replica
    M = b // mb
    f = flops_per_token(L, C, T) * B * T
    eta = 1.0 if tp == 1 else a.tp_eff ** math.log2(tp)
    compute = f / (world * a.flops * 1e9 * eta)
    bubble = compute * (pp - 1) / M
    act = mb * T * C * 4  # one micro-batch's activations, bytes
    tp_t = 0.0
    if tp > 1:  # inside a node: shared memory
        tp_t = M * (L / pp) * 4 * ring(tp, act, a.shm_alpha * 1e-6, a.shm_beta * 1e-9)
    pp_t = 0.0
    if pp > 1:
        cross = tp * pp > a.ranks  # stage boundaries between nodes
        al, be = (a.alpha * 1e-6, a.beta * 1e-9) if cross else (a.shm_alpha * 1e-6, a.shm_beta * 1e-9)
        pp_t = M * 2 * (al + act * be)
    grad = 4 * gpt_params(L, C, T) / (pp * tp)
    inside = dp * pp * tp <= a.ranks  # the dp group in one node
    al, be = (a.shm_alpha * 1e-6, a.shm_beta * 1e-9) if inside else (a.alpha * 1e-6, a.beta * 1e-9)
    dp_t = ring(dp, grad, al, be)
    dp_exposed = max(0.0, dp_t - (2.0 / 3.0) * compute / M)
    total = compute + bubble + tp_t + pp_t + dp_exposed
    # memory per rank
    P = gpt_params(L, C, T) / (pp * tp)
    state = P * (8 + 8 / (dp if a.zero else 1))
    h = C // 64 or 1
    per_layer_seq = 2 * (T * C * (10 + 24 / tp) + 5 * h * T * T / tp)
    inflight = min(pp, M) if pp > 1 else 1
    actb = per_layer_seq * math.ceil(L / pp) * mb * inflight
    return total, state + actb, dict(compute=compute, bubble=bubble, tp=tp_t, pp=pp_t, dp=dp_exposed)


def layouts(m, world, a):
    L = m["L"]
    for tp in [t for t in (1, 2, 4, 8, 16) if t <= a.ranks and a.ranks % t == 0]:
        if (C_heads := m["C"] // 64 or 1) % tp and tp > 1:
            continue
        for pp in range(1, min(L, world // tp) + 1):
            if (world // tp) % pp or L % pp:
                continue
            dp = world // (tp * pp)
            if a.batch % dp:
                continue
            b = a.batch // dp
            for mb in [d for d in range(1, b + 1) if b % d == 0]:
                if pp > 1 and b // mb < pp:  # fewer micro-batches than stages
                    continue
                yield (dp, pp, tp, mb)


def best(m, world, a):
    """The fastest micro-batch size of each layout that fits, fastest layout first (ties:
    the larger micro-batch: fewer, larger GEMMs run faster than this model says)."""
    by = {}
    for lay in layouts(m, world, a):
        t, mem, parts = step_time(m, lay, a)
        if mem > a.mem * 2**30:
            continue
        k = lay[:3]
        if k not in by or (t, -lay[3]) < (by[k][0], -by[k][1][3]):
            by[k] = (t, lay, mem, parts)
    return sorted(by.values(), key=lambda r: (r[0], -r[1][3]))


SIZES = [  # (name, L, C): dtrain-gpt's default, then GPT-2/3 shapes with its T and vocabulary
    ("0.8M (dtrain-gpt)", 4, 128),
    ("25M", 8, 512),
    ("124M", 12, 768),
    ("350M", 24, 1024),
    ("1.3B", 24, 2048),
    ("6.7B", 32, 4096),
    ("13B", 40, 5120),
    ("30B", 48, 7168),
]


def fmt_lay(lay):
    dp, pp, tp, mb = lay
    return f"dp {dp} x pp {pp} x tp {tp}, micro {mb}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flops", type=float, default=10.0,
                   help="sustained GFLOP/s of one rank (one core) on dtrain-gpt's GEMMs (measured: bench/mesh_bench.sh)")
    p.add_argument("--tp-eff", type=float, default=0.88,
                   help="compute efficiency of a 2-way tensor-parallel split (tp's step vs half of one rank's; "
                        "measured: pipe_bench tp vs dp), compounded per doubling")
    p.add_argument("--alpha", type=float, default=18.8, help="network latency per ring step, us (1 Gbit/s fit)")
    p.add_argument("--beta", type=float, default=8.63, help="network ns per byte (1 Gbit/s fit)")
    p.add_argument("--shm-alpha", type=float, default=1.3, help="shared-memory latency per step, us (4 KiB all_reduce)")
    p.add_argument("--shm-beta", type=float, default=0.125, help="shared-memory ns per byte (8 GB/s bus bandwidth)")
    p.add_argument("--ranks", type=int, default=2, help="ranks (cores) per node: the netns machines of the comm issue")
    p.add_argument("--mem", type=float, default=11.0, help="GiB per rank (this VM: 23 GiB / 2)")
    p.add_argument("--batch", type=int, default=512, help="global batch, sequences")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (T; dtrain-gpt's default)")
    p.add_argument("--bench", action="store_true",
                   help="the model's step times for bench/pipe_bench.c's layouts (2 ranks on one node)")
    p.add_argument("--nodes", default="1,8,64")
    p.add_argument("--no-zero", dest="zero", action="store_false", help="plain DDP on the data dimension")
    a = p.parse_args()
    nodes = [int(x) for x in a.nodes.split(",")]
    if a.bench:  # pipe_bench.c: 4 blocks, C 128, T 64, B 16, 2 ranks, one node
        a.batch, a.ranks = 16, 2
        m = {"L": 4, "C": 128, "T": 64}
        one = flops_per_token(4, 128, 64) * 16 * 64 / (a.flops * 1e9)
        print(f"one process: {one*1e3:.0f} ms")
        for name, lay in [("dp 2", (2, 1, 1, 8)), ("tp 2", (1, 1, 2, 16)), ("pp 2, M 4", (1, 2, 1, 4)),
                          ("pp 2, M 8", (1, 2, 1, 2))]:
            t, mem, parts = step_time(m, lay, a)
            print(f"{name}: {t*1e3:.0f} ms (" + ", ".join(f"{k} {v*1e3:.1f}" for k, v in parts.items()) + ")")
        return
    print(f"# {a.ranks} ranks per node, {a.mem:g} GiB and {a.flops:g} GFLOP/s per rank, tp efficiency "
          f"{a.tp_eff:g} per doubling; network alpha {a.alpha:g} us, beta {a.beta:g} ns/B; shm alpha "
          f"{a.shm_alpha:g} us, beta {a.shm_beta:g} ns/B; global batch {a.batch} x {a.seq} tokens; "
          f"ZeRO-1 {'on' if a.zero else 'off'}")
    print()
    print("| model | params | nodes | best layout | step s | tokens/s | vs ideal | memory/rank GiB | "
          "where the time goes (compute/bubble/tp/pp/dp, %) | runner-up |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|---|")
    for name, L, C in SIZES:
        m = {"L": L, "C": C, "T": a.seq}
        P = gpt_params(L, C, a.seq)
        for n in nodes:
            world = n * a.ranks
            r = best(m, world, a)
            if not r:
                print(f"| {name} | {P/1e6:.1f}M | {n} | does not fit ({16*P/2**30/world:.1f} GiB of states per rank "
                      f"at best) | | | | | | |")
                continue
            t, lay, mem, parts = r[0]
            ideal = flops_per_token(L, C, a.seq) * a.batch * a.seq / (world * a.flops * 1e9)
            share = "/".join(f"{100*parts[k]/t:.0f}" for k in ("compute", "bubble", "tp", "pp", "dp"))
            ru = fmt_lay(r[1][1]) + f" ({r[1][0]/t:.2f}x the time)" if len(r) > 1 else "-"
            print(f"| {name} | {P/1e6:.1f}M | {n} | {fmt_lay(lay)} | {t:.3g} | {a.batch*a.seq/t:.3g} | "
                  f"{ideal/t:.2f} | {mem/2**30:.2f} | {share} | {ru} |")


if __name__ == "__main__":
    main()
