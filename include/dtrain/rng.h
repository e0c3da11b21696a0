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

// ------------------------------------------------------------------------- MT19937
//
// The Mersenne Twister MT19937 (Matsumoto and Nishimura, 1998; the reference
// init_genrand and genrand_int32), kept to reproduce PyTorch's CPU generator exactly:
// torch.Generator().manual_seed(s) is init_genrand(s mod 2^32), and
// torch.randint(0, n, (k,), generator=g) draws, in order, for each element
//   n <  2^32: genrand_int32() % n
//   n >= 2^32: ((uint64)genrand_int32() << 32 | genrand_int32()) % n
// (the first draw is the high word). tests/data/fixtures/torch_randint.txt holds
// torch 1.13's draws for several seeds and ranges. Not for new uses: dt_rng is the
// project's generator; this one exists for bit-exact batches against PyTorch scripts.

typedef struct dt_mt19937 {
    uint32_t mt[624];
    int      mti; // next word of mt to temper; 624 = twist first
} dt_mt19937;

// init_genrand(seed mod 2^32): torch.Generator().manual_seed(seed). DT_ERR_ARG on NULL.
DT_API dt_status dt_mt19937_init(dt_mt19937 *g, uint64_t seed);
// genrand_int32: the next 32-bit output.
DT_API uint32_t dt_mt19937_u32(dt_mt19937 *g);
// torch's random64(): two outputs, the first one the high word.
DT_API uint64_t dt_mt19937_u64(dt_mt19937 *g);
// torch.randint(0, n, (count,), generator=g) into out[0..count), advancing g as torch
// does. DT_ERR_ARG when n is 0 (torch refuses an empty range too).
DT_API dt_status dt_mt19937_randint(dt_mt19937 *g, uint64_t n, size_t count, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_RNG_H
