// simd.h: sixteen-lane vectors for the kernels' loops (kernels/vmath.h builds on them).
// Which instructions they become is the kernel table's choice: each target's objects
// are compiled for its instruction set (src/kernels, docs/kernels.md), capped by DT_ISA.
#ifndef DTRAIN_SIMD_H
#define DTRAIN_SIMD_H

#include <stdint.h>

// Sixteen floats as one value, for loops the compiler would not vectorise well on its
// own (short rows with a tail). On AVX-512 it is one register; the baseline build
// splits it into SSE operations, and GCC 12's AVX2 build stores it through the stack:
// src/kernels/vec computes in each target's own width instead (vec.h's vf). Loads and
// stores go through memcpy: unaligned, and free of strict-aliasing trouble. The helpers
// are always inlined: a 64-byte vector passed to or returned from a real call is passed
// in registers by AVX-512 code and in memory by baseline code, so an out-of-line helper
// shared by two targets' objects (as at -O0) would be called with the wrong convention.
#define DT_VINLINE static inline __attribute__((always_inline))
typedef float   dt_v16f __attribute__((vector_size(64)));
typedef int32_t dt_v16i __attribute__((vector_size(64)));

DT_VINLINE dt_v16f dt_load16(const float *p) {
    dt_v16f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
DT_VINLINE void dt_store16(float *p, dt_v16f v) {
    __builtin_memcpy(p, &v, sizeof v);
}
// (vector + scalar broadcasts the scalar; a 16-element initialiser may be built lane
// by lane)
DT_VINLINE dt_v16f dt_splat16(float x) {
    return (dt_v16f){0} + x;
}
// Lane l of the result is lane mask[l] of v. GCC's builtin takes any mask; clang (the
// fuzzing build) has no variable-mask shuffle, so it gets the lane loop.
#if defined(__clang__)
DT_VINLINE dt_v16f dt_shuffle16f(dt_v16f v, dt_v16i mask) {
    dt_v16f r;
    for (int l = 0; l < 16; l++)
        r[l] = v[mask[l] & 15];
    return r;
}
DT_VINLINE dt_v16i dt_shuffle16i(dt_v16i v, dt_v16i mask) {
    dt_v16i r;
    for (int l = 0; l < 16; l++)
        r[l] = v[mask[l] & 15];
    return r;
}
#else
#define dt_shuffle16f(v, mask) __builtin_shuffle((dt_v16f)(v), (dt_v16i)(mask))
#define dt_shuffle16i(v, mask) __builtin_shuffle((dt_v16i)(v), (dt_v16i)(mask))
#endif

// a > 0 ? v : 0, lane by lane
DT_VINLINE dt_v16f dt_keep_positive16(dt_v16f a, dt_v16f v) {
    dt_v16i m = a > dt_splat16(0.0f);
    return (dt_v16f)((dt_v16i)v & m);
}

#endif // DTRAIN_SIMD_H
