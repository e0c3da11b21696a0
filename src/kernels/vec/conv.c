// conv.c: the data movement and small reductions around the convolution and Linear
// GEMMs (im2col and its adjoint, bias add and bias gradients, the gradient shards' fixed
// tree), the global average pool and the dropout mask (vec.h). Memory-bound loops.
#include "core/tree.h"
#include "kernels/vec/vec.h"

#include <string.h>

// Columns [lo, hi) of the output whose input column j*sw - pw + kj lies inside [0, w).
static void inside(int wo, int w, int sw, int pw, int kj, int *lo, int *hi) {
    int a = 0, b = wo;
    while (a < wo && a * sw - pw + kj < 0)
        a++;
    while (b > a && (b - 1) * sw - pw + kj >= w)
        b--;
    *lo = a;
    *hi = b;
}

// Row (c, ki, kj) of col, column (i, j) = x[c][i*sh - ph + ki][j*sw - pw + kj] or 0:
// the (cin, kh, kw) order of a flattened weight row.
static void im2col(const dt_kconv *p, const float *x, int h, int w, int ho, int wo, float *col,
                   size_t ldc) {
    for (int c = 0; c < p->cin; c++)
        for (int ki = 0; ki < p->kh; ki++)
            for (int kj = 0; kj < p->kw; kj++) {
                float *row = col + ((size_t)(c * p->kh + ki) * p->kw + kj) * ldc;
                int    lo, hi;
                inside(wo, w, p->sw, p->pw, kj, &lo, &hi);
                for (int i = 0; i < ho; i++) {
                    int    ih  = i * p->sh - p->ph + ki;
                    float *dst = row + (size_t)i * wo;
                    if (ih < 0 || ih >= h) {
                        memset(dst, 0, sizeof(float) * (size_t)wo);
                        continue;
                    }
                    const float *src = x + ((size_t)c * h + ih) * w - p->pw + kj;
                    for (int j = 0; j < lo; j++)
                        dst[j] = 0.0f;
                    if (p->sw == 1) // rows are short (7 to 28): no memcpy call
                        for (int j = lo; j < hi; j++)
                            dst[j] = src[j];
                    else
                        for (int j = lo; j < hi; j++)
                            dst[j] = src[(size_t)j * p->sw];
                    for (int j = hi; j < wo; j++)
                        dst[j] = 0.0f;
                }
            }
}

// The adjoint: dx += the columns scattered back (the caller zeroes dx first).
static void col2im(const dt_kconv *p, const float *col, size_t ldc, int h, int w, int ho, int wo,
                   float *dx) {
    for (int c = 0; c < p->cin; c++)
        for (int ki = 0; ki < p->kh; ki++)
            for (int kj = 0; kj < p->kw; kj++) {
                const float *row = col + ((size_t)(c * p->kh + ki) * p->kw + kj) * ldc;
                int          lo, hi;
                inside(wo, w, p->sw, p->pw, kj, &lo, &hi);
                for (int i = 0; i < ho; i++) {
                    int ih = i * p->sh - p->ph + ki;
                    if (ih < 0 || ih >= h)
                        continue;
                    const float *src = row + (size_t)i * wo;
                    float       *dst = dx + ((size_t)c * h + ih) * w - p->pw + kj;
                    if (p->sw == 1)
                        for (int j = lo; j < hi; j++)
                            dst[j] += src[j];
                    else
                        for (int j = lo; j < hi; j++)
                            dst[(size_t)j * p->sw] += src[j];
                }
            }
}

// acc += the column sums of dy's rows (ld floats apart), row by row, in double.
static void col_sums_f64(const float *dy, size_t ld, int rows, int w, double *acc) {
    for (int r = 0; r < rows; r++)
        dt_add_row_f64(dy + (size_t)r * ld, w, acc);
}

static void add_row_bias(float *y, const float *b, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float  v   = b[r];
        float *row = y + (size_t)r * cols;
        for (int j = 0; j < cols; j++)
            row[j] += v;
    }
}

// Sixteen running sums per row, so the loop vectorises without reassociating floats
// behind our back: the order of additions is fixed and the same on every CPU.
static void row_sums_add(const float *y, int rows, int cols, float *s) {
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

static void shard_tree(float *buf, size_t ld, int shards, size_t n) {
    for (int h = dt_tree_top(shards); h >= 1; h /= 2)
        for (int k = 0; k < h && k + h < shards; k++) {
            float       *a = buf + (size_t)k * ld;
            const float *b = buf + (size_t)(k + h) * ld;
            for (size_t j = 0; j < n; j++)
                a[j] += b[j];
        }
}

// The global average (output 1x1, the ResNet's head): one contiguous sum per plane.
static void global_avg(size_t planes, size_t hw, const float *x, float *y) {
    for (size_t pl = 0; pl < planes; pl++) {
        const float *xp      = x + pl * hw;
        vf           acc[VH] = {0};
        size_t       i       = 0;
        for (; i + 16 <= hw; i += 16)
            UNROLL(2) for (int h = 0; h < VH; h++) acc[h] += vload(xp + i + h * VL);
        float s = vhsum16(acc);
        for (; i < hw; i++)
            s += xp[i];
        y[pl] = s / (float)hw;
    }
}

static void global_avg_bwd(size_t planes, size_t hw, const float *dy, float *dx) {
    for (size_t pl = 0; pl < planes; pl++) {
        float  g  = dy[pl] / (float)hw;
        float *xp = dx + pl * hw;
        for (size_t i = 0; i < hw; i++)
            xp[i] = g;
    }
}

// v[i] *= f for i < n, a vector at a time (the same products as the scalar loop).
DT_VINLINE void scale_run(float *v, size_t n, float f) {
    size_t i = 0;
    for (; i + VL <= n; i += VL)
        vstore(v + i, vload(v + i) * f);
    for (; i < n; i++)
        v[i] *= f;
}

// v (units x per_unit) *= scale where the unit's mask byte is set, 0 where it is not (a
// dropout mask, drawn by the layer, applied forward or backward).
static void mask_scale(float *v, const uint8_t *mask, size_t units, size_t per_unit, float scale) {
    for (size_t u = 0; u < units; u++)
        scale_run(v + u * per_unit, per_unit, mask[u] ? scale : 0.0f);
}

void DT_KV(fill_conv)(dt_ktab *t) {
    t->im2col         = im2col;
    t->col2im         = col2im;
    t->col_sums_f64   = col_sums_f64;
    t->add_row_bias   = add_row_bias;
    t->row_sums_add   = row_sums_add;
    t->shard_tree     = shard_tree;
    t->global_avg     = global_avg;
    t->global_avg_bwd = global_avg_bwd;
    t->mask_scale     = mask_scale;
}
