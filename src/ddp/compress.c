// compress.c: bf16 / fp16 gradient compression for DDP buckets (ddp.h), PyTorch's
// bf16_compress_hook and fp16_compress_hook done with the collectives comm.h has.
//
// The comm layer has no 16-bit dtype (its sums are fp32), so a 16-bit all-reduce is
// built from the two halves of a ring all-reduce, moving 16-bit data as opaque 32-bit
// words (two values per word):
//   start:  q = g / world in fp32, rounded to 16 bits into `world` blocks of c values
//           (c = ceil(n / world) rounded up to even, the tail zero-padded); an
//           all-to-all sends block j to rank j (queued, asynchronous);
//   finish: rank r sums the `world` copies of its block in fp32, in rank order (comm's
//           reduce kernel, dt_reduce_n), rounds the sum to 16 bits, and an all-gather
//           gives every rank every block; the 16-bit values are widened back into
//           the gradient.
// Each rank sends and receives 2 (world - 1) c 16-bit values: half of the fp32 ring
// all-reduce's bytes. The sum's order depends only on ranks, so every rank gets the
// same bits, reproducibly. PyTorch divides after the cast (in 16 bits); dividing first
// in fp32 rounds once instead of twice and keeps fp16 from overflowing before the
// division.
#include "ddp/compress.h"

#include "comm/reduce.h"
#include "nn/prec.h"

#include <string.h>

typedef struct bucket_buf {
    size_t    n, c;        // floats in the bucket, 16-bit values per block
    uint16_t *send, *recv; // world * c each
    uint16_t *mine;        // c: this rank's reduced block
    uint16_t *all;         // world * c: every block, gathered
} bucket_buf;

typedef struct compress_state {
    dt_ddp_compress kind;
    int             world;
    int             nb; // buckets seen so far (buffers grow as buckets appear)
    bucket_buf     *b;
    float          *tmp; // scratch floats, max c * world
    size_t          tmp_n;
    const void    **in; // world pointers: the decoded blocks, for comm's reduce kernel
} compress_state;

static const char *const names[] = {"none", "bf16", "fp16"};

const char *dt_ddp_compress_name(dt_ddp_compress c) {
    return (unsigned)c <= DT_DDP_COMPRESS_FP16 ? names[c] : "?";
}

dt_status dt_ddp_compress_parse(const char *name, dt_ddp_compress *out) {
    for (int i = 0; name && i <= DT_DDP_COMPRESS_FP16; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (dt_ddp_compress)i;
            return DT_OK;
        }
    return dt_fail(DT_ERR_ARG, "ddp compression: expected none, bf16 or fp16; found \"%.40s\"",
                   name ? name : "(null)");
}

static void encode(const compress_state *s, const float *x, uint16_t *h, size_t n) {
    if (s->kind == DT_DDP_COMPRESS_BF16)
        dt_f32_to_bf16(x, h, n);
    else
        dt_f32_to_f16(x, h, n);
}

static void decode(const compress_state *s, const uint16_t *h, float *x, size_t n) {
    if (s->kind == DT_DDP_COMPRESS_BF16)
        dt_bf16_to_f32(h, x, n);
    else
        dt_f16_to_f32(h, x, n);
}

static void buf_free(bucket_buf *b) {
    dt_free(b->send);
    memset(b, 0, sizeof *b);
}

// The buffers of bucket i for n floats (allocated once; a bucket keeps its size).
static dt_status get_buf(compress_state *s, int i, size_t n, bucket_buf **out) {
    if (i >= s->nb) {
        bucket_buf *nbuf = dt_alloc_zero(sizeof(bucket_buf) * (size_t)(i + 1));
        if (!nbuf)
            return DT_ERR_NOMEM;
        if (s->b)
            memcpy(nbuf, s->b, sizeof(bucket_buf) * (size_t)s->nb);
        dt_free(s->b);
        s->b  = nbuf;
        s->nb = i + 1;
    }
    bucket_buf *b = &s->b[i];
    if (b->send && b->n != n)
        buf_free(b);
    if (!b->send) {
        size_t w = (size_t)s->world, c = (n + w - 1) / w;
        c += c & 1;
        uint16_t *mem = dt_alloc_zero(sizeof(uint16_t) * (3 * w * c + c));
        if (!mem)
            return dt_fail(DT_ERR_NOMEM,
                           "ddp compression: expected %zu bytes for a bucket of "
                           "%zu floats, found no memory",
                           sizeof(uint16_t) * (3 * w * c + c), n);
        *b = (bucket_buf){.n    = n,
                          .c    = c,
                          .send = mem,
                          .recv = mem + w * c,
                          .all  = mem + 2 * w * c,
                          .mine = mem + 3 * w * c};
        if (w * c > s->tmp_n) {
            dt_free(s->tmp);
            s->tmp_n = 0;
            if (!(s->tmp = dt_alloc(sizeof(float) * w * c)))
                return DT_ERR_NOMEM;
            s->tmp_n = w * c;
        }
    }
    *out = b;
    return DT_OK;
}

static dt_status hook_start(void *state, dt_pg *pg, int bucket, float *grad, size_t count,
                            dt_work **work) {
    compress_state *s  = state;
    bucket_buf     *b  = NULL;
    dt_status       st = get_buf(s, bucket, count, &b);
    if (st != DT_OK)
        return st;
    float inv = 1.0f / (float)s->world;
    for (size_t i = 0; i < count; i++)
        s->tmp[i] = grad[i] * inv;
    memset(s->tmp + count, 0, sizeof(float) * ((size_t)s->world * b->c - count));
    encode(s, s->tmp, b->send, (size_t)s->world * b->c);
    return dt_pg_all_to_all_async(pg, b->send, b->recv, b->c / 2, DT_INT32, work);
}

static dt_status hook_finish(void *state, dt_pg *pg, int bucket, float *grad, size_t count) {
    compress_state *s = state;
    bucket_buf     *b = &s->b[bucket];
    size_t          c = b->c, w = (size_t)s->world;
    // The w copies of this rank's block widened into tmp (w * c floats), summed in rank
    // order by comm's kernel into the first.
    for (size_t r = 0; r < w; r++) {
        decode(s, b->recv + r * c, s->tmp + r * c, c);
        s->in[r] = s->tmp + r * c;
    }
    dt_reduce_n(s->tmp, NULL, false, s->in, s->world, c, DT_FLOAT32, DT_REDUCE_SUM, DT_ORDER_ANY);
    encode(s, s->tmp, b->mine, c);
    dt_status st = dt_pg_all_gather(pg, b->mine, b->all, c / 2, DT_INT32);
    if (st != DT_OK)
        return dt_fail_context("ddp compression: all-gather of bucket %d", bucket);
    decode(s, b->all, grad, count);
    return DT_OK;
}

dt_status ddp_compress_new(void **state, dt_ddp_comm_hook *hook, dt_ddp_compress kind, int world) {
    *state = NULL;
    if (kind != DT_DDP_COMPRESS_BF16 && kind != DT_DDP_COMPRESS_FP16)
        return dt_fail(DT_ERR_ARG, "ddp compression: expected NONE, BF16 or FP16, found %d",
                       (int)kind);
    if (world < 1)
        return dt_fail(DT_ERR_ARG, "ddp compression: expected a world size >= 1, found %d", world);
    compress_state *s = dt_alloc_zero(sizeof *s);
    if (s && !(s->in = dt_alloc(sizeof(void *) * (size_t)world))) {
        dt_free(s);
        s = NULL;
    }
    if (!s)
        return DT_ERR_NOMEM;
    s->kind  = kind;
    s->world = world;
    *hook    = (dt_ddp_comm_hook){.start = hook_start, .finish = hook_finish, .state = s};
    *state   = s;
    return DT_OK;
}

void ddp_compress_free(void *state) {
    compress_state *s = state;
    if (!s)
        return;
    for (int i = 0; i < s->nb; i++)
        buf_free(&s->b[i]);
    dt_free(s->b);
    dt_free(s->tmp);
    dt_free(s->in);
    dt_free(s);
}
