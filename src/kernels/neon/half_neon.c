// half_neon.c: fp32 <-> fp16 with the Advanced SIMD conversions, eight lanes at a time
// (FCVTN / FCVTL, part of every arm64 CPU). They round to nearest even under Linux's
// default FPCR (no flush to zero, no default NaN) and keep a NaN's sign and top payload
// bits, quieted, as the scalar code of ref/half_ref.c does, which takes the last elements.
#include "kernels/fill.h"
#include "kernels/half.h"

#include <arm_neon.h>

void dt_k_f32_to_f16_neon(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x4_t lo = vcvt_f16_f32(vld1q_f32(src + i));
        float16x8_t h  = vcvt_high_f16_f32(lo, vld1q_f32(src + i + 4));
        vst1q_u16(dst + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}

void dt_k_f16_to_f32_neon(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}
