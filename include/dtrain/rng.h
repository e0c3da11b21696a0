// rng.h: a deterministic, splittable, counter-based random number generator.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
// the generator PyTorch uses on CUDA): a 64-bit key names a stream, a 128-bit counter
// walks it. Same seed, same numbers on every machine and compiler: the output is
// defined by 32-bit integer arithmetic only, and float conversions are exact.
//
// Splitting derives an independent child stream from (parent key, id), so dropout
// masks can be keyed by (seed, epoch, layer, dataset index) without any shared state:
//     dt_rng r = dt_rng_split(dt_rng_split(dt_rng_init(seed), epoch), layer);
#ifndef DTRAIN_RNG_H
#define DTRAIN_RNG_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_rng {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t buf[4]; // the last block of output
    int      left;   // unread words in buf
} dt_rng;

DT_API dt_rng dt_rng_init(uint64_t seed);
// An independent stream named by `id` under `parent`; parent is not advanced.
DT_API dt_rng   dt_rng_split(const dt_rng *parent, uint64_t id);
DT_API uint32_t dt_rng_u32(dt_rng *r);
DT_API uint64_t dt_rng_u64(dt_rng *r);
// Uniform in [0, 1) with 24 random bits (every value exactly representable).
DT_API float dt_rng_uniform(dt_rng *r);
// Uniform in [lo, hi).
DT_API float dt_rng_uniform_range(dt_rng *r, float lo, float hi);
// Standard normal (Box-Muller on two uniforms, computed in double).
DT_API float dt_rng_normal(dt_rng *r);
// Uniform integer in [0, n) without modulo bias; n > 0.
DT_API uint64_t dt_rng_below(dt_rng *r, uint64_t n);
// Fisher-Yates permutation of [0, n) into perm.
DT_API void dt_rng_permutation(dt_rng *r, uint32_t *perm, size_t n);

// The raw block function, exposed for known-answer tests.
DT_API void dt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_RNG_H
