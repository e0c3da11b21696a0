// kernels.h: the plugin's own kernels, as C launchers (k_*.cu). Each queues its kernel
// on stream s and returns the launch's status (cudaGetLastError), so a caller checks
// it with CU_RT and the message names the kernel. Tensors are row-major float32 as
// in the CPU's ops.h; `acc` says whether an input gradient is added to (another
// reader of the value wrote it first: fan-out) or written; parameter gradients are
// always added to. Every reduction runs in a fixed order (no atomics on floats), so a
// step is deterministic for a given batch and device.
#ifndef DTRAIN_CUDA_KERNELS_H
#define DTRAIN_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ------------------------------------------------------------ element-wise (k_elem.cu)
// The activations, in graph.h's order: relu, gelu, gelu_tanh, tanh, sigmoid, silu.
enum { K_RELU, K_GELU, K_GELU_TANH, K_TANH, K_SIGMOID, K_SILU };
cudaError_t k_fill(cudaStream_t s, float *y, float v, size_t n);
// y = x (acc: y += x)
cudaError_t k_copy(cudaStream_t s, float *y, const float *x, size_t n, bool acc);
// y = a + b
cudaError_t k_add(cudaStream_t s, float *y, const float *a, const float *b, size_t n);
cudaError_t k_scale(cudaStream_t s, float *x, float f, size_t n);
cudaError_t k_act_forward(cudaStream_t s, int act, const float *x, float *y, size_t n);
// dx (=|+=) dy * act'(x): relu, tanh and sigmoid read the output y, the others x.
cudaError_t k_act_backward(cudaStream_t s, int act, const float *x, const float *y, const float *dy,
                           float *dx, size_t n, bool acc);
// y (rows, cols) += b[col]
cudaError_t k_bias_rows(cudaStream_t s, float *y, const float *b, size_t rows, int cols);
// db[c] += sum over rows of y[r][c]
cudaError_t k_col_sums(cudaStream_t s, const float *y, size_t rows, int cols, float *db);
// db[r] += sum over cols of y[r][c] (one row per block)
cudaError_t k_row_sums(cudaStream_t s, const float *y, int rows, size_t cols, float *db);
// bf16 copies (round to nearest even, as the CPU's prec.h), and bf16 -> float.
cudaError_t k_to_bf16(cudaStream_t s, const float *x, uint16_t *y, size_t n);

// ------------------------------------------------------------- convolution (k_conv.cu)
// The convolution as one matrix product over the whole batch: col (K, N*P) with K =
// cin kh kw and P = ho wo the output's pixels, column n*P + p holding sample n's
// window at pixel p (zeros where it hits padding); the product's result Yt (cout, N*P).
typedef struct k_conv {
    int  n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, ho, wo;
    bool bias, relu, pool2; // pool2: a 2x2 stride-2 max pool of the ReLU's output
} k_conv;
cudaError_t k_im2col(cudaStream_t s, const k_conv *c, const float *x, float *col);
// dx (=|+=) the adjoint of im2col of dcol, gathered per input pixel.
cudaError_t k_col2im(cudaStream_t s, const k_conv *c, const float *dcol, float *dx, bool acc);
// Yt (cout, N*P) + bias, ReLU, 2x2 max pool -> y (N, cout, ho', wo'); arg (N, cout,
// ho/2, wo/2) bytes: the window's winner (0..3, ties to the first in row-major order).
cudaError_t k_conv_out(cudaStream_t s, const k_conv *c, const float *yt, const float *bias,
                       float *y, uint8_t *arg);
// The reverse: dy (N, cout, ho', wo') -> dYt (cout, N*P) through the pool's winners and
// the ReLU's mask (the output y > 0).
cudaError_t k_conv_dout(cudaStream_t s, const k_conv *c, const float *dy, const float *y,
                        const uint8_t *arg, float *dyt);

// ---------------------------------------------------------------- pooling (k_pool.cu)
typedef struct k_pool {
    int planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw;
} k_pool;
// Max: arg holds the winner's index in its plane (-1 when the window is all padding);
// ties to the first maximum in row-major order; a NaN wins.
cudaError_t k_maxpool_forward(cudaStream_t s, const k_pool *p, const float *x, float *y,
                              int32_t *arg);
cudaError_t k_maxpool_backward(cudaStream_t s, const k_pool *p, const float *dy, const int32_t *arg,
                               float *dx, bool acc);
// Average with the padding counted (count_include_pad); adaptive when adaptive is set
// (kernel, stride and padding unused).
cudaError_t k_avgpool_forward(cudaStream_t s, const k_pool *p, bool adaptive, const float *x,
                              float *y);
cudaError_t k_avgpool_backward(cudaStream_t s, const k_pool *p, bool adaptive, const float *dy,
                               float *dx, bool acc);

// ---------------------------------------------------------------- random (k_rand.cu)
// Dropout: sample n's stream is split(node key, keys ? keys[n] : n) (rng.h), element i
// of a unit takes word i of it (Philox4x32-10, counter i / 4), kept when its 24-bit
// uniform is >= p; units are elements (per = 1) or channels (per = plane size).
// mask[n][u] = kept ? 1/(1-p) : 0; y = x * mask.
cudaError_t k_dropout_forward(cudaStream_t s, const uint64_t *node_key, const uint64_t *keys, int n,
                              size_t units, size_t per, float p, const float *x, float *y,
                              float *mask);
cudaError_t k_dropout_backward(cudaStream_t s, int n, size_t units, size_t per, const float *mask,
                               const float *dy, float *dx, bool acc);
// The stream keys of n samples into out (tests compare them with dt_rng_split).
cudaError_t k_split_keys(cudaStream_t s, const uint64_t *node_key, const uint64_t *keys, int n,
                         uint64_t *out);

// ---------------------------------------------------- softmax and losses (k_loss.cu)
// Over rows of d: y = x - logsumexp(x) (log) or softmax.
cudaError_t k_softmax_forward(cudaStream_t s, bool log, int rows, int d, const float *x, float *y);
// log: dx = dy - e^y sum(dy); else dx = y (dy - sum(dy y)).
cudaError_t k_softmax_backward(cudaStream_t s, bool log, int rows, int d, const float *y,
                               const float *dy, float *dx, bool acc);
// The losses write their gradient (times scale) into dx and the mean loss into *loss
// (device), all rows summed in double in a fixed order.
cudaError_t k_nll_loss(cudaStream_t s, int rows, int k, const float *logp, const int32_t *t,
                       float scale, float *dx, float *loss, double *work);
cudaError_t k_cross_entropy(cudaStream_t s, int rows, int k, const float *x, const int32_t *t,
                            int ignore, float smoothing, float scale, float *dx, float *loss,
                            double *work);
cudaError_t k_mse_loss(cudaStream_t s, size_t n, const float *x, const float *t, float scale,
                       float *dx, float *loss, double *work);
// Doubles the loss kernels need for their partial sums.
size_t k_loss_work(size_t rows);

// ------------------------------------------------------------- norms (k_norm.cu)
// BatchNorm over (n, c, l): training statistics (biased variance, in double), the
// running ones updated with the unbiased variance; mean, invstd saved (c each).
typedef struct k_bn {
    int   n, c, l;
    float eps, momentum;
    bool  training, relu, residual;
} k_bn;
cudaError_t k_bn_forward(cudaStream_t s, const k_bn *b, const float *x, const float *gamma,
                         const float *beta, const float *res, float *rmean, float *rvar,
                         float *mean, float *invstd, float *y);
// dx (=|+=), dres (=|+=, the residual's gradient), dgamma += , dbeta += ; work: 2c floats.
cudaError_t k_bn_backward(cudaStream_t s, const k_bn *b, const float *x, const float *y,
                          const float *dy, const float *gamma, const float *mean,
                          const float *invstd, float *dx, bool acc, float *dres, bool res_acc,
                          float *dgamma, float *dbeta, float *work);
// LayerNorm over rows of d; mean, rstd (rows) saved.
cudaError_t k_ln_forward(cudaStream_t s, int rows, int d, float eps, const float *x,
                         const float *gamma, const float *beta, float *y, float *mean, float *rstd);
// dx (=|+=); dgamma, dbeta += the column sums of (dy xhat, dy), by way of part sums
// in work (blocks x 2d floats, k_ln_work) summed in a fixed order.
cudaError_t k_ln_backward(cudaStream_t s, int rows, int d, const float *x, const float *gamma,
                          const float *mean, const float *rstd, const float *dy, float *dx,
                          bool acc, float *dgamma, float *dbeta, float *work);
size_t      k_ln_work(int rows, int d); // floats

// ------------------------------------------------------------- embedding (k_embed.cu)
// y[i] = w[idx[i]]; dw[r] += the sum of dy[i] over the i with idx[i] = r, in order of i.
cudaError_t k_embed_forward(cudaStream_t s, size_t count, int d, const int32_t *idx, const float *w,
                            float *y);
cudaError_t k_embed_backward(cudaStream_t s, size_t count, int num, int d, const int32_t *idx,
                             const float *dy, float *dw);

// ----------------------------------------------------------- attention (k_attn.cu)
// Causal multi-head attention on packed (B, T, 3C) q|k|v rows -> (B, T, C), as
// ops.h's dt_nn_attn_*: lse (B, H, T) saved; backward writes dqkv (B, T, 3C)
// (=|+=). d = C/H <= 128. work: k_attn_work floats.
cudaError_t k_attn_forward(cudaStream_t s, int B, int T, int C, int H, const float *qkv, float *y,
                           float *lse);
cudaError_t k_attn_backward(cudaStream_t s, int B, int T, int C, int H, const float *qkv,
                            const float *y, const float *lse, const float *dy, float *dqkv,
                            bool acc, float *work);
size_t      k_attn_work(int B, int T, int C, int H);

// --------------------------------------------------------------- optimizers (k_optim.cu)
cudaError_t k_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr,
                  float wd, float momentum, float dampening, bool nesterov, bool first);
cudaError_t k_adam(cudaStream_t s, float *p, const float *g, float *m, float *v, float *vmax,
                   size_t n, float wd, float b1, float b2, float eps, float step_size,
                   float bc2_sqrt, float decay);
cudaError_t k_adadelta(cudaStream_t s, float *p, const float *g, float *sq, float *acc, size_t n,
                       float lr, float wd, float rho, float eps);
// Sum of squares of x[0..n) added to *sum (double), by blocks in a fixed order; work:
// k_sumsq_work doubles.
cudaError_t k_sumsq(cudaStream_t s, const float *x, size_t n, double *sum, double *work);
size_t      k_sumsq_work(void);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_CUDA_KERNELS_H
