#!/usr/bin/python3
"""Writes the model-graph fixtures tests/golden/data/graph_*.bin from PyTorch.

Run with Debian's interpreter (torch 1.13): /usr/bin/python3 tests/golden/gen_graph.py
(`make golden` runs it after gen.py). Same file format as gen.py (README.md). Each
fixture is a whole block computed in float64 from float32 inputs: the parameters are
named as dtrain's graph names them ("p:<node>.<tensor>"), their gradients "g:<...>",
buffers after the step "b:<...>" (and before it "b0:<...>" where a case loads them),
inputs "in:<name>", the output "y", the output
gradient "dy", and the inputs' gradients "dx:<name>". The gradients are those of
sum(y * dy).
"""
import math
import os
import sys
import zlib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen import rnd, write  # noqa: E402


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def params(spec):
    """spec: list of (name, shape, kind); kind 'w' random, 'one' ~1, 'zero' ~0."""
    out = {}
    for name, shape, kind in spec:
        if kind == "w":
            t = rnd(*shape, scale=1.0 / math.sqrt(max(1, math.prod(shape[1:]))))
        elif kind == "one":
            t = rnd(*shape, scale=0.2, shift=1.0)
        else:
            t = rnd(*shape, scale=0.2)
        out[name] = t.requires_grad_(True)
    return out


def finish(name, inputs, p, y, buffers=(), extra=()):
    dy = rnd(*y.shape)
    y.backward(dy)
    ts = [("in:" + k, v) for k, v in inputs.items()]
    ts += [("p:" + k, v) for k, v in p.items()]
    ts += [("dy", dy), ("y", y)]
    ts += [("g:" + k, v.grad) for k, v in p.items()]
    ts += [("dx:" + k, v.grad) for k, v in inputs.items() if v.dtype.is_floating_point]
    ts += [("b:" + k, v) for k, v in buffers]
    ts += list(extra)
    assert len(ts) <= 64
    write(name, ts)


def bn_train(x, p, name, buffers):
    c = x.shape[1]
    rm = torch.zeros(c, dtype=torch.float64)
    rv = torch.ones(c, dtype=torch.float64)
    y = F.batch_norm(x, rm, rv, p[name + ".weight"], p[name + ".bias"], training=True,
                     momentum=0.1, eps=1e-5)
    buffers += [(name + ".running_mean", rm), (name + ".running_var", rv)]
    return y


def resblock():
    """x -> conv1 -> bn1 -> relu -> conv2 -> bn2 -> + x -> relu (a ResNet basic block)."""
    name = "graph_resblock"
    seed(name)
    n, c, h, w = 3, 4, 6, 5
    p = params([("conv1.weight", (c, c, 3, 3), "w"), ("bn1.weight", (c,), "one"),
                ("bn1.bias", (c,), "zero"), ("conv2.weight", (c, c, 3, 3), "w"),
                ("bn2.weight", (c,), "one"), ("bn2.bias", (c,), "zero")])
    x = rnd(n, c, h, w).requires_grad_(True)
    buffers = []
    t = F.conv2d(x, p["conv1.weight"], padding=1)
    t = F.relu(bn_train(t, p, "bn1", buffers))
    t = F.conv2d(t, p["conv2.weight"], padding=1)
    t = bn_train(t, p, "bn2", buffers)
    y = F.relu(t + x)
    finish(name, {"x": x}, p, y, buffers)


def block_params(prefix, c):
    return [(prefix + "ln1.weight", (c,), "one"), (prefix + "ln1.bias", (c,), "zero"),
            (prefix + "qkv.weight", (3 * c, c), "w"), (prefix + "qkv.bias", (3 * c,), "zero"),
            (prefix + "proj.weight", (c, c), "w"), (prefix + "proj.bias", (c,), "zero"),
            (prefix + "ln2.weight", (c,), "one"), (prefix + "ln2.bias", (c,), "zero"),
            (prefix + "fc.weight", (4 * c, c), "w"), (prefix + "fc.bias", (4 * c,), "zero"),
            (prefix + "fc2.weight", (c, 4 * c), "w"), (prefix + "fc2.bias", (c,), "zero")]


def attention(qkv, heads):
    b, t, c3 = qkv.shape
    c = c3 // 3
    q, k, v = qkv.split(c, dim=2)
    q = q.view(b, t, heads, c // heads).transpose(1, 2)
    k = k.view(b, t, heads, c // heads).transpose(1, 2)
    v = v.view(b, t, heads, c // heads).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(b, t, c)


def block(x, p, prefix, c, heads):
    """Pre-LN transformer block: x + proj(attn(qkv(ln1 x))), then + fc2(gelu(fc(ln2 .)))."""
    g = lambda n: p[prefix + n]  # noqa: E731
    h = F.layer_norm(x, (c,), g("ln1.weight"), g("ln1.bias"), 1e-5)
    h = F.linear(attention(F.linear(h, g("qkv.weight"), g("qkv.bias")), heads), g("proj.weight"),
                 g("proj.bias"))
    r = x + h
    h = F.layer_norm(r, (c,), g("ln2.weight"), g("ln2.bias"), 1e-5)
    h = F.linear(F.gelu(F.linear(h, g("fc.weight"), g("fc.bias"))), g("fc2.weight"),
                 g("fc2.bias"))
    return r + h


def transformer():
    name = "graph_transformer"
    seed(name)
    b, t, c, heads = 2, 7, 8, 2
    p = params(block_params("", c))
    x = rnd(b, t, c).requires_grad_(True)
    finish(name, {"x": x}, p, block(x, p, "", c, heads))


def gpt_tied():
    """Token and position embeddings, one block, ln_f, and a head tied to wte."""
    name = "graph_gpt_tied"
    seed(name)
    b, t, c, heads, vocab = 2, 6, 8, 2, 13
    p = params([("wte.weight", (vocab, c), "w"), ("wpe.weight", (t, c), "w")] +
               block_params("h.", c) + [("ln_f.weight", (c,), "one"), ("ln_f.bias", (c,), "zero")])
    idx = torch.randint(0, vocab, (b, t), dtype=torch.int64)
    idx[0, 1] = idx[1, 4] = idx[0, 5]  # a repeated token: embedding rows add
    pos = torch.arange(t, dtype=torch.int64).repeat(b, 1)
    h = F.embedding(idx, p["wte.weight"]) + F.embedding(pos, p["wpe.weight"])
    h = block(h, p, "h.", c, heads)
    h = F.layer_norm(h, (c,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    y = F.linear(h, p["wte.weight"])  # the tied head
    finish(name, {"idx": idx, "pos": pos}, p, y)


def cnn_eval():
    """Evaluation mode: conv (3x2, groups 2, bias) - BatchNorm2d (running stats) - SiLU,
    fanned out to MaxPool2d (3x3, stride 2, pad 1) and AvgPool2d (same window), concat
    on channels, AdaptiveAvgPool2d (2, 2), Flatten, Linear, BatchNorm1d (running stats),
    Tanh, Linear; plus cross-entropy (ignore_index 2, label smoothing 0.1) of the output."""
    name = "graph_cnn_eval"
    seed(name)
    n, cin, h, w, k = 5, 4, 7, 6, 5
    p = params([("conv.weight", (6, 2, 3, 2), "w"), ("conv.bias", (6,), "zero"),
                ("bn.weight", (6,), "one"), ("bn.bias", (6,), "zero"),
                ("fc1.weight", (9, 48), "w"), ("fc1.bias", (9,), "zero"),
                ("bn1d.weight", (9,), "one"), ("bn1d.bias", (9,), "zero"),
                ("fc2.weight", (k, 9), "w"), ("fc2.bias", (k,), "zero")])
    b0 = {"bn.running_mean": rnd(6, scale=0.3), "bn.running_var": rnd(6, scale=0.2, shift=1.0),
          "bn1d.running_mean": rnd(9, scale=0.3),
          "bn1d.running_var": rnd(9, scale=0.2, shift=1.0)}
    x = rnd(n, cin, h, w).requires_grad_(True)
    t = F.conv2d(x, p["conv.weight"], p["conv.bias"], padding=(1, 0), groups=2)
    t = F.batch_norm(t, b0["bn.running_mean"], b0["bn.running_var"], p["bn.weight"],
                     p["bn.bias"], training=False, eps=1e-5)
    t = F.silu(t)
    t = torch.cat([F.max_pool2d(t, 3, 2, 1), F.avg_pool2d(t, 3, 2, 1)], dim=1)
    t = F.adaptive_avg_pool2d(t, (2, 2)).flatten(1)
    t = F.linear(t, p["fc1.weight"], p["fc1.bias"])
    t = F.batch_norm(t, b0["bn1d.running_mean"], b0["bn1d.running_var"], p["bn1d.weight"],
                     p["bn1d.bias"], training=False, eps=1e-5)
    y = F.linear(torch.tanh(t), p["fc2.weight"], p["fc2.bias"])
    target = torch.tensor([0, 2, 4, 1, 2], dtype=torch.int64)
    logits = y.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(logits, target, ignore_index=2, label_smoothing=0.1)
    loss.backward()
    extra = [("target", target), ("loss", loss.reshape(1)), ("dlogits", logits.grad)]
    extra += [("b0:" + k2, v) for k2, v in b0.items()]  # loaded before the forward
    finish(name, {"x": x}, p, y, list(b0.items()), extra)  # "b:": unchanged in evaluation


def main():
    cnn_eval()
    resblock()
    transformer()
    gpt_tied()


if __name__ == "__main__":
    main()
