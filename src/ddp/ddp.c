// ddp.c: DistributedDataParallel (see ddp.h for the contract): the checks and
// broadcasts at the start, and the reduction of each gradient bucket as a comm hook of
// the one gradient reducer (reducer.h), which owns the buckets, the ready tracking, the
// launch during backward and the errors: an all-reduce (AVG; in the tree order of comm.h
// with tree_reduce), the 16-bit compression (compress.c) or the caller's hook.
#include "dtrain/ddp.h"

#include "ddp/compress.h"
#include "ddp/reducer.h"

#include <stdio.h>
#include <string.h>

// Per tensor in the shape check: numel, ndim, 4 dims, CRC32C of the name, trainable.
#define ENTRY_LEN 8

struct dt_ddp {
    dt_params  *p;
    dt_pg      *pg;
    dt_ddp_opts o;
    dt_reducer *r;
    void       *own_hook; // the compression state this wrapper made (compress.h)
};

dt_ddp_opts dt_ddp_opts_default(void) {
    return (dt_ddp_opts){.broadcast_params = true, .overlap = true};
}

dt_status dt_ddp_mark_ready(dt_ddp *d, size_t offset, size_t count) {
    return dt_reducer_mark(d->r, offset, count);
}

// ------------------------------------------------------------------------------ init

// Tensor i of the parameter table then the buffer table, as ENTRY_LEN numbers.
static const dt_param_info *entry_info(dt_params *p, int i) {
    int np = dt_params_count(p);
    return i < np ? dt_params_info(p, i) : dt_params_buffer_info(p, i - np);
}

static void fill_table(dt_params *p, int64_t *t, int n) {
    for (int i = 0; i < n; i++) {
        const dt_param_info *pi = entry_info(p, i);
        int64_t             *e  = t + (size_t)ENTRY_LEN * (size_t)i;
        e[0]                    = (int64_t)pi->count;
        e[1]                    = pi->ndim;
        for (int k = 0; k < 4; k++)
            e[2 + k] = pi->shape[k];
        e[6] = dt_crc32c(0, pi->name, strlen(pi->name));
        e[7] = pi->trainable;
    }
}

static void shape_str(const int64_t *e, char *buf, size_t n) {
    int off = snprintf(buf, n, "(");
    for (int k = 0; k < e[1] && off > 0 && (size_t)off < n; k++)
        off += snprintf(buf + off, n - (size_t)off, k ? ", %lld" : "%lld", (long long)e[2 + k]);
    if (off > 0 && (size_t)off < n)
        snprintf(buf + off, n - (size_t)off, ")");
}

// Every rank's tables against rank 0's: first the counts, then every tensor's shape,
// name (by checksum) and trainability; the first difference, the same message on every
// rank.
static dt_status verify_shapes(dt_ddp *d) {
    int      world  = dt_pg_size(d->pg);
    int64_t  cnt[2] = {dt_params_count(d->p), dt_params_buffer_count(d->p)};
    int64_t *allc   = dt_alloc(sizeof(int64_t) * 2 * (size_t)world);
    if (!allc)
        return DT_ERR_NOMEM;
    dt_status s = dt_pg_all_gather(d->pg, cnt, allc, 2, DT_INT64);
    if (s != DT_OK) {
        dt_free(allc);
        return dt_fail_context("ddp: comparing parameter tables across ranks");
    }
    for (int r = 1; r < world && s == DT_OK; r++)
        if (allc[2 * r] != allc[0] || allc[2 * r + 1] != allc[1])
            s = dt_fail(DT_ERR_MISMATCH,
                        "ddp: rank %d has %lld parameter tensors and %lld buffers, rank 0 has "
                        "%lld and %lld",
                        r, (long long)allc[2 * r], (long long)allc[2 * r + 1], (long long)allc[0],
                        (long long)allc[1]);
    dt_free(allc);
    if (s != DT_OK)
        return s;
    int      n   = (int)(cnt[0] + cnt[1]);
    size_t   len = (size_t)ENTRY_LEN * (size_t)(n ? n : 1);
    int64_t *all = dt_alloc(sizeof(int64_t) * len * (size_t)(world + 1));
    if (!all)
        return DT_ERR_NOMEM;
    int64_t *mine = all + len * (size_t)world;
    memset(mine, 0, sizeof(int64_t) * len);
    fill_table(d->p, mine, n);
    s = dt_pg_all_gather(d->pg, mine, all, len, DT_INT64);
    if (s != DT_OK) {
        dt_free(all);
        return dt_fail_context("ddp: comparing parameter shapes across ranks");
    }
    const int64_t *ref = all;
    for (int r = 1; r < world && s == DT_OK; r++) {
        const int64_t *t = all + len * (size_t)r;
        for (int i = 0; i < n; i++) {
            const int64_t *a = ref + ENTRY_LEN * i, *b = t + ENTRY_LEN * i;
            if (memcmp(a, b, ENTRY_LEN * sizeof(int64_t)) != 0) {
                char        sa[64], sb[64];
                const char *kind = i < cnt[0] ? "parameter" : "buffer";
                const char *nm   = entry_info(d->p, i)->name;
                shape_str(a, sa, sizeof sa);
                shape_str(b, sb, sizeof sb);
                if (memcmp(a, b, 6 * sizeof(int64_t)) != 0)
                    s = dt_fail(DT_ERR_MISMATCH,
                                "ddp: %s %s has shape %s on rank 0 but %s on rank %d", kind, nm, sa,
                                sb, r);
                else if (a[6] != b[6])
                    s = dt_fail(DT_ERR_MISMATCH,
                                "ddp: %s %d has another name on rank %d than on rank 0 (\"%s\" on "
                                "rank %d)",
                                kind, i < cnt[0] ? i : i - (int)cnt[0], r, nm, dt_pg_rank(d->pg));
                else
                    s = dt_fail(DT_ERR_MISMATCH, "ddp: %s %s is %s on rank 0 but %s on rank %d",
                                kind, nm, a[7] ? "trainable" : "frozen",
                                b[7] ? "trainable" : "frozen", r);
                break;
            }
        }
    }
    dt_free(all);
    return s;
}

dt_status dt_ddp_broadcast_buffers(dt_ddp *d) {
    size_t nb = dt_params_buffer_numel(d->p);
    if (!nb)
        return DT_OK;
    if (dt_pg_broadcast(d->pg, dt_params_buffers(d->p), nb, DT_FLOAT32, 0))
        return dt_fail_context("ddp: broadcasting %zu buffer floats from rank 0", nb);
    return DT_OK;
}

static void ddp_destroy(dt_ddp *d) {
    dt_reducer_free(d->r);
    ddp_compress_free(d->own_hook);
    dt_free(d);
}

dt_status dt_ddp_new(dt_ddp **out, dt_params *p, dt_pg *pg, const dt_ddp_opts *opts) {
    *out = NULL;
    if (!p || !pg)
        return dt_fail(DT_ERR_ARG, "ddp: expected parameters and a process group, found NULL");
    if (!dt_params_ready(p))
        return dt_fail(DT_ERR_STATE, "ddp: expected parameters with storage (dt_params_alloc or "
                                     "dt_params_bind, or a finalized model), found none");
    dt_ddp *d = dt_alloc_zero(sizeof *d);
    if (!d)
        return DT_ERR_NOMEM;
    d->p               = p;
    d->pg              = pg;
    d->o               = opts ? *opts : dt_ddp_opts_default();
    dt_reducer_opts ro = {.who                = "ddp",
                          .sync_span          = "ddp sync",
                          .bucket_cap_bytes   = d->o.bucket_cap_bytes,
                          .first_bucket_bytes = d->o.first_bucket_bytes,
                          .track              = true,
                          .overlap            = d->o.overlap,
                          // the average over ranks, in comm's tree order with tree_reduce
                          // (with 2 ranks every order is a + b)
                          .order = d->o.tree_reduce ? DT_ORDER_TREE : DT_ORDER_ANY};
    dt_status       s  = DT_OK;
    if ((d->o.comm_hook || d->o.compress != DT_DDP_COMPRESS_NONE) && d->o.tree_reduce)
        s = dt_fail(DT_ERR_ARG, "ddp: tree_reduce and gradient compression (or a comm hook) "
                                "both set: expected one of them");
    else if (d->o.comm_hook && !d->o.comm_hook->start)
        s = dt_fail(DT_ERR_ARG, "ddp: expected a comm hook with a start, found none");
    else if (d->o.comm_hook)
        ro.hook = *d->o.comm_hook;
    else if (d->o.compress != DT_DDP_COMPRESS_NONE)
        s = ddp_compress_new(&d->own_hook, &ro.hook, d->o.compress, dt_pg_size(pg));
    if (s || (s = verify_shapes(d)) ||
        (d->o.broadcast_params &&
         ((s = dt_pg_broadcast(pg, dt_params_data(p), dt_params_numel(p), DT_FLOAT32, 0)) ||
          (s = dt_ddp_broadcast_buffers(d)))) ||
        (s = dt_reducer_new(&d->r, p, pg, &ro))) {
        ddp_destroy(d);
        return s;
    }
    *out = d;
    return DT_OK;
}

void dt_ddp_free(dt_ddp *d) {
    if (!d)
        return;
    ddp_destroy(d);
}

void dt_ddp_set_sync(dt_ddp *d, bool sync) {
    dt_reducer_set_sync(d->r, sync);
}

void dt_ddp_set_sum(dt_ddp *d, bool sum) {
    dt_reducer_set_sum(d->r, sum);
}

dt_status dt_ddp_sync(dt_ddp *d) {
    return dt_reducer_sync(d->r);
}

int dt_ddp_num_buckets(const dt_ddp *d) {
    return dt_reducer_num_buckets(d->r);
}

void dt_ddp_bucket(const dt_ddp *d, int i, size_t *offset, size_t *count) {
    const dt_bucket_span *b = dt_reducer_bucket(d->r, i);
    *offset                 = b ? b->offset : 0;
    *count                  = b ? b->count : 0;
}

void dt_ddp_stats(const dt_ddp *d, double *wait_s, int64_t *steps) {
    dt_reducer_stats(d->r, wait_s, steps);
}
