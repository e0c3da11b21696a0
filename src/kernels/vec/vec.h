// vec.h: the portable vector kernels. Each file of src/kernels/vec is written once, in C
// with GCC's vector extensions (core/simd.h, kernels/vmath.h), and compiled once per
// target by the Makefile: plain (ref), and on x86-64 with -march=x86-64-v3 (avx2) and
// -march=x86-64-v4 (avx512), DT_KVEC naming the target. Its kernels are static; its
// fill function, suffixed by the target (DT_KV), puts them in the table, and vec.c's
// dt_kvec_fill_<target> calls every file's. The compiler alone decides the instructions,
// so the arithmetic of a kernel on a target is what GCC makes of the C for that
// instruction set (with FMA contraction from avx2 up): the same on every CPU of that
// target.
#ifndef DTRAIN_KERNELS_VEC_H
#define DTRAIN_KERNELS_VEC_H

#include "kernels/table.h"
#include "kernels/vmath.h"

#ifndef DT_KVEC
#error "src/kernels/vec/*.c are compiled per target with -DDT_KVEC=<target> (Makefile)"
#endif

#define DT_KV_CAT_(a, b) a##_##b
#define DT_KV_CAT(a, b)  DT_KV_CAT_(a, b)
// name_<target>: dt_kvec_fill_act_avx2 for DT_KV(fill_act) in the avx2 object
#define DT_KV(name) DT_KV_CAT(dt_kvec_##name, DT_KVEC)
// this object's target, as a dt_isa
#define DT_KVEC_ISA_ref    DT_ISA_REF
#define DT_KVEC_ISA_avx2   DT_ISA_AVX2
#define DT_KVEC_ISA_avx512 DT_ISA_AVX512
#define DT_KVEC_ISA_neon   DT_ISA_NEON
#define DT_KV_ISA_(t)      DT_KVEC_ISA_##t
#define DT_KV_ISA(t)       DT_KV_ISA_(t)
#define DT_KVEC_ISA        DT_KV_ISA(DT_KVEC)

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

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
// e^x (vmath.h's dt_vexp16, lane for lane)
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

// max of row[0, len), len >= 1 (vmath.h's dt_vmax_row: the lanes' maxima taken in order)
DT_VINLINE float vmax_row(const float *row, size_t len) {
    float  m = row[0];
    size_t i = 0;
    if (len >= 16) {
        vf mv[VH];
        UNROLL(2) for (int h = 0; h < VH; h++) mv[h] = vload(row + h * VL);
        for (i = 16; i + 16 <= len; i += 16)
            UNROLL(2) for (int h = 0; h < VH; h++) {
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

// row[i] = e^(row[i] - sub) for i < len; returns their sum (vmath.h's dt_vexp_row: the
// same exponentials, summed in the same order).
DT_VINLINE float vexp_row(float *row, size_t len, float sub) {
    vf     acc[VH] = {0}, s = vsplat(sub);
    size_t i = 0;
    for (; i + 16 <= len; i += 16)
        UNROLL(2) for (int h = 0; h < VH; h++) {
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

// One per file of this folder.
void DT_KV(fill_act)(dt_ktab *t);
void DT_KV(fill_conv)(dt_ktab *t);
void DT_KV(fill_conv_wide)(dt_ktab *t);
void DT_KV(fill_shifted)(dt_ktab *t);
void DT_KV(fill_norm)(dt_ktab *t);
void DT_KV(fill_attn)(dt_ktab *t);
void DT_KV(fill_optim)(dt_ktab *t);
void DT_KV(fill_half)(dt_ktab *t);
void DT_KV(fill_reduce)(dt_ktab *t);
// vec.c: all of the above
void DT_KV(fill)(dt_ktab *t);

#endif // DTRAIN_KERNELS_VEC_H
