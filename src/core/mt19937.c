// mt19937.c: the Mersenne Twister and PyTorch's randint on top of it (see rng.h).
// Written from the published algorithm (Matsumoto and Nishimura, ACM TOMACS 1998).
#include "dtrain/rng.h"

#define MT_N          624
#define MT_M          397
#define MT_MATRIX_A   0x9908b0dfu
#define MT_UPPER_MASK 0x80000000u
#define MT_LOWER_MASK 0x7fffffffu

dt_status dt_mt19937_init(dt_mt19937 *g, uint64_t seed) {
    if (!g)
        return dt_fail(DT_ERR_ARG, "dt_mt19937_init: expected a generator, found NULL");
    g->mt[0] = (uint32_t)seed;
    for (uint32_t i = 1; i < MT_N; i++)
        g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + i;
    g->mti = MT_N;
    return DT_OK;
}

static void twist(dt_mt19937 *g) {
    uint32_t *mt = g->mt;
    for (int k = 0; k < MT_N; k++) {
        uint32_t y = (mt[k] & MT_UPPER_MASK) | (mt[(k + 1) % MT_N] & MT_LOWER_MASK);
        mt[k]      = mt[(k + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
    }
    g->mti = 0;
}

uint32_t dt_mt19937_u32(dt_mt19937 *g) {
    if (g->mti >= MT_N)
        twist(g);
    uint32_t y = g->mt[g->mti++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t dt_mt19937_u64(dt_mt19937 *g) {
    uint64_t hi = dt_mt19937_u32(g);
    uint64_t lo = dt_mt19937_u32(g);
    return hi << 32 | lo;
}

dt_status dt_mt19937_randint(dt_mt19937 *g, uint64_t n, size_t count, uint64_t *out) {
    if (n == 0)
        return dt_fail(DT_ERR_ARG, "dt_mt19937_randint: expected a range n >= 1, found 0");
    if (n < (1ull << 32)) {
        for (size_t i = 0; i < count; i++)
            out[i] = dt_mt19937_u32(g) % n;
    } else {
        for (size_t i = 0; i < count; i++)
            out[i] = dt_mt19937_u64(g) % n;
    }
    return DT_OK;
}
