#!/usr/bin/python3
"""Writes the golden fixtures of tests/golden/data/ from PyTorch (see README.md).

Run with Debian's interpreter (torch 1.13): /usr/bin/python3 tests/golden/gen.py
(or `make golden`). Every fixture holds the inputs, parameters and a random output
gradient dy, and what PyTorch computes from them: the output (or loss), buffers after
the step (BatchNorm's running statistics) and the gradient of sum(y * dy) with respect
to every input and parameter. The torch modules run in float64 on float32 inputs, so the
stored float32 results are correctly rounded and the C test measures dtrain's error only.
Deterministic: a fixed seed per fixture; rerunning rewrites identical files.
"""
import math
import os
import struct
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
MAGIC = b"DTGF"
VERSION = 1
F32, I32 = 0, 1


def write(name, tensors):
    """tensors: list of (name, torch tensor); float -> f32, integer -> i32."""
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(tensors)))
        for tname, t in tensors:
            t = t.detach().cpu().contiguous()
            if t.dtype.is_floating_point:
                dtype, arr = F32, t.to(torch.float32)
            else:
                dtype, arr = I32, t.to(torch.int32)
            raw = tname.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<II", dtype, arr.dim()))
            f.write(struct.pack("<%dI" % arr.dim(), *arr.shape))
            f.write(arr.numpy().astype("<f4" if dtype == F32 else "<i4").tobytes())


def rnd(*shape, scale=1.0, shift=0.0):
    # float32 values, promoted to float64 for the reference computation
    return (torch.randn(*shape, dtype=torch.float32) * scale + shift).double()


def leaf(t):
    return t.clone().requires_grad_(True)


def cfg(*values):
    return ("cfg", torch.tensor(values, dtype=torch.int32))


def grads_of(y, dy, *leaves):
    y.backward(dy)
    return [l.grad for l in leaves]


def conv2d(name, n, cin, cout, h, w, k, s, p, groups, bias):
    torch.manual_seed(zlib.crc32(name.encode()))
    m = nn.Conv2d(cin, cout, k, stride=s, padding=p, groups=groups, bias=bias).double()
    x = leaf(rnd(n, cin, h, w))
    y = m(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    ts = [cfg(cin, cout, k[0], k[1], s[0], s[1], p[0], p[1], groups, int(bias), n, h, w),
          ("x", x), ("w", m.weight), ("dy", dy), ("y", y), ("dx", x.grad), ("dw", m.weight.grad)]
    if bias:
        ts += [("b", m.bias), ("db", m.bias.grad)]
    write(name, ts)


def linear(name, n, fin, fout, bias):
    torch.manual_seed(zlib.crc32(name.encode()))
    m = nn.Linear(fin, fout, bias=bias).double()
    x = leaf(rnd(n, fin))
    y = m(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    ts = [cfg(n, fin, fout, int(bias)), ("x", x), ("w", m.weight), ("dy", dy), ("y", y),
          ("dx", x.grad), ("dw", m.weight.grad)]
    if bias:
        ts += [("b", m.bias), ("db", m.bias.grad)]
    write(name, ts)


def batchnorm(name, shape, training):
    torch.manual_seed(zlib.crc32(name.encode()))
    c = shape[1]
    m = (nn.BatchNorm2d(c) if len(shape) == 4 else nn.BatchNorm1d(c)).double()
    with torch.no_grad():
        m.weight.copy_(rnd(c, scale=0.5, shift=1.0))
        m.bias.copy_(rnd(c, scale=0.5))
        m.running_mean.copy_(rnd(c, scale=0.3))
        m.running_var.copy_(rnd(c, scale=0.2, shift=1.0).abs())
    rm0, rv0 = m.running_mean.clone(), m.running_var.clone()
    m.train(training)
    x = leaf(rnd(*shape, scale=2.0, shift=0.5))
    y = m(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    n, l = shape[0], (math.prod(shape[2:]) if len(shape) > 2 else 1)
    write(name, [cfg(n, c, l, int(training)), ("x", x), ("gamma", m.weight), ("beta", m.bias),
                 ("running_mean0", rm0), ("running_var0", rv0), ("dy", dy), ("y", y),
                 ("running_mean", m.running_mean), ("running_var", m.running_var),
                 ("dx", x.grad), ("dgamma", m.weight.grad), ("dbeta", m.bias.grad)])


def layernorm(name, rows, d):
    torch.manual_seed(zlib.crc32(name.encode()))
    m = nn.LayerNorm(d).double()
    with torch.no_grad():
        m.weight.copy_(rnd(d, scale=0.5, shift=1.0))
        m.bias.copy_(rnd(d, scale=0.5))
    x = leaf(rnd(rows, d, scale=1.5, shift=-0.7))
    y = m(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(rows, d), ("x", x), ("gamma", m.weight), ("beta", m.bias), ("dy", dy),
                 ("y", y), ("dx", x.grad), ("dgamma", m.weight.grad), ("dbeta", m.bias.grad)])


def embedding(name, num, d, count):
    torch.manual_seed(zlib.crc32(name.encode()))
    m = nn.Embedding(num, d).double()
    idx = torch.randint(0, num, (count,))
    idx[1] = idx[0]  # a repeated index: its gradient rows add up
    y = m(idx)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(num, d, count), ("idx", idx), ("w", m.weight), ("dy", dy), ("y", y),
                 ("dw", m.weight.grad)])


def elementwise(name, fn, n=67):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = rnd(n, scale=3.0)
    x[0], x[1], x[2] = 0.0, 12.0, -12.0  # zero and saturated ends
    x = leaf(x)
    y = fn(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(n), ("x", x), ("dy", dy), ("y", y), ("dx", x.grad)])


def softmax(name, rows, d):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = leaf(rnd(rows, d, scale=3.0))
    y = torch.softmax(x, dim=-1)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(rows, d), ("x", x), ("dy", dy), ("y", y), ("dx", x.grad)])


def avgpool(name, n, c, h, w, k, s, p):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = leaf(rnd(n, c, h, w))
    y = nn.AvgPool2d(k, stride=s, padding=p)(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(k[0], k[1], s[0], s[1], p[0], p[1], n, c, h, w), ("x", x), ("dy", dy),
                 ("y", y), ("dx", x.grad)])


def adaptive(name, n, c, h, w, ho, wo):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = leaf(rnd(n, c, h, w))
    y = nn.AdaptiveAvgPool2d((ho, wo))(x)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(n, c, h, w, ho, wo), ("x", x), ("dy", dy), ("y", y), ("dx", x.grad)])


def attention(name, b, t, c, nh):
    """Packed qkv (B, T, 3C) as c_attn gives it; gpt_bytes.py's CausalSelfAttention."""
    torch.manual_seed(zlib.crc32(name.encode()))
    qkv = leaf(rnd(b, t, 3 * c, scale=1.5))
    q, k, v = qkv.split(c, dim=2)
    hs = c // nh
    q = q.view(b, t, nh, hs).transpose(1, 2)
    k = k.view(b, t, nh, hs).transpose(1, 2)
    v = v.view(b, t, nh, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
    dy = rnd(*y.shape)
    y.backward(dy)
    write(name, [cfg(b, t, c, nh), ("qkv", qkv), ("dy", dy), ("y", y), ("dqkv", qkv.grad)])


def pointwise_loss(name, fn, n, target):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = rnd(n, scale=2.0)
    t = target(n, x)
    x = leaf(x)
    loss = fn(x, t)
    loss.backward()
    write(name, [cfg(n), ("x", x), ("t", t), ("loss", loss.reshape(1)), ("dx", x.grad)])


def cross_entropy(name, n, k, ignore_index, ls, ignored):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = leaf(rnd(n, k, scale=2.0))
    t = torch.randint(0, k, (n,))
    for i in ignored:
        t[i] = ignore_index
    loss = F.cross_entropy(x, t, ignore_index=ignore_index, label_smoothing=ls)
    loss.backward()
    write(name, [cfg(n, k, ignore_index), ("ls", torch.tensor([ls], dtype=torch.float32)),
                 ("x", x), ("target", t), ("loss", loss.reshape(1)), ("dx", x.grad)])


def main():
    torch.set_num_threads(1)
    conv2d("conv2d_rect", 2, 3, 4, 7, 6, (3, 2), (2, 1), (1, 0), 1, True)
    conv2d("conv2d_groups", 2, 4, 6, 5, 5, (3, 3), (1, 1), (1, 1), 2, False)
    conv2d("conv2d_depthwise", 3, 4, 4, 6, 7, (1, 3), (1, 2), (0, 1), 4, True)
    conv2d("conv2d_1x1_s2", 2, 5, 3, 7, 7, (1, 1), (2, 2), (0, 0), 1, False)
    conv2d("conv2d_s1_rect", 2, 3, 5, 6, 7, (3, 2), (1, 1), (1, 1), 1, True)
    conv2d("conv2d_s1_5x5", 1, 2, 17, 9, 20, (5, 5), (1, 1), (2, 2), 1, False)
    # 18x18 outputs: im2col takes 4 samples per GEMM, so 6 make a full and a partial chunk
    conv2d("conv2d_chunks", 6, 2, 3, 18, 18, (3, 3), (1, 1), (1, 1), 1, True)
    # channels-in-lanes kernels (conv_cl.c, cout a multiple of 16): stride-2 phases with
    # two 16-lane vectors, odd widths (blocks of 7, 4, 2, 1 pixels), a 1-channel stem,
    # rectangular kernels with mixed strides, rows longer than one 28-pixel block, and
    # stride 3 over a 2x2 kernel (input pixels that no tap reaches)
    conv2d("conv2d_cl_s2", 2, 16, 32, 9, 10, (3, 3), (2, 2), (1, 1), 1, True)
    conv2d("conv2d_cl_s1", 3, 16, 16, 7, 9, (3, 3), (1, 1), (1, 1), 1, False)
    conv2d("conv2d_cl_stem", 2, 1, 16, 6, 5, (3, 3), (1, 1), (1, 1), 1, True)
    conv2d("conv2d_cl_stem_wide", 2, 1, 32, 5, 20, (3, 3), (1, 1), (1, 0), 1, False)
    conv2d("conv2d_cl_rect", 2, 32, 64, 8, 7, (3, 2), (2, 1), (1, 0), 1, True)
    conv2d("conv2d_cl_wide", 1, 16, 48, 5, 31, (3, 3), (1, 1), (1, 1), 1, False)
    # Winograd F(2x2, 3x3) (3x3 stride 1, 16+ input channels): odd output sizes leave
    # partial tiles
    conv2d("conv2d_cl_wino", 2, 32, 32, 13, 12, (3, 3), (1, 1), (1, 1), 1, True)
    conv2d("conv2d_cl_wino_wide", 1, 48, 16, 9, 33, (3, 3), (1, 1), (1, 1), 1, False)
    # 7x7 outputs with 32 channels: the direct kernel's two-row blocks (3 pairs + 1 row)
    conv2d("conv2d_cl_s2_7", 2, 16, 32, 14, 13, (3, 3), (2, 2), (1, 1), 1, True)
    conv2d("conv2d_cl_s3", 2, 16, 16, 8, 8, (2, 2), (3, 3), (0, 0), 1, True)
    linear("linear_bias", 5, 7, 3, True)
    linear("linear_nobias", 4, 9, 6, False)
    linear("linear_wide", 19, 37, 21, True)  # full and partial 8x48 blocks of the kernels
    batchnorm("bn2d_train", (3, 4, 5, 3), True)
    batchnorm("bn2d_eval", (2, 3, 4, 4), False)
    batchnorm("bn1d_train", (6, 5), True)
    batchnorm("bn1d_3d_train", (4, 3, 7), True)
    layernorm("layernorm", 6, 10)
    layernorm("layernorm_wide", 5, 37)  # two vectors of 16 and a tail
    embedding("embedding", 11, 5, 7)
    elementwise("gelu", nn.GELU())
    elementwise("gelu_tanh", nn.GELU(approximate="tanh"))
    elementwise("tanh", torch.tanh)
    elementwise("sigmoid", torch.sigmoid)
    elementwise("silu", F.silu)
    softmax("softmax", 5, 9)
    avgpool("avgpool2d", 2, 3, 7, 6, (3, 2), (2, 2), (1, 1))
    avgpool("avgpool2d_plain", 1, 2, 6, 6, (2, 2), (2, 2), (0, 0))
    adaptive("adaptive_avgpool2d", 2, 3, 7, 5, 3, 2)
    adaptive("adaptive_avgpool2d_1x1", 3, 4, 5, 6, 1, 1)
    attention("attention", 2, 70, 12, 3)
    attention("attention_short", 1, 5, 8, 2)
    pointwise_loss("mse", F.mse_loss, 13, lambda n, x: rnd(n))
    pointwise_loss("l1", F.l1_loss, 13,
                   lambda n, x: torch.cat([x[:2], rnd(n - 2)]))  # two exact ties: gradient 0
    pointwise_loss("bce_logits", F.binary_cross_entropy_with_logits, 13,
                   lambda n, x: torch.rand(n, dtype=torch.float64))
    cross_entropy("cross_entropy", 9, 6, -100, 0.0, [])
    cross_entropy("cross_entropy_ignore_smooth", 11, 7, -100, 0.1, [2, 5, 6])
    cross_entropy("cross_entropy_ignore_class", 8, 5, 3, 0.25, [0, 4])


if __name__ == "__main__":
    main()
