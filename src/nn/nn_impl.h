// nn_impl.h: what src/nn's layers and kernels share: the fused convolution's
// configuration and per-thread context (layers/conv_fused.h runs it as a team layer,
// layers/conv_team.c and pool_team.c are its kernels), the gradient-shard constants,
// and kernels several layers call.
//
// Threads split a batch by samples: thread t owns samples [s0, s1). Forward never
// needs the threads to meet, since every layer here treats samples independently.
#ifndef DTRAIN_NN_IMPL_H
#define DTRAIN_NN_IMPL_H

#include "dtrain/nn.h"
#include "nn/pool.h"

typedef struct nn_shape {
    int c, h, w; // per sample; flat tensors are (f, 1, 1)
} nn_shape;

static inline size_t nn_shape_size(nn_shape s) {
    return (size_t)s.c * (size_t)s.h * (size_t)s.w;
}

typedef struct nn_layer nn_layer;

// What a layer's forward or backward sees, per thread.
typedef struct nn_ctx {
    int             ith, nth; // this thread, of nth
    int             s0, s1;   // the samples this thread owns: s0, s0 + sstep, ... < s1
    int             sstep;    // 1, or (conv backward with gradient shards) the shard count
    int             shards;   // gradient shards (dt_model_set_grad_shards), 0: off
    int             batch;
    bool            training;
    dt_pool        *pool;    // for layers that must meet inside backward
    float          *scratch; // this thread's scratch, layer->scratch_floats long
    const dt_rng   *rng;     // this step's stream, already split by layer index
    const uint64_t *keys;    // (batch) sample s draws from split(rng, keys[s]); NULL: from
                             // split(rng, s)
} nn_ctx;

// Gradient shards (dt_graph_set_grad_shards: sample s of a batch belongs to shard
// s % S) and how layers form them: layer.h's dt_layer_grad. The fused convolution's
// gradient is partial: its backward is called once per shard, with s0 = the shard,
// sstep = S and its own zeroed dparams, and adds the shard's samples in increasing
// order; the graph combines the shards by the tree of dt_nn_shard_tree.
#define NN_MAX_SHARDS 64
// Tiles of a linear weight gradient formed per shard at a time (scratch per shard:
// rows x cols floats; one vector block of shifted.c).
#define NN_SHARD_ROWS 8
#define NN_SHARD_COLS 48

struct nn_layer {
    int      index;
    nn_shape in, out;
    // hyper-parameters
    int   out_c; // conv: out channels; linear: out features
    int   k, stride, pad;
    float p; // dropout probability
    // parameters: weight then bias, as slices of the flat buffers
    int     nparams; // 0 or 2
    int     wndim;
    int64_t wshape[4];
    int64_t bcount;
    size_t  wcount;
    size_t  param_off; // floats into the flat buffers
    size_t  param_count;
    float  *w, *b; // views into the flat parameter buffer (after finalize)
    size_t  fan_in;
    // per-thread scratch and per-sample saved state
    size_t    scratch_floats;
    size_t    aux_per_sample;    // bytes
    size_t    shard_scratch;     // floats of scratch per gradient shard (linear), when sharded
    uint8_t  *aux;               // batch * aux_per_sample, owned by the model
    bool      last_training;     // the mode of the last forward (dropout backward uses it)
    bool      fuse_relu;         // conv: applies the next layer's ReLU itself
    nn_layer *pool;              // conv: the 2x2/2 max pool after that ReLU, computed by the
                                 // convolution itself (NULL: none); its output and winner
                                 // indices are the pool layer's
    bool         direct;         // conv: shifted-GEMM kernels instead of im2col + OpenBLAS
    bool         direct16;       // conv in bf16: conv16.c's kernels (on the avx512bf16 path)
    int         *offsets;        // conv (direct): row offsets of the shifted operands, owned
    bool         skip;           // done by an earlier layer (fusion): the model never calls it
    dt_precision prec;           // conv, linear: dt_model_set_precision's mode
    void        *w16;            // its weight shadow (prec.h), made once per forward; owned
    bool         lowp_failed;    // a 16-bit product could not get memory (forward, backward)
    double       flops;          // forward, per sample
    uint64_t     fwd_ns, bwd_ns; // profile, thread 0
};

// The fused convolution's kernels (conv_team.c) and its pool's shape (pool_team.c):
// setup checks l->in and fills l->out, the parameter shapes, scratch and saved sizes;
// forward and backward run this thread's samples (c). Backward may overwrite dout;
// dparams: weight then bias, where this call ADDS (a partial gradient).
dt_status dt_team_conv_setup(nn_layer *l);
void      dt_team_conv_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out);
void      dt_team_conv_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                                float *dout, float *din, float *dparams);
dt_status dt_team_pool_setup(nn_layer *l);

// Kernels shared by layers (kernels.c).
// (C, H, W) image -> (C*k*k, Ho*Wo) columns, zero where the window hits padding.
void dt_nn_im2col(const float *img, int c, int h, int w, int k, int stride, int pad, int ho, int wo,
                  float *col);
// Adds columns back into a zeroed (C, H, W) image: the adjoint of im2col.
void dt_nn_col2im(const float *col, int c, int h, int w, int k, int stride, int pad, int ho, int wo,
                  float *img);
// Whether layers use the shifted GEMMs (direct convolution, Linear's tiles) instead of
// im2col and dtrain's GEMM: when the CPU has AVX2 or AVX-512 (their tiles are shaped
// for those registers), unless DT_CONV=gemm (or DT_CONV=direct forces them). blas.c.
bool dt_nn_want_direct(void);
// out[o][j] (+)= sum_r w[o][r] * src[off[r] + j]   (o < rows, j < n; shifted.c)
void dt_nn_shifted_gemm(const float *src, const int *off, int R, const float *w, int rows, int n,
                        float *out, size_t out_ld, bool add);
// With gradient shards: out[o][j] += tree over shards m of the sum over shard m's
// samples (shifted.c, linear.c); n <= NN_SHARD_COLS, tile S x ROWS x COLS floats.
void dt_nn_shifted_gemm_shards(const float *src, const int *off, const int *start, const int *len,
                               int S, const float *w, int rows, int n, float *tile, float *out,
                               size_t out_ld);
// dw[o][r] += sum_j a[o][j] * src[off[r] + j]   (o < rows, r < R, j < n; shifted.c)
void dt_nn_shifted_gemm_nt(const float *a, size_t a_ld, int rows, const float *src, const int *off,
                           int R, int n, float *dw);
// The fixed combination of S shard buffers of n floats, rows `ld` apart: the tree of
// core/tree.h, buf[k] += buf[k + h] for h = the largest power of two below S, then
// h/2, ... 1, k < h and k + h < S; the sum ends in buf[0]. The same tree continues across ranks
// (ddp.c), so one process with S shards and N processes with S/N each add the same numbers in the
// same order.
void dt_nn_shard_tree(float *buf, size_t ld, int shards, size_t n);
// y[i] = max(y[i], 0)
void dt_nn_relu_inplace(float *y, size_t n);
// d[i] = y[i] > 0 ? d[i] : 0
void dt_nn_relu_backward(const float *y, float *d, size_t n);
// rows x cols: each row r gets + b[r] (conv bias per channel)
void dt_nn_add_row_bias(float *y, const float *b, int rows, int cols);
// rows x cols: sum of each row added into s[r]
void dt_nn_row_sums_add(const float *y, int rows, int cols, float *s);

#endif // DTRAIN_NN_IMPL_H
