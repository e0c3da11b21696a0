// exec_impl.h: the CUDA executor's state, shared by exec.c (buffers, runs, CUDA
// graphs, copies, the optimizer) and exec_ops.c (each kind of node's forward and
// backward). One executor runs on one stream of one device; every buffer is allocated
// when the plan is made for a batch size (the caching allocator's blocks), so a run
// allocates nothing and can be captured as a CUDA graph.
#ifndef DTRAIN_CUDA_EXEC_IMPL_H
#define DTRAIN_CUDA_EXEC_IMPL_H

#include "cuda/cuda_impl.h"
#include "cuda/kernels.h"
#include "exec/exec_abi.h"

#include <cublas_v2.h>

// One node's value: its output, its gradient (when some path to the loss needs it) and
// what its forward saves for its backward.
typedef struct cx_val {
    void  *y;         // (batch, numel) floats, or int32 for an index input
    float *dy;        // NULL: no gradient needed
    size_t numel;     // per sample
    bool   is_int;    // an int32 input
    bool   need_grad; // some path from it reaches the output through differentiable inputs
    void  *saved;
    size_t saved_per, saved_fixed; // bytes per sample, and for the batch
} cx_val;

// What the kinds implement (exec_ops.c): the bytes each saves and the scratch each
// needs at batch n, a check of what the device can run (DT_ERR_UNSUPPORTED naming the
// node), and the passes.
typedef struct cx cx;
typedef struct cx_op {
    const char *kind;
    dt_status (*check)(cx *x, int node);
    void (*sizes)(cx *x, int node, int n, size_t *saved_per, size_t *saved_fixed, size_t *scratch);
    dt_status (*forward)(cx *x, int node);
    dt_status (*backward)(cx *x, int node);
    bool grad_through; // whether its float inputs receive gradients (embedding: no)
} cx_op;
const cx_op *cx_op_of(const char *kind); // NULL: not a kind this device runs

// A run's kernel sequence, as far as it changes what is queued: a captured CUDA graph
// is replayed only for the same one.
typedef struct cx_sig {
    int   batch;
    bool  training, forward, backward, keys, loss;
    int   loss_kind, ignore;
    float smoothing, scale;
} cx_sig;

struct cx {
    int            dev;
    cudaStream_t   s;
    cublasHandle_t blas;
    void          *blas_ws; // cuBLAS's workspace: no allocation while a graph is captured
    // The plan (copied).
    int            nn, output, ninputs;
    dt_node_desc  *nodes;
    const cx_op  **ops;
    int           *inputs;
    int            np, nb;
    dt_param_info *pt, *bt;
    size_t         numel, bnumel;
    dt_precision   prec;
    int            graph_mode; // -1 auto, 0 off, 1 on
    // Device state.
    float    *p, *g, *b; // parameters, gradients, buffers
    float    *state;     // the optimizer's (state_n floats), from its first step
    size_t    state_n;
    uint16_t *w16; // bf16 copies of the parameters (precision bf16)
    cx_val   *v;
    int       cap;     // the batch the buffers hold
    void     *scratch; // shared by the nodes' passes, scratch_bytes
    size_t    scratch_bytes;
    // Staging: pinned host copies of what a run reads, and their device twins.
    void    **in_host;
    size_t   *in_bytes; // per sample
    void     *tgt_host, *tgt_dev;
    size_t    tgt_bytes; // capacity
    uint64_t *keys_host, *keys_dev, *nk_host, *nk_dev;
    float    *loss_dev, *loss_host;
    double   *loss_work, *norm_dev, *norm_work, *norm_host;
    // The current run.
    int                     batch;
    bool                    training, has_keys;
    const dt_exec_lossdesc *loss;
    bool                   *written; // backward: the value's gradient holds something
    // Completion and CUDA graphs.
    cudaEvent_t     done;
    bool            pending;
    cudaGraphExec_t gexec;
    cx_sig          gsig, last_sig;
    bool            graph_failed;
    int64_t         replays;
    size_t          bytes; // device memory this executor allocated
};

// ------------------------------------------------------------- helpers (exec.c)
// The product of a per-sample shape's dimensions (layer.h's dt_shape_numel, which the
// plugin cannot call).
static inline size_t cx_numel(const dt_shape *s) {
    size_t n = 1;
    for (int k = 0; k < s->ndim; k++)
        n *= (size_t)s->d[k];
    return n;
}
// Node i's input j's value, its output's value.
static inline cx_val *cx_in(cx *x, int i, int j) {
    return &x->v[x->nodes[i].in[j]];
}
static inline cx_val *cx_out(cx *x, int i) {
    return &x->v[i];
}
// Parameter k of node i on the device (weights, gradients, buffers).
float          *cx_w(cx *x, int i, int k);
float          *cx_dw(cx *x, int i, int k);
float          *cx_buf(cx *x, int i, int k);
const uint16_t *cx_w16(cx *x, int i, int k); // its bf16 copy (precision bf16)
// Where node i's backward puts input j's gradient: NULL when nobody needs it; *acc
// true when another reader wrote it first (add to it). Marks it written.
float *cx_dx(cx *x, int i, int j, bool *acc);

// Row-major GEMM on the executor's stream (cuBLAS; blas.c): C (m, n) = op(A) (m, k)
// op(B) (k, n) + beta C, lda etc. the row strides; fp32 (TF32 off), or bf16 operands
// with fp32 accumulation (gemm16: A and B bf16).
dt_status cx_gemm(cx *x, bool ta, bool tb, int m, int n, int k, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc);
dt_status cx_gemm16(cx *x, bool ta, bool tb, int m, int n, int k, const uint16_t *a, int lda,
                    const uint16_t *b, int ldb, float beta, float *c, int ldc);
dt_status cx_blas_open(cx *x);
void      cx_blas_close(cx *x);

#endif // DTRAIN_CUDA_EXEC_IMPL_H
