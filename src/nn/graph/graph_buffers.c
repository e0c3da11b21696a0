// graph_buffers.c: what a finalized graph holds between passes (graph.h): its value
// buffers, threads and their buffers, gradient shards, precision and the 16-bit
// shadows of weights, the parameter-use announcements of ZeRO-3, and the profile.
// graph_run.c runs the passes over them.
//
// Memory per value: its output y (batch x numel), the layer's saved state; the
// gradients dy of the nodes share buffers by liveness (share_dy), and a node that works
// in place (an alias, graph_pass.c) shares its input's y and dy; scratch and the
// temporaries for fan-out are shared by all nodes.
#include "dtrain/trace.h"

#include "nn/graph/graph_impl.h"
#include "nn/layers/layers_impl.h"

#include "nn/ops.h"
#include "nn/prec.h"

#include <stdio.h>
#include <string.h>

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
        size_t f   = dt_graph_val_floats(&g->vals[v], batch);
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

// Floats of scratch node v needs on one thread for `batch` samples.
static size_t node_scratch(const dt_graph *g, const gval *v, int batch) {
    size_t f = v->su.scratch_per_sample * (size_t)batch + v->su.scratch_fixed;
    return dt_graph_team(v) ? f + v->su.scratch_per_shard * (size_t)g->shards : f;
}

dt_status dt_graph_reserve_buffers(dt_graph *g, int batch) {
    if (batch <= g->reserved && g->reserved16 == (g->prec != DT_PREC_FP32))
        return DT_OK;
    dt_graph_release_buffers(g);
    dt_graph_plan_aliases(g);
    DT_TRY(share_dy(g, batch));
    size_t scratch = 1, tmp = 1;
    for (int i = 0; i < g->nvals; i++) {
        gval  *v = &g->vals[i];
        size_t n = dt_graph_val_floats(v, batch);
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
            t += dt_graph_val_floats(&g->vals[v->in[j]], batch);
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
    return dt_graph_reserve_buffers(g, batch);
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
dt_status dt_graph_thread_buffers(dt_graph *g) {
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
    if (!g || shards < 0 || shards > 64)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_grad_shards: expected 0 gradient shards (off) or 1 to 64, "
                       "found %d",
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
dt_status dt_graph_fill_shadows(dt_graph *g) {
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
dt_status dt_graph_node_use(dt_graph *g, gval *v, dt_param_use what, bool backward) {
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
dt_status dt_graph_pass_use(dt_graph *g, dt_param_use what, bool backward) {
    if (what == DT_USE_BEGIN)
        g->hooked = dt_params_has_use_hook(g->params);
    return g->hooked ? dt_params_use(g->params, what, backward, NULL, 0) : DT_OK;
}

// Under a use consumer a node with tensors runs as a task of its own, between its
// announcements (its tensors are there only meanwhile).
bool dt_graph_used_alone(const dt_graph *g, const gval *v) {
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
    if (v->layer)
        lay_kernel_name(v->layer, v->nin ? &g->vals[v->in[0]].shape : NULL, out->kernel,
                        sizeof out->kernel);
    return DT_OK;
}

// The operations of node v's pass over the batch, as its layer declares them per
// sample: a forward's; in backward, one such for the parameters' gradient and one for
// the inputs', where each is computed.
double dt_graph_node_flop(const dt_graph *g, const gval *v, bool backward) {
    double f = (double)v->su.flops_per_sample * g->batch;
    if (!backward)
        return f;
    bool dx = false;
    for (int j = 0; j < v->nin; j++)
        dx = dx || v->bdx[j];
    return f * ((v->su.nparams > 0) + dx);
}
