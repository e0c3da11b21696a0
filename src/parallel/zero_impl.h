// zero_impl.h: the ZeRO wrapper's private layout, shared by zero.c (stages 1 and 2, whose
// gradients the one gradient reducer of src/ddp reduces, and what all stages share: the
// shard table, the norm, the step) and zero3.c (stage 3).
#ifndef DTRAIN_PARALLEL_ZERO_IMPL_H
#define DTRAIN_PARALLEL_ZERO_IMPL_H

#include "dtrain/zero.h"

// A bucket of the gradient reducer (src/ddp/reducer.h) as ZeRO cuts it.
typedef struct zbucket {
    size_t   offset, count; // floats of the whole buffers
    size_t   q;             // floor(count / world): each rank's chunk
    size_t   soff;          // this rank's chunk in the shard, then the remainder
    dt_work *rs;            // the reduce-scatter, when the remainder's all-reduce follows it
                            // (then the reducer waits for that one; this is freed after the sync)
} zbucket;

typedef struct zero3 zero3; // stage 3's state (zero3.c)

struct dt_zero {
    dt_params         *p, *shard;
    dt_pg             *pg;
    dt_optim          *opt;
    dt_zero_opts       o;
    int                world, rank;
    int                ntensors, nbuckets;
    zbucket           *b;
    struct dt_reducer *r; // stages 1 and 2: the gradient reducer (src/ddp/reducer.h)
    bool               sync, hooked;
    dt_status          err; // stage 3: a failure of the use hook, for the sync
    char               errmsg[512];
    size_t             ns;
    int                npieces;
    int               *piece_src;     // [npieces] source tensor of each shard tensor
    size_t            *piece_flat;    // [npieces] its float offset in the whole buffers
    bool              *piece_primary; // [npieces] counted in the norm (remainders: last rank only)
    double             wait_s, gather_s;
    int64_t            steps;
    double             moved; // floats received or sent (dt_zero_usage)
    zero3             *z3;
};

// Adds the pieces of the tensors that floats [lo, hi) of the whole buffers hold to the
// shard table (only counts them when add is false).
dt_status dt_zero_add_pieces(dt_zero *z, size_t lo, size_t hi, bool primary, bool add);

// Stage 3 (zero3.c). _init: the ranges and units, the consumer, the pages given back;
// this rank's range in *lo, *hi (its shard). _sync and _settle: dt_zero_sync's work,
// and every unit released and every operation finished (before a step, a gather of
// the whole parameters, the end). _free is NULL-safe.
dt_status dt_zero3_init(dt_zero *z, size_t *lo, size_t *hi);
dt_status dt_zero3_sync(dt_zero *z);
dt_status dt_zero3_settle(dt_zero *z);
void      dt_zero3_free(dt_zero *z);
dt_status dt_zero3_params_gather(dt_zero *z, int root);
dt_status dt_zero3_params_release(dt_zero *z);
void      dt_zero3_usage(const dt_zero *z, dt_zero_usage *u);
// Units and ranges of a table, without a group: rank ranges own[0..world] (world + 1
// entries) and the largest unit's floats.
void   dt_zero3_ranges(const dt_params *p, int world, size_t align, size_t *own);
size_t dt_zero3_largest_unit(const dt_params *p, size_t unit_bytes);

#endif
