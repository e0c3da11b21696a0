// zero3.c: ZeRO stage 3 (zero.h): parameters and gradients sharded over the ranks,
// each unit gathered just before a step of a pass reads it and given back after.
//
// Layout. Rank r owns floats [own[r], own[r + 1]) of both flat buffers: whole pages,
// so that everything else can be given back page by page (dt_params_discard) while the
// layers keep their views into the buffers. A unit is a run of tensors; its segments
// are its intersections with the ranks' ranges. Gathering a unit is one broadcast per
// segment from its owner, in place; reducing its gradients is one reduce (sum) per
// segment to its owner, in place: the owner's range accumulates every contribution
// (several micro-batches, both uses of a tied tensor), and dt_zero_sync divides by N.
//
// A unit's state within a pass:
//   held        its parameters are gathered (or the gather is in flight: gw)
//   prefetched  held ahead for a later step (kept when a step needs other units)
//   in_use      between a step's ACQUIRE and RELEASE
//   dirty       backward wrote its gradients since its last reduction
//   reducing    that reduction is in flight (rw); afterwards the gradients outside
//               this rank's range are zeroed and their pages given back
// Units are released lazily: when a step needs other units (or a backward pass ends),
// not at RELEASE, so consecutive steps on one unit (a LayerNorm and the Linear after
// it) gather it once. `live` counts the whole units held and the gradients not yet
// reduced; it and every decision built on it (prefetch, waiting for reductions) are
// the same on every rank, so all ranks issue the same collectives in the same order.
#include "dtrain/trace.h"
#include "zero_impl.h"

#include <string.h>

#define MAX_REDUCING 2 // reductions in flight before the oldest is waited for

typedef struct zseg {
    size_t lo, hi;
    int    root;
} zseg;

typedef struct zunit {
    size_t    a, c; // floats [a, a + c)
    int       seg0, nseg;
    bool      held, prefetched, in_use, dirty, reducing;
    dt_work **gw, **rw; // [nseg] operations in flight (into z3->works)
} zunit;

struct zero3 {
    size_t   *own; // [world + 1]
    size_t    lo, hi, numel;
    zunit    *u;
    int       nu;
    zseg     *segs;
    int       nsegs;
    dt_work **works; // 2 * nsegs
    int      *tunit; // [ntensors]
    int      *need;  // [nu] the units of the current step
    // The pass: its kind, its steps so far, and the order of units the first pass of
    // each kind recorded (the first unit of each step), which prefetch follows.
    bool bwd, recording, diverged;
    int  ev;
    int *rec[2], nrec[2], caprec[2];
    bool recorded[2];
    int *fifo, nfifo; // units being reduced, oldest first
    // Accounting (dt_zero_usage).
    size_t  live, live_peak, limit, res_peak;
    int64_t gathers, prefetches, reductions, over_limit;
    bool    track;
};

// ------------------------------------------------------------------------ layout

void dt_zero3_ranges(const dt_params *p, int world, size_t align, size_t *own) {
    size_t n = dt_params_numel(p);
    if (!align)
        align = dt_page_bytes() / sizeof(float);
    own[0] = 0;
    for (int r = 1; r < world; r++) {
        size_t b = (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)world) / align * align;
        own[r]   = b > own[r - 1] ? b : own[r - 1];
    }
    own[world] = n;
}

// Walks the tensors in order: a node's tensors (one `layer`) stay together, a tensor
// of no node (layer -1) stands alone, and a unit closes once it holds min floats; a
// last unit below that joins the one before. Returns the number of units; with u, also
// their ranges, and with tunit each tensor's unit.
static int plan_units(const dt_params *p, size_t min, zunit *u, int *tunit) {
    int    nt = dt_params_count(p), nu = 0;
    size_t a = 0, c = 0;
    for (int t = 0; t < nt; t++) {
        const dt_param_info *pi = dt_params_info(p, t);
        c += pi->count;
        if (tunit)
            tunit[t] = nu;
        const dt_param_info *next      = dt_params_info(p, t + 1);
        bool                 same_node = next && pi->layer >= 0 && next->layer == pi->layer;
        if (!same_node && c >= min) {
            if (u)
                u[nu] = (zunit){.a = a, .c = c};
            nu++, a += c, c = 0;
        }
    }
    if (c && nu) { // the short tail joins the last unit
        if (u)
            u[nu - 1].c += c;
        for (int t = nt - 1; tunit && t >= 0 && tunit[t] == nu; t--)
            tunit[t] = nu - 1;
    } else if (c) {
        if (u)
            u[nu] = (zunit){.a = a, .c = c};
        nu++;
    }
    return nu;
}

static size_t unit_floats(size_t unit_bytes) {
    return (unit_bytes ? unit_bytes : (size_t)64 << 10) / sizeof(float);
}

size_t dt_zero3_largest_unit(const dt_params *p, size_t unit_bytes) {
    int    n   = dt_params_count(p) ? plan_units(p, unit_floats(unit_bytes), NULL, NULL) : 0;
    zunit *u   = dt_alloc(sizeof(zunit) * (size_t)(n ? n : 1));
    size_t big = 0;
    if (u && n)
        plan_units(p, unit_floats(unit_bytes), u, NULL);
    for (int i = 0; u && i < n; i++)
        big = u[i].c > big ? u[i].c : big;
    dt_free(u);
    return big;
}

// ----------------------------------------------------------------------- pages

// Whether floats [x, y) may be zeroed and given back: outside this rank's range and in
// no unit whose parameters are held (or, for gradients, dirty or being reduced).
static bool span_free(const zero3 *s, bool grads, size_t x, size_t y) {
    if (x >= y)
        return true;
    if (x < s->hi && s->lo < y)
        return false;
    int lo = 0, hi = s->nu - 1; // the unit holding x
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->u[mid].a <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int i = lo; i < s->nu && s->u[i].a < y; i++) {
        const zunit *u = &s->u[i];
        if (grads ? u->dirty || u->reducing : u->held)
            return false;
    }
    return true;
}

// Floats [x, y) of a unit, outside this rank's range, are needed no more: zeroed and
// their pages given back, the edges extended to whole pages where nothing else there
// is needed either.
static void drop_span(dt_zero *z, bool grads, size_t x, size_t y) {
    zero3 *s  = z->z3;
    size_t pf = dt_page_bytes() / sizeof(float);
    if (x >= y)
        return;
    size_t x0 = x / pf * pf, y1 = (y + pf - 1) / pf * pf;
    if (y1 > s->numel)
        y1 = s->numel;
    if (span_free(s, grads, x0, x))
        x = x0;
    if (span_free(s, grads, y, y1))
        y = y1;
    dt_params_discard(z->p, grads, x, y - x);
}

static void drop_unit(dt_zero *z, const zunit *u, bool grads) {
    zero3 *s = z->z3;
    size_t e = u->a + u->c;
    drop_span(z, grads, u->a, e < s->lo ? e : s->lo);
    drop_span(z, grads, u->a > s->hi ? u->a : s->hi, e);
}

static void measure(dt_zero *z) {
    zero3 *s = z->z3;
    if (s->live > s->live_peak)
        s->live_peak = s->live;
    if (!s->track)
        return;
    size_t r =
        dt_params_resident(z->p, false, 0, s->numel) + dt_params_resident(z->p, true, 0, s->numel);
    if (r > s->res_peak)
        s->res_peak = r;
}

// ------------------------------------------------------------------ operations

static dt_status fail(dt_zero *z, dt_status st) {
    if (z->err == DT_OK) {
        z->err = st;
        snprintf(z->errmsg, sizeof z->errmsg, "%s", dt_last_error());
    }
    dt_pg_abort(z->pg, dt_last_error());
    return st;
}

// Waits for and frees a unit's operations (gathers or reductions).
static dt_status wait_ops(dt_zero *z, zunit *u, bool gathers, int ui) {
    dt_work **w  = gathers ? u->gw : u->rw;
    dt_status st = DT_OK;
    double    t0 = dt_now();
    for (int i = 0; i < u->nseg; i++) {
        if (!w[i])
            continue;
        dt_status s2 = dt_work_wait(w[i]);
        dt_work_free(w[i]);
        w[i] = NULL;
        if (st == DT_OK && s2 != DT_OK)
            st = dt_fail_context("zero-3: %s of unit %d (floats %zu..%zu)",
                                 gathers ? "gather" : "reduction", ui, u->a, u->a + u->c);
    }
    if (gathers)
        z->gather_s += dt_now() - t0;
    else
        z->wait_s += dt_now() - t0;
    return st == DT_OK ? DT_OK : fail(z, st);
}

static dt_status start_gather(dt_zero *z, int ui, bool prefetch) {
    zero3 *s = z->z3;
    zunit *u = &s->u[ui];
    float *d = dt_params_data(z->p);
    DT_TRACE_BEGIN(tr);
    for (int i = 0; i < u->nseg; i++) {
        const zseg *g = &s->segs[u->seg0 + i];
        dt_status   st =
            dt_pg_broadcast_async(z->pg, d + g->lo, g->hi - g->lo, DT_FLOAT32, g->root, &u->gw[i]);
        if (st != DT_OK)
            return fail(z, dt_fail_context("zero-3: gather of unit %d", ui));
        if (g->root != z->rank)
            z->moved += (double)(g->hi - g->lo);
    }
    DT_TRACE_END(tr, "zero", prefetch ? "prefetch" : "gather", "unit", ui);
    u->held = true;
    s->live += u->c;
    s->gathers++;
    s->prefetches += prefetch;
    return DT_OK;
}

// Gives a unit's parameters back (after its gathers finish), and starts reducing its
// gradients when backward wrote them.
static dt_status release_unit(dt_zero *z, int ui) {
    zero3 *s = z->z3;
    zunit *u = &s->u[ui];
    if (u->held) {
        DT_TRY(wait_ops(z, u, true, ui));
        u->held = u->prefetched = false;
        s->live -= u->c;
        drop_unit(z, u, false);
    }
    if (!u->dirty)
        return DT_OK;
    float *g = dt_params_grads(z->p);
    DT_TRACE_BEGIN(tr);
    for (int i = 0; i < u->nseg; i++) {
        const zseg *sg   = &s->segs[u->seg0 + i];
        bool        mine = sg->root == z->rank;
        dt_status   st =
            dt_pg_reduce_async(z->pg, g + sg->lo, mine ? g + sg->lo : NULL, sg->hi - sg->lo,
                               DT_FLOAT32, DT_REDUCE_SUM, sg->root, &u->rw[i]);
        if (st != DT_OK)
            return fail(z, dt_fail_context("zero-3: reduction of unit %d", ui));
        if (!mine)
            z->moved += (double)(sg->hi - sg->lo);
    }
    DT_TRACE_END(tr, "zero", "reduce", "unit", ui);
    u->dirty = false, u->reducing = true;
    s->fifo[s->nfifo++] = ui;
    s->reductions++;
    return DT_OK;
}

// Waits for unit ui's reduction; its gradients outside this rank's range go back.
static dt_status reap(dt_zero *z, int ui) {
    zero3 *s = z->z3;
    zunit *u = &s->u[ui];
    if (!u->reducing)
        return DT_OK;
    dt_status st = wait_ops(z, u, false, ui);
    u->reducing  = false;
    s->live -= u->c;
    for (int i = 0; i < s->nfifo; i++)
        if (s->fifo[i] == ui) {
            memmove(s->fifo + i, s->fifo + i + 1, sizeof(int) * (size_t)(s->nfifo - i - 1));
            s->nfifo--;
            break;
        }
    if (st == DT_OK)
        drop_unit(z, u, true);
    return st;
}

static dt_status reap_all(dt_zero *z) {
    dt_status st = DT_OK;
    while (z->z3->nfifo) {
        dt_status s2 = reap(z, z->z3->fifo[0]);
        st           = st != DT_OK ? st : s2;
    }
    return st;
}

dt_status dt_zero3_settle(dt_zero *z) {
    zero3    *s  = z->z3;
    dt_status st = DT_OK;
    for (int i = 0; i < s->nu; i++) {
        s->u[i].in_use = false;
        if (st == DT_OK && (s->u[i].held || s->u[i].dirty))
            st = release_unit(z, i);
    }
    dt_status s2 = reap_all(z);
    return st != DT_OK ? st : s2;
}

// ------------------------------------------------------------------- the passes

static bool in_set(const int *set, int n, int x) {
    for (int i = 0; i < n; i++)
        if (set[i] == x)
            return true;
    return false;
}

// The first unit of a later step of the recorded pass that this step does not use.
static int next_unit(const zero3 *s, const int *need, int nn) {
    if (!s->recorded[s->bwd] || s->diverged)
        return -1;
    for (int k = s->ev; k < s->nrec[s->bwd]; k++)
        if (!in_set(need, nn, s->rec[s->bwd][k]))
            return s->rec[s->bwd][k];
    return -1;
}

static dt_status record(zero3 *s, int unit) {
    int b = s->bwd, k = s->ev++;
    if (s->recording) {
        if (s->nrec[b] == s->caprec[b]) {
            int  cap = s->caprec[b] ? 2 * s->caprec[b] : 64;
            int *r   = dt_alloc(sizeof(int) * (size_t)cap);
            if (!r)
                return DT_ERR_NOMEM;
            if (s->nrec[b])
                memcpy(r, s->rec[b], sizeof(int) * (size_t)s->nrec[b]);
            dt_free(s->rec[b]);
            s->rec[b] = r, s->caprec[b] = cap;
        }
        s->rec[b][s->nrec[b]++] = unit;
    } else if (k >= s->nrec[b] || s->rec[b][k] != unit) {
        s->diverged = true; // this pass differs from the recorded one: no more prefetch
    }
    return DT_OK;
}

static dt_status acquire(dt_zero *z, const int *t, int n) {
    zero3 *s    = z->z3;
    int   *need = s->need, nn = 0;
    for (int i = 0; i < n; i++)
        if (!in_set(need, nn, s->tunit[t[i]]))
            need[nn++] = s->tunit[t[i]];
    if (!nn)
        return DT_OK;
    DT_TRY(record(s, need[0]));
    // Units this step does not read go (their gradients start reducing).
    for (int i = 0; i < s->nu; i++) {
        zunit *u = &s->u[i];
        if ((u->held || u->dirty) && !u->in_use && !u->prefetched && !in_set(need, nn, i))
            DT_TRY(release_unit(z, i));
    }
    while (s->nfifo > MAX_REDUCING)
        DT_TRY(reap(z, s->fifo[0]));
    for (int j = 0; j < nn; j++) {
        zunit *u = &s->u[need[j]];
        if (s->bwd && u->reducing) // its last reduction reads what backward adds to
            DT_TRY(reap(z, need[j]));
        size_t cost = (u->held ? 0 : u->c) + (s->bwd && !u->dirty ? u->c : 0);
        while (s->limit && s->live + cost > s->limit && s->nfifo)
            DT_TRY(reap(z, s->fifo[0]));
        if (s->limit && s->live + cost > s->limit)
            s->over_limit++;
        if (!u->held)
            DT_TRY(start_gather(z, need[j], false));
        DT_TRY(wait_ops(z, u, true, need[j]));
        u->prefetched = false, u->in_use = true;
        if (s->bwd && !u->dirty)
            u->dirty = true, s->live += u->c;
    }
    int w = next_unit(s, need, nn);
    if (w >= 0 && !s->u[w].held && (!s->limit || s->live + s->u[w].c <= s->limit)) {
        DT_TRY(start_gather(z, w, true));
        s->u[w].prefetched = true;
    }
    measure(z);
    return DT_OK;
}

static dt_status on_use(void *user, dt_param_use what, bool backward, const int *t, int n) {
    dt_zero *z = user;
    zero3   *s = z->z3;
    if (z->err != DT_OK)
        return dt_fail(z->err, "%s", z->errmsg);
    switch (what) {
    case DT_USE_BEGIN:
        s->bwd = backward, s->ev = 0, s->diverged = false;
        s->recording = !s->recorded[backward];
        if (s->recording)
            s->nrec[backward] = 0;
        for (int i = 0; i < s->nu; i++) // what an earlier pass fetched ahead is plain held
            s->u[i].prefetched = false;
        return DT_OK;
    case DT_USE_ACQUIRE:
        return acquire(z, t, n);
    case DT_USE_RELEASE:
        for (int i = 0; i < n; i++)
            s->u[s->tunit[t[i]]].in_use = false;
        measure(z); // backward has written the gradients: the peak of a step
        return DT_OK;
    case DT_USE_END:
        if (s->recording)
            s->recorded[backward] = true, s->recording = false;
        if (!backward) // a backward usually follows, starting where this pass ended
            return DT_OK;
        for (int i = 0; i < s->nu; i++) {
            s->u[i].in_use = false;
            if (s->u[i].held || s->u[i].dirty)
                DT_TRY(release_unit(z, i));
        }
        return DT_OK;
    }
    return DT_OK;
}

// ------------------------------------------------------------ sync, gather, release

dt_status dt_zero3_sync(dt_zero *z) {
    zero3    *s  = z->z3;
    double    t0 = dt_now();
    dt_status st = z->err != DT_OK ? dt_fail(z->err, "%s", z->errmsg) : dt_zero3_settle(z);
    if (st != DT_OK)
        return st;
    float *g   = dt_params_grads(z->p);
    float  inv = 1.0f / (float)z->world; // the owner's range holds the sum over ranks
    for (size_t i = s->lo; i < s->hi; i++)
        g[i] *= inv;
    z->wait_s += dt_now() - t0;
    return DT_OK;
}

dt_status dt_zero3_params_gather(dt_zero *z, int root) {
    zero3 *s = z->z3;
    DT_TRY(dt_zero3_settle(z));
    float    *d  = dt_params_data(z->p);
    dt_status st = DT_OK;
    for (int r = 0; st == DT_OK && r < z->world; r++) {
        size_t lo = s->own[r], n = s->own[r + 1] - lo;
        if (!n || r == root)
            continue;
        if (root < 0)
            st = dt_pg_broadcast(z->pg, d + lo, n, DT_FLOAT32, r);
        else if (z->rank == r)
            st = dt_pg_send(z->pg, d + lo, n, DT_FLOAT32, root, 0x7a33);
        else if (z->rank == root)
            st = dt_pg_recv(z->pg, d + lo, n, DT_FLOAT32, r, 0x7a33);
        if (st != DT_OK)
            st = fail(z, dt_fail_context("zero-3: gathering rank %d's parameters", r));
    }
    return st;
}

dt_status dt_zero3_params_release(dt_zero *z) {
    zero3 *s = z->z3;
    DT_TRY(dt_zero3_settle(z));
    DT_TRY(dt_params_discard(z->p, false, 0, s->lo));
    return dt_params_discard(z->p, false, s->hi, s->numel - s->hi);
}

void dt_zero3_usage(const dt_zero *z, dt_zero_usage *out) {
    const zero3 *s = z->z3;
    size_t       nf;
    dt_optim_state(z->opt, &nf);
    out->shard_floats        = s->hi - s->lo;
    out->state_bytes         = sizeof(float) * (2 * (s->hi - s->lo) + nf);
    out->live_peak_bytes     = sizeof(float) * s->live_peak;
    out->resident_peak_bytes = s->track ? s->res_peak + sizeof(float) * nf : 0;
    out->gathers             = s->gathers;
    out->prefetches          = s->prefetches;
    out->reductions          = s->reductions;
    out->over_limit          = s->over_limit;
}

// -------------------------------------------------------------------- set-up

dt_status dt_zero3_init(dt_zero *z, size_t *lo, size_t *hi) {
    if (!dt_params_announces_use(z->p))
        return dt_fail(DT_ERR_ARG,
                       "zero: stage 3 expected parameters whose provider announces each use "
                       "(dt_params_use: a dt_graph does), found a provider that does not (a "
                       "dt_model, or hand-written buffers: use stage 1 or 2)");
    zero3 *s = z->z3 = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->numel = dt_params_numel(z->p);
    s->limit = z->o.max_live_bytes / sizeof(float);
    s->track = z->o.track_resident;
    s->own   = dt_alloc(sizeof(size_t) * (size_t)(z->world + 1));
    s->tunit = dt_alloc(sizeof(int) * (size_t)(z->ntensors ? z->ntensors : 1));
    int nu   = z->ntensors ? plan_units(z->p, unit_floats(z->o.unit_bytes), NULL, NULL) : 0;
    s->u     = dt_alloc_zero(sizeof(zunit) * (size_t)(nu ? nu : 1));
    s->fifo  = dt_alloc(sizeof(int) * (size_t)(nu ? nu : 1));
    s->need  = dt_alloc(sizeof(int) * (size_t)(nu ? nu : 1));
    if (!s->own || !s->tunit || !s->u || !s->fifo || !s->need)
        return DT_ERR_NOMEM;
    dt_zero3_ranges(z->p, z->world, z->o.shard_align, s->own);
    s->lo = *lo = s->own[z->rank], s->hi = *hi = s->own[z->rank + 1];
    if (nu)
        s->nu = plan_units(z->p, unit_floats(z->o.unit_bytes), s->u, s->tunit);
    for (int i = 0; i < s->nu; i++) // segments: one per rank whose range the unit meets
        for (int r = 0; r < z->world; r++)
            s->nsegs += s->u[i].a < s->own[r + 1] && s->own[r] < s->u[i].a + s->u[i].c;
    s->segs  = dt_alloc(sizeof(zseg) * (size_t)(s->nsegs ? s->nsegs : 1));
    s->works = dt_alloc_zero(sizeof(dt_work *) * 2 * (size_t)(s->nsegs ? s->nsegs : 1));
    if (!s->segs || !s->works)
        return DT_ERR_NOMEM;
    for (int i = 0, k = 0; i < s->nu; i++) {
        zunit *u = &s->u[i];
        u->seg0  = k;
        for (int r = 0; r < z->world; r++) {
            size_t a = u->a > s->own[r] ? u->a : s->own[r];
            size_t e = u->a + u->c < s->own[r + 1] ? u->a + u->c : s->own[r + 1];
            if (a < e)
                s->segs[k++] = (zseg){a, e, r};
        }
        u->nseg = k - u->seg0;
        u->gw   = s->works + u->seg0;
        u->rw   = s->works + s->nsegs + u->seg0;
    }
    // Everything outside this rank's range goes back; zero_grad gives pages back too.
    DT_TRY(dt_params_discard(z->p, false, 0, s->lo));
    DT_TRY(dt_params_discard(z->p, false, s->hi, s->numel - s->hi));
    DT_TRY(dt_params_discard(z->p, true, 0, s->numel));
    dt_params_set_discard_grads(z->p, true);
    DT_TRY(dt_params_set_use_hook(z->p, on_use, z));
    z->hooked = true;
    return DT_OK;
}

void dt_zero3_free(dt_zero *z) {
    zero3 *s = z->z3;
    if (!s)
        return;
    for (int i = 0; s->works && i < 2 * s->nsegs; i++)
        if (s->works[i])
            dt_work_wait(s->works[i]), dt_work_free(s->works[i]);
    if (z->hooked) {
        dt_params_set_use_hook(z->p, NULL, NULL);
        dt_params_set_discard_grads(z->p, false);
        z->hooked = false;
    }
    dt_free(s->own), dt_free(s->tunit), dt_free(s->u), dt_free(s->fifo), dt_free(s->need);
    dt_free(s->segs), dt_free(s->works), dt_free(s->rec[0]), dt_free(s->rec[1]);
    dt_free(s);
    z->z3 = NULL;
}
