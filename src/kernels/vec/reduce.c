// reduce.c: comm's element-wise reductions (vec.h): one plain loop per (dtype, op) that
// the compiler vectorises for each target. What comm/reduce.h's dt_reduce and the shm
// engine's block loops compute, as rows comm can call (docs/kernels.md).
#include "kernels/vec/vec.h"

#include <string.h>

// `restrict` is not used: dst may equal a or b. The loops read a[i] and b[i] before
// writing dst[i], which is what makes that aliasing safe.
#define DEFINE_LOOPS(T, SUF)                                                                       \
    static void sum_##SUF(T *dst, const T *a, const T *b, size_t n) {                              \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] + b[i];                                                                  \
    }                                                                                              \
    static void prod_##SUF(T *dst, const T *a, const T *b, size_t n) {                             \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] * b[i];                                                                  \
    }

// Integers go through unsigned types: wrap-around is defined there.
DEFINE_LOOPS(float, f32)
DEFINE_LOOPS(uint32_t, u32)
DEFINE_LOOPS(uint64_t, u64)

// Float max/min propagate NaN: (a > b || isnan(a)) picks a NaN a, and a NaN b fails
// a > b and is picked otherwise. Written without branches so it vectorises.
static void max_f32(float *dst, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = a[i], y = b[i];
        dst[i] = (x > y || x != x) ? x : y;
    }
}
static void min_f32(float *dst, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = a[i], y = b[i];
        dst[i] = (x < y || x != x) ? x : y;
    }
}

#define DEFINE_MINMAX_INT(T, SUF)                                                                  \
    static void max_##SUF(T *dst, const T *a, const T *b, size_t n) {                              \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] > b[i] ? a[i] : b[i];                                                    \
    }                                                                                              \
    static void min_##SUF(T *dst, const T *a, const T *b, size_t n) {                              \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = a[i] < b[i] ? a[i] : b[i];                                                    \
    }
DEFINE_MINMAX_INT(int32_t, i32)
DEFINE_MINMAX_INT(int64_t, i64)

static void reduce(dt_dtype dtype, dt_reduce_op op, void *dst, const void *a, const void *b,
                   size_t n) {
    bool sum = op == DT_REDUCE_SUM || op == DT_REDUCE_AVG;
    switch (dtype) {
    case DT_FLOAT32:
        if (sum)
            sum_f32(dst, a, b, n);
        else if (op == DT_REDUCE_PROD)
            prod_f32(dst, a, b, n);
        else if (op == DT_REDUCE_MAX)
            max_f32(dst, a, b, n);
        else if (op == DT_REDUCE_MIN)
            min_f32(dst, a, b, n);
        else
            break;
        return;
    case DT_INT32:
        if (sum)
            sum_u32(dst, a, b, n);
        else if (op == DT_REDUCE_PROD)
            prod_u32(dst, a, b, n);
        else if (op == DT_REDUCE_MAX)
            max_i32(dst, a, b, n);
        else if (op == DT_REDUCE_MIN)
            min_i32(dst, a, b, n);
        else
            break;
        return;
    case DT_INT64:
        if (sum)
            sum_u64(dst, a, b, n);
        else if (op == DT_REDUCE_PROD)
            prod_u64(dst, a, b, n);
        else if (op == DT_REDUCE_MAX)
            max_i64(dst, a, b, n);
        else if (op == DT_REDUCE_MIN)
            min_i64(dst, a, b, n);
        else
            break;
        return;
    default:
        break;
    }
    DT_ASSERT(!"reduce: invalid dtype or op");
}

// Two inputs summed into one or two outputs in one pass. Explicit vectors of the target's
// width (vmath.h's VL floats: one register), loaded before they are stored, keep it
// vectorised when an output is an input (in place), where the compiler's own
// vectorisation would fall back to scalar code after its alias check.
#define VB (VL * 4) // bytes a step
#define DEF_SUM2(name, T, V)                                                                       \
    typedef T   V __attribute__((vector_size(VB)));                                                \
    static void name(void *o1v, void *o2v, const void *av, const void *bv, size_t n) {             \
        unsigned char       *o1 = o1v, *o2 = o2v;                                                  \
        const unsigned char *a = av, *b = bv;                                                      \
        size_t               nb = n * sizeof(T), i = 0;                                            \
        for (; i + VB <= nb; i += VB) {                                                            \
            V x, y;                                                                                \
            memcpy(&x, a + i, VB);                                                                 \
            memcpy(&y, b + i, VB);                                                                 \
            x += y;                                                                                \
            memcpy(o1 + i, &x, VB);                                                                \
            if (o2)                                                                                \
                memcpy(o2 + i, &x, VB);                                                            \
        }                                                                                          \
        for (; i < nb; i += sizeof(T)) {                                                           \
            T x, y;                                                                                \
            memcpy(&x, a + i, sizeof(T));                                                          \
            memcpy(&y, b + i, sizeof(T));                                                          \
            x += y;                                                                                \
            memcpy(o1 + i, &x, sizeof(T));                                                         \
            if (o2)                                                                                \
                memcpy(o2 + i, &x, sizeof(T));                                                     \
        }                                                                                          \
    }
DEF_SUM2(sum2_f32, float, vsum_f32)
DEF_SUM2(sum2_u32, uint32_t, vsum_u32)
DEF_SUM2(sum2_u64, uint64_t, vsum_u64)

static void reduce_sum2(dt_dtype dtype, void *o1, void *o2, const void *a, const void *b,
                        size_t n) {
    DT_ASSERT(dtype == DT_FLOAT32 || dtype == DT_INT32 || dtype == DT_INT64);
    if (dtype == DT_FLOAT32)
        sum2_f32(o1, o2, a, b, n);
    else if (dtype == DT_INT32)
        sum2_u32(o1, o2, a, b, n);
    else
        sum2_u64(o1, o2, a, b, n);
}

// AVG's final step. Dividing by a power of two is exact scaling, so x / 2^k and
// x * 2^-k are the same float for every x (subnormals included): the multiply gives
// bitwise the same averages, at a fraction of the cost of a divide.
static void reduce_div(float *buf, size_t n, int d) {
    float f = (float)d;
    if ((d & (d - 1)) == 0) {
        float m = 1.0f / f;
        for (size_t i = 0; i < n; i++)
            buf[i] = buf[i] * m;
        return;
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = buf[i] / f;
}

void DT_KV(fill_reduce)(dt_ktab *t) {
    t->reduce      = reduce;
    t->reduce_sum2 = reduce_sum2;
    t->reduce_div  = reduce_div;
}
