// graph_run.c: running a finalized graph (graph.h): forward and backward over the
// buffers and threads of graph_buffers.c.
//
// Gradients of fan-out: a value's dy is WRITTEN by the first consumer that backward
// reaches (the last in forward order) and every later consumer writes into a
// temporary that is then added (dt_nn_accumulate), so a value read k times gets the
// sum of k gradients without zeroing anything first.
//
// Threads: a forward or a backward is one task on the pool per run of nodes, every
// thread walking all of them. Thread t of n owns samples [B t / n, B (t + 1) / n) of
// every value, so a node's range only reads what the same thread wrote before, and the
// threads meet only where that is not so: around a node summing gradient shards, before
// a node that writes a gradient buffer other threads may still use with another layout
// (the buffers are shared by liveness), and after a node with parameters, whose
// per-thread partial gradients are then summed in thread order, each thread a slice,
// before thread 0 reports them ready. A node with batch-wide state (BatchNorm) ends the
// run: it runs whole on the calling thread between two tasks (free to use the pool
// itself). Team layers (layer.h's DT_LAYER_TEAM: Linear, the fused convolution) are
// called on every thread at once with the whole batch's buffers and split the work
// themselves.
//
// Gradient shards (dt_graph_set_grad_shards): sample s belongs to shard s % S. The
// backward of a node with parameters then runs per shard, each adding its samples in
// increasing order into its own buffer, and the shards are combined by the fixed tree
// of dt_nn_shard_tree before being added to the gradient: the result does not depend
// on the thread count. Team layers take a shard's samples in one call (or, with a
// shared gradient, sum the shards themselves); other layers are called once per sample.
#include "dtrain/trace.h"

#include "nn/graph/graph_impl.h"

#include "nn/nn_impl.h"
#include "nn/ops.h"
#include "nn/prec.h"

#include <stdio.h>
#include <string.h>

// ------------------------------------------------------------------- calling layers

static float *thread_scratch(const dt_graph *g, int ith) {
    return ith == 0 ? g->scratch : g->tscratch[ith];
}

static size_t param_off(const dt_graph *g, const gval *v, int k) {
    return dt_params_info(g->params, v->pidx[k])->offset;
}

// A public layer's forward or backward over samples [b0, b1) on thread ith; its
// parameter gradients go to dw (NULL: thread 0's into the gradient, others' into their
// partials).
static dt_status call_layer(dt_graph *g, gval *v, bool backward, int b0, int b1, int ith,
                            float *const *dw_to) {
    if (b1 <= b0)
        return DT_OK;
    size_t       off = (size_t)b0;
    dt_shape     in[DT_LAYER_MAX_INPUTS];
    const float *x[DT_LAYER_MAX_INPUTS];
    float       *dx[DT_LAYER_MAX_INPUTS];
    float       *dw[DT_LAYER_MAX_TENSORS];
    for (int j = 0; j < v->nin; j++) {
        const gval *u = &g->vals[v->in[j]];
        in[j]         = u->shape;
        x[j]          = dt_graph_val_data(u) + off * dt_shape_numel(&u->shape);
        dx[j]         = backward && v->bdx[j] ? v->bdx[j] + off * dt_shape_numel(&u->shape) : NULL;
    }
    for (int p = 0; p < v->su.nparams; p++)
        dw[p] = dw_to ? dw_to[p] : ith == 0 ? v->dw[p] : g->partial[ith] + param_off(g, v, p);
    size_t        ny  = dt_shape_numel(&v->shape);
    dt_rng        rng = dt_rng_split(&g->rng, (uint64_t)v->layer_no);
    dt_layer_args a   = {
          .batch     = b1 - b0,
          .training  = v->fwd_training,
          .nin       = v->nin,
          .in        = in,
          .out       = &v->shape,
          .x         = x,
          .y         = v->y + off * ny,
          .dy        = backward ? v->dy + off * ny : NULL,
          .dx        = dx,
          .w         = v->w,
          .dw        = dw,
          .buf       = v->buf,
          .saved     = v->saved + off * v->su.saved_per_sample,
          .scratch   = thread_scratch(g, ith),
          .rng       = &rng,
          .keys      = (g->keys ? g->keys : g->pos_keys) + off,
          .precision = g->prec,
          .w16       = (const void *const *)v->w16,
          .saved16   = dt_graph_saved16_at(g, v, off),
          .pool      = dt_graph_whole(v) ? g->pool : NULL, // runs whole: may share its work out
    };
    if (!backward)
        return v->layer->ops->forward(v->layer, &a);
    DT_TRY(v->layer->ops->backward(v->layer, &a));
    for (int j = 0; j < v->nin; j++) { // a later consumer's gradient, added in range
        gval  *u  = &g->vals[v->in[j]];
        size_t nu = dt_shape_numel(&u->shape);
        if (dx[j] && !v->bdirect[j])
            dt_nn_accumulate((size_t)(b1 - b0) * nu, dx[j], u->dy + off * nu);
    }
    return DT_OK;
}

// A team layer's forward or backward on thread ith of nth: the whole batch's buffers,
// its samples in tm; parameter gradients into dw (NULL: the layer's shared gradient, or
// this thread's partial when the layer's are partial).
static dt_status call_team(dt_graph *g, gval *v, bool backward, const dt_layer_team *tm,
                           float *const *dw_to) {
    int          ith = tm->ith;
    dt_shape     in[DT_LAYER_MAX_INPUTS];
    const float *x[DT_LAYER_MAX_INPUTS];
    float       *dx[DT_LAYER_MAX_INPUTS];
    float       *dw[DT_LAYER_MAX_TENSORS];
    for (int j = 0; j < v->nin; j++) {
        in[j] = g->vals[v->in[j]].shape;
        x[j]  = dt_graph_val_data(&g->vals[v->in[j]]);
        dx[j] = backward ? v->bdx[j] : NULL;
    }
    bool own = v->su.grad == DT_LAYER_GRAD_PARTIAL && ith > 0;
    for (int p = 0; p < v->su.nparams; p++)
        dw[p] = dw_to ? dw_to[p] : own ? g->partial[ith] + param_off(g, v, p) : v->dw[p];
    dt_rng        rng = dt_rng_split(&g->rng, (uint64_t)v->layer_no);
    dt_layer_args a   = {
          .batch     = g->batch,
          .training  = backward ? v->fwd_training : g->training,
          .nin       = v->nin,
          .in        = in,
          .out       = &v->shape,
          .x         = x,
          .y         = v->y,
          .dy        = backward ? v->dy : NULL,
          .dx        = dx,
          .w         = v->w,
          .dw        = dw,
          .buf       = v->buf,
          .saved     = v->saved,
          .scratch   = thread_scratch(g, ith),
          .rng       = &rng,
          .keys      = g->keys,
          .precision = g->prec,
          .w16       = (const void *const *)v->w16,
          .saved16   = dt_graph_saved16_at(g, v, 0),
          .pool      = g->pool,
          .team      = tm,
    };
    return backward ? v->layer->ops->backward(v->layer, &a) : v->layer->ops->forward(v->layer, &a);
}

static dt_layer_team team_of(const dt_graph *g, int ith, int nth) {
    return (dt_layer_team){
        .ith    = ith,
        .nth    = nth,
        .s0     = (int)((int64_t)g->batch * ith / nth),
        .s1     = (int)((int64_t)g->batch * (ith + 1) / nth),
        .step   = 1,
        .shards = g->shards,
    };
}

static void record(dt_graph *g, int ith, int node, dt_status st) {
    if (st == DT_OK || g->tstatus[ith] != DT_OK)
        return;
    g->tstatus[ith] = st;
    g->tfail[ith]   = node;
    __atomic_store_n(&g->failed, 1, __ATOMIC_RELAXED);
}

static bool failed(dt_graph *g) {
    return __atomic_load_n(&g->failed, __ATOMIC_RELAXED) != 0;
}

static void meet(dt_graph *g, int nth) {
    if (nth > 1)
        dt_pool_barrier(g->pool);
}

// ------------------------------------------------------------------------- forward

// What one pool task runs: nodes [lo, hi) of a forward, or hi-1 down to lo of a
// backward, none of them whole (those run on the calling thread between tasks).
typedef struct task {
    dt_graph    *g;
    int          lo, hi;
    const float *dout; // backward's first task: the output's gradient to copy in
} task;

static void forward_task(void *arg, int ith, int nth) {
    task     *k  = arg;
    dt_graph *g  = k->g;
    int       b0 = (int)((int64_t)g->batch * ith / nth);
    int       b1 = (int)((int64_t)g->batch * (ith + 1) / nth);
    for (int i = k->lo; i < k->hi; i++) {
        gval *v = &g->vals[i];
        if (!v->layer)
            continue;
        uint64_t t0 = g->profile && ith == 0 ? dt_now_ns() : 0;
        uint64_t c0 = g->times && ith == 0 ? dt_graph_cpu_ns() : 0;
        DT_TRACE_BEGIN(tr);
        if (dt_graph_team(v)) { // every thread calls it, failed or not: it may meet the others
            dt_layer_team tm = team_of(g, ith, nth);
            record(g, ith, i, call_team(g, v, false, &tm, NULL));
        } else if (!failed(g)) {
            record(g, ith, i, call_layer(g, v, false, b0, b1, ith, NULL));
        }
        DT_TRACE_END(tr, "forward", v->layer->ops->kind, "node", i);
        if (t0) {
            v->fwd_ns += dt_now_ns() - t0;
            v->fwd_flop += dt_graph_node_flop(g, v, false);
        }
        if (c0) // dt_graph_set_timing: the process's CPU time (every thread's) meanwhile
            g->times[2 * i] += (double)(dt_graph_cpu_ns() - c0) * 1e-9;
    }
}

// The outcome of a pass: the first failing thread's, named by node and pass; 16-bit
// products of Sequential nodes that found no memory.
static dt_status task_status(dt_graph *g, int nth, const char *pass) {
    for (int t = 0; t < nth; t++) {
        if (g->tstatus[t] == DT_OK)
            continue;
        const gval *v = &g->vals[g->tfail[t]];
        if (t == 0)
            return dt_fail_context("node '%s' (%s) %s", v->name, v->layer->ops->kind, pass);
        return dt_fail(g->tstatus[t], "node '%s' (%s) %s: thread %d of %d failed (status %d)",
                       v->name, v->layer->ops->kind, pass, t, nth, (int)g->tstatus[t]);
    }
    return DT_OK;
}

static void begin_pass(dt_graph *g, int nth, bool backward) {
    for (int t = 0; t < nth; t++) {
        g->tstatus[t] = DT_OK;
        g->tfail[t]   = -1;
    }
    g->failed = 0;
    (void)backward;
}

// A node that runs whole, on the calling thread between two tasks.
static void run_whole(dt_graph *g, int i, bool backward) {
    gval    *v  = &g->vals[i];
    uint64_t t0 = g->profile ? dt_now_ns() : 0;
    uint64_t c0 = g->times ? dt_graph_cpu_ns() : 0;
    DT_TRACE_BEGIN(tr);
    if (backward && v->bzero)
        memset(v->dy, 0, sizeof(float) * dt_graph_val_floats(v, g->batch));
    record(g, 0, i, call_layer(g, v, backward, 0, g->batch, 0, NULL));
    DT_TRACE_END(tr, backward ? "backward" : "forward", v->layer->ops->kind, "node", i);
    if (t0) {
        *(backward ? &v->bwd_ns : &v->fwd_ns) += dt_now_ns() - t0;
        *(backward ? &v->bwd_flop : &v->fwd_flop) += dt_graph_node_flop(g, v, backward);
    }
    if (c0)
        g->times[2 * i + backward] += (double)(dt_graph_cpu_ns() - c0) * 1e-9;
}

dt_status dt_graph_forward(dt_graph *g, const void *const *inputs, int batch) {
    if (!g || !g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_forward: expected a finalized graph");
    if (batch < 1 || !inputs)
        return dt_fail(DT_ERR_ARG, "dt_graph_forward: expected inputs and batch >= 1, found %d",
                       batch);
    if (g->training && g->keys && g->nkeys != batch)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_forward: expected a batch of %d samples, as many as the "
                       "sample keys set (dt_graph_set_sample_keys), found %d",
                       g->nkeys, batch);
    DT_TRY(dt_graph_reserve_buffers(g, batch));
    DT_TRY(dt_graph_thread_buffers(g));
    DT_TRY(dt_graph_pass_use(g, DT_USE_BEGIN, false));
    DT_TRY(dt_graph_fill_shadows(g));
    g->batch = batch;
    g->split = g->nthreads;
    int ni   = 0;
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!v->layer) {
            v->ext = inputs[ni];
            if (!v->ext)
                return dt_fail(DT_ERR_ARG, "dt_graph_forward: input '%s' is NULL", v->name);
            ni++;
            continue;
        }
        v->fwd_training = g->training;
    }
    begin_pass(g, g->split, false);
    DT_TRACE_BEGIN(tr);
    for (int i = 0; i < g->nvals && !failed(g);) {
        gval *v = &g->vals[i];
        if (dt_graph_used_alone(g, v)) {
            record(g, 0, i, dt_graph_node_use(g, v, DT_USE_ACQUIRE, false));
            if (!failed(g) && dt_graph_whole(v)) {
                run_whole(g, i, false);
            } else if (!failed(g)) {
                task k = {g, i, i + 1, NULL};
                dt_pool_run(g->pool, forward_task, &k);
            }
            if (!failed(g))
                record(g, 0, i, dt_graph_node_use(g, v, DT_USE_RELEASE, false));
            i++;
            continue;
        }
        if (v->layer && dt_graph_whole(v)) {
            run_whole(g, i++, false);
            continue;
        }
        task k = {g, i, i, NULL};
        while (k.hi < g->nvals && !(g->vals[k.hi].layer && dt_graph_whole(&g->vals[k.hi])) &&
               !dt_graph_used_alone(g, &g->vals[k.hi]))
            k.hi++;
        dt_pool_run(g->pool, forward_task, &k);
        i = k.hi;
    }
    DT_TRACE_END(tr, "graph", "forward", "batch", batch);
    DT_TRY(task_status(g, g->split, "forward"));
    return dt_graph_pass_use(g, DT_USE_END, false);
}

const float *dt_graph_output(const dt_graph *g) {
    return g && g->output >= 0 ? dt_graph_val_data(&g->vals[g->output]) : NULL;
}
const float *dt_graph_node_output(const dt_graph *g, int node) {
    return g && node >= 0 && node < g->nvals ? dt_graph_val_data(&g->vals[node]) : NULL;
}
const float *dt_graph_input_grad(const dt_graph *g, int input) {
    if (!g || !g->input_grad)
        return NULL;
    for (int i = 0, k = 0; i < g->nvals; i++)
        if (!g->vals[i].layer && k++ == input)
            return g->vals[i].written ? g->vals[i].dy : NULL;
    return NULL;
}

// ------------------------------------------------------------------------ backward

static bool wants_grad(const dt_graph *g, const gval *v) {
    if (v->shape.dtype != DT_ELEM_F32)
        return false;
    return v->layer ? true : g->input_grad;
}

// Whether node v's backward leaves every thread where the next may start without
// meeting: false after the nodes that end with the threads meeting.
static bool ends_met(const dt_graph *g, const gval *v) {
    return dt_graph_whole(v) || v->su.nparams || dt_graph_sharded(g, v);
}

// What backward does, decided before the threads start: each node's input-gradient
// targets (as the graph's bookkeeping of which gradients are written so far), whether
// its own gradient must be zeroed, and where the threads must meet because a gradient
// buffer changes layout (another value of another size) under them.
static void plan_backward(dt_graph *g) {
    int     n        = g->nvals;
    float **bufs     = g->plan_buf;
    size_t *layout   = g->plan_lay;
    int     nb       = 0; // buffers touched since the threads last met, with their layouts
    bool    tmp_used = false;
    for (int i = 0; i < n; i++)
        g->vals[i].written = false;
    g->vals[g->output].written = true;
    for (int i = n - 1; i >= 0; i--) {
        gval *v = &g->vals[i];
        if (!v->layer)
            continue;
        v->bzero    = !v->written;
        v->written  = true;
        size_t toff = 0;
        for (int j = 0; j < v->nin; j++) {
            gval *u       = &g->vals[v->in[j]];
            v->bdx[j]     = NULL;
            v->bdirect[j] = false;
            if (v->su.no_input_grad || !wants_grad(g, u))
                continue;
            bool taken = u->written;
            for (int q = 0; q < j; q++)
                taken = taken || (v->in[q] == v->in[j] && v->bdirect[q]);
            if (!taken) {
                v->bdx[j]     = u->dy;
                v->bdirect[j] = true;
            } else {
                v->bdx[j] = g->tmp + toff;
                toff += dt_graph_val_floats(u, g->batch);
            }
        }
        for (int j = 0; j < v->nin; j++)
            if (v->bdx[j])
                g->vals[v->in[j]].written = true;
        // The buffers this node reads and writes, by the per-sample size they are used at.
        float *acc[DT_LAYER_MAX_INPUTS + 1];
        size_t lay[DT_LAYER_MAX_INPUTS + 1];
        int    na   = 0;
        bool   meet = toff > 0 && tmp_used;
        acc[na]     = v->dy;
        lay[na++]   = dt_shape_numel(&v->shape);
        for (int j = 0; j < v->nin; j++)
            if (v->bdirect[j]) {
                acc[na]   = v->bdx[j];
                lay[na++] = dt_shape_numel(&g->vals[v->in[j]].shape);
            }
        for (int a = 0; a < na && !meet; a++)
            for (int b = 0; b < nb; b++)
                meet = meet || (bufs[b] == acc[a] && layout[b] != lay[a]);
        v->bmeet = meet;
        if (meet) {
            nb       = 0;
            tmp_used = false;
        }
        for (int a = 0; a < na; a++) {
            int b = 0;
            while (b < nb && bufs[b] != acc[a])
                b++;
            bufs[b]   = acc[a];
            layout[b] = lay[a];
            nb += b == nb;
        }
        tmp_used = tmp_used || toff > 0;
        if (ends_met(g, v)) {
            nb       = 0;
            tmp_used = false;
        }
    }
}

// Thread ith's slice [lo, hi) of n floats.
static void slice(size_t n, int ith, int nth, size_t *lo, size_t *hi) {
    *lo = n * (size_t)ith / (size_t)nth;
    *hi = n * (size_t)(ith + 1) / (size_t)nth;
}

// Node v's gradient by shards: this thread takes shards ith, ith + nth, ...
static void backward_shards(dt_graph *g, gval *v, int i, int ith, int nth) {
    size_t np = dt_params_numel(g->params);
    for (int sh = ith; sh < g->shards; sh += nth) {
        float *base = g->shard_buf + (size_t)sh * np, *dw[DT_LAYER_MAX_TENSORS];
        for (int k = 0; k < v->su.nparams; k++) {
            const dt_param_info *t = dt_params_info(g->params, v->pidx[k]);
            dw[k]                  = base + t->offset;
            memset(dw[k], 0, sizeof(float) * t->count);
        }
        if (dt_graph_team(v)) { // the shard's samples in one call
            dt_layer_team tm = team_of(g, ith, nth);
            tm.s0 = sh, tm.s1 = g->batch, tm.step = g->shards;
            record(g, ith, i, call_team(g, v, true, &tm, dw));
            continue;
        }
        for (int s = sh; s < g->batch && !failed(g); s += g->shards)
            record(g, ith, i, call_layer(g, v, true, s, s + 1, ith, dw));
    }
}

// Sums node v's per-thread partials (thread order) or its shards (the fixed tree) into
// the gradient: this thread's slice of each tensor.
static void reduce_node(dt_graph *g, const gval *v, int ith, int nth, bool shards) {
    size_t np    = dt_params_numel(g->params);
    float *grads = dt_params_grads(g->params);
    for (int k = 0; k < v->su.nparams; k++) {
        const dt_param_info *t = dt_params_info(g->params, v->pidx[k]);
        size_t               lo, hi;
        slice(t->count, ith, nth, &lo, &hi);
        if (hi <= lo)
            continue;
        lo += t->offset;
        hi += t->offset;
        if (shards) {
            dt_nn_shard_tree(g->shard_buf + lo, np, g->shards, hi - lo);
            dt_nn_accumulate(hi - lo, g->shard_buf + lo, grads + lo);
            continue;
        }
        for (int th = 1; th < nth; th++) {
            float *p = g->partial[th];
            dt_nn_accumulate(hi - lo, p + lo, grads + lo);
            if (g->hooked) // under ZeRO-3 the partials' pages go back too
                dt_discard(p + lo, sizeof(float) * (hi - lo));
            else
                memset(p + lo, 0, sizeof(float) * (hi - lo));
        }
    }
}

// Reports node i's tensors whose gradients are final: those it is the earliest user of.
static dt_status report_ready(dt_graph *g, int i) {
    const gval *v  = &g->vals[i];
    int         np = dt_params_count(g->params);
    size_t      a = 0, b = 0; // a pending span [a, b) of merged tensors
    for (int k = 0; k < v->su.nparams; k++) {
        int t = v->pidx[k];
        if (g->first_user[t] != i || t >= np)
            continue;
        const dt_param_info *info = dt_params_info(g->params, t);
        if (g->merge_ready && b > a && info->offset == b) {
            b += info->count;
            continue;
        }
        if (b > a)
            DT_TRY(dt_params_grad_ready(g->params, a, b - a));
        a = info->offset;
        b = a + info->count;
    }
    return b > a ? dt_params_grad_ready(g->params, a, b - a) : DT_OK;
}

static void backward_task(void *arg, int ith, int nth) {
    task     *k  = arg;
    dt_graph *g  = k->g;
    int       b0 = (int)((int64_t)g->batch * ith / nth);
    int       b1 = (int)((int64_t)g->batch * (ith + 1) / nth);
    if (k->dout) {
        gval  *o  = &g->vals[g->output];
        size_t no = dt_shape_numel(&o->shape);
        memcpy(o->dy + (size_t)b0 * no, k->dout + (size_t)b0 * no,
               sizeof(float) * (size_t)(b1 - b0) * no);
    }
    for (int i = k->hi - 1; i >= k->lo; i--) {
        gval *v = &g->vals[i];
        if (!v->layer)
            continue;
        uint64_t t0 = g->profile && ith == 0 ? dt_now_ns() : 0;
        uint64_t c0 = g->times && ith == 0 ? dt_graph_cpu_ns() : 0;
        DT_TRACE_BEGIN(tr);
        if (v->bmeet)
            meet(g, nth);
        if (v->bzero) { // feeds nothing that reaches the output: a zero gradient
            size_t ny = dt_shape_numel(&v->shape);
            memset(v->dy + (size_t)b0 * ny, 0, sizeof(float) * (size_t)(b1 - b0) * ny);
        }
        bool shards = dt_graph_sharded(g, v);
        if (shards) {
            meet(g, nth); // the shards' rows were written by every thread
            backward_shards(g, v, i, ith, nth);
            meet(g, nth);
        } else if (dt_graph_team(
                       v)) { // every thread calls it, failed or not: it may meet the others
            dt_layer_team tm = team_of(g, ith, nth);
            record(g, ith, i, call_team(g, v, true, &tm, NULL));
        } else if (!failed(g)) {
            record(g, ith, i, call_layer(g, v, true, b0, b1, ith, NULL));
        }
        // A team node's fan-out, added by range once every thread wrote its rows (a team
        // layer may write other threads' rows: they meet first).
        for (int j = 0; dt_graph_team(v) && j < v->nin; j++)
            if (v->bdx[j] && !v->bdirect[j]) {
                const gval *u  = &g->vals[v->in[j]];
                size_t      nu = dt_shape_numel(&u->shape);
                meet(g, nth);
                dt_nn_accumulate((size_t)(b1 - b0) * nu, v->bdx[j] + (size_t)b0 * nu,
                                 u->dy + (size_t)b0 * nu);
            }
        if (v->su.nparams) {
            bool partials =
                !shards && nth > 1 && (!dt_graph_team(v) || v->su.grad == DT_LAYER_GRAD_PARTIAL);
            if (!shards)
                meet(g, nth);
            if (partials || shards) {
                reduce_node(g, v, ith, nth, shards);
                meet(g, nth);
            }
            if (ith == 0)
                record(g, 0, i, report_ready(g, i));
        }
        DT_TRACE_END(tr, "backward", v->layer->ops->kind, "node", i);
        if (t0) {
            v->bwd_ns += dt_now_ns() - t0;
            v->bwd_flop += dt_graph_node_flop(g, v, true);
        }
        if (c0)
            g->times[2 * i + 1] += (double)(dt_graph_cpu_ns() - c0) * 1e-9;
    }
}

dt_status dt_graph_backward(dt_graph *g, const float *dout) {
    if (!g || !g->finalized || g->batch < 1)
        return dt_fail(DT_ERR_STATE, "dt_graph_backward: expected a forward first");
    if (!dout)
        return dt_fail(DT_ERR_ARG, "dt_graph_backward: expected dout, found NULL");
    if (g->split != g->nthreads)
        return dt_fail(DT_ERR_STATE,
                       "dt_graph_backward: the thread count changed since forward (%d, now %d)",
                       g->split, g->nthreads);
    DT_TRY(dt_graph_thread_buffers(g));
    plan_backward(g);
    begin_pass(g, g->split, true);
    DT_TRY(dt_graph_pass_use(g, DT_USE_BEGIN, true));
    DT_TRACE_BEGIN(tr);
    const float *first = dout; // copied in by the first task, or here
    for (int i = g->nvals; i > 0 && !failed(g);) {
        gval *v     = &g->vals[i - 1];
        bool  alone = dt_graph_used_alone(g, v);
        if (alone)
            record(g, 0, i - 1, dt_graph_node_use(g, v, DT_USE_ACQUIRE, true));
        if (failed(g))
            break;
        if (v->layer && dt_graph_whole(v)) {
            if (first) {
                gval *o = &g->vals[g->output];
                memcpy(o->dy, first, sizeof(float) * dt_graph_val_floats(o, g->batch));
                first = NULL;
            }
            run_whole(g, --i, true);
            if (v->su.nparams && !failed(g))
                record(g, 0, i, report_ready(g, i));
        } else {
            task k = {g, i, i, first};
            while (!alone && k.lo > 0 &&
                   !(g->vals[k.lo - 1].layer && dt_graph_whole(&g->vals[k.lo - 1])) &&
                   !dt_graph_used_alone(g, &g->vals[k.lo - 1]))
                k.lo--;
            if (alone)
                k.lo = i - 1;
            dt_pool_run(g->pool, backward_task, &k);
            first = NULL;
            i     = k.lo;
        }
        if (alone && !failed(g))
            record(g, 0, i, dt_graph_node_use(g, v, DT_USE_RELEASE, true));
    }
    DT_TRACE_END(tr, "graph", "backward", "batch", g->batch);
    DT_TRY(task_status(g, g->split, "backward"));
    return dt_graph_pass_use(g, DT_USE_END, true);
}
