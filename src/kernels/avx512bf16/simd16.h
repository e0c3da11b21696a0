// simd16.h: AVX-512 helpers shared by the bf16 kernels (gemm16.c, conv16.c), for
// functions compiled with target("avx512f,avx512bw,avx512bf16") (DT_SIMD16_TARGET).
#ifndef DTRAIN_KERNELS_AVX512BF16_SIMD16_H
#define DTRAIN_KERNELS_AVX512BF16_SIMD16_H

#include <immintrin.h>

#define DT_SIMD16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define DT_SIMD16_INLINE DT_SIMD16_TARGET static inline __attribute__((always_inline))

// Sixteen rows of 16 32-bit words -> sixteen columns: r[i] lane j -> r[j] lane i.
// Interleaves 32-bit then 64-bit elements inside 128-bit lanes (u[4g + c] lane k then
// holds column 4k + c of rows 4g..4g+3), then gathers the lanes across registers.
DT_SIMD16_INLINE void dt_transpose16_epi32(__m512i *r) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i]     = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {
        u[4 * g]     = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
        __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c]       = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + c]   = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        r[4 + c]   = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + c]  = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}

// 16 floats rounded to bf16 (vmath.h's dt_round_bf16_v16 in intrinsics: to nearest even,
// NaN made quiet), each in the high half of its 32-bit lane (the low half zero). In
// intrinsics because clang refuses 64-byte generic vectors passed between a function
// with AVX-512 and one without (vmath.h's helpers have no target of their own).
DT_SIMD16_INLINE __m512i dt_round_bf16_hi(__m512 x) {
    __m512i u = _mm512_castps_si512(x), hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r =
        _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), hi);
    __m512i   q     = _mm512_or_si512(_mm512_and_si512(u, hi), _mm512_set1_epi32(0x400000));
    __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                              _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_blend_epi32(isnan, r, q);
}
#endif // DTRAIN_KERNELS_AVX512BF16_SIMD16_H
