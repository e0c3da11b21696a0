// graph_pass.c: what dt_graph_finalize does to a graph before registering its tensors
// (the fusion pass), the BatchNorm fusion a caller asks for (dt_graph_fuse), and the
// plan of in-place nodes made with the buffers.
//
// Fusion: a convolution whose only reader is a ReLU becomes one node of the Sequential
// kind (seq.h, conv2d.c) that applies the ReLU while writing its output, and when that
// ReLU's only reader is a 2x2 stride-2 max pool (and the convolution has stride 1 and
// an even output), the pool too: the pooled output and the winners are computed from
// the convolution's output while it is in cache, and the full-size output never goes
// to memory. Two patterns are rewritten:
//   - Sequential conv2d -> relu (-> maxpool2d), the nodes a dt_model is built of;
//   - a graph's Conv2d (square kernel, stride 1, even padding, one group, bias) ->
//     ReLU -> MaxPool2d(2) (2x2, stride 2, no padding): the fused node takes over the
//     Conv2d, which still initialises the parameters from its own stream.
// The fused node keeps the convolution's position (initialisation, random streams)
// and the names of its tensors ("<conv>.weight"), and takes the name of the last node
// it replaces, whose readers it now feeds: dt_params, checkpoints, DDP and the nodes
// downstream see no difference; dt_graph_find of the ReLU (and the pool, unless last)
// finds nothing any more. DT_NO_POOL_FUSION=1 keeps the pool apart (and a graph's
// Conv2d unfused); dt_graph_opts.no_fusion turns the pass off.
//
// dt_graph_fuse (graph.h), before finalize, replaces chains of a graph's own layers:
//   BatchNorm -> ReLU               one batchnorm*_relu node
//   BatchNorm -> Add(., r) -> ReLU  one batchnorm*_add_relu node reading (x, r)
// when every value in between is read by its one successor only (and is not the
// output). The fused node sits where the ReLU was (the Add's other input may come after
// the BatchNorm) and takes its name, so later nodes read what they read before; it
// declares the BatchNorm's tensors under the BatchNorm's name and keeps its layer
// position (initialisation, and the tensors' order: dt_graph_tensor_order), so
// checkpoints and DDP see the same parameters. The values in between are gone: no
// memory for them, no passes over them.
//
// In place: a Sequential ReLU, dropout or flatten node that is the only reader of a
// Sequential node (not the output, not a log-softmax, whose backward reads its
// output) works in its input's buffers, output and gradient alike, as the Sequential
// model always did. A graph's own layers keep buffers of their own.
#include "nn/graph/graph_impl.h"
#include "nn/layers/conv_fused.h"
#include "nn/layers/layers_impl.h"

#include <stdio.h>
#include <string.h>

static bool no_pool_fusion(void) {
    long v = 0;
    if (dt_setting_int("DT_NO_POOL_FUSION", &v) != DT_OK) {
        DT_WARN("nn", "%s; fusing", dt_last_error());
        dt_clear_error();
    }
    return v == 1;
}

// The one node reading value i (once), or -1 (no reader, several, or i is the output).
static int sole_reader(const dt_graph *g, int i) {
    if (i < 0 || g->vals[i].nconsumers != 1 || i == g->output)
        return -1;
    for (int j = i + 1; j < g->nvals; j++)
        for (int k = 0; k < g->vals[j].nin; k++)
            if (g->vals[j].in[k] == i)
                return j;
    return -1;
}

// The sole reader of value i when it reads nothing else, or -1.
static int only_reader(const dt_graph *g, int i) {
    int j = sole_reader(g, i);
    return j >= 0 && g->vals[j].nin == 1 ? j : -1;
}

// Whether node i's parameters are tied to another's, or another's to them.
static bool tied(const dt_graph *g, int i) {
    for (int k = 0; k < g->vals[i].su.nparams; k++)
        if (g->vals[i].tie_val[k] >= 0 || g->vals[i].copy_of[k][0])
            return true;
    for (int j = 0; j < g->nvals; j++)
        for (int k = 0; g->vals[j].layer && k < g->vals[j].su.nparams; k++)
            if (g->vals[j].tie_val[k] == i)
                return true;
    return false;
}

// A Conv2d (square kernel, equal strides and paddings, one group, a bias) -> ReLU at i,
// and the 2x2 stride-2 max pool after it (p, else -1) when pool_ok and the convolution
// has stride 1 and an even output.
static bool match_conv(const dt_graph *g, int i, bool pool_ok, dt_nn_conv2d *cp, int *r, int *p) {
    const gval     *v = &g->vals[i];
    dt_nn_avgpool2d pp;
    if (!lay_as_conv2d(v->layer, cp) || cp->groups != 1 || cp->kh != cp->kw || cp->kh > 16 ||
        cp->sh != cp->sw || cp->ph != cp->pw || !cp->bias || v->shape.ndim != 3)
        return false;
    *r = only_reader(g, i);
    if (*r < 0 || !lay_is_relu(g->vals[*r].layer))
        return false;
    *p = only_reader(g, *r);
    if (!pool_ok || *p < 0 || !lay_as_maxpool2d(g->vals[*p].layer, &pp) || pp.kh != 2 ||
        pp.kw != 2 || pp.sh != 2 || pp.sw != 2 || pp.ph != 0 || pp.pw != 0 || cp->sh != 1 ||
        v->shape.d[1] % 2 || v->shape.d[2] % 2)
        *p = -1;
    return true;
}

// Node i now does what nodes i..last did (the removed ones marked in `into`): its
// setup again, then it takes last's name and readers.
static dt_status take_over(dt_graph *g, int i, int last, int *into) {
    gval          *v  = &g->vals[i];
    dt_shape       in = g->vals[v->in[0]].shape;
    dt_layer_setup su = {.precision = g->prec}; // a mode set before finalize
    DT_TRY(v->layer->ops->setup(v->layer, 1, &in, &su));
    const dt_shape *want = &g->vals[last].shape;
    if (su.out.ndim != want->ndim || dt_shape_numel(&su.out) != dt_shape_numel(want))
        return dt_fail(DT_ERR_STATE, "graph fusion: node '%s' would change the shape of '%s'",
                       v->name, g->vals[last].name);
    v->su    = su;
    v->shape = *want;
    if (!v->tensor_node[0])
        snprintf(v->tensor_node, sizeof v->tensor_node, "%s", v->name);
    snprintf(v->name, sizeof v->name, "%s", g->vals[last].name);
    for (int j = i + 1; j <= last; j++)
        if (into[j] == i) {
            dt_layer_free(g->vals[j].layer);
            g->vals[j].layer = NULL;
        }
    return DT_OK;
}

// Drops the nodes folded into others (into[j] >= 0: a kept node, before or after j)
// and renumbers the rest.
static dt_status compact(dt_graph *g, const int *into) {
    int *map = dt_alloc(sizeof(int) * (size_t)g->nvals);
    if (!map)
        return DT_ERR_NOMEM;
    int n = 0; // a kept node's new index; a folded one's, its keeper's
    for (int j = 0; j < g->nvals; j++)
        map[j] = into[j] < 0 ? n++ : -1;
    for (int j = 0; j < g->nvals; j++)
        if (into[j] >= 0)
            map[j] = map[into[j]];
    for (int j = 0; j < g->nvals; j++) {
        if (into[j] >= 0)
            continue;
        gval *v = &g->vals[map[j]];
        if (map[j] != j)
            *v = g->vals[j];
        for (int q = 0; q < v->nin; q++)
            v->in[q] = map[v->in[q]];
        for (int q = 0; v->layer && q < v->su.nparams; q++)
            if (v->tie_val[q] >= 0)
                v->tie_val[q] = map[v->tie_val[q]];
    }
    g->output = map[g->output];
    g->nvals  = n;
    dt_free(map);
    for (int j = 0; j < n; j++)
        g->vals[j].nconsumers = 0;
    for (int j = 0; j < n; j++)
        for (int q = 0; q < g->vals[j].nin; q++)
            g->vals[g->vals[j].in[q]].nconsumers++;
    return DT_OK;
}

dt_status dt_graph_run_passes(dt_graph *g) {
    if (g->no_fusion)
        return DT_OK;
    int *into = dt_alloc(sizeof(int) * (size_t)(g->nvals ? g->nvals : 1));
    if (!into)
        return DT_ERR_NOMEM;
    for (int j = 0; j < g->nvals; j++)
        into[j] = -1;
    bool      pool_ok = !no_pool_fusion(), changed = false;
    dt_status st = DT_OK;
    for (int i = 0; i < g->nvals && st == DT_OK; i++) {
        gval        *v = &g->vals[i];
        int          r, p;
        dt_nn_conv2d cp;
        if (!v->layer || into[i] >= 0 || v->nin != 1 || tied(g, i))
            continue;
        if (!match_conv(g, i, pool_ok, &cp, &r, &p))
            continue;
        dt_layer *fused = NULL;
        st              = dt_fused_from_conv(&fused, v->layer, &cp, p >= 0);
        if (st == DT_OK)
            v->layer = fused; // it owns the Conv2d now
        if (st != DT_OK)
            break;
        into[r] = i;
        if (p >= 0)
            into[p] = i;
        st      = take_over(g, i, p >= 0 ? p : r, into);
        changed = true;
    }
    if (st == DT_OK && changed)
        st = compact(g, into);
    dt_free(into);
    return st == DT_OK ? DT_OK : dt_fail_context("dt_graph_finalize: fusion");
}

// The Add after BatchNorm b (fusable with a ReLU after it), or -1.
static int bn_add(const dt_graph *g, int b) {
    int a = sole_reader(g, b);
    if (a < 0 || !lay_is_add(g->vals[a].layer) || g->vals[a].nin != 2 ||
        g->vals[a].in[0] == g->vals[a].in[1] || tied(g, a))
        return -1;
    return a;
}

// Node r becomes the fusion of BatchNorm b (and Add a, when a >= 0) with ReLU r; b and
// a are folded into it (their layers freed).
static dt_status fuse_bn_at(dt_graph *g, int b, int a, int r, int *into) {
    gval     *vb = &g->vals[b], *vr = &g->vals[r];
    dt_layer *l;
    DT_TRY(lay_bn_fused_new(&l, vb->layer, a >= 0));
    gval f = {0};
    snprintf(f.name, sizeof f.name, "%s", vr->name);
    snprintf(f.tensor_node, sizeof f.tensor_node, "%s", dt_graph_tensor_node(vb));
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
    f.su.precision = g->prec;
    dt_status st   = l->ops->setup(l, f.nin, in, &f.su);
    if (st != DT_OK) {
        dt_layer_free(l);
        return dt_fail_context("fusing '%s' into '%s'", vb->name, vr->name);
    }
    f.shape       = f.su.out;
    f.nconsumers  = vr->nconsumers;
    f.layer_no    = vb->layer_no;
    f.param_layer = vb->param_layer;
    f.alias       = -1;
    for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++)
        f.tie_val[k] = -1;
    dt_layer_free(vb->layer);
    dt_layer_free(vr->layer);
    vb->layer = NULL;
    into[b]   = r;
    if (a >= 0) {
        dt_layer_free(g->vals[a].layer);
        g->vals[a].layer = NULL;
        into[a]          = r;
    }
    *vr = f;
    return DT_OK;
}

dt_status dt_graph_fuse(dt_graph *g, int *fused) {
    if (fused)
        *fused = 0;
    if (!g)
        return dt_fail(DT_ERR_ARG, "dt_graph_fuse: expected a graph, found NULL");
    if (g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_fuse: expected a graph not yet finalized");
    int *into = dt_alloc(sizeof(int) * (size_t)(g->nvals ? g->nvals : 1));
    if (!into)
        return DT_ERR_NOMEM;
    for (int j = 0; j < g->nvals; j++)
        into[j] = -1;
    dt_status st = DT_OK;
    int       nf = 0;
    for (int b = 0; st == DT_OK && b < g->nvals; b++) {
        const gval *v = &g->vals[b];
        if (!v->layer || v->moved || into[b] >= 0 || !lay_is_batchnorm(v->layer) || tied(g, b))
            continue;
        int a = bn_add(g, b), r = sole_reader(g, a >= 0 ? a : b);
        if (r < 0 || g->vals[r].moved || !lay_is_relu(g->vals[r].layer))
            continue;
        st = fuse_bn_at(g, b, a, r, into);
        nf += st == DT_OK;
    }
    if (st == DT_OK && nf)
        st = compact(g, into);
    dt_free(into);
    if (fused)
        *fused = st == DT_OK ? nf : 0;
    return st;
}

// A node that can work in place (dt_layer_setup.in_place) shares its input's buffers
// when it is that input's only reader, the input is a layer's output (not a graph input,
// which is the caller's) and not the graph's output, and the input's layer does not
// read its output's values back in its own backward (output_read_back).
void dt_graph_plan_aliases(dt_graph *g) {
    for (int i = 0; i < g->nvals; i++) {
        gval *v  = &g->vals[i];
        v->alias = -1;
        if (!v->layer || !v->su.in_place || v->nin != 1)
            continue;
        int         u  = v->in[0];
        const gval *uv = &g->vals[u];
        if (uv->layer && !uv->su.output_read_back && uv->nconsumers == 1 && u != g->output &&
            dt_shape_numel(&uv->shape) == dt_shape_numel(&v->shape) &&
            uv->shape.dtype == DT_ELEM_F32)
            v->alias = u;
    }
}
