// elastic.c: elastic membership (dtrun --nnodes MIN:MAX; docs/dtrun.md "Elastic jobs").
// The workers meet in the rendezvous store that dtrun serves at MASTER_ADDR:MASTER_PORT
// (guarded by the job token, as every store is), in numbered generations:
//
//   elastic/gen              the current generation g (a counter; absent: 0)
//   elastic/formed           a group has formed: the job holds a state from here on
//   elastic/g<g>/n           arrivals so far; an arrival's slot is its rank
//   elastic/g<g>/m<slot>     who took the slot ("host pid step")
//   elastic/g<g>/held        arrivals that hold the state (members of an earlier one)
//   elastic/g<g>/closed      "W N": its world size and the arrivals it closed with,
//                            written once (compare-and-set); arrivals beyond W (the
//                            largest size the job allows) stand by for the next one
//   elastic/g<g>/pg          rank 0's group address, "tcp://addr:port"
//   elastic/g<g>/left        arrivals that ended (dtrun's host waits for them all)
//   elastic/done             the step the members finished at: later workers are refused
//
// A generation closes when no one arrived for DT_ELASTIC_SETTLE_MS and MIN have, or at
// once when MAX have; whoever sees that first writes `closed` (the first write wins). A
// worker that arrives after the close, or finds its generation closed, opens the next one
// (compare-and-set of elastic/gen from g to g + 1), which the members see at their next
// step boundary (one store read per step): a joiner is admitted within one step. A member
// whose collective fails (a peer died) drops its group and comes back the same way. Every
// wait is bounded by DT_ELASTIC_TIMEOUT_MS and says what it waits for.
//
// After the new group forms, the member that took the most steps (the lowest rank among
// equals) broadcasts the state: the counters (step, epoch, the next batch of the epoch,
// samples seen, the optimizer's step count), the parameters, the buffers and the
// optimizer's state. Everything else (dropout streams, the sampler's order) follows from
// the seed, the epoch and the sample, so the run goes on as if the world had not changed.
#include "train_impl.h"

#include "core/tree.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct dt_elastic {
    dt_store *store;
    long      min, max, timeout_ms, settle_ms;
    int64_t   gen;      // the generation this worker is a member of (-1: none yet)
    int64_t   reg_gen;  // the last one it arrived in (as a member or standing by)
    bool      ended;    // the job finished while it stood by
    bool      torn;     // a state broadcast to it broke off: its copy is not whole
    int       world;    // its size
    long      v;        // --invariant as given (0: none), and the global batch: the
    size_t    gbatch;   // world sizes a generation may take (allowed)
    char      host[64]; // this worker's host, for the members' list
    char      store_host[256];
    int       store_port;
};

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int64_t now_ms(void) {
    return (int64_t)(dt_now_ns() / 1000000u);
}

bool dt_train_elastic_wanted(void) {
    return dt_setting_str("DT_ELASTIC") != NULL;
}

dt_status dt_train_elastic_open(dt_trainer *t) {
    const char *spec = dt_setting_str("DT_ELASTIC");
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    long        min = 0, max = 0, p = 0;
    if (!spec || sscanf(spec, "%ld:%ld", &min, &max) != 2 || min < 1 || max < min)
        return dt_fail(DT_ERR_ARG,
                       "DT_ELASTIC: expected MIN:MAX workers (1 <= MIN <= MAX), found \"%s\"",
                       spec ? spec : "");
    if (!addr || !*addr || !port || dt_parse_long(port, 1, 65535, "MASTER_PORT", &p) != DT_OK)
        return dt_fail(DT_ERR_ARG,
                       "DT_ELASTIC: expected MASTER_ADDR and MASTER_PORT naming the "
                       "rendezvous store (dtrun sets them), found %s",
                       addr && *addr ? "no MASTER_PORT" : "no MASTER_ADDR");
    struct dt_elastic *e = dt_alloc_zero(sizeof *e);
    if (!e)
        return DT_ERR_NOMEM;
    e->min = min, e->max = max, e->gen = -1, e->reg_gen = -1;
    snprintf(e->store_host, sizeof e->store_host, "%s", addr);
    e->store_port = (int)p;
    if (gethostname(e->host, sizeof e->host - 1) != 0 || !e->host[0])
        snprintf(e->host, sizeof e->host, "unknown");
    dt_status st = dt_setting_int("DT_ELASTIC_TIMEOUT_MS", &e->timeout_ms);
    if (!st)
        st = dt_setting_int("DT_ELASTIC_SETTLE_MS", &e->settle_ms);
    dt_store_opts so = dt_store_opts_default();
    so.timeout_ms    = e->timeout_ms;
    if (!st)
        st = dt_store_new_tcp(&e->store, addr, (int)p, false, &so);
    if (st) {
        dt_free(e);
        return st;
    }
    t->el = e;
    return DT_OK;
}

void dt_train_elastic_close(dt_trainer *t, bool finished) {
    struct dt_elastic *e = t->el;
    if (!e)
        return;
    if (e->gen >= 0 && finished) { // a worker that comes later has nothing to join
        char v[24];
        int  nv = snprintf(v, sizeof v, "%lld", (long long)t->step);
        dt_store_set(e->store, "elastic/done", v, (size_t)nv);
    }
    if (e->reg_gen >= 0) { // dtrun's host keeps the store up until every arrival left
        char key[64];
        snprintf(key, sizeof key, "elastic/g%lld/left", (long long)e->reg_gen);
        dt_store_add(e->store, key, 1, NULL);
    }
    dt_store_free(e->store);
    dt_free(e);
    t->el = NULL;
}

bool dt_train_elastic_ended(const dt_trainer *t) {
    return t->el && t->el->ended;
}

dt_status dt_train_elastic_poll(dt_trainer *t, bool *changed) {
    int64_t g = 0;
    *changed  = false;
    DT_TRY(dt_store_add(t->el->store, "elastic/gen", 0, &g));
    *changed = g != t->el->gen;
    return DT_OK;
}

dt_status dt_train_elastic_agree(dt_trainer *t, bool *others) {
    int64_t  mine = t->preempted || dt_train_preempt_pending();
    int64_t *all  = dt_alloc(sizeof(int64_t) * (size_t)t->world);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st = dt_pg_all_gather(t->pg, &mine, all, 1, DT_INT64);
    *others      = false;
    for (int r = 0; !st && r < t->world; r++)
        *others |= r != t->rank && all[r];
    dt_free(all);
    t->preempted = mine != 0;
    return st;
}

static bool key_exists(dt_store *s, const char *key) {
    bool        yes  = false;
    const char *k[1] = {key};
    return dt_store_check(s, k, 1, &yes) == DT_OK && yes;
}

// A job whose members finished: refused to a worker that comes after (DT_ERR_STATE).
static dt_status check_not_done(dt_store *s) {
    if (!key_exists(s, "elastic/done"))
        return DT_OK;
    void *v = NULL;
    dt_store_get(s, "elastic/done", &v, NULL);
    dt_status st = dt_fail(DT_ERR_STATE,
                           "elastic: the job has finished (its members ended at "
                           "step %s): nothing to join",
                           v ? (char *)v : "?");
    dt_free(v);
    return st;
}

// Opens the next generation when g is closed (one bump wins); *g: the current one.
static dt_status current_gen(dt_store *s, int64_t *g) {
    for (int i = 0; i < 64; i++) {
        char key[64], from[24], to[24];
        DT_TRY(dt_store_add(s, "elastic/gen", 0, g));
        snprintf(key, sizeof key, "elastic/g%lld/closed", (long long)*g);
        if (!key_exists(s, key))
            return DT_OK;
        int  nf = snprintf(from, sizeof from, "%lld", (long long)*g);
        int  nt = snprintf(to, sizeof to, "%lld", (long long)*g + 1);
        bool swapped;
        DT_TRY(dt_store_compare_set(s, "elastic/gen", from, (size_t)nf, to, (size_t)nt, &swapped));
    }
    return dt_fail(DT_ERR_STATE, "elastic: the generation kept changing (64 tries)");
}

// The members of generation g that did not come (for the message below MIN).
static void missing_members(dt_store *s, int64_t g, char *buf, size_t n) {
    char    key[64];
    int64_t count = 0;
    snprintf(buf, n, "none known");
    snprintf(key, sizeof key, "elastic/g%lld/closed", (long long)g);
    if (g < 0 || !key_exists(s, key))
        return;
    void *v = NULL;
    if (dt_store_get(s, key, &v, NULL) == DT_OK)
        count = atoll(v);
    dt_free(v);
    size_t len = 0;
    buf[0]     = '\0';
    for (int64_t i = 0; i < count && len + 1 < n; i++) {
        snprintf(key, sizeof key, "elastic/g%lld/m%lld", (long long)g, (long long)i);
        v = NULL;
        if (dt_store_get(s, key, &v, NULL) == DT_OK)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", (char *)v);
        dt_free(v);
    }
}

// Whether a generation of w workers keeps the job's promise: w divides the global batch
// and, with --invariant V given, is one of the sizes V's tree splits into.
static bool allowed(const struct dt_elastic *e, int64_t w) {
    return w >= 1 && e->gbatch % (size_t)w == 0 && (e->v <= 0 || dt_tree_splits(e->v, (long)w));
}

// Waits for generation g to close; *world: its size, *arrived: the arrivals it closed
// with (those beyond the world, the largest allowed size, wait as standby). Whoever sees
// it settle closes it.
// Once the job has trained (a group formed: elastic/formed), a generation closes only with
// a member that holds the state among its arrivals (elastic/g<g>/held counts them): new
// workers never start a second job of their own while the members are on their way.
static dt_status wait_close(struct dt_elastic *e, int64_t g, int64_t *world, int64_t *arrived) {
    char nkey[64], ckey[64], hkey[64];
    snprintf(nkey, sizeof nkey, "elastic/g%lld/n", (long long)g);
    snprintf(ckey, sizeof ckey, "elastic/g%lld/closed", (long long)g);
    snprintf(hkey, sizeof hkey, "elastic/g%lld/held", (long long)g);
    int64_t start = now_ms(), changed = start, last = -1, said = start;
    for (;;) {
        if (key_exists(e->store, ckey))
            break;
        DT_TRY(check_not_done(e->store));
        int64_t n, held = 0, now = now_ms();
        DT_TRY(dt_store_add(e->store, nkey, 0, &n));
        bool formed = key_exists(e->store, "elastic/formed");
        if (formed)
            DT_TRY(dt_store_add(e->store, hkey, 0, &held));
        if (n != last)
            last = n, changed = now;
        bool    stateful = !formed || held > 0;
        int64_t w        = n;
        while (w > 0 && !allowed(e, w))
            w--;
        if (stateful && w >= e->min && (n >= e->max || now - changed >= e->settle_ms)) {
            char v[48];
            int  nv = snprintf(v, sizeof v, "%lld %lld", (long long)w, (long long)n);
            bool swapped;
            DT_TRY(dt_store_compare_set(e->store, ckey, NULL, 0, v, (size_t)nv, &swapped));
            continue;
        }
        if (now - start >= e->timeout_ms) {
            char miss[512];
            missing_members(e->store, g - 1, miss, sizeof miss);
            if (!stateful)
                return dt_fail(DT_ERR_TIMEOUT,
                               "elastic: waited %.1f s (--rdzv-timeout) for a member that holds "
                               "the job's state, found %lld new workers; the last generation's "
                               "members (host pid step): %s",
                               (double)e->timeout_ms / 1000, (long long)n, miss);
            return dt_fail(DT_ERR_TIMEOUT,
                           "elastic: waited %.1f s (--rdzv-timeout) for at least %ld workers, "
                           "found %lld (of whom %lld may train: a world size that divides the "
                           "global batch and --invariant's tree takes); waited for the last "
                           "generation's members (host pid step): %s",
                           (double)e->timeout_ms / 1000, e->min, (long long)n, (long long)w, miss);
        }
        if (now - said >= 10000) {
            fprintf(stderr, "elastic: generation %lld has %lld of at least %ld workers; waiting\n",
                    (long long)g, (long long)n, e->min);
            said = now;
        }
        sleep_ms(10);
    }
    void *v = NULL;
    DT_TRY(dt_store_get(e->store, ckey, &v, NULL));
    long long w = 0, n = 0;
    int       got = sscanf(v, "%lld %lld", &w, &n);
    dt_free(v);
    if (got != 2 || w < 1 || w > e->max || n < w) // written by a member: checked all the same
        return dt_fail(DT_ERR_FORMAT,
                       "elastic: generation %lld closed with %lld of %lld workers, "
                       "expected 1 to %ld",
                       (long long)g, w, n, e->max);
    *world = w, *arrived = n;
    return DT_OK;
}

// The address of this host on the way to the store (no packet is sent).
static void local_addr(const struct dt_elastic *e, char *buf, size_t n) {
    snprintf(buf, n, "127.0.0.1");
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    char            ps[16];
    snprintf(ps, sizeof ps, "%d", e->store_port);
    if (getaddrinfo(e->store_host, ps, &hints, &res) != 0 || !res)
        return;
    int                fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    socklen_t          len = sizeof sa;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        inet_ntop(AF_INET, &sa.sin_addr, buf, (socklen_t)n);
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
}

// A standby worker of generation g (of `world` members) waits until the generation
// moves on (a member lost, a worker joining), or the job finishes (refused then, as a
// late worker). Not bounded by time: a standby may wait as long as the job trains.
static dt_status standby(struct dt_elastic *e, int64_t g, int64_t world) {
    fprintf(stderr,
            "elastic: generation %lld trains with %lld workers (the largest size "
            "allowed); standing by for the next one\n",
            (long long)g, (long long)world);
    for (;;) {
        int64_t now;
        if (key_exists(e->store, "elastic/done")) {
            e->ended = true;
            return dt_fail(DT_ERR_STATE, "elastic: the job finished while this worker stood by");
        }
        DT_TRY(dt_store_add(e->store, "elastic/gen", 0, &now));
        if (now != g)
            return DT_OK;
        sleep_ms(50);
    }
}

// One rendezvous: a generation, a slot in it, and the group of its members.
static dt_status rendezvous(dt_trainer *t, dt_pg **pg) {
    struct dt_elastic *e = t->el;
    *pg                  = NULL;
    for (int tries = 0; tries < 16; tries++) {
        int64_t g, slot, world = 0;
        char    key[64], v[160];
        DT_TRY(check_not_done(e->store));
        DT_TRY(current_gen(e->store, &g));
        snprintf(key, sizeof key, "elastic/g%lld/n", (long long)g);
        DT_TRY(dt_store_add(e->store, key, 1, &slot));
        slot--;
        snprintf(key, sizeof key, "elastic/g%lld/m%lld", (long long)g, (long long)slot);
        int nv = snprintf(v, sizeof v, "%s %d %lld", e->host, (int)getpid(),
                          (long long)(e->gen >= 0 ? t->step : -1));
        DT_TRY(dt_store_set(e->store, key, v, (size_t)nv));
        e->reg_gen = g;
        if (e->gen >= 0) { // this worker holds the state (see wait_close)
            snprintf(key, sizeof key, "elastic/g%lld/held", (long long)g);
            DT_TRY(dt_store_add(e->store, key, 1, NULL));
        }
        int64_t arrived = 0;
        DT_TRY(wait_close(e, g, &world, &arrived));
        if (slot >= arrived) // came after the close: the next generation
            continue;
        if (slot >= world) { // beyond the largest allowed size: standby until the next
            DT_TRY(standby(e, g, world));
            tries--; // waiting for a place is not a failed try
            continue;
        }
        snprintf(key, sizeof key, "elastic/g%lld/pg", (long long)g);
        if (slot == 0) {
            char addr[64];
            int  port = dt_free_port();
            if (!port)
                return dt_fail(DT_ERR_IO, "elastic: no free TCP port for the group's store");
            local_addr(e, addr, sizeof addr);
            nv = snprintf(v, sizeof v, "tcp://%s:%d", addr, port);
            DT_TRY(dt_store_set(e->store, key, v, (size_t)nv));
        }
        void *method = NULL;
        DT_TRY(dt_store_get(e->store, key, &method, NULL));
        dt_pg_opts o = dt_pg_opts_default();
        o.backend    = dt_train_device_backend(t);
        o.timeout_ms = e->timeout_ms;
        dt_status st = dt_pg_new(pg, method, (int)slot, (int)world, &o);
        dt_free(method);
        if (st == DT_OK) {
            e->gen = g, e->world = (int)world;
            if (slot == 0)
                DT_TRY(dt_store_set(e->store, "elastic/formed", "1", 1));
            return DT_OK;
        }
        // A member died before the group formed: the next generation, without it.
        fprintf(stderr, "elastic: generation %lld did not form (%s); trying the next\n",
                (long long)g, dt_last_error());
        char from[24], to[24];
        int  nf = snprintf(from, sizeof from, "%lld", (long long)g);
        int  nt = snprintf(to, sizeof to, "%lld", (long long)g + 1);
        bool swapped;
        DT_TRY(dt_store_compare_set(e->store, "elastic/gen", from, (size_t)nf, to, (size_t)nt,
                                    &swapped));
    }
    return dt_fail(DT_ERR_STATE, "elastic: no generation formed in 16 tries");
}

// The state from the member with the most steps (lowest rank among equals) to all.
// The member with the most steps sends its state to the others. A member whose copy
// differs from the sender's (a joiner, or one a step behind) and whose broadcast breaks
// off (the sender died) is torn: it offers no state at the next regrouping, so a
// half-received copy is never sent on. Members at the sender's step hold the same bytes,
// so a broken broadcast leaves them whole.
static dt_status share_state(dt_trainer *t, bool had_state, int64_t *next_batch, int *old_world) {
    struct dt_elastic *e    = t->el;
    int                w    = t->world;
    int64_t            mine = e->torn     ? -2
                              : had_state ? t->step
                                          : -1,
            *all            = dt_alloc(sizeof(int64_t) * (size_t)w);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st       = dt_pg_all_gather(t->pg, &mine, all, 1, DT_INT64);
    int       src      = 0;
    bool      any_torn = false;
    for (int r = 0; r < w; r++) {
        any_torn |= all[r] == -2;
        if (all[r] > all[src])
            src = r;
    }
    int64_t best = all[src];
    dt_free(all);
    DT_TRY(st);
    if (best < 0 && any_torn)
        return dt_fail(DT_ERR_STATE,
                       "elastic: the member sending the state was lost while sending it, and no "
                       "survivor holds a whole copy: the job cannot go on from memory");
    int64_t meta[6] = {
        t->step, t->epoch, *next_batch, t->samples_seen, dt_optim_step_count(t->opt), *old_world};
    DT_TRY(dt_pg_broadcast(t->pg, meta, 6, DT_INT64, src));
    if (t->rank != src && mine != meta[0])
        e->torn = true; // until every broadcast below has arrived
    *old_world = (int)meta[5];
    t->step = meta[0], t->epoch = (long)meta[1], *next_batch = meta[2];
    t->samples_seen = meta[3];
    DT_TRY(dt_optim_set_step_count(t->opt, meta[4]));
    DT_TRY(dt_pg_broadcast(t->pg, dt_params_data(t->p), dt_params_numel(t->p), DT_FLOAT32, src));
    size_t nb = dt_params_buffer_numel(t->p);
    if (nb)
        DT_TRY(dt_pg_broadcast(t->pg, dt_params_buffers(t->p), nb, DT_FLOAT32, src));
    size_t nopt = 0;
    float *os   = dt_optim_state(t->opt, &nopt);
    if (nopt)
        DT_TRY(dt_pg_broadcast(t->pg, os, nopt, DT_FLOAT32, src));
    e->torn = false;
    return DT_OK;
}

dt_status dt_train_elastic_regroup(dt_trainer *t, int64_t *next_batch) {
    struct dt_elastic *e         = t->el;
    int                old_world = e->gen >= 0 ? e->world : 0;
    bool               had_state = e->gen >= 0;
    if (t->pg) {
        dt_pg_abort(t->pg, "elastic: the membership changes");
        dt_pg_free(t->pg);
        t->pg = NULL;
    }
    dt_pg *pg;
    e->v      = t->a.invariant > 0 ? t->inv_v : 0;
    e->gbatch = t->gbatch;
    DT_TRY(rendezvous(t, &pg));
    t->pg         = pg;
    t->world      = dt_pg_size(pg);
    t->rank       = dt_pg_rank(pg);
    t->local_rank = dt_pg_local_rank(pg);
    t->local_size = dt_pg_local_size(pg);
    // A member started with other flags (or another program's settings) stops the job
    // here, naming the flag, before any state moves.
    DT_TRY(dt_train_check_shared(t));
    DT_TRY(share_state(t, had_state, next_batch, &old_world));
    dt_trainer_print(t, "world %d -> %d at step %lld (generation %lld)\n", old_world, t->world,
                     (long long)t->step, (long long)e->gen);
    fflush(stdout);
    return DT_OK;
}
