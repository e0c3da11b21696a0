// ops.h: the kernels of the layers and losses, as pure functions over explicit shapes.
//
// Every tensor is float32, batch-major and row-major: (N, C, H, W) images, (N, F) flat
// rows, (B, T, C) sequences. The functions keep no state and allocate nothing: the
// caller passes the weights, the buffers forward saves for backward, and scratch (the
// *_scratch functions give its size, in floats), so any number of threads may call them
// at once on disjoint outputs. Backward WRITES the input gradients (dx, may be NULL when
// nobody needs it) and ADDS the parameter gradients (dw, db: the caller zeroes them once
// per step, and several calls accumulate, as torch's .grad does).
//
// Each op matches the PyTorch module or function named beside it (torch 1.13), checked by
// tests/golden (fixtures written by PyTorch) and tests/grad (finite differences). The
// *_init functions draw PyTorch's default initialisation from a dtrain stream.
//
// This header is internal: the model graph and the public layer interface wrap it.
#ifndef DTRAIN_NN_OPS_H
#define DTRAIN_NN_OPS_H

#include "dtrain/core.h"
#include "dtrain/rng.h"
#include "kernels/table.h"

// ------------------------------------------------------------------------------ Conv2d

// torch.nn.Conv2d(cin, cout, (kh, kw), stride=(sh, sw), padding=(ph, pw), groups=groups,
// bias=bias), dilation 1, zero padding. Weight (cout, cin/groups, kh, kw), bias (cout).
// y[n][o][i][j] = b[o] + sum over the group's input channels c and (ki, kj) of
// w[o][c][ki][kj] * x[n][g*cin/groups + c][i*sh - ph + ki][j*sw - pw + kj].
typedef dt_kconv dt_nn_conv2d; // (kernels/table.h: the kernels take it too)

// DT_ERR_ARG unless the sizes are positive, groups divides cin and cout, and the kernel
// fits the padded (h, w) input; sets *ho, *wo.
dt_status dt_nn_conv2d_check(const dt_nn_conv2d *p, int h, int w, int *ho, int *wo);
size_t    dt_nn_conv2d_weight_count(const dt_nn_conv2d *p);
// Scratch for forward and backward, in floats: one sample's column matrix.
size_t dt_nn_conv2d_scratch(const dt_nn_conv2d *p, int h, int w);
// PyTorch's reset_parameters: kaiming_uniform_(a=sqrt(5)) = U(-1/sqrt(fan_in), +), bias
// U(-1/sqrt(fan_in), +), fan_in = cin/groups*kh*kw. Weight first, then bias, from `rng`.
void dt_nn_conv2d_init(const dt_nn_conv2d *p, dt_rng *rng, float *w, float *b);
// x (n, cin, h, w) -> y (n, cout, ho, wo). b is ignored when !p->bias.
void dt_nn_conv2d_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                          const float *wt, const float *b, float *y, float *scratch);
// dx (n, cin, h, w) = (written, may be NULL); dw += ; db += (when p->bias).
void dt_nn_conv2d_backward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                           const float *wt, const float *dy, float *dx, float *dw, float *db,
                           float *scratch);

// The same in a 16-bit precision mode (prec.h's autocast: wt16 is the weight's shadow,
// or NULL to round it per call), on the im2col path; fp32 is the functions above.
// DT_ERR_NOMEM when an fp16 temporary cannot be had.
dt_status dt_nn_conv2d_forward_prec(const dt_nn_conv2d *p, dt_precision prec, const void *wt16,
                                    int n, int h, int w, const float *x, const float *wt,
                                    const float *b, float *y, float *scratch);
dt_status dt_nn_conv2d_backward_prec(const dt_nn_conv2d *p, dt_precision prec, const void *wt16,
                                     int n, int h, int w, const float *x, const float *wt,
                                     const float *dy, float *dx, float *dw, float *db,
                                     float *scratch);
// Which kernel dt_nn_conv2d_forward (backward false) or _backward (input_grad: dx wanted)
// runs for this shape (w the input's width), as --profile names it: "conv2d fwd:
// avx512/channels-in-lanes", "conv2d bwd: avx512/direct" (the shifted GEMMs), "conv2d
// fwd: avx2/im2col" (im2col and the sgemm row), the target being the one that filled
// the row doing the work; into buf, which it returns.
const char *dt_nn_conv2d_kernel(const dt_nn_conv2d *p, int w, bool backward, bool input_grad,
                                char *buf, size_t n);

// ------------------------------------------------------------------------------ Linear

// torch.nn.Linear(in, out, bias): y (n, out) = x (n, in) W^T + b, W (out, in), b (out).
// Init as Conv2d with fan_in = in. b NULL: no bias.
void dt_nn_linear_init(int in, int out, dt_rng *rng, float *w, float *b);
void dt_nn_linear_forward(int n, int in, int out, const float *x, const float *w, const float *b,
                          float *y);
// dx = dy W (written, may be NULL); dw += dy^T x; db += sum over rows of dy (db NULL: none).
void dt_nn_linear_backward(int n, int in, int out, const float *x, const float *w, const float *dy,
                           float *dx, float *dw, float *db);
// The same in a 16-bit precision mode (w16: the weight's shadow, or NULL).
dt_status dt_nn_linear_forward_prec(dt_precision prec, const void *w16, int n, int in, int out,
                                    const float *x, const float *w, const float *b, float *y);
dt_status dt_nn_linear_backward_prec(dt_precision prec, const void *w16, int n, int in, int out,
                                     const float *x, const float *w, const float *dy, float *dx,
                                     float *dw, float *db);
// db += the column sums of dy (n, out), summed in double.
void dt_nn_linear_bias_grad(int n, int out, const float *dy, float *db);
// bf16 with bf16 copies of the activations (linear16.c): forward rounds x into x16 (n, in)
// and multiplies that; backward reads the same x16 and rounds dy into dy16 (chunk * out
// values) chunk rows at a time, for both products of the chunk.
dt_status dt_nn_linear16_forward(const uint16_t *w16, int n, int in, int out, const float *x,
                                 uint16_t *x16, const float *b, float *y);
dt_status dt_nn_linear16_backward(const uint16_t *w16, int n, int in, int out, const uint16_t *x16,
                                  const float *dy, uint16_t *dy16, int chunk, float *dx, float *dw,
                                  float *db);
// The rows of output gradient linear16 rounds at a time (its scratch: that many x out).
#define DT_NN_LINEAR16_CHUNK 1024

// --------------------------------------------------------------------------- BatchNorm

// torch.nn.BatchNorm1d(c) on (n, c) or (n, c, l), BatchNorm2d(c) on (n, c, h, w) as
// l = h*w: eps 1e-5, momentum 0.1, affine (gamma 1, beta 0 at init), running mean 0 and
// running var 1 (buffers, not parameters). Training normalises with the batch's mean
// and biased variance over the m = n*l values of a channel and moves the running
// statistics toward the mean and the unbiased variance (m/(m-1)):
//     running = (1 - momentum) * running + momentum * batch.
// Evaluation normalises with the running statistics.
//
// Training forward is split so SyncBatchNorm can all-reduce between the steps:
//   1. dt_nn_bn_stats: per channel sum and sum of squared deviations of the local x;
//   2. (SyncBatchNorm: all-reduce the sums and the count m for the mean, then the
//      squared deviations from that mean: layers/batchnorm.c)
//   3. dt_nn_bn_moments: mean and 1/sqrt(var + eps) (saved for backward), running stats;
//   4. dt_nn_bn_apply: y = (x - mean) * invstd * gamma + beta.
// Backward likewise: dt_nn_bn_backward_stats (per channel sum of dy and of dy * xhat),
// all-reduce, dt_nn_bn_backward_apply. dt_nn_bn_forward / _backward do it all locally.
// The _range and _rows forms do a part (channels [c0, c1); rows [r0, r1) of the n*c rows
// of l values), so threads can share one call: every channel's sums are added in the
// same order whatever the split. Their _ex options fuse what follows a BatchNorm in a
// ResNet: a residual added and a ReLU (y = max(0, bn(x) + res)), whose backward takes
// the output y (the gradient reaching the normalisation is y > 0 ? dy : 0, and the
// residual's gradient dres is that same value).
typedef struct dt_nn_bn {
    int   c;
    float eps, momentum;
    bool  affine;
} dt_nn_bn;

dt_nn_bn dt_nn_bn_default(int c);
// gamma 1, beta 0, running_mean 0, running_var 1 (no random draw).
void dt_nn_bn_init(const dt_nn_bn *p, float *gamma, float *beta, float *running_mean,
                   float *running_var);
// sum[c] = sum of x over (n, l); m2[c] = sum of (x - mean)^2, the squared deviations
// from the channel's mean (both in double; never E[x^2] - E[x]^2, which cancels when the
// mean is large against the spread). The _range form writes channels [c0, c1) to
// sum[0 .. c1 - c0) and m2 likewise.
void dt_nn_bn_stats(int n, int c, int l, const float *x, double *sum, double *m2);
void dt_nn_bn_stats_range(int n, int c, int c0, int c1, int l, const float *x, double *sum,
                          double *m2);
// From the totals over `count` values per channel: mean, invstd; running stats updated
// when running_mean is not NULL.
void dt_nn_bn_moments(const dt_nn_bn *p, double count, const double *sum, const double *m2,
                      float *mean, float *invstd, float *running_mean, float *running_var);
// Evaluation: mean = running_mean, invstd = 1/sqrt(running_var + eps).
void dt_nn_bn_eval_moments(const dt_nn_bn *p, const float *running_mean, const float *running_var,
                           float *mean, float *invstd);
// y = (x - mean) * invstd * gamma + beta; gamma, beta NULL when !affine.
void dt_nn_bn_apply(int n, int c, int l, const float *x, const float *mean, const float *invstd,
                    const float *gamma, const float *beta, float *y);
// Rows [r0, r1) of it, + res (NULL: none), then ReLU when relu.
void dt_nn_bn_apply_rows(int n, int c, int l, int r0, int r1, const float *x, const float *mean,
                         const float *invstd, const float *gamma, const float *beta,
                         const float *res, bool relu, float *y);
// All of the above on one process. mean, invstd (c each) are saved for backward.
void dt_nn_bn_forward(const dt_nn_bn *p, int n, int l, bool training, const float *x,
                      const float *gamma, const float *beta, float *running_mean,
                      float *running_var, float *mean, float *invstd, float *y);
// sum_dy[c] = sum of dy, sum_dyx[c] = sum of dy * (x - mean) * invstd, over (n, l).
void dt_nn_bn_backward_stats(int n, int c, int l, const float *x, const float *dy,
                             const float *mean, const float *invstd, float *sum_dy, float *sum_dyx);
// A ReLU after the normalisation (the fused forms): its mask y > 0 comes from the
// forward's output y, or, with y NULL, from x again: x * scale + shift > 0 with the
// forward's gamma and beta and the forward's own multiply-add (x is read anyway, so
// one stream fewer; only without a residual, which would have to be read instead).
typedef dt_kbn_relu dt_nn_bn_relu; // {y, gamma, beta} (kernels/table.h)
// Channels [c0, c1) of it, behind a ReLU (NULL: none); dres (NULL: not wanted) receives
// the gradient reaching the normalisation (a residual's gradient).
void dt_nn_bn_backward_stats_ex(int n, int c, int c0, int c1, int l, const float *x,
                                const float *dy, const dt_nn_bn_relu *relu, const float *mean,
                                const float *invstd, float *sum_dy, float *sum_dyx, float *dres);
// Training: dx = gamma invstd (dy - sum_dy/count - xhat sum_dyx/count);
// evaluation (count 0): dx = gamma invstd dy, the statistics being constants.
void dt_nn_bn_backward_apply(int n, int c, int l, const float *x, const float *dy,
                             const float *mean, const float *invstd, const float *gamma,
                             const float *sum_dy, const float *sum_dyx, double count, float *dx);
// Rows [r0, r1) of it, behind a ReLU (NULL: none).
void dt_nn_bn_backward_apply_rows(int n, int c, int l, int r0, int r1, const float *x,
                                  const float *dy, const dt_nn_bn_relu *relu, const float *mean,
                                  const float *invstd, const float *gamma, const float *sum_dy,
                                  const float *sum_dyx, double count, float *dx);
// Local backward: dx written (may be NULL), dgamma += sum_dyx, dbeta += sum_dy.
// scratch: 2*c floats.
void dt_nn_bn_backward(const dt_nn_bn *p, int n, int l, bool training, const float *x,
                       const float *dy, const float *mean, const float *invstd, const float *gamma,
                       float *dx, float *dgamma, float *dbeta, float *scratch);

// --------------------------------------------------------------------------- LayerNorm

// torch.nn.LayerNorm(d, eps=1e-5, elementwise_affine): over the last dimension of
// (rows, d): y = (x - mean) * rstd * gamma + beta, rstd = 1/sqrt(biased var + eps).
// gamma 1, beta 0 at init; NULL when not affine. mean, rstd (rows) saved for backward.
void dt_nn_layernorm_init(int d, float *gamma, float *beta);
void dt_nn_layernorm_forward(int rows, int d, float eps, const float *x, const float *gamma,
                             const float *beta, float *y, float *mean, float *rstd);
// dx written (may be NULL); dgamma += sum dy*xhat, dbeta += sum dy (NULL: not affine).
void dt_nn_layernorm_backward(int rows, int d, const float *x, const float *gamma,
                              const float *mean, const float *rstd, const float *dy, float *dx,
                              float *dgamma, float *dbeta);

// --------------------------------------------------------------------------- Embedding

// torch.nn.Embedding(num, d): y[i] = W[idx[i]], W (num, d) ~ N(0, 1) at init.
// DT_ERR_ARG naming the position when an index is outside [0, num).
void      dt_nn_embedding_init(int num, int d, dt_rng *rng, float *w);
dt_status dt_nn_embedding_forward(int count, int num, int d, const int32_t *idx, const float *w,
                                  float *y);
// dw[idx[i]] += dy[i] (indices already checked by forward).
void dt_nn_embedding_backward(int count, int d, const int32_t *idx, const float *dy, float *dw);

// --------------------------------------------------------------- element-wise and softmax

// torch.nn.GELU(approximate='none'): x * Phi(x) = x/2 (1 + erf(x/sqrt 2)); 'tanh':
// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Backward from x.
void dt_nn_gelu_forward(size_t n, bool tanh_approx, const float *x, float *y);
void dt_nn_gelu_backward(size_t n, bool tanh_approx, const float *x, const float *dy, float *dx);
// torch.nn.ReLU: y = x > 0 ? x : 0; backward from the output y:
// dx = y > 0 ? dy : 0. Both may run in place (y == x, dx == dy).
void dt_nn_relu_forward(size_t n, const float *x, float *y);
void dt_nn_relu_grad(size_t n, const float *y, const float *dy, float *dx);
// torch.nn.Tanh, torch.nn.Sigmoid: backward from the output y.
void dt_nn_tanh_forward(size_t n, const float *x, float *y);
void dt_nn_tanh_backward(size_t n, const float *y, const float *dy, float *dx);
void dt_nn_sigmoid_forward(size_t n, const float *x, float *y);
void dt_nn_sigmoid_backward(size_t n, const float *y, const float *dy, float *dx);
// torch.nn.SiLU: x sigmoid(x). Backward from x.
void dt_nn_silu_forward(size_t n, const float *x, float *y);
void dt_nn_silu_backward(size_t n, const float *x, const float *dy, float *dx);
// torch.nn.Softmax(dim=-1) on (rows, d); backward from y: dx = y (dy - sum(dy y)).
void dt_nn_softmax_forward(int rows, int d, const float *x, float *y);
void dt_nn_softmax_backward(int rows, int d, const float *y, const float *dy, float *dx);
// Residual add y = a + b; its backward is da = db = dy. A tensor read by several ops
// (fan-out) gets the sum of their gradients: dst += src.
void dt_nn_add_forward(size_t n, const float *a, const float *b, float *y);
void dt_nn_accumulate(size_t n, const float *src, float *dst);

// ----------------------------------------------------------------------------- Pooling

// torch.nn.AvgPool2d((kh, kw), stride=(sh, sw), padding=(ph, pw)), ceil_mode False,
// count_include_pad True (the divisor is always kh*kw). No parameters.
typedef struct dt_nn_avgpool2d {
    int kh, kw, sh, sw, ph, pw;
} dt_nn_avgpool2d;

// DT_ERR_ARG unless sizes are positive, padding <= half the kernel (as torch), and a
// window fits; sets *ho, *wo.
dt_status dt_nn_avgpool2d_check(const dt_nn_avgpool2d *p, int h, int w, int *ho, int *wo);
void dt_nn_avgpool2d_forward(const dt_nn_avgpool2d *p, int n, int c, int h, int w, const float *x,
                             float *y);
void dt_nn_avgpool2d_backward(const dt_nn_avgpool2d *p, int n, int c, int h, int w, const float *dy,
                              float *dx);
// torch.nn.AdaptiveAvgPool2d((ho, wo)): output cell (i, j) averages rows
// [floor(i h/ho), ceil((i+1) h/ho)) and the columns likewise. (1, 1) is a global mean.
void dt_nn_adaptive_avgpool2d_forward(int n, int c, int h, int w, int ho, int wo, const float *x,
                                      float *y);
void dt_nn_adaptive_avgpool2d_backward(int n, int c, int h, int w, int ho, int wo, const float *dy,
                                       float *dx);

// -------------------------------------------------------- causal multi-head attention

// The attention of a GPT block (torch: q, k, v viewed as (B, H, T, d), d = C/H, then
// softmax((q k^T / sqrt(d)).masked_fill(causal mask, -inf)) v, transposed back to
// (B, T, C), as bench/peer's gpt_bytes.py writes it):
//     y[b, t, h*d:(h+1)*d] = sum over s <= t of softmax_s(q_t . k_s / sqrt(d)) v_s.
// q, k, v rows are `ld` floats apart (ld = C for separate tensors, 3C for the packed
// output of c_attn with k = q + C, v = q + 2C); y and dy are (B, T, C).
// Computed blockwise with an online softmax: forward holds one block x block tile of
// scores at a time (never the T x T matrix) and saves the log-sum-exp of each row,
// lse (B, H, T); backward recomputes the probabilities tile by tile (flash attention),
// holding two tiles (probabilities and their gradient). Scratch is per call: threads
// that split (sample, head) pairs each need their own. Single-threaded per call.
int dt_nn_attn_block(void); // the tile size, 64
// DT_ERR_ARG unless B, T, C, H >= 1, H divides C and ld >= C.
dt_status dt_nn_attn_check(int B, int T, int C, int H, int ld);
size_t    dt_nn_attn_scratch(int d);
void      dt_nn_attn_forward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                             const float *v, float *y, float *lse, float *scratch);
// dq, dk, dv (row stride ld) are written; dq may share the packed buffer with dk, dv.
void dt_nn_attn_backward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                         const float *v, const float *y, const float *lse, const float *dy,
                         float *dq, float *dk, float *dv, float *scratch);

// The same with the products in bf16 (attn16.c; torch.autocast's bmm): on the
// avx512bf16 path when d = C/H is a multiple of 16 (dt_nn_attn16_ok), scratch of
// dt_nn_attn16_scratch(T, d) floats; the softmax, lse and gradients stay fp32.
bool   dt_nn_attn16_ok(int C, int H);
size_t dt_nn_attn16_scratch(int T, int d);
void   dt_nn_attn16_forward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                            const float *v, float *y, float *lse, float *scratch);
void   dt_nn_attn16_backward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                             const float *v, const float *y, const float *lse, const float *dy,
                             float *dq, float *dk, float *dv, float *scratch);

// ------------------------------------------------------------------------------ Losses

// Each returns the mean loss and writes its gradient (d loss / d x) into dx when not
// NULL; the sums run in double.
// torch.nn.MSELoss: mean (x - t)^2.
float dt_nn_mse_loss(size_t n, const float *x, const float *t, float *dx);
// torch.nn.L1Loss: mean |x - t|; the gradient at x == t is 0, as torch's sign().
float dt_nn_l1_loss(size_t n, const float *x, const float *t, float *dx);
// torch.nn.BCEWithLogitsLoss: mean of max(x, 0) - x t + log(1 + exp(-|x|)).
float dt_nn_bce_logits_loss(size_t n, const float *x, const float *t, float *dx);
// torch.nn.CrossEntropyLoss(ignore_index, label_smoothing) over logits (n, k) and class
// targets (n): per row (1 - ls) (-log p[target]) + ls/k sum_j (-log p[j]); rows whose
// target is ignore_index count for nothing; the mean divides by the rows that count.
// When every row is ignored torch returns NaN; this returns loss 0 and a zero gradient.
// DT_ERR_ARG naming the row when a target is outside [0, k) and not ignore_index.
dt_status dt_nn_cross_entropy(int n, int k, const float *logits, const int32_t *target,
                              int ignore_index, float label_smoothing, float *loss, float *dlogits);

#endif // DTRAIN_NN_OPS_H
