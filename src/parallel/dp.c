// dp.c: DataParallel in one process (dp.h): replicas on the threads of a pool, each on
// a contiguous slice of the batch, their gradients summed in replica order.
#include "dtrain/dp.h"

#include "dtrain/trace.h"
#include "nn/pool.h"

#include <stdio.h>
#include <string.h>

typedef struct replica {
    dt_dp_replica r;
    bool          made;
    uint64_t     *keys; // the slice's dataset indices, as dropout keys
    size_t        keys_cap;
    size_t        begin, n; // the slice of the current batch
    float         loss;
    dt_status     st;
    char          msg[256]; // the failure's message (recorded on the replica's thread)
} replica;

struct dt_dp {
    dt_params      *master;
    int             n;
    dt_dp_ops       ops;
    dt_dp_opts      o;
    replica        *rep;
    dt_pool        *pool;
    dt_rng          rng;
    bool            has_rng, training;
    const dt_batch *b;      // the batch of the running step
    bool            failed; // some replica failed this step: no reduction
};

dt_dp_opts dt_dp_opts_default(void) {
    return (dt_dp_opts){.replica_threads = 1};
}

// The layouts must agree tensor by tensor: copying and summing go by flat offsets.
static dt_status check_layout(dt_params *m, dt_params *r, int i) {
    if (!r || !dt_params_ready(r))
        return dt_fail(DT_ERR_ARG,
                       "DataParallel: replica %d: expected allocated parameters, found %s", i,
                       r ? "a table without storage" : "none");
    if (dt_params_numel(r) != dt_params_numel(m) || dt_params_count(r) != dt_params_count(m) ||
        dt_params_buffer_numel(r) != dt_params_buffer_numel(m))
        return dt_fail(
            DT_ERR_MISMATCH,
            "DataParallel: replica %d: expected the master's layout (%d tensors, %zu "
            "floats, %zu buffer floats), found %d tensors, %zu floats, %zu buffer floats",
            i, dt_params_count(m), dt_params_numel(m), dt_params_buffer_numel(m),
            dt_params_count(r), dt_params_numel(r), dt_params_buffer_numel(r));
    for (int k = 0; k < dt_params_count(m); k++) {
        const dt_param_info *a = dt_params_info(m, k), *b = dt_params_info(r, k);
        if (a->offset != b->offset || a->count != b->count || strcmp(a->name, b->name))
            return dt_fail(DT_ERR_MISMATCH,
                           "DataParallel: replica %d: tensor %d: expected \"%s\" (%zu floats at "
                           "%zu), found \"%s\" (%zu floats at %zu)",
                           i, k, a->name, a->count, a->offset, b->name, b->count, b->offset);
    }
    return DT_OK;
}

dt_status dt_dp_new(dt_dp **out, dt_params *master, int n, const dt_dp_ops *ops,
                    const dt_dp_opts *opts) {
    *out = NULL;
    if (n < 1 || n > DT_DP_MAX_REPLICAS)
        return dt_fail(DT_ERR_ARG, "DataParallel: expected 1 to %d replicas, found %d",
                       DT_DP_MAX_REPLICAS, n);
    if (!master || !dt_params_ready(master) || !ops || !ops->make || !ops->work)
        return dt_fail(DT_ERR_ARG,
                       "DataParallel: expected allocated master parameters and a replica "
                       "factory and work function, found %s",
                       !master || !dt_params_ready(master) ? "no master parameters"
                                                           : "no make or work function");
    dt_dp_opts o = opts ? *opts : dt_dp_opts_default();
    if (o.replica_threads < 1)
        return dt_fail(DT_ERR_ARG, "DataParallel: expected replica_threads >= 1, found %d",
                       o.replica_threads);
    dt_dp *dp = dt_alloc_zero(sizeof *dp);
    if (!dp)
        return DT_ERR_NOMEM;
    dp->master = master, dp->n = n, dp->ops = *ops, dp->o = o, dp->training = true;
    dt_status st = DT_OK;
    if (!(dp->rep = dt_alloc_zero(sizeof(replica) * (size_t)n)))
        st = DT_ERR_NOMEM;
    for (int i = 0; !st && i < n; i++) {
        replica *r = &dp->rep[i];
        if ((st = ops->make(ops->user, i, &r->r)) != DT_OK) {
            dt_fail_context("DataParallel: building replica %d", i);
            break;
        }
        r->made = true;
        if ((st = check_layout(master, r->r.params, i)))
            break;
        if (r->r.model)
            st = dt_model_set_threads(r->r.model, o.replica_threads);
        if (!st && r->r.graph)
            st = dt_graph_set_threads(r->r.graph, o.replica_threads);
    }
    if (!st && !(dp->pool = dt_pool_init(n)))
        st = dt_last_status() ? dt_last_status() : DT_ERR_NOMEM;
    if (st) {
        dt_dp_free(dp);
        return st;
    }
    *out = dp;
    return DT_OK;
}

void dt_dp_free(dt_dp *dp) {
    if (!dp)
        return;
    dt_pool_free(dp->pool);
    for (int i = 0; dp->rep && i < dp->n; i++) {
        if (dp->rep[i].made && dp->ops.drop)
            dp->ops.drop(dp->ops.user, &dp->rep[i].r);
        dt_free(dp->rep[i].keys);
    }
    dt_free(dp->rep);
    dt_free(dp);
}

int dt_dp_size(const dt_dp *dp) {
    return dp ? dp->n : 0;
}

dt_dp_replica *dt_dp_replica_at(dt_dp *dp, int i) {
    return dp && i >= 0 && i < dp->n ? &dp->rep[i].r : NULL;
}

void dt_dp_set_rng(dt_dp *dp, const dt_rng *rng) {
    dp->rng = *rng, dp->has_rng = true;
}

void dt_dp_train(dt_dp *dp, bool training) {
    dp->training = training;
}

// Replica i's part of a step, on its own thread: copy the master, run the slice.
static dt_status run_replica(dt_dp *dp, replica *r) {
    dt_params *p = r->r.params;
    size_t     n = dt_params_numel(p), nb = dt_params_buffer_numel(p);
    memcpy(dt_params_data(p), dt_params_data(dp->master), sizeof(float) * n);
    if (nb)
        memcpy(dt_params_buffers(p), dt_params_buffers(dp->master), sizeof(float) * nb);
    dt_params_zero_grad(p);
    const dt_batch *b = dp->b;
    if (r->n > r->keys_cap) {
        dt_free(r->keys);
        r->keys_cap = 0;
        if (!(r->keys = dt_alloc(sizeof(uint64_t) * r->n)))
            return DT_ERR_NOMEM;
        r->keys_cap = r->n;
    }
    for (size_t s = 0; s < r->n; s++)
        r->keys[s] = b->indices ? b->indices[r->begin + s] : r->begin + s;
    if (r->r.model) {
        dt_model_train(r->r.model, dp->training);
        if (dp->has_rng)
            dt_model_set_rng(r->r.model, &dp->rng);
        DT_TRY(dt_model_set_sample_keys(r->r.model, r->keys, (int)r->n));
    }
    if (r->r.graph) {
        dt_graph_train(r->r.graph, dp->training);
        if (dp->has_rng)
            dt_graph_set_rng(r->r.graph, &dp->rng);
        DT_TRY(dt_graph_set_sample_keys(r->r.graph, r->keys, (int)r->n));
    }
    dt_batch s = *b;
    s.size     = r->n;
    s.x        = b->x ? b->x + r->begin * b->sample_elems : NULL;
    s.y        = b->y ? b->y + r->begin : NULL;
    s.indices  = b->indices ? b->indices + r->begin : NULL;
    s.t        = b->t ? b->t + r->begin * b->t_elems : NULL;
    return dp->ops.work(dp->ops.user, &r->r, &s, &r->loss);
}

static void task(void *arg, int ith, int nth) {
    dt_dp   *dp = arg;
    replica *r  = &dp->rep[ith];
    r->st       = DT_OK;
    if (r->n) {
        r->st = run_replica(dp, r);
        if (r->st)
            snprintf(r->msg, sizeof r->msg, "%s", dt_last_error());
    }
    dt_pool_barrier(dp->pool);
    for (int i = 0; i < nth; i++)
        if (dp->rep[i].st)
            return; // every thread sees the same failures after the barrier
    // Thread ith sums its range of the gradients over the replicas, in replica order.
    size_t numel = dt_params_numel(dp->master);
    size_t lo = numel * (size_t)ith / (size_t)nth, hi = numel * (size_t)(ith + 1) / (size_t)nth;
    float *g = dt_params_grads(dp->master);
    float  B = (float)dp->b->size;
    for (size_t j = lo; j < hi; j++) {
        float s = 0;
        for (int i = 0; i < nth; i++) {
            const replica *q = &dp->rep[i];
            if (q->n)
                s += ((float)q->n / B) * dt_params_grads(q->r.params)[j];
        }
        g[j] += s;
    }
}

dt_status dt_dp_forward_backward(dt_dp *dp, const dt_batch *b, float *loss) {
    if (!b || b->size < 1 || (!b->x && !b->t && !b->y))
        return dt_fail(DT_ERR_ARG,
                       "DataParallel: expected a batch of at least one sample, found %s",
                       b ? "an empty batch" : "none");
    size_t B = b->size, N = (size_t)dp->n;
    for (size_t i = 0; i < N; i++) {
        size_t lo = B * i / N, hi = B * (i + 1) / N;
        dp->rep[i].begin = lo, dp->rep[i].n = hi - lo;
    }
    dp->b = b;
    DT_TRACE_BEGIN(t0);
    dt_pool_run(dp->pool, task, dp);
    DT_TRACE_END(t0, "dp", "forward_backward", "replicas", dp->n);
    dp->b = NULL;
    for (int i = 0; i < dp->n; i++)
        if (dp->rep[i].st)
            return dt_fail(dp->rep[i].st, "DataParallel: replica %d (samples %zu..%zu): %s", i,
                           dp->rep[i].begin, dp->rep[i].begin + dp->rep[i].n, dp->rep[i].msg);
    float l = 0;
    for (int i = 0; i < dp->n; i++)
        if (dp->rep[i].n)
            l += ((float)dp->rep[i].n / (float)B) * dp->rep[i].loss;
    *loss = l;
    // Replica 0's buffers (BatchNorm running statistics) become the master's.
    size_t nb = dt_params_buffer_numel(dp->master);
    if (nb && dp->rep[0].n)
        memcpy(dt_params_buffers(dp->master), dt_params_buffers(dp->rep[0].r.params),
               sizeof(float) * nb);
    return DT_OK;
}
