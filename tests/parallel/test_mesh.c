// test_mesh.c: the device mesh (mesh.h) in real processes, 4 ranks as 2x2 (dp x pp,
// pp x tp) and 8 ranks as 2x2x2. Every rank all-gathers its world rank over each of its
// three groups; the members must be exactly the world ranks that share the other two
// coordinates, in the order of the group's own coordinate, and an all_reduce over each
// group must sum only its members. Bad sizes fail naming them.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/mesh.h"
#include "dtrain/pipe.h"
#include "dtrain/train.h"

static void ranks(int rank, int world, void *arg) {
    const dt_mesh_opts *mo = arg;
    dt_pg              *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_mesh *m = NULL;
    CHECK_OK(dt_mesh_new(&m, pg, mo));
    if (!CHECK(m != NULL)) {
        dt_pg_free(pg);
        return;
    }
    int dp = dt_mesh_size(m, DT_MESH_DP), pp = dt_mesh_size(m, DT_MESH_PP),
        tp = dt_mesh_size(m, DT_MESH_TP);
    CHECK_EQ(dp * pp * tp, world);
    int c[3] = {dt_mesh_coord(m, DT_MESH_DP), dt_mesh_coord(m, DT_MESH_PP),
                dt_mesh_coord(m, DT_MESH_TP)};
    CHECK_EQ(dt_mesh_rank_of(m, c[0], c[1], c[2]), rank);
    CHECK_EQ(c[2], rank % tp);
    CHECK_EQ(c[1], (rank / tp) % pp);
    CHECK_EQ(c[0], rank / (pp * tp));
    for (int d = 0; d < DT_MESH_DIM_COUNT_; d++) {
        dt_pg *g = dt_mesh_group(m, (dt_mesh_dim)d);
        int    n = dt_mesh_size(m, (dt_mesh_dim)d);
        CHECK_EQ(dt_pg_size(g), n);
        CHECK_EQ(dt_pg_rank(g), c[d]);
        int32_t me = rank, members[8] = {0};
        CHECK_OK(dt_pg_all_gather(g, &me, members, 1, DT_INT32));
        int32_t sum = 0, expect = 0;
        for (int i = 0; i < n; i++) {
            int cc[3] = {c[0], c[1], c[2]};
            cc[d]     = i;
            int want  = dt_mesh_rank_of(m, cc[0], cc[1], cc[2]);
            CHECK_EQ(members[i], want);
            expect += want;
        }
        CHECK_OK(dt_pg_all_reduce(g, &me, &sum, 1, DT_INT32, DT_REDUCE_SUM));
        CHECK_EQ(sum, expect);
    }
    dt_mesh_free(m);
    dt_pg_free(pg);
}

static void sizes(void) {
    int s[3];
    CHECK_OK(dt_mesh_sizes(8, &(dt_mesh_opts){.pp = 2}, s));
    CHECK(s[0] == 4 && s[1] == 2 && s[2] == 1);
    CHECK_OK(dt_mesh_sizes(8, NULL, s));
    CHECK(s[0] == 8 && s[1] == 1 && s[2] == 1);
    CHECK_ERR(dt_mesh_sizes(8, &(dt_mesh_opts){.pp = 3}, s), DT_ERR_ARG, "does not divide");
    CHECK_ERR(dt_mesh_sizes(8, &(dt_mesh_opts){.dp = 3, .pp = 2}, s), DT_ERR_ARG, "3 x 2 x 1");
}

// The trainer's flags: offered where the program says it can use them, refused elsewhere,
// checked against the world size where it is known (--num-processes) before anything
// starts; a program whose model cannot be cut refuses --pp and --tp, saying why.
static void flags(void) {
    dt_trainer_opts to = dt_trainer_opts_default();
    to.program         = "test";
    to.model_parallel  = true;
    char       *argv[] = {"test",  "--pp",
                          "2",     "--tp",
                          "2",     "--micro-batches",
                          "8",     "--schedule",
                          "gpipe", "--num-processes",
                          "8",     NULL};
    dt_trainer *t      = NULL;
    CHECK_OK(dt_trainer_new(&t, 11, argv, &to));
    if (CHECK(t != NULL)) {
        const dt_train_args *a = dt_trainer_args(t);
        CHECK(a->pp == 2 && a->tp == 2 && a->dp == 0 && a->micro_batches == 8);
        CHECK(strcmp(a->cuts, "auto") == 0);
        dt_pipe_schedule s;
        CHECK_OK(dt_pipe_schedule_parse(a->schedule, &s));
        CHECK(s == DT_PIPE_GPIPE);
        int sz[3];
        CHECK_OK(dt_mesh_sizes(8, &(dt_mesh_opts){(int)a->dp, (int)a->pp, (int)a->tp}, sz));
        CHECK(sz[DT_MESH_DP] == 2);
        dt_trainer_exit(t, DT_OK);
    }
    t           = NULL;
    char *bad[] = {"test", "--schedule", "zb", NULL};
    CHECK_ERR(dt_trainer_new(&t, 3, bad, &to), DT_ERR_ARG, "gpipe or 1f1b");
    char *odd[] = {"test", "--pp", "2", "--num-processes", "3", NULL}; // 2 does not divide 3
    CHECK_ERR(dt_trainer_new(&t, 5, odd, &to), DT_ERR_ARG, "--pp 2 with 3 rank(s)");
    char *dp[] = {"test", "--dp", "3", "--pp", "2", "--num-processes", "4", NULL};
    CHECK_ERR(dt_trainer_new(&t, 7, dp, &to), DT_ERR_ARG, "3 x 2 x 1");
    char *cuts[] = {"test", "--pp", "3", "--cuts", "a,b,c", "--num-processes", "3", NULL};
    CHECK_ERR(dt_trainer_new(&t, 7, cuts, &to), DT_ERR_ARG, "expected 2 name(s)");
    to.no_model_split = "its BatchNorm needs whole batches";
    char *nosplit[]   = {"test", "--tp", "2", "--num-processes", "2", NULL};
    CHECK_ERR(dt_trainer_new(&t, 5, nosplit, &to), DT_ERR_ARG,
              "test cannot be split over tensor-parallel ranks: its BatchNorm");
    char *dponly[] = {"test", "--dp", "2", "--num-processes", "2", NULL};
    CHECK_OK(dt_trainer_new(&t, 5, dponly, &to));
    dt_trainer_exit(t, DT_OK);
    t                 = NULL;
    to.model_parallel = false;
    CHECK_ERR(dt_trainer_new(&t, 3, argv, &to), DT_ERR_ARG, "--pp");
    CHECK(t == NULL);
}

int main(void) {
    RUN(sizes);
    RUN(flags);
    struct {
        int          world;
        dt_mesh_opts o;
    } cases[] = {
        {4, {.pp = 2}},          // dp 2 x pp 2
        {4, {.pp = 2, .tp = 2}}, // pp 2 x tp 2
        {4, {.dp = 2, .tp = 2}}, // dp 2 x tp 2
        {8, {.pp = 2, .tp = 2}}, // 2 x 2 x 2
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_current = "mesh";
        mp_opts o     = {.world = cases[i].world, .timeout_ms = 60000};
        fprintf(stderr, "mesh world %d: dp %d pp %d tp %d\n", cases[i].world, cases[i].o.dp,
                cases[i].o.pp, cases[i].o.tp);
        MP_RUN(&o, ranks, &cases[i].o);
    }
    return check_summary();
}
