// half.c: fp32 <-> bf16 conversions (nn/prec.h says what they compute; vec.h). They are
// integer operations (round to nearest even by adding 0x7fff plus the lowest kept bit)
// that the compiler vectorises for each target. The hardware's VCVTNEPS2BF16 is not
// used: it treats denormal inputs as zero, which would make the bits depend on the CPU.
#include "kernels/half.h"
#include "kernels/vec/vec.h"

#include <string.h>

// VL lanes of bit patterns: fp32 and bf16 (vec.h's vf, as integers).
typedef uint32_t vfu __attribute__((vector_size(VL * 4)));
typedef uint16_t vfh __attribute__((vector_size(VL * 2)));
DT_DEFINE_ROUND_BF16(round_bf16, vfu)

static void f32_to_bf16(const float *restrict src, uint16_t *restrict dst, size_t n) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vfu u;
        __builtin_memcpy(&u, src + i, sizeof u);
        vfh h = __builtin_convertvector(round_bf16(u) >> 16, vfh);
        __builtin_memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++)
        dst[i] = dt_f32_to_bf16_1(src[i]);
}

static void bf16_to_f32(const uint16_t *restrict src, float *restrict dst, size_t n) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vfh h;
        __builtin_memcpy(&h, src + i, sizeof h);
        vfu u = __builtin_convertvector(h, vfu) << 16;
        __builtin_memcpy(dst + i, &u, sizeof u);
    }
    for (; i < n; i++)
        dst[i] = dt_bf16_to_f32_1(src[i]);
}

static void f32_round_bf16(const float *restrict src, float *restrict dst, size_t n) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vfu u;
        __builtin_memcpy(&u, src + i, sizeof u);
        u = round_bf16(u);
        __builtin_memcpy(dst + i, &u, sizeof u);
    }
    for (; i < n; i++)
        dst[i] = dt_bf16_to_f32_1(dt_f32_to_bf16_1(src[i]));
}

// Rows [0, rows) of dy (row length out) rounded into dy16 and, when acc is not NULL,
// added into the column sums acc (double, rows in order: the bias gradient's sums).
static void bf16_round_sum(const float *dy, int rows, int out, uint16_t *dy16, double *acc) {
    if (!acc) {
        f32_to_bf16(dy, dy16, (size_t)rows * (size_t)out);
        return;
    }
    for (int s = 0; s < rows; s++) {
        const float *row = dy + (size_t)s * out;
        f32_to_bf16(row, dy16 + (size_t)s * out, (size_t)out);
        dt_add_row_f64(row, out, acc);
    }
}

void DT_KV(fill_half)(dt_ktab *t) {
    t->f32_to_bf16    = f32_to_bf16;
    t->bf16_to_f32    = bf16_to_f32;
    t->f32_round_bf16 = f32_round_bf16;
    t->bf16_round_sum = bf16_round_sum;
}
