// half_avx512.c: fp32 <-> fp16 with AVX-512F on 16 lanes (VCVTPS2PH / VCVTPH2PS round to
// nearest even like the scalar code of ref/half_ref.c, which takes the last elements).
#include "kernels/fill.h"
#include "kernels/half.h"

#include <immintrin.h>

#define ROUND_NE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

void dt_k_f32_to_f16_avx512(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), ROUND_NE));
    for (; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}

void dt_k_f16_to_f32_avx512(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}
