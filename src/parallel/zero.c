// zero.c: ZeRO stages 1 and 2 over the parameter contract (see zero.h for the contract
// and the shard layout), and what stage 3 (zero3.c) shares with them: the shard table,
// the norm, the step, the usage.
#include "dtrain/trace.h"
#include "zero_impl.h"

#include "ddp/reducer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

dt_zero_opts dt_zero_opts_default(void) {
    return (dt_zero_opts){.stage = 2, .broadcast_params = true};
}

// ------------------------------------------------------------------------ layout

// The reducer's buckets (src/ddp/reducer.h, DDP's), each cut into world chunks of q
// floats and a remainder; this rank's chunk and the remainder lie at soff in the shard.
static dt_status form_buckets(dt_zero *z) {
    int nb      = dt_reducer_num_buckets(z->r);
    z->nbuckets = nb;
    z->b        = dt_alloc_zero(sizeof(zbucket) * (size_t)(nb ? nb : 1));
    if (!z->b)
        return DT_ERR_NOMEM;
    size_t soff = 0;
    for (int i = 0; i < nb; i++) {
        const dt_bucket_span *sp = dt_reducer_bucket(z->r, i);
        zbucket              *bk = &z->b[i];
        *bk                      = (zbucket){.offset = sp->offset, .count = sp->count};
        bk->q                    = bk->count / (size_t)z->world;
        bk->soff                 = soff;
        soff += bk->q + (bk->count - bk->q * (size_t)z->world);
    }
    z->ns = soff;
    return DT_OK;
}

dt_status dt_zero_add_pieces(dt_zero *z, size_t lo, size_t hi, bool primary, bool add) {
    for (int t = 0; t < z->ntensors && lo < hi; t++) {
        const dt_param_info *pi = dt_params_info(z->p, t);
        size_t               a  = pi->offset > lo ? pi->offset : lo;
        size_t               e  = pi->offset + pi->count < hi ? pi->offset + pi->count : hi;
        if (a >= e)
            continue;
        int k = z->npieces++;
        if (!add)
            continue;
        // A tensor cut into two pieces of one shard (a chunk and the remainder) needs a
        // second, unique name.
        char name[DT_PARAM_NAME_MAX + 1];
        snprintf(name, sizeof name, "%s", pi->name);
        if (dt_params_find(z->shard, name) >= 0)
            snprintf(name, sizeof name, "%.56s#%d", pi->name, k);
        int64_t shape[1] = {(int64_t)(e - a)};
        DT_TRY(dt_params_add(z->shard, name, 1, shape, pi->flags));
        z->piece_src[k]     = t;
        z->piece_flat[k]    = a;
        z->piece_primary[k] = primary;
    }
    return DT_OK;
}

// The shard table: per bucket, this rank's chunk, then the remainder (primary on the
// last rank, where it continues the chunk); stage 3: this rank's range [lo, hi).
static dt_status build_shard(dt_zero *z, bool add, size_t lo, size_t hi) {
    z->npieces = 0;
    if (z->o.stage == 3)
        return dt_zero_add_pieces(z, lo, hi, true, add);
    for (int i = 0; i < z->nbuckets; i++) {
        const zbucket *bk = &z->b[i];
        size_t c0 = bk->offset + (size_t)z->rank * bk->q, r0 = bk->offset + bk->q * z->world;
        DT_TRY(dt_zero_add_pieces(z, c0, c0 + bk->q, true, add));
        DT_TRY(dt_zero_add_pieces(z, r0, bk->offset + bk->count, z->rank == z->world - 1, add));
    }
    return DT_OK;
}

// Every rank must describe the same table: numel, tensors and a checksum of names,
// shapes and trainability.
static dt_status check_tables(dt_zero *z) {
    uint32_t crc = 0;
    for (int t = 0; t < z->ntensors; t++) {
        const dt_param_info *pi = dt_params_info(z->p, t);
        crc                     = dt_crc32c(crc, pi->name, strlen(pi->name));
        crc                     = dt_crc32c(crc, pi->shape, sizeof pi->shape);
        crc                     = dt_crc32c(crc, &pi->trainable, sizeof pi->trainable);
    }
    int64_t  mine[4] = {(int64_t)dt_params_numel(z->p), z->ntensors,
                        (int64_t)dt_params_buffer_numel(z->p), crc};
    int64_t *all     = dt_alloc(sizeof(int64_t) * 4 * (size_t)z->world);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status s = dt_pg_all_gather(z->pg, mine, all, 4, DT_INT64);
    for (int r = 0; s == DT_OK && r < z->world; r++)
        if (memcmp(all + 4 * r, mine, sizeof mine) != 0)
            s = dt_fail(DT_ERR_MISMATCH,
                        "zero: expected the same parameter table on every rank, found %lld floats "
                        "in %lld tensors (%lld buffer floats, names and shapes CRC32C %08llx) on "
                        "rank %d and %lld in %lld (%lld, %08llx) on rank %d",
                        (long long)mine[0], (long long)mine[1], (long long)mine[2],
                        (unsigned long long)mine[3], z->rank, (long long)all[4 * r],
                        (long long)all[4 * r + 1], (long long)all[4 * r + 2],
                        (unsigned long long)all[4 * r + 3], r);
    dt_free(all);
    return s;
}

// ------------------------------------------------------------- gradient reduction
//
// The reducer tracks, launches and waits; ZeRO's part is the reduction of one bucket (a
// comm hook, ddp.h): a reduce-scatter of the world chunks (this rank's lands in place)
// and an all-reduce of the remainder, both averages.

static dt_status bucket_start(void *state, dt_pg *pg, int i, float *g, size_t count,
                              dt_work **work) {
    dt_zero  *z  = state;
    zbucket  *bk = &z->b[i];
    size_t    r0 = bk->q * (size_t)z->world, rem = count - r0;
    dt_work  *rs = NULL, *ar = NULL;
    dt_status s = DT_OK;
    if (bk->q)
        s = dt_pg_reduce_scatter_async(pg, g, g + (size_t)z->rank * bk->q, bk->q, DT_FLOAT32,
                                       DT_REDUCE_AVG, &rs);
    if (s == DT_OK && rem)
        s = dt_pg_all_reduce_async(pg, g + r0, g + r0, rem, DT_FLOAT32, DT_REDUCE_AVG, &ar);
    // What a ring moves per rank: the others' chunks of this rank's, and twice the
    // remainder's (N - 1) / N.
    z->moved += (double)(z->world - 1) * ((double)bk->q + 2.0 * (double)rem / z->world);
    if (s != DT_OK) { // what was queued must end before its handles go
        dt_work_free(rs);
        dt_work_free(ar);
        return s;
    }
    // The lane runs them in issue order: the bucket is done when the last one is.
    *work  = ar ? ar : rs;
    bk->rs = ar ? rs : NULL;
    return DT_OK;
}

// The reduce-scatter that an all-reduce followed: finished (issue order); its status.
static dt_status release_rs(zbucket *bk) {
    dt_status s = DT_OK;
    if (bk->rs) {
        s = dt_work_wait(bk->rs);
        dt_work_free(bk->rs);
        bk->rs = NULL;
    }
    return s;
}

static dt_status bucket_finish(void *state, dt_pg *pg, int i, float *g, size_t count) {
    (void)pg, (void)g, (void)count;
    return release_rs(&((dt_zero *)state)->b[i]);
}

dt_status dt_zero_sync(dt_zero *z) {
    if (z->o.stage == 3) // reduced during every backward; the sum becomes the mean here
        return z->sync ? dt_zero3_sync(z) : DT_OK;
    dt_status s = dt_reducer_sync(z->r);
    for (int i = 0; i < z->nbuckets; i++) // after a failure: what the hook did not finish
        release_rs(&z->b[i]);
    return s;
}

void dt_zero_set_sync(dt_zero *z, bool sync) {
    z->sync = sync;
    if (z->r)
        dt_reducer_set_sync(z->r, sync);
}

// ---------------------------------------------------------------- norm and step

dt_status dt_zero_grad_norm(dt_zero *z, float *norm) {
    double ss = 0;
    for (int k = 0; k < z->npieces; k++) {
        const dt_param_info *pi = dt_params_info(z->shard, k);
        if (!pi->trainable || !z->piece_primary[k])
            continue;
        const float *g = dt_params_grads(z->p) + z->piece_flat[k];
        for (size_t i = 0; i < pi->count; i++)
            ss += (double)g[i] * (double)g[i];
    }
    float part = (float)ss, total = 0;
    DT_TRY(dt_pg_all_reduce(z->pg, &part, &total, 1, DT_FLOAT32, DT_REDUCE_SUM));
    *norm = sqrtf(total);
    return DT_OK;
}

double dt_zero_shard_sumsq(const dt_zero *z, const float *weight) {
    double ss = 0;
    for (int k = 0; z && k < z->npieces; k++) {
        const dt_param_info *pi = dt_params_info(z->shard, k);
        float                w  = weight ? weight[z->piece_src[k]] : 1.0f;
        if (!pi->trainable || !z->piece_primary[k] || w == 0.0f)
            continue;
        const float *g = dt_params_grads(z->p) + z->piece_flat[k];
        double       s = 0;
        for (size_t i = 0; i < pi->count; i++)
            s += (double)g[i] * (double)g[i];
        ss += w * s;
    }
    return ss;
}

dt_status dt_zero_clip_grad_norm(dt_zero *z, float max_norm, float *norm) {
    if (!(max_norm > 0) || !isfinite(max_norm))
        return dt_fail(DT_ERR_ARG, "zero: expected a finite max_norm > 0, found %g",
                       (double)max_norm);
    float total;
    DT_TRY(dt_zero_grad_norm(z, &total));
    if (norm)
        *norm = total;
    if (!isfinite(total))
        return DT_OK;
    float coef = (float)((double)max_norm / ((double)total + 1e-6));
    if (coef < 1.0f)
        for (int k = 0; k < z->npieces; k++) {
            const dt_param_info *pi = dt_params_info(z->shard, k);
            if (pi->trainable)
                for (size_t i = 0; i < pi->count; i++)
                    dt_params_grads(z->p)[z->piece_flat[k] + i] *= coef;
        }
    return DT_OK;
}

dt_status dt_zero_step(dt_zero *z) {
    float *p = dt_params_data(z->p);
    if (z->o.stage == 3) { // the next forward gathers what it reads
        DT_TRY(dt_zero3_settle(z));
        dt_optim_step(z->opt);
        z->steps++;
        return DT_OK;
    }
    dt_optim_step(z->opt); // this rank's pieces, in place in the whole buffer
    double    t0 = dt_now();
    dt_status s  = DT_OK;
    DT_TRACE_BEGIN(tr);
    for (int i = 0; s == DT_OK && i < z->nbuckets; i++) {
        zbucket *bk = &z->b[i];
        // In place: this rank's chunk is already where the gather puts it; the
        // remainder was stepped identically on every rank.
        float *chunk = p + bk->offset;
        if (bk->q)
            s = dt_pg_all_gather_async(z->pg, chunk + (size_t)z->rank * bk->q, chunk, bk->q,
                                       DT_FLOAT32, &bk->rs);
        z->moved += (double)(z->world - 1) * (double)bk->q;
    }
    for (int i = 0; i < z->nbuckets; i++)
        if (z->b[i].rs) {
            dt_status s2 = dt_work_wait(z->b[i].rs);
            dt_work_free(z->b[i].rs);
            z->b[i].rs = NULL;
            if (s == DT_OK && s2 != DT_OK)
                s = dt_fail_context("zero: all_gather of bucket %d", i);
        }
    DT_TRACE_END(tr, "zero", "all_gather", NULL, 0);
    z->gather_s += dt_now() - t0;
    z->steps++;
    if (s != DT_OK)
        dt_pg_abort(z->pg, dt_last_error());
    return s;
}

// ----------------------------------------------------------------- construction

static dt_status zero_init(dt_zero *z) {
    z->ntensors = dt_params_count(z->p);
    DT_TRY(check_tables(z));
    if (z->o.broadcast_params) {
        DT_TRY(dt_pg_broadcast(z->pg, dt_params_data(z->p), dt_params_numel(z->p), DT_FLOAT32, 0));
        if (dt_params_buffer_numel(z->p))
            DT_TRY(dt_pg_broadcast(z->pg, dt_params_buffers(z->p), dt_params_buffer_numel(z->p),
                                   DT_FLOAT32, 0));
    }
    size_t lo = 0, hi = 0;
    if (z->o.stage == 3) {
        DT_TRY(dt_zero3_init(z, &lo, &hi));
    } else {
        // Stage 2 reduces each bucket during backward, as DDP does; stage 1 all of them
        // at the sync, without tracking.
        dt_reducer_opts ro = {.who                = "zero",
                              .sync_span          = "zero sync",
                              .bucket_cap_bytes   = z->o.bucket_cap_bytes,
                              .first_bucket_bytes = z->o.first_bucket_bytes,
                              .track              = z->o.stage == 2,
                              .overlap            = z->o.stage == 2,
                              .hook = {.start = bucket_start, .finish = bucket_finish, .state = z}};
        DT_TRY(dt_reducer_new(&z->r, z->p, z->pg, &ro));
        DT_TRY(form_buckets(z));
    }
    DT_TRY(build_shard(z, false, lo, hi));
    size_t np        = (size_t)(z->npieces ? z->npieces : 1);
    z->piece_src     = dt_alloc(sizeof(int) * np);
    z->piece_flat    = dt_alloc(sizeof(size_t) * np);
    z->piece_primary = dt_alloc(sizeof(bool) * np);
    if (!z->piece_src || !z->piece_flat || !z->piece_primary)
        return DT_ERR_NOMEM;
    DT_TRY(dt_params_new(&z->shard, NULL));
    DT_TRY(build_shard(z, true, lo, hi));
    DT_TRY(dt_optim_shard(z->opt, z->shard, z->piece_src, z->piece_flat));
    return DT_OK;
}

dt_status dt_zero_new(dt_zero **out, dt_params *params, dt_pg *pg, dt_optim *opt,
                      const dt_zero_opts *opts) {
    *out           = NULL;
    dt_zero_opts o = opts ? *opts : dt_zero_opts_default();
    if (o.stage < 1 || o.stage > 3)
        return dt_fail(DT_ERR_ARG,
                       "zero: expected stage 1, 2 or 3 (stage 0 is plain DDP: dt_ddp_new), found "
                       "%d",
                       o.stage);
    if (!params || !dt_params_ready(params) || !pg || !opt)
        return dt_fail(DT_ERR_ARG,
                       "zero: expected parameters with storage, a group and an optimizer, found "
                       "%s",
                       !params || !dt_params_ready(params) ? "no parameter storage"
                       : !pg                               ? "a NULL group"
                                                           : "a NULL optimizer");
    if (dt_optim_params(opt) != params)
        return dt_fail(DT_ERR_ARG, "zero: expected an optimizer over the wrapped parameters, "
                                   "found one over another table");
    dt_zero *z = dt_alloc_zero(sizeof *z);
    if (!z)
        return DT_ERR_NOMEM;
    z->p = params, z->pg = pg, z->opt = opt, z->o = o, z->sync = true;
    z->world = dt_pg_size(pg), z->rank = dt_pg_rank(pg);
    dt_status s = zero_init(z);
    if (s != DT_OK) {
        dt_zero_free(z);
        return s;
    }
    *out = z;
    return DT_OK;
}

void dt_zero_free(dt_zero *z) {
    if (!z)
        return;
    dt_reducer_free(z->r); // waits for what is in flight
    for (int i = 0; z->b && i < z->nbuckets; i++)
        release_rs(&z->b[i]);
    if (z->z3)
        dt_zero3_free(z);
    // The optimizer keeps pointing at the shard table: it is only safe to free after it.
    dt_free(z->b);
    dt_free(z->piece_src);
    dt_free(z->piece_flat);
    dt_free(z->piece_primary);
    dt_params_free(z->shard);
    dt_free(z);
}

const dt_params *dt_zero_shard_params(const dt_zero *z) {
    return z->shard;
}

int dt_zero_stage(const dt_zero *z) {
    return z->o.stage;
}

int dt_zero_num_buckets(const dt_zero *z) {
    return z->nbuckets;
}

void dt_zero_bucket(const dt_zero *z, int i, size_t *offset, size_t *count) {
    *offset = i >= 0 && i < z->nbuckets ? z->b[i].offset : 0;
    *count  = i >= 0 && i < z->nbuckets ? z->b[i].count : 0;
}

void dt_zero_stats(const dt_zero *z, double *sync_wait_s, double *gather_s, int64_t *steps) {
    double  reducer_s = 0;
    int64_t synced    = 0;
    if (z->r)
        dt_reducer_stats(z->r, &reducer_s, &synced);
    if (sync_wait_s)
        *sync_wait_s = z->wait_s + reducer_s;
    if (gather_s)
        *gather_s = z->gather_s;
    if (steps)
        *steps = z->steps;
}

void dt_zero_scale_grad(dt_zero *z, float s) {
    float *g = dt_params_grads(z->p);
    for (int k = 0; k < z->npieces; k++) {
        const dt_param_info *pi = dt_params_info(z->shard, k);
        for (size_t i = 0; pi->trainable && i < pi->count; i++)
            g[z->piece_flat[k] + i] *= s;
    }
}

dt_status dt_zero_params_gather(dt_zero *z, int root) {
    if (root < -1 || root >= z->world)
        return dt_fail(DT_ERR_ARG, "zero: expected a root in [-1, %d), found %d", z->world, root);
    return z->z3 ? dt_zero3_params_gather(z, root) : DT_OK;
}

dt_status dt_zero_params_release(dt_zero *z) {
    return z->z3 ? dt_zero3_params_release(z) : DT_OK;
}

void dt_zero_get_usage(const dt_zero *z, dt_zero_usage *u) {
    memset(u, 0, sizeof *u);
    size_t nf = 0, n = dt_params_numel(z->p);
    dt_optim_state(z->opt, &nf);
    u->shard_floats = z->ns;
    u->state_bytes  = sizeof(float) * (2 * n + nf);
    if (z->z3)
        dt_zero3_usage(z, u);
    u->moved_bytes = sizeof(float) * z->moved;
    u->steps       = z->steps;
}

dt_status dt_zero_plan_memory(dt_params *p, dt_optim *opt, int world, const dt_zero_opts *opts,
                              dt_zero_memory *out) {
    memset(out, 0, sizeof *out);
    dt_zero_opts o = opts ? *opts : dt_zero_opts_default();
    if (!p || !dt_params_ready(p) || !opt || world < 1 || o.stage < 0 || o.stage > 3)
        return dt_fail(DT_ERR_ARG,
                       "zero: expected parameters, an optimizer, a world >= 1 and a stage in "
                       "0..3, found world %d and stage %d",
                       world, o.stage);
    size_t n = dt_params_numel(p), nf = 0, np = dt_optim_num_params(opt);
    dt_optim_state(opt, &nf);
    size_t blocks = np ? nf / np : 0; // floats of state per parameter float
    size_t own = n, optim = blocks * n;
    if (o.stage == 3) {
        size_t *r = dt_alloc(sizeof(size_t) * (size_t)(world + 1));
        if (!r)
            return DT_ERR_NOMEM;
        dt_zero3_ranges(p, world, o.shard_align, r);
        own = 0;
        for (int i = 0; i < world; i++)
            own = r[i + 1] - r[i] > own ? r[i + 1] - r[i] : own;
        dt_free(r);
        optim        = blocks * own;
        out->working = 2 * sizeof(float) * dt_zero3_largest_unit(p, o.unit_bytes);
    } else if (o.stage > 0) { // a bucket's chunk and remainder: at most ceil(c / N) + N
        dt_bucket_span *spans = dt_alloc(sizeof *spans * (size_t)(dt_params_count(p) + 1));
        int             nb    = 0;
        if (!spans)
            return DT_ERR_NOMEM;
        dt_bucket_plan(p, o.bucket_cap_bytes, o.first_bucket_bytes, spans, &nb);
        optim = 0;
        for (int i = 0; i < nb; i++)
            optim += blocks * (spans[i].count / (size_t)world + spans[i].count % (size_t)world);
        dt_free(spans);
    }
    out->params = sizeof(float) * own;
    out->grads  = sizeof(float) * own;
    out->optim  = sizeof(float) * optim;
    out->total  = out->params + out->grads + out->optim + out->working;
    return DT_OK;
}
