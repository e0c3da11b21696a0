// targets.h: what the kernel tests share: the targets this machine can run (ref first,
// whatever DT_ISA says: each test calls each target's own rows, dt_ktab_only), random
// inputs, and comparisons against a bound.
#ifndef DTRAIN_TESTS_KERNELS_TARGETS_H
#define DTRAIN_TESTS_KERNELS_TARGETS_H

#include "../check.h"
#include "kernels/table.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define U 0x1p-24 // the unit roundoff of float

// Targets with kernels of their own on this CPU: ref, then the others it has.
static inline int kt_targets(dt_isa *out) {
    int n = 0;
    for (int t = 0; t < DT_ISA_COUNT_; t++)
        if (dt_ktab_only((dt_isa)t))
            out[n++] = (dt_isa)t;
    return n;
}

static unsigned        kt_seed = 12345u;
static inline uint32_t kt_bits(void) {
    kt_seed = kt_seed * 1664525u + 1013904223u;
    return kt_seed;
}
// Uniform in [lo, hi).
static inline float kt_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(kt_bits() >> 8) * 0x1p-24f;
}
static inline float *kt_floats(size_t n, float lo, float hi) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        p[i] = kt_uniform(lo, hi);
    return p;
}
static inline float *kt_copy(const float *x, size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    memcpy(p, x, sizeof(float) * n);
    return p;
}

// a and b bit for bit (NaNs by their bits too); reports the first difference.
static inline bool kt_same(const char *what, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes) == 0)
        return CHECK(true);
    const unsigned char *x = a, *y = b;
    size_t               i = 0;
    while (x[i] == y[i])
        i++;
    fprintf(stderr, "     %s: first byte that differs: %zu of %zu\n", what, i, bytes);
    return CHECK(false);
}

// |a[i] - b[i]| <= k u mag[i] (mag NULL: k u max(|b[i]|, floor)) for every i.
static inline bool kt_close(const char *what, const float *a, const float *b, size_t n, double k,
                            const double *mag, double floor) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double m   = mag ? mag[i] : fabs((double)b[i]);
        double tol = k * U * (m > floor ? m : floor);
        if (!(fabs((double)a[i] - (double)b[i]) <= tol) && bad++ == 0)
            first = i;
    }
    if (bad)
        fprintf(stderr, "     %s: %zu of %zu beyond the bound, first [%zu]: %.9g vs ref %.9g\n",
                what, bad, n, first, (double)a[first], (double)b[first]);
    return CHECK(bad == 0);
}

#endif // DTRAIN_TESTS_KERNELS_TARGETS_H
