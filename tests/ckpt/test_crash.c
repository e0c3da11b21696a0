// test_crash.c: kill -9 during checkpoint saves. A process saves checkpoints back to
// back (so any moment is inside some save: writing a rank file, the state, fsync,
// rename, the marker, pruning); it is killed at a random moment, 50 times. After every
// kill the newest complete checkpoint must load and verify, hold exactly the state
// saved for its step, and never be older than the newest one before the kill. Then a
// process that saves the same step again and again (a rewound run, keep 1) is killed:
// that step must stay complete. Then 2 ranks, killing rank 0, rank 1 or both while
// they save together.
#include "../lib/mp.h"
#include "ckpt_test.h"

#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#define KEEP 2

// The state saved at `step`, derived from it alone, so a loaded checkpoint can be
// checked against what must have been saved for its step.
typedef struct saver {
    dt_model   *m;
    dt_optim   *o;
    dt_rng      g;
    dt_ckpt_rng rngs[1];
} saver;

static void saver_init(saver *s) {
    s->m = ct_model(1, 1024); // ~55k parameters: saves of ~0.7 MB
    dt_adam_new(&s->o, dt_model_as_params(s->m), NULL);
    s->rngs[0] = (dt_ckpt_rng){"g", &s->g};
}

static void saver_free(saver *s) {
    dt_optim_free(s->o);
    dt_model_free(s->m);
}

// `version` tells apart saves of the same step (0 when each step is saved once).
static void saver_fill(saver *s, int64_t step, int rank, int64_t version) {
    size_t nf = 0;
    float *st = dt_optim_state(s->o, &nf);
    ct_fill(dt_model_params(s->m), dt_model_num_params(s->m),
            (uint64_t)step + (uint64_t)version * 1000003u);
    ct_fill(st, nf, (uint64_t)step + 1000000);
    dt_optim_set_step_count(s->o, step);
    s->g = dt_rng_init((uint64_t)step * 31 + (uint64_t)rank);
}

static dt_ckpt_state saver_state(saver *s, int64_t step) {
    return (dt_ckpt_state){.model = s->m, .optim = s->o, .step = step, .rngs = s->rngs, .nrngs = 1};
}

// Loads the newest checkpoint into a fresh saver and compares with the state of its step.
static bool loaded_matches(saver *s, int64_t step, int rank, int64_t version) {
    saver want;
    saver_init(&want);
    saver_fill(&want, step, rank, version);
    size_t na, nb;
    float *a = dt_optim_state(s->o, &na), *b = dt_optim_state(want.o, &nb);
    bool   ok = memcmp(dt_model_params(s->m), dt_model_params(want.m),
                       dt_model_num_params(s->m) * 4) == 0 &&
              na == nb && memcmp(a, b, na * 4) == 0 && dt_optim_step_count(s->o) == step &&
              memcmp(&s->g, &want.g, sizeof s->g) == 0;
    saver_free(&want);
    return ok;
}

// Saves steps from+1, from+2, ... until killed, a save fails (a peer was killed) or
// 20 s pass.
static void save_forever(const char *dir, dt_pg *pg, int64_t from) {
    saver s;
    saver_init(&s);
    dt_ckpt_opts o     = {.keep = KEEP};
    int          rank  = pg ? dt_pg_rank(pg) : 0;
    uint64_t     until = dt_deadline_ns(20000);
    for (int64_t step = from + 1; dt_now_ns() < until; step++) {
        saver_fill(&s, step, rank, 0);
        dt_ckpt_state st = saver_state(&s, step);
        if (dt_ckpt_save(dir, pg, &st, &o))
            break;
    }
    saver_free(&s);
}

// Signs that a save was interrupted: a step directory without marker, or a temp file.
static int leftovers(const char *dir) {
    int  n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "step-", 5) != 0)
            continue;
        char sub[512], marker[640];
        snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
        snprintf(marker, sizeof marker, "%s/complete.dtck", sub);
        n += !ct_exists(marker);
        DIR           *s = opendir(sub);
        struct dirent *fe;
        while (s && (fe = readdir(s)))
            n += strstr(fe->d_name, ".tmp.") != NULL;
        if (s)
            closedir(s);
    }
    closedir(d);
    return n;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void test_kill_one_process(void) {
    enum { KILLS = 50 };
    char dir[128];
    ct_tmpdir(dir, sizeof dir, "ckpt-kill");
    dt_rng  r      = dt_rng_init((uint64_t)dt_now_ns());
    int64_t newest = -1, first_newest = -2;
    int     hits = 0, bad_loads = 0, went_back = 0;
    long    window_us = 30000; // doubled after a kill that found no new save (a loaded
                               // machine gives the child less of the window), reset after one
    for (int k = 0; k < KILLS; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            save_forever(dir, NULL, newest < 0 ? 0 : newest);
            _exit(3);
        }
        // A random moment within the next few saves (each takes a few ms).
        sleep_us((long)dt_rng_below(&r, (uint64_t)window_us));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        hits += leftovers(dir) > 0;

        int64_t latest;
        CHECK_OK(dt_ckpt_latest(dir, &latest));
        went_back += latest < newest;
        if (latest >= 0) {
            char cdir[256];
            dt_ckpt_path(dir, latest, cdir, sizeof cdir);
            saver s;
            saver_init(&s);
            dt_ckpt_state cs = saver_state(&s, 0);
            dt_ckpt_info  info;
            dt_status     ls = dt_ckpt_load(dir, NULL, &cs, NULL, &info);
            if (ls || !info.found || info.step != latest || !loaded_matches(&s, latest, 0, 0) ||
                dt_ckpt_verify(cdir)) {
                bad_loads++;
                fprintf(stderr, "     kill %d: checkpoint %s did not load whole: %s\n", k, cdir,
                        dt_last_error());
            }
            dt_ckpt_info_free(&info);
            saver_free(&s);
        }
        if (first_newest == -2 && latest >= 0)
            first_newest = latest;
        window_us = latest > newest ? 30000 : (window_us < 1000000 ? 2 * window_us : window_us);
        newest    = latest;
    }
    CHECK_EQ(bad_loads, 0);
    CHECK_EQ(went_back, 0);
    CHECK(newest > first_newest); // the savers made progress
    // Evidence the kills landed inside saves, not between them (almost all do).
    CHECK(hits > 0);
    printf("kill -9 during saves, 1 process: %d kills, %d left an interrupted save behind, "
           "newest step %lld; every newest complete checkpoint loaded and verified\n",
           KILLS, hits, (long long)newest);
    ct_rm_tree(dir);
}

// A run rewound to step 7 saves step 7 again and again, with new contents each time and
// keep 1 (no older checkpoint to fall back on), and is killed at a random moment: after
// every kill step 7 is complete, loads whole, and holds exactly one save's contents.
static dt_status save_version(const char *dir, saver *s, int64_t version) {
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)version);
    saver_fill(s, 7, 0, version);
    dt_ckpt_kv    kv = {"version", v};
    dt_ckpt_state st = saver_state(s, 7);
    st.kvs = &kv, st.nkvs = 1;
    dt_ckpt_opts o = {.keep = 1};
    return dt_ckpt_save(dir, NULL, &st, &o);
}

// The saver reports each version it committed (save returned) in `committed`.
static void resave_forever(const char *dir, int64_t version, _Atomic int64_t *committed) {
    saver s;
    saver_init(&s);
    uint64_t until = dt_deadline_ns(20000);
    for (; dt_now_ns() < until && save_version(dir, &s, version) == DT_OK; version++)
        atomic_store(committed, version);
    saver_free(&s);
}

static void test_kill_while_replacing(void) {
    enum { KILLS = 30 };
    char dir[128];
    ct_tmpdir(dir, sizeof dir, "ckpt-resave");
    void *shared = mmap(NULL, sizeof(_Atomic int64_t), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!CHECK(shared != MAP_FAILED))
        return;
    _Atomic int64_t *committed = shared;
    dt_rng           r         = dt_rng_init((uint64_t)dt_now_ns() + 2);
    int64_t          version = 0, missing = 0, bad_loads = 0, wrong = 0;
    saver            first;
    saver_init(&first);
    CHECK_OK(save_version(dir, &first, 0)); // step 7 exists, complete, from here on
    saver_free(&first);
    for (int k = 0; k < KILLS; k++) {
        atomic_store(committed, version);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            resave_forever(dir, version + 1, committed);
            _exit(3);
        }
        // Once this saver has committed a replacement (however slow the machine), at a
        // random moment of the next few saves.
        uint64_t until = dt_deadline_ns(20000);
        while (atomic_load(committed) == version && dt_now_ns() < until)
            sleep_us(200);
        sleep_us((long)dt_rng_below(&r, 30000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        int64_t done = atomic_load(committed), latest;
        CHECK_OK(dt_ckpt_latest(dir, &latest));
        if (latest != 7) {
            missing++;
            fprintf(stderr, "     kill %d: expected step 7 complete, found newest %lld\n", k,
                    (long long)latest);
            continue;
        }
        saver s;
        saver_init(&s);
        dt_ckpt_state cs = saver_state(&s, 0);
        dt_ckpt_info  info;
        dt_status     ls  = dt_ckpt_load(dir, NULL, &cs, NULL, &info);
        const char   *v   = ls ? NULL : dt_ckpt_info_get(&info, "version");
        int64_t       now = v ? atoll(v) : -1;
        if (!v || !loaded_matches(&s, 7, 0, now)) {
            bad_loads++;
            fprintf(stderr, "     kill %d: step 7 did not load whole: %s\n", k,
                    ls ? dt_last_error() : "contents of no single save");
        }
        // The last committed save, or the one after it when the kill came between its
        // exchange and the report.
        if (!CHECK(now == done || now == done + 1))
            fprintf(stderr, "     kill %d: loaded version %lld, the saver had committed %lld\n", k,
                    (long long)now, (long long)done);
        wrong += now != done && now != done + 1;
        version = now > version ? now : version;
        dt_ckpt_info_free(&info);
        saver_free(&s);
    }
    CHECK_EQ(missing, 0);
    CHECK_EQ(bad_loads, 0);
    CHECK(version >= KILLS); // every saver committed at least one replacement
    printf("kill -9 while re-saving the same step (keep 1), %d kills: step 7 complete and "
           "whole after each, holding the newest committed save (%lld saves in all)\n",
           KILLS, (long long)version);
    munmap(shared, sizeof *committed);
    ct_rm_tree(dir);
}

// ------------------------------------------------------------------ two ranks

typedef struct shared {
    volatile pid_t   pids[2];
    volatile int64_t loaded[2]; // the step each rank loaded (-1 none), -2 on failure
} shared;

static char g_dir[128];

static void kill_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    shared *sh = mp_shared();
    dt_pg  *pg = mp_pg_init(10000);
    if (!pg)
        _exit(4);
    saver s;
    saver_init(&s);
    dt_ckpt_state cs = saver_state(&s, 0);
    dt_ckpt_info  info;
    int64_t       from = 0;
    if (dt_ckpt_load(g_dir, pg, &cs, NULL, &info) == DT_OK) {
        from             = info.found ? info.step : 0;
        sh->loaded[rank] = info.found && !loaded_matches(&s, info.step, rank, 0) ? -2 : info.step;
    } else {
        fprintf(stderr, "     rank %d: load failed: %s\n", rank, dt_last_error());
        sh->loaded[rank] = -2;
    }
    dt_ckpt_info_free(&info);
    saver_free(&s);
    sh->pids[rank] = getpid();
    save_forever(g_dir, pg, from); // returns when the other rank was killed
    dt_pg_free(pg);
}

static void test_kill_two_ranks(void) {
    enum { KILLS = 12 };
    ct_tmpdir(g_dir, sizeof g_dir, "ckpt-kill2");
    dt_rng  r      = dt_rng_init((uint64_t)dt_now_ns() + 1);
    int64_t newest = -1;
    int     hits   = 0;
    for (int k = 0; k < KILLS; k++) {
        shared *sh = mp_shared();
        // The killer: waits until both ranks have loaded and completed a save past the
        // newest one (so every job makes progress however slow the machine), then kills
        // rank 0, rank 1 or both at a random moment of the saves that follow.
        int     victim = k % 3; // 0, 1: that rank; 2: both
        long    delay  = (long)dt_rng_below(&r, 40000);
        mp_opts o      = {.world = 2, .may_die = 3, .timeout_ms = 60000};
        // Zeroed before the killer starts, so it only ever sees this run's pids.
        memset(mp_shared(), 0, sizeof *sh);
        fflush(NULL);
        pid_t killer = fork();
        if (killer == 0) {
            uint64_t until = dt_deadline_ns(30000);
            int64_t  done  = -1;
            while ((!sh->pids[0] || !sh->pids[1] || done <= newest) && dt_now_ns() < until) {
                sleep_us(500);
                if (dt_ckpt_latest(g_dir, &done) != DT_OK)
                    done = -1;
            }
            sleep_us(delay);
            if (victim != 1 && sh->pids[0])
                kill(sh->pids[0], SIGKILL);
            if (victim != 0 && sh->pids[1])
                kill(sh->pids[1], SIGKILL);
            _exit(0);
        }
        MP_RUN(&o, kill_rank, NULL);
        waitpid(killer, NULL, 0);
        // Both ranks of the new job loaded the newest complete checkpoint, whole.
        CHECK_EQ(sh->loaded[0], newest);
        CHECK_EQ(sh->loaded[1], newest);
        hits += leftovers(g_dir) > 0;

        int64_t latest;
        CHECK_OK(dt_ckpt_latest(g_dir, &latest));
        CHECK(latest > newest); // the killer waited for a save past the newest
        if (latest >= 0) {
            char cdir[256];
            dt_ckpt_path(g_dir, latest, cdir, sizeof cdir);
            CHECK_OK(dt_ckpt_verify(cdir));
        }
        newest = latest;
    }
    CHECK(newest > 0);
    printf("kill -9 during saves, 2 ranks: %d kills (rank 0, rank 1, both), %d left an "
           "interrupted save behind, newest step %lld; every next job loaded the newest\n",
           KILLS, hits, (long long)newest);
    ct_rm_tree(g_dir);
}

int main(void) {
    RUN(test_kill_one_process);
    RUN(test_kill_while_replacing);
    RUN(test_kill_two_ranks);
    return check_summary();
}
