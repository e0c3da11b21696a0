// graph_pipe.c: what pipeline parallelism (src/parallel/pipe.c) needs from a graph:
// sets of values per micro-batch in flight (slots), the table of ties, and a stage's
// subgraph extracted with its layers' original positions (graph.h).
#include "nn/graph/graph_impl.h"

#include <stdio.h>
#include <string.h>

dt_status dt_graph_set_slots(dt_graph *g, int n) {
    if (!g || !g->finalized || n < 1)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_slots: expected a finalized graph and n >= 1, "
                       "found n = %d",
                       n);
    dt_graph_release_buffers(g); // before the slots that own them go
    dt_graph_release_slots(g);   // keeps the selected slot's keys in g->keys
    g->batch = 0;
    if (n == 1)
        return DT_OK;
    size_t nv = (size_t)g->nvals;
    g->slots  = dt_alloc_zero(sizeof(gslot) * (size_t)n);
    if (!g->slots)
        return DT_ERR_NOMEM;
    g->nslots = n;
    for (int s = 0; s < n; s++) { // one block per slot: y, saved, ext, fwd_training
        void **blk = dt_alloc_zero(nv * (3 * sizeof(void *) + sizeof(bool)) + 1);
        if (!blk)
            return DT_ERR_NOMEM;
        g->slots[s].y            = (float **)blk;
        g->slots[s].saved        = (float **)blk + nv;
        g->slots[s].ext          = (const float **)blk + 2 * nv;
        g->slots[s].fwd_training = (bool *)(blk + 3 * nv);
    }
    return DT_OK;
}

dt_status dt_graph_use_slot(dt_graph *g, int slot) {
    if (!g || slot < 0 || slot >= (g->nslots ? g->nslots : 1))
        return dt_fail(DT_ERR_ARG, "dt_graph_use_slot: expected a slot in [0, %d), found %d",
                       g && g->nslots ? g->nslots : 1, slot);
    if (!g->nslots || slot == g->slot)
        return DT_OK;
    gslot *a = &g->slots[g->slot], *b = &g->slots[slot];
    for (int i = 0; i < g->nvals; i++) {
        gval *v            = &g->vals[i];
        a->ext[i]          = v->ext;
        a->fwd_training[i] = v->fwd_training;
        v->ext             = b->ext[i];
        v->fwd_training    = b->fwd_training[i];
        if (v->layer) {
            v->y     = b->y[i];
            v->saved = b->saved[i];
        }
    }
    a->batch = g->batch;
    a->keys  = g->keys;
    a->nkeys = g->nkeys;
    g->batch = b->batch;
    g->keys  = b->keys;
    g->nkeys = b->nkeys;
    b->keys  = NULL;
    g->slot  = slot;
    return DT_OK;
}

int dt_graph_num_ties(const dt_graph *g) {
    int n = 0;
    for (int i = 0; g && i < g->nvals; i++)
        for (int k = 0; g->vals[i].layer && k < g->vals[i].su.nparams; k++)
            n += g->vals[i].tie_val[k] >= 0;
    return n;
}

dt_status dt_graph_tie_at(const dt_graph *g, int t, char *owner, int *owner_node, int *param_node) {
    for (int i = 0, n = 0; g && i < g->nvals; i++)
        for (int k = 0; g->vals[i].layer && k < g->vals[i].su.nparams; k++) {
            const gval *v = &g->vals[i];
            if (v->tie_val[k] < 0 || n++ != t)
                continue;
            const gval *o = &g->vals[v->tie_val[k]];
            snprintf(owner, DT_PARAM_NAME_MAX + 1, "%s.%s", o->name,
                     o->su.params[v->tie_k[k]].name);
            *owner_node = v->tie_val[k];
            *param_node = i;
            return DT_OK;
        }
    return dt_fail(DT_ERR_ARG, "dt_graph_tie_at: no tie %d (%d ties)", t, dt_graph_num_ties(g));
}

dt_status dt_graph_extract(dt_graph **out, dt_graph *whole, int first, int last) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "dt_graph_extract: expected an output pointer, found NULL");
    *out = NULL;
    if (!whole || whole->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_extract: expected a graph not yet finalized");
    if (first < 0 || last < first || last >= whole->nvals)
        return dt_fail(DT_ERR_ARG, "dt_graph_extract: expected nodes 0 <= %d <= %d < %d", first,
                       last, whole->nvals);
    for (int i = first; i <= last; i++) {
        const gval *v = &whole->vals[i];
        if (v->moved)
            return dt_fail(DT_ERR_STATE, "dt_graph_extract: node '%s' was extracted already",
                           v->name);
    }
    int *map = dt_alloc(sizeof(int) * (size_t)whole->nvals);
    if (!map)
        return DT_ERR_NOMEM;
    for (int i = 0; i < whole->nvals; i++)
        map[i] = -1;
    dt_graph     *g  = NULL;
    dt_graph_opts o  = {.max_nodes = whole->cap};
    dt_status     st = dt_graph_new(&g, &o);
    // The values read from before the range become inputs, in the order of their first
    // reader; graph inputs inside the range stay inputs.
    for (int i = first; st == DT_OK && i <= last; i++) {
        const gval *v = &whole->vals[i];
        for (int j = 0; j < v->nin && st == DT_OK; j++)
            if (v->in[j] < first && map[v->in[j]] < 0) {
                map[v->in[j]] = g->nvals;
                st = dt_graph_input(g, whole->vals[v->in[j]].name, &whole->vals[v->in[j]].shape);
            }
    }
    for (int i = first; st == DT_OK && i <= last; i++) {
        gval *v        = &whole->vals[i];
        gval *n        = &g->vals[g->nvals];
        *n             = *v;
        n->nconsumers  = 0;
        n->param_layer = g->nvals;
        for (int j = 0; j < v->nin; j++) {
            n->in[j] = map[v->in[j]];
            g->vals[n->in[j]].nconsumers++;
        }
        for (int k = 0; v->layer && k < v->su.nparams; k++) {
            int ov = v->tie_val[k];
            if (ov >= 0 && ov >= first) {
                n->tie_val[k] = map[ov];
            } else if (ov >= 0) { // the owner stays behind: a copy under its name
                n->tie_val[k] = -1;
                snprintf(n->copy_of[k], sizeof n->copy_of[k], "%s.%s", whole->vals[ov].name,
                         whole->vals[ov].su.params[v->tie_k[k]].name);
            }
        }
        map[i] = g->nvals++;
        if (v->layer) {
            g->output = map[i];
            v->layer  = NULL; // the new graph owns it now
            v->moved  = true;
        }
    }
    dt_free(map);
    if (st == DT_OK && g->output < 0)
        st = dt_fail(DT_ERR_ARG, "dt_graph_extract: nodes %d..%d hold no layer", first, last);
    if (st != DT_OK) {
        dt_graph_free(g);
        return st;
    }
    *out = g;
    return DT_OK;
}

dt_status dt_graph_param_table(const dt_graph *g, bool whole, dt_params **out) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "dt_graph_param_table: expected an output pointer");
    *out = NULL;
    if (!g)
        return dt_fail(DT_ERR_ARG, "dt_graph_param_table: expected a graph, found NULL");
    int *order = dt_alloc(sizeof(int) * (size_t)(g->nvals ? g->nvals : 1));
    if (!order)
        return DT_ERR_NOMEM;
    dt_params *p  = NULL;
    dt_status  st = dt_params_new(&p, NULL);
    char       name[DT_PARAM_NAME_MAX + 2];
    int        np = 0;
    // The order and names of dt_graph_finalize's registration (graph.c).
    int m = dt_graph_tensor_order(g, order);
    for (int q = 0; q < m && st == DT_OK; q++) {
        const gval *v = &g->vals[order[q]];
        for (int k = 0; k < v->su.nparams && st == DT_OK; k++) {
            if (v->tie_val[k] >= 0)
                continue;
            const dt_layer_tensor *t = &v->su.params[k];
            if (v->copy_of[k][0])
                snprintf(name, sizeof name, "%s", v->copy_of[k]);
            else if (snprintf(name, sizeof name, "%s.%s", dt_graph_tensor_node(v), t->name) >
                     DT_PARAM_NAME_MAX)
                st = dt_fail(DT_ERR_ARG, "graph: tensor name '%s.%s' is longer than %d bytes",
                             dt_graph_tensor_node(v), t->name, DT_PARAM_NAME_MAX);
            int64_t shape[DT_PARAM_MAX_DIMS];
            for (int d = 0; d < DT_PARAM_MAX_DIMS; d++)
                shape[d] = t->shape[d];
            if (whole)
                dt_param_split_whole_shape(&t->split, t->ndim, t->shape, shape);
            if (st == DT_OK)
                st = dt_params_add_ex(p, name, t->ndim, shape, t->flags, v->param_layer, false);
            // whole: the unsplit shape, and the part this graph's layer holds of it
            if (st == DT_OK && dt_param_split_on(&t->split))
                st = dt_params_set_split(p, np, &t->split);
            np++;
        }
        for (int k = 0; k < v->su.nbuffers && st == DT_OK; k++) {
            const dt_layer_tensor *t = &v->su.buffers[k];
            if (snprintf(name, sizeof name, "%s.%s", dt_graph_tensor_node(v), t->name) >
                DT_PARAM_NAME_MAX)
                st = dt_fail(DT_ERR_ARG, "graph: tensor name '%s.%s' is longer than %d bytes",
                             dt_graph_tensor_node(v), t->name, DT_PARAM_NAME_MAX);
            else
                st = dt_params_add_ex(p, name, t->ndim, t->shape, t->flags, v->param_layer, true);
        }
    }
    dt_free(order);
    if (st != DT_OK) {
        dt_params_free(p);
        return st;
    }
    *out = p;
    return DT_OK;
}

dt_status dt_graph_set_timing(dt_graph *g, bool on) {
    if (!g)
        return dt_fail(DT_ERR_ARG, "dt_graph_set_timing: expected a graph, found NULL");
    dt_free(g->times);
    g->times = NULL;
    if (on && !(g->times = dt_alloc_zero(sizeof(double) * 2 * (size_t)(g->cap ? g->cap : 1))))
        return DT_ERR_NOMEM;
    return DT_OK;
}

void dt_graph_node_seconds(const dt_graph *g, int node, double *forward, double *backward) {
    bool ok = g && g->times && node >= 0 && node < g->nvals;
    if (forward)
        *forward = ok ? g->times[2 * node] : 0.0;
    if (backward)
        *backward = ok ? g->times[2 * node + 1] : 0.0;
}
