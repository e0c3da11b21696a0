// conv16.h: bf16 "shifted GEMMs" (conv16.c), the VDPBF16PS counterparts of shifted.c's
// fp32 kernels: a stride-1 convolution, its input gradient and its weight gradient over
// bf16 operands with fp32 sums, reading the (wide-layout) input in place, without a
// column matrix. What conv2d.c runs for a bf16 convolution on the avx512bf16 path.
//
// VDPBF16PS multiplies PAIRS of bf16 along the reduction and adds both products to one
// fp32 lane. A convolution's reduction runs over (channel, ki, kj); the kernels pair
// channels: an operand of "pair words" holds, at each position p, the 32-bit word
// (x[2c][p], x[2c+1][p]) (channel 2c in the low half; a missing odd channel is zero), so
// the shifted slice of every (channel pair, ki, kj) is still one contiguous load. The
// weight gradient sums over positions instead, so it pairs neighbouring positions: the
// input in plain bf16 rows (two neighbours are one 32-bit word, broadcast), the output
// gradient as position-pair words with the output channels across the lanes.
//
// Numerics: operands are rounded to bf16 (nearest even, prec.h's conversions), products
// are exact in fp32 and summed in fp32 in an order fixed by the shapes (reproducible run
// to run, independent of threads). VDPBF16PS treats bf16 denormals as zero and adds a
// pair's two products before the lane: within the bound tests/unit/test_conv16.c and
// test_autocast.c check. Only for the avx512bf16 path: dt_c16_usable() says whether the
// kernels may run now (DT_PRECISION_PATH=fp32 turns them off, as it does the bf16 GEMM).
#ifndef DTRAIN_NN_CONV16_H
#define DTRAIN_NN_CONV16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The smallest reduction (channels x kernel area) worth bf16 here: below it a layer's
// products are mostly packing (the seed ConvNet's first convolution, K = 9, runs at a
// third of the bf16 peak through the GEMM, slower than fp32), so conv2d.c keeps them fp32.
#define DT_C16_MIN_K 16

// This CPU and build can run the kernels and the current GEMM path is avx512bf16.
bool dt_c16_usable(void);

// ---------------------------------------------------------------------- packing
// x (c, h, w) fp32 -> pair words of the zero-padded input: x2[cp][(i + pad) * wp + j + pad]
// = (x[2cp][i][j], x[2cp+1][i][j]) rounded to bf16, zero in the padding; cp < (c + 1) / 2,
// planes of hp * wp words (hp = h + 2 pad, wp = w + 2 pad).
void dt_c16_pack_pairs(const float *x, int c, int h, int w, int pad, uint32_t *x2);
// x (c, h, w) fp32 -> bf16 planes of the zero-padded input, c * hp * wp values.
void dt_c16_pack_plain(const float *x, int c, int h, int w, int pad, uint16_t *xb);
// Rows (rows, n) of g (stride g_ld) -> pair words of consecutive rows, rows of ld2
// words: g2[rp][margin + j] = (g[2rp][j], g[2rp+1][j]), zero in [0, margin) and
// [margin + n, ld2).
void dt_c16_rows_to_pairs(const float *g, size_t g_ld, int rows, int n, int margin, size_t ld2,
                          uint32_t *g2);
// Rows (rows, n) of g (stride g_ld) -> words of position pairs with the rows across:
// gt[m][o] = (g[o][2m], g[o][2m+1]) rounded to bf16 for m < (n + 1) / 2 and o < ldt, zero
// for o >= rows and at position n when n is odd; ldt a multiple of 16, >= rows.
void dt_c16_rows_to_pair_cols(const float *g, size_t g_ld, int rows, int n, uint32_t *gt, int ldt);
// Both of the above from one pass over g (the input gradient's and the weight
// gradient's operands in one).
void dt_c16_rows_to_both(const float *g, size_t g_ld, int rows, int n, uint32_t *gt, int ldt,
                         int margin, size_t ld2, uint32_t *g2);
// Weights w16 (o, c, kk) in bf16 -> w2[oc][cp * kk + t] = (w[oc][2cp][t], w[oc][2cp+1][t]).
void dt_c16_weight_pairs(const uint16_t *w16, int o, int c, int kk, uint32_t *w2);
// Transposed, for the input gradient: wt2[ic][op * kk + t] = (w[2op][ic][t], w[2op+1][ic][t]).
void dt_c16_weight_pairs_t(const uint16_t *w16, int o, int c, int kk, uint32_t *wt2);

// ---------------------------------------------------------------------- kernels
// out[o][j] = sum_{r < R} w2[o][r] . src[off[r] + j]   (o < rows, j < n), where a . b of
// two pair words is lo(a) lo(b) + hi(a) hi(b); overwrites out (rows out_ld apart).
// Reads src[off[r] + j] for j < n only.
void dt_c16_shifted(const uint32_t *src, const int *off, int R, const uint32_t *w2, int rows, int n,
                    float *out, size_t out_ld);
// dwt[r][o] += sum_{j < n} src[off[r] + j] g[o][j]   (r < R, o < ldt), src bf16, g given
// as dt_c16_rows_to_pair_cols's gt (ldt a multiple of 16), dwt (R, ldt) row-major: the
// transposed weight gradient. Reads src[off[r] + j] for j < n only.
void dt_c16_shifted_tn(const uint16_t *src, const int *off, int R, int n, const uint32_t *gt,
                       int ldt, float *dwt);

#endif // DTRAIN_NN_CONV16_H
