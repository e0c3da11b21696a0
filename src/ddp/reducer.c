// reducer.c: the one gradient reducer (reducer.h): buckets, ready tracking, launch,
// the comm hook's start and finish, errors.
#include "ddp/reducer.h"

#include "dtrain/trace.h"

#include <stdio.h>
#include <string.h>

typedef struct bucket {
    dt_bucket_span span;
    int            pending; // trainable tensors not yet ready in this backward
    bool           started;
    dt_work       *work; // the reduction in flight (NULL: none, or the hook finished it)
} bucket;

struct dt_reducer {
    dt_params      *p;
    dt_pg          *pg;
    dt_reducer_opts o;
    int             ntensors, nbuckets;
    bucket         *b;
    int            *tensor_bucket; // [ntensors]; -1 for frozen tensors outside every bucket
    bool           *ready;         // [ntensors]
    int             next_launch;   // buckets start in index order on every rank
    bool            sync;
    bool            sum;    // SUM rather than AVG over the ranks (no hook)
    bool            failed; // a report of this step failed (returned to its backward)
    double          wait_s;
    int64_t         steps;
};

// ----------------------------------------------------------------------- buckets

// PyTorch's assignment by size for one dtype: walk the trainable tensors in definition
// order and close a bucket once it holds at least the current limit (first_bytes for the
// first bucket, then cap_bytes; so a bucket can exceed it by one tensor); the list comes
// out reversed, bucket 0 holding the tensors backward finishes first. Frozen tensors get
// no bucket (PyTorch leaves requires_grad=False parameters out); one lying between two
// trainable tensors of a bucket is inside its range and reduced with it, harmlessly.
void dt_bucket_plan(const dt_params *p, size_t cap_bytes, size_t first_bytes, dt_bucket_span *spans,
                    int *nb) {
    size_t cap   = cap_bytes ? cap_bytes : (size_t)25 << 20;
    size_t first = first_bytes ? first_bytes : cap_bytes ? cap : (size_t)1 << 20;
    int    n = dt_params_count(p), last = -1; // the last trainable tensor
    for (int t = 0; t < n; t++)
        if (dt_params_info(p, t)->trainable)
            last = t;
    int    k = 0, start = -1, ntrain = 0;
    size_t bytes = 0, limit = first;
    for (int t = 0; t <= last; t++) { // in definition order into spans[0..k)
        const dt_param_info *pi = dt_params_info(p, t);
        if (!pi->trainable)
            continue;
        if (start < 0)
            start = t;
        ntrain++;
        bytes += pi->count * sizeof(float);
        if (bytes >= limit || t == last) {
            const dt_param_info *p0 = dt_params_info(p, start);
            spans[k++]              = (dt_bucket_span){.offset   = p0->offset,
                                                       .count    = pi->offset + pi->count - p0->offset,
                                                       .first    = start,
                                                       .ntensors = t - start + 1,
                                                       .ntrain   = ntrain};
            start = -1, ntrain = 0, bytes = 0, limit = cap;
        }
    }
    for (int i = 0; i < k / 2; i++) { // reversed: bucket 0 is the last tensors'
        dt_bucket_span s = spans[i];
        spans[i]         = spans[k - 1 - i];
        spans[k - 1 - i] = s;
    }
    *nb = k;
}

static dt_status plan_buckets(dt_reducer *r) {
    dt_bucket_span *spans = dt_alloc(sizeof *spans * (size_t)(r->ntensors ? r->ntensors : 1));
    if (!spans)
        return DT_ERR_NOMEM;
    dt_bucket_plan(r->p, r->o.bucket_cap_bytes, r->o.first_bucket_bytes, spans, &r->nbuckets);
    for (int t = 0; t < r->ntensors; t++)
        r->tensor_bucket[t] = -1;
    for (int i = 0; i < r->nbuckets; i++) {
        r->b[i].span = spans[i];
        for (int t = spans[i].first; t < spans[i].first + spans[i].ntensors; t++)
            r->tensor_bucket[t] = dt_params_info(r->p, t)->trainable ? i : -1;
    }
    dt_free(spans);
    return DT_OK;
}

static void reset_step(dt_reducer *r) {
    for (int i = 0; i < r->nbuckets; i++) {
        r->b[i].pending = r->b[i].span.ntrain;
        r->b[i].started = false;
        r->b[i].work    = NULL;
    }
    memset(r->ready, 0, sizeof(bool) * (size_t)(r->ntensors ? r->ntensors : 1));
    r->next_launch = 0;
    r->failed      = false;
}

// ------------------------------------------------------------------------ launch

static dt_status start_bucket(dt_reducer *r, int i) {
    bucket *bk  = &r->b[i];
    bk->started = true;
    bk->work    = NULL;
    DT_TRACE_BEGIN(tr);
    float    *g = dt_params_grads(r->p) + bk->span.offset;
    dt_status s = r->o.hook.start
                      ? r->o.hook.start(r->o.hook.state, r->pg, i, g, bk->span.count, &bk->work)
                      : dt_pg_all_reduce_ordered_async(r->pg, g, g, bk->span.count, DT_FLOAT32,
                                                       r->sum ? DT_REDUCE_SUM : DT_REDUCE_AVG,
                                                       r->o.order, &bk->work);
    DT_TRACE_END(tr, r->o.who, "bucket start", "bucket", i);
    if (s != DT_OK) {
        bk->work = NULL;
        return dt_fail_context("%s: bucket %d (%zu floats)", r->o.who, i, bk->span.count);
    }
    return DT_OK;
}

// Starts every bucket, in index order, whose gradients are all final (all of them:
// `all`).
static dt_status launch(dt_reducer *r, bool all) {
    while (r->next_launch < r->nbuckets && (all || r->b[r->next_launch].pending == 0)) {
        int i = r->next_launch++;
        DT_TRY(start_bucket(r, i));
    }
    return DT_OK;
}

dt_status dt_reducer_mark(dt_reducer *r, size_t offset, size_t count) {
    if (!r->sync)
        return DT_OK;
    size_t    end = offset + count, covered = 0;
    dt_status s = DT_OK;
    for (int t = 0; t < r->ntensors && s == DT_OK; t++) { // validate before changing anything
        const dt_param_info *pi = dt_params_info(r->p, t);
        if (pi->offset >= end || pi->offset + pi->count <= offset || !pi->trainable)
            continue;
        if (pi->offset < offset || pi->offset + pi->count > end)
            s = dt_fail(DT_ERR_ARG,
                        "%s: range [%zu, %zu) cuts parameter %s [%zu, %zu); expected whole tensors",
                        r->o.who, offset, end, pi->name, pi->offset, pi->offset + pi->count);
        else if (r->ready[t])
            s = dt_fail(DT_ERR_STATE,
                        "%s: parameter %s was marked ready twice in one step: call the sync after "
                        "each backward, or turn sync off to accumulate",
                        r->o.who, pi->name);
        covered += pi->count;
    }
    if (s == DT_OK && covered == 0) {
        // A range of frozen tensors only has nothing to reduce.
        for (int t = 0; t < r->ntensors; t++) {
            const dt_param_info *pi = dt_params_info(r->p, t);
            if (pi->offset >= offset && pi->offset + pi->count <= end && pi->count)
                return DT_OK;
        }
        s = dt_fail(DT_ERR_ARG, "%s: range [%zu, %zu) covers no parameter tensor", r->o.who, offset,
                    end);
    }
    if (s == DT_OK) {
        for (int t = 0; t < r->ntensors; t++) {
            const dt_param_info *pi = dt_params_info(r->p, t);
            if (pi->trainable && pi->offset >= offset && pi->offset + pi->count <= end) {
                r->ready[t] = true;
                r->b[r->tensor_bucket[t]].pending--;
            }
        }
        if (r->o.overlap)
            s = launch(r, false);
    }
    if (s != DT_OK)
        r->failed = true;
    return s;
}

static dt_status on_grad_ready(void *user, size_t offset, size_t count) {
    return dt_reducer_mark(user, offset, count);
}

// ------------------------------------------------------------------------- sync

// Every trainable tensor in a bucket got its gradient; else DT_ERR_STATE naming them.
static dt_status check_all_ready(dt_reducer *r) {
    char   names[384];
    size_t off     = 0;
    int    missing = 0;
    for (int t = 0; t < r->ntensors; t++)
        if (!r->ready[t] && r->tensor_bucket[t] >= 0) {
            missing++;
            if (off < sizeof names - 40)
                off += (size_t)snprintf(names + off, sizeof names - off, "%s%s",
                                        missing > 1 ? ", " : "", dt_params_info(r->p, t)->name);
        }
    if (!missing)
        return DT_OK;
    return dt_fail(DT_ERR_STATE,
                   "%s: %d parameter tensor(s) received no gradient in this backward (%s); every "
                   "parameter must get a gradient on every rank in every step (report each with "
                   "dt_params_grad_ready)",
                   r->o.who, missing, names);
}

// Waits for bucket i and finishes it; frees its handle either way.
static dt_status finish_bucket(dt_reducer *r, int i, bool ok_so_far) {
    bucket   *bk = &r->b[i];
    dt_status s  = DT_OK;
    if (bk->work) {
        DT_TRACE_BEGIN(tr);
        s = dt_work_wait(bk->work);
        DT_TRACE_END(tr, r->o.who, "bucket wait", "bucket", i);
        if (s == DT_OK && ok_so_far && r->o.hook.finish)
            s = r->o.hook.finish(r->o.hook.state, r->pg, i, dt_params_grads(r->p) + bk->span.offset,
                                 bk->span.count);
        dt_work_free(bk->work);
        bk->work = NULL;
    }
    if (s != DT_OK)
        return dt_fail_context("%s: reduction of bucket %d (%zu floats)", r->o.who, i,
                               bk->span.count);
    return DT_OK;
}

dt_status dt_reducer_sync(dt_reducer *r) {
    if (!r->sync)
        return DT_OK;
    uint64_t  t0 = dt_now_ns();
    dt_status s  = DT_OK;
    DT_TRACE_BEGIN(tr_sync);
    if (r->failed)
        s = dt_fail(DT_ERR_STATE,
                    "%s: a gradient report of this step failed (its error went to the backward "
                    "that made it); the step cannot be reduced",
                    r->o.who);
    if (s == DT_OK)
        s = launch(r, !r->o.track);
    if (s == DT_OK && r->o.track && r->next_launch < r->nbuckets)
        s = check_all_ready(r);
    if (s != DT_OK)
        dt_pg_abort(r->pg, dt_last_error()); // the others fail at once instead of waiting
    for (int i = 0; i < r->nbuckets; i++) {
        if (!r->b[i].started)
            continue;
        dt_status bs = finish_bucket(r, i, s == DT_OK);
        if (s == DT_OK && bs != DT_OK) {
            s = bs;
            dt_pg_abort(r->pg, dt_last_error());
        }
    }
    DT_TRACE_END(tr_sync, r->o.who, r->o.sync_span, "buckets", r->nbuckets);
    r->wait_s += (double)(dt_now_ns() - t0) * 1e-9;
    if (s == DT_OK)
        r->steps++;
    reset_step(r);
    return s;
}

// ------------------------------------------------------------------ construction

dt_status dt_reducer_new(dt_reducer **out, dt_params *p, dt_pg *pg, const dt_reducer_opts *o) {
    *out = NULL;
    if (!o->hook.start && o->hook.finish)
        return dt_fail(DT_ERR_ARG, "%s: expected a comm hook with a start, found a finish alone",
                       o->who);
    dt_reducer *r = dt_alloc_zero(sizeof *r);
    if (!r)
        return dt_fail_context("%s: the reducer", o->who);
    r->p             = p;
    r->pg            = pg;
    r->o             = *o;
    r->sync          = true;
    r->ntensors      = dt_params_count(p);
    size_t nt        = (size_t)(r->ntensors ? r->ntensors : 1);
    r->b             = dt_alloc_zero(sizeof(bucket) * nt);
    r->tensor_bucket = dt_alloc_zero(sizeof(int) * nt);
    r->ready         = dt_alloc_zero(sizeof(bool) * nt);
    dt_status s      = r->b && r->tensor_bucket && r->ready ? DT_OK : DT_ERR_NOMEM;
    if (s == DT_OK && (s = plan_buckets(r)) == DT_OK) {
        reset_step(r);
        if (o->track)
            s = dt_params_add_grad_hook(p, on_grad_ready, r);
    }
    if (s != DT_OK) {
        dt_fail_context("%s: the reducer", o->who);
        r->o.track = false; // nothing registered
        dt_reducer_free(r);
        return s;
    }
    *out = r;
    return DT_OK;
}

void dt_reducer_free(dt_reducer *r) {
    if (!r)
        return;
    for (int i = 0; r->b && i < r->nbuckets; i++)
        if (r->b[i].work) {
            dt_work_wait(r->b[i].work);
            dt_work_free(r->b[i].work);
        }
    if (r->o.track)
        dt_params_remove_grad_hook(r->p, on_grad_ready, r);
    dt_free(r->b);
    dt_free(r->tensor_bucket);
    dt_free(r->ready);
    dt_free(r);
}

void dt_reducer_set_sync(dt_reducer *r, bool sync) {
    r->sync = sync;
}

void dt_reducer_set_sum(dt_reducer *r, bool sum) {
    r->sum = sum;
}

int dt_reducer_num_buckets(const dt_reducer *r) {
    return r->nbuckets;
}

const dt_bucket_span *dt_reducer_bucket(const dt_reducer *r, int i) {
    return i >= 0 && i < r->nbuckets ? &r->b[i].span : NULL;
}

void dt_reducer_stats(const dt_reducer *r, double *wait_s, int64_t *steps) {
    *wait_s = r->wait_s;
    *steps  = r->steps;
}
