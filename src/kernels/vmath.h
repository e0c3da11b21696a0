// vmath.h: what the vector kernels share: exp over sixteen floats at once (for softmax,
// the losses and the activations: libm's expf/tanhf are scalar calls, 10-40 ns each;
// this is a few instructions per lane), the target's own vector (vf) with row maxima
// and sums in a fixed order on it, and bf16 rounding of sixteen lanes. Always inlined,
// so each target's object (vec/*.c, the target folders) compiles them for its own
// instruction set (see core/simd.h on the calling convention of 64-byte vectors).
#ifndef DTRAIN_KERNELS_VMATH_H
#define DTRAIN_KERNELS_VMATH_H

#include "core/simd.h"

#include <stddef.h>
#include <stdint.h>

// e^x for each lane: x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2, ln2 split in a
// high part exact in float and a low part (Cody-Waite), so r carries no rounding of
// n ln2; e^r by its Taylor polynomial to r^7 (truncation 5e-9 relative at |r| = 0.347),
// then the exponent bits of 2^n added in. Relative error about 2 float ulps (2.4e-7).
// Below -87.3 (where e^x leaves the normal floats) the result is 0, so exp(-inf) = 0;
// above 88 it saturates at e^88 (callers subtract a maximum first). No NaN inputs.
// (A macro, so that it is built on the target's own vector too: vexp below.)
#define DT_DEFINE_VEXP(name, VF, VI)                                                               \
    DT_VINLINE VF name(VF x) {                                                                     \
        const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */          \
        VI          small = x < (VF){0} - 87.3f;                                                   \
        VI          big   = x > (VF){0} + 88.0f;                                                   \
        x                 = (VF)(((VI)x & ~big) | ((VI)((VF){0} + 88.0f) & big));                  \
        x                 = (VF)((VI)x & ~small); /* then 0, fixed below */                        \
        VF t              = x * 1.44269504088896341f + magic;                                      \
        VF n              = t - magic;                                                             \
        VF r              = x - n * 0.693145751953125f; /* ln2 high: 12 significant bits */        \
        r                 = r - n * 1.42860682030941723212e-6f;                                    \
        VF p              = (VF){0} + 1.0f / 5040.0f;                                              \
        p                 = p * r + 1.0f / 720.0f;                                                 \
        p                 = p * r + 1.0f / 120.0f;                                                 \
        p                 = p * r + 1.0f / 24.0f;                                                  \
        p                 = p * r + 1.0f / 6.0f;                                                   \
        p                 = p * r + 0.5f;                                                          \
        p                 = p * r + 1.0f;                                                          \
        p                 = p * r + 1.0f;                                                          \
        VI e              = __builtin_convertvector(n, VI) << 23;                                  \
        VF y              = (VF)((VI)p + e);                                                       \
        return (VF)((VI)y & ~small);                                                               \
    }
DT_DEFINE_VEXP(dt_vexp16, dt_v16f, dt_v16i)

// Sum of the sixteen lanes, as a tree of four shuffled adds (a fixed order; a lane-by-lane
// loop is a chain of 15 dependent adds, a quarter of LayerNorm's time on rows of 128).
DT_VINLINE float dt_hsum16(dt_v16f v) {
    const dt_v16i h8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
    const dt_v16i h4 = {4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15};
    const dt_v16i h2 = {2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const dt_v16i h1 = {1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v += dt_shuffle16f(v, h8);
    v += dt_shuffle16f(v, h4);
    v += dt_shuffle16f(v, h2);
    v += dt_shuffle16f(v, h1);
    return v[0];
}
// The target's own vector, vf of VL lanes, for the loops whose lanes never meet (maps,
// the applying passes of the norms): one zmm register on avx512 (simd.h's sixteen
// lanes), one ymm on avx2 (eight lanes; two xmm on ref and neon). GCC 12 builds a
// sixteen-lane vector on AVX2 as two halves that go through the stack at every store,
// with one compare and branch per lane for its integer masks: GELU's forward spent a
// third of its instructions there. Each lane computes what it computed in sixteen, so
// the bits do not change; loops that sum over lanes keep simd.h's sixteen-lane order
// (VH, vhsum16 below).
#if defined(__AVX512F__)
#define VL 16
typedef dt_v16f vf;
typedef dt_v16i vfi;
#else
#define VL 8
typedef float   vf __attribute__((vector_size(32)));
typedef int32_t vfi __attribute__((vector_size(32)));
#endif
DT_VINLINE vf vload(const float *p) {
    vf v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
DT_VINLINE void vstore(float *p, vf v) {
    __builtin_memcpy(p, &v, sizeof v);
}
DT_VINLINE vf vsplat(float x) {
    return (vf){0} + x;
}
// lanes [0, len) of p, zero elsewhere; the store writes lanes [0, len)
DT_VINLINE vf vload_part(const float *p, size_t len) {
    vf v = {0};
    __builtin_memcpy(&v, p, sizeof(float) * len);
    return v;
}
DT_VINLINE void vstore_part(float *p, vf v, size_t len) {
    __builtin_memcpy(p, &v, sizeof(float) * len);
}
// a > 0 ? v : 0, lane by lane
DT_VINLINE vf vkeep_positive(vf a, vf v) {
    return (vf)((vfi)v & (a > (vf){0}));
}
// e^x (dt_vexp16, lane for lane)
DT_DEFINE_VEXP(vexp, vf, vfi)
// Sums over lanes keep sixteen lanes: VH target vectors per sixteen floats (lanes 0-7,
// then 8-15, on eight-lane targets), summed by dt_hsum16's tree.
#define VH (16 / VL)
DT_VINLINE float vhsum16(const vf *a) {
#if VL == 16
    return dt_hsum16(a[0]);
#else
    vf v = a[0] + a[1]; // dt_hsum16's first step: lane l + lane l + 8
    v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 4, 5, 6, 7);
    v += __builtin_shufflevector(v, v, 1, 0, 2, 3, 4, 5, 6, 7);
    return v[0];
#endif
}

// max of row[0, len), len >= 1 (the lanes' maxima taken in order)
DT_VINLINE float vmax_row(const float *row, size_t len) {
    float  m = row[0];
    size_t i = 0;
    if (len >= 16) {
        vf mv[VH];
        _Pragma("GCC unroll 2") for (int h = 0; h < VH; h++) mv[h] = vload(row + h * VL);
        for (i = 16; i + 16 <= len; i += 16)
            _Pragma("GCC unroll 2") for (int h = 0; h < VH; h++) {
                vf  v = vload(row + i + h * VL);
                vfi g = v > mv[h];
                mv[h] = (vf)(((vfi)v & g) | ((vfi)mv[h] & ~g));
            }
        m = mv[0][0];
        for (int h = 0; h < VH; h++)
            for (int l = h ? 0 : 1; l < VL; l++)
                m = mv[h][l] > m ? mv[h][l] : m;
    }
    for (; i < len; i++)
        m = row[i] > m ? row[i] : m;
    return m;
}

// row[i] = e^(row[i] - sub) for i < len; returns their sum (the lanes summed in
// sixteen-lane order: the same bits on every width).
DT_VINLINE float vexp_row(float *row, size_t len, float sub) {
    vf     acc[VH] = {0}, s = vsplat(sub);
    size_t i = 0;
    for (; i + 16 <= len; i += 16)
        _Pragma("GCC unroll 2") for (int h = 0; h < VH; h++) {
            vf e = vexp(vload(row + i + h * VL) - s);
            vstore(row + i + h * VL, e);
            acc[h] += e;
        }
    for (int h = 0; h < VH && i + (size_t)h * VL < len; h++) {
        size_t at = i + (size_t)h * VL, n = len - at < VL ? len - at : VL;
        vf     e = vexp(vload_part(row + at, n) - s);
        for (size_t l = n; l < VL; l++)
            e[l] = 0.0f;
        vstore_part(row + at, e, n);
        acc[h] += e;
    }
    return vhsum16(acc);
}

// acc[o] += row[o] for o < n, in double, a register of doubles per vector step: eight
// columns on AVX-512, four elsewhere (a 64-byte vector goes through the stack in GCC 12's
// AVX2 build; vf above). Each float is exact in double: the same sums, in the same
// order, as the scalar loop, whatever the width.
typedef float dt_v8f __attribute__((vector_size(32)));
#if defined(__AVX512F__)
#define DT_ROW_F64 8
#else
#define DT_ROW_F64 4
#endif
typedef float   dt_vrowf __attribute__((vector_size(DT_ROW_F64 * 4)));
typedef double  dt_vrowd __attribute__((vector_size(DT_ROW_F64 * 8)));
DT_VINLINE void dt_add_row_f64(const float *row, int n, double *acc) {
    int nv = n / DT_ROW_F64 * DT_ROW_F64;
    for (int o = 0; o < nv; o += DT_ROW_F64) {
        dt_vrowf r;
        dt_vrowd a;
        __builtin_memcpy(&r, row + o, sizeof r);
        __builtin_memcpy(&a, acc + o, sizeof a);
        a += __builtin_convertvector(r, dt_vrowd);
        __builtin_memcpy(acc + o, &a, sizeof a);
    }
    for (int o = nv; o < n; o++)
        acc[o] += row[o];
}

// For the few helpers that ran as baseline x86-64 code (out of line, called from every
// multiversioned kernel) before the kernels were compiled per target: their products and
// sums stay separately rounded on every target (no FMA contraction), so their bits are
// what they always were. Out of line, as they were.
#if defined(__GNUC__) && !defined(__clang__)
#define DT_NO_FMA __attribute__((noinline, optimize("fp-contract=off")))
#else
#define DT_NO_FMA __attribute__((noinline))
#endif

// Sixteen lanes of bit patterns (simd.h's conventions: always inlined, memcpy loads).
typedef uint32_t dt_v16u __attribute__((vector_size(64)));
typedef uint16_t dt_v16h __attribute__((vector_size(32)));

// fp32 bit patterns rounded to bf16 (to nearest even; NaN made quiet), returned as fp32
// patterns whose low 16 bits are zero: >> 16 gives the bf16 bits.
// (A macro, so that vec/ can build it on its own vector width: vec/half.c.)
#define DT_DEFINE_ROUND_BF16(name, VU)                                                             \
    DT_VINLINE VU name(VU u) {                                                                     \
        VU r   = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;                                   \
        VU q   = (u & 0xffff0000u) | 0x400000u;                                                    \
        VU nan = (VU)((u & 0x7fffffffu) > 0x7f800000u); /* all ones where NaN */                   \
        return (q & nan) | (r & ~nan);                                                             \
    }
DT_DEFINE_ROUND_BF16(dt_round_bf16_v16, dt_v16u)
// Sixteen floats at src to bf16 at dst.
DT_VINLINE void dt_f32_to_bf16_16(const float *src, uint16_t *dst) {
    dt_v16u u;
    __builtin_memcpy(&u, src, sizeof u);
    dt_v16h h = __builtin_convertvector(dt_round_bf16_v16(u) >> 16, dt_v16h);
    __builtin_memcpy(dst, &h, sizeof h);
}

#endif // DTRAIN_KERNELS_VMATH_H
