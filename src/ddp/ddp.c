// ddp.c: gradient buckets over the flat gradient buffer, reduced on the progress
// thread while backward goes on (see ddp.h for the contract).
#include "dtrain/ddp.h"
#include "dtrain/trace.h"

#include "ddp/buckets.h"
#include "ddp/compress.h"

#include <stdio.h>
#include <string.h>

// Per tensor in the shape check: numel, ndim, 4 dims, CRC32C of the name, trainable.
#define ENTRY_LEN 8

typedef struct bucket {
    size_t   offset, count;   // floats of the flat buffers
    int      first, ntensors; // parameter tensors [first, first + ntensors)
    int      ntrain;          // the trainable ones among them
    int      pending;         // trainable tensors not yet ready in this backward
    dt_work *work;            // the all-reduce in flight, NULL when not started
} bucket;

struct dt_ddp {
    dt_params  *p;
    dt_pg      *pg;
    dt_ddp_opts o;
    int         ntensors;
    int         nbuckets;
    bucket     *b;
    int        *tensor_bucket; // [ntensors]; -1 for frozen tensors outside every bucket
    bool       *ready;         // [ntensors]
    int         next_launch;   // buckets start in index order on every rank
    bool        sync;
    bool        marked; // something was marked ready since the last sync
    dt_status   err;    // sticky failure seen in the hook
    char        errmsg[512];
    double      wait_s;
    int64_t     steps;
    int         world;
    float      *gathered; // tree_reduce: world copies of each bucket, bucket-major

    dt_ddp_comm_hook hook;     // start == NULL: plain fp32 all-reduce
    void            *own_hook; // the compression state this wrapper made (compress.h)
};

dt_ddp_opts dt_ddp_opts_default(void) {
    return (dt_ddp_opts){.broadcast_params = true, .overlap = true};
}

// --------------------------------------------------------------------------- buckets

// The buckets (buckets.h: PyTorch's assignment by size), in reduction order.
static dt_status form_buckets(dt_ddp *d) {
    int             n     = d->ntensors;
    dt_bucket_span *spans = dt_alloc_zero(sizeof *spans * (size_t)(n ? n : 1));
    d->b                  = dt_alloc_zero(sizeof(bucket) * (size_t)(n ? n : 1));
    if (!spans || !d->b) {
        dt_free(spans);
        return DT_ERR_NOMEM;
    }
    dt_bucket_plan(d->p, d->o.bucket_cap_bytes, d->o.first_bucket_bytes, spans, &d->nbuckets,
                   d->tensor_bucket);
    for (int i = 0; i < d->nbuckets; i++)
        d->b[i] = (bucket){.offset   = spans[i].offset,
                           .count    = spans[i].count,
                           .first    = spans[i].first,
                           .ntensors = spans[i].ntensors,
                           .ntrain   = spans[i].ntrain};
    dt_free(spans);
    return DT_OK;
}

static void reset_step(dt_ddp *d) {
    for (int i = 0; i < d->nbuckets; i++) {
        d->b[i].pending = d->b[i].ntrain;
        d->b[i].work    = NULL;
    }
    memset(d->ready, 0, sizeof(bool) * (size_t)(d->ntensors ? d->ntensors : 1));
    d->next_launch = 0;
    d->marked      = false;
}

static void record_error(dt_ddp *d, dt_status s) {
    if (d->err == DT_OK) {
        d->err = s;
        snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
    }
}

// Starts every bucket, in index order, whose gradients are all final.
static void launch_ready(dt_ddp *d) {
    while (d->next_launch < d->nbuckets && d->b[d->next_launch].pending == 0) {
        bucket *bk = &d->b[d->next_launch];
        float  *g  = dt_params_grads(d->p) + bk->offset;
        bk->work   = NULL;
        DT_TRACE_BEGIN(tr);
        dt_status s =
            d->hook.start
                ? d->hook.start(d->hook.state, d->pg, d->next_launch, g, bk->count, &bk->work)
            : d->gathered
                ? dt_pg_all_gather_async(d->pg, g, d->gathered + (size_t)d->world * bk->offset,
                                         bk->count, DT_FLOAT32, &bk->work)
                : dt_pg_all_reduce_async(d->pg, g, g, bk->count, DT_FLOAT32, DT_REDUCE_AVG,
                                         &bk->work);
        DT_TRACE_END(tr, "ddp", "bucket start", "bucket", d->next_launch);
        if (s != DT_OK) {
            record_error(d, dt_fail_context("ddp: bucket %d", d->next_launch));
            bk->work = NULL;
        }
        d->next_launch++;
    }
}

static dt_status mark(dt_ddp *d, size_t offset, size_t count, bool launch) {
    size_t end = offset + count, covered = 0;
    for (int t = 0; t < d->ntensors; t++) { // validate before changing anything
        const dt_param_info *pi = dt_params_info(d->p, t);
        if (pi->offset >= end || pi->offset + pi->count <= offset || !pi->trainable)
            continue;
        if (pi->offset < offset || pi->offset + pi->count > end)
            return dt_fail(DT_ERR_ARG,
                           "ddp: range [%zu, %zu) cuts parameter %s [%zu, %zu); expected whole "
                           "tensors",
                           offset, end, pi->name, pi->offset, pi->offset + pi->count);
        if (d->ready[t])
            return dt_fail(DT_ERR_STATE,
                           "ddp: parameter %s was marked ready twice in one step: call "
                           "dt_ddp_sync after each backward, or turn sync off to accumulate",
                           pi->name);
        covered += pi->count;
    }
    if (covered == 0) {
        // A range of frozen tensors only has nothing to reduce.
        for (int t = 0; t < d->ntensors; t++) {
            const dt_param_info *pi = dt_params_info(d->p, t);
            if (pi->offset >= offset && pi->offset + pi->count <= end && pi->count)
                return DT_OK;
        }
        return dt_fail(DT_ERR_ARG, "ddp: range [%zu, %zu) covers no parameter tensor", offset, end);
    }
    for (int t = 0; t < d->ntensors; t++) {
        const dt_param_info *pi = dt_params_info(d->p, t);
        if (pi->trainable && pi->offset >= offset && pi->offset + pi->count <= end) {
            d->ready[t] = true;
            d->b[d->tensor_bucket[t]].pending--;
        }
    }
    d->marked = true;
    if (launch && d->o.overlap)
        launch_ready(d);
    return DT_OK;
}

static void on_grad_ready(void *user, size_t offset, size_t count) {
    dt_ddp *d = user;
    if (!d->sync)
        return;
    dt_status s = mark(d, offset, count, true);
    if (s != DT_OK)
        record_error(d, s);
}

dt_status dt_ddp_mark_ready(dt_ddp *d, size_t offset, size_t count) {
    if (!d->sync)
        return DT_OK;
    return mark(d, offset, count, true);
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
    ddp_compress_free(d->own_hook);
    dt_free(d->gathered);
    dt_free(d->b);
    dt_free(d->tensor_bucket);
    dt_free(d->ready);
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
    d->p             = p;
    d->pg            = pg;
    d->o             = opts ? *opts : dt_ddp_opts_default();
    d->ntensors      = dt_params_count(p);
    d->sync          = true;
    size_t nt        = (size_t)(d->ntensors ? d->ntensors : 1);
    d->tensor_bucket = dt_alloc_zero(sizeof(int) * nt);
    d->ready         = dt_alloc_zero(sizeof(bool) * nt);
    d->world         = dt_pg_size(pg);
    dt_status s      = !d->tensor_bucket || !d->ready ? DT_ERR_NOMEM : DT_OK;
    if (!s && (d->o.comm_hook || d->o.compress != DT_DDP_COMPRESS_NONE) && d->o.tree_reduce)
        s = dt_fail(DT_ERR_ARG, "ddp: tree_reduce and gradient compression (or a comm hook) "
                                "both set: expected one of them");
    if (!s && d->o.comm_hook)
        d->hook = *d->o.comm_hook;
    else if (!s && d->o.compress != DT_DDP_COMPRESS_NONE)
        s = ddp_compress_new(&d->own_hook, &d->hook, d->o.compress, dt_pg_size(pg));
    // With 2 ranks every backend's all-reduce adds a + b (= b + a), already the tree.
    if (!s && d->o.tree_reduce && d->world > 2 &&
        !(d->gathered = dt_alloc(sizeof(float) * (size_t)d->world * dt_params_numel(p))))
        s = DT_ERR_NOMEM;
    if (s || (s = form_buckets(d)) || (s = verify_shapes(d)) ||
        (d->o.broadcast_params &&
         ((s = dt_pg_broadcast(pg, dt_params_data(p), dt_params_numel(p), DT_FLOAT32, 0)) ||
          (s = dt_ddp_broadcast_buffers(d)))) ||
        (s = dt_params_add_grad_hook(p, on_grad_ready, d))) {
        ddp_destroy(d);
        return s;
    }
    reset_step(d);
    *out = d;
    return DT_OK;
}

// Waits for every started bucket (failures are already recorded elsewhere).
static void drain(dt_ddp *d) {
    for (int i = 0; i < d->nbuckets; i++)
        if (d->b[i].work) {
            dt_work_wait(d->b[i].work);
            dt_work_free(d->b[i].work);
            d->b[i].work = NULL;
        }
}

void dt_ddp_free(dt_ddp *d) {
    if (!d)
        return;
    drain(d);
    dt_params_remove_grad_hook(d->p, on_grad_ready, d);
    ddp_destroy(d);
}

void dt_ddp_set_sync(dt_ddp *d, bool sync) {
    d->sync = sync;
}

// tree_reduce: the world copies of bucket bk (rank r's at r * count) summed by the fixed
// tree over ranks, highest bit first (r with r + h for h = N/2, N/4, ... 1 when N is a
// power of two), divided by N, into the gradient buffer. The same on every rank.
static void tree_combine(dt_ddp *d, const bucket *bk) {
    float *blk = d->gathered + (size_t)d->world * bk->offset;
    float *g   = dt_params_grads(d->p) + bk->offset;
    int    h   = 1;
    while (2 * h < d->world)
        h *= 2;
    for (; h >= 1; h /= 2)
        for (int k = 0; k < h && k + h < d->world; k++) {
            float       *a = blk + (size_t)k * bk->count;
            const float *b = blk + (size_t)(k + h) * bk->count;
            for (size_t j = 0; j < bk->count; j++)
                a[j] += b[j];
        }
    float n = (float)d->world;
    for (size_t j = 0; j < bk->count; j++)
        g[j] = blk[j] / n;
}

dt_status dt_ddp_sync(dt_ddp *d) {
    if (!d->sync)
        return DT_OK;
    if (d->err == DT_OK && !d->o.overlap)
        launch_ready(d);
    if (d->err == DT_OK && d->next_launch < d->nbuckets) {
        // Some bucket never completed: name the tensors that got no gradient.
        char   names[384];
        size_t off     = 0;
        int    missing = 0;
        for (int t = 0; t < d->ntensors; t++)
            if (!d->ready[t] && d->tensor_bucket[t] >= 0) {
                missing++;
                if (off < sizeof names - 40)
                    off += (size_t)snprintf(names + off, sizeof names - off, "%s%s",
                                            missing > 1 ? ", " : "", dt_params_info(d->p, t)->name);
            }
        dt_fail(DT_ERR_STATE,
                "ddp: %d parameter tensor(s) received no gradient in this backward (%s); "
                "every parameter must get a gradient on every rank in every step",
                missing, names);
        record_error(d, DT_ERR_STATE);
        dt_pg_abort(d->pg, d->errmsg);
    }
    uint64_t  t0 = dt_now_ns();
    dt_status s  = DT_OK;
    DT_TRACE_BEGIN(tr_sync);
    for (int i = 0; i < d->nbuckets; i++) {
        if (!d->b[i].work)
            continue;
        DT_TRACE_BEGIN(tr);
        dt_status ws = dt_work_wait(d->b[i].work);
        DT_TRACE_END(tr, "ddp", "bucket wait", "bucket", i);
        if (ws == DT_OK && d->hook.finish && d->err == DT_OK)
            ws = d->hook.finish(d->hook.state, d->pg, i, dt_params_grads(d->p) + d->b[i].offset,
                                d->b[i].count);
        if (ws != DT_OK && s == DT_OK) {
            s = ws;
            dt_fail_context("ddp: all-reduce of bucket %d (%zu floats)", i, d->b[i].count);
            record_error(d, s);
        }
        if (ws == DT_OK && d->gathered)
            tree_combine(d, &d->b[i]);
        dt_work_free(d->b[i].work);
        d->b[i].work = NULL;
    }
    DT_TRACE_END(tr_sync, "ddp", "ddp sync", "buckets", d->nbuckets);
    d->wait_s += (double)(dt_now_ns() - t0) * 1e-9;
    d->steps++;
    reset_step(d);
    if (d->err != DT_OK) {
        dt_status e = d->err;
        dt_fail(e, "%s", d->errmsg);
        d->err = DT_OK; // reported once; the group itself stays failed if it was aborted
        return e;
    }
    return DT_OK;
}

int dt_ddp_num_buckets(const dt_ddp *d) {
    return d->nbuckets;
}

void dt_ddp_bucket(const dt_ddp *d, int i, size_t *offset, size_t *count) {
    *offset = i >= 0 && i < d->nbuckets ? d->b[i].offset : 0;
    *count  = i >= 0 && i < d->nbuckets ? d->b[i].count : 0;
}

void dt_ddp_stats(const dt_ddp *d, double *wait_s, int64_t *steps) {
    *wait_s = d->wait_s;
    *steps  = d->steps;
}
