// graph_fuse.c: the graph's fusion pass (dt_graph_fuse, graph.h). It runs on a graph
// not yet finalized and replaces chains of nodes by one node of a fused layer:
//
//   BatchNorm -> ReLU              one batchnorm*_relu node
//   BatchNorm -> Add(., r) -> ReLU  one batchnorm*_add_relu node reading (x, r)
//
// when every intermediate value is read by its one successor only (and is not the
// graph's output). The fused node takes the ReLU's name, so later nodes read what they
// read before, and declares the BatchNorm's tensors under the BatchNorm's name
// ("layer1.bn1.weight"), so checkpoints and DDP see the same parameters; it keeps the
// BatchNorm's layer position (its initialisation). The values of the nodes it replaces
// are gone: no memory for them, no passes over them.
#include "nn/graph_impl.h"
#include "nn/layers_impl.h"

#include <stdio.h>
#include <string.h>

// The node reading value v, when exactly one node reads it (once) and v is not the
// graph's output; else -1.
static int sole_reader(const dt_graph *g, int v) {
    if (g->vals[v].nconsumers != 1 || v == g->output)
        return -1;
    for (int i = v + 1; i < g->nvals; i++)
        for (int j = 0; j < g->vals[i].nin; j++)
            if (g->vals[i].in[j] == v)
                return i;
    return -1;
}

// Whether a tie involves node v's tensors (as the tied node or as the owner).
static bool tied(const dt_graph *g, int v) {
    for (int i = 0; i < g->nvals; i++)
        for (int k = 0; g->vals[i].layer && k < g->vals[i].su.nparams; k++)
            if ((i == v && g->vals[i].tie_val[k] >= 0) || g->vals[i].tie_val[k] == v)
                return true;
    return false;
}

static bool is_node(const dt_graph *g, int v) {
    return v >= 0 && g->vals[v].layer && !g->vals[v].moved;
}

// Node r becomes the fusion of BatchNorm b (and Add a, when a >= 0) with ReLU r; b and
// a are marked dead (their layers freed).
static dt_status fuse_at(dt_graph *g, int b, int a, int r, bool *dead) {
    gval     *vb = &g->vals[b], *vr = &g->vals[r];
    dt_layer *l;
    DT_TRY(lay_bn_fused_new(&l, vb->layer, a >= 0));
    gval f = {0};
    snprintf(f.name, sizeof f.name, "%s", vr->name);
    snprintf(f.tensor_node, sizeof f.tensor_node, "%s", vb->name);
    f.layer = l;
    f.nin   = 1;
    f.in[0] = vb->in[0];
    if (a >= 0) {
        const gval *va = &g->vals[a];
        f.in[f.nin++]  = va->in[0] == b ? va->in[1] : va->in[0];
    }
    dt_shape in[2];
    for (int j = 0; j < f.nin; j++)
        in[j] = g->vals[f.in[j]].shape;
    dt_status st = l->ops->setup(l, f.nin, in, &f.su);
    if (st != DT_OK) {
        dt_layer_free(l);
        return dt_fail_context("fusing '%s' into '%s'", vb->name, vr->name);
    }
    f.shape      = f.su.out;
    f.nconsumers = vr->nconsumers;
    f.layer_no   = vb->layer_no;
    for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++) {
        f.tie_val[k] = -1;
        memcpy(f.copy_of[k], vb->copy_of[k], sizeof f.copy_of[k]);
    }
    dt_layer_free(vb->layer);
    dt_layer_free(vr->layer);
    vb->layer = vr->layer = NULL;
    dead[b]               = true;
    if (a >= 0) {
        dt_layer_free(g->vals[a].layer);
        g->vals[a].layer = NULL;
        dead[a]          = true;
    }
    *vr = f;
    return DT_OK;
}

// Drops the dead values and renumbers the rest.
static void compact(dt_graph *g, const bool *dead, int *map) {
    int n = 0;
    for (int i = 0; i < g->nvals; i++)
        map[i] = dead[i] ? -1 : n++;
    for (int i = 0; i < g->nvals; i++) {
        if (dead[i])
            continue;
        gval *v = &g->vals[i];
        for (int j = 0; j < v->nin; j++)
            v->in[j] = map[v->in[j]];
        for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++)
            if (v->tie_val[k] >= 0)
                v->tie_val[k] = map[v->tie_val[k]];
        if (map[i] != i)
            g->vals[map[i]] = *v;
    }
    g->output = map[g->output];
    g->nvals  = n;
}

dt_status dt_graph_fuse(dt_graph *g, int *fused) {
    if (fused)
        *fused = 0;
    if (!g)
        return dt_fail(DT_ERR_ARG, "dt_graph_fuse: expected a graph, found NULL");
    if (g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_fuse: expected a graph not yet finalized");
    bool *dead = dt_alloc_zero(sizeof(bool) * (size_t)(g->nvals ? g->nvals : 1));
    int  *map  = dt_alloc(sizeof(int) * (size_t)(g->nvals ? g->nvals : 1));
    if (!dead || !map) {
        dt_free(dead);
        dt_free(map);
        return DT_ERR_NOMEM;
    }
    dt_status st = DT_OK;
    int       nf = 0;
    for (int b = 0; st == DT_OK && b < g->nvals; b++) {
        if (!is_node(g, b) || !lay_is_batchnorm(g->vals[b].layer) || tied(g, b))
            continue;
        int a = sole_reader(g, b), r = -1;
        if (!is_node(g, a))
            continue;
        if (lay_is_add(g->vals[a].layer) && g->vals[a].nin == 2 &&
            g->vals[a].in[0] != g->vals[a].in[1]) {
            r = sole_reader(g, a);
            if (!is_node(g, r) || !lay_is_relu(g->vals[r].layer))
                continue;
        } else if (lay_is_relu(g->vals[a].layer)) {
            r = a, a = -1;
        } else {
            continue;
        }
        st = fuse_at(g, b, a, r, dead);
        nf += st == DT_OK;
    }
    if (nf)
        compact(g, dead, map);
    dt_free(dead);
    dt_free(map);
    if (fused)
        *fused = nf;
    return st;
}
