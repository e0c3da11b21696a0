// ckpt.h: checkpoints. Saving and loading the whole state of a training run (model
// parameters, optimizer state, each rank's sampler position and random generators, user
// key/values) so that a resumed run continues bit for bit where the saved one stopped.
//
// On disk, a checkpoint of step S is a directory <dir>/step-<S, 6+ digits> holding
//   state.dtck        shared state (parameters, optimizer, user key/values), by rank 0
//   rank-<R>.dtck     rank R's own state (sampler epoch and position, RNG states)
//   complete.dtck     the completion marker: a manifest of the files above with their
//                     sizes and CRC32C, written by rank 0 last, after every rank is done
// A directory without its marker is not a checkpoint: loading ignores it. Every file is
// written to "<path>.tmp.<pid>", fsynced, renamed and its directory fsynced, so a crash
// at any moment leaves the previous checkpoints whole. The byte layout is in
// docs/checkpoint-format.md; every file carries a magic, a version, its size and a
// CRC32C per section, and readers refuse anything that does not check out, naming the
// file, what was expected and what was found.
//
// The directory must be one file system that every rank sees (one machine, or a shared
// mount), and one job writes a checkpoint directory at a time.
//
//     dt_ckpt_state st = {.model = m, .optim = opt, .sampler = smp, .step = step};
//     dt_ckpt_save("ckpt", pg, &st, NULL);                 // collective
//     ...
//     dt_ckpt_info info;
//     dt_ckpt_load("ckpt", pg, &st, NULL, &info);          // collective
//     if (info.found) step = info.step;                    // else: start fresh
//     dt_ckpt_info_free(&info);
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include "dtrain/comm.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/params.h"
#include "dtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

// The format version this build writes, and the oldest it reads (docs/checkpoint-format.md
// says what changed: version 2 adds tensor flags and the non-trainable buffers).
#define DT_CKPT_VERSION     2
#define DT_CKPT_VERSION_MIN 1

// Limits a reader enforces, so a lying file cannot ask for absurd allocations.
#define DT_CKPT_NAME_MAX  255       // bytes in a key, an RNG name or a parameter name
#define DT_CKPT_VALUE_MAX (1 << 20) // bytes in one user value

// A named random generator of this rank. Saving reads *rng; loading overwrites it.
typedef struct dt_ckpt_rng {
    const char *name; // 1..DT_CKPT_NAME_MAX bytes, unique in the list
    dt_rng     *rng;
} dt_ckpt_rng;

// A user key/value, both NUL-terminated text.
typedef struct dt_ckpt_kv {
    const char *key;   // 1..DT_CKPT_NAME_MAX bytes, unique in the list
    const char *value; // 0..DT_CKPT_VALUE_MAX bytes
} dt_ckpt_kv;

// What a checkpoint holds. All pointers are borrowed. Saving reads the objects; loading
// writes into them (they must already exist, built the same way as when saving).
// The sampler's state is read with dt_sampler_epoch/dt_sampler_position, so save during
// or after a pass, not between a load and the next dt_sampler_begin (the resumed
// position only takes effect at that begin). Its shuffle seed and options are
// configuration, not state: the program must create the sampler with the same ones.
typedef struct dt_ckpt_state {
    dt_params *params;          // the parameters and buffers (params.h), or NULL and:
    dt_model  *model;           // a finalized model (its dt_model_as_params); one is required
    dt_optim  *optim;           // optional: its flat state and step count; a sharded one
                                // (zero.h) is saved whole, gathered over pg, and loads
                                // its shard (pg must be the group it is sharded over)
    dt_sampler        *sampler; // optional: this rank's epoch and position
    int64_t            step;    // saving: the step that names the checkpoint (>= 0)
    const dt_ckpt_rng *rngs;    // this rank's generators (may be NULL when nrngs is 0)
    int                nrngs;
    const dt_ckpt_kv  *kvs;  // saving: user key/values, rank 0's are kept; loading:
    int                nkvs; // ignored (they come back in dt_ckpt_info)
} dt_ckpt_state;

typedef struct dt_ckpt_opts {
    int keep;      // after a save, keep this many newest complete checkpoints (0 = 3;
                   // < 0 = keep all). Only checkpoints older than the one just saved
                   // are deleted, and leftovers of interrupted saves with them.
    bool fallback; // loading: when the newest complete checkpoint is refused, warn
                   // and try the next older one instead of failing
    bool reshard;  // loading: accept a checkpoint saved at another world size and load its
                   // shared state (parameters, buffers, optimizer, key/values); the saving
                   // ranks' samplers and generators do not apply (st->sampler and st->rngs
                   // must be absent: DT_ERR_MISMATCH otherwise). A sharded optimizer
                   // (zero.h) takes its shard of the whole saved state at any world size.
    int64_t below; // loading: consider only checkpoints of steps below this one (0: all):
                   // the trainer's mesh keeps checkpoints per model part and loads the
                   // newest step every part has
} dt_ckpt_opts;

// Zeroed options: keep 3, no fallback.
DT_API dt_ckpt_opts dt_ckpt_opts_default(void);

// What a load found. Free with dt_ckpt_info_free.
typedef struct dt_ckpt_info {
    bool        found;       // false: no complete checkpoint in the directory (nothing loaded)
    int64_t     step;        // the step loaded (-1 when none)
    int         world;       // the world size that wrote it (this job's unless resharded)
    char        path[4096];  // the checkpoint's directory, "<dir>/step-000120"
    int         refused;     // newer complete checkpoints refused first (with fallback)
    bool        has_sampler; // this rank's sampler state was saved and restored
    uint64_t    epoch;       // ... its epoch and position
    size_t      position;
    dt_ckpt_kv *kvs; // owned: the user key/values saved with it
    int         nkvs;
} dt_ckpt_info;

// Frees the key/values and zeroes *info. NULL is a no-op.
DT_API void dt_ckpt_info_free(dt_ckpt_info *info);
// The value saved under `key`, or NULL.
DT_API const char *dt_ckpt_info_get(const dt_ckpt_info *info, const char *key);

// Saves a checkpoint of st->step under `dir` (created if missing). COLLECTIVE over pg
// (NULL = a single process): every rank calls it with the same step. Rank 0 writes the
// shared state, every rank its own file, the ranks wait for each other, then rank 0
// writes the marker and deletes checkpoints beyond opts->keep. A complete checkpoint of
// the same step is replaced whole: the new one is written beside it (step-N.next) and
// the two directories are exchanged atomically (renameat2), so a crash leaves the old
// or the new one (on file systems without the exchange, such as NFS, the old one is
// removed just before the rename: a crash there leaves only older ones). Returns the same status on
// every rank: DT_ERR_IO naming the file and the step that failed (write, fsync,
// rename...; the temporary file is removed), DT_ERR_ARG, DT_ERR_MISMATCH when ranks
// pass different steps, or the group's error when a rank died. On failure the previous
// checkpoints are intact.
DT_API dt_status dt_ckpt_save(const char *dir, dt_pg *pg, const dt_ckpt_state *st,
                              const dt_ckpt_opts *opts);

// Loads the newest complete checkpoint under `dir` into st's objects. COLLECTIVE over pg:
// rank 0 picks the checkpoint, every rank reads and verifies the shared file and its
// own, and either every rank applies it or none does (objects untouched on failure).
// No complete checkpoint (or no directory): DT_OK with info->found false. A refused
// checkpoint, without opts->fallback, fails on every rank with the refusing rank's
// message: DT_ERR_FORMAT (corrupt, truncated, wrong magic or version: names the file and
// the check), DT_ERR_MISMATCH (another model, optimizer, world size or sampler: names
// what was expected and what was found), DT_ERR_IO. With fallback, refusals are logged
// and older complete checkpoints tried; failing only when every one is refused.
// `info` may be NULL; otherwise free it with dt_ckpt_info_free (also after failure).
DT_API dt_status dt_ckpt_load(const char *dir, dt_pg *pg, const dt_ckpt_state *st,
                              const dt_ckpt_opts *opts, dt_ckpt_info *info /* out */);

// Steps of the complete checkpoints under `dir` (those with a marker file; not
// verified), ascending, in *steps (owned: dt_free; NULL when *n is 0). A missing
// directory is an empty list. DT_ERR_FORMAT naming a directory "step-<digits>" that a
// save would not have named so ("step-4" for step-000004). Not collective.
DT_API dt_status dt_ckpt_list(const char *dir, int64_t **steps /* out */, size_t *n /* out */);
// The newest complete checkpoint's step, -1 when none. Not collective.
DT_API dt_status dt_ckpt_latest(const char *dir, int64_t *step /* out */);
// "<dir>/step-000120" into buf (n bytes); DT_ERR_ARG when it does not fit.
DT_API dt_status dt_ckpt_path(const char *dir, int64_t step, char *buf, size_t n);

// Verifies without loading: a checkpoint file (every check of a load except those
// against a model), or a checkpoint directory (its marker, then every file it lists,
// with sizes and checksums). Not collective. Errors as dt_ckpt_load's.
DT_API dt_status dt_ckpt_verify(const char *path);
// The same checks on a file image in memory; `name` stands for the path in messages.
// Never reads outside buf[0, n). Used by the fuzzer.
DT_API dt_status dt_ckpt_verify_bytes(const void *buf, size_t n, const char *name);

// Parameters and buffers alone, in the same format (a file of kind "model"), written
// atomically like every checkpoint file. Not collective (rank 0 calls it).
DT_API dt_status dt_ckpt_save_params(const char *path, dt_params *p);
DT_API dt_status dt_ckpt_save_model(const char *path, dt_model *m); // its dt_params
// Loads parameters and buffers into `p` from a model file, a checkpoint's state.dtck, a
// checkpoint directory, or a directory of checkpoints (its newest complete one). The
// tables must match p's (DT_ERR_MISMATCH naming the first difference; a version-1 file
// has no buffers, so it loads only into parameters without buffers); p is untouched
// on failure. Not collective.
DT_API dt_status dt_ckpt_load_params(const char *path, dt_params *p);
DT_API dt_status dt_ckpt_load_model(const char *path, dt_model *m); // its dt_params

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_CKPT_H
