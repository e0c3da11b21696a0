// ps.c: the synchronous parameter server (ps.h). Servers and workers meet only through
// the world group's send/recv, in a fixed order on each side, so a step's messages can
// never cross: a worker sends to servers 0..S-1 and then receives from them in the same
// order; a server receives from workers 0..W-1 and then sends to them in that order.
#include "parallel/ps.h"

#include "dtrain/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAG_INIT   0x70730001 // "ps": worker 0's parameters for a server's range
#define TAG_CTRL   0x70730002 // a worker's control message: {op, step, groups, lr bits...}
#define TAG_GRAD   0x70730003 // a worker's gradient slice
#define TAG_PARAM  0x70730004 // a server's updated range
#define OP_STEP    1
#define OP_DONE    2
#define OP_STATE   3          // the servers' optimizer state to every worker (a checkpoint)
#define OP_PULL    4          // async: a worker has pushed to every server; reply when in bound
#define OP_FETCH   5          // async: the range as it is now (the workers, all at one step)
#define TAG_STATE  0x70730005 // a range of the optimizer's state: step count, then blocks
#define MAX_GROUPS 16

struct dt_ps {
    dt_params *p;
    dt_optim  *opt;
    dt_pg     *world;
    int        rank, workers, servers, ngroups;
    size_t     n;     // floats in the flat parameters
    dt_params *shard; // a server's range as a table (dt_optim_shard)
    int       *piece_src;
    size_t    *piece_flat;
    float     *tmp; // a server's receive buffer for workers 1..W-1
    int64_t    step;
    double     wait_s;    // a worker's seconds in push_pull (sends, the servers' step, receives)
    int        staleness; // 0: synchronous; K: asynchronous, at most K steps ahead
    int        slow_ms;   // a worker: DT_PS_SLOW_WORKER's delay before each push (tests)
    bool       settled;   // a worker: no push since its last dt_ps_pull_params (or none yet)
};

// Server s's range of the n flat floats.
static void range_of(const dt_ps *ps, int s, size_t *lo, size_t *hi) {
    *lo = ps->n * (size_t)s / (size_t)ps->servers;
    *hi = ps->n * (size_t)(s + 1) / (size_t)ps->servers;
}

// The server's range [lo, hi) as pieces of the table's tensors, for dt_optim_shard.
static dt_status build_shard(dt_ps *ps, size_t lo, size_t hi) {
    int nt         = dt_params_count(ps->p);
    ps->piece_src  = dt_alloc(sizeof(int) * (size_t)(nt ? nt : 1));
    ps->piece_flat = dt_alloc(sizeof(size_t) * (size_t)(nt ? nt : 1));
    if (!ps->piece_src || !ps->piece_flat)
        return DT_ERR_NOMEM;
    DT_TRY(dt_params_new(&ps->shard, NULL));
    int k = 0;
    for (int t = 0; t < nt; t++) {
        const dt_param_info *pi = dt_params_info(ps->p, t);
        size_t               a  = pi->offset > lo ? pi->offset : lo;
        size_t               e  = pi->offset + pi->count < hi ? pi->offset + pi->count : hi;
        if (a >= e)
            continue;
        int64_t shape[1] = {(int64_t)(e - a)};
        DT_TRY(dt_params_add(ps->shard, pi->name, 1, shape, pi->flags));
        ps->piece_src[k] = t, ps->piece_flat[k] = a, k++;
    }
    return dt_optim_shard(ps->opt, ps->shard, ps->piece_src, ps->piece_flat);
}

// Every rank must describe the same table (a server steps what workers compute).
static dt_status check_table(dt_ps *ps) {
    int      world   = ps->workers + ps->servers;
    int64_t  mine[2] = {(int64_t)ps->n, ps->ngroups};
    int64_t *all     = dt_alloc(sizeof(int64_t) * 2 * (size_t)world);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status s = dt_pg_all_gather(ps->world, mine, all, 2, DT_INT64);
    for (int r = 0; s == DT_OK && r < world; r++)
        if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
            s = dt_fail(DT_ERR_MISMATCH,
                        "ps: expected the same parameters on every rank, found %lld floats in "
                        "%lld optimizer groups on rank %d and %lld in %lld on rank %d",
                        (long long)mine[0], (long long)mine[1], ps->rank, (long long)all[2 * r],
                        (long long)all[2 * r + 1], r);
    dt_free(all);
    return s;
}

// The optimizer's state as blocks of `per` floats (one per parameter per block: Adam's
// two moments, Adadelta's two averages, SGD's momentum; none for plain SGD).
static dt_status state_blocks(dt_ps *ps, size_t per, float **st, size_t *nb) {
    size_t nf = 0;
    *st       = dt_optim_state(ps->opt, &nf);
    *nb       = per ? nf / per : 0;
    if (per && *nb * per != nf)
        return dt_fail(DT_ERR_INTERNAL,
                       "ps: expected the optimizer's state in blocks of %zu "
                       "floats, found %zu floats",
                       per, nf);
    return DT_OK;
}

// One server's range of the optimizer's state between a worker (the whole table's
// blocks, at lo) and the server (its range's blocks): the step count, then each block.
static dt_status move_state(dt_ps *ps, bool send, int peer, size_t lo, size_t hi) {
    bool    server = dt_ps_is_server(ps);
    float  *st;
    size_t  nb, per = server ? hi - lo : ps->n, at = server ? 0 : lo;
    int64_t steps = dt_optim_step_count(ps->opt);
    DT_TRY(state_blocks(ps, per, &st, &nb));
    if (send)
        DT_TRY(dt_pg_send(ps->world, &steps, 1, DT_INT64, peer, TAG_STATE));
    else {
        DT_TRY(dt_pg_recv(ps->world, &steps, 1, DT_INT64, peer, TAG_STATE));
        DT_TRY(dt_optim_set_step_count(ps->opt, steps)); // refuses a negative count
    }
    for (size_t b = 0; b < nb; b++)
        DT_TRY(
            send ? dt_pg_send(ps->world, st + b * per + at, hi - lo, DT_FLOAT32, peer, TAG_STATE)
                 : dt_pg_recv(ps->world, st + b * per + at, hi - lo, DT_FLOAT32, peer, TAG_STATE));
    return DT_OK;
}

dt_status dt_ps_new(dt_ps **out, dt_params *p, dt_optim *opt, dt_pg *world, int servers,
                    int staleness) {
    *out     = NULL;
    int size = dt_pg_size(world);
    if (staleness < 0)
        return dt_fail(DT_ERR_ARG,
                       "--ps-staleness %d: expected 0 (synchronous) or a bound K >= 1 on how "
                       "many steps a worker may run ahead of the slowest",
                       staleness);
    if (servers < 1 || servers >= size)
        return dt_fail(DT_ERR_ARG,
                       "--ps %d: expected 1 to %d servers (the world has %d ranks "
                       "and needs a worker)",
                       servers, size - 1, size);
    if (dt_params_numel(p) < (size_t)servers)
        return dt_fail(DT_ERR_ARG, "--ps %d: expected at most %zu servers (one float each)",
                       servers, dt_params_numel(p));
    if (dt_optim_num_groups(opt) > MAX_GROUPS)
        return dt_fail(DT_ERR_ARG, "--ps: expected at most %d optimizer groups, found %d",
                       MAX_GROUPS, dt_optim_num_groups(opt));
    dt_ps *ps = dt_alloc_zero(sizeof *ps);
    if (!ps)
        return dt_fail_context("the parameter server");
    *ps              = (dt_ps){.p         = p,
                               .opt       = opt,
                               .world     = world,
                               .rank      = dt_pg_rank(world),
                               .workers   = size - servers,
                               .servers   = servers,
                               .ngroups   = dt_optim_num_groups(opt),
                               .n         = dt_params_numel(p),
                               .staleness = staleness,
                               .settled   = true};
    const char *slow = getenv("DT_PS_SLOW_WORKER"); // "W:MS", worker W sleeps MS per push
    int         sw = -1, sms = 0;
    if (slow && staleness && sscanf(slow, "%d:%d", &sw, &sms) == 2 && sw == ps->rank && sms > 0)
        ps->slow_ms = sms;
    dt_status st = check_table(ps);
    size_t    lo, hi;
    if (st == DT_OK && dt_ps_is_server(ps)) { // worker 0's parameters, the optimizer's range
        range_of(ps, ps->rank - ps->workers, &lo, &hi);
        st = build_shard(ps, lo, hi);
        if (st == DT_OK && !(ps->tmp = dt_alloc(sizeof(float) * (hi - lo + 1))))
            st = DT_ERR_NOMEM;
        if (st == DT_OK)
            st = dt_pg_recv(world, dt_params_data(p) + lo, hi - lo, DT_FLOAT32, 0, TAG_INIT);
        if (st == DT_OK) // a resumed run's state (a fresh one's zeros)
            st = move_state(ps, false, 0, lo, hi);
    } else if (st == DT_OK && ps->rank == 0) {
        for (int s = 0; st == DT_OK && s < servers; s++) {
            range_of(ps, s, &lo, &hi);
            st = dt_pg_send(world, dt_params_data(p) + lo, hi - lo, DT_FLOAT32, ps->workers + s,
                            TAG_INIT);
            if (st == DT_OK)
                st = move_state(ps, true, ps->workers + s, lo, hi);
        }
    }
    if (st != DT_OK) {
        dt_ps_free(ps);
        return st;
    }
    *out = ps;
    return DT_OK;
}

void dt_ps_free(dt_ps *ps) {
    if (!ps)
        return;
    dt_params_free(ps->shard);
    dt_free(ps->piece_src);
    dt_free(ps->piece_flat);
    dt_free(ps->tmp);
    dt_free(ps);
}

bool dt_ps_is_server(const dt_ps *ps) {
    return ps->rank >= ps->workers;
}

double dt_ps_bytes_per_step(const dt_ps *ps) {
    return ps ? 4.0 * (double)ps->n : 0;
}

// ------------------------------------------------------------------------- workers

// The control message of this step: {op, step, groups, each group's lr as its bits}.
static size_t ctrl_of(const dt_ps *ps, int64_t op, int64_t *c) {
    c[0] = op, c[1] = ps->step, c[2] = ps->ngroups;
    for (int g = 0; g < ps->ngroups; g++) {
        float   lr = op == OP_STEP ? dt_optim_group_lr(ps->opt, g) : 0; // ended: opt may be gone
        int32_t bits;
        memcpy(&bits, &lr, sizeof bits);
        c[3 + g] = bits;
    }
    return 3 + (size_t)ps->ngroups;
}

// The control message `op` to every server.
static dt_status tell_servers(dt_ps *ps, int64_t op) {
    int64_t c[3 + MAX_GROUPS];
    size_t  nc = ctrl_of(ps, op, c);
    for (int s = 0; s < ps->servers; s++)
        DT_TRY(dt_pg_send(ps->world, c, nc, DT_INT64, ps->workers + s, TAG_CTRL));
    return DT_OK;
}

// Every server's range of the parameters, into this worker's copy.
static dt_status recv_params(dt_ps *ps) {
    size_t lo, hi;
    for (int s = 0; s < ps->servers; s++) {
        range_of(ps, s, &lo, &hi);
        DT_TRY(dt_pg_recv(ps->world, dt_params_data(ps->p) + lo, hi - lo, DT_FLOAT32,
                          ps->workers + s, TAG_PARAM));
    }
    return DT_OK;
}

dt_status dt_ps_push_pull(dt_ps *ps) {
    if (ps->slow_ms) {
        struct timespec ts = {ps->slow_ms / 1000, (long)(ps->slow_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    double  t0 = dt_now();
    size_t  lo, hi;
    int64_t c[3 + MAX_GROUPS];
    size_t  nc = ctrl_of(ps, OP_STEP, c);
    for (int s = 0; s < ps->servers; s++) {
        range_of(ps, s, &lo, &hi);
        DT_TRY(dt_pg_send(ps->world, c, nc, DT_INT64, ps->workers + s, TAG_CTRL));
        DT_TRY(dt_pg_send(ps->world, dt_params_grads(ps->p) + lo, hi - lo, DT_FLOAT32,
                          ps->workers + s, TAG_GRAD));
    }
    // Async: a server replies once this worker has pushed to every server (so that no
    // server's reply waits on this worker's push to another: docs/ps.md) and is in bound.
    if (ps->staleness)
        DT_TRY(tell_servers(ps, OP_PULL));
    ps->settled = false;
    DT_TRY(recv_params(ps));
    ps->step++;
    ps->wait_s += dt_now() - t0;
    return DT_OK;
}

int64_t dt_ps_step(const dt_ps *ps) {
    return ps->step;
}

double dt_ps_wait_secs(const dt_ps *ps) {
    return ps ? ps->wait_s : 0;
}

dt_status dt_ps_pull_state(dt_ps *ps) {
    size_t lo, hi;
    DT_TRY(tell_servers(ps, OP_STATE));
    for (int s = 0; s < ps->servers; s++) {
        range_of(ps, s, &lo, &hi);
        DT_TRY(move_state(ps, false, ps->workers + s, lo, hi));
    }
    return DT_OK;
}

int dt_ps_staleness(const dt_ps *ps) {
    return ps ? ps->staleness : 0;
}

dt_status dt_ps_pull_params(dt_ps *ps) {
    if (!ps || !ps->staleness || dt_ps_is_server(ps))
        return DT_OK;
    DT_TRY(tell_servers(ps, OP_FETCH));
    DT_TRY(recv_params(ps));
    ps->settled = true;
    return DT_OK;
}

bool dt_ps_settled(const dt_ps *ps) {
    return !ps || ps->settled;
}

dt_status dt_ps_close(dt_ps *ps) {
    if (!ps || dt_ps_is_server(ps))
        return DT_OK;
    return tell_servers(ps, OP_DONE);
}

// ------------------------------------------------------------------------- servers

// Worker w's control message, checked (hostile until proven: the transport has
// authenticated the peer, not its arithmetic): a known op, the step this server
// expects, the optimizer's group count; lrs finite.
static dt_status recv_ctrl(dt_ps *ps, int w, int64_t step, bool pull, int64_t *op, float *lrs) {
    int64_t c[3 + MAX_GROUPS];
    DT_TRY(dt_pg_recv(ps->world, c, 3 + (size_t)ps->ngroups, DT_INT64, w, TAG_CTRL));
    bool known = pull ? c[0] == OP_PULL
                      : (c[0] == OP_STEP || c[0] == OP_DONE || c[0] == OP_STATE ||
                         (c[0] == OP_FETCH && ps->staleness));
    if (!known || c[1] != step || c[2] != ps->ngroups)
        return dt_fail(DT_ERR_PEER,
                       "ps: server rank %d expected worker %d's %s at step %lld (%d groups), found "
                       "op %lld at step %lld (%lld groups)",
                       ps->rank, w, pull ? "pull" : "push", (long long)step, ps->ngroups,
                       (long long)c[0], (long long)c[1], (long long)c[2]);
    *op = c[0];
    for (int g = 0; g < ps->ngroups; g++) {
        int32_t bits = (int32_t)c[3 + g];
        memcpy(&lrs[g], &bits, sizeof bits);
        if (!(lrs[g] >= 0 && lrs[g] < 1e30f))
            return dt_fail(DT_ERR_PEER, "ps: worker %d sent learning rate %g for group %d", w,
                           (double)lrs[g], g);
    }
    return DT_OK;
}

// ------------------------------------------------------------------ asynchronous

// The asynchronous server's view of its workers.
typedef struct async_w {
    int64_t applied; // pushes applied: the worker's next push is its step `applied`
    bool    pulling; // pushed; its pull (OP_PULL) comes next
    bool    held;    // pulled while too far ahead: its reply waits
    bool    done;
} async_w;

// The slowest worker still training (its pushes applied), or -1 when all are done.
static int slowest(const dt_ps *ps, const async_w *aw) {
    int m = -1;
    for (int w = 0; w < ps->workers; w++)
        if (!aw[w].done && (m < 0 || aw[w].applied < aw[m].applied))
            m = w;
    return m;
}

// Replies to every held worker that the slowest one's progress brought back in bound.
static dt_status release(dt_ps *ps, async_w *aw, const float *x, size_t len) {
    int m = slowest(ps, aw);
    for (int w = 0; w < ps->workers; w++)
        if (aw[w].held && (m < 0 || aw[w].applied - aw[m].applied <= ps->staleness)) {
            aw[w].held = false;
            DT_TRY(dt_pg_send(ps->world, x, len, DT_FLOAT32, w, TAG_PARAM));
        }
    return DT_OK;
}

// Worker w's push of its step aw[w].applied: its slice, a W-th of it applied at once with
// the workers' optimizer step (so that W pushes of one step move the range as the
// synchronous mean does, to first order).
static dt_status apply_push(dt_ps *ps, async_w *aw, int w, const float *lrs, size_t lo, size_t hi) {
    float *g = dt_params_grads(ps->p) + lo;
    DT_TRY(dt_pg_recv(ps->world, ps->tmp, hi - lo, DT_FLOAT32, w, TAG_GRAD));
    for (size_t i = 0; i < hi - lo; i++)
        g[i] = ps->tmp[i] / (float)ps->workers;
    for (int k = 0; k < ps->ngroups; k++)
        DT_TRY(dt_optim_set_group_lr(ps->opt, k, lrs[k]));
    int m = slowest(ps, aw);
    dt_log(
        DT_LOG_INFO, "ps",
        "server rank %d applied worker %d's step %lld (slowest: worker %d, %lld applied; bound %d)",
        ps->rank, w, (long long)aw[w].applied, m, (long long)aw[m].applied, ps->staleness);
    dt_optim_step(ps->opt);
    aw[w].applied++, aw[w].pulling = true;
    ps->step++;
    return DT_OK;
}

// Serves the workers in the order their messages arrive (dt_pg_wait_any, the list
// rotated after each so that none starves): pushes applied at once; a pull answered
// with the range as it is, unless the worker would then be more than K steps ahead of
// the slowest worker still training, in which case the reply waits for that worker's
// pushes (logged, naming both). The slowest is never held, so every hold ends; a held
// worker waits in its receive, bounded by the group's timeout.
static dt_status serve_async(dt_ps *ps) {
    size_t lo, hi;
    range_of(ps, ps->rank - ps->workers, &lo, &hi);
    const float *x    = dt_params_data(ps->p) + lo;
    async_w     *aw   = dt_alloc_zero(sizeof *aw * (size_t)ps->workers);
    int         *list = dt_alloc(sizeof(int) * (size_t)ps->workers);
    dt_status    st   = aw && list ? DT_OK : DT_ERR_NOMEM;
    float        lrs[MAX_GROUPS];
    for (int next = 0; st == DT_OK;) {
        int n = 0, w = -1;
        for (int i = 0; i < ps->workers; i++) {
            int v = (next + i) % ps->workers;
            if (!aw[v].done && !aw[v].held)
                list[n++] = v;
        }
        if (n == 0)
            break; // every worker said DONE (a held one never is the slowest: see release)
        if ((st = dt_pg_wait_any(ps->world, list, n, &w)) != DT_OK)
            break;
        next       = (w + 1) % ps->workers;
        int64_t op = 0;
        int64_t at = aw[w].pulling ? aw[w].applied - 1 : aw[w].applied;
        if ((st = recv_ctrl(ps, w, at, aw[w].pulling, &op, lrs)) != DT_OK)
            break;
        if (op == OP_STEP) {
            st = apply_push(ps, aw, w, lrs, lo, hi);
            if (st == DT_OK)
                st = release(ps, aw, x, hi - lo);
        } else if (op == OP_PULL) {
            aw[w].pulling = false;
            int m         = slowest(ps, aw);
            if (aw[w].applied - aw[m].applied <= ps->staleness)
                st = dt_pg_send(ps->world, x, hi - lo, DT_FLOAT32, w, TAG_PARAM);
            else {
                aw[w].held = true;
                dt_log(DT_LOG_INFO, "ps",
                       "server rank %d holds worker %d before its step %lld: %lld steps ahead "
                       "of worker %d (%lld applied), above --ps-staleness %d; waiting for "
                       "worker %d's next push",
                       ps->rank, w, (long long)aw[w].applied,
                       (long long)(aw[w].applied - aw[m].applied), m, (long long)aw[m].applied,
                       ps->staleness, m);
            }
        } else if (op == OP_STATE)
            st = move_state(ps, true, w, lo, hi);
        else if (op == OP_FETCH)
            st = dt_pg_send(ps->world, x, hi - lo, DT_FLOAT32, w, TAG_PARAM);
        else { // DONE: it no longer counts as the slowest
            aw[w].done = true;
            st         = release(ps, aw, x, hi - lo);
        }
    }
    dt_free(aw);
    dt_free(list);
    return st;
}

dt_status dt_ps_serve(dt_ps *ps) {
    if (ps->staleness)
        return serve_async(ps);
    size_t lo, hi;
    range_of(ps, ps->rank - ps->workers, &lo, &hi);
    float *g = dt_params_grads(ps->p) + lo, *x = dt_params_data(ps->p) + lo, lrs[MAX_GROUPS];
    for (;;) {
        int64_t first = 0;
        for (int w = 0; w < ps->workers; w++) {
            int64_t op = 0;
            DT_TRY(recv_ctrl(ps, w, ps->step, false, &op, lrs));
            if (w == 0)
                first = op;
            else if (op != first)
                return dt_fail(DT_ERR_PEER,
                               "ps: worker 0 sent op %lld at step %lld and worker %d op %lld",
                               (long long)first, (long long)ps->step, w, (long long)op);
            if (op != OP_STEP)
                continue;
            // The sum in worker order: worker 0's slice, then each other's added.
            DT_TRY(dt_pg_recv(ps->world, w ? ps->tmp : g, hi - lo, DT_FLOAT32, w, TAG_GRAD));
            for (size_t i = 0; w && i < hi - lo; i++)
                g[i] += ps->tmp[i];
        }
        if (first == OP_DONE)
            return DT_OK;
        if (first == OP_STATE) { // a checkpoint: this range's state to every worker
            for (int w = 0; w < ps->workers; w++)
                DT_TRY(move_state(ps, true, w, lo, hi));
            continue;
        }
        for (size_t i = 0; i < hi - lo; i++) // the mean, as an all-reduce's AVG divides
            g[i] /= (float)ps->workers;
        for (int k = 0; k < ps->ngroups; k++)
            DT_TRY(dt_optim_set_group_lr(ps->opt, k, lrs[k]));
        dt_optim_step(ps->opt);
        for (int w = 0; w < ps->workers; w++)
            DT_TRY(dt_pg_send(ps->world, x, hi - lo, DT_FLOAT32, w, TAG_PARAM));
        ps->step++;
    }
}
