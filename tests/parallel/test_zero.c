// test_zero.c: ZeRO stages 1 and 2 (zero.h) in real processes.
//
// The workload: a table of tensors of awkward sizes (a frozen one in the middle, biases
// flagged no-decay) whose gradient is that of 0.5 (p_i x_si - y_si)^2 averaged over the
// samples s of the global batch, x and y hashed from (step, s, i); rank r of W takes
// samples [r B/W, (r + 1) B/W) and reports each tensor's gradient last tensor first, as
// a backward does. AdamW with weight decay 0.1 on weights and 0 on the no-decay group,
// gradients clipped to a norm that clips every step. Asserted:
// - stages 1 and 2 at 2 and 4 ranks (one bucket, and buckets smaller than a tensor so
//   chunks, remainders and frozen tensors cut across ranks) end with the parameters of
//   the one-process run on the global batch and of plain DDP at the same world size,
//   to rounding, and bitwise equal on every rank;
// - the optimizer state of each rank is 2 floats per shard float (Adam's m and v), the
//   shards partition the table, and a rank holds at most 1/W of DDP's state plus the
//   remainders (fewer than W floats per bucket);
// - a checkpoint saved at 4 ranks under ZeRO loads at 2 ranks (ZeRO) and at 1 (plain
//   optimizer) and the runs continue to the uninterrupted run's parameters;
// - a rank killed in the middle of a step stops every other rank within the bound,
//   with an error naming it.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/ckpt.h"
#include "dtrain/ddp.h"
#include "dtrain/optim.h"
#include "dtrain/zero.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { BATCH = 8, STEPS = 6, SPLIT = 3 };
#define MAX_NORM 0.05f

typedef struct tdef {
    const char *name;
    int64_t     rows, cols;
    uint32_t    flags;
} tdef;

static const tdef tensors[] = {
    {"a.weight", 7, 13, 0}, {"a.bias", 7, 1, DT_PARAM_NO_DECAY}, {"frozen", 3, 3, DT_PARAM_FROZEN},
    {"b.weight", 5, 11, 0}, {"b.bias", 5, 1, DT_PARAM_NO_DECAY}, {"c.weight", 37, 1, 0},
};
enum { NT = sizeof tensors / sizeof tensors[0] };

static dt_params *make_table(void) {
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    for (int i = 0; i < NT; i++) {
        int64_t shape[2] = {tensors[i].rows, tensors[i].cols};
        CHECK_OK(dt_params_add(p, tensors[i].name, tensors[i].cols > 1 ? 2 : 1, shape,
                               tensors[i].flags));
    }
    CHECK_OK(dt_params_alloc(p));
    float *w = dt_params_data(p);
    for (size_t i = 0; i < dt_params_numel(p); i++)
        w[i] = 0.3f * sinf((float)i * 0.7f);
    return p;
}

static float hashf(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                 (c + 7) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    h *= 0xD6E8FEEBA3C6A4B5ull;
    h ^= h >> 29;
    return (float)((double)(h >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

// This rank's share of the global batch's mean gradient (sum over its samples / B x W
// / W... i.e. the mean over its own samples), reported tensor by tensor, last first.
static void backward(dt_params *p, int64_t step, int rank, int world) {
    dt_params_zero_grad(p);
    const float *w   = dt_params_data(p);
    float       *g   = dt_params_grads(p);
    int          per = BATCH / world;
    for (int t = NT - 1; t >= 0; t--) {
        const dt_param_info *pi = dt_params_info(p, t);
        for (size_t i = pi->offset; i < pi->offset + pi->count; i++)
            for (int s = rank * per; s < (rank + 1) * per; s++) {
                float x = hashf((uint64_t)step, (uint64_t)s, i) + 1.5f;
                float y = hashf((uint64_t)step + 1000, (uint64_t)s, i);
                g[i] += (w[i] * x - y) * x / (float)per;
            }
        CHECK_OK(dt_params_grad_ready(p, pi->offset, pi->count));
    }
}

static dt_optim *make_optim(dt_params *p) {
    dt_adam_opts ao = dt_adamw_opts_default();
    ao.lr = 0.02f, ao.weight_decay = 0.1f;
    dt_optim *o = NULL;
    CHECK_OK(dt_adamw_new(&o, p, &ao));
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0;
    CHECK_OK(dt_optim_add_group(o, dt_param_no_decay, NULL, &nd, NULL));
    return o;
}

// Steps [from, to) of the one-process run on the global batch.
static void serial_steps(dt_params *p, dt_optim *o, int64_t from, int64_t to) {
    for (int64_t s = from; s < to; s++) {
        backward(p, s, 0, 1);
        float norm;
        CHECK_OK(dt_clip_grad_norm(p, MAX_NORM, &norm));
        CHECK(norm > MAX_NORM); // every step clips
        dt_optim_step(o);
    }
}

static float *serial_result(int64_t steps) {
    dt_params *p = make_table();
    dt_optim  *o = make_optim(p);
    serial_steps(p, o, 0, steps);
    float *out = malloc(dt_params_numel(p) * sizeof(float));
    memcpy(out, dt_params_data(p), dt_params_numel(p) * sizeof(float));
    dt_optim_free(o);
    dt_params_free(p);
    return out;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void zero_steps(dt_zero *z, dt_params *p, int64_t from, int64_t to, int rank, int world) {
    for (int64_t s = from; s < to; s++) {
        backward(p, s, rank, world);
        CHECK_OK(dt_zero_sync(z));
        float norm;
        CHECK_OK(dt_zero_clip_grad_norm(z, MAX_NORM, &norm));
        CHECK(norm > MAX_NORM);
        CHECK_OK(dt_zero_step(z));
    }
}

static bool replicas_equal(dt_pg *pg, dt_params *p) {
    int32_t mine = (int32_t)dt_crc32c(0, dt_params_data(p), dt_params_numel(p) * 4), all[8];
    CHECK_OK(dt_pg_all_gather(pg, &mine, all, 1, DT_INT32));
    for (int r = 0; r < dt_pg_size(pg); r++)
        if (all[r] != mine)
            return false;
    return true;
}

// ------------------------------------------------------------- equality and memory

typedef struct eq_case {
    size_t bucket_cap; // bytes; 0 = default (one bucket)
} eq_case;

static void equality_rank(int rank, int world, void *arg) {
    const eq_case *c  = arg;
    dt_pg         *pg = mp_pg_init(0);
    if (!pg)
        return;
    float *ref = serial_result(STEPS);

    // Plain DDP at this world size.
    dt_params  *dp       = make_table();
    dt_optim   *dopt     = make_optim(dp);
    dt_ddp_opts ddo      = dt_ddp_opts_default();
    ddo.bucket_cap_bytes = c->bucket_cap;
    dt_ddp *ddp          = NULL;
    CHECK_OK(dt_ddp_new(&ddp, dp, pg, &ddo));
    for (int64_t s = 0; ddp && s < STEPS; s++) {
        backward(dp, s, rank, world);
        CHECK_OK(dt_ddp_sync(ddp));
        CHECK_OK(dt_clip_grad_norm(dp, MAX_NORM, NULL));
        dt_optim_step(dopt);
    }
    size_t n = dt_params_numel(dp), ddp_state = 0;
    dt_optim_state(dopt, &ddp_state);
    CHECK_EQ(ddp_state, 2 * n);
    double dd = rel_diff(dt_params_data(dp), ref, n);
    CHECK(dd < 1e-5);

    for (int stage = 1; stage <= 2; stage++) {
        dt_params   *p  = make_table();
        dt_optim    *o  = make_optim(p);
        dt_zero_opts zo = dt_zero_opts_default();
        zo.stage = stage, zo.bucket_cap_bytes = c->bucket_cap;
        dt_zero *z = NULL;
        CHECK_OK(dt_zero_new(&z, p, pg, o, &zo));
        if (!z)
            continue;
        // Memory: Adam's two blocks of the shard only; shards of all ranks partition the
        // table (each chunk once, each remainder on every rank).
        size_t nf = 0, ns = dt_params_numel(dt_zero_shard_params(z)), expect = 0, rems = 0;
        dt_optim_state(o, &nf);
        for (int i = 0; i < dt_zero_num_buckets(z); i++) {
            size_t off, cnt;
            dt_zero_bucket(z, i, &off, &cnt);
            expect += cnt / (size_t)world + cnt % (size_t)world;
            rems += cnt % (size_t)world;
        }
        CHECK_EQ(ns, expect);
        CHECK_EQ(nf, 2 * ns);
        CHECK(nf <= ddp_state / (size_t)world + 2 * rems);
        CHECK(dt_optim_num_params(o) == ns);
        int64_t sum = (int64_t)(ns - rems), total = 0;
        CHECK_OK(dt_pg_all_reduce(pg, &sum, &total, 1, DT_INT64, DT_REDUCE_SUM));
        // The trainable buckets hold every float but the frozen tensor outside them.
        size_t covered = 0;
        for (int i = 0; i < dt_zero_num_buckets(z); i++) {
            size_t off, cnt;
            dt_zero_bucket(z, i, &off, &cnt);
            covered += cnt;
        }
        CHECK_EQ((size_t)total + rems, covered);

        zero_steps(z, p, 0, STEPS, rank, world);
        double dz  = rel_diff(dt_params_data(p), ref, n);
        double dzd = rel_diff(dt_params_data(p), dt_params_data(dp), n);
        if (!CHECK(dz < 1e-5) || !CHECK(dzd < 1e-5))
            fprintf(stderr, "     rank %d stage %d: vs serial %.3g, vs DDP %.3g\n", rank, stage, dz,
                    dzd);
        CHECK(replicas_equal(pg, p));
        // The frozen tensor never moved.
        const dt_param_info *fz = dt_params_info(p, dt_params_find(p, "frozen"));
        CHECK(dt_params_data(p)[fz->offset + 1] == 0.3f * sinf((float)(fz->offset + 1) * 0.7f));
        if (rank == 0)
            fprintf(stderr,
                    "     world %d, stage %d, %d buckets: vs 1 process %.2g, vs DDP %.2g; Adam "
                    "state %zu floats per rank (DDP %zu)\n",
                    world, stage, dt_zero_num_buckets(z), dz, dzd, nf, ddp_state);
        dt_zero_free(z);
        dt_optim_free(o);
        dt_params_free(p);
    }
    dt_ddp_free(ddp);
    dt_optim_free(dopt);
    dt_params_free(dp);
    free(ref);
    dt_pg_free(pg);
}

static void test_equality(void) {
    eq_case one = {0}, many = {.bucket_cap = 96}; // 24 floats: several tensors cut
    for (int w = 2; w <= 4; w += 2) {
        mp_opts o = {.world = w};
        MP_RUN(&o, equality_rank, &one);
        MP_RUN(&o, equality_rank, &many);
    }
}

// ------------------------------------------------------------------ resharding

static char g_dir[256];

static void save_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_params   *p      = make_table();
    dt_optim    *o      = make_optim(p);
    dt_zero_opts zo     = dt_zero_opts_default();
    zo.bucket_cap_bytes = 96;
    dt_zero *z          = NULL;
    CHECK_OK(dt_zero_new(&z, p, pg, o, &zo));
    if (z) {
        zero_steps(z, p, 0, SPLIT, rank, world);
        dt_ckpt_state st = {.params = p, .optim = o, .step = SPLIT};
        CHECK_OK(dt_ckpt_save(g_dir, pg, &st, NULL));
    }
    dt_zero_free(z);
    dt_optim_free(o);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void resume_rank(int rank, int world, void *arg) {
    const float *ref = arg;
    dt_pg       *pg  = mp_pg_init(0);
    if (!pg)
        return;
    dt_params   *p  = make_table();
    dt_optim    *o  = make_optim(p);
    dt_zero_opts zo = dt_zero_opts_default();
    dt_zero     *z  = NULL;
    CHECK_OK(dt_zero_new(&z, p, pg, o, &zo));
    // Without reshard, another world size is refused, naming both.
    dt_ckpt_state st = {.params = p, .optim = o};
    CHECK_ERR(dt_ckpt_load(g_dir, pg, &st, NULL, NULL), DT_ERR_MISMATCH, "world size 4");
    dt_ckpt_opts co = dt_ckpt_opts_default();
    co.reshard      = true;
    dt_ckpt_info info;
    CHECK_OK(dt_ckpt_load(g_dir, pg, &st, &co, &info));
    CHECK(info.found && info.step == SPLIT && info.world == 4);
    dt_ckpt_info_free(&info);
    CHECK_EQ(dt_optim_step_count(o), SPLIT);
    if (z)
        zero_steps(z, p, SPLIT, STEPS, rank, world);
    double d = rel_diff(dt_params_data(p), ref, dt_params_numel(p));
    if (!CHECK(d < 1e-5))
        fprintf(stderr, "     rank %d: resumed at world %d differs by %.3g\n", rank, world, d);
    else if (rank == 0)
        fprintf(stderr, "     saved at 4 ranks, resumed at %d under ZeRO-2: %.2g from 1 process\n",
                world, d);
    dt_zero_free(z);
    dt_optim_free(o);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void test_reshard(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-test-zero-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    float  *ref = serial_result(STEPS);
    mp_opts o4 = {.world = 4}, o2 = {.world = 2};
    MP_RUN(&o4, save_rank, NULL);
    MP_RUN(&o2, resume_rank, ref);

    // One process, a plain (unsharded) optimizer: the same whole state.
    dt_params   *p   = make_table();
    dt_optim    *o   = make_optim(p);
    dt_ckpt_opts co  = dt_ckpt_opts_default();
    co.reshard       = true;
    dt_ckpt_state st = {.params = p, .optim = o};
    CHECK_OK(dt_ckpt_load(g_dir, NULL, &st, &co, NULL));
    serial_steps(p, o, SPLIT, STEPS);
    double d = rel_diff(dt_params_data(p), ref, dt_params_numel(p));
    if (!CHECK(d < 1e-5))
        fprintf(stderr, "     resumed in 1 process differs by %.3g\n", d);
    dt_optim_free(o);
    dt_params_free(p);
    free(ref);
    CHECK(system(cmd) == 0);
}

// ------------------------------------------------------------------- a rank dies

static void kill_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(5000);
    if (!pg)
        return;
    dt_params *p = make_table();
    dt_optim  *o = make_optim(p);
    dt_zero   *z = NULL;
    CHECK_OK(dt_zero_new(&z, p, pg, o, NULL));
    if (z) {
        zero_steps(z, p, 0, 2, rank, world);
        // Once every rank has finished those steps (a rank that dies may be noticed
        // before its peers have read what it sent: the failure must not come earlier).
        double    t0 = dt_now();
        dt_status s  = dt_pg_barrier(pg);
        if (rank == world - 1) {
            // Dies in the middle of the next backward: some buckets started, not all.
            dt_params_zero_grad(p);
            const dt_param_info *pi = dt_params_info(p, NT - 1);
            CHECK_OK(dt_params_grad_ready(p, pi->offset, pi->count));
            raise(SIGKILL);
        }
        for (int64_t step = 2; step < 50 && s == DT_OK; step++) {
            backward(p, step, rank, world);
            s = dt_zero_sync(z);
            if (s == DT_OK)
                s = dt_zero_step(z);
        }
        double waited = dt_now() - t0;
        CHECK(s != DT_OK);
        char want[32];
        snprintf(want, sizeof want, "rank %d", world - 1);
        if (!CHECK(strstr(dt_last_error(), want) != NULL))
            fprintf(stderr, "     rank %d: error does not name rank %d: %s\n", rank, world - 1,
                    dt_last_error());
        CHECK(waited < 15.0);
        if (rank == 0)
            fprintf(stderr, "     rank %d killed mid-step: rank 0 stopped after %.2f s: %s\n",
                    world - 1, waited, dt_last_error());
    }
    dt_zero_free(z);
    dt_optim_free(o);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void test_kill(void) {
    mp_opts o = {.world = 3, .may_die = 1u << 2};
    MP_RUN(&o, kill_rank, NULL);
}

// ------------------------------------------------------------------ arguments

static void test_arguments(void) {
    dt_params   *p  = make_table();
    dt_optim    *o  = make_optim(p);
    dt_zero     *z  = NULL;
    dt_zero_opts zo = dt_zero_opts_default();
    zo.stage        = 4;
    CHECK_ERR(dt_zero_new(&z, p, NULL, o, &zo), DT_ERR_ARG, "stage 1, 2 or 3");
    CHECK(z == NULL);
    zo.stage = 0;
    CHECK_ERR(dt_zero_new(&z, p, NULL, o, &zo), DT_ERR_ARG, "dt_ddp_new");
    zo.stage = 1;
    CHECK_ERR(dt_zero_new(&z, p, NULL, o, &zo), DT_ERR_ARG, "NULL group");
    dt_optim_free(o);
    dt_params_free(p);
}

int main(void) {
    test_arguments();
    test_equality();
    test_reshard();
    test_kill();
    return check_summary();
}
