// group_suite.c: the sub-group suite (see group_suite.h).
#include "group_suite.h"
#include "coll_suite.h"

#include <string.h>

static bool has(const char *s, const char *needle) {
    return strstr(s, needle) != NULL;
}

// Checks a group's shape: size, rank, local rank and size (when every rank of the world
// runs on one host), and that an all_gather of world ranks lists `members` in group
// order.
static bool one_host;

static void check_shape(dt_pg *g, int world_rank, const int *members, int n) {
    CHECK(g != NULL);
    if (!g)
        return;
    int me = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == world_rank)
            me = i;
    CHECK_EQ(dt_pg_size(g), n);
    CHECK_EQ(dt_pg_rank(g), me);
    if (one_host) {
        CHECK_EQ(dt_pg_local_size(g), n);
        CHECK_EQ(dt_pg_local_rank(g), me);
    }
    int32_t got[8] = {0}, mine = world_rank;
    CHECK_OK(dt_pg_all_gather(g, &mine, got, 1, DT_INT32));
    for (int i = 0; i < n; i++)
        CHECK_EQ(got[i], members[i]);
}

// Sum over the members of (world rank + 1).
static float member_sum(const int *members, int n) {
    float s = 0;
    for (int i = 0; i < n; i++)
        s += (float)(members[i] + 1);
    return s;
}

void group_suite_run_impl(dt_pg *world, uint64_t seed, int *passed, int *failed) {
    int p0 = check_passed, f0 = check_failed;
    check_current = "group_suite";
    int rank      = dt_pg_rank(world);
    one_host      = dt_pg_local_size(world) == dt_pg_size(world);
    CHECK_EQ(dt_pg_size(world), 4);
    coll_suite_opts so = {.seed = seed};

    // Pairs {0,1}, {2,3} by new_group: every rank calls both, gets one.
    static const int lo[2] = {0, 1}, hi[2] = {2, 3};
    dt_pg           *a = NULL, *b = NULL, *pair;
    CHECK_OK(dt_pg_new_group(&a, world, lo, 2, NULL));
    CHECK_OK(dt_pg_new_group(&b, world, hi, 2, NULL));
    CHECK((a != NULL) == (rank < 2) && (b != NULL) == (rank >= 2));
    pair                  = rank < 2 ? a : b;
    const int *pair_ranks = rank < 2 ? lo : hi;
    check_shape(pair, rank, pair_ranks, 2);

    // {0,2}, {1,3} by split.
    dt_pg *odd = NULL;
    CHECK_OK(dt_pg_split(&odd, world, rank % 2, rank, NULL));
    int odd_ranks[2] = {rank % 2, rank % 2 + 2};
    check_shape(odd, rank, odd_ranks, 2);
    if (!pair || !odd)
        goto out;
    so.seed = seed ^ 1;
    COLL_SUITE_RUN(pair, &so);
    so.seed = seed ^ 2;
    COLL_SUITE_RUN(odd, &so);

    // Interleaved with the world, blocking.
    for (int it = 0; it < 3; it++) {
        float v = (float)(rank + 1) * (float)(it + 1), w = v, p = v, o = v;
        CHECK_OK(dt_pg_all_reduce(world, &w, &w, 1, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_OK(dt_pg_all_reduce(pair, &p, &p, 1, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_OK(dt_pg_all_reduce(odd, &o, &o, 1, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_EQ(w, 10.0f * (float)(it + 1));
        CHECK_EQ(p, member_sum(pair_ranks, 2) * (float)(it + 1));
        CHECK_EQ(o, member_sum(odd_ranks, 2) * (float)(it + 1));
    }
    // Async on two groups and the world at once, then send/recv in group ranks.
    {
        enum { N = 1000 };
        static float w[N], p[N], o[N];
        for (int i = 0; i < N; i++)
            w[i] = p[i] = (float)(rank + 1) + (float)i, o[i] = rank == odd_ranks[0] ? (float)i : -1;
        dt_work *ww = NULL, *wp = NULL, *wo = NULL;
        CHECK_OK(dt_pg_all_reduce_async(pair, p, p, N, DT_FLOAT32, DT_REDUCE_MAX, &wp));
        CHECK_OK(dt_pg_all_reduce_async(world, w, w, N, DT_FLOAT32, DT_REDUCE_SUM, &ww));
        CHECK_OK(dt_pg_broadcast_async(odd, o, N, DT_FLOAT32, 0, &wo));
        CHECK_OK(dt_work_wait(wo));
        CHECK_OK(dt_work_wait(ww));
        CHECK_OK(dt_work_wait(wp));
        dt_work_free(ww), dt_work_free(wp), dt_work_free(wo);
        bool ok = true;
        for (int i = 0; i < N; i++)
            ok &= w[i] == 10.0f + 4.0f * (float)i &&
                  p[i] == (float)(pair_ranks[1] + 1) + (float)i && o[i] == (float)i;
        CHECK(ok);
        int32_t msg = rank * 100 + 7, got = -1;
        if (dt_pg_rank(pair) == 0)
            CHECK_OK(dt_pg_send(pair, &msg, 1, DT_INT32, 1, 5));
        else
            CHECK_OK(dt_pg_recv(pair, &got, 1, DT_INT32, 0, 5));
        if (dt_pg_rank(pair) == 1)
            CHECK_EQ(got, pair_ranks[0] * 100 + 7);
    }

    // A split of a split: the ranks of {0,2} / {1,3} reversed by key.
    {
        dt_pg *rev = NULL;
        CHECK_OK(dt_pg_split(&rev, odd, 0, -dt_pg_rank(odd), NULL));
        int rev_ranks[2] = {odd_ranks[1], odd_ranks[0]};
        check_shape(rev, rank, rev_ranks, 2);
        if (rev) {
            so.seed = seed ^ 3;
            COLL_SUITE_RUN(rev, &so);
        }
        // And a split where only one rank of each pair takes part (a singleton).
        dt_pg *one = NULL;
        CHECK_OK(dt_pg_split(&one, pair, dt_pg_rank(pair) == 0 ? 0 : -1, 0, NULL));
        CHECK((one != NULL) == (dt_pg_rank(pair) == 0));
        float x = 3;
        if (one)
            CHECK_OK(dt_pg_all_reduce(one, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_EQ(x, 3.0f);
        dt_pg_free(one);
        dt_pg_free(rev);
    }

    // A group of 3 (the list in any order) and singletons.
    {
        static const int three[3] = {3, 0, 1};
        dt_pg           *t        = NULL;
        CHECK_OK(dt_pg_new_group(&t, world, three, 3, NULL));
        CHECK((t != NULL) == (rank != 2));
        if (t) {
            static const int sorted[3] = {0, 1, 3};
            check_shape(t, rank, sorted, 3);
            so.seed = seed ^ 4;
            COLL_SUITE_RUN(t, &so);
        }
        dt_pg *s = NULL;
        CHECK_OK(dt_pg_split(&s, world, rank, 0, NULL));
        int me = rank;
        check_shape(s, rank, &me, 1);
        if (s) {
            so.seed = seed ^ 5;
            COLL_SUITE_RUN(s, &so);
        }
        // The world still works after all that, and a group is freed while another
        // is in use.
        dt_pg_free(s);
        float v = 1;
        CHECK_OK(dt_pg_all_reduce(world, &v, &v, 1, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_EQ(v, 4.0f);
        dt_pg_free(t);
    }
out:
    dt_pg_free(odd);
    dt_pg_free(a);
    dt_pg_free(b);
    CHECK_OK(dt_pg_barrier(world));
    *passed += check_passed - p0;
    *failed += check_failed - f0;
}

void group_suite_errors_impl(dt_pg *world, int *passed, int *failed) {
    int p0 = check_passed, f0 = check_failed;
    check_current = "group_suite_errors";
    int   rank    = dt_pg_rank(world);
    float x       = 1;
    // A rank outside a group holds NULL: using it is an argument error.
    CHECK_ERR(dt_pg_all_reduce(NULL, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_ARG, "NULL");
    // Bad lists, refused before anything is sent (every rank passes the same one).
    dt_pg    *g       = (dt_pg *)&x; // must come back NULL
    const int bad1[2] = {0, 4}, bad2[2] = {1, 1};
    CHECK_ERR(dt_pg_new_group(&g, world, bad1, 2, NULL), DT_ERR_ARG, "found 4");
    CHECK(g == NULL);
    CHECK_ERR(dt_pg_new_group(&g, world, bad2, 2, NULL), DT_ERR_ARG, "twice");
    CHECK_ERR(dt_pg_new_group(&g, world, bad2, 0, NULL), DT_ERR_ARG, "found 0");
    CHECK_ERR(dt_pg_split(&g, NULL, 0, 0, NULL), DT_ERR_ARG, "NULL");
    CHECK_OK(dt_pg_barrier(world));
    // Lists that differ between ranks: every rank is told, the world stays usable.
    const int l0[2] = {0, 1}, l1[2] = {0, 2};
    CHECK_ERR(dt_pg_new_group(&g, world, rank == 0 ? l0 : l1, 2, NULL), DT_ERR_MISMATCH,
              "another list of ranks");
    CHECK(g == NULL);
    CHECK_OK(dt_pg_barrier(world));
    // Two ranks of a group calling different collectives: both fail, the message names
    // the group, and the failure stops every group of the process (the world too).
    dt_pg *pair = NULL;
    CHECK_OK(dt_pg_split(&pair, world, rank / 2, rank, NULL));
    // Both pairs fail, and a fast rank's failure may reach a slow rank still in this
    // barrier (every group of a process shares one poison): its result is not checked.
    dt_pg_barrier(world);
    if (pair) {
        float       buf[4] = {1, 2, 3, 4};
        dt_status   st     = dt_pg_rank(pair) == 0
                                 ? dt_pg_all_reduce(pair, buf, buf, 4, DT_FLOAT32, DT_REDUCE_SUM)
                                 : dt_pg_broadcast(pair, buf, 4, DT_FLOAT32, 0);
        const char *msg    = dt_last_error();
        CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_PEER);
        CHECK(has(msg, "group") && has(msg, "world rank"));
        if (!has(msg, "group"))
            fprintf(stderr, "     rank %d: %s: %s\n", rank, dt_status_str(st), msg);
        CHECK(dt_pg_barrier(world) != DT_OK);
        dt_pg_free(pair);
    }
    *passed += check_passed - p0;
    *failed += check_failed - f0;
}
