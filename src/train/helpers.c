// helpers.c: what a program and the trainer's own files ask of a dt_trainer (train.h):
// its accessors, printing on rank 0, and the collective helpers over its group. It calls
// nothing else of the trainer, so every other file of src/train may call it.
#include "train_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

// ----------------------------------------------------------------------- accessors

dt_pg *dt_trainer_pg(dt_trainer *t) {
    return t->pg;
}
int dt_trainer_rank(const dt_trainer *t) {
    return t->rank;
}
int dt_trainer_world(const dt_trainer *t) {
    return t->world;
}
bool dt_train_mesh_on(const dt_trainer *t) {
    return t->mesh != NULL;
}
int dt_trainer_mesh_size(const dt_trainer *t, dt_mesh_dim dim) {
    if (dim < 0 || dim >= DT_MESH_DIM_COUNT_)
        return -1;
    return t->msize[dim] > 0 ? t->msize[dim] : dim == DT_MESH_DP ? t->world : 1;
}
int dt_trainer_mesh_coord(const dt_trainer *t, dt_mesh_dim dim) {
    if (t->mesh)
        return dt_mesh_coord(t->mesh, dim);
    return dim == DT_MESH_DP ? t->rank : dim < 0 || dim >= DT_MESH_DIM_COUNT_ ? -1 : 0;
}

dt_pg *dt_trainer_mesh_group(dt_trainer *t, dt_mesh_dim dim) {
    if (t->mesh)
        return dt_mesh_size(t->mesh, dim) > 1 ? dt_mesh_group(t->mesh, dim) : NULL;
    return dim == DT_MESH_DP ? t->pg : NULL;
}

dt_pg *dt_train_dp_group(dt_trainer *t) {
    return dt_trainer_mesh_group(t, DT_MESH_DP);
}
int dt_train_dp_size(const dt_trainer *t) {
    return dt_trainer_mesh_size(t, DT_MESH_DP);
}

dt_pipe *dt_trainer_pipe(dt_trainer *t) {
    return t->pipe;
}

int dt_trainer_local_rank(const dt_trainer *t) {
    return t->local_rank;
}
bool dt_trainer_is_main(const dt_trainer *t) {
    return t->rank == 0;
}
bool dt_trainer_is_local_main(const dt_trainer *t) {
    return t->local_rank == 0;
}
int dt_trainer_threads(const dt_trainer *t) {
    return t->threads;
}
double dt_trainer_start_time(const dt_trainer *t) {
    return t->start;
}
void dt_trainer_set_clip_grad(dt_trainer *t, double max_norm) {
    t->a.clip_grad = max_norm;
}
void dt_trainer_exclude_time(dt_trainer *t, double secs) {
    t->excluded += secs;
}
double dt_trainer_loop_secs(const dt_trainer *t) {
    return (t->finished > 0 ? t->finished : dt_now()) - t->train_start - t->excluded;
}
dt_precision dt_trainer_precision(const dt_trainer *t) {
    dt_precision p = DT_PREC_FP32;
    if (t->a.precision && dt_precision_parse(t->a.precision, &p) != DT_OK)
        p = DT_PREC_FP32; // not reached: the flag table accepts only the three words
    return p;
}
float dt_trainer_loss_scale(const dt_trainer *t) {
    return t->scaler ? dt_grad_scaler_scale(t->scaler) : 1.0f;
}
void dt_trainer_scale_loss_grad(const dt_trainer *t, float *dloss, size_t n) {
    float s = dt_trainer_loss_scale(t);
    if (s != 1.0f)
        for (size_t i = 0; i < n; i++)
            dloss[i] *= s;
}
size_t dt_trainer_loss_over(dt_trainer *t, size_t n) {
    return t->strat ? dt_strategy_loss_over(t->strat, n) : n;
}
int64_t dt_trainer_skipped_steps(const dt_trainer *t) {
    return t->skipped;
}

int64_t dt_trainer_step_count(const dt_trainer *t) {
    return t->step;
}
long dt_trainer_epoch(const dt_trainer *t) {
    return t->epoch;
}
size_t dt_trainer_num_batches(const dt_trainer *t) {
    return t->nbatches;
}
float dt_trainer_grad_norm(const dt_trainer *t) {
    return t->grad_norm;
}
bool dt_trainer_sync_step(const dt_trainer *t) {
    return t->sync;
}
bool dt_trainer_preempted(const dt_trainer *t) {
    return t->preempted;
}
dt_rng dt_trainer_epoch_rng(const dt_trainer *t) {
    return dt_rng_split(&t->root, (uint64_t)t->epoch);
}
dt_rng dt_trainer_step_rng(const dt_trainer *t, uint64_t id) {
    dt_rng s = dt_rng_split(&t->base, 0x73746570 /* "step" */);
    s        = dt_rng_split(&s, (uint64_t)t->step);
    return dt_rng_split(&s, id);
}

static void vprint_if(bool yes, const char *fmt, va_list ap) {
    if (yes) {
        vprintf(fmt, ap);
        fflush(stdout);
    }
}

void dt_trainer_print(const dt_trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_if(t->rank == 0, fmt, ap);
    va_end(ap);
}

void dt_trainer_print_local(const dt_trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_if(t->local_rank == 0, fmt, ap);
    va_end(ap);
}

// ------------------------------------------------------------------ collective helpers

dt_status dt_trainer_wait_for_everyone(dt_trainer *t) {
    return t->pg ? dt_pg_barrier(t->pg) : DT_OK;
}
dt_status dt_trainer_main_first_begin(dt_trainer *t) {
    return t->pg && t->rank != 0 ? dt_pg_barrier(t->pg) : DT_OK;
}
dt_status dt_trainer_main_first_end(dt_trainer *t) {
    return t->pg && t->rank == 0 ? dt_pg_barrier(t->pg) : DT_OK;
}
dt_status dt_trainer_all_reduce(dt_trainer *t, void *buf, size_t count, dt_dtype dtype,
                                dt_reduce_op op) {
    return t->pg ? dt_pg_all_reduce(t->pg, buf, buf, count, dtype, op) : DT_OK;
}

dt_status dt_trainer_gather_for_metrics(dt_trainer *t, const void *src, size_t count,
                                        dt_dtype dtype, void **out, size_t *total) {
    size_t es = dt_dtype_size(dtype);
    *out = NULL, *total = 0;
    if (!es)
        return dt_fail(DT_ERR_ARG, "gather_for_metrics: expected a valid dtype, found %d",
                       (int)dtype);
    int      world = t->world;
    int64_t *cnt   = dt_alloc(sizeof(int64_t) * (size_t)world);
    if (!cnt)
        return DT_ERR_NOMEM;
    int64_t   mine = (int64_t)count, most = 0, sum = 0;
    dt_status st = t->pg ? dt_pg_all_gather(t->pg, &mine, cnt, 1, DT_INT64) : DT_OK;
    if (!t->pg)
        cnt[0] = mine;
    for (int r = 0; r < world; r++)
        most = cnt[r] > most ? cnt[r] : most, sum += cnt[r];
    // Padded to the largest share for the gather, then the padding dropped.
    char *pad = NULL, *all = NULL, *res = NULL;
    if (!st && (!(pad = dt_alloc_zero(es * (size_t)(most ? most : 1))) ||
                !(all = dt_alloc(es * (size_t)(most ? most : 1) * (size_t)world)) ||
                !(res = dt_alloc(es * (size_t)(sum ? sum : 1)))))
        st = DT_ERR_NOMEM;
    if (!st) {
        if (count)
            memcpy(pad, src, es * count);
        st = t->pg ? dt_pg_all_gather(t->pg, pad, all, (size_t)most, dtype) : DT_OK;
        if (!t->pg && count)
            memcpy(all, pad, es * count);
    }
    if (!st) {
        size_t at = 0;
        for (int r = 0; r < world; r++) {
            memcpy(res + at, all + (size_t)r * (size_t)most * es, (size_t)cnt[r] * es);
            at += (size_t)cnt[r] * es;
        }
        *out = res, *total = (size_t)sum, res = NULL;
    }
    dt_free(cnt), dt_free(pad), dt_free(all), dt_free(res);
    return st;
}
