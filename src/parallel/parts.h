// parts.h: a model cut over a device mesh (mesh.h, pipe.h, tp.h): where its pipeline is
// cut, and its whole tensors carried to the parts that hold them and back. The trainer
// (src/train/mesh.c) chooses among the cuts by its flags and keeps the checkpoints of
// each part; what is here knows nothing of flags or folders.
#ifndef DTRAIN_PARALLEL_PARTS_H
#define DTRAIN_PARALLEL_PARTS_H

#include "dtrain/graph.h"
#include "dtrain/mesh.h"
#include "dtrain/pipe.h"

// ------------------------------------------------------------------------ the cuts
// Cuts are indices into the model's `ncand` candidate nodes `cand` (names, in order),
// pp - 1 of them, strictly increasing.

// Candidates k (ncand - 1) / pp for k = 1 .. pp - 1: evenly spread.
void dt_parts_uniform_cuts(int ncand, int pp, int *pick);
// "a,b,c" (names among the candidates) into pick; refused (DT_ERR_ARG) naming `what`,
// the candidates and the name that is unknown, out of order or one too many.
dt_status dt_parts_parse_cuts(const char *spec, int ncand, const char *const *cand, int pp,
                              int *pick, const char *what);
// The cuts by measured cost: the model (`whole`, consumed) cut by `pick` is timed stage
// by stage over mb samples per micro-batch (each rank its stage's nodes, a stage's tp
// ranks together), the times summed over `world` and averaged over the replicas, and rank
// 0 chooses (dt_pipe_balance) and prints both; every rank gets its pick. candn: the
// candidates' node positions. COLLECTIVE over world.
dt_status dt_parts_balance(dt_graph *whole, dt_pg *world, dt_mesh *mesh, uint64_t seed, int threads,
                           int nnodes, int ncand, const char *const *cand, const int *candn, int mb,
                           int *pick);

// ------------------------------------------------------------------ the whole model

// This rank's part of a model: the whole model's table (no storage), this rank's stage's
// parameters (a tensor split over tp holds its part: dt_param_split), and the cuts' node
// positions in the whole graph. All borrowed.
typedef struct dt_parts {
    dt_pg           *world;
    const dt_mesh   *mesh;
    const dt_params *whole;
    dt_params       *local;
    const int       *cut_node;
    int              ncuts;
} dt_parts;

// Fills `values` with the whole tensor `whole` (train.h's dt_trainer_fill_fn).
typedef void (*dt_parts_fill_fn)(void *user, const dt_param_info *whole, float *values);
// fill called for every whole tensor in order (held here or not: the draws stay in
// order), and this rank's part of each it holds kept.
dt_status dt_parts_init(const dt_parts *pt, dt_parts_fill_fn fill, void *user);
// A whole model's file loaded on every rank and cut into this rank's part.
dt_status dt_parts_load_model(const dt_parts *pt, const char *path);
// The parts gathered to the world's rank 0 (each tp part to its place, each stage's
// tensors, the first replica's) and saved there as the whole model's file. COLLECTIVE.
dt_status dt_parts_save_model(const dt_parts *pt, const char *path);

#endif // DTRAIN_PARALLEL_PARTS_H
