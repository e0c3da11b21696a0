// conv16.c: the entry points of the bf16 shifted GEMMs of a stride-1 convolution
// (conv16.h): rows of the kernel table that only the avx512bf16 target fills
// (kernels/avx512bf16/conv16.c), and the weights' pairing, which is plain C.
#include "nn/conv16.h"
#include "kernels/table.h"
#include "nn/prec.h"

bool dt_c16_usable(void) {
    return dt_k()->c16_shifted && dt_prec_path_get() == DT_PATH_AVX512BF16;
}

// The rows (never NULL where dt_c16_usable, the callers' condition).
void dt_c16_pack_pairs(const float *x, int c, int h, int w, int pad, uint32_t *x2) {
    dt_k()->c16_pack_pairs(x, c, h, w, pad, x2);
}
void dt_c16_pack_plain(const float *x, int c, int h, int w, int pad, uint16_t *xb) {
    dt_k()->c16_pack_plain(x, c, h, w, pad, xb);
}
void dt_c16_rows_to_pairs(const float *g, size_t g_ld, int rows, int n, int margin, size_t ld2,
                          uint32_t *g2) {
    dt_k()->c16_rows_to_pairs(g, g_ld, rows, n, margin, ld2, g2);
}
void dt_c16_rows_to_pair_cols(const float *g, size_t g_ld, int rows, int n, uint32_t *gt, int ldt) {
    dt_k()->c16_rows_to_pair_cols(g, g_ld, rows, n, gt, ldt);
}
void dt_c16_rows_to_both(const float *g, size_t g_ld, int rows, int n, uint32_t *gt, int ldt,
                         int margin, size_t ld2, uint32_t *g2) {
    dt_k()->c16_rows_to_both(g, g_ld, rows, n, gt, ldt, margin, ld2, g2);
}
void dt_c16_shifted(const uint32_t *src, const int *off, int R, const uint32_t *w2, int rows, int n,
                    float *out, size_t out_ld) {
    dt_k()->c16_shifted(src, off, R, w2, rows, n, out, out_ld);
}
void dt_c16_shifted_tn(const uint16_t *src, const int *off, int R, int n, const uint32_t *gt,
                       int ldt, float *dwt) {
    dt_k()->c16_shifted_tn(src, off, R, n, gt, ldt, dwt);
}

static inline uint32_t pair(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

void dt_c16_weight_pairs(const uint16_t *w16, int o, int c, int kk, uint32_t *w2) {
    int r2 = (c + 1) / 2 * kk;
    for (int oc = 0; oc < o; oc++)
        for (int cp = 0; cp < (c + 1) / 2; cp++)
            for (int t = 0; t < kk; t++) {
                const uint16_t *wa = w16 + ((size_t)oc * c + 2 * cp) * kk + t;
                w2[(size_t)oc * r2 + (size_t)cp * kk + t] = pair(*wa, 2 * cp + 1 < c ? wa[kk] : 0);
            }
}

void dt_c16_weight_pairs_t(const uint16_t *w16, int o, int c, int kk, uint32_t *wt2) {
    int rb = (o + 1) / 2 * kk;
    for (int ic = 0; ic < c; ic++)
        for (int op = 0; op < (o + 1) / 2; op++)
            for (int t = 0; t < kk; t++) {
                const uint16_t *wa = w16 + ((size_t)(2 * op) * c + ic) * kk + t;
                uint16_t        hi = 2 * op + 1 < o ? wa[(size_t)c * kk] : 0;
                wt2[(size_t)ic * rb + (size_t)op * kk + t] = pair(*wa, hi);
            }
}
