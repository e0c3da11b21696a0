// mesh.c: the dp x pp x tp grid of mesh.h and its three sub-groups.
#include "dtrain/mesh.h"

struct dt_mesh {
    dt_pg *world;                     // borrowed
    dt_pg *group[DT_MESH_DIM_COUNT_]; // owned
    int    size[DT_MESH_DIM_COUNT_];
    int    coord[DT_MESH_DIM_COUNT_];
};

dt_mesh_opts dt_mesh_opts_default(void) {
    return (dt_mesh_opts){0, 0, 0};
}

const char *dt_mesh_dim_name(dt_mesh_dim dim) {
    static const char *names[DT_MESH_DIM_COUNT_] = {"dp", "pp", "tp"};
    return dim >= 0 && dim < DT_MESH_DIM_COUNT_ ? names[dim] : "?";
}

dt_status dt_mesh_sizes(int world, const dt_mesh_opts *opts, int sizes[DT_MESH_DIM_COUNT_]) {
    dt_mesh_opts o = opts ? *opts : dt_mesh_opts_default();
    if (world < 1 || o.dp < 0 || o.pp < 0 || o.tp < 0)
        return dt_fail(DT_ERR_ARG,
                       "mesh: expected a world >= 1 and sizes >= 0, found world %d, dp %d, pp %d, "
                       "tp %d",
                       world, o.dp, o.pp, o.tp);
    int pp = o.pp ? o.pp : 1, tp = o.tp ? o.tp : 1;
    if (world % (pp * tp) != 0)
        return dt_fail(DT_ERR_ARG, "mesh: pp %d x tp %d = %d does not divide the world size %d", pp,
                       tp, pp * tp, world);
    int dp = o.dp ? o.dp : world / (pp * tp);
    if ((int64_t)dp * pp * tp != world)
        return dt_fail(DT_ERR_ARG,
                       "mesh: expected dp x pp x tp = the world size %d, found %d x %d x %d = %lld",
                       world, dp, pp, tp, (long long)dp * pp * tp);
    sizes[DT_MESH_DP] = dp;
    sizes[DT_MESH_PP] = pp;
    sizes[DT_MESH_TP] = tp;
    return DT_OK;
}

dt_status dt_mesh_new(dt_mesh **out, dt_pg *world, const dt_mesh_opts *opts) {
    if (!out || !world)
        return dt_fail(DT_ERR_ARG, "dt_mesh_new: expected an output pointer and a world group");
    *out = NULL;
    int size[DT_MESH_DIM_COUNT_];
    DT_TRY(dt_mesh_sizes(dt_pg_size(world), opts, size));
    dt_mesh *m = dt_alloc_zero(sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    m->world = world;
    for (int d = 0; d < DT_MESH_DIM_COUNT_; d++)
        m->size[d] = size[d];
    int r  = dt_pg_rank(world);
    int pp = size[DT_MESH_PP], tp = size[DT_MESH_TP];
    m->coord[DT_MESH_DP] = r / (pp * tp);
    m->coord[DT_MESH_PP] = (r / tp) % pp;
    m->coord[DT_MESH_TP] = r % tp;
    // The group along `d` is the set of ranks sharing the other two coordinates: that
    // pair is the color, the coordinate along d the key (so group rank = coordinate).
    for (int d = 0; d < DT_MESH_DIM_COUNT_; d++) {
        int color = 0;
        for (int e = 0; e < DT_MESH_DIM_COUNT_; e++)
            if (e != d)
                color = color * m->size[e] + m->coord[e];
        dt_status st = dt_pg_split(&m->group[d], world, color, m->coord[d], NULL);
        if (st != DT_OK) {
            dt_fail_context("dt_mesh_new: the %s group", dt_mesh_dim_name((dt_mesh_dim)d));
            dt_mesh_free(m);
            return st;
        }
    }
    *out = m;
    return DT_OK;
}

void dt_mesh_free(dt_mesh *m) {
    if (!m)
        return;
    for (int d = DT_MESH_DIM_COUNT_ - 1; d >= 0; d--)
        dt_pg_free(m->group[d]);
    dt_free(m);
}

static bool dim_ok(const dt_mesh *m, dt_mesh_dim d) {
    return m && d >= 0 && d < DT_MESH_DIM_COUNT_;
}
dt_pg *dt_mesh_group(dt_mesh *m, dt_mesh_dim dim) {
    return dim_ok(m, dim) ? m->group[dim] : NULL;
}
int dt_mesh_coord(const dt_mesh *m, dt_mesh_dim dim) {
    return dim_ok(m, dim) ? m->coord[dim] : -1;
}
int dt_mesh_size(const dt_mesh *m, dt_mesh_dim dim) {
    return dim_ok(m, dim) ? m->size[dim] : -1;
}
int dt_mesh_rank_of(const dt_mesh *m, int dp, int pp, int tp) {
    if (!m || dp < 0 || pp < 0 || tp < 0 || dp >= m->size[DT_MESH_DP] ||
        pp >= m->size[DT_MESH_PP] || tp >= m->size[DT_MESH_TP])
        return -1;
    return (dp * m->size[DT_MESH_PP] + pp) * m->size[DT_MESH_TP] + tp;
}
