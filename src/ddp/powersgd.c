// powersgd.c: PowerSGD gradient compression as a DDP comm hook (ddp.h).
//
// Per bucket, found on its first step: the parameter matrices worth compressing (their
// P and Q slices) and the ranges sent uncompressed. start adds the error, forms P = M Q
// and queues one all-reduce of [P | uncompressed values]; finish orthonormalises P,
// forms Q = M^T P, all-reduces Q (blocking) and writes the rank-r approximation P Q^T
// into the gradient, keeping M - P Q^T as the next step's error. M Q and M^T P go
// through sgemm (each rank's own, then averaged); P Q^T is a plain loop in a fixed
// order, so every rank computes the same bits from the same reduced P and Q whatever
// kernels its BLAS picked.
#include "dtrain/ddp.h"

#include "dtrain/rng.h"
#include "nn/blas.h"

#include <math.h>
#include <string.h>

typedef struct pmat {
    size_t off; // floats from the bucket's start
    int    n, m;
    size_t poff, qoff; // into the bucket's P and Q
} pmat;

typedef struct prange {
    size_t off, len; // floats from the bucket's start, sent uncompressed
} prange;

typedef struct pbucket {
    bool    known;
    bool    plain; // this step: a plain all-reduce (before start_iter)
    size_t  offset, count;
    int     nmat, nrange;
    pmat   *mats;
    prange *ranges;
    size_t  plen, qlen, vlen;
    float  *err; // count floats (matrix parts used)
    float  *msg; // plen + vlen
    float  *q;   // qlen: warm-started from step to step
    float  *row; // max m: one row of P Q^T
} pbucket;

struct dt_powersgd {
    dt_params       *p;
    int              world;
    dt_powersgd_opts o;
    dt_ddp_comm_hook hook;
    int              nb;
    pbucket         *b;
    int64_t          iter; // steps begun (bucket 0 starts)
    size_t           sent, full, sent_last, full_last;
};

dt_powersgd_opts dt_powersgd_opts_default(void) {
    return (dt_powersgd_opts){.rank = 1, .start_iter = 0, .seed = 0};
}

static void bucket_free(pbucket *b) {
    dt_free(b->mats);
    dt_free(b->ranges);
    dt_free(b->err);
    dt_free(b->msg);
    dt_free(b->q);
    dt_free(b->row);
}

// Finds the tensors of the bucket [offset, offset + count) and sizes its buffers.
static dt_status bucket_layout(dt_powersgd *ps, pbucket *b, size_t offset, size_t count) {
    int nt = dt_params_count(ps->p), r = ps->o.rank, maxm = 1;
    b->mats   = dt_alloc_zero(sizeof(pmat) * (size_t)(nt ? nt : 1));
    b->ranges = dt_alloc_zero(sizeof(prange) * (size_t)(nt + 1));
    if (!b->mats || !b->ranges)
        return DT_ERR_NOMEM;
    b->offset    = offset;
    b->count     = count;
    size_t cover = offset; // floats before this are accounted for
    for (int t = 0; t < nt; t++) {
        const dt_param_info *pi = dt_params_info(ps->p, t);
        if (pi->offset < offset || pi->offset + pi->count > offset + count)
            continue;
        size_t n = pi->ndim >= 2 ? (size_t)pi->shape[0] : 0, m = n ? pi->count / n : 0;
        bool   compress = pi->trainable && n > 0 && m > 0 && 2 * (size_t)r * (n + m) <= n * m;
        if (!compress)
            continue;
        if (pi->offset > cover) // the floats between: uncompressed
            b->ranges[b->nrange++] = (prange){cover - offset, pi->offset - cover};
        b->mats[b->nmat++] = (pmat){
            .off = pi->offset - offset, .n = (int)n, .m = (int)m, .poff = b->plen, .qoff = b->qlen};
        b->plen += n * (size_t)r;
        b->qlen += m * (size_t)r;
        maxm  = (int)m > maxm ? (int)m : maxm;
        cover = pi->offset + pi->count;
    }
    if (offset + count > cover)
        b->ranges[b->nrange++] = (prange){cover - offset, offset + count - cover};
    for (int i = 0; i < b->nrange; i++)
        b->vlen += b->ranges[i].len;
    b->err = dt_alloc_zero(sizeof(float) * count);
    b->msg = dt_alloc(sizeof(float) * (b->plen + b->vlen + 1));
    b->q   = dt_alloc(sizeof(float) * (b->qlen + 1));
    b->row = dt_alloc(sizeof(float) * (size_t)maxm);
    if (!b->err || !b->msg || !b->q || !b->row)
        return dt_fail(DT_ERR_NOMEM,
                       "powersgd: expected buffers for a bucket of %zu floats, "
                       "found no memory",
                       count);
    // The first Q: normal random, the same on every rank (a stream per matrix).
    dt_rng root = dt_rng_init(ps->o.seed);
    for (int k = 0; k < b->nmat; k++) {
        dt_rng g = dt_rng_split(&root, offset + b->mats[k].off);
        for (size_t i = 0; i < (size_t)b->mats[k].m * (size_t)r; i++)
            b->q[b->mats[k].qoff + i] = dt_rng_normal(&g);
    }
    b->known = true;
    return DT_OK;
}

static dt_status get_bucket(dt_powersgd *ps, int i, size_t offset, size_t count, pbucket **out) {
    if (i >= ps->nb) {
        pbucket *nb = dt_alloc_zero(sizeof(pbucket) * (size_t)(i + 1));
        if (!nb)
            return DT_ERR_NOMEM;
        if (ps->b)
            memcpy(nb, ps->b, sizeof(pbucket) * (size_t)ps->nb);
        dt_free(ps->b);
        ps->b  = nb;
        ps->nb = i + 1;
    }
    pbucket *b = &ps->b[i];
    if (b->known && (b->offset != offset || b->count != count))
        return dt_fail(DT_ERR_STATE, "powersgd: bucket %d was [%zu, +%zu), found [%zu, +%zu)", i,
                       b->offset, b->count, offset, count);
    if (!b->known) {
        dt_status s = bucket_layout(ps, b, offset, count);
        if (s != DT_OK)
            return s;
    }
    *out = b;
    return DT_OK;
}

static dt_status ps_start(void *state, dt_pg *pg, int bucket, float *grad, size_t count,
                          dt_work **work) {
    dt_powersgd *ps = state;
    if (bucket == 0) {
        ps->iter++;
        ps->sent_last = ps->sent, ps->full_last = ps->full;
        ps->sent = ps->full = 0;
    }
    size_t    offset = (size_t)(grad - dt_params_grads(ps->p));
    pbucket  *b      = NULL;
    dt_status s      = get_bucket(ps, bucket, offset, count, &b);
    if (s != DT_OK)
        return s;
    ps->full += count;
    b->plain = ps->iter <= ps->o.start_iter || b->nmat == 0;
    if (b->plain) {
        ps->sent += count;
        return dt_pg_all_reduce_async(pg, grad, grad, count, DT_FLOAT32, DT_REDUCE_AVG, work);
    }
    int r = ps->o.rank;
    for (int k = 0; k < b->nmat; k++) { // M = grad + err (in the gradient); P = M Q
        const pmat  *mt = &b->mats[k];
        float       *mm = grad + mt->off, *e = b->err + mt->off, *pp = b->msg + mt->poff;
        const float *q = b->q + mt->qoff;
        for (size_t i = 0; i < (size_t)mt->n * mt->m; i++)
            mm[i] += e[i];
        // local products go through sgemm (their sums are averaged afterwards, so every
        // rank still ends with the same bits); P Q^T below stays a fixed-order loop
        dt_sgemm(false, false, mt->n, r, mt->m, 1.0f, mm, mt->m, q, r, 0.0f, pp, r);
    }
    float *v = b->msg + b->plen;
    for (int k = 0; k < b->nrange; k++) {
        memcpy(v, grad + b->ranges[k].off, sizeof(float) * b->ranges[k].len);
        v += b->ranges[k].len;
    }
    ps->sent += b->plen + b->vlen + b->qlen;
    return dt_pg_all_reduce_async(pg, b->msg, b->msg, b->plen + b->vlen, DT_FLOAT32, DT_REDUCE_AVG,
                                  work);
}

// Gram-Schmidt on the r columns of the row-major n x r matrix p; a column that
// vanishes stays zero.
static void orthonormalise(float *p, int n, int r) {
    for (int c = 0; c < r; c++) {
        for (int d = 0; d < c; d++) {
            double dot = 0;
            for (int i = 0; i < n; i++)
                dot += (double)p[(size_t)i * r + c] * p[(size_t)i * r + d];
            for (int i = 0; i < n; i++)
                p[(size_t)i * r + c] -= (float)dot * p[(size_t)i * r + d];
        }
        double nn = 0;
        for (int i = 0; i < n; i++)
            nn += (double)p[(size_t)i * r + c] * p[(size_t)i * r + c];
        float inv = nn > 0 ? (float)(1.0 / sqrt(nn)) : 0.0f;
        for (int i = 0; i < n; i++)
            p[(size_t)i * r + c] *= inv;
    }
}

static dt_status ps_finish(void *state, dt_pg *pg, int bucket, float *grad, size_t count) {
    dt_powersgd *ps = state;
    pbucket     *b  = &ps->b[bucket];
    (void)count;
    if (b->plain)
        return DT_OK;
    int          r = ps->o.rank;
    const float *v = b->msg + b->plen;
    for (int k = 0; k < b->nrange; k++) {
        memcpy(grad + b->ranges[k].off, v, sizeof(float) * b->ranges[k].len);
        v += b->ranges[k].len;
    }
    for (int k = 0; k < b->nmat; k++) { // Q = M^T P with P orthonormal
        const pmat  *mt = &b->mats[k];
        float       *pp = b->msg + mt->poff, *q = b->q + mt->qoff;
        const float *mm = grad + mt->off;
        orthonormalise(pp, mt->n, r);
        dt_sgemm(true, false, mt->m, r, mt->n, 1.0f, mm, mt->m, pp, r, 0.0f, q, r);
    }
    dt_status s = dt_pg_all_reduce(pg, b->q, b->q, b->qlen, DT_FLOAT32, DT_REDUCE_AVG);
    if (s != DT_OK)
        return dt_fail_context("powersgd: all-reduce of Q for bucket %d", bucket);
    for (int k = 0; k < b->nmat; k++) { // grad = P Q^T; err = M - grad
        const pmat  *mt = &b->mats[k];
        const float *pp = b->msg + mt->poff, *q = b->q + mt->qoff;
        float       *mm = grad + mt->off, *e = b->err + mt->off;
        for (int i = 0; i < mt->n; i++) {
            for (int j = 0; j < mt->m; j++) {
                float acc = 0;
                for (int c = 0; c < r; c++)
                    acc += pp[(size_t)i * r + c] * q[(size_t)j * r + c];
                b->row[j] = acc;
            }
            float *mrow = mm + (size_t)i * mt->m, *erow = e + (size_t)i * mt->m;
            for (int j = 0; j < mt->m; j++) {
                erow[j] = mrow[j] - b->row[j];
                mrow[j] = b->row[j];
            }
        }
    }
    return DT_OK;
}

dt_status dt_powersgd_new(dt_powersgd **out, dt_params *params, int world,
                          const dt_powersgd_opts *opts) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "powersgd: expected an output pointer, found NULL");
    *out               = NULL;
    dt_powersgd_opts o = opts ? *opts : dt_powersgd_opts_default();
    if (!params || !dt_params_ready(params))
        return dt_fail(DT_ERR_ARG, "powersgd: expected parameters with storage, found %s",
                       params ? "none" : "NULL");
    if (o.rank < 1 || o.rank > 1024)
        return dt_fail(DT_ERR_ARG, "powersgd: rank must be in [1, 1024], found %d", o.rank);
    if (o.start_iter < 0 || world < 1)
        return dt_fail(DT_ERR_ARG,
                       "powersgd: expected start_iter >= 0 and world >= 1, found "
                       "%d and %d",
                       o.start_iter, world);
    dt_status bs = dt_blas_init();
    if (bs != DT_OK)
        return bs;
    dt_powersgd *ps = dt_alloc_zero(sizeof *ps);
    if (!ps)
        return DT_ERR_NOMEM;
    ps->p     = params;
    ps->world = world;
    ps->o     = o;
    ps->hook  = (dt_ddp_comm_hook){.start = ps_start, .finish = ps_finish, .state = ps};
    *out      = ps;
    return DT_OK;
}

const dt_ddp_comm_hook *dt_powersgd_hook(dt_powersgd *ps) {
    return &ps->hook;
}

void dt_powersgd_stats(const dt_powersgd *ps, size_t *sent_floats, size_t *full_floats) {
    // the last complete step: the counters of the step in progress if it is complete
    *sent_floats = ps->sent ? ps->sent : ps->sent_last;
    *full_floats = ps->full ? ps->full : ps->full_last;
}

void dt_powersgd_free(dt_powersgd *ps) {
    if (!ps)
        return;
    for (int i = 0; i < ps->nb; i++)
        bucket_free(&ps->b[i]);
    dt_free(ps->b);
    dt_free(ps);
}
