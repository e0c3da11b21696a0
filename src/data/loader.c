// loader.c: batches in a sampler's order, prepared one ahead on a background thread.
//
// Two slots. Batch k always goes to slot k % 2, so while the caller holds batch k the
// worker fills batch k + 1 into the other slot; when the caller asks for k + 1 it
// gives k back. The content of batch k is a function of the sampler's list alone, so
// the thread changes when a batch is ready, never what it holds.
//
//   caller:  next -> k (HELD)   next -> k+1 (HELD), k FREE    next -> ...
//   worker:  fill k+1 (FILLING -> READY)       fill k+2 (FILLING -> READY)
//
// Whoever claims batch k first (next_fill, under mu) prepares it: normally the worker,
// but when the caller asks for a batch the worker has not started (its wake-up is late,
// or its CPU is busy) the caller prepares it itself rather than wait (caller_helps).
// On a machine whose cores are all busy this degrades to preparing batches inline.
//
// Shared fields are guarded by mu. The epoch plan (order, first, count) is written by
// the caller only while the worker is idle and the loader inactive, and read by the
// worker only after it saw `active` under mu.
#include "data_impl.h"
#include "dtrain/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct slot {
    float    *x;     // (B, shape...)
    int32_t  *y;     // (B), or NULL for a dataset without labels
    float    *t;     // (B, target_elems), or NULL
    uint32_t *idx;   // (B)
    size_t    batch; // batch number (within the plan) it holds when READY or HELD
    size_t    size;
    int       state; // guarded by mu
    dt_status st;    // how filling it went (a callback dataset can fail)
    char      msg[512];
} slot;

struct dt_loader {
    const dt_dataset *ds;
    dt_sampler       *sampler;
    bool              own_sampler;
    dt_loader_opts    o;
    size_t            elems; // floats per sample
    slot              slots[2];

    // The epoch plan: batch k covers order[first + k*B, ...). Written while inactive.
    const uint32_t *order;
    size_t          order_len;
    size_t          first;    // resume position within the pass
    size_t          nbatches; // batches of this plan
    uint64_t        epoch;    // the sampler's epoch for this plan (keys augmentation)

    size_t    next_take; // caller only
    bool      holding;   // caller only: slot (next_take - 1) % 2 is HELD
    dt_status status;    // caller only

    pthread_mutex_t mu;
    pthread_cond_t  cv_work;   // worker waits for work or stop
    pthread_cond_t  cv_ready;  // caller waits for a READY slot or an idle worker
    bool            active;    // guarded by mu: the plan is valid
    bool            stop;      // guarded by mu
    bool            busy;      // guarded by mu: the worker is filling a slot
    size_t          next_fill; // guarded by mu
    uint64_t        gen;       // guarded by mu: bumped when a plan is abandoned
    pthread_t       thread;
    bool            thread_started;
    bool            sync_init;
};

dt_loader_opts dt_loader_opts_default(void) {
    return (dt_loader_opts){
        .batch_size   = 64,
        .drop_last    = false,
        .prefetch     = true,
        .caller_helps = true,
        .timeout_ms   = 60000,
    };
}

static void fill_slot(const dt_loader *l, slot *sl, size_t k) {
    size_t B     = l->o.batch_size;
    size_t start = l->first + k * B;
    size_t size  = l->order_len - start < B ? l->order_len - start : B;
    memcpy(sl->idx, l->order + start, size * sizeof *sl->idx);
    sl->st = dt_dataset_gather_at(l->ds, l->epoch, sl->idx, size, sl->x, sl->y, sl->t);
    if (sl->st) // the message is this thread's: keep it for the caller's
        snprintf(sl->msg, sizeof sl->msg, "%s", dt_last_error());
    sl->size  = size;
    sl->batch = k;
}

static bool has_work(const dt_loader *l) {
    return l->active && l->next_fill < l->nbatches && l->slots[l->next_fill % 2].state == SLOT_FREE;
}

static void *worker(void *arg) {
    dt_loader *l = arg;
    pthread_setname_np(pthread_self(), "dt-loader"); // for top -H, gdb and traces
    pthread_mutex_lock(&l->mu);
    for (;;) {
        // Idle until there is work or a stop; both are signalled, so this wait needs
        // no deadline (the caller's waits have theirs).
        while (!l->stop && !has_work(l))
            pthread_cond_wait(&l->cv_work, &l->mu);
        if (l->stop)
            break;
        size_t   k   = l->next_fill++;
        slot    *sl  = &l->slots[k % 2];
        uint64_t gen = l->gen;
        sl->state    = SLOT_FILLING;
        l->busy      = true;
        pthread_mutex_unlock(&l->mu);

        DT_TRACE_BEGIN(tr);
        fill_slot(l, sl, k);
        DT_TRACE_END(tr, "data", "prepare batch", "batch", k);

        pthread_mutex_lock(&l->mu);
        l->busy   = false;
        sl->state = gen == l->gen ? SLOT_READY : SLOT_FREE;
        pthread_cond_broadcast(&l->cv_ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static bool alloc_slots(dt_loader *l) {
    size_t B = l->o.batch_size, nx, nt, te = l->ds->target_elems;
    if (!dt_size_mul(&nx, B, l->elems) || !dt_size_mul(&nx, nx, sizeof(float)) ||
        !dt_size_mul(&nt, B, te) || !dt_size_mul(&nt, nt, sizeof(float))) {
        dt_fail(DT_ERR_ARG, "loader: batch of %zu samples of %zu floats overflows size_t", B,
                l->elems);
        return false;
    }
    for (int i = 0; i < 2; i++) {
        slot *sl = &l->slots[i];
        sl->x    = dt_alloc(nx);
        sl->y    = l->ds->has_labels ? dt_alloc(B * sizeof *sl->y) : NULL;
        sl->t    = te ? dt_alloc(nt) : NULL;
        sl->idx  = dt_alloc(B * sizeof *sl->idx);
        if (!sl->x || (l->ds->has_labels && !sl->y) || (te && !sl->t) || !sl->idx)
            return false;
    }
    return true;
}

static dt_loader *loader_create(const dt_dataset *ds, dt_sampler *sampler,
                                const dt_loader_opts *opts) {
    dt_loader_opts o = opts ? *opts : dt_loader_opts_default();
    if (o.batch_size < 1 || o.batch_size > (1u << 24)) {
        dt_fail(DT_ERR_ARG, "loader: expected a batch size in [1, %u], found %zu", 1u << 24,
                o.batch_size);
        return NULL;
    }
    if (o.timeout_ms <= 0)
        o.timeout_ms = dt_loader_opts_default().timeout_ms;
    if (sampler && dt_sampler_dataset_size(sampler) != ds->n) {
        dt_fail(DT_ERR_ARG,
                "loader: expected a sampler over the dataset's %zu samples, found "
                "one over %zu",
                ds->n, dt_sampler_dataset_size(sampler));
        return NULL;
    }
    dt_loader *l = dt_alloc_zero(sizeof *l);
    if (!l)
        return NULL;
    l->ds    = ds;
    l->o     = o;
    l->elems = ds->sample_elems;
    if (!l->elems) {
        dt_fail(DT_ERR_ARG, "loader: expected a dataset made by a dt_dataset constructor, found "
                            "one with no sample shape");
        goto fail;
    }
    l->sampler = sampler;
    l->status  = DT_OK;
    if (!sampler) {
        dt_sampler_opts so = dt_sampler_opts_default();
        so.shuffle         = false;
        l->own_sampler     = true;
        if (dt_sampler_new(&l->sampler, ds->n, &so) != DT_OK)
            goto fail;
    }
    if (!alloc_slots(l))
        goto fail;

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); // deadlines from dt_deadline_ns
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, &ca);
    pthread_cond_init(&l->cv_ready, &ca);
    pthread_condattr_destroy(&ca);
    l->sync_init = true;
    if (o.prefetch) {
        int e = pthread_create(&l->thread, NULL, worker, l);
        if (e) {
            errno = e;
            dt_fail_errno(DT_ERR_IO, "loader: cannot start the prefetch thread");
            goto fail;
        }
        l->thread_started = true;
    }
    return l;
fail:
    dt_loader_free(l); // records no error: the failure's message survives
    return NULL;
}

dt_status dt_loader_new(dt_loader **out, const dt_dataset *ds, dt_sampler *sampler,
                        const dt_loader_opts *opts) {
    *out = loader_create(ds, sampler, opts);
    if (*out)
        return DT_OK;
    dt_status st = dt_last_status();
    return st != DT_OK ? st : dt_fail(DT_ERR_STATE, "loader_create: failed without a message");
}

void dt_loader_free(dt_loader *l) {
    if (!l)
        return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL); // the worker stops after at most one batch
    }
    if (l->sync_init) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv_work);
        pthread_cond_destroy(&l->cv_ready);
    }
    for (int i = 0; i < 2; i++) {
        dt_free(l->slots[i].x);
        dt_free(l->slots[i].y);
        dt_free(l->slots[i].t);
        dt_free(l->slots[i].idx);
    }
    if (l->own_sampler)
        dt_sampler_free(l->sampler);
    dt_free(l);
}

size_t dt_loader_num_batches(const dt_loader *l) {
    size_t n = dt_sampler_num_samples(l->sampler), B = l->o.batch_size;
    return l->o.drop_last ? n / B : (n + B - 1) / B;
}

dt_status dt_loader_status(const dt_loader *l) {
    return l->status;
}

void dt_loader_begin_epoch(dt_loader *l, int64_t epoch) {
    // Abandon the previous plan and wait until the worker is off its slots; filling a
    // batch is bounded work, so this wait ends.
    pthread_mutex_lock(&l->mu);
    l->active = false;
    l->gen++;
    while (l->busy)
        pthread_cond_wait(&l->cv_ready, &l->mu);
    l->slots[0].state = l->slots[1].state = SLOT_FREE;
    l->next_fill                          = 0;
    pthread_mutex_unlock(&l->mu);

    if (epoch >= 0)
        dt_sampler_set_epoch(l->sampler, (uint64_t)epoch);
    dt_sampler_begin(l->sampler);
    l->order    = dt_sampler_indices(l->sampler, &l->order_len);
    l->first    = dt_sampler_position(l->sampler);
    l->epoch    = dt_sampler_epoch(l->sampler);
    size_t left = l->order_len - l->first, B = l->o.batch_size;
    l->nbatches  = l->o.drop_last ? left / B : (left + B - 1) / B;
    l->next_take = 0;
    l->holding   = false;
    l->status    = DT_OK;

    pthread_mutex_lock(&l->mu);
    l->active = true;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
}

static bool wait_ready(dt_loader *l, slot *sl, size_t k) {
    uint64_t deadline = dt_deadline_ns(l->o.timeout_ms);
    while (!(sl->state == SLOT_READY && sl->batch == k)) {
        int ms = dt_ms_left(deadline);
        if (ms <= 0)
            return false;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t at =
            (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
        ts.tv_sec  = (time_t)(at / 1000000000ull);
        ts.tv_nsec = (long)(at % 1000000000ull);
        pthread_cond_timedwait(&l->cv_ready, &l->mu, &ts);
    }
    return true;
}

bool dt_loader_next(dt_loader *l, dt_batch *b) {
    if (l->status != DT_OK) {
        dt_fail(l->status, "loader: the epoch already failed; call dt_loader_begin_epoch");
        return false;
    }
    pthread_mutex_lock(&l->mu);
    bool active = l->active;
    if (l->holding) {
        l->slots[(l->next_take - 1) % 2].state = SLOT_FREE;
        l->holding                             = false;
        pthread_cond_broadcast(&l->cv_work);
    }
    pthread_mutex_unlock(&l->mu);
    if (!active) {
        l->status = dt_fail(DT_ERR_STATE, "loader: expected dt_loader_begin_epoch before "
                                          "dt_loader_next, found none");
        return false;
    }
    if (l->next_take >= l->nbatches)
        return false;

    size_t k  = l->next_take;
    slot  *sl = &l->slots[k % 2];
    DT_TRACE_BEGIN(tr);
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        bool ok = true;
        if (l->o.caller_helps && l->next_fill == k && sl->state == SLOT_FREE) {
            // The worker has not started this batch (not scheduled yet, or its CPU is
            // busy): preparing it here costs no more than waiting for it would.
            l->next_fill++;
            sl->state = SLOT_FILLING;
            pthread_mutex_unlock(&l->mu);
            fill_slot(l, sl, k);
            pthread_mutex_lock(&l->mu);
            pthread_cond_broadcast(&l->cv_work); // batch k + 1 may be the worker's now
        } else {
            ok = wait_ready(l, sl, k);
        }
        if (ok)
            sl->state = SLOT_HELD;
        pthread_mutex_unlock(&l->mu);
        if (!ok) {
            l->status = dt_fail(DT_ERR_TIMEOUT,
                                "loader: expected batch %zu of %zu within %d ms, found it not "
                                "ready (prefetch thread stalled)",
                                k, l->nbatches, l->o.timeout_ms);
            return false;
        }
    } else {
        fill_slot(l, sl, k);
        sl->state = SLOT_HELD;
    }
    DT_TRACE_END(tr, "data", "wait for batch", "batch", k);
    l->holding = true;
    if (sl->st) { // the batch is not handed out, and the position does not move
        l->status = dt_fail(sl->st, "loader: batch %zu: %s", k, sl->msg);
        return false;
    }
    l->next_take++;
    dt_data_sampler_advance(l->sampler, sl->size);

    b->x            = sl->x;
    b->y            = sl->y;
    b->t            = sl->t;
    b->t_elems      = l->ds->target_elems;
    b->indices      = sl->idx;
    b->size         = sl->size;
    b->h            = l->ds->h;
    b->w            = l->ds->w;
    b->sample_elems = l->elems;
    b->ndim         = l->ds->ndim;
    memcpy(b->shape, l->ds->shape, sizeof b->shape);
    b->index = l->first / l->o.batch_size + k;
    return true;
}
