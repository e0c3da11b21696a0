// mesh.h: the device mesh of a hybrid-parallel job. The world's ranks are laid out as a
// dp x pp x tp grid (tp fastest, then pp, then dp: the tensor-parallel ranks of a stage
// are consecutive, as Megatron-LM places them, so they share a host first), and each
// dimension gets its own sub-group (dt_pg_split): the ranks that differ only in that
// coordinate.
//
//     dt_mesh *m;
//     dt_mesh_opts mo = dt_mesh_opts_default();  mo.pp = 2;   // dp: the rest
//     dt_mesh_new(&m, world, &mo);                            // collective over world
//     dt_pg *pp = dt_mesh_group(m, DT_MESH_PP);               // this rank's pipeline
//     int stage = dt_mesh_coord(m, DT_MESH_PP);               // = dt_pg_rank(pp)
//     ...
//     dt_mesh_free(m);                                        // before the world group
//
// World rank r has coordinates dp = r / (pp * tp), pp = (r / tp) % pp, tp = r % tp.
// A dimension of size 1 still has a group (of one rank), so code needs no special case.
#ifndef DTRAIN_MESH_H
#define DTRAIN_MESH_H

#include "dtrain/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_mesh dt_mesh;

typedef enum dt_mesh_dim {
    DT_MESH_DP = 0,
    DT_MESH_PP = 1,
    DT_MESH_TP = 2,
    DT_MESH_DIM_COUNT_
} dt_mesh_dim;

typedef struct dt_mesh_opts {
    int dp, pp, tp; // sizes; 0 = default: pp and tp 1, dp the world / (pp * tp)
} dt_mesh_opts;
DT_API dt_mesh_opts dt_mesh_opts_default(void);

// The sizes a mesh of `world` ranks gets from `opts` (NULL: defaults) in sizes[dim]:
// DT_ERR_ARG naming the sizes when their product is not the world or one is negative.
// Not collective (the trainer checks its flags with it before joining a group).
DT_API dt_status dt_mesh_sizes(int world, const dt_mesh_opts *opts, int sizes[DT_MESH_DIM_COUNT_]);

// Builds the three groups of this rank over `world` (borrowed: it must outlive the mesh).
// COLLECTIVE over world (three dt_pg_split calls, in the order dp, pp, tp). *out stays
// NULL on failure.
DT_API dt_status dt_mesh_new(dt_mesh **out, dt_pg *world, const dt_mesh_opts *opts);
DT_API void      dt_mesh_free(dt_mesh *m); // NULL-safe; frees the groups, not the world

// This rank's group along `dim` (owned by the mesh), its coordinate (= its rank in that
// group) and the dimension's size. NULL / -1 for a bad dim.
DT_API dt_pg *dt_mesh_group(dt_mesh *m, dt_mesh_dim dim);
DT_API int    dt_mesh_coord(const dt_mesh *m, dt_mesh_dim dim);
DT_API int    dt_mesh_size(const dt_mesh *m, dt_mesh_dim dim);
// World rank of the rank at coordinates (dp, pp, tp); -1 out of range.
DT_API int dt_mesh_rank_of(const dt_mesh *m, int dp, int pp, int tp);
// "dp" / "pp" / "tp".
DT_API const char *dt_mesh_dim_name(dt_mesh_dim dim);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_MESH_H
