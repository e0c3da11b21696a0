// reduce.c: comm's kernels (reduce.h). One accumulate loop per (dtype, op), `acc op= x`
// over restrict pointers, which the compiler vectorises; a driver that reduces any
// number of inputs through L1-sized scratch blocks in rank or tree order (so an output
// may alias an input, and any world size uses the same two-operand loop); an explicit
// 64-byte-vector loop for the hot case of two float32 / integer sums; the average's
// division; the non-temporal copy. DT_CLONES builds AVX-512, AVX2 and baseline versions.
#include "comm/reduce.h"

#include "core/simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2_STREAM 1
#else
#define HAVE_SSE2_STREAM 0
#endif

// ------------------------------------------------------------------ accumulate loops

// acc[i] = acc[i] op x[i]. Integer sums and products use unsigned arithmetic so that
// overflow wraps (two's complement, as comm.h promises) instead of being undefined.
// Float max/min let a NaN in either operand through, like torch.maximum: a NaN acc
// stays, a NaN x is taken (x != x), else the larger.
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

// The wrappers convert the typed loops to one signature without casting function
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

// Rows: dtype (float32, int32, int64); columns: op (sum, avg, max, min, prod). AVG adds.
static acc_fn pick_acc(dt_dtype dtype, dt_reduce_op op) {
    static const acc_fn table[3][5] = {
        {w_acc_f32_sum, w_acc_f32_sum, w_acc_f32_max, w_acc_f32_min, w_acc_f32_prod},
        {w_acc_u32_sum, w_acc_u32_sum, w_acc_i32_max, w_acc_i32_min, w_acc_u32_prod},
        {w_acc_u64_sum, w_acc_u64_sum, w_acc_i64_max, w_acc_i64_min, w_acc_u64_prod},
    };
    DT_ASSERT((unsigned)dtype < 3 && (unsigned)op < 5);
    return table[dtype][op];
}

// ------------------------------------------------------------------ two-operand sums

// Two inputs, SUM (the hot case: gradients of two ranks, and every step of a ring): one
// pass that reads both inputs and writes both outputs. Explicit 64-byte vectors, loaded
// before they are stored, keep it vectorised when an output is an input (in place),
// where the compiler's own vectorisation would fall back to scalar code after its alias
// check.
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

// ---------------------------------------------------------------------- the copy

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

void dt_copy_nt(void *dst, const void *src, size_t nbytes, bool nt) {
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

void dt_store_fence(void) {
#if HAVE_SSE2_STREAM
    _mm_sfence();
#endif
}

// ------------------------------------------------------------------ the average

// A power of two divides exactly as its reciprocal multiplies: x / 2^k and x * 2^-k are
// the same float for every x (subnormals included), and the multiply costs a fraction
// of a divide (a DDP step averaging 300k gradients on 2 ranks spent 2% of its time
// dividing).
static DT_CLONES void div_f32(float *buf, size_t n, int d) {
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
static void div_i32(int32_t *acc, size_t n, int d) {
    for (size_t i = 0; i < n; i++)
        acc[i] = acc[i] / d;
}
static void div_i64(int64_t *acc, size_t n, int d) {
    for (size_t i = 0; i < n; i++)
        acc[i] = acc[i] / d;
}

void dt_reduce_div(dt_dtype dtype, void *buf, size_t count, int divisor) {
    if (dtype == DT_FLOAT32 && divisor != 1)
        div_f32(buf, count, divisor);
}

// ------------------------------------------------------------------ n operands

// 4 KiB: a scratch block and one block of each input stay in L1 (32-48 KiB on the
// machines measured). The tree order needs h scratch blocks (h < nin), taken from a
// 16 KiB array: blocks shrink as h grows, down to one cache line.
#define BLOCK_BYTES 4096
#define TREE_BYTES  16384

static void finish_block(void *out1, void *out2, bool nt, size_t off, unsigned char *t,
                         size_t nbytes, dt_dtype dtype, dt_reduce_op op, size_t n, int nin) {
    if (op == DT_REDUCE_AVG && nin > 1) {
        if (dtype == DT_FLOAT32)
            div_f32((float *)(void *)t, n, nin);
        else if (dtype == DT_INT32)
            div_i32((int32_t *)(void *)t, n, nin);
        else
            div_i64((int64_t *)(void *)t, n, nin);
    }
    if (out1)
        memcpy((unsigned char *)out1 + off, t, nbytes);
    if (out2)
        dt_copy_nt((unsigned char *)out2 + off, t, nbytes, nt);
}

// Tree order: scratch block k holds the partial of ranks k, k + h', k + 2h', ... as the
// halving proceeds; block 0 ends with the whole reduction.
static void reduce_tree(void *out1, void *out2, bool nt, const void *const *in, int nin,
                        size_t count, size_t es, dt_dtype dtype, dt_reduce_op op, acc_fn acc) {
    int top = 1;
    while (2 * top < nin)
        top *= 2;
    _Alignas(64) unsigned char tmp[TREE_BYTES];
    size_t                     bb    = (TREE_BYTES / (size_t)top) & ~(size_t)63;
    size_t                     block = bb / es;
    DT_ASSERT(block > 0);
    for (size_t at = 0; at < count; at += block) {
        size_t n = count - at < block ? count - at : block, off = at * es, nbytes = n * es;
        for (int k = 0; k < top; k++) {
            unsigned char *t = tmp + (size_t)k * bb;
            memcpy(t, (const unsigned char *)in[k] + off, nbytes);
            if (k + top < nin)
                acc(t, (const unsigned char *)in[k + top] + off, n);
        }
        for (int h = top / 2; h >= 1; h /= 2)
            for (int k = 0; k < h; k++)
                acc(tmp + (size_t)k * bb, tmp + (size_t)(k + h) * bb, n);
        finish_block(out1, out2, nt, off, tmp, nbytes, dtype, op, n, nin);
    }
}

void dt_reduce_n(void *out1, void *out2, bool nt, const void *const *in, int nin, size_t count,
                 dt_dtype dtype, dt_reduce_op op, dt_reduce_order order) {
    size_t es = dt_dtype_size(dtype);
    DT_ASSERT(es != 0 && nin >= 1);
    if (count == 0)
        return;
    // Two operands: both orders are a + b.
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
            dt_copy_nt((unsigned char *)out2 + off, (unsigned char *)out1 + off, n * es, true);
        }
        return;
    }
    acc_fn acc = pick_acc(dtype, op);
    if (order == DT_ORDER_TREE && nin > 2) {
        reduce_tree(out1, out2, nt, in, nin, count, es, dtype, op, acc);
        return;
    }
    size_t                     block = BLOCK_BYTES / es;
    _Alignas(64) unsigned char tmp[BLOCK_BYTES];
    for (size_t at = 0; at < count; at += block) {
        size_t n = count - at < block ? count - at : block, off = at * es;
        memcpy(tmp, (const unsigned char *)in[0] + off, n * es);
        for (int r = 1; r < nin; r++)
            acc(tmp, (const unsigned char *)in[r] + off, n);
        finish_block(out1, out2, nt, off, tmp, n * es, dtype, op, n, nin);
    }
}

void dt_reduce(dt_dtype dtype, dt_reduce_op op, void *dst, const void *a, const void *b,
               size_t count) {
    DT_ASSERT((unsigned)dtype < 3 && (unsigned)op < DT_REDUCE_COUNT_);
    const void *in[2] = {a, b};
    // AVG adds here: the caller divides once at the end.
    dt_reduce_n(dst, NULL, false, in, 2, count, dtype, op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op,
                DT_ORDER_ANY);
}
