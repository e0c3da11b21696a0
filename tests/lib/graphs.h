// graphs.h: the model graphs the graph tests share (golden, gradients, DDP, checkpoints).
// Node names match tests/golden/gen_graph.py's parameter names.
#ifndef DTRAIN_TESTS_GRAPHS_H
#define DTRAIN_TESTS_GRAPHS_H

#include "dtrain/graph.h"

// A ResNet basic block on input "x" (c, h, w): conv1 (3x3, pad 1, no bias), bn1, relu1,
// conv2, bn2, add (+ x), out (ReLU). bn may be NULL (defaults).
dt_status tg_resblock(dt_graph *g, int c, int h, int w, const dt_batchnorm_opts *bn);
// A pre-LN transformer block reading node or input `in` (t, c), nodes named
// <prefix>ln1, qkv, attn, proj, r1 (residual), ln2, fc, gelu, fc2, out (residual).
dt_status tg_block(dt_graph *g, const char *prefix, const char *in, int c, int heads);
// Inputs "idx", "pos" (t, int32); wte (vocab, c), wpe (t, c), emb = add; with drop > 0
// a Dropout "drop"; a block "h."; ln_f; head (Linear c -> vocab, no bias) tied to wte.
dt_status tg_gpt(dt_graph *g, int t, int c, int heads, int vocab, float drop);

#endif
