// test_backend_agree.c: ranks that ask for different backends are refused at the
// rendezvous, through the store, before either starts its backend's set-up (where each
// would wait for peers that never come, until the timeout): every rank fails within
// seconds with DT_ERR_MISMATCH naming both backends. Names that mean the same backend
// ("gloo" and "tcp", NULL and "auto") form a group.
#include "../lib/mp.h"

#include <stdlib.h>
#include <string.h>

typedef struct shared {
    int    status[2];
    double secs[2];
    char   msg[2][512];
} shared;

typedef struct pair {
    const char *backend[2];
} pair;

static void ranks(int rank, int world, void *arg) {
    (void)world;
    const pair *p    = arg;
    shared     *sh   = mp_shared();
    dt_pg_opts  o    = dt_pg_opts_default();
    o.backend        = p->backend[rank];
    o.timeout_ms     = 30000;
    dt_pg    *pg     = NULL;
    double    t0     = dt_now();
    dt_status st     = dt_pg_new_from_env(&pg, &o);
    sh->secs[rank]   = dt_now() - t0;
    sh->status[rank] = st;
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", st ? dt_last_error() : "");
    if (pg)
        CHECK_OK(dt_pg_barrier(pg));
    dt_pg_free(pg);
}

static void test_mismatch(void) {
    pair    p = {{"tcp", "shm"}};
    mp_opts o = {.world = 2, .timeout_ms = 90000};
    MP_RUN(&o, ranks, &p);
    const shared *sh = mp_shared();
    for (int r = 0; r < 2; r++) {
        CHECK_EQ(sh->status[r], DT_ERR_MISMATCH);
        CHECK(strstr(sh->msg[r], "backend mismatch: rank 1 asks for backend shm, rank 0 for "
                                 "tcp (give every rank the same --backend)") != NULL);
        CHECK(sh->secs[r] < 10.0); // the timeout is 30 s
        if (check_failed)
            fprintf(stderr, "     rank %d after %.1f s: %s\n", r, sh->secs[r], sh->msg[r]);
    }
}

static void test_aliases(void) {
    pair same[] = {{{"gloo", "tcp"}}, {{NULL, "auto"}}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        mp_opts o = {.world = 2, .timeout_ms = 60000};
        MP_RUN(&o, ranks, &same[i]);
        const shared *sh = mp_shared();
        CHECK_EQ(sh->status[0], DT_OK);
        CHECK_EQ(sh->status[1], DT_OK);
    }
}

int main(void) {
    RUN(test_mismatch);
    RUN(test_aliases);
    return check_summary();
}
