// parts.c: a model cut over a device mesh (parts.h): where the pipeline is cut (evenly,
// by name, or balanced by measured layer cost) and the whole model's tensors carried to
// the parts and back (initialisation, a whole model file loaded or gathered).
#include "parallel/parts.h"

#include "dtrain/ckpt.h"

#include <stdio.h>
#include <string.h>

enum { TAG_GATHER = 0x6000, TIMING_REPS = 5 };

// ------------------------------------------------------------------------ the cuts

void dt_parts_uniform_cuts(int ncand, int pp, int *pick) {
    for (int k = 1; k < pp; k++)
        pick[k - 1] = (int)((int64_t)k * (ncand - 1) / pp);
    for (int k = 1; k < pp - 1; k++) // strictly increasing even when ncand is small
        if (pick[k] <= pick[k - 1])
            pick[k] = pick[k - 1] + 1;
}

dt_status dt_parts_parse_cuts(const char *spec, int ncand, const char *const *cand, int pp,
                              int *pick, const char *what) {
    int         n = 0;
    const char *p = spec;
    while (*p) {
        size_t k = strcspn(p, ",");
        int    c = -1;
        for (int i = 0; i < ncand && c < 0; i++)
            if (strlen(cand[i]) == k && strncmp(cand[i], p, k) == 0)
                c = i;
        if (c < 0 || n >= pp - 1 || (n > 0 && c <= pick[n - 1])) {
            char list[512] = "";
            for (int i = 0, at = 0; i < ncand && at < (int)sizeof list - 64; i++)
                at += snprintf(list + at, sizeof list - (size_t)at, "%s%s", i ? ", " : "", cand[i]);
            return dt_fail(DT_ERR_ARG,
                           "%s: expected %d cut(s) in order among this model's cut points (%s), "
                           "found '%.*s'%s",
                           what, pp - 1, list, (int)k, p,
                           c < 0         ? ""
                           : n >= pp - 1 ? " (one too many)"
                                         : " (out of order)");
        }
        pick[n++] = c;
        p += k + (p[k] == ',');
    }
    if (n != pp - 1)
        return dt_fail(DT_ERR_ARG, "%s: expected %d cut(s) for --pp %d, found %d in '%s'", what,
                       pp - 1, pp, n, spec);
    return DT_OK;
}

// Each stage's cost under the cuts pick (into cand, node positions candn).
static void stage_costs(int nnodes, const double *cost, const int *candn, const int *pick, int pp,
                        double *out) {
    for (int s = 0, i = 0; s < pp; s++) {
        int end = s < pp - 1 ? candn[pick[s]] : nnodes - 1;
        out[s]  = 0;
        for (; i <= end; i++)
            out[s] += cost[i];
    }
}

dt_status dt_parts_balance(dt_graph *whole, dt_pg *world, dt_mesh *mesh, uint64_t seed, int threads,
                           int nnodes, int ncand, const char *const *cand, const int *candn, int mb,
                           int *pick) {
    int         pp   = dt_mesh_size(mesh, DT_MESH_PP);
    double     *cost = dt_alloc_zero(sizeof(double) * (size_t)nnodes);
    float      *sum  = dt_alloc_zero(sizeof(float) * (size_t)nnodes);
    double     *sc   = dt_alloc(sizeof(double) * 2 * (size_t)pp);
    dt_status   st   = cost && sum && sc ? DT_OK : DT_ERR_NOMEM;
    const char *names[1024];
    for (int k = 0; k < pp - 1; k++)
        names[k] = cand[pick[k]];
    dt_pipe *probe = NULL;
    if (st == DT_OK)
        st = dt_pipe_new(&probe, whole, pp - 1, names, dt_mesh_group(mesh, DT_MESH_PP), seed, NULL);
    else
        dt_graph_free(whole);
    if (st == DT_OK)
        st = dt_graph_set_threads(dt_pipe_graph(probe), threads);
    if (st == DT_OK)
        st = dt_pipe_time_nodes(probe, mb, TIMING_REPS, nnodes, cost);
    dt_pipe_free(probe);
    for (int i = 0; i < nnodes; i++)
        sum[i] = (float)cost[i];
    if (st == DT_OK) // every node was timed by the dp x tp ranks of its stage
        st = dt_pg_all_reduce(world, sum, sum, (size_t)nnodes, DT_FLOAT32, DT_REDUCE_SUM);
    double repl = (double)dt_mesh_size(mesh, DT_MESH_DP) * dt_mesh_size(mesh, DT_MESH_TP);
    for (int i = 0; i < nnodes; i++)
        cost[i] = sum[i] / repl;
    if (st == DT_OK && dt_pg_rank(world) == 0) { // rank 0 chooses, everyone takes its choice
        stage_costs(nnodes, cost, candn, pick, pp, sc + pp);
        st = dt_pipe_balance(nnodes, cost, ncand, candn, pp, pick, NULL);
    }
    int32_t *got = (int32_t *)sum; // nnodes >= pp - 1 floats: room for the picks
    for (int k = 0; k < pp - 1; k++)
        got[k] = pick[k];
    if (st == DT_OK)
        st = dt_pg_broadcast(world, got, (size_t)(pp - 1), DT_INT32, 0);
    for (int k = 0; st == DT_OK && k < pp - 1; k++)
        pick[k] = got[k];
    if (st == DT_OK && dt_pg_rank(world) == 0) {
        stage_costs(nnodes, cost, candn, pick, pp, sc);
        char   line[2][512];
        double top[2] = {0, 0};
        for (int u = 0; u < 2; u++) {
            size_t at = 0;
            for (int s = 0; s < pp && at < sizeof line[u] - 16; s++) {
                at += (size_t)snprintf(line[u] + at, sizeof line[u] - at, " %.3f",
                                       sc[u * pp + s] * 1e3);
                top[u] = sc[u * pp + s] > top[u] ? sc[u * pp + s] : top[u];
            }
        }
        printf("pipeline: cuts balanced by measured layer cost, stages' ms per micro-batch of %d "
               "samples:%s (uniform cuts:%s); slowest %.3f ms (uniform %.3f)\n",
               mb, line[0], line[1], top[0] * 1e3, top[1] * 1e3);
        fflush(stdout);
    }
    dt_free(cost), dt_free(sum), dt_free(sc);
    return st;
}

// ------------------------------------------------------------------ the whole model

// This rank's tensor named like whole tensor w (a tie's copy too), or -1.
static int local_of(const dt_parts *pt, const dt_param_info *w) {
    return dt_params_find(pt->local, w->name);
}

dt_status dt_parts_init(const dt_parts *pt, dt_parts_fill_fn fill, void *user) {
    dt_params *lp  = pt->local;
    size_t     cap = 0;
    for (int i = 0; i < dt_params_count(pt->whole); i++)
        cap = dt_params_info(pt->whole, i)->count > cap ? dt_params_info(pt->whole, i)->count : cap;
    float *v = dt_alloc(sizeof(float) * (cap ? cap : 1));
    if (!v)
        return DT_ERR_NOMEM;
    for (int i = 0; i < dt_params_count(pt->whole); i++) {
        const dt_param_info *w = dt_params_info(pt->whole, i);
        fill(user, w, v); // every tensor, held here or not: the draws stay in order
        int k = local_of(pt, w);
        if (k < 0)
            continue;
        const dt_param_info *l = dt_params_info(lp, k);
        dt_param_split_copy(&l->split, l->ndim, l->shape, v, dt_params_data(lp) + l->offset, false);
    }
    dt_free(v);
    return DT_OK;
}

// A storage-owning copy of the whole table.
static dt_status whole_alloc(const dt_params *tab, dt_params **out) {
    DT_TRY(dt_params_new(out, NULL));
    for (int i = 0; i < dt_params_count(tab); i++) {
        const dt_param_info *w = dt_params_info(tab, i);
        DT_TRY(dt_params_add(*out, w->name, w->ndim, w->shape, w->flags));
    }
    for (int i = 0; i < dt_params_buffer_count(tab); i++) {
        const dt_param_info *w = dt_params_buffer_info(tab, i);
        DT_TRY(dt_params_add_buffer(*out, w->name, w->ndim, w->shape, w->flags));
    }
    return dt_params_alloc(*out);
}

// The stage holding node `node` of the whole graph.
static int stage_of(const dt_parts *pt, int node) {
    int s = 0;
    while (s < pt->ncuts && node > pt->cut_node[s])
        s++;
    return s;
}

dt_status dt_parts_load_model(const dt_parts *pt, const char *path) {
    dt_params *w  = NULL;
    dt_status  st = whole_alloc(pt->whole, &w);
    if (st == DT_OK)
        st = dt_ckpt_load_params(path, w);
    dt_params *lp = pt->local;
    for (int i = 0; st == DT_OK && i < dt_params_count(w); i++) {
        const dt_param_info *wi = dt_params_info(w, i);
        int                  k  = local_of(pt, wi);
        if (k < 0)
            continue;
        const dt_param_info *l = dt_params_info(lp, k);
        dt_param_split_copy(&l->split, l->ndim, l->shape, dt_params_data(w) + wi->offset,
                            dt_params_data(lp) + l->offset, false);
    }
    for (int i = 0; st == DT_OK && i < dt_params_buffer_count(w); i++) { // not split
        const dt_param_info *wi = dt_params_buffer_info(w, i);
        for (int k = 0; k < dt_params_buffer_count(lp); k++)
            if (!strcmp(dt_params_buffer_info(lp, k)->name, wi->name))
                memcpy(dt_params_buffers(lp) + dt_params_buffer_info(lp, k)->offset,
                       dt_params_buffers(w) + wi->offset, sizeof(float) * wi->count);
    }
    dt_params_free(w);
    return st;
}

// One tensor (or buffer) of the whole model to rank 0: the part of every tp rank of its
// stage in the first replica, or tp rank 0's copy of a whole one. Every rank walks the
// tensors in order, so each sender's messages are a subsequence of rank 0's receives.
static dt_status gather_one(const dt_parts *pt, const dt_param_info *w, bool buffer, float *dst,
                            float *tmp, int tag) {
    dt_params            *lp = pt->local;
    int                   s = stage_of(pt, w->layer), tps = dt_mesh_size(pt->mesh, DT_MESH_TP);
    const dt_param_split *sp    = &w->split;
    int                   parts = buffer || !dt_param_split_on(sp) ? 1 : tps;
    int                   dp    = dt_mesh_coord(pt->mesh, DT_MESH_DP);
    int pp = dt_mesh_coord(pt->mesh, DT_MESH_PP), tp = dt_mesh_coord(pt->mesh, DT_MESH_TP);
    const dt_param_info *l = NULL;
    if (dp == 0 && pp == s && tp < parts) {
        int k = -1;
        if (buffer) {
            for (int j = 0; j < dt_params_buffer_count(lp) && k < 0; j++)
                k = strcmp(dt_params_buffer_info(lp, j)->name, w->name) ? -1 : j;
            l = k >= 0 ? dt_params_buffer_info(lp, k) : NULL;
        } else if ((k = local_of(pt, w)) >= 0) {
            l = dt_params_info(lp, k);
        }
        if (!l)
            return dt_fail(DT_ERR_INTERNAL, "save: stage %d holds no tensor '%s'", s, w->name);
    }
    const float *src = l ? (buffer ? dt_params_buffers(lp) : dt_params_data(lp)) + l->offset : NULL;
    size_t       n   = w->count / (size_t)parts;
    if (dt_pg_rank(pt->world) != 0) {
        if (l)
            DT_TRY(dt_pg_send(pt->world, src, n, DT_FLOAT32, 0, tag));
        return DT_OK;
    }
    for (int r = 0; r < parts; r++) {
        int from = dt_mesh_rank_of(pt->mesh, 0, s, r);
        if (from == 0)
            memcpy(tmp, src, sizeof(float) * n);
        else
            DT_TRY(dt_pg_recv(pt->world, tmp, n, DT_FLOAT32, from, tag));
        dt_param_split part = *sp;
        part.part           = r;
        int64_t shape[DT_PARAM_MAX_DIMS];
        memcpy(shape, w->shape, sizeof shape);
        if (parts > 1)
            shape[sp->axis] /= parts;
        dt_param_split_copy(parts > 1 ? &part : NULL, w->ndim, shape, dst, tmp, true);
    }
    return DT_OK;
}

dt_status dt_parts_save_model(const dt_parts *pt, const char *path) {
    bool       root = dt_pg_rank(pt->world) == 0;
    dt_params *w    = NULL;
    size_t     cap  = 1;
    for (int i = 0; i < dt_params_count(pt->whole); i++)
        cap = dt_params_info(pt->whole, i)->count > cap ? dt_params_info(pt->whole, i)->count : cap;
    for (int i = 0; i < dt_params_buffer_count(pt->whole); i++)
        cap = dt_params_buffer_info(pt->whole, i)->count > cap
                  ? dt_params_buffer_info(pt->whole, i)->count
                  : cap;
    float    *tmp = dt_alloc(sizeof(float) * cap);
    dt_status st  = tmp ? DT_OK : DT_ERR_NOMEM;
    if (st == DT_OK && root)
        st = whole_alloc(pt->whole, &w);
    int np = dt_params_count(pt->whole);
    for (int i = 0; st == DT_OK && i < np; i++) {
        const dt_param_info *wi = dt_params_info(pt->whole, i);
        st = gather_one(pt, wi, false, w ? dt_params_data(w) + wi->offset : NULL, tmp,
                        TAG_GATHER + i);
    }
    for (int i = 0; st == DT_OK && i < dt_params_buffer_count(pt->whole); i++) {
        const dt_param_info *wi = dt_params_buffer_info(pt->whole, i);
        st = gather_one(pt, wi, true, w ? dt_params_buffers(w) + wi->offset : NULL, tmp,
                        TAG_GATHER + np + i);
    }
    if (st == DT_OK && root)
        st = dt_ckpt_save_params(path, w);
    dt_params_free(w);
    dt_free(tmp);
    return st;
}
