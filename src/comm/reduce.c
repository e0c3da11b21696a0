// reduce.c: comm's kernels (reduce.h): a driver that reduces any number of inputs
// through L1-sized scratch blocks in rank or tree order (so an output may alias an
// input, and any world size uses the same two-operand step), over the kernel table's
// reduction rows (one per target, capped by DT_ISA); the average's division; the
// non-temporal copy.
#include "comm/reduce.h"

#include "kernels/table.h"

#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2_STREAM 1
#else
#define HAVE_SSE2_STREAM 0
#endif

// The loops are rows of the kernel table (src/kernels/vec/reduce.c, docs/kernels.md):
// `reduce` (dst = a op b, dst may be a or b) as the accumulate step acc op= x,
// `reduce_sum2` for two operands summed into one or two outputs, `reduce_div` for the
// average's float division. This file drives them: blocks, orders, outputs.

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
        dt_k()->reduce_div(buf, count, divisor);
}

// ------------------------------------------------------------------ n operands

// 4 KiB: a scratch block and one block of each input stay in L1 (32-48 KiB on the
// machines measured). The tree order needs 1.5 h scratch blocks (h the largest power
// of two below nin: one level's partials and the next's), 16 KiB of them: blocks shrink
// as h grows, down to one cache line (from h = 128; up to h = 256, nin up to 512).
#define BLOCK_BYTES  4096
#define TREE_BYTES   16384
#define TREE_MAX_TOP 256

static void finish_block(void *out1, void *out2, bool nt, size_t off, unsigned char *t,
                         size_t nbytes, dt_dtype dtype, dt_reduce_op op, size_t n, int nin) {
    if (op == DT_REDUCE_AVG && nin > 1) {
        if (dtype == DT_FLOAT32)
            dt_k()->reduce_div((float *)(void *)t, n, nin);
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

// Each step writes a scratch block that is neither of its operands: the rows vectorise
// only when their output overlaps no input (a + b into a falls back to scalar code
// behind the compiler's alias check).

// Tree order: at each level the partials of the level above, pairwise (k and k + h),
// into the other half of the scratch; the last level leaves the whole reduction.
static void reduce_tree(void *out1, void *out2, bool nt, const void *const *in, int nin,
                        size_t count, size_t es, dt_dtype dtype, dt_reduce_op op,
                        dt_k_reduce_fn *rf) {
    int top = 1;
    while (2 * top < nin)
        top *= 2;
    DT_ASSERT(top <= TREE_MAX_TOP);
    _Alignas(64) unsigned char tmp[(TREE_MAX_TOP + TREE_MAX_TOP / 2) * 64];
    // top blocks for a level, top / 2 for the next (then the first again, and so on).
    size_t bb = (TREE_BYTES / (size_t)(top + top / 2)) & ~(size_t)63;
    if (bb < 64)
        bb = 64;
    size_t         block  = bb / es;
    unsigned char *lvl[2] = {tmp, tmp + (size_t)top * bb};
    for (size_t at = 0; at < count; at += block) {
        size_t n = count - at < block ? count - at : block, off = at * es, nbytes = n * es;
        for (int k = 0; k < top; k++) {
            unsigned char *t = lvl[0] + (size_t)k * bb;
            const void    *a = (const unsigned char *)in[k] + off;
            if (k + top < nin)
                rf(dtype, op, t, a, (const unsigned char *)in[k + top] + off, n);
            else
                memcpy(t, a, nbytes);
        }
        int cur = 0;
        for (int h = top / 2; h >= 1; h /= 2, cur ^= 1)
            for (int k = 0; k < h; k++)
                rf(dtype, op, lvl[cur ^ 1] + (size_t)k * bb, lvl[cur] + (size_t)k * bb,
                   lvl[cur] + (size_t)(k + h) * bb, n);
        finish_block(out1, out2, nt, off, lvl[cur], nbytes, dtype, op, n, nin);
    }
}

void dt_reduce_n(void *out1, void *out2, bool nt, const void *const *in, int nin, size_t count,
                 dt_dtype dtype, dt_reduce_op op, dt_reduce_order order) {
    size_t es = dt_dtype_size(dtype);
    DT_ASSERT(es != 0 && nin >= 1);
    if (count == 0)
        return;
    const dt_ktab *k = dt_k();
    // Two operands: both orders are a + b.
    if (nin == 2 && op == DT_REDUCE_SUM && out1) {
        if (!out2 || !nt) {
            k->reduce_sum2(dtype, out1, out2, in[0], in[1], count);
            return;
        }
        // Non-temporal results: reduce a block into out1, stream it on from L1.
        size_t block = BLOCK_BYTES / es;
        for (size_t at = 0; at < count; at += block) {
            size_t n = count - at < block ? count - at : block, off = at * es;
            k->reduce_sum2(dtype, (unsigned char *)out1 + off, NULL,
                           (const unsigned char *)in[0] + off, (const unsigned char *)in[1] + off,
                           n);
            dt_copy_nt((unsigned char *)out2 + off, (unsigned char *)out1 + off, n * es, true);
        }
        return;
    }
    // The accumulate steps: the row adds for AVG (finish_block divides).
    if (order == DT_ORDER_TREE && nin > 2) {
        reduce_tree(out1, out2, nt, in, nin, count, es, dtype, op, k->reduce);
        return;
    }
    // Rank order: two scratch blocks in turn.
    size_t                     block = BLOCK_BYTES / es;
    _Alignas(64) unsigned char tmp[2][BLOCK_BYTES];
    for (size_t at = 0; at < count; at += block) {
        size_t               n = count - at < block ? count - at : block, off = at * es;
        const unsigned char *a   = (const unsigned char *)in[0] + off;
        unsigned char       *res = tmp[0];
        if (nin == 1)
            memcpy(res, a, n * es);
        for (int r = 1; r < nin; r++, a = res) {
            res = tmp[r & 1];
            k->reduce(dtype, op, res, a, (const unsigned char *)in[r] + off, n);
        }
        finish_block(out1, out2, nt, off, res, n * es, dtype, op, n, nin);
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
