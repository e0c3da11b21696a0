// test_algo_forced.c: DT_ALLREDUCE_ALGO and its siblings on every backend that runs
// without an outside library: tcp and shm (3 processes) and hybrid (2 fake hosts x 2).
// For each setting the group's decision table must name the forced algorithm for a
// small (4 KiB) and a large (1 MiB) buffer, and the operations run with it must give
// the exact results (int32 sums and a broadcast from every root: no rounding, so any
// wrong element, wrong order of pieces or missed peer shows). "auto" is checked too:
// shm's segment, tcp's recursive doubling then ring, hybrid's two levels above
// DT_HYBRID_MIN_BYTES and DT_HYBRID_BCAST_MIN_BYTES (all_reduce and broadcast).
// Forcing an algorithm a backend cannot run is refused at creation: test_collectives.
#include "../lib/mp.h"
#include "comm/pg_impl.h"

#include <stdlib.h>
#include <string.h>

#define SMALL_COUNT 1024   // int32: 4 KiB, below DT_SMALL_BYTES (64 KiB)
#define LARGE_COUNT 262144 // int32: 1 MiB

typedef struct one_case {
    const char *backend;
    const char *setting, *value; // NULL: auto
    dt_coll     kind;            // the collective whose choice is checked
    const char *small, *large;   // the algorithm expected at 4 KiB and at 1 MiB
} one_case;

static const one_case cases[] = {
    {"tcp", NULL, NULL, DT_COLL_ALL_REDUCE, "rdouble", "ring"},
    {"tcp", "DT_ALLREDUCE_ALGO", "ring", DT_COLL_ALL_REDUCE, "ring", "ring"},
    {"tcp", "DT_ALLREDUCE_ALGO", "rdouble", DT_COLL_ALL_REDUCE, "rdouble", "rdouble"},
    {"tcp", "DT_BROADCAST_ALGO", "chain", DT_COLL_BROADCAST, "chain", "chain"},
    {"tcp", "DT_BROADCAST_ALGO", "tree", DT_COLL_BROADCAST, "tree", "tree"},
    {"shm", NULL, NULL, DT_COLL_ALL_REDUCE, "shm", "shm"},
    {"shm", "DT_ALLREDUCE_ALGO", "ring", DT_COLL_ALL_REDUCE, "ring", "ring"},
    {"shm", "DT_ALLREDUCE_ALGO", "rdouble", DT_COLL_ALL_REDUCE, "rdouble", "rdouble"},
    {"shm", "DT_BROADCAST_ALGO", "chain", DT_COLL_BROADCAST, "chain", "chain"},
    {"shm", "DT_BROADCAST_ALGO", "tree", DT_COLL_BROADCAST, "tree", "tree"},
    {"hybrid", NULL, NULL, DT_COLL_ALL_REDUCE, "rdouble", "hier"},
    {"hybrid", "DT_ALLREDUCE_ALGO", "hier", DT_COLL_ALL_REDUCE, "hier", "hier"},
    {"hybrid", "DT_ALLREDUCE_ALGO", "ring", DT_COLL_ALL_REDUCE, "ring", "ring"},
    {"hybrid", "DT_BROADCAST_ALGO", "chain", DT_COLL_BROADCAST, "chain", "chain"},
    {"hybrid", NULL, NULL, DT_COLL_BROADCAST, "tree", "hier"},
    {"hybrid", "DT_BROADCAST_ALGO", "hier", DT_COLL_BROADCAST, "hier", "hier"},
};

static dt_pg *join(int rank, const char *backend) {
    if (strcmp(backend, "hybrid") == 0)
        mp_fake_host(rank / 2); // 2 fake hosts of 2 ranks
    return mp_pg_open(backend, 30000);
}

// What the group's table picks for `kind` over `count` int32s.
static const char *chosen(const dt_pg *pg, dt_coll kind, size_t count) {
    dt_op op    = {.kind = kind, .count = count, .dtype = DT_INT32, .op = DT_REDUCE_SUM, .root = 0};
    op.fp.order = DT_ORDER_ANY;
    return dt_algo_chosen(&pg->xport, &pg->algo, &op);
}

// Element i of rank r's buffer; the sum over ranks is known in closed form.
static int32_t value(int r, size_t i) {
    return (int32_t)((size_t)(r + 1) * 1000003u + i % 7919u) - 4000000;
}

static void check_results(dt_pg *pg, int rank, int world, size_t count) {
    int32_t *buf = malloc(count * sizeof *buf);
    if (!CHECK(buf != NULL))
        return;
    for (size_t i = 0; i < count; i++)
        buf[i] = value(rank, i);
    CHECK_OK(dt_pg_all_reduce(pg, buf, buf, count, DT_INT32, DT_REDUCE_SUM));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t want = 0;
        for (int r = 0; r < world; r++)
            want += value(r, i);
        bad += buf[i] != (int32_t)want;
    }
    CHECK_EQ(bad, (size_t)0);
    // Every root: a tree or chain rooted elsewhere than rank 0; on hybrid, roots on
    // either host at either local index (the cross step runs among other ranks).
    for (int root = 0; root < world; root++) {
        for (size_t i = 0; i < count; i++)
            buf[i] = rank == root ? value(root, i) : 0;
        CHECK_OK(dt_pg_broadcast(pg, buf, count, DT_INT32, root));
        bad = 0;
        for (size_t i = 0; i < count; i++)
            bad += buf[i] != value(root, i);
        CHECK_EQ(bad, (size_t)0);
    }
    free(buf);
}

static void ranks(int rank, int world, void *arg) {
    const one_case *c  = arg;
    dt_pg          *pg = join(rank, c->backend);
    if (!CHECK(pg != NULL))
        return;
    CHECK(strcmp(dt_pg_backend(pg), c->backend) == 0);
    const char *s = chosen(pg, c->kind, SMALL_COUNT), *l = chosen(pg, c->kind, LARGE_COUNT);
    bool        ok = CHECK(strcmp(s, c->small) == 0);
    ok             = CHECK(strcmp(l, c->large) == 0) && ok;
    if (!ok)
        fprintf(stderr, "rank %d, %s %s=%s: expected %s and %s, found %s and %s\n", rank,
                c->backend, c->setting ? c->setting : "", c->value ? c->value : "auto", c->small,
                c->large, s, l);
    check_results(pg, rank, world, SMALL_COUNT);
    check_results(pg, rank, world, LARGE_COUNT);
    dt_pg_free(pg);
}

static void test_forced(void) {
    // The hybrid's hier from 64 KiB: the small buffer stays flat, the large one is not.
    setenv("DT_HYBRID_MIN_BYTES", "65536", 1);
    setenv("DT_HYBRID_BCAST_MIN_BYTES", "65536", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        one_case c = cases[i];
        fprintf(stderr, "  %s, %s=%s\n", c.backend, c.setting ? c.setting : "DT_*_ALGO",
                c.value ? c.value : "auto");
        if (c.setting)
            setenv(c.setting, c.value, 1);
        mp_opts o = {.world = strcmp(c.backend, "hybrid") == 0 ? 4 : 3, .timeout_ms = 60000};
        MP_RUN(&o, ranks, &c);
        if (c.setting)
            unsetenv(c.setting);
    }
    unsetenv("DT_HYBRID_MIN_BYTES");
    unsetenv("DT_HYBRID_BCAST_MIN_BYTES");
}

int main(void) {
    RUN(test_forced);
    return check_summary();
}
