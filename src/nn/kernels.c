// kernels.c: the element-wise and data-movement loops around the GEMMs. Each is
// memory-bound; DT_CLONES gives them AVX-512/AVX2 versions picked at load time.
#include "core/simd.h"
#include "nn/nn_impl.h"

#include <string.h>

// Output columns [lo, hi) whose input column ow*stride - pad + kj lies inside [0, w).
static void inside_cols(int wo, int w, int stride, int pad, int kj, int *lo, int *hi) {
    int a = 0, b = wo;
    while (a < wo && a * stride - pad + kj < 0)
        a++;
    while (b > a && (b - 1) * stride - pad + kj >= w)
        b--;
    *lo = a;
    *hi = b;
}

// Rows of `col` are (channel, ki, kj), columns are output positions (oh, ow): row
// r = (c*k + ki)*k + kj matches the (Cin, kh, kw) order of a flattened conv weight.
DT_CLONES void dt_nn_im2col(const float *img, int c, int h, int w, int k, int stride, int pad,
                            int ho, int wo, float *col) {
    for (int ch = 0; ch < c; ch++) {
        const float *plane = img + (size_t)ch * h * w;
        for (int ki = 0; ki < k; ki++) {
            for (int kj = 0; kj < k; kj++) {
                float *row = col + ((size_t)(ch * k + ki) * k + kj) * (size_t)ho * wo;
                int    ow_lo, ow_hi;
                inside_cols(wo, w, stride, pad, kj, &ow_lo, &ow_hi);
                for (int oh = 0; oh < ho; oh++) {
                    int    ih  = oh * stride - pad + ki;
                    float *dst = row + (size_t)oh * wo;
                    if (ih < 0 || ih >= h) {
                        memset(dst, 0, sizeof(float) * (size_t)wo);
                        continue;
                    }
                    const float *src = plane + (size_t)ih * w - pad + kj;
                    for (int ow = 0; ow < ow_lo; ow++)
                        dst[ow] = 0.0f;
                    if (stride == 1) {
                        memcpy(dst + ow_lo, src + ow_lo, sizeof(float) * (size_t)(ow_hi - ow_lo));
                    } else {
                        for (int ow = ow_lo; ow < ow_hi; ow++)
                            dst[ow] = src[(size_t)ow * stride];
                    }
                    for (int ow = ow_hi; ow < wo; ow++)
                        dst[ow] = 0.0f;
                }
            }
        }
    }
}

DT_CLONES void dt_nn_col2im(const float *col, int c, int h, int w, int k, int stride, int pad,
                            int ho, int wo, float *img) {
    for (int ch = 0; ch < c; ch++) {
        float *plane = img + (size_t)ch * h * w;
        for (int ki = 0; ki < k; ki++) {
            for (int kj = 0; kj < k; kj++) {
                const float *row = col + ((size_t)(ch * k + ki) * k + kj) * (size_t)ho * wo;
                int          ow_lo, ow_hi;
                inside_cols(wo, w, stride, pad, kj, &ow_lo, &ow_hi);
                for (int oh = 0; oh < ho; oh++) {
                    int ih = oh * stride - pad + ki;
                    if (ih < 0 || ih >= h)
                        continue;
                    const float *src = row + (size_t)oh * wo;
                    float       *dst = plane + (size_t)ih * w - pad + kj;
                    if (stride == 1) {
                        for (int ow = ow_lo; ow < ow_hi; ow++)
                            dst[ow] += src[ow];
                    } else {
                        for (int ow = ow_lo; ow < ow_hi; ow++)
                            dst[(size_t)ow * stride] += src[ow];
                    }
                }
            }
        }
    }
}

DT_CLONES void dt_nn_relu_inplace(float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

DT_CLONES void dt_nn_relu_backward(const float *y, float *d, size_t n) {
    for (size_t i = 0; i < n; i++)
        d[i] = y[i] > 0.0f ? d[i] : 0.0f;
}

DT_CLONES void dt_nn_add_row_bias(float *y, const float *b, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float  v   = b[r];
        float *row = y + (size_t)r * cols;
        for (int j = 0; j < cols; j++)
            row[j] += v;
    }
}

// Sixteen running sums per row, so the loop vectorises without reassociating floats
// behind our back: the order of additions is fixed and the same on every CPU.
DT_CLONES void dt_nn_row_sums_add(const float *y, int rows, int cols, float *s) {
    for (int r = 0; r < rows; r++) {
        const float *row     = y + (size_t)r * cols;
        float        acc[16] = {0};
        int          j       = 0;
        for (; j + 16 <= cols; j += 16)
            for (int l = 0; l < 16; l++)
                acc[l] += row[j + l];
        float total = 0.0f;
        for (int l = 0; l < 16; l++)
            total += acc[l];
        for (; j < cols; j++)
            total += row[j];
        s[r] += total;
    }
}

DT_CLONES void dt_nn_shard_tree(float *buf, size_t ld, int shards, size_t n) {
    for (int h = shards / 2; h >= 1; h /= 2)
        for (int k = 0; k < h; k++) {
            float       *a = buf + (size_t)k * ld;
            const float *b = buf + (size_t)(k + h) * ld;
            for (size_t j = 0; j < n; j++)
                a[j] += b[j];
        }
}
