// exec.c: the CUDA executor (exec_abi.h's dt_exec_api): the plan's buffers, runs
// (forward, loss, backward) on one stream, their capture as CUDA graphs, copies to and
// from the host, and the optimizer's update. exec_ops.c holds the nodes' passes.
//
// A run first waits for the previous one (bounded), because the pinned staging
// buffers it fills are what the previous run's copies read; then it queues, in order:
// the copies of its inputs, sample keys and dropout streams to the device; the forward
// of every node; the loss (its gradient into the output's dy, its value copied back
// to pinned memory); the backward of every node whose output's gradient holds
// something, in reverse, with fan-out gradients summed (cx_dx). When the same run
// comes twice in a row (cx_sig: batch, mode, loss), the third is captured as a CUDA
// graph and replayed from then on (DT_CUDA_GRAPH: auto, 0 never, 1 from the first).
#include "cuda/exec_impl.h"

#include <math.h>
#include <string.h>

static dt_status cx_alloc(cx *x, size_t bytes, void **out) {
    DT_TRY(cu_mem_alloc(x->dev, bytes, out));
    x->bytes += bytes;
    return DT_OK;
}

static void cx_release(cx *x, void **p) {
    cu_mem_free(x->dev, *p);
    *p = NULL;
}

static dt_status pinned(size_t bytes, void **out) {
    CU_RT(cudaMallocHost(out, bytes ? bytes : 8));
    return DT_OK;
}

static void unpin(void **p) {
    if (*p)
        cudaFreeHost(*p);
    *p = NULL;
}

// ------------------------------------------------------------------ accessors

float *cx_w(cx *x, int i, int k) {
    return x->p + x->pt[x->nodes[i].params[k]].offset;
}
float *cx_dw(cx *x, int i, int k) {
    return x->g + x->pt[x->nodes[i].params[k]].offset;
}
float *cx_buf(cx *x, int i, int k) {
    return x->b + x->bt[x->nodes[i].buffers[k]].offset;
}
const uint16_t *cx_w16(cx *x, int i, int k) {
    return x->w16 + x->pt[x->nodes[i].params[k]].offset;
}

float *cx_dx(cx *x, int i, int j, bool *acc) {
    int     in = x->nodes[i].in[j];
    cx_val *v  = &x->v[in];
    *acc       = false;
    if (!v->dy)
        return NULL;
    *acc           = x->written[in];
    x->written[in] = true;
    return v->dy;
}

// ------------------------------------------------------------------- buffers

static void free_values(cx *x) {
    for (int i = 0; i < x->nn; i++) {
        cx_val *v = &x->v[i];
        cx_release(x, &v->y);
        cx_release(x, (void **)&v->dy);
        cx_release(x, &v->saved);
    }
    cx_release(x, &x->scratch);
    cx_release(x, &x->tgt_dev);
    cx_release(x, (void **)&x->keys_dev);
    cx_release(x, (void **)&x->loss_work);
    for (int k = 0; k < x->ninputs; k++)
        unpin(&x->in_host[k]);
    unpin(&x->tgt_host);
    unpin((void **)&x->keys_host);
    x->cap = 0;
}

static void drop_graph(cx *x) {
    if (x->gexec)
        cudaGraphExecDestroy(x->gexec);
    x->gexec = NULL;
    memset(&x->gsig, 0, sizeof x->gsig);
}

// Waits for the last run (its staging buffers are free again).
static dt_status settle(cx *x) {
    if (!x->pending)
        return DT_OK;
    DT_TRY(cu_event_wait(x->done, "the executor's last run"));
    x->pending = false;
    return DT_OK;
}

// Buffers for batches up to n: every value, its gradient and saved state, the shared
// scratch, the staging of inputs, targets and keys.
static dt_status reserve(cx *x, int n) {
    if (n <= x->cap)
        return DT_OK;
    DT_TRY(cu_stream_wait(x->dev, x->s, "the executor's stream"));
    drop_graph(x);
    free_values(x);
    size_t scratch = 0, out_rows = (size_t)n * x->v[x->output].numel;
    for (int i = 0; i < x->nn; i++) {
        cx_val *v = &x->v[i];
        size_t  per, fixed, scr;
        x->ops[i]->sizes(x, i, n, &per, &fixed, &scr);
        scratch = scr > scratch ? scr : scratch;
        DT_TRY(cx_alloc(x, sizeof(float) * v->numel * (size_t)n, &v->y));
        if (v->need_grad)
            DT_TRY(cx_alloc(x, sizeof(float) * v->numel * (size_t)n, (void **)&v->dy));
        if (per || fixed)
            DT_TRY(cx_alloc(x, per * (size_t)n + fixed, &v->saved));
    }
    for (int k = 0; k < x->ninputs; k++)
        DT_TRY(pinned(x->in_bytes[k] * (size_t)n, &x->in_host[k]));
    x->tgt_bytes = sizeof(float) * out_rows; // int32 classes or float targets: at most this
    DT_TRY(cx_alloc(x, scratch, &x->scratch));
    DT_TRY(cx_alloc(x, x->tgt_bytes, &x->tgt_dev));
    DT_TRY(pinned(x->tgt_bytes, &x->tgt_host));
    DT_TRY(cx_alloc(x, sizeof(uint64_t) * (size_t)n, (void **)&x->keys_dev));
    DT_TRY(pinned(sizeof(uint64_t) * (size_t)n, (void **)&x->keys_host));
    DT_TRY(cx_alloc(x, sizeof(double) * k_loss_work(out_rows), (void **)&x->loss_work));
    x->scratch_bytes = scratch;
    x->cap           = n;
    CU_LOG(DT_LOG_INFO, "executor on device %d: buffers for batch %d (%.1f MiB in all)", x->dev, n,
           (double)x->bytes / (1 << 20));
    return DT_OK;
}

// Which values need a gradient: the output, and the float inputs of every node that
// needs one and passes gradients through (graph inputs never: no input gradients).
static void plan_grads(cx *x) {
    x->v[x->output].need_grad = true;
    for (int i = x->nn - 1; i >= 0; i--) {
        const dt_node_desc *d = &x->nodes[i];
        if (!x->v[i].need_grad || !x->ops[i]->grad_through)
            continue;
        for (int j = 0; j < d->nin; j++) {
            cx_val *in = &x->v[d->in[j]];
            if (!in->is_int && strcmp(x->nodes[d->in[j]].kind, "input") != 0)
                in->need_grad = true;
        }
    }
}

// ------------------------------------------------------------------- life cycle

static void destroy(void *h);

static dt_status copy_plan(cx *x, const dt_exec_plan *p) {
    x->nn = p->nnodes, x->output = p->output, x->ninputs = p->ninputs;
    x->np = p->nparams, x->nb = p->nbuffers, x->numel = p->numel, x->bnumel = p->buffer_numel;
    x->prec       = p->precision == DT_PREC_BF16 ? DT_PREC_BF16 : DT_PREC_FP32;
    x->graph_mode = p->cuda_graph;
    x->nodes      = cu_host->alloc(sizeof *x->nodes * (size_t)x->nn);
    x->ops        = cu_host->alloc_zero(sizeof *x->ops * (size_t)x->nn);
    x->v          = cu_host->alloc_zero(sizeof *x->v * (size_t)x->nn);
    x->written    = cu_host->alloc_zero(sizeof *x->written * (size_t)x->nn);
    x->inputs     = cu_host->alloc(sizeof(int) * (size_t)(x->ninputs + 1));
    x->in_host    = cu_host->alloc_zero(sizeof(void *) * (size_t)(x->ninputs + 1));
    x->in_bytes   = cu_host->alloc_zero(sizeof(size_t) * (size_t)(x->ninputs + 1));
    x->pt         = cu_host->alloc(sizeof *x->pt * (size_t)(x->np + 1));
    x->bt         = cu_host->alloc(sizeof *x->bt * (size_t)(x->nb + 1));
    if (!x->nodes || !x->ops || !x->v || !x->written || !x->inputs || !x->in_host || !x->in_bytes ||
        !x->pt || !x->bt)
        return DT_ERR_NOMEM;
    memcpy(x->nodes, p->nodes, sizeof *x->nodes * (size_t)x->nn);
    memcpy(x->inputs, p->inputs, sizeof(int) * (size_t)x->ninputs);
    memcpy(x->pt, p->params, sizeof *x->pt * (size_t)x->np);
    memcpy(x->bt, p->buffers, sizeof *x->bt * (size_t)x->nb);
    for (int i = 0; i < x->nn; i++) {
        dt_node_desc *d = &x->nodes[i];
        if (!(x->ops[i] = cx_op_of(d->kind)))
            return cu_fail(DT_ERR_UNSUPPORTED,
                           "node '%s': kind \"%s\" does not run on a CUDA "
                           "device yet",
                           d->name, d->kind);
        DT_TRY(x->ops[i]->check(x, i));
        x->v[i].numel  = cx_numel(&d->out_shape);
        x->v[i].is_int = d->out_shape.dtype == DT_ELEM_I32;
    }
    for (int k = 0; k < x->ninputs; k++)
        x->in_bytes[k] = 4 * x->v[x->inputs[k]].numel; // float or int32
    return DT_OK;
}

static dt_status create(void **out, int dev, const dt_exec_plan *p) {
    *out  = NULL;
    cx *x = cu_host->alloc_zero(sizeof *x);
    if (!x)
        return DT_ERR_NOMEM;
    x->dev       = dev;
    dt_status st = copy_plan(x, p);
    if (st == DT_OK)
        st = cu_use(dev);
    if (st == DT_OK) {
        cudaError_t e = cudaStreamCreateWithFlags(&x->s, cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming);
        if (e != cudaSuccess)
            st = cu_rt_fail(e, "the executor's stream and event");
    }
    if (st == DT_OK)
        st = cx_blas_open(x);
    if (st == DT_OK) {
        plan_grads(x);
        size_t n = x->numel ? x->numel : 1, nb = x->bnumel ? x->bnumel : 1;
        if (!(st = cx_alloc(x, sizeof(float) * n, (void **)&x->p)) &&
            !(st = cx_alloc(x, sizeof(float) * n, (void **)&x->g)) &&
            !(st = cx_alloc(x, sizeof(float) * nb, (void **)&x->b)) &&
            !(st = cx_alloc(x, sizeof(uint64_t) * (size_t)x->nn, (void **)&x->nk_dev)) &&
            !(st = pinned(sizeof(uint64_t) * (size_t)x->nn, (void **)&x->nk_host)) &&
            !(st = cx_alloc(x, 2 * sizeof(float), (void **)&x->loss_dev)) &&
            !(st = pinned(2 * sizeof(float), (void **)&x->loss_host)) &&
            !(st = cx_alloc(x, sizeof(double) * (k_sumsq_work() + 1), (void **)&x->norm_work)) &&
            !(st = pinned(sizeof(double), (void **)&x->norm_host)))
            x->norm_dev = x->norm_work + k_sumsq_work();
        if (st == DT_OK && x->prec == DT_PREC_BF16)
            st = cx_alloc(x, sizeof(uint16_t) * n, (void **)&x->w16);
    }
    if (st == DT_OK) { // the starting values, zero gradients
        cudaError_t e = cudaMemcpyAsync(x->p, p->init_params, sizeof(float) * x->numel,
                                        cudaMemcpyHostToDevice, x->s);
        if (e == cudaSuccess && x->bnumel)
            e = cudaMemcpyAsync(x->b, p->init_buffers, sizeof(float) * x->bnumel,
                                cudaMemcpyHostToDevice, x->s);
        if (e == cudaSuccess)
            e = cudaMemsetAsync(x->g, 0, sizeof(float) * x->numel, x->s);
        st = e == cudaSuccess ? cu_stream_wait(dev, x->s, "copying the parameters to the GPU")
                              : cu_rt_fail(e, "copying the parameters to the GPU");
    }
    if (st == DT_OK && p->max_batch > 0)
        st = reserve(x, p->max_batch);
    if (st) {
        destroy(x);
        return st;
    }
    *out = x;
    return DT_OK;
}

static void destroy(void *h) {
    cx *x = h;
    if (!x)
        return;
    if (x->s && cu_stream_wait(x->dev, x->s, "freeing the executor") != DT_OK)
        CU_LOG(DT_LOG_WARN, "freeing the executor: its stream did not finish");
    drop_graph(x);
    if (x->v)
        free_values(x);
    void **dev[] = {(void **)&x->p,        (void **)&x->g,        (void **)&x->b,
                    (void **)&x->state,    (void **)&x->w16,      (void **)&x->nk_dev,
                    (void **)&x->loss_dev, (void **)&x->norm_work};
    for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++)
        cx_release(x, dev[k]);
    unpin((void **)&x->nk_host);
    unpin((void **)&x->loss_host);
    unpin((void **)&x->norm_host);
    cx_blas_close(x);
    if (x->done)
        cudaEventDestroy(x->done);
    if (x->s)
        cudaStreamDestroy(x->s);
    void *host[] = {x->nodes,   x->ops,      x->v,  x->written, x->inputs,
                    x->in_host, x->in_bytes, x->pt, x->bt};
    for (size_t k = 0; k < sizeof host / sizeof host[0]; k++)
        cu_host->free(host[k]);
    cu_host->free(x);
}

// ------------------------------------------------------------------------ runs

static dt_status enqueue_loss(cx *x) {
    const dt_exec_lossdesc *l    = x->loss;
    cx_val                 *out  = &x->v[x->output];
    size_t                  n    = (size_t)x->batch * out->numel;
    int                     rows = (int)(n / (size_t)l->classes);
    CU_RT(cudaMemcpyAsync(x->tgt_dev, x->tgt_host,
                          l->kind == 2 ? sizeof(float) * n : sizeof(int32_t) * (size_t)rows,
                          cudaMemcpyHostToDevice, x->s));
    if (l->kind == 0)
        CU_RT(k_nll_loss(x->s, rows, l->classes, out->y, x->tgt_dev, l->grad_scale, out->dy,
                         x->loss_dev, x->loss_work));
    else if (l->kind == 1)
        CU_RT(k_cross_entropy(x->s, rows, l->classes, out->y, x->tgt_dev, l->ignore_index,
                              l->label_smoothing, l->grad_scale, out->dy, x->loss_dev,
                              x->loss_work));
    else
        CU_RT(k_mse_loss(x->s, n, out->y, x->tgt_dev, l->grad_scale, out->dy, x->loss_dev,
                         x->loss_work));
    CU_RT(cudaMemcpyAsync(x->loss_host, x->loss_dev, sizeof(float), cudaMemcpyDeviceToHost, x->s));
    return DT_OK;
}

// The run's work, on x->s (captured or not).
static dt_status enqueue(cx *x, const dt_exec_run *r) {
    int n = x->batch;
    if (r->forward) {
        for (int k = 0; k < x->ninputs; k++)
            CU_RT(cudaMemcpyAsync(x->v[x->inputs[k]].y, x->in_host[k], x->in_bytes[k] * (size_t)n,
                                  cudaMemcpyHostToDevice, x->s));
        CU_RT(cudaMemcpyAsync(x->nk_dev, x->nk_host, sizeof(uint64_t) * (size_t)x->nn,
                              cudaMemcpyHostToDevice, x->s));
        if (x->has_keys)
            CU_RT(cudaMemcpyAsync(x->keys_dev, x->keys_host, sizeof(uint64_t) * (size_t)n,
                                  cudaMemcpyHostToDevice, x->s));
        if (x->prec == DT_PREC_BF16) // this step's bf16 copies of the weights
            CU_RT(k_to_bf16(x->s, x->p, x->w16, x->numel));
        for (int i = 0; i < x->nn; i++)
            DT_TRY(x->ops[i]->forward(x, i));
    }
    if (x->loss)
        DT_TRY(enqueue_loss(x));
    if (r->backward) {
        memset(x->written, 0, sizeof *x->written * (size_t)x->nn);
        x->written[x->output] = true; // the loss's gradient
        for (int i = x->nn - 1; i >= 0; i--)
            if (x->written[i] && x->v[i].need_grad)
                DT_TRY(x->ops[i]->backward(x, i));
    }
    return DT_OK;
}

static bool same_sig(const cx_sig *a, const cx_sig *b) {
    return a->batch == b->batch && a->training == b->training && a->forward == b->forward &&
           a->backward == b->backward && a->keys == b->keys && a->loss == b->loss &&
           a->loss_kind == b->loss_kind && a->ignore == b->ignore && a->smoothing == b->smoothing &&
           a->scale == b->scale;
}

// Captures the run as a graph (replacing any other); false when capture failed (the
// run is then queued directly, and capture is not tried again).
static dt_status capture(cx *x, const dt_exec_run *r, const cx_sig *sig, bool *ok) {
    *ok = false;
    drop_graph(x);
    cudaGraph_t graph = NULL;
    CU_RT(cudaStreamBeginCapture(x->s, cudaStreamCaptureModeThreadLocal));
    dt_status   st = enqueue(x, r);
    cudaError_t e  = cudaStreamEndCapture(x->s, &graph);
    if (st == DT_OK && e == cudaSuccess)
        e = cudaGraphInstantiate(&x->gexec, graph, 0);
    if (graph)
        cudaGraphDestroy(graph);
    if (st != DT_OK)
        return st;
    if (e != cudaSuccess) {
        cudaGetLastError();
        x->gexec        = NULL;
        x->graph_failed = true;
        CU_LOG(DT_LOG_WARN, "capturing a step as a CUDA graph failed (%s); running without",
               cudaGetErrorString(e));
        return DT_OK;
    }
    x->gsig = *sig;
    *ok     = true;
    return DT_OK;
}

static dt_status run(void *h, const dt_exec_run *r) {
    cx *x = h;
    DT_TRY(cu_use(x->dev));
    if (r->forward)
        DT_TRY(reserve(x, r->batch));
    else if (r->batch != x->batch)
        return cu_fail(DT_ERR_STATE,
                       "executor: a loss or backward for batch %d after a forward of "
                       "%d",
                       r->batch, x->batch);
    DT_TRY(settle(x));
    x->batch = r->batch;
    if (r->forward) {
        x->training = r->training, x->has_keys = r->keys != NULL;
        for (int k = 0; k < x->ninputs; k++)
            memcpy(x->in_host[k], r->inputs[k], x->in_bytes[k] * (size_t)r->batch);
        memcpy(x->nk_host, r->node_keys, sizeof(uint64_t) * (size_t)x->nn);
        if (r->keys)
            memcpy(x->keys_host, r->keys, sizeof(uint64_t) * (size_t)r->batch);
    }
    x->loss = r->loss;
    if (r->loss) {
        size_t n    = (size_t)r->batch * x->v[x->output].numel;
        size_t rows = n / (size_t)r->loss->classes;
        memcpy(x->tgt_host, r->loss->targets,
               r->loss->kind == 2 ? sizeof(float) * n : sizeof(int32_t) * rows);
    }
    cx_sig sig  = {r->batch,
                   x->training,
                   r->forward,
                   r->backward,
                   x->has_keys,
                   r->loss != NULL,
                  r->loss ? r->loss->kind : -1,
                  r->loss ? r->loss->ignore_index : 0,
                  r->loss ? r->loss->label_smoothing : 0.0f,
                  r->loss ? r->loss->grad_scale : 0.0f};
    bool   want = !x->graph_failed &&
                (x->graph_mode == 1 || (x->graph_mode < 0 && same_sig(&sig, &x->last_sig)));
    x->last_sig = sig;
    bool replay = x->gexec && same_sig(&sig, &x->gsig);
    if (!replay && want)
        DT_TRY(capture(x, r, &sig, &replay));
    else if (!replay)
        DT_TRY(enqueue(x, r));
    if (replay) {
        CU_RT(cudaGraphLaunch(x->gexec, x->s));
        x->replays++;
    }
    CU_RT(cudaEventRecord(x->done, x->s));
    x->pending = true;
    return DT_OK;
}

static dt_status loss_value(void *h, float *loss) {
    cx *x = h;
    DT_TRY(settle(x));
    *loss = *x->loss_host;
    return DT_OK;
}

// --------------------------------------------------------------- copies, state

static dt_status copy(void *h, unsigned part, bool to_host, void *host, size_t off, size_t n) {
    cx    *x = h;
    float *d = NULL;
    DT_TRY(cu_use(x->dev));
    if (part == DT_EXEC_OPTIM && !x->state) { // the state arrives before the first step
        DT_TRY(cx_alloc(x, sizeof(float) * (off + n), (void **)&x->state));
        CU_RT(cudaMemsetAsync(x->state, 0, sizeof(float) * (off + n), x->s));
        x->state_n = off + n;
    }
    switch (part) {
    case DT_EXEC_PARAMS:
        d = x->p;
        break;
    case DT_EXEC_GRADS:
        d = x->g;
        break;
    case DT_EXEC_BUFFERS:
        d = x->b;
        break;
    case DT_EXEC_OPTIM:
        d = x->state;
        break;
    case DT_EXEC_PART_OUTPUT:
        d = x->v[x->output].y;
        break;
    default:
        return cu_fail(DT_ERR_ARG, "executor: no part %u", part);
    }
    if (part == DT_EXEC_OPTIM && off + n > x->state_n)
        return cu_fail(DT_ERR_ARG, "executor: the optimizer's state holds %zu floats, not %zu",
                       x->state_n, off + n);
    if (n == 0)
        return DT_OK;
    CU_RT(cudaMemcpyAsync(to_host ? host : (void *)(d + off), to_host ? (void *)(d + off) : host,
                          sizeof(float) * n,
                          to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, x->s));
    DT_TRY(cu_stream_wait(x->dev, x->s, to_host ? "a copy from the GPU" : "a copy to the GPU"));
    x->pending = false; // the stream is idle: the last run is done too
    return DT_OK;
}

static void *device_ptr(void *h, unsigned part) {
    cx *x = h;
    return part == DT_EXEC_PARAMS    ? (void *)x->p
           : part == DT_EXEC_GRADS   ? (void *)x->g
           : part == DT_EXEC_BUFFERS ? (void *)x->b
                                     : NULL;
}

static dt_status zero_grad(void *h) {
    cx *x = h;
    DT_TRY(cu_use(x->dev));
    CU_RT(cudaMemsetAsync(x->g, 0, sizeof(float) * x->numel, x->s));
    return DT_OK;
}

static dt_status grad_norm(void *h, float *norm) {
    cx *x = h;
    DT_TRY(cu_use(x->dev));
    CU_RT(cudaMemsetAsync(x->norm_dev, 0, sizeof(double), x->s));
    for (int t = 0; t < x->np;) { // runs of consecutive trainable tensors
        if (!x->pt[t].trainable) {
            t++;
            continue;
        }
        size_t off = x->pt[t].offset, n = 0;
        for (; t < x->np && x->pt[t].trainable; t++)
            n += x->pt[t].count;
        CU_RT(k_sumsq(x->s, x->g + off, n, x->norm_dev, x->norm_work));
    }
    CU_RT(cudaMemcpyAsync(x->norm_host, x->norm_dev, sizeof(double), cudaMemcpyDeviceToHost, x->s));
    DT_TRY(cu_stream_wait(x->dev, x->s, "the gradient norm"));
    x->pending = false;
    *norm      = (float)sqrt(*x->norm_host);
    return DT_OK;
}

static dt_status scale_grads(void *h, float f) {
    cx *x = h;
    DT_TRY(cu_use(x->dev));
    CU_RT(k_scale(x->s, x->g, f, x->numel));
    return DT_OK;
}

// One launch per run of consecutive tensors of one group, as optim.c's ranges.
static dt_status optim_range(cx *x, const dt_exec_optim *o, int grp, size_t off, size_t n) {
    float *p = x->p + off, *g = x->g + off, *st = x->state;
    size_t N = x->numel;
    switch (o->kind) {
    case 0: // SGD
        CU_RT(k_sgd(x->s, p, g, o->momentum != 0.0f ? st + off : NULL, n, o->lr[grp], o->wd[grp],
                    o->momentum, o->dampening, o->nesterov, o->step == 1));
        break;
    case 1: // Adam: L2 added to the gradient
    case 2: // AdamW: decoupled decay
        CU_RT(k_adam(x->s, p, g, st + off, st + N + off, o->amsgrad ? st + 2 * N + off : NULL, n,
                     o->kind == 1 ? o->wd[grp] : 0.0f, o->beta1, o->beta2, o->eps,
                     o->step_size[grp], o->bc2_sqrt, o->decay[grp]));
        break;
    default: // Adadelta
        CU_RT(k_adadelta(x->s, p, g, st + off, st + N + off, n, o->lr[grp], o->wd[grp], o->rho,
                         o->eps));
        break;
    }
    return DT_OK;
}

static dt_status optim_step(void *h, const dt_exec_optim *o) {
    cx *x = h;
    DT_TRY(cu_use(x->dev));
    if (o->state_floats && !x->state) {
        DT_TRY(cx_alloc(x, sizeof(float) * o->state_floats, (void **)&x->state));
        CU_RT(cudaMemsetAsync(x->state, 0, sizeof(float) * o->state_floats, x->s));
        x->state_n = o->state_floats;
    }
    if (o->state_floats > x->state_n)
        return cu_fail(DT_ERR_ARG, "executor: the optimizer needs %zu floats of state, %zu held",
                       o->state_floats, x->state_n);
    for (int t = 0; t < x->np;) {
        int grp = o->tgroup[t];
        if (grp < 0 || x->pt[t].count == 0) {
            t++;
            continue;
        }
        size_t off = x->pt[t].offset, n = 0;
        for (; t < x->np && o->tgroup[t] == grp && x->pt[t].offset == off + n; t++)
            n += x->pt[t].count;
        DT_TRY(optim_range(x, o, grp, off, n));
    }
    return DT_OK;
}

static dt_status sync_(void *h) {
    cx *x = h;
    DT_TRY(cu_stream_wait(x->dev, x->s, "the executor's stream"));
    x->pending = false;
    return DT_OK;
}

static void stats(void *h, int64_t *replays, size_t *bytes) {
    cx *x    = h;
    *replays = x->replays;
    *bytes   = x->bytes;
}

static const dt_exec_api table = {
    .abi         = DT_EXEC_ABI,
    .size        = sizeof(dt_exec_api),
    .create      = create,
    .destroy     = destroy,
    .run         = run,
    .loss_value  = loss_value,
    .copy        = copy,
    .device_ptr  = device_ptr,
    .zero_grad   = zero_grad,
    .grad_norm   = grad_norm,
    .scale_grads = scale_grads,
    .optim_step  = optim_step,
    .sync        = sync_,
    .stats       = stats,
};

const void *const cu_exec_api = &table;
