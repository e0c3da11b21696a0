// autocast.c: the matrix products of Linear and Conv2d in a 16-bit precision mode
// (prec.h, "autocast"). bf16 runs on the bf16 GEMM of gemm16.c, rounding fp32
// activations as it packs them and reading the weights' bf16 shadow; fp16 rounds both
// operands to fp16 values and multiplies them with sgemm (exact products, fp32 sums),
// then rounds the product to fp16.
#include "nn/blas.h"
#include "nn/prec.h"

#include <string.h>

size_t dt_ac_shadow_bytes(dt_precision p, size_t n) {
    return p == DT_PREC_BF16 ? n * sizeof(uint16_t) : p == DT_PREC_FP16 ? n * sizeof(float) : 0;
}

// Rounds n floats to fp16 values through a small buffer of fp16 bits (vectorised).
static void round_f16(const float *src, float *dst, size_t n) {
    uint16_t h[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t c = n - i < 1024 ? n - i : 1024;
        dt_f32_to_f16(src + i, h, c);
        dt_f16_to_f32(h, dst + i, c);
    }
}

void dt_f32_round_f16_inplace(float *x, size_t n) {
    float t[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t c = n - i < 1024 ? n - i : 1024;
        round_f16(x + i, t, c);
        memcpy(x + i, t, sizeof(float) * c);
    }
}

void dt_ac_shadow_fill(dt_precision p, const float *w, size_t n, void *shadow) {
    if (p == DT_PREC_BF16)
        dt_f32_to_bf16(w, shadow, n);
    else if (p == DT_PREC_FP16)
        round_f16(w, shadow, n);
}

// A dense fp16-rounded copy of a stored (rows, cols) block of stride ld.
static float *rounded_copy(const float *x, int rows, int cols, int ld) {
    float *t = dt_alloc(sizeof(float) * ((size_t)rows * (size_t)cols + 1));
    if (!t)
        return NULL;
    for (int r = 0; r < rows; r++)
        round_f16(x + (size_t)r * (size_t)ld, t + (size_t)r * (size_t)cols, (size_t)cols);
    return t;
}

static dt_status gemm_f16(bool ta, bool tb, int m, int n, int k, const float *a, const void *a16,
                          int lda, const float *b, const void *b16, int ldb, float *c, int ldc,
                          bool accumulate) {
    float    *ta_ = NULL, *tb_ = NULL, *tc = NULL;
    dt_status st = DT_OK;
    if (!a16) {
        if (!(ta_ = rounded_copy(a, ta ? k : m, ta ? m : k, lda)))
            goto nomem;
        lda = ta ? m : k;
    }
    if (!b16) {
        if (!(tb_ = rounded_copy(b, tb ? n : k, tb ? k : n, ldb)))
            goto nomem;
        ldb = tb ? k : n;
    }
    const float *pa = a16 ? a16 : ta_, *pb = b16 ? b16 : tb_;
    if (accumulate) { // the product rounded to fp16 on its own, then added
        if (!(tc = dt_alloc(sizeof(float) * (size_t)m * (size_t)n)))
            goto nomem;
        dt_sgemm(ta, tb, m, n, k, 1.0f, pa, lda, pb, ldb, 0.0f, tc, n);
        dt_f32_round_f16_inplace(tc, (size_t)m * (size_t)n);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * (size_t)ldc + (size_t)j] += tc[(size_t)i * (size_t)n + (size_t)j];
    } else {
        dt_sgemm(ta, tb, m, n, k, 1.0f, pa, lda, pb, ldb, 0.0f, c, ldc);
        for (int i = 0; i < m; i++)
            dt_f32_round_f16_inplace(c + (size_t)i * (size_t)ldc, (size_t)n);
    }
    goto done;
nomem:
    st = DT_ERR_NOMEM;
done:
    dt_free(ta_);
    dt_free(tb_);
    dt_free(tc);
    return st;
}

dt_status dt_ac_gemm(dt_precision p, bool trans_a, bool trans_b, int m, int n, int k,
                     const float *a, const void *a16, int lda, const float *b, const void *b16,
                     int ldb, float *c, int ldc, bool accumulate) {
    if (m <= 0 || n <= 0)
        return DT_OK;
    if (k <= 0) {
        if (!accumulate)
            for (int i = 0; i < m; i++)
                memset(c + (size_t)i * (size_t)ldc, 0, sizeof(float) * (size_t)n);
        return DT_OK;
    }
    switch (p) {
    case DT_PREC_BF16:
        return dt_gemm_bf16_mixed(dt_prec_path_get(), trans_a, trans_b, m, n, k,
                                  a16 ? a16 : (const void *)a, lda, !a16,
                                  b16 ? b16 : (const void *)b, ldb, !b16, c, ldc, accumulate);
    case DT_PREC_FP16:
        return gemm_f16(trans_a, trans_b, m, n, k, a, a16, lda, b, b16, ldb, c, ldc, accumulate);
    default:
        dt_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
        return DT_OK;
    }
}
