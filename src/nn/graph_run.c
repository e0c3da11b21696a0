// graph_run.c: running a finalized graph (graph.h): its buffers, its threads, forward
// and backward.
//
// Memory per value: its output y (batch x numel), the layer's saved state; the
// gradients dy of the nodes share buffers by liveness (share_dy), and a node that works
// in place (an alias, graph_pass.c) shares its input's y and dy; scratch and the
// temporaries for fan-out are shared by all nodes.
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
// itself). Team layers (layer.h's DT_LAYER_TEAM: the Sequential model's, seq.h) are
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

#include "nn/graph_impl.h"

#include "nn/ops.h"
#include "nn/prec.h"
#include "nn/seq.h"

#include <stdio.h>
#include <string.h>

static size_t val_floats(const gval *v, int batch) {
    return dt_shape_numel(&v->shape) * (size_t)batch;
}

static const float *val_data(const gval *v) {
    return v->layer ? v->y : v->ext;
}

// ------------------------------------------------------------------------- buffers

void dt_graph_release_buffers(dt_graph *g) {
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!g->nslots) { // else the slots own them
            if (v->alias < 0)
                dt_free(v->y);
            dt_free(v->saved);
        }
        if (!v->layer) // a node's dy is one of the shared slots
            dt_free(v->dy);
        v->y = v->dy = v->saved = NULL;
    }
    for (int s = 0; s < g->nslots; s++)
        for (int i = 0; i < g->nvals; i++) {
            if (g->vals[i].alias < 0)
                dt_free(g->slots[s].y[i]);
            dt_free(g->slots[s].saved[i]);
            g->slots[s].y[i] = g->slots[s].saved[i] = NULL;
        }
    dt_free(g->scratch);
    dt_free(g->tmp);
    g->scratch = g->tmp = NULL;
    dt_free(g->pos_keys);
    dt_free(g->plan_buf);
    dt_free(g->plan_lay);
    g->pos_keys = NULL;
    g->plan_buf = NULL;
    g->plan_lay = NULL;
    for (int k = 0; k < g->ndy; k++)
        dt_free(g->dyslot[k]);
    dt_free(g->dyslot);
    g->dyslot   = NULL;
    g->ndy      = 0;
    g->reserved = 0;
}

void dt_graph_free_thread_buffers(dt_graph *g) {
    size_t np = g->params ? dt_params_numel(g->params) : 0;
    for (int t = 1; t < g->tbuf_n; t++) {
        if (g->partial)
            dt_free_pages(g->partial[t], sizeof(float) * (np ? np : 1));
        if (g->tscratch)
            dt_free(g->tscratch[t]);
    }
    dt_free(g->partial);
    dt_free(g->tscratch);
    dt_free(g->tstatus);
    dt_free(g->tfail);
    g->partial = g->tscratch = NULL;
    g->tstatus               = NULL;
    g->tfail                 = NULL;
    g->tbuf_n                = 0;
    g->tscratch_n            = 0;
}

// The gradient of node v is live in backward from its last consumer's backward (which
// writes it; the output: from the start) to v's own (which reads it last). Nodes whose
// intervals do not overlap share one buffer: greedily, in backward order, a node takes
// a slot whose last holder's own backward came before this node's first write (index
// above it). The live set of a chain of blocks is a few values, not all of them. An
// in-place node and the values it works on are one interval: the first write of the
// last of them to the own backward of the first.
static dt_status share_dy(dt_graph *g, int batch) {
    int     n    = g->nvals;
    int    *last = dt_alloc(sizeof(int) * (size_t)n * 3), *order = last + n, *holder = last + 2 * n;
    size_t *size    = dt_alloc_zero(sizeof(size_t) * (size_t)n);
    int    *slot_of = dt_alloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!last || !size || !slot_of) {
        dt_free(last);
        dt_free(size);
        dt_free(slot_of);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        last[i] = i == g->output ? n : i;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g->vals[i].nin; j++)
            if (last[g->vals[i].in[j]] < i)
                last[g->vals[i].in[j]] = i;
    for (int i = n - 1; i >= 0; i--) { // a group's interval on its root
        int r = dt_graph_root(g, i);
        if (r != i && last[i] > last[r])
            last[r] = last[i];
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (g->vals[i].layer && g->vals[i].alias < 0) { // by last consumer, latest first
            int k = m++;
            while (k > 0 && last[order[k - 1]] < last[i]) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = i;
        }
    int ns = 0;
    for (int q = 0; q < m; q++) {
        int v = order[q], s = -1;
        for (int k = 0; k < ns && s < 0; k++)
            if (holder[k] > last[v])
                s = k;
        if (s < 0)
            s = ns++;
        holder[s]  = v;
        slot_of[v] = s;
        size_t f   = val_floats(&g->vals[v], batch);
        if (f > size[s])
            size[s] = f;
    }
    dt_status st = DT_OK;
    g->dyslot    = dt_alloc_zero(sizeof(float *) * (size_t)(ns ? ns : 1));
    if (!g->dyslot)
        st = DT_ERR_NOMEM;
    for (int k = 0; !st && k < ns; k++) {
        g->ndy       = k + 1;
        g->dyslot[k] = dt_alloc(sizeof(float) * (size[k] ? size[k] : 1));
        if (!g->dyslot[k])
            st = DT_ERR_NOMEM;
    }
    for (int i = 0; !st && i < n; i++)
        if (g->vals[i].layer)
            g->vals[i].dy = g->dyslot[slot_of[dt_graph_root(g, i)]];
    dt_free(slot_of);
    dt_free(last);
    dt_free(size);
    return st;
}

static bool team(const gval *v);

// Floats of scratch node v needs on one thread for `batch` samples.
static size_t node_scratch(const dt_graph *g, const gval *v, int batch) {
    size_t f = v->su.scratch_per_sample * (size_t)batch + v->su.scratch_fixed;
    return team(v) ? f + v->su.scratch_per_shard * (size_t)g->shards : f;
}

static dt_status reserve(dt_graph *g, int batch) {
    if (batch <= g->reserved && g->reserved16 == (g->prec != DT_PREC_FP32))
        return DT_OK;
    dt_graph_release_buffers(g);
    dt_graph_plan_aliases(g);
    DT_TRY(share_dy(g, batch));
    size_t scratch = 1, tmp = 1;
    for (int i = 0; i < g->nvals; i++) {
        gval  *v = &g->vals[i];
        size_t n = val_floats(v, batch);
        if (!v->layer) {
            v->dy = dt_alloc(sizeof(float) * (n ? n : 1));
            if (!v->dy)
                return DT_ERR_NOMEM;
            continue;
        }
        size_t s = v->su.saved_per_sample * (size_t)batch + v->su.saved_fixed +
                   dt_graph_saved16_floats(g, v, batch);
        int r = dt_graph_root(g, i);
        for (int k = 0; k < (g->nslots ? g->nslots : 1); k++) {
            v->y     = v->alias >= 0 ? (g->nslots ? g->slots[k].y[r] : g->vals[r].y)
                                     : dt_alloc(sizeof(float) * (n ? n : 1));
            v->saved = dt_alloc(sizeof(float) * (s ? s : 1));
            if (g->nslots) {
                g->slots[k].y[i]     = v->y;
                g->slots[k].saved[i] = v->saved;
            }
            if (!v->y || !v->saved)
                return DT_ERR_NOMEM;
        }
        if (g->nslots) {
            v->y     = g->slots[g->slot].y[i];
            v->saved = g->slots[g->slot].saved[i];
        }
        size_t sc = node_scratch(g, v, batch), t = 0;
        if (sc > scratch)
            scratch = sc;
        for (int j = 0; j < v->nin; j++)
            t += val_floats(&g->vals[v->in[j]], batch);
        if (t > tmp)
            tmp = t;
    }
    g->scratch  = dt_alloc(sizeof(float) * scratch);
    g->tmp      = dt_alloc(sizeof(float) * tmp);
    g->pos_keys = dt_alloc(sizeof(uint64_t) * (size_t)batch);
    g->plan_buf = dt_alloc(sizeof(float *) * (size_t)(g->nvals + 1));
    g->plan_lay = dt_alloc(sizeof(size_t) * (size_t)(g->nvals + 1));
    if (!g->scratch || !g->tmp || !g->pos_keys || !g->plan_buf || !g->plan_lay)
        return DT_ERR_NOMEM;
    for (int i = 0; i < batch; i++)
        g->pos_keys[i] = (uint64_t)i;
    g->scratch_n  = scratch;
    g->tmp_n      = tmp;
    g->reserved   = batch;
    g->reserved16 = g->prec != DT_PREC_FP32;
    return DT_OK;
}

dt_status dt_graph_reserve(dt_graph *g, int batch) {
    if (!g || !g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_reserve: expected a finalized graph");
    if (batch < 1)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_reserve: expected a batch of at least 1 sample, "
                       "found %d",
                       batch);
    return reserve(g, batch);
}

dt_status dt_graph_set_threads(dt_graph *g, int threads) {
    if (!g || threads < 1 || threads > 256)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_threads: expected a graph and 1 to 256 threads, found %d",
                       threads);
    if (threads == g->nthreads)
        return DT_OK;
    dt_pool_free(g->pool);
    g->pool = NULL;
    dt_graph_free_thread_buffers(g);
    g->nthreads = threads;
    if (threads > 1 && !(g->pool = dt_pool_init(threads))) {
        g->nthreads = 1;
        return dt_fail_context("dt_graph_set_threads");
    }
    return DT_OK;
}

int dt_graph_threads(const dt_graph *g) {
    return g ? g->nthreads : 1;
}

// Scratch and gradient partials of threads 1.., each thread's status, the shards.
static dt_status thread_buffers(dt_graph *g) {
    size_t np = dt_params_numel(g->params);
    if (g->shards && !g->shard_buf &&
        !(g->shard_buf = dt_alloc_zero(sizeof(float) * (size_t)g->shards * (np ? np : 1))))
        return DT_ERR_NOMEM;
    int n = g->nthreads;
    if (g->tbuf_n == n && g->tscratch_n >= g->scratch_n)
        return DT_OK;
    dt_graph_free_thread_buffers(g);
    g->partial    = dt_alloc_zero(sizeof(float *) * (size_t)n);
    g->tscratch   = dt_alloc_zero(sizeof(float *) * (size_t)n);
    g->tstatus    = dt_alloc_zero(sizeof(dt_status) * (size_t)n);
    g->tfail      = dt_alloc_zero(sizeof(int) * (size_t)n);
    g->tbuf_n     = n;
    g->tscratch_n = g->scratch_n;
    if (!g->partial || !g->tscratch || !g->tstatus || !g->tfail)
        return DT_ERR_NOMEM;
    for (int t = 1; t < n; t++) {
        g->partial[t]  = dt_alloc_pages(sizeof(float) * (np ? np : 1)); // zeroed
        g->tscratch[t] = dt_alloc(sizeof(float) * g->scratch_n);
        if (!g->partial[t] || !g->tscratch[t])
            return DT_ERR_NOMEM;
    }
    return DT_OK;
}

dt_status dt_graph_set_grad_shards(dt_graph *g, int shards) {
    if (!g || shards < 0 || shards > 64 || (shards & (shards - 1)))
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_grad_shards: expected 0 gradient shards (off) or a power "
                       "of two up to 64, found %d",
                       shards);
    if (shards == g->shards)
        return DT_OK;
    dt_free(g->shard_buf);
    g->shard_buf = NULL;
    g->shards    = shards;
    return g->finalized ? dt_graph_setup_again(g) : DT_OK;
}

int dt_graph_batch_coupled(const dt_graph *g) {
    for (int i = 0; g && i < g->nvals; i++)
        if (g->vals[i].layer && g->vals[i].su.batch_coupled)
            return i;
    return -1;
}

int dt_graph_grad_shards(const dt_graph *g) {
    return g ? g->shards : 0;
}

dt_status dt_graph_setup_node(dt_graph *g, int i) {
    gval *v = &g->vals[i];
    if (!v->layer)
        return DT_OK;
    dt_shape in[DT_LAYER_MAX_INPUTS];
    for (int j = 0; j < v->nin; j++)
        in[j] = g->vals[v->in[j]].shape;
    dt_layer_setup su = {.precision = g->prec};
    dt_status      st = v->layer->ops->setup(v->layer, v->nin, in, &su);
    if (st == DT_OK && (su.nparams != v->su.nparams || su.nbuffers != v->su.nbuffers ||
                        dt_shape_numel(&su.out) != dt_shape_numel(&v->su.out)))
        st = dt_fail(DT_ERR_STATE, "its tensors or output changed with the precision");
    if (st != DT_OK)
        return dt_fail_context("node '%s' (%s)", v->name, v->layer->ops->kind);
    su.out = v->su.out; // a fusion's output keeps the shape it took over
    v->su  = su;
    return DT_OK;
}

dt_status dt_graph_setup_again(dt_graph *g) {
    dt_graph_release_buffers(g);
    dt_graph_free_thread_buffers(g);
    g->batch = 0;
    for (int i = 0; i < g->nvals; i++)
        DT_TRY(dt_graph_setup_node(g, i));
    return DT_OK;
}

dt_status dt_graph_set_precision(dt_graph *g, dt_precision p) {
    if (!g || (p != DT_PREC_FP32 && p != DT_PREC_BF16 && p != DT_PREC_FP16))
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_precision: expected a graph and fp32, bf16 or "
                       "fp16, found mode %d",
                       (int)p);
    if (p == g->prec)
        return DT_OK;
    g->prec = p; // every layer's setup sees it (a 16-bit conv2d takes other kernels)
    return g->finalized ? dt_graph_setup_again(g) : DT_OK;
}

dt_precision dt_graph_precision(const dt_graph *g) {
    return g ? g->prec : DT_PREC_FP32;
}

static void free_shadows(dt_graph *g) {
    for (int i = 0; i < g->nvals; i++)
        for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++) {
            dt_free(g->vals[i].w16[k]);
            g->vals[i].w16[k] = NULL;
        }
}

void dt_graph_free_shadows(dt_graph *g) {
    free_shadows(g);
}

static dt_status fill_node_shadows(dt_graph *g, gval *v) {
    for (int k = 0; g->prec != DT_PREC_FP32 && k < v->su.nparams; k++) {
        if (!(v->su.lowp_params & (1u << k)))
            continue;
        size_t n = dt_params_info(g->params, v->pidx[k])->count;
        if (!v->w16[k] && !(v->w16[k] = dt_alloc(dt_ac_shadow_bytes(g->prec, n))))
            return DT_ERR_NOMEM;
        dt_ac_shadow_fill(g->prec, v->w[k], n, v->w16[k]);
    }
    return DT_OK;
}

// The weights' 16-bit shadows, made once per forward from the fp32 masters (the
// optimizer changes them between steps); backward reads the same copies. With a
// parameter-use consumer the weights are only there while their node runs: each
// node's shadows are made then (again in backward: the same rounding, the same
// copies) and freed with the weights (node_use).
static dt_status fill_shadows(dt_graph *g) {
    if (g->prec == DT_PREC_FP32)
        return DT_OK;
    if (g->w16_prec != g->prec)
        free_shadows(g);
    g->w16_prec = g->prec;
    for (int i = 0; !g->hooked && i < g->nvals; i++)
        if (g->vals[i].layer)
            DT_TRY(fill_node_shadows(g, &g->vals[i]));
    return DT_OK;
}

// Node v's step of a pass under a parameter-use consumer (ZeRO-3): the tensors it reads
// (a tied one under its owner's index), each once, announced before and after
// (params.h), on the calling thread while no task runs.
static dt_status node_use(dt_graph *g, gval *v, dt_param_use what, bool backward) {
    int t[DT_LAYER_MAX_TENSORS], n = 0;
    for (int k = 0; k < v->su.nparams; k++) {
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup = dup || t[j] == v->pidx[k];
        if (!dup)
            t[n++] = v->pidx[k];
    }
    if (what == DT_USE_RELEASE)
        for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++) {
            dt_free(v->w16[k]);
            v->w16[k] = NULL;
        }
    dt_status st = n ? dt_params_use(g->params, what, backward, t, n) : DT_OK;
    return st == DT_OK && what == DT_USE_ACQUIRE ? fill_node_shadows(g, v) : st;
}

// A pass's beginning or end, announced when the parameters have a use consumer.
static dt_status pass_use(dt_graph *g, dt_param_use what, bool backward) {
    if (what == DT_USE_BEGIN)
        g->hooked = dt_params_has_use_hook(g->params);
    return g->hooked ? dt_params_use(g->params, what, backward, NULL, 0) : DT_OK;
}

// Under a use consumer a node with tensors runs as a task of its own, between its
// announcements (its tensors are there only meanwhile).
static bool used_alone(const dt_graph *g, const gval *v) {
    return g->hooked && v->layer && v->su.nparams > 0;
}

void dt_graph_set_profile(dt_graph *g, bool on) {
    if (!g)
        return;
    g->profile = on;
    for (int i = 0; i < g->nvals; i++) {
        gval *v   = &g->vals[i];
        v->fwd_ns = v->bwd_ns = 0;
        v->fwd_flop = v->bwd_flop = 0;
    }
}

dt_status dt_graph_node_profile(const dt_graph *g, int node, dt_graph_profile *out) {
    if (!g || !out || node < 0 || node >= g->nvals)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_node_profile: expected a graph, a node in [0, %d) "
                       "and an output, found node %d",
                       g ? g->nvals : 0, node);
    const gval *v = &g->vals[node];
    *out          = (dt_graph_profile){.fwd_s    = (double)v->fwd_ns * 1e-9,
                                       .bwd_s    = (double)v->bwd_ns * 1e-9,
                                       .fwd_flop = v->fwd_flop,
                                       .bwd_flop = v->bwd_flop};
    return DT_OK;
}

// The operations of node v's pass over the batch, as its layer declares them per
// sample: a forward's; in backward, one such for the parameters' gradient and one for
// the inputs', where each is computed.
static double node_flop(const dt_graph *g, const gval *v, bool backward) {
    double f = (double)v->su.flops_per_sample * g->batch;
    if (!backward)
        return f;
    bool dx = false;
    for (int j = 0; j < v->nin; j++)
        dx = dx || v->bdx[j];
    return f * ((v->su.nparams > 0) + dx);
}

// ------------------------------------------------------------------- calling layers

// A layer with batch-wide state in forward (BatchNorm's statistics: saved_fixed) runs
// on the whole batch on thread 0, as one that asks for it (DT_LAYER_WHOLE); a team
// layer is called by every thread at once; every other layer is split by samples.
static bool whole(const gval *v) {
    return v->su.run == DT_LAYER_WHOLE || (v->su.run == DT_LAYER_RANGE && v->su.saved_fixed != 0);
}
static bool team(const gval *v) {
    return v->su.run == DT_LAYER_TEAM;
}
// Whether the graph forms the node's parameter gradient per shard (a team layer with a
// shared gradient sums its shards itself).
static bool sharded(const dt_graph *g, const gval *v) {
    return g->shards && v->su.nparams && !whole(v) &&
           (!team(v) || v->su.grad == DT_LAYER_GRAD_PARTIAL);
}

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
        x[j]          = val_data(u) + off * dt_shape_numel(&u->shape);
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
          .pool      = whole(v) ? g->pool : NULL, // runs whole: may share its work out
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
        x[j]  = val_data(&g->vals[v->in[j]]);
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
        if (team(v)) { // every thread calls it, failed or not: it may meet the others
            dt_layer_team tm = team_of(g, ith, nth);
            record(g, ith, i, call_team(g, v, false, &tm, NULL));
        } else if (!failed(g)) {
            record(g, ith, i, call_layer(g, v, false, b0, b1, ith, NULL));
        }
        DT_TRACE_END(tr, "forward", v->layer->ops->kind, "node", i);
        if (t0) {
            v->fwd_ns += dt_now_ns() - t0;
            v->fwd_flop += node_flop(g, v, false);
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
        memset(v->dy, 0, sizeof(float) * val_floats(v, g->batch));
    record(g, 0, i, call_layer(g, v, backward, 0, g->batch, 0, NULL));
    DT_TRACE_END(tr, backward ? "backward" : "forward", v->layer->ops->kind, "node", i);
    if (t0) {
        *(backward ? &v->bwd_ns : &v->fwd_ns) += dt_now_ns() - t0;
        *(backward ? &v->bwd_flop : &v->fwd_flop) += node_flop(g, v, backward);
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
    DT_TRY(reserve(g, batch));
    DT_TRY(thread_buffers(g));
    DT_TRY(pass_use(g, DT_USE_BEGIN, false));
    DT_TRY(fill_shadows(g));
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
        if (used_alone(g, v)) {
            record(g, 0, i, node_use(g, v, DT_USE_ACQUIRE, false));
            if (!failed(g) && whole(v)) {
                run_whole(g, i, false);
            } else if (!failed(g)) {
                task k = {g, i, i + 1, NULL};
                dt_pool_run(g->pool, forward_task, &k);
            }
            if (!failed(g))
                record(g, 0, i, node_use(g, v, DT_USE_RELEASE, false));
            i++;
            continue;
        }
        if (v->layer && whole(v)) {
            run_whole(g, i++, false);
            continue;
        }
        task k = {g, i, i, NULL};
        while (k.hi < g->nvals && !(g->vals[k.hi].layer && whole(&g->vals[k.hi])) &&
               !used_alone(g, &g->vals[k.hi]))
            k.hi++;
        dt_pool_run(g->pool, forward_task, &k);
        i = k.hi;
    }
    DT_TRACE_END(tr, "graph", "forward", "batch", batch);
    DT_TRY(task_status(g, g->split, "forward"));
    return pass_use(g, DT_USE_END, false);
}

const float *dt_graph_output(const dt_graph *g) {
    return g && g->output >= 0 ? val_data(&g->vals[g->output]) : NULL;
}
const float *dt_graph_node_output(const dt_graph *g, int node) {
    return g && node >= 0 && node < g->nvals ? val_data(&g->vals[node]) : NULL;
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
    return whole(v) || v->su.nparams || sharded(g, v);
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
                toff += val_floats(u, g->batch);
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
        if (team(v)) { // the shard's samples in one call
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
        bool shards = sharded(g, v);
        if (shards) {
            meet(g, nth); // the shards' rows were written by every thread
            backward_shards(g, v, i, ith, nth);
            meet(g, nth);
        } else if (team(v)) { // every thread calls it, failed or not: it may meet the others
            dt_layer_team tm = team_of(g, ith, nth);
            record(g, ith, i, call_team(g, v, true, &tm, NULL));
        } else if (!failed(g)) {
            record(g, ith, i, call_layer(g, v, true, b0, b1, ith, NULL));
        }
        // A team node's fan-out, added by range once every thread wrote its rows (a team
        // layer may write other threads' rows: they meet first).
        for (int j = 0; team(v) && j < v->nin; j++)
            if (v->bdx[j] && !v->bdirect[j]) {
                const gval *u  = &g->vals[v->in[j]];
                size_t      nu = dt_shape_numel(&u->shape);
                meet(g, nth);
                dt_nn_accumulate((size_t)(b1 - b0) * nu, v->bdx[j] + (size_t)b0 * nu,
                                 u->dy + (size_t)b0 * nu);
            }
        if (v->su.nparams) {
            bool partials = !shards && nth > 1 && (!team(v) || v->su.grad == DT_LAYER_GRAD_PARTIAL);
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
            v->bwd_flop += node_flop(g, v, true);
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
    DT_TRY(thread_buffers(g));
    plan_backward(g);
    begin_pass(g, g->split, true);
    DT_TRY(pass_use(g, DT_USE_BEGIN, true));
    DT_TRACE_BEGIN(tr);
    const float *first = dout; // copied in by the first task, or here
    for (int i = g->nvals; i > 0 && !failed(g);) {
        gval *v     = &g->vals[i - 1];
        bool  alone = used_alone(g, v);
        if (alone)
            record(g, 0, i - 1, node_use(g, v, DT_USE_ACQUIRE, true));
        if (failed(g))
            break;
        if (v->layer && whole(v)) {
            if (first) {
                gval *o = &g->vals[g->output];
                memcpy(o->dy, first, sizeof(float) * val_floats(o, g->batch));
                first = NULL;
            }
            run_whole(g, --i, true);
            if (v->su.nparams && !failed(g))
                record(g, 0, i, report_ready(g, i));
        } else {
            task k = {g, i, i, first};
            while (!alone && k.lo > 0 && !(g->vals[k.lo - 1].layer && whole(&g->vals[k.lo - 1])) &&
                   !used_alone(g, &g->vals[k.lo - 1]))
                k.lo--;
            if (alone)
                k.lo = i - 1;
            dt_pool_run(g->pool, backward_task, &k);
            first = NULL;
            i     = k.lo;
        }
        if (alone && !failed(g))
            record(g, 0, i, node_use(g, v, DT_USE_RELEASE, true));
    }
    DT_TRACE_END(tr, "graph", "backward", "batch", g->batch);
    DT_TRY(task_status(g, g->split, "backward"));
    return pass_use(g, DT_USE_END, true);
}
