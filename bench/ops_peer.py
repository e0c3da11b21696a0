#!/usr/bin/python3
"""PyTorch's side of bench/ops-bench: the same ops on the same shapes, one thread.

    /usr/bin/python3 bench/ops_peer.py [--reps N] [--filter SUBSTRING]

prints one line per case: name, forward us, backward us (medians over N timed
repetitions after two warm-ups), in ops-bench's format. Times are the thread's CPU time
(time.thread_time), as ops-bench's: with one intra-op thread, torch runs the kernels, and
autograd the CPU backward, on the calling thread. Forward runs with autograd
recording (as in training); backward is y.backward(dy) on a fresh forward, timed alone:
the input gradient and every parameter gradient. The attention is gpt_bytes.py's
(q k^T, causal masked_fill, softmax, @ v, the head transposes); the losses are timed as
loss forward, then loss.backward().
"""
import argparse
import math
import os
import time

# One OpenBLAS thread too (torch's Linear calls OpenBLAS, whose own threads
# torch.set_num_threads does not limit): the comparison is one core against one core, and
# thread CPU time would miss a second BLAS thread's work.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def conv(cin, cout, k, s, p, hw, input_grad):
    m = nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=False)
    x = torch.randn(128, cin, hw, hw, requires_grad=input_grad)
    return lambda: m(x), m


def bn(c, hw):
    m = nn.BatchNorm2d(c)
    x = torch.randn(128, c, hw, hw, requires_grad=True)
    return lambda: m(x), m


def relu(c, hw):
    m = nn.ReLU()
    x = torch.randn(128, c, hw, hw, requires_grad=True)
    return lambda: m(x), m


def bn_relu(c, hw):  # resnet_fmnist.py's F.relu(self.bn1(...))
    m = nn.BatchNorm2d(c)
    x = torch.randn(128, c, hw, hw, requires_grad=True)
    return lambda: F.relu(m(x)), m


def adaptive():
    m = nn.AdaptiveAvgPool2d(1)
    x = torch.randn(128, 64, 7, 7, requires_grad=True)
    return lambda: m(x), m


def linear(n, fin, fout):
    m = nn.Linear(fin, fout)
    x = torch.randn(n, fin, requires_grad=True)
    return lambda: m(x), m


def embedding():
    m = nn.Embedding(256, 128)
    idx = torch.randint(0, 256, (32, 128))
    return lambda: m(idx), m


def layernorm():
    m = nn.LayerNorm(128)
    x = torch.randn(32, 128, 128, requires_grad=True)
    return lambda: m(x), m


def gelu():
    m = nn.GELU(approximate="tanh")
    x = torch.randn(4096, 512, requires_grad=True)
    return lambda: m(x), m


def attention(B=32, T=128, C=128, nh=4):
    qkv = torch.randn(B, T, 3 * C, requires_grad=True)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    hs = C // nh

    def fwd():
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    return fwd, None


def cross_entropy(n, k):
    x = torch.randn(n, k, requires_grad=True)
    t = torch.randint(0, k, (n,))
    return lambda: F.cross_entropy(x, t), None


CASES = [
    ("resnet stem conv3x3 1->16 28x28", lambda: conv(1, 16, 3, 1, 1, 28, False)),
    ("resnet conv3x3 16->16 28x28", lambda: conv(16, 16, 3, 1, 1, 28, True)),
    ("resnet conv3x3 16->32 s2 28x28", lambda: conv(16, 32, 3, 2, 1, 28, True)),
    ("resnet conv1x1 16->32 s2 28x28", lambda: conv(16, 32, 1, 2, 0, 28, True)),
    ("resnet conv3x3 32->32 14x14", lambda: conv(32, 32, 3, 1, 1, 14, True)),
    ("resnet conv3x3 32->64 s2 14x14", lambda: conv(32, 64, 3, 2, 1, 14, True)),
    ("resnet conv3x3 64->64 7x7", lambda: conv(64, 64, 3, 1, 1, 7, True)),
    ("resnet batchnorm2d 16x28x28", lambda: bn(16, 28)),
    ("resnet batchnorm2d 64x7x7", lambda: bn(64, 7)),
    ("resnet relu 16x28x28", lambda: relu(16, 28)),
    ("resnet batchnorm2d+relu 16x28x28", lambda: bn_relu(16, 28)),
    ("resnet adaptive avgpool 64x7x7->1", adaptive),
    ("resnet linear 64->10", lambda: linear(128, 64, 10)),
    ("resnet cross-entropy 128x10", lambda: cross_entropy(128, 10)),
    ("gpt embedding 256x128", embedding),
    ("gpt layernorm 128", layernorm),
    ("gpt linear qkv 128->384", lambda: linear(4096, 128, 384)),
    ("gpt attention causal H=4 d=32", attention),
    ("gpt linear proj 128->128", lambda: linear(4096, 128, 128)),
    ("gpt linear fc 128->512", lambda: linear(4096, 128, 512)),
    ("gpt gelu tanh 4096x512", gelu),
    ("gpt linear fc 512->128", lambda: linear(4096, 512, 128)),
    ("gpt linear head 128->256", lambda: linear(4096, 128, 256)),
    ("gpt cross-entropy 4096x256", lambda: cross_entropy(4096, 256)),
]


def median_us(fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1e6)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--filter", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__} ops, 1 thread, thread CPU time, median of {args.reps}")
    print(f"{'op':<40} {'fwd_us':>12} {'bwd_us':>12}")
    for name, make in CASES:
        if args.filter and args.filter not in name:
            continue
        fwd, module = make()
        y = fwd()
        dy = torch.randn_like(y) if y.dim() else None

        def forward():
            return fwd()

        def backward_once():
            out = fwd()
            t0 = time.thread_time()
            out.backward(dy)
            return (time.thread_time() - t0) * 1e6

        f = median_us(forward, args.reps)
        for _ in range(2):
            backward_once()
        b = sorted(backward_once() for _ in range(args.reps))[args.reps // 2]
        print(f"{name:<40} {f:12.1f} {b:12.1f}", flush=True)


if __name__ == "__main__":
    main()
