// shm_kernels.c: the reduction and copy loops of the shm engine. Reductions run in
// L1-sized blocks through a scratch block so that any number of inputs is combined in
// rank order with one vectorised two-operand loop, and so that an output may alias an
// input (in-place collectives) without restrict lying to the compiler.
#include "comm/shm/shm.h"
#include "core/simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2_STREAM 1
#else
#define HAVE_SSE2_STREAM 0
#endif

// acc[i] = acc[i] op x[i]. Integer sums and products use unsigned arithmetic so that
// overflow wraps (two's complement, as comm.h promises) instead of being undefined.
// Float max/min let a NaN in either operand through, like torch.maximum.
#define DEF_ACC(name, T, EXPR)                                                                     \
    static DT_CLONES void name(T *restrict acc, const T *restrict x, size_t n) {                   \
        for (size_t i = 0; i < n; i++) {                                                           \
            T a = acc[i], b = x[i];                                                                \
            acc[i] = (EXPR);                                                                       \
        }                                                                                          \
    }

DEF_ACC(acc_f32_sum, float, a + b)
DEF_ACC(acc_f32_max, float, a != a ? a : (b > a || b != b) ? b : a)
DEF_ACC(acc_f32_min, float, a != a ? a : (b < a || b != b) ? b : a)
DEF_ACC(acc_f32_prod, float, a *b)
DEF_ACC(acc_u32_sum, uint32_t, a + b)
DEF_ACC(acc_u32_prod, uint32_t, a *b)
DEF_ACC(acc_i32_max, int32_t, b > a ? b : a)
DEF_ACC(acc_i32_min, int32_t, b < a ? b : a)
DEF_ACC(acc_u64_sum, uint64_t, a + b)
DEF_ACC(acc_u64_prod, uint64_t, a *b)
DEF_ACC(acc_i64_max, int64_t, b > a ? b : a)
DEF_ACC(acc_i64_min, int64_t, b < a ? b : a)

typedef void (*acc_fn)(void *restrict acc, const void *restrict x, size_t n);

// A power of two divides exactly as its reciprocal multiplies (see dt_reduce_div).
static DT_CLONES void div_f32(float *acc, size_t n, int d) {
    float f = (float)d;
    if ((d & (d - 1)) == 0) {
        float m = 1.0f / f;
        for (size_t i = 0; i < n; i++)
            acc[i] = acc[i] * m;
        return;
    }
    for (size_t i = 0; i < n; i++)
        acc[i] = acc[i] / f;
}
static void div_i32(int32_t *acc, size_t n, int d) {
    for (size_t i = 0; i < n; i++)
        acc[i] = acc[i] / d;
}
static void div_i64(int64_t *acc, size_t n, int d) {
    for (size_t i = 0; i < n; i++)
        acc[i] = acc[i] / d;
}

// The wrappers convert the typed kernels to one signature without casting function
// pointers (calling through a mismatched pointer type is undefined).
#define WRAP(name, T)                                                                              \
    static void w_##name(void *restrict acc, const void *restrict x, size_t n) {                   \
        name((T *)acc, (const T *)x, n);                                                           \
    }
WRAP(acc_f32_sum, float)
WRAP(acc_f32_max, float)
WRAP(acc_f32_min, float)
WRAP(acc_f32_prod, float)
WRAP(acc_u32_sum, uint32_t)
WRAP(acc_u32_prod, uint32_t)
WRAP(acc_i32_max, int32_t)
WRAP(acc_i32_min, int32_t)
WRAP(acc_u64_sum, uint64_t)
WRAP(acc_u64_prod, uint64_t)
WRAP(acc_i64_max, int64_t)
WRAP(acc_i64_min, int64_t)

static acc_fn pick_acc(dt_dtype dtype, dt_reduce_op op) {
    static const acc_fn table[3][5] = {
        {w_acc_f32_sum, w_acc_f32_sum, w_acc_f32_max, w_acc_f32_min, w_acc_f32_prod},
        {w_acc_u32_sum, w_acc_u32_sum, w_acc_i32_max, w_acc_i32_min, w_acc_u32_prod},
        {w_acc_u64_sum, w_acc_u64_sum, w_acc_i64_max, w_acc_i64_min, w_acc_u64_prod},
    };
    DT_ASSERT((unsigned)dtype < 3 && (unsigned)op < 5);
    return table[dtype][op];
}

#if HAVE_SSE2_STREAM
// Non-temporal copy: whole cache lines go to memory without first being read into
// the cache (a plain store reads the line it writes: a third more traffic).
static void copy_stream(unsigned char *dst, const unsigned char *src, size_t n) {
    size_t head = (size_t)(-(uintptr_t)dst & 15);
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_stream_si128((__m128i *)(void *)(dst + i), a);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 48), d);
    }
    memcpy(dst + body, src + body, n - body);
}
#endif

void dt_shm_copy(void *dst, const void *src, size_t nbytes, bool nt) {
    if (nbytes == 0 || dst == src)
        return;
#if HAVE_SSE2_STREAM
    if (nt && nbytes >= 4096) {
        copy_stream(dst, src, nbytes);
        return;
    }
#endif
    (void)nt;
    memcpy(dst, src, nbytes);
}

void dt_shm_store_fence(void) {
#if HAVE_SSE2_STREAM
    _mm_sfence();
#endif
}

// 4 KiB: the scratch block and one block of each input stay in L1 (48 KiB here).
#define BLOCK_BYTES 4096

// Two inputs, SUM (the hot case: gradients of two ranks): one pass that reads both
// inputs and writes both outputs. Explicit 64-byte vectors, loaded before they are
// stored, keep it vectorised when an output is an input (in place), where the
// compiler's own vectorisation would fall back to scalar code after its alias check.
#define DEF_SUM2(name, T, V)                                                                       \
    typedef T             V __attribute__((vector_size(64)));                                      \
    static DT_CLONES void name(void *o1v, void *o2v, const void *av, const void *bv, size_t n) {   \
        unsigned char       *o1 = o1v, *o2 = o2v;                                                  \
        const unsigned char *a = av, *b = bv;                                                      \
        size_t               nb = n * sizeof(T), i = 0;                                            \
        for (; i + 64 <= nb; i += 64) {                                                            \
            V x, y;                                                                                \
            memcpy(&x, a + i, 64);                                                                 \
            memcpy(&y, b + i, 64);                                                                 \
            x += y;                                                                                \
            memcpy(o1 + i, &x, 64);                                                                \
            if (o2)                                                                                \
                memcpy(o2 + i, &x, 64);                                                            \
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
DEF_SUM2(sum2_f32, float, v16f)
DEF_SUM2(sum2_u32, uint32_t, v16u)
DEF_SUM2(sum2_u64, uint64_t, v8u)

void dt_shm_reduce_kernel(void *out1, void *out2, bool nt, const void *const *in, int nin,
                          size_t count, dt_dtype dtype, dt_reduce_op op) {
    size_t es = dt_dtype_size(dtype);
    DT_ASSERT(es != 0 && nin >= 1);
    if (nin == 2 && op == DT_REDUCE_SUM && out1) {
        void (*sum2)(void *, void *, const void *, const void *, size_t) =
            dtype == DT_FLOAT32 ? sum2_f32
            : dtype == DT_INT32 ? sum2_u32
                                : sum2_u64;
        if (!out2 || !nt) {
            sum2(out1, out2, in[0], in[1], count);
            return;
        }
        // Non-temporal results: reduce a block into out1, stream it on from L1.
        size_t block = BLOCK_BYTES / es;
        for (size_t at = 0; at < count; at += block) {
            size_t n = count - at < block ? count - at : block, off = at * es;
            sum2((unsigned char *)out1 + off, NULL, (const unsigned char *)in[0] + off,
                 (const unsigned char *)in[1] + off, n);
            dt_shm_copy((unsigned char *)out2 + off, (unsigned char *)out1 + off, n * es, true);
        }
        return;
    }
    acc_fn                     acc   = pick_acc(dtype, op);
    size_t                     block = BLOCK_BYTES / es;
    _Alignas(64) unsigned char tmp[BLOCK_BYTES];
    for (size_t at = 0; at < count; at += block) {
        size_t n   = count - at < block ? count - at : block;
        size_t off = at * es;
        memcpy(tmp, (const unsigned char *)in[0] + off, n * es);
        for (int r = 1; r < nin; r++)
            acc(tmp, (const unsigned char *)in[r] + off, n);
        if (op == DT_REDUCE_AVG && nin > 1) {
            if (dtype == DT_FLOAT32)
                div_f32((float *)(void *)tmp, n, nin);
            else if (dtype == DT_INT32)
                div_i32((int32_t *)(void *)tmp, n, nin);
            else
                div_i64((int64_t *)(void *)tmp, n, nin);
        }
        if (out1)
            memcpy((unsigned char *)out1 + off, tmp, n * es);
        if (out2)
            dt_shm_copy((unsigned char *)out2 + off, tmp, n * es, nt);
    }
}
