// ddp.c: gradient buckets over the flat gradient buffer, reduced on the progress
// thread while backward goes on (see ddp.h for the contract).
#include "dtrain/ddp.h"

#include <stdio.h>
#include <string.h>

#define MAX_TENSORS 128
#define TABLE_LEN   (1 + MAX_TENSORS * 6) // count, then per tensor: numel, ndim, 4 dims

typedef struct bucket {
    size_t   offset, count;   // floats of the flat buffers
    int      first, ntensors; // parameter tensors [first, first + ntensors)
    int      pending;         // tensors not yet ready in this backward
    dt_work *work;            // the all-reduce in flight, NULL when not started
} bucket;

struct dt_ddp {
    dt_model   *m;
    dt_pg      *pg;
    dt_ddp_opts o;
    int         ntensors;
    int         nbuckets;
    bucket     *b;
    int         tensor_bucket[MAX_TENSORS];
    bool        ready[MAX_TENSORS];
    int         next_launch; // buckets start in index order on every rank
    bool        sync;
    bool        marked; // something was marked ready since the last sync
    dt_status   err;    // sticky failure seen in the hook
    char        errmsg[512];
    double      wait_s;
    int64_t     steps;
    int         world;
    float      *gathered; // tree_reduce: world copies of each bucket, bucket-major
};

dt_ddp_opts dt_ddp_opts_default(void) {
    return (dt_ddp_opts){.broadcast_params = true, .overlap = true};
}

// --------------------------------------------------------------------------- buckets

// PyTorch's compute_bucket_assignment_by_size for one dtype: walk the tensors in
// definition order, close a bucket once it holds at least the current limit (so a
// bucket can exceed it by one tensor), then move to the next limit; reverse at the end.
static dt_status form_buckets(dt_ddp *d) {
    size_t cap   = d->o.bucket_cap_bytes ? d->o.bucket_cap_bytes : (size_t)25 << 20;
    size_t first = d->o.first_bucket_bytes ? d->o.first_bucket_bytes
                   : d->o.bucket_cap_bytes ? cap
                                           : (size_t)1 << 20;
    bucket tmp[MAX_TENSORS];
    int    nb = 0, start = 0;
    size_t bytes = 0, limit = first;
    for (int t = 0; t < d->ntensors; t++) {
        const dt_param_info *pi = dt_model_param_info(d->m, t);
        bytes += pi->count * sizeof(float);
        if (bytes >= limit || t == d->ntensors - 1) {
            const dt_param_info *p0 = dt_model_param_info(d->m, start);
            tmp[nb++]               = (bucket){.offset   = p0->offset,
                                               .count    = pi->offset + pi->count - p0->offset,
                                               .first    = start,
                                               .ntensors = t - start + 1};
            start                   = t + 1;
            bytes                   = 0;
            limit                   = cap;
        }
    }
    d->b = dt_alloc_zero(sizeof(bucket) * (size_t)(nb ? nb : 1));
    if (!d->b)
        return DT_ERR_NOMEM;
    d->nbuckets = nb;
    for (int i = 0; i < nb; i++) {
        d->b[i] = tmp[nb - 1 - i];
        for (int t = d->b[i].first; t < d->b[i].first + d->b[i].ntensors; t++)
            d->tensor_bucket[t] = i;
    }
    return DT_OK;
}

static void reset_step(dt_ddp *d) {
    for (int i = 0; i < d->nbuckets; i++) {
        d->b[i].pending = d->b[i].ntensors;
        d->b[i].work    = NULL;
    }
    memset(d->ready, 0, sizeof d->ready);
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
        bucket   *bk = &d->b[d->next_launch];
        float    *g  = dt_model_grads(d->m) + bk->offset;
        dt_status s =
            d->gathered
                ? dt_pg_all_gather_async(d->pg, g, d->gathered + (size_t)d->world * bk->offset,
                                         bk->count, DT_FLOAT32, &bk->work)
                : dt_pg_all_reduce_async(d->pg, g, g, bk->count, DT_FLOAT32, DT_REDUCE_AVG,
                                         &bk->work);
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
        const dt_param_info *pi = dt_model_param_info(d->m, t);
        if (pi->offset >= end || pi->offset + pi->count <= offset)
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
    if (covered == 0)
        return dt_fail(DT_ERR_ARG, "ddp: range [%zu, %zu) covers no parameter tensor", offset, end);
    for (int t = 0; t < d->ntensors; t++) {
        const dt_param_info *pi = dt_model_param_info(d->m, t);
        if (pi->offset >= offset && pi->offset + pi->count <= end) {
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

static void fill_table(const dt_model *m, int64_t *t) {
    memset(t, 0, sizeof(int64_t) * TABLE_LEN);
    int n = dt_model_num_param_tensors(m);
    t[0]  = n;
    for (int i = 0; i < n && i < MAX_TENSORS; i++) {
        const dt_param_info *p = dt_model_param_info(m, i);
        int64_t             *e = t + 1 + 6 * i;
        e[0]                   = (int64_t)p->count;
        e[1]                   = p->ndim;
        for (int k = 0; k < 4; k++)
            e[2 + k] = p->shape[k];
    }
}

static void shape_str(const int64_t *e, char *buf, size_t n) {
    int off = snprintf(buf, n, "(");
    for (int k = 0; k < e[1] && off > 0 && (size_t)off < n; k++)
        off += snprintf(buf + off, n - (size_t)off, k ? ", %lld" : "%lld", (long long)e[2 + k]);
    if (off > 0 && (size_t)off < n)
        snprintf(buf + off, n - (size_t)off, ")");
}

// Every rank's parameter table against rank 0's; the first difference, the same
// message on every rank.
static dt_status verify_shapes(dt_ddp *d) {
    int      world = dt_pg_size(d->pg);
    int64_t *all   = dt_alloc(sizeof(int64_t) * TABLE_LEN * (size_t)(world + 1));
    if (!all)
        return DT_ERR_NOMEM;
    int64_t *mine = all + (size_t)TABLE_LEN * (size_t)world;
    fill_table(d->m, mine);
    dt_status s = dt_pg_all_gather(d->pg, mine, all, TABLE_LEN, DT_INT64);
    if (s != DT_OK) {
        dt_free(all);
        return dt_fail_context("ddp: comparing parameter shapes across ranks");
    }
    const int64_t *ref = all;
    for (int r = 1; r < world && s == DT_OK; r++) {
        const int64_t *t = all + (size_t)TABLE_LEN * (size_t)r;
        if (t[0] != ref[0]) {
            s = dt_fail(DT_ERR_MISMATCH,
                        "ddp: rank %d's model has %lld parameter tensors, rank 0's has %lld", r,
                        (long long)t[0], (long long)ref[0]);
            break;
        }
        for (int i = 0; i < ref[0] && i < MAX_TENSORS; i++) {
            const int64_t *a = ref + 1 + 6 * i, *b = t + 1 + 6 * i;
            if (memcmp(a, b, 6 * sizeof(int64_t)) != 0) {
                char sa[64], sb[64];
                shape_str(a, sa, sizeof sa);
                shape_str(b, sb, sizeof sb);
                s = dt_fail(DT_ERR_MISMATCH,
                            "ddp: parameter %s has shape %s on rank 0 but %s on rank %d",
                            dt_model_param_info(d->m, i)->name, sa, sb, r);
                break;
            }
        }
    }
    dt_free(all);
    return s;
}

dt_status dt_ddp_init(dt_ddp **out, dt_model *m, dt_pg *pg, const dt_ddp_opts *opts) {
    *out = NULL;
    if (!m || !pg)
        return dt_fail(DT_ERR_ARG, "ddp: expected a model and a process group, found NULL");
    if (dt_model_num_param_tensors(m) > MAX_TENSORS)
        return dt_fail(DT_ERR_UNSUPPORTED, "ddp: at most %d parameter tensors, found %d",
                       MAX_TENSORS, dt_model_num_param_tensors(m));
    dt_ddp *d = dt_alloc_zero(sizeof *d);
    if (!d)
        return DT_ERR_NOMEM;
    d->m        = m;
    d->pg       = pg;
    d->o        = opts ? *opts : dt_ddp_opts_default();
    d->ntensors = dt_model_num_param_tensors(m);
    d->sync     = true;
    d->world    = dt_pg_size(pg);
    dt_status s = DT_OK;
    // With 2 ranks every backend's all-reduce adds a + b (= b + a), already the tree.
    if (d->o.tree_reduce && d->world > 2 &&
        !(d->gathered = dt_alloc(sizeof(float) * (size_t)d->world * dt_model_num_params(m))))
        s = DT_ERR_NOMEM;
    if (s || (s = form_buckets(d)) || (s = verify_shapes(d)) ||
        (d->o.broadcast_params &&
         (s = dt_pg_broadcast(pg, dt_model_params(m), dt_model_num_params(m), DT_FLOAT32, 0)))) {
        dt_free(d->gathered);
        dt_free(d->b);
        dt_free(d);
        return s;
    }
    reset_step(d);
    dt_model_set_grad_hook(m, on_grad_ready, d);
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
    dt_model_set_grad_hook(d->m, NULL, NULL);
    dt_free(d->gathered);
    dt_free(d->b);
    dt_free(d);
}

// tree_reduce: the world copies of bucket bk (rank r's at r * count) summed by the fixed
// tree over ranks, highest bit first (r with r + h for h = N/2, N/4, ... 1 when N is a
// power of two), divided by N, into the gradient buffer. The same on every rank.
static void tree_combine(dt_ddp *d, const bucket *bk) {
    float *blk = d->gathered + (size_t)d->world * bk->offset,
          *g   = dt_model_grads(d->m) + bk->offset;
    int h      = 1;
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

void dt_ddp_set_sync(dt_ddp *d, bool sync) {
    d->sync = sync;
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
            if (!d->ready[t]) {
                missing++;
                if (off < sizeof names - 40)
                    off += (size_t)snprintf(names + off, sizeof names - off, "%s%s",
                                            missing > 1 ? ", " : "",
                                            dt_model_param_info(d->m, t)->name);
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
    for (int i = 0; i < d->nbuckets; i++) {
        if (!d->b[i].work)
            continue;
        dt_status ws = dt_work_wait(d->b[i].work);
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
