// rng.c: Philox4x32-10 streams with key splitting (see rng.h for the contract).
#include "dtrain/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u // golden ratio
#define PHILOX_W1 0xBB67AE85u // sqrt(3) - 1

void dt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0          = n0;
        c1          = (uint32_t)p1;
        c2          = n2;
        c3          = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// SplitMix64's finaliser: a bijective 64-bit mixer, used to derive child keys.
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

dt_rng dt_rng_init(uint64_t seed) {
    dt_rng r = {0};
    r.key[0] = (uint32_t)seed;
    r.key[1] = (uint32_t)(seed >> 32);
    r.left   = 0;
    return r;
}

dt_rng dt_rng_split(const dt_rng *parent, uint64_t id) {
    uint64_t k = (uint64_t)parent->key[0] | (uint64_t)parent->key[1] << 32;
    uint64_t c = mix64(k + 0x9E3779B97F4A7C15ull) ^ mix64(id ^ 0xD1B54A32D192ED03ull);
    return dt_rng_init(mix64(c));
}

static void refill(dt_rng *r) {
    dt_philox4x32_10(r->ctr, r->key, r->buf);
    // 128-bit counter increment
    for (int i = 0; i < 4; i++)
        if (++r->ctr[i] != 0)
            break;
    r->left = 4;
}

uint32_t dt_rng_u32(dt_rng *r) {
    if (r->left == 0)
        refill(r);
    return r->buf[4 - r->left--];
}

uint64_t dt_rng_u64(dt_rng *r) {
    uint64_t lo = dt_rng_u32(r);
    uint64_t hi = dt_rng_u32(r);
    return lo | hi << 32;
}

float dt_rng_uniform(dt_rng *r) {
    return (float)(dt_rng_u32(r) >> 8) * 0x1.0p-24f;
}

float dt_rng_uniform_range(dt_rng *r, float lo, float hi) {
    return lo + (hi - lo) * dt_rng_uniform(r);
}

float dt_rng_normal(dt_rng *r) {
    double u1 = ((double)dt_rng_u32(r) + 1.0) * 0x1.0p-32; // (0, 1]
    double u2 = (double)dt_rng_u32(r) * 0x1.0p-32;         // [0, 1)
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t dt_rng_below(dt_rng *r, uint64_t n) {
    DT_ASSERT(n > 0);
    // Reject the low (2^64 mod n) values so every residue is equally likely.
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = dt_rng_u64(r);
        if (x >= threshold)
            return x % n;
    }
}

void dt_rng_permutation(dt_rng *r, uint32_t *perm, size_t n) {
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t   j  = (size_t)dt_rng_below(r, i);
        uint32_t t  = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j]     = t;
    }
}
