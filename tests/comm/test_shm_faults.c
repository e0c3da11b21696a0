// test_shm_faults.c: the shm backend's failure behaviour through the process group, in
// real processes: a rank SIGKILLed in the middle of a large all_reduce (the others
// fail with DT_ERR_PEER naming it within 5 s, and so do their later calls), a rank
// killed while the others are idle, mismatched collectives (both sides get both
// fingerprints), a timeout naming the late rank, dt_pg_abort reaching the other ranks,
// "auto" choosing shm on one host, and nothing left behind in /dev/shm.
#include "../lib/mp.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct shared {
    volatile uint64_t kill_ns; // when the victim killed itself
    volatile int      seen[8]; // per rank: 1 once it got the expected error
} shared;

static dt_pg *pg_shm(int64_t timeout_ms) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "shm";
    o.timeout_ms = timeout_ms;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    if (!pg)
        fprintf(stderr, "dt_pg_new_from_env: %s\n", dt_last_error());
    return pg;
}

// True when the segment's creator (its name: dtrain-<uid>-<pid>-<hex>) still runs: a
// job in progress, such as another test suite running beside this one. The ranks of
// this test have all been reaped when it looks, so their leftovers have dead creators.
static bool creator_alive(const char *name, size_t prefix_len) {
    char *end;
    long  pid = strtol(name + prefix_len, &end, 10);
    return end != name + prefix_len && *end == '-' && pid > 0 &&
           (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

// Names of this user's segments in /dev/shm whose creator is gone, concatenated (to
// compare before/after).
static void list_segments(char *out, size_t n) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "dtrain-%d-", (int)getuid());
    out[0]    = '\0';
    DIR   *d  = opendir("/dev/shm");
    size_t at = 0;
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && at + strlen(e->d_name) + 2 < n &&
            !creator_alive(e->d_name, strlen(prefix)))
            at += (size_t)snprintf(out + at, n - at, "%s ", e->d_name);
    closedir(d);
}

static char segments_before[4096];

static void check_no_leftovers(const char *when) {
    char now[4096];
    list_segments(now, sizeof now);
    if (!CHECK(strcmp(now, segments_before) == 0))
        fprintf(stderr, "     %s: /dev/shm holds \"%s\", before: \"%s\"\n", when, now,
                segments_before);
}

// ------------------------------------------------------------------ SIGKILL mid-op

static void *kill_me_later(void *arg) {
    shared *sh = arg;
    usleep(300 * 1000);
    sh->kill_ns = dt_now_ns();
    kill(getpid(), SIGKILL);
    return NULL;
}

static void ranks_killed_mid_all_reduce(int rank, int world, void *arg) {
    (void)arg, (void)world;
    shared *sh = mp_shared();
    dt_pg  *pg = pg_shm(60000);
    if (!CHECK(pg != NULL))
        return;
    CHECK(strcmp(dt_pg_backend(pg), "shm") == 0);
    size_t n   = (size_t)4 << 20; // 16 MiB: many chunks per call, so the kill lands inside one
    float *buf = dt_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f;
    if (rank == 2) {
        pthread_t t;
        pthread_create(&t, NULL, kill_me_later, sh);
    }
    dt_status st = DT_OK;
    for (int it = 0; it < 1000000 && st == DT_OK; it++)
        st = dt_pg_all_reduce(pg, buf, buf, n, DT_FLOAT32, DT_REDUCE_SUM);
    uint64_t now = dt_now_ns();
    CHECK_ERR(st, DT_ERR_PEER, "rank 2");
    CHECK(strstr(dt_last_error(), "all_reduce #") != NULL);
    double secs = sh->kill_ns ? (double)(now - sh->kill_ns) / 1e9 : 1e9;
    if (!CHECK(secs < 5.0))
        fprintf(stderr, "     rank %d saw the death after %.2f s\n", rank, secs);
    // Later collectives fail at once with the same story.
    uint64_t t0 = dt_now_ns();
    CHECK_ERR(dt_pg_barrier(pg), DT_ERR_PEER, "rank 2");
    CHECK((double)(dt_now_ns() - t0) / 1e9 < 1.0);
    dt_free(buf);
    dt_pg_free(pg);
}

static void test_killed_mid_all_reduce(void) {
    mp_opts o = {.world = 3, .may_die = 1u << 2, .timeout_ms = 60000};
    MP_RUN(&o, ranks_killed_mid_all_reduce, NULL);
    check_no_leftovers("after a SIGKILL");
}

// A rank dies while the others are between collectives: their next one fails.
static void ranks_killed_idle(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = pg_shm(60000);
    if (!CHECK(pg != NULL))
        return;
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 1)
        kill(getpid(), SIGKILL);
    usleep(200 * 1000);
    float    x  = 1;
    uint64_t t0 = dt_now_ns();
    CHECK_ERR(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_PEER,
              "rank 1 died");
    CHECK((double)(dt_now_ns() - t0) / 1e9 < 5.0);
    dt_pg_free(pg);
}

static void test_killed_idle(void) {
    mp_opts o = {.world = 4, .may_die = 1u << 1, .timeout_ms = 60000};
    MP_RUN(&o, ranks_killed_idle, NULL);
    check_no_leftovers("after a SIGKILL between collectives");
}

// --------------------------------------------------------------------- mismatches

static void ranks_mismatch(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = pg_shm(20000);
    if (!CHECK(pg != NULL))
        return;
    float buf[32] = {0};
    CHECK_OK(dt_pg_all_reduce(pg, buf, buf, 4, DT_FLOAT32, DT_REDUCE_SUM));
    size_t n = rank == 1 ? 20 : 10;
    CHECK_ERR(dt_pg_all_reduce(pg, buf, buf, n, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_MISMATCH,
              "all_reduce #2");
    // Both fingerprints, whichever rank saw it first.
    CHECK(strstr(dt_last_error(), "count 10") != NULL);
    CHECK(strstr(dt_last_error(), "count 20") != NULL);
    CHECK_ERR(dt_pg_barrier(pg), DT_ERR_MISMATCH, "count 20");
    dt_pg_free(pg);
}

static void ranks_mismatch_kind(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = pg_shm(20000);
    if (!CHECK(pg != NULL))
        return;
    int       v[3] = {1, 2, 3};
    dt_status st   = rank == 0 ? dt_pg_broadcast(pg, v, 3, DT_INT32, 0)
                               : dt_pg_all_reduce(pg, v, v, 3, DT_INT32, DT_REDUCE_MAX);
    CHECK_ERR(st, DT_ERR_MISMATCH, "broadcast #1 (int32, count 3, root 0)");
    CHECK(strstr(dt_last_error(), "all_reduce #1 (int32 max, count 3)") != NULL);
    dt_pg_free(pg);
}

static void test_mismatch(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, ranks_mismatch, NULL);
    o.world = 3;
    MP_RUN(&o, ranks_mismatch, NULL);
    o.world = 2;
    MP_RUN(&o, ranks_mismatch_kind, NULL);
    check_no_leftovers("after mismatches");
}

// ------------------------------------------------------------ timeout and abort

static void ranks_timeout(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = pg_shm(400);
    if (!CHECK(pg != NULL))
        return;
    if (rank == 1)
        usleep(1500 * 1000);
    uint64_t  t0 = dt_now_ns();
    dt_status st = dt_pg_barrier(pg);
    double    ms = (double)(dt_now_ns() - t0) / 1e6;
    if (rank == 0) {
        CHECK_ERR(st, DT_ERR_TIMEOUT, "barrier #1: timed out after");
        CHECK(strstr(dt_last_error(), "rank 1") != NULL);
        CHECK(ms >= 350 && ms < 3000);
    } else {
        // Rank 0 gave up long ago and said so: no wait for our own timeout.
        CHECK(st == DT_ERR_TIMEOUT || st == DT_ERR_PEER);
        CHECK(strstr(dt_last_error(), "rank 0") != NULL);
        CHECK(ms < 300);
    }
    dt_pg_free(pg);
}

static void ranks_abort(int rank, int world, void *arg) {
    (void)arg, (void)world;
    shared *sh = mp_shared();
    dt_pg  *pg = pg_shm(60000);
    if (!CHECK(pg != NULL))
        return;
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 2) {
        dt_pg_abort(pg, "the data loader failed");
        CHECK_ERR(dt_pg_barrier(pg), DT_ERR_STATE, "the data loader failed");
    } else {
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(dt_pg_barrier(pg), DT_ERR_PEER, "(reported by rank 2)");
        CHECK(strstr(dt_last_error(), "the data loader failed") != NULL);
        CHECK((double)(dt_now_ns() - t0) / 1e9 < 5.0);
    }
    sh->seen[rank] = 1;
    dt_pg_free(pg);
}

static void test_timeout_and_abort(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, ranks_timeout, NULL);
    o.world = 3;
    MP_RUN(&o, ranks_abort, NULL);
    check_no_leftovers("after a timeout and an abort");
}

// ------------------------------------------------------------------- selection

static void ranks_auto(int rank, int world, void *arg) {
    (void)arg;
    dt_pg_opts o = dt_pg_opts_default();
    o.timeout_ms = 20000;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    if (!CHECK(pg != NULL))
        return;
    CHECK(strcmp(dt_pg_backend(pg), "shm") == 0);
    int64_t v = rank + 1, sum = 0;
    CHECK_OK(dt_pg_all_reduce(pg, &v, &sum, 1, DT_INT64, DT_REDUCE_SUM));
    CHECK_EQ(sum, (int64_t)world * (world + 1) / 2);
    dt_pg_free(pg);
}

static void test_auto_chooses_shm(void) {
    mp_opts o = {.world = 3};
    MP_RUN(&o, ranks_auto, NULL);
    check_no_leftovers("after normal runs");
}

int main(void) {
    list_segments(segments_before, sizeof segments_before);
    RUN(test_auto_chooses_shm);
    RUN(test_killed_mid_all_reduce);
    RUN(test_killed_idle);
    RUN(test_mismatch);
    RUN(test_timeout_and_abort);
    return check_summary();
}
