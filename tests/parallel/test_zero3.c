// test_zero3.c: ZeRO stage 3 (zero.h) over a model graph, in real processes.
//
// The model: a one-block GPT whose head is tied to the token embedding (the tied tensor
// lies in the first unit and is read again by the last step of forward and the first of
// backward), dropout keyed by the sample. AdamW with a no-decay group, gradients clipped
// every step. Asserted:
// - ZeRO 1, 2 and 3 at 2 and 4 ranks (B/N samples each) take the gradient norms of one
//   process on the whole batch at every step (1e-5: Adam and clipping would hide a
//   gradient off by a factor) and end with its parameters, to rounding (1e-4: Adam
//   divides by the root of tiny second moments, which magnifies the reduction order's
//   rounding; stages 1 and 2 land 3e-5 away, stage 3 as close); stage 3 also with two
//   micro-batches per step, with a bound on the live units, with units of one node or
//   of the whole model, with rank ranges cutting tensors anywhere (shard_align 4), with
//   2 threads per rank (their gradient partials given back) and in bf16 (the weights'
//   16-bit copies made as each unit arrives, against a bf16 run of one process);
// - stage 3's memory on a wider model at page granularity: between steps a rank's
//   resident parameter and gradient pages are its range's, its Adam state 2 floats per
//   float of that range, the units gathered at once stay under max_live_bytes, the
//   resident peak inside a step under range + live units + a few pages, and later
//   steps prefetch;
// - a stage-3 checkpoint saved at 4 ranks resumes at 2 ranks (stage 3) and in 1
//   process (plain AdamW) with the uninterrupted run's next loss and final parameters;
// - a rank killed in the middle of a forward stops every other rank within the bound,
//   naming it; bad arguments are refused, naming what was expected.
#include "../check.h"
#include "../lib/graphs.h"
#include "../lib/mp.h"
#include "dtrain/ckpt.h"
#include "dtrain/zero.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { T = 6, C = 8, HEADS = 2, VOCAB = 11, B = 8, STEPS = 5, SPLIT = 2, MAXP = 4096 };
#define MAX_NORM 0.05f

static int32_t g_tok[STEPS * B][T + 1];

static void make_data(void) {
    dt_rng r = dt_rng_init(21);
    for (int i = 0; i < STEPS * B; i++)
        for (int t = 0; t <= T; t++)
            g_tok[i][t] = (int32_t)dt_rng_below(&r, VOCAB);
}

static dt_graph *build(int t, int c, int heads, int vocab) {
    dt_graph *g = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_gpt(g, t, c, heads, vocab, 0.2f));
    CHECK_OK(dt_graph_finalize(g, 99));
    return g;
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

// One step's forward and backward on samples [lo, lo + n) of step s's batch: the mean
// loss over them and, added to the gradients, its gradient.
static float fwd_bwd(dt_graph *g, int s, int lo, int n) {
    int32_t  idx[B * T], pos[B * T], tgt[B * T];
    uint64_t keys[B];
    float    dl[B * T * VOCAB], loss = NAN;
    for (int i = 0; i < n; i++) {
        int gi  = s * B + lo + i;
        keys[i] = (uint64_t)gi;
        for (int t = 0; t < T; t++) {
            idx[i * T + t] = g_tok[gi][t];
            pos[i * T + t] = t;
            tgt[i * T + t] = g_tok[gi][t + 1];
        }
    }
    dt_rng root = dt_rng_init(5), r = dt_rng_split(&root, (uint64_t)s);
    dt_graph_set_rng(g, &r);
    CHECK_OK(dt_graph_set_sample_keys(g, keys, n));
    CHECK_OK(dt_graph_forward(g, (const void *[]){idx, pos}, n));
    CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(g), tgt, n * T, VOCAB, -1, 0.0f, &loss, dl));
    CHECK_OK(dt_graph_backward(g, dl));
    return loss;
}

// Steps [from, to) in one process on the whole batch; the losses go to loss[s].
static float g_ref[MAXP], g_ref_loss[STEPS], g_ref_norm[STEPS];
static float g_ref16[MAXP], g_ref16_norm[STEPS]; // the bf16 run's
static bool  g_bf16;                             // the case being run is bf16

static void serial_steps(dt_graph *g, dt_optim *o, int from, int to, float *loss) {
    for (int s = from; s < to; s++) {
        dt_params_zero_grad(dt_graph_params(g));
        float l = fwd_bwd(g, s, 0, B);
        if (loss)
            loss[s] = l;
        CHECK_OK(dt_clip_grad_norm(dt_graph_params(g), MAX_NORM,
                                   g_bf16 ? &g_ref16_norm[s] : &g_ref_norm[s]));
        dt_optim_step(o);
    }
}

static size_t g_n;

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// Steps [from, to) under ZeRO over rank's B/N samples, in `micro` micro-batches; the
// mean loss over ranks of each step goes to loss[s].
static void zero_steps(dt_zero *z, dt_graph *g, dt_pg *pg, int from, int to, int micro,
                       float *loss) {
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg), per = B / world, mb = per / micro;
    for (int s = from; s < to; s++) {
        dt_params_zero_grad(dt_graph_params(g));
        float l = 0;
        for (int k = 0; k < micro; k++) {
            dt_zero_set_sync(z, k == micro - 1);
            l += fwd_bwd(g, s, rank * per + k * mb, mb) / (float)micro;
        }
        CHECK_OK(dt_zero_sync(z));
        if (micro > 1)
            dt_zero_scale_grad(z, 1.0f / (float)micro);
        float norm = NAN;
        CHECK_OK(dt_zero_clip_grad_norm(z, MAX_NORM, &norm));
        float ref = g_bf16 ? g_ref16_norm[s] : g_ref_norm[s];
        // bf16: weights a rounding apart may round to different 16-bit values
        if (B % world == 0 && !CHECK(fabsf(norm - ref) <= (g_bf16 ? 1e-3f : 1e-5f) * ref))
            fprintf(stderr, "     rank %d step %d: gradient norm %.7g, 1 process %.7g\n", rank, s,
                    (double)norm, (double)ref);
        CHECK_OK(dt_zero_step(z));
        CHECK_OK(dt_pg_all_reduce(pg, &l, &l, 1, DT_FLOAT32, DT_REDUCE_AVG));
        if (loss)
            loss[s] = l;
    }
}

// The whole parameters on every rank, compared with the one-process run; bitwise the
// same on every rank.
static void check_result(dt_zero *z, dt_graph *g, dt_pg *pg, const char *what) {
    dt_params *p = dt_graph_params(g);
    CHECK_OK(dt_zero_params_gather(z, -1));
    double   d    = rel_diff(dt_params_data(p), g_bf16 ? g_ref16 : g_ref, g_n);
    uint32_t mine = dt_crc32c(0, dt_params_data(p), g_n * sizeof(float)), all[4];
    CHECK_OK(dt_pg_all_gather(pg, &mine, all, 1, DT_INT32));
    for (int r = 0; r < dt_pg_size(pg); r++)
        CHECK(all[r] == mine);
    if (!CHECK(d < 1e-4))
        fprintf(stderr, "     rank %d, %s: differs from 1 process by %.3g\n", dt_pg_rank(pg), what,
                d);
    else if (dt_pg_rank(pg) == 0)
        fprintf(stderr, "     world %d, %s: %.2g from 1 process\n", dt_pg_size(pg), what, d);
    CHECK_OK(dt_zero_params_release(z));
}

// ---------------------------------------------------------------------- equality

typedef struct eq_case {
    int         stage, micro, threads;
    bool        bf16;
    size_t      unit_bytes, align, live;
    const char *what;
} eq_case;

static const eq_case cases[] = {
    {1, 1, 1, false, 0, 0, 0, "stage 1"},
    {2, 1, 1, false, 0, 0, 0, "stage 2"},
    {3, 1, 1, false, 64, 4, 0, "stage 3, a unit per node, ranges cut at 4 floats"},
    {3, 2, 1, false, 64, 4, 0, "stage 3, 2 micro-batches"},
    {3, 1, 1, false, 64, 1, 4096, "stage 3, at most 4 KiB of units live"},
    {3, 1, 1, false, 1 << 20, 8, 0, "stage 3, one unit"},
    {3, 1, 2, false, 256, 0, 0, "stage 3, 2 threads"},
    {3, 1, 1, true, 256, 4, 0, "stage 3, bf16"},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static void equality_rank(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    for (int c = 0; c < NCASES; c++) {
        const eq_case *e = &cases[c];
        dt_graph      *g = build(T, C, HEADS, VOCAB);
        g_bf16           = e->bf16;
        CHECK_OK(dt_graph_set_threads(g, e->threads));
        CHECK_OK(dt_graph_set_precision(g, e->bf16 ? DT_PREC_BF16 : DT_PREC_FP32));
        dt_optim    *o  = make_optim(dt_graph_params(g));
        dt_zero_opts zo = dt_zero_opts_default();
        zo.stage = e->stage, zo.unit_bytes = e->unit_bytes, zo.shard_align = e->align;
        zo.max_live_bytes = e->live;
        dt_zero *z        = NULL;
        CHECK_OK(dt_zero_new(&z, dt_graph_params(g), pg, o, &zo));
        if (z) {
            zero_steps(z, g, pg, 0, STEPS, e->micro, NULL);
            check_result(z, g, pg, e->what);
            dt_zero_usage u;
            dt_zero_get_usage(z, &u);
            if (e->live)
                CHECK(u.live_peak_bytes <= e->live && u.over_limit == 0);
            if (e->stage == 3)
                CHECK(u.reductions > 0 && (e->unit_bytes > 4096 || u.prefetches > 0));
        }
        dt_zero_free(z);
        dt_optim_free(o);
        dt_graph_free(g);
    }
    dt_pg_free(pg);
}

static void test_equality(void) {
    for (int w = 2; w <= 4; w += 2) {
        mp_opts o = {.world = w, .timeout_ms = 60000};
        MP_RUN(&o, equality_rank, NULL);
    }
}

// ---------------------------------------------------------------------- memory

enum { WT = 16, WC = 64, WH = 4, WV = 64 };

static void memory_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_graph    *g = build(WT, WC, WH, WV);
    dt_params   *p = dt_graph_params(g);
    dt_optim    *o = make_optim(p);
    size_t       n = dt_params_numel(p), pg_bytes = dt_page_bytes();
    dt_zero_opts zo = dt_zero_opts_default();
    zo.stage = 3, zo.unit_bytes = 16 << 10, zo.track_resident = true;
    dt_zero_memory plan;
    CHECK_OK(dt_zero_plan_memory(p, o, world, &zo, &plan));
    zo.max_live_bytes = 2 * plan.working; // room for two of the largest units
    dt_zero *z        = NULL;
    CHECK_OK(dt_zero_new(&z, p, pg, o, &zo));
    if (!z) {
        dt_optim_free(o), dt_graph_free(g), dt_pg_free(pg);
        return;
    }
    size_t range = dt_params_numel(dt_zero_shard_params(z)), range_bytes = range * sizeof(float);
    size_t pages = (range_bytes + pg_bytes - 1) / pg_bytes * pg_bytes;
    CHECK(range_bytes <= plan.params);
    CHECK(dt_params_resident(p, false, 0, n) <= pages);
    CHECK(dt_params_resident(p, true, 0, n) == 0);
    // Steps of the wide model on the small data (tokens below VOCAB fit WV).
    int     per = B / world;
    int32_t idx[B * WT], pos[B * WT], tgt[B * WT];
    float  *dl = malloc(sizeof(float) * B * WT * WV);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < per * WT; i++)
            idx[i] = (int32_t)((i * 7 + s) % WV), pos[i] = i % WT, tgt[i] = (i * 5 + 1) % WV;
        dt_params_zero_grad(p);
        float loss;
        CHECK_OK(dt_graph_forward(g, (const void *[]){idx, pos}, per));
        CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(g), tgt, per * WT, WV, -1, 0, &loss, dl));
        CHECK_OK(dt_graph_backward(g, dl));
        CHECK_OK(dt_zero_sync(z));
        CHECK_OK(dt_zero_step(z));
    }
    free(dl);
    size_t nf = 0;
    dt_optim_state(o, &nf);
    CHECK_EQ(nf, 2 * range);
    size_t rp = dt_params_resident(p, false, 0, n), rg = dt_params_resident(p, true, 0, n);
    CHECK(rp <= pages && rg <= pages);
    dt_zero_usage u;
    dt_zero_get_usage(z, &u);
    size_t slack = 8 * pg_bytes, bound = 2 * pages + 2 * u.live_peak_bytes + slack;
    CHECK(u.live_peak_bytes <= zo.max_live_bytes && u.over_limit == 0);
    CHECK(u.resident_peak_bytes - nf * sizeof(float) <= bound);
    CHECK(u.prefetches > 0);
    if (rank == 0)
        fprintf(stderr,
                "     world %d, %zu floats: range %zu, resident after steps %zu + %zu bytes, peak "
                "%zu (bound %zu), live units %zu bytes at most (limit %zu), %lld prefetches\n",
                world, n, range, rp, rg, u.resident_peak_bytes - nf * sizeof(float), bound,
                u.live_peak_bytes, zo.max_live_bytes, (long long)u.prefetches);
    dt_zero_free(z);
    dt_optim_free(o);
    dt_graph_free(g);
    dt_pg_free(pg);
}

static void test_memory(void) {
    for (int w = 2; w <= 4; w += 2) {
        mp_opts o = {.world = w, .timeout_ms = 60000};
        MP_RUN(&o, memory_rank, NULL);
    }
}

// ------------------------------------------------------------------ resharding

static char g_dir[256];

static dt_zero *wrap3(dt_graph *g, dt_optim *o, dt_pg *pg) {
    dt_zero_opts zo = dt_zero_opts_default();
    zo.stage = 3, zo.unit_bytes = 64, zo.shard_align = 4;
    dt_zero *z = NULL;
    CHECK_OK(dt_zero_new(&z, dt_graph_params(g), pg, o, &zo));
    return z;
}

static void save_rank(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_graph *g = build(T, C, HEADS, VOCAB);
    dt_optim *o = make_optim(dt_graph_params(g));
    dt_zero  *z = wrap3(g, o, pg);
    if (z) {
        zero_steps(z, g, pg, 0, SPLIT, 1, NULL);
        CHECK_OK(dt_zero_params_gather(z, 0));
        dt_ckpt_state st = {.params = dt_graph_params(g), .optim = o, .step = SPLIT};
        CHECK_OK(dt_ckpt_save(g_dir, pg, &st, NULL));
        CHECK_OK(dt_zero_params_release(z));
    }
    dt_zero_free(z);
    dt_optim_free(o);
    dt_graph_free(g);
    dt_pg_free(pg);
}

static void resume_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_graph    *g   = build(T, C, HEADS, VOCAB);
    dt_optim    *o   = make_optim(dt_graph_params(g));
    dt_zero     *z   = wrap3(g, o, pg);
    dt_ckpt_opts co  = dt_ckpt_opts_default();
    co.reshard       = true;
    dt_ckpt_state st = {.params = dt_graph_params(g), .optim = o};
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(g_dir, pg, &st, &co, &info));
    CHECK(info.found && info.step == SPLIT && info.world == 4);
    dt_ckpt_info_free(&info);
    if (z) {
        CHECK_OK(dt_zero_params_release(z));
        float loss[STEPS];
        zero_steps(z, g, pg, SPLIT, STEPS, 1, loss);
        double d = fabs(loss[SPLIT] - g_ref_loss[SPLIT]) / fabs(g_ref_loss[SPLIT]);
        if (!CHECK(d < 1e-5))
            fprintf(stderr, "     rank %d: next loss %.7f, uninterrupted %.7f\n", rank,
                    (double)loss[SPLIT], (double)g_ref_loss[SPLIT]);
        char what[64];
        snprintf(what, sizeof what, "saved at 4 ranks, resumed at %d", world);
        check_result(z, g, pg, what);
    }
    dt_zero_free(z);
    dt_optim_free(o);
    dt_graph_free(g);
    dt_pg_free(pg);
}

static void test_reshard(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-test-zero3-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    mp_opts o4 = {.world = 4, .timeout_ms = 60000}, o2 = {.world = 2, .timeout_ms = 60000};
    MP_RUN(&o4, save_rank, NULL);
    MP_RUN(&o2, resume_rank, NULL);
    // One process, a plain AdamW: the same whole state.
    dt_graph    *g   = build(T, C, HEADS, VOCAB);
    dt_optim    *o   = make_optim(dt_graph_params(g));
    dt_ckpt_opts co  = dt_ckpt_opts_default();
    co.reshard       = true;
    dt_ckpt_state st = {.params = dt_graph_params(g), .optim = o};
    CHECK_OK(dt_ckpt_load(g_dir, NULL, &st, &co, NULL));
    float loss[STEPS];
    serial_steps(g, o, SPLIT, STEPS, loss);
    double dl = fabs(loss[SPLIT] - g_ref_loss[SPLIT]) / fabs(g_ref_loss[SPLIT]);
    double d  = rel_diff(dt_params_data(dt_graph_params(g)), g_ref, g_n);
    if (!CHECK(d < 1e-4 && dl < 1e-5))
        fprintf(stderr, "     resumed in 1 process: next loss %.3g, parameters %.3g apart\n", dl,
                d);
    else
        fprintf(stderr, "     saved at 4 ranks, resumed in 1 process: next loss %.2g, %.2g\n", dl,
                d);
    dt_optim_free(o);
    dt_graph_free(g);
    CHECK(system(cmd) == 0);
}

// ------------------------------------------------------------------ a rank dies

static void kill_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(5000);
    if (!pg)
        return;
    dt_graph *g = build(T, C, HEADS, VOCAB);
    dt_optim *o = make_optim(dt_graph_params(g));
    dt_zero  *z = wrap3(g, o, pg);
    if (z) {
        zero_steps(z, g, pg, 0, 2, 1, NULL);
        double    t0 = dt_now();
        dt_status s  = dt_pg_barrier(pg);
        if (rank == world - 1) { // dies after the first step of a forward: gathers issued
            dt_params *p    = dt_graph_params(g);
            int        t[1] = {0};
            CHECK_OK(dt_params_use(p, DT_USE_BEGIN, false, NULL, 0));
            CHECK_OK(dt_params_use(p, DT_USE_ACQUIRE, false, t, 1));
            raise(SIGKILL);
        }
        int32_t idx[B * T] = {0}, pos[B * T] = {0};
        for (int k = 0; k < 10 && s == DT_OK; k++)
            s = dt_graph_forward(g, (const void *[]){idx, pos}, 2);
        double waited = dt_now() - t0;
        CHECK(s != DT_OK);
        char want[32];
        snprintf(want, sizeof want, "rank %d", world - 1);
        if (!CHECK(strstr(dt_last_error(), want) != NULL))
            fprintf(stderr, "     rank %d: error does not name rank %d: %s\n", rank, world - 1,
                    dt_last_error());
        CHECK(waited < 15.0);
        if (rank == 0)
            fprintf(stderr, "     rank %d killed mid-forward: rank 0 stopped after %.2f s: %s\n",
                    world - 1, waited, dt_last_error());
    }
    dt_zero_free(z);
    dt_optim_free(o);
    dt_graph_free(g);
    dt_pg_free(pg);
}

static void test_kill(void) {
    mp_opts o = {.world = 3, .may_die = 1u << 2};
    MP_RUN(&o, kill_rank, NULL);
}

// ------------------------------------------------------------------ arguments

static void test_arguments(void) {
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t shape[1] = {100};
    CHECK_OK(dt_params_add(p, "w", 1, shape, 0));
    CHECK_OK(dt_params_alloc(p));
    dt_optim    *o  = make_optim(p);
    dt_pg       *pg = NULL; // arguments are checked before the group is used
    dt_zero     *z  = NULL;
    dt_zero_opts zo = dt_zero_opts_default();
    zo.stage        = 4;
    CHECK_ERR(dt_zero_new(&z, p, pg, o, &zo), DT_ERR_ARG, "stage 1, 2 or 3");
    // Memory plans: DDP holds 4 floats per parameter with Adam, stage 3 at 4 ranks a
    // quarter of it plus the working set.
    dt_zero_memory m;
    zo.stage = 0;
    CHECK_OK(dt_zero_plan_memory(p, o, 4, &zo, &m));
    CHECK(m.params == 400 && m.grads == 400 && m.optim == 800 && m.working == 0);
    zo.stage = 3, zo.shard_align = 1;
    CHECK_OK(dt_zero_plan_memory(p, o, 4, &zo, &m));
    CHECK(m.params == 100 && m.optim == 200 && m.working == 800 && m.total == 1200);
    dt_optim_free(o);
    dt_params_free(p);

    // A provider that does not announce its reads cannot run stage 3 (needs a group:
    // checked after it is known to be one).
    dt_graph *g = build(T, C, HEADS, VOCAB);
    CHECK(dt_params_announces_use(dt_graph_params(g)));
    dt_graph_free(g);
}

static void announce_rank(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t shape[1] = {100};
    CHECK_OK(dt_params_add(p, "w", 1, shape, 0));
    CHECK_OK(dt_params_alloc(p));
    dt_optim    *o  = make_optim(p);
    dt_zero     *z  = NULL;
    dt_zero_opts zo = dt_zero_opts_default();
    zo.stage        = 3;
    CHECK_ERR(dt_zero_new(&z, p, pg, o, &zo), DT_ERR_ARG, "announces each use");
    CHECK(z == NULL);
    dt_optim_free(o);
    dt_params_free(p);
    dt_pg_free(pg);
}

int main(void) {
    make_data();
    check_current = "reference";
    dt_graph *ref = build(T, C, HEADS, VOCAB);
    g_n           = dt_params_numel(dt_graph_params(ref));
    CHECK(g_n <= MAXP);
    dt_optim *o = make_optim(dt_graph_params(ref));
    serial_steps(ref, o, 0, STEPS, g_ref_loss);
    memcpy(g_ref, dt_params_data(dt_graph_params(ref)), sizeof(float) * g_n);
    dt_optim_free(o);
    dt_graph_free(ref);
    ref = build(T, C, HEADS, VOCAB); // the same in bf16
    CHECK_OK(dt_graph_set_precision(ref, DT_PREC_BF16));
    o      = make_optim(dt_graph_params(ref));
    g_bf16 = true;
    serial_steps(ref, o, 0, STEPS, NULL);
    g_bf16 = false;
    memcpy(g_ref16, dt_params_data(dt_graph_params(ref)), sizeof(float) * g_n);
    CHECK(rel_diff(g_ref16, g_ref, g_n) > 1e-4); // bf16 moves them: the comparison tells
    dt_optim_free(o);
    dt_graph_free(ref);

    check_current = "arguments";
    test_arguments();
    mp_opts o1 = {.world = 2};
    MP_RUN(&o1, announce_rank, NULL);
    check_current = "equality";
    test_equality();
    check_current = "memory";
    test_memory();
    check_current = "reshard";
    test_reshard();
    check_current = "kill";
    test_kill();
    return check_summary();
}
