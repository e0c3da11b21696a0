// half_avx2.c: fp32 <-> fp16 with F16C on 8 lanes (VCVTPS2PH / VCVTPH2PS round to nearest
// even like the scalar code of ref/half_ref.c, which takes the last elements).
#include "kernels/fill.h"
#include "kernels/half.h"

#include <immintrin.h>

#define ROUND_NE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

void dt_k_f32_to_f16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), ROUND_NE));
    for (; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}

void dt_k_f16_to_f32_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}
