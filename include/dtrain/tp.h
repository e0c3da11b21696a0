// tp.h: tensor (intra-layer) parallelism, Megatron-LM style, over a process group (a
// dt_mesh's tp group, or any dt_pg). The shards are layers (layer.h:
// dt_layer_linear_tp_new); this module gives them their all-reduce and builds the two
// blocks Megatron splits:
//
//   MLP        fc (column: c -> hidden/tp) -> GELU -> fc2 (row: hidden/tp -> c)
//   attention  qkv (column, q|k|v of this rank's heads) -> attention (heads/tp)
//              -> proj (row: c/tp -> c)
//
// Each costs one all-reduce of the (rows, c) activations in forward (fc2's / proj's
// output) and one in backward (fc's / qkv's input gradient). Every rank of the group
// holds 1/tp of the block's weights and computes the same outputs and input gradients
// as the unsplit block, to rounding; its weight gradients are its slices of the unsplit
// ones. Layers outside these blocks (LayerNorm, embeddings, the head) are replicated:
// every rank computes them alike.
#ifndef DTRAIN_TP_H
#define DTRAIN_TP_H

#include "dtrain/comm.h"
#include "dtrain/graph.h"
#include "dtrain/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Sets opts->reduce to a sum (all_reduce) over `pg` (borrowed: it must outlive the
// layers). The sums are collective over pg: every rank runs the same graph.
DT_API void dt_tp_sum_opts(dt_linear_tp_opts *opts, dt_pg *pg);

// Adds <prefix>fc, <prefix>gelu (tanh approximation when gelu_tanh) and <prefix>fc2
// reading `in` (.., c): the MLP c -> hidden -> c split over pg (hidden divisible by its
// size). The output node is <prefix>fc2.
DT_API dt_status dt_tp_mlp_add(dt_graph *g, const char *prefix, const char *in, int c, int hidden,
                               bool gelu_tanh, dt_pg *pg);
// Adds <prefix>qkv, <prefix>attn and <prefix>proj reading `in` (T, c): causal
// self-attention with `heads` heads split over pg (heads divisible by its size). The
// output node is <prefix>proj.
DT_API dt_status dt_tp_attention_add(dt_graph *g, const char *prefix, const char *in, int c,
                                     int heads, dt_pg *pg);

// Megatron's vocabulary-parallel cross-entropy: nn.CrossEntropyLoss(ignore_index)
// (the mean over the rows whose target is not ignored) of logits split over pg by
// columns. `logits` (n, vocab / size) holds this rank's columns [rank * vocab / size,
// ...): a column-parallel head's output (dt_layer_linear_tp_new, or the head tied to a
// dt_layer_embedding_tp_new). Two all-reduces of n and 2n floats (the rows' maximum;
// their sums of exponentials and the target logits) instead of gathering n x vocab
// logits. *loss is the same on every rank; dlogits (n, vocab / size; may be NULL) gets
// this rank's columns of the unsplit loss's gradient. COLLECTIVE over pg (NULL: the
// whole vocabulary here, as dt_loss_cross_entropy_ex).
DT_API dt_status dt_tp_cross_entropy(dt_pg *pg, const float *logits, const int32_t *target, int n,
                                     int vocab, int ignore_index, float *loss, float *dlogits);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_TP_H
