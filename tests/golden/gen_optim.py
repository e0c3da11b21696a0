#!/usr/bin/python3
"""Golden fixtures for dtrain's optimizers, parameter groups, gradient clipping and
learning-rate schedules, computed by PyTorch (torch 1.13, float32 on the CPU).

Run by hand from the repository root:   /usr/bin/python3 tests/golden/gen_optim.py
It rewrites tests/golden/data/optim_*.bin, which are committed, so the test
(tests/golden/test_optim_golden.c) needs no PyTorch.

File format (all little-endian), a sequence of named arrays until the end of file:
    u32 name length, the name's bytes (ASCII, no NUL),
    u32 ndim, ndim x u32 dimensions,
    the float32 values (row-major; a scalar is ndim 1, dims [1]).

optim_sgd.bin / optim_adamw.bin: three tensors w (4, 3), b (4), v (2, 4) laid out in that
order; group 0 holds w and v, group 1 holds b with its own lr and weight_decay 0 (the
"no decay on biases" pattern). Arrays: "init" (the 24 initial parameters, flat), then
per step k = 0, 1, 2: "grad<k>" (the gradient set before the step, flat), "norm<k>"
(the total norm clip_grad_norm_(max_norm=0.5) returned), "param<k>" (the parameters
after optimizer.step()). Options are in the arrays "hyper" (see HYPER below).

optim_sched.bin: "step" (lr of StepLR(step_size=3, gamma=0.5), base 0.1, steps 0..7),
"cosine" (CosineAnnealingLR(T_max=10, eta_min=0.001), base 0.1, steps 0..10),
"linear" (LinearLR(start_factor=0.25, end_factor=1, total_iters=4), base 0.1, 0..8),
"warmcos" (SequentialLR([LinearLR(0.2, 1.0, total_iters=5), CosineAnnealingLR(T_max=10)],
milestones=[5]), base 0.1, steps 0..15): the lr in effect after `t` scheduler steps.
"""
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def put(f, name, t):
    t = torch.as_tensor(t, dtype=torch.float32).contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    f.write(struct.pack("<I", len(name)) + name.encode())
    f.write(struct.pack("<I", t.dim()) + b"".join(struct.pack("<I", d) for d in t.shape))
    f.write(t.numpy().astype("<f4").tobytes())


def flat(ts):
    return torch.cat([t.detach().reshape(-1) for t in ts])


def optim_case(path, make):
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(4, 3, generator=g).requires_grad_()
    b = torch.randn(4, generator=g).requires_grad_()
    v = torch.randn(2, 4, generator=g).requires_grad_()
    opt, hyper = make(w, b, v)
    with open(path, "wb") as f:
        put(f, "hyper", hyper)
        put(f, "init", flat([w, b, v]))
        for k in range(3):
            grads = torch.randn(24, generator=g) * (0.2 + k)
            off = 0
            for p in (w, b, v):
                p.grad = grads[off:off + p.numel()].reshape(p.shape).clone()
                off += p.numel()
            norm = torch.nn.utils.clip_grad_norm_([w, b, v], max_norm=0.5)
            put(f, "grad%d" % k, grads)
            put(f, "norm%d" % k, norm)
            opt.step()
            put(f, "param%d" % k, flat([w, b, v]))


# HYPER: [lr0, weight_decay0, lr1, momentum_or_beta1, dampening_or_beta2, eps]
def sgd(w, b, v):
    opt = torch.optim.SGD([{"params": [w, v]}, {"params": [b], "lr": 0.05, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, weight_decay=0.01)
    return opt, [0.1, 0.01, 0.05, 0.9, 0.0, 0.0]


def adamw(w, b, v):
    opt = torch.optim.AdamW([{"params": [w, v]}, {"params": [b], "lr": 0.02, "weight_decay": 0.0}],
                            lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    return opt, [0.01, 0.1, 0.02, 0.9, 0.999, 1e-8]


def lrs(make, n):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    s = make(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    optim_case(os.path.join(OUT, "optim_sgd.bin"), sgd)
    optim_case(os.path.join(OUT, "optim_adamw.bin"), adamw)
    S = torch.optim.lr_scheduler
    with open(os.path.join(OUT, "optim_sched.bin"), "wb") as f:
        put(f, "step", lrs(lambda o: S.StepLR(o, step_size=3, gamma=0.5), 8))
        put(f, "cosine", lrs(lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001), 11))
        put(f, "linear", lrs(lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0,
                                                  total_iters=4), 9))
        put(f, "warmcos", lrs(lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=5),
                S.CosineAnnealingLR(o, T_max=10)], milestones=[5]), 16))


if __name__ == "__main__":
    main()
