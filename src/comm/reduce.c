// reduce.c: element-wise reduction kernels, one plain loop per (dtype, op) that the
// compiler vectorises; DT_CLONES builds AVX-512, AVX2 and baseline versions.
#include "comm/reduce.h"

#include "core/simd.h"

// `restrict` is not used: dst may equal a or b. The loops read a[i] and b[i] before
// writing dst[i], which is what makes that aliasing safe.

#define DEFINE_LOOPS(T, SUF)                                                                       \
    DT_CLONES static void sum_##SUF(T *dst, const T *a, const T *b, size_t n) {                    \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] + b[i];                                                                  \
    }                                                                                              \
    DT_CLONES static void prod_##SUF(T *dst, const T *a, const T *b, size_t n) {                   \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] * b[i];                                                                  \
    }

// Integers go through unsigned types: wrap-around is defined there.
DEFINE_LOOPS(float, f32)
DEFINE_LOOPS(uint32_t, u32)
DEFINE_LOOPS(uint64_t, u64)

// Float max/min propagate NaN: (a > b || isnan(a)) picks a NaN a, and a NaN b fails
// a > b and is picked otherwise. Written without branches so it vectorises.
DT_CLONES static void max_f32(float *dst, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = a[i], y = b[i];
        dst[i] = (x > y || x != x) ? x : y;
    }
}
DT_CLONES static void min_f32(float *dst, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = a[i], y = b[i];
        dst[i] = (x < y || x != x) ? x : y;
    }
}

#define DEFINE_MINMAX_INT(T, SUF)                                                                  \
    DT_CLONES static void max_##SUF(T *dst, const T *a, const T *b, size_t n) {                    \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] > b[i] ? a[i] : b[i];                                                    \
    }                                                                                              \
    DT_CLONES static void min_##SUF(T *dst, const T *a, const T *b, size_t n) {                    \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] < b[i] ? a[i] : b[i];                                                    \
    }
DEFINE_MINMAX_INT(int32_t, i32)
DEFINE_MINMAX_INT(int64_t, i64)

void dt_reduce(dt_dtype dtype, dt_reduce_op op, void *dst, const void *a, const void *b,
               size_t count) {
    if (count == 0)
        return;
    switch (dtype) {
    case DT_FLOAT32:
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG:
            sum_f32(dst, a, b, count);
            return;
        case DT_REDUCE_PROD:
            prod_f32(dst, a, b, count);
            return;
        case DT_REDUCE_MAX:
            max_f32(dst, a, b, count);
            return;
        case DT_REDUCE_MIN:
            min_f32(dst, a, b, count);
            return;
        default:
            break;
        }
        break;
    case DT_INT32:
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG:
            sum_u32(dst, a, b, count);
            return;
        case DT_REDUCE_PROD:
            prod_u32(dst, a, b, count);
            return;
        case DT_REDUCE_MAX:
            max_i32(dst, a, b, count);
            return;
        case DT_REDUCE_MIN:
            min_i32(dst, a, b, count);
            return;
        default:
            break;
        }
        break;
    case DT_INT64:
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG:
            sum_u64(dst, a, b, count);
            return;
        case DT_REDUCE_PROD:
            prod_u64(dst, a, b, count);
            return;
        case DT_REDUCE_MAX:
            max_i64(dst, a, b, count);
            return;
        case DT_REDUCE_MIN:
            min_i64(dst, a, b, count);
            return;
        default:
            break;
        }
        break;
    default:
        break;
    }
    DT_ASSERT(!"dt_reduce: invalid dtype or op");
}

DT_CLONES static void div_f32(float *buf, size_t n, float d) {
    for (size_t i = 0; i < n; i++)
        buf[i] /= d;
}

DT_CLONES static void mul_f32(float *buf, size_t n, float m) {
    for (size_t i = 0; i < n; i++)
        buf[i] *= m;
}

// AVG's final step. Dividing by a power of two is exact scaling, so x / 2^k and
// x * 2^-k are the same float for every x (subnormals included): the multiply gives
// bitwise the same averages, at a fraction of the cost of a divide (a DDP step
// averaging 300k gradients on 2 ranks spent 2% of its time dividing).
void dt_reduce_div(dt_dtype dtype, void *buf, size_t count, int divisor) {
    if (dtype != DT_FLOAT32 || divisor == 1)
        return;
    if ((divisor & (divisor - 1)) == 0)
        mul_f32(buf, count, 1.0f / (float)divisor);
    else
        div_f32(buf, count, (float)divisor);
}
