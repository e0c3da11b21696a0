// test_pipe.c: pipeline parallelism (pipe.h) in real processes.
//
// A 4-block GPT without weight tying (token and position embeddings, dropout, blocks
// h.0 .. h.3, ln_f, an untied head) trains STEPS steps on cross-entropy, once whole in
// this process with the whole batch B, and then cut into 2 stages (after h.1.out) and
// 4 stages (after each of h.0 .. h.2), under GPipe and 1F1B, with M micro-batches
// (M = 1, an uneven 3, 4, 8). Dropout masks are keyed by the samples' dataset indices,
// so every layout draws the masks of the whole run. Each stage writes its parameters
// where the whole graph keeps the same names; together they must equal the whole run's
// to rounding (1e-5 of scale: a micro-batch missed, weighted wrong or a gradient sent to
// the wrong stage moves them by ~1e-2), under SGD and AdamW, and GPipe must equal 1F1B
// bitwise (same backward order). Each run's loss of every step equals the whole one's.
// Then a stage killed, and a stage frozen (SIGSTOP), inside its forward: every other
// stage's step fails within the liveness bound, naming it. The cuts by measured cost:
// dt_pipe_balance against every choice on random costs; dt_pipe_time_nodes times
// exactly its stage's nodes.
#include "../check.h"
#include "../lib/graphs.h"
#include "../lib/mp.h"
#include "dtrain/mesh.h"
#include "dtrain/optim.h"
#include "dtrain/pipe.h"
#include "dtrain/tp.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

enum { T = 6, C = 8, HEADS = 2, VOCAB = 11, NBLK = 4, B = 8, STEPS = 3, MAXP = 4096 };

static int32_t g_tok[STEPS * B][T + 1];

typedef struct shared {
    float            w[MAXP];         // parameters by the whole graph's offsets
    int              seen[MAXP];      // stages that wrote each float
    float            loss[STEPS];     // every step's loss, from rank 0
    float            eval_loss;       // dt_pipe_eval after training, from rank 0
    float            copy[VOCAB * C]; // the last stage's copy of a tied wte.weight
    _Atomic uint64_t kill_ns;
    double           fail_s[4];
    int              named[4];
    pid_t            victim; // the killed or frozen stage's process
} shared;

typedef struct cfg {
    int              stages, micro;
    dt_pipe_schedule sched;
    bool             adamw;
    int              kill;   // >= 0: this stage dies in its second step
    int              dp;     // > 1: dp replicas of the pipeline on a dp x pp mesh, under DDP
    bool             tied;   // the head tied to the token embedding, across stages
    int              tp;     // > 1: the blocks split over tp ranks (a pp x tp mesh)
    bool             freeze; // with kill: the stage stops (SIGSTOP) instead of dying
} cfg;

static bool   g_tied; // build() ties the head to wte
static dt_pg *g_tp;   // build() splits every block over this tensor-parallel group

// tg_block's nodes, its attention and MLP split over g_tp (tp.h).
static void tp_block(dt_graph *g, const char *p, const char *in) {
    dt_layer *l;
    char      a[48], b[48];
#define NM(buf, s) (snprintf(buf, sizeof buf, "%s%s", p, s), buf)
    CHECK_OK(dt_layer_layernorm_new(&l, C, NULL));
    CHECK_OK(dt_graph_add(g, NM(a, "ln1"), l, in));
    CHECK_OK(dt_tp_attention_add(g, p, NM(a, "ln1"), C, HEADS, g_tp));
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, NM(b, "r1"), l, in, NM(a, "proj")));
    CHECK_OK(dt_layer_layernorm_new(&l, C, NULL));
    CHECK_OK(dt_graph_add(g, NM(a, "ln2"), l, NM(b, "r1")));
    CHECK_OK(dt_tp_mlp_add(g, p, NM(a, "ln2"), C, 4 * C, false, g_tp));
    CHECK_OK(dt_layer_add_new(&l, NULL));
    char r1[48];
    CHECK_OK(dt_graph_add(g, NM(b, "out"), l, NM(r1, "r1"), NM(a, "fc2")));
#undef NM
}

// An identity layer that kills its process on the forward of its call `g_bomb`.
static int       g_bomb = -1;
static bool      g_freeze; // SIGSTOP instead of SIGKILL: a frozen stage
static dt_status bomb_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    (void)l;
    (void)nin;
    s->out = in[0];
    return DT_OK;
}
static dt_status bomb_forward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    if (g_bomb >= 0 && g_bomb-- == 0) {
        shared *sh = mp_shared();
        sh->victim = getpid();
        atomic_store(&sh->kill_ns, dt_now_ns());
        raise(g_freeze ? SIGSTOP : SIGKILL);
    }
    memcpy(a->y, a->x[0], sizeof(float) * (size_t)a->batch * dt_shape_numel(a->out));
    return DT_OK;
}
static dt_status bomb_backward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    if (a->dx[0])
        memcpy(a->dx[0], a->dy, sizeof(float) * (size_t)a->batch * dt_shape_numel(a->out));
    return DT_OK;
}
static const dt_layer_ops bomb_ops = {"bomb", bomb_setup, NULL, bomb_forward, bomb_backward, NULL};

static dt_graph *build(bool bomb) {
    dt_graph *g = NULL;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "idx", &(dt_shape){1, {T, 1, 1, 1}, DT_ELEM_I32}));
    CHECK_OK(dt_graph_input(g, "pos", &(dt_shape){1, {T, 1, 1, 1}, DT_ELEM_I32}));
    CHECK_OK(dt_layer_embedding_new(&l, VOCAB, C, NULL));
    CHECK_OK(dt_graph_add(g, "wte", l, "idx"));
    CHECK_OK(dt_layer_embedding_new(&l, T, C, NULL));
    CHECK_OK(dt_graph_add(g, "wpe", l, "pos"));
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "emb", l, "wte", "wpe"));
    CHECK_OK(dt_layer_dropout_new(&l, 0.2f, NULL));
    CHECK_OK(dt_graph_add(g, "emb.drop", l, "emb")); // stands for "block -1"'s output
    char in[32] = "emb.drop", pre[32];
    for (int b = 0; b < NBLK; b++) {
        snprintf(pre, sizeof pre, "b%d.", b);
        if (g_tp)
            tp_block(g, pre, in);
        else
            CHECK_OK(tg_block(g, pre, in, C, HEADS));
        snprintf(in, sizeof in, "b%d.out", b);
        if (bomb && b == 1) { // the first node of stage 2 of 4
            CHECK_OK(dt_layer_new(&l, &bomb_ops, NULL, NULL));
            CHECK_OK(dt_graph_add(g, "bomb", l, in));
            snprintf(in, sizeof in, "bomb");
        }
    }
    CHECK_OK(dt_layer_layernorm_new(&l, C, NULL));
    CHECK_OK(dt_graph_add(g, "ln_f", l, in));
    CHECK_OK(dt_layer_linear_new(&l, C, VOCAB, &(dt_linear_opts){.bias = false}));
    CHECK_OK(dt_graph_add(g, "head", l, "ln_f"));
    if (g_tied)
        CHECK_OK(dt_graph_tie(g, "head.weight", "wte.weight"));
    return g;
}

static void make_data(void) {
    dt_rng r = dt_rng_init(21);
    for (int i = 0; i < STEPS * B; i++)
        for (int t = 0; t <= T; t++)
            g_tok[i][t] = (int32_t)dt_rng_below(&r, VOCAB);
}

typedef struct batch {
    int32_t  idx[B * T], pos[B * T], tgt[B * T];
    uint64_t keys[B];
} batch;

static void fill(batch *b, int s) {
    for (int i = 0; i < B; i++) {
        int gi     = s * B + i;
        b->keys[i] = (uint64_t)gi;
        for (int t = 0; t < T; t++) {
            b->idx[i * T + t] = g_tok[gi][t];
            b->pos[i * T + t] = t;
            b->tgt[i * T + t] = t == 0 ? -1 : g_tok[gi][t + 1];
        }
    }
}

static dt_status ce(void *user, const float *out, int first, int n, float *loss, float *dout) {
    const int32_t *tgt = user; // this replica's targets
    return dt_loss_cross_entropy_ex(out, tgt + first * T, n * T, VOCAB, -1, 0.0f, loss, dout);
}

static dt_optim *make_opt(dt_params *p, bool adamw) {
    dt_optim *o = NULL;
    if (adamw) {
        dt_adam_opts ao = dt_adamw_opts_default();
        ao.lr           = 0.01f;
        // Some gradients are zero in exact arithmetic (the key bias: softmax ignores a
        // shift of all scores) and rounding noise in practice, which Adam's default eps
        // would blow up to full steps of either sign; 1e-3 keeps those steps tiny.
        ao.eps = 1e-3f;
        CHECK_OK(dt_adamw_new(&o, p, &ao));
    } else {
        dt_sgd_opts so = dt_sgd_opts_default();
        so.lr          = 0.3f;
        CHECK_OK(dt_sgd_new(&o, p, &so));
    }
    return o;
}

static float g_ref_eval; // the whole model's evaluation loss after training

// The whole model in one process: final parameters into w, losses into loss.
static size_t reference(bool adamw, float *w, float *loss) {
    dt_graph *g = build(false);
    CHECK_OK(dt_graph_finalize(g, 7));
    dt_params *p  = dt_graph_params(g);
    dt_optim  *o  = make_opt(p, adamw);
    float     *dl = malloc(sizeof(float) * B * T * VOCAB);
    batch      b;
    dt_rng     root = dt_rng_init(5);
    for (int s = 0; s < STEPS; s++) {
        fill(&b, s);
        dt_rng r = dt_rng_split(&root, (uint64_t)s);
        dt_graph_set_rng(g, &r);
        CHECK_OK(dt_graph_set_sample_keys(g, b.keys, B));
        CHECK_OK(dt_graph_forward(g, (const void *[]){b.idx, b.pos}, B));
        CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(g), b.tgt, B * T, VOCAB, -1, 0.0f,
                                          &loss[s], dl));
        dt_params_zero_grad(p);
        CHECK_OK(dt_graph_backward(g, dl));
        dt_optim_step(o);
    }
    fill(&b, 0); // evaluation of the first batch with the trained weights
    dt_graph_train(g, false);
    CHECK_OK(dt_graph_forward(g, (const void *[]){b.idx, b.pos}, B));
    CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(g), b.tgt, B * T, VOCAB, -1, 0.0f,
                                      &g_ref_eval, dl));
    size_t n = dt_params_numel(p);
    memcpy(w, dt_params_data(p), sizeof(float) * n);
    free(dl);
    dt_optim_free(o);
    dt_graph_free(g);
    return n;
}

static void ranks(int rank, int world, void *arg) {
    (void)world;
    const cfg *c = arg;
    g_tied       = c->tied;
    shared *sh   = mp_shared();
    g_freeze     = c->freeze;
    if (c->freeze) // a frozen peer is found by its missing heartbeats: 2 s, not 5
        setenv("DT_LIVENESS_MS", "2000", 1);
    dt_pg *pg = mp_pg_init(c->kill >= 0 ? 60000 : 0);
    if (!CHECK(pg != NULL))
        return;
    dt_mesh *mesh = NULL;
    int      dp = c->dp > 1 ? c->dp : 1, dpi = 0, tp = c->tp > 1 ? c->tp : 1;
    CHECK_OK(dt_mesh_new(&mesh, pg, &(dt_mesh_opts){.dp = dp, .pp = c->stages, .tp = tp}));
    if (!CHECK(mesh != NULL)) {
        dt_pg_free(pg);
        return;
    }
    dt_pg *ppg           = dt_mesh_group(mesh, DT_MESH_PP);
    g_tp                 = tp > 1 ? dt_mesh_group(mesh, DT_MESH_TP) : NULL;
    dpi                  = dt_mesh_coord(mesh, DT_MESH_DP);
    int          stage   = dt_mesh_coord(mesh, DT_MESH_PP);
    const char  *cuts4[] = {"b0.out", "b1.out", "b2.out"}, *cuts2[] = {"b1.out"};
    dt_pipe_opts po  = dt_pipe_opts_default();
    po.schedule      = c->sched;
    po.micro_batches = c->micro;
    dt_pipe *pp      = NULL;
    CHECK_OK(dt_pipe_new(&pp, build(c->kill >= 0), c->stages - 1, c->stages == 4 ? cuts4 : cuts2,
                         ppg, 7, &po));
    if (!CHECK(pp != NULL)) {
        dt_mesh_free(mesh);
        dt_pg_free(pg);
        return;
    }
    dt_ddp *ddp = NULL;
    if (dp > 1) { // the stage's replicas average their gradients
        CHECK_OK(dt_ddp_new(&ddp, dt_pipe_params(pp), dt_mesh_group(mesh, DT_MESH_DP), NULL));
        dt_pipe_set_ddp(pp, ddp);
    }
    CHECK_EQ(dt_pipe_stage(pp), stage);
    dt_params *p  = dt_pipe_params(pp);
    dt_optim  *o  = make_opt(p, c->adamw);
    int        nb = B / dp, lo = dpi * nb; // this replica's samples of each step
    batch      b;
    dt_rng     root = dt_rng_init(5);
    for (int s = 0; s < STEPS; s++) {
        fill(&b, s);
        dt_rng r = dt_rng_split(&root, (uint64_t)s);
        dt_graph_set_rng(dt_pipe_graph(pp), &r);
        dt_params_zero_grad(p);
        if (c->kill == rank && s == 1)
            g_bomb = 1; // the second micro-batch's forward of this step
        float       loss = -1.0f;
        double      t0   = dt_now();
        const void *in[] = {b.idx + lo * T, b.pos + lo * T};
        dt_status   st =
            dt_pipe_step(pp, stage == 0 ? in : NULL, nb, b.keys + lo, ce, b.tgt + lo * T, &loss);
        if (c->kill >= 0 && s == 1) {
            CHECK(st != DT_OK);
            sh->fail_s[rank] = dt_now() - t0;
            char victim[32];
            snprintf(victim, sizeof victim, "rank %d", c->kill);
            sh->named[rank] = strstr(dt_last_error(), victim) != NULL;
            if (!sh->named[rank] || rank == 0)
                fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
            if (c->freeze && rank == 0) { // the others have stopped: end the frozen one
                while (!sh->victim)
                    usleep(1000);
                kill(sh->victim, SIGKILL);
            }
            break;
        }
        CHECK_OK(st);
        if (ddp)
            CHECK_OK(dt_ddp_sync(ddp));
        if (dp > 1) // the replicas' mean losses, averaged
            CHECK_OK(dt_pg_all_reduce(dt_mesh_group(mesh, DT_MESH_DP), &loss, &loss, 1, DT_FLOAT32,
                                      DT_REDUCE_AVG));
        if (rank == 0)
            sh->loss[s] = loss;
        dt_optim_step(o);
    }
    if (c->kill < 0 && dp == 1) { // evaluation through the pipeline
        fill(&b, 0);
        float       el   = -1.0f;
        const void *in[] = {b.idx, b.pos};
        CHECK_OK(dt_pipe_eval(pp, stage == 0 ? in : NULL, B, ce, b.tgt, &el));
        if (rank == 0)
            sh->eval_loss = el;
    }
    g_tp = NULL;                              // the reference below is whole
    if (c->kill < 0 && dpi == 0 && tp == 1) { // each tensor where the whole graph keeps it
        dt_graph *ref = build(false);
        CHECK_OK(dt_graph_finalize(ref, 7));
        dt_params *rp = dt_graph_params(ref);
        for (int t = 0; t < dt_params_count(p); t++) {
            const dt_param_info *i = dt_params_info(p, t);
            int                  k = dt_params_find(rp, i->name);
            if (!CHECK(k >= 0))
                continue;
            const dt_param_info *j = dt_params_info(rp, k);
            CHECK_EQ(j->count, i->count);
            memcpy(sh->w + j->offset, dt_params_data(p) + i->offset, sizeof(float) * i->count);
            for (size_t e = 0; e < i->count; e++)
                sh->seen[j->offset + e]++;
            if (c->tied && stage == c->stages - 1 && !strcmp(i->name, "wte.weight"))
                memcpy(sh->copy, dt_params_data(p) + i->offset, sizeof(float) * i->count);
        }
        dt_graph_free(ref);
    }
    dt_optim_free(o);
    dt_ddp_free(ddp);
    dt_pipe_free(pp);
    dt_mesh_free(mesh);
    dt_pg_free(pg);
}

static float g_ref[2][MAXP], g_ref_loss[2][STEPS], g_prev[MAXP];

static void equality(void) {
    size_t n = 0;
    for (int a = 0; a < 2; a++)
        n = reference(a, g_ref[a], g_ref_loss[a]);
    if (!CHECK(n <= MAXP && sizeof(shared) <= 65536))
        return;
    cfg cases[] = {
        {2, 1, DT_PIPE_GPIPE, false, -1, 1, false, 0, false},
        {2, 1, DT_PIPE_1F1B, false, -1, 1, false, 0, false},
        {2, 3, DT_PIPE_GPIPE, false, -1, 1, false, 0, false},
        {2, 3, DT_PIPE_1F1B, false, -1, 1, false, 0, false},
        {2, 4, DT_PIPE_GPIPE, true, -1, 1, false, 0, false},
        {2, 4, DT_PIPE_1F1B, true, -1, 1, false, 0, false},
        {4, 2, DT_PIPE_GPIPE, false, -1, 1, false, 0, false},
        {4, 2, DT_PIPE_1F1B, false, -1, 1, false, 0, false},
        {4, 4, DT_PIPE_GPIPE, true, -1, 1, false, 0, false},
        {4, 4, DT_PIPE_1F1B, true, -1, 1, false, 0, false},
        {4, 8, DT_PIPE_GPIPE, false, -1, 1, false, 0, false},
        {4, 8, DT_PIPE_1F1B, false, -1, 1, false, 0, false},
        // A 2x2 mesh: 2 replicas of a 2-stage pipeline, B/2 each, under DDP.
        {2, 2, DT_PIPE_GPIPE, false, -1, 2, false, 0, false},
        {2, 2, DT_PIPE_1F1B, true, -1, 2, false, 0, false},
        // The head tied to wte on the first stage: a copy on the last, gradients summed.
        {2, 4, DT_PIPE_GPIPE, false, -1, 1, true, 0, false},
        {2, 4, DT_PIPE_1F1B, false, -1, 1, true, 0, false},
        {4, 4, DT_PIPE_1F1B, true, -1, 1, true, 0, false},
        {2, 2, DT_PIPE_1F1B, false, -1, 2, true, 0, false},
        // A pp 2 x tp 2 mesh: each stage's blocks split over 2 ranks (losses compared).
        {2, 4, DT_PIPE_1F1B, false, -1, 1, false, 2, false},
        {2, 2, DT_PIPE_GPIPE, true, -1, 1, true, 2, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cfg    *k  = &cases[c];
        int     tp = k->tp > 1 ? k->tp : 1;
        mp_opts o  = {.world = k->stages * k->dp * tp, .timeout_ms = 60000};
        g_tied     = k->tied;
        n          = reference(k->adamw, g_ref[k->adamw], g_ref_loss[k->adamw]);
        MP_RUN(&o, ranks, k);
        const shared *sh  = mp_shared();
        const float  *w   = g_ref[k->adamw];
        double        err = 0.0, scale = 0.0, lerr = 0.0;
        bool          all = true;
        for (size_t i = 0; i < n && tp == 1; i++) { // tp: the losses alone
            all   = all && sh->seen[i] == (k->tied && i < VOCAB * C ? 2 : 1);
            err   = fmax(err, fabs((double)sh->w[i] - w[i]));
            scale = fmax(scale, fabs(w[i]));
        }
        for (int s = 0; s < STEPS; s++)
            lerr = fmax(lerr, fabs((double)sh->loss[s] - g_ref_loss[k->adamw][s]));
        CHECK(all);             // every parameter on exactly one stage (a tied one: and its copy)
        if (k->tied && tp == 1) // wte.weight comes first in the whole graph
            CHECK(memcmp(sh->copy, sh->w, sizeof(float) * VOCAB * C) == 0);
        if (k->dp == 1)
            lerr = fmax(lerr, fabs((double)sh->eval_loss - g_ref_eval));
        bool ok = CHECK(err <= 1e-5 * scale) && CHECK(lerr <= 1e-5);
        fprintf(stderr,
                "%s dp=%d pp=%d tp=%d %-5s M=%d %s%s: max |pipe - whole| %.3g (scale %.3g), loss "
                "%.3g\n",
                ok ? "ok  " : "FAIL", k->dp > 1 ? k->dp : 1, k->stages, tp,
                dt_pipe_schedule_name(k->sched), k->micro, k->adamw ? "adamw" : "sgd",
                k->tied ? " tied" : "", err, scale, lerr);
        const cfg *q = c > 0 ? &cases[c - 1] : k; // GPipe just before, same layout
        if (k->sched == DT_PIPE_1F1B && q->sched == DT_PIPE_GPIPE && q->stages == k->stages &&
            q->micro == k->micro && q->dp == k->dp && q->adamw == k->adamw && q->tied == k->tied &&
            tp == 1)
            CHECK(memcmp(g_prev, sh->w, sizeof(float) * n) == 0);
        memcpy(g_prev, sh->w, sizeof(float) * n);
    }
}

// A stage killed, or frozen (SIGSTOP), inside its forward: every other stage's step
// fails within the liveness bound, naming it.
static void killed(void) {
    for (int f = 0; f < 2; f++) {
        cfg     k     = {4, 4, DT_PIPE_1F1B, false, 2, 1, false, 0, f == 1};
        mp_opts o     = {.world = 4, .timeout_ms = 90000, .may_die = 1u << 2};
        check_current = f ? "frozen" : "killed";
        MP_RUN(&o, ranks, &k);
        const shared *sh = mp_shared();
        CHECK(atomic_load(&sh->kill_ns) != 0);
        for (int r = 0; r < 4; r++) {
            if (r == 2)
                continue;
            // The liveness bound (DT_LIVENESS_MS: 5 s by default, 2 s for the frozen
            // stage) plus slack for a loaded machine; the group timeout is 60 s, so a
            // hang until it would fail here.
            CHECK(sh->fail_s[r] > 0 && sh->fail_s[r] < 30.0);
            CHECK(sh->named[r]);
            fprintf(stderr, "%s stage 2: stage %d stopped %.2f s into the step\n",
                    f ? "frozen" : "killed", r, sh->fail_s[r]);
        }
    }
}

// The cuts by cost (dt_pipe_balance) against every choice tried, on hand-made costs and
// random ones; then a stage's nodes timed (dt_pipe_time_nodes): every node of this
// stage gets a time, the other stage's nodes none.
static void balancing(void) {
    double c[8]   = {0, 1, 1, 1, 1, 1, 1, 5}; // a heavy last node (a head)
    int    cand[] = {1, 2, 3, 4, 5, 6}, ch[3];
    double top;
    CHECK_OK(dt_pipe_balance(8, c, 6, cand, 2, ch, &top));
    CHECK(ch[0] == 4 && top == 6.0); // 0..5 | 6..7 = 5 | 6: ties cut early
    CHECK_OK(dt_pipe_balance(8, c, 6, cand, 3, ch, &top));
    CHECK(top == 5.0 && ch[1] == 5); // the head's stage alone with one node: 4, 2, 5
    dt_rng r = dt_rng_init(9);
    for (int trial = 0; trial < 200; trial++) {
        int    n = 3 + (int)dt_rng_below(&r, 10), nc = 0, cd[16], P = 2 + (int)dt_rng_below(&r, 3);
        double cost[16];
        for (int i = 0; i < n; i++)
            cost[i] = (double)dt_rng_below(&r, 100);
        for (int i = 0; i < n - 1; i++)
            if (dt_rng_below(&r, 3))
                cd[nc++] = i;
        if (nc < P - 1)
            continue;
        int got[4];
        CHECK_OK(dt_pipe_balance(n, cost, nc, cd, P, got, &top));
        // Every increasing choice of P - 1 candidates (P <= 4: at most three nested loops).
        double best = INFINITY;
        for (int a = 0; a < nc; a++)
            for (int b = P > 2 ? a + 1 : nc; b < (P > 2 ? nc : nc + 1); b++)
                for (int e = P > 3 ? b + 1 : nc; e < (P > 3 ? nc : nc + 1); e++) {
                    int    cut[3] = {cd[a], P > 2 ? cd[b] : n - 1, P > 3 ? cd[e] : n - 1};
                    double worst = 0, sum = 0;
                    for (int i = 0, s = 0; i < n; i++) {
                        sum += cost[i];
                        if (i == (s < P - 1 ? cut[s] : n - 1)) {
                            worst = fmax(worst, sum);
                            sum   = 0;
                            s++;
                        }
                    }
                    best = fmin(best, worst);
                }
        CHECK(top == best);
    }
    CHECK_ERR(dt_pipe_balance(8, c, 2, (int[]){3, 2}, 2, ch, NULL), DT_ERR_ARG, "increasing");
    CHECK_ERR(dt_pipe_balance(8, c, 1, cand, 3, ch, NULL), DT_ERR_ARG, "2 candidate cuts");
}

static void timed(int rank, int world, void *arg) {
    (void)world;
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_graph *whole = build(false);
    int       n = dt_graph_num_nodes(whole), cut = dt_graph_find(whole, "b1.out");
    dt_pipe  *p = NULL;
    CHECK_OK(dt_pipe_new(&p, whole, 1, (const char *[]){"b1.out"}, pg, 7, NULL));
    double cost[256];
    for (int i = 0; i < n; i++)
        cost[i] = -1;
    CHECK_OK(dt_pipe_time_nodes(p, 4, 2, n, cost));
    int first, last;
    dt_pipe_range(p, &first, &last);
    CHECK(first == (rank ? cut + 1 : 0) && last == (rank ? n - 1 : cut));
    for (int i = 0; i < n; i++) {
        bool mine = i >= first && i <= last, input = i < 2; // idx, pos: not layers
        CHECK(mine && !input ? cost[i] > 0 : mine ? cost[i] >= 0 : cost[i] == -1);
    }
    CHECK_ERR(dt_pipe_time_nodes(p, 4, 2, n - 1, cost), DT_ERR_ARG, "whole graph's");
    dt_pipe_free(p);
    dt_pg_free(pg);
}

static dt_status bad_loss(void *user, const float *out, int first, int n, float *loss, float *dout);

static void one_rank_cut(int rank, int world, void *arg) {
    (void)rank;
    (void)world;
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_pipe *p = NULL;
    CHECK_ERR(dt_pipe_new(&p, build(false), 1, (const char *[]){"b1.out"}, pg, 7, NULL), DT_ERR_ARG,
              "expected 0 cuts");
    CHECK(p == NULL);
    // One stage (what --tp or --zero 3 alone run on): a failure is the layer's or the
    // loss's own, with no "pipeline stage 0" nobody asked for.
    CHECK_OK(dt_pipe_new(&p, build(false), 0, NULL, pg, 7, &(dt_pipe_opts){DT_PIPE_1F1B, 2}));
    static int32_t idx[B * T];
    int            calls = 2; // bad_loss refuses from its third call on
    CHECK_ERR(dt_pipe_step(p, (const void *[]){idx, idx}, B, NULL, bad_loss, &calls, NULL),
              DT_ERR_ARG, "the test's loss refuses micro-batch 0");
    CHECK(strstr(dt_last_error(), "pipeline stage") == NULL);
    calls = 2;
    CHECK_ERR(dt_pipe_eval(p, (const void *[]){idx, idx}, B, bad_loss, &calls, NULL), DT_ERR_ARG,
              "the test's loss refuses micro-batch 0");
    CHECK(strstr(dt_last_error(), "pipeline stage") == NULL);
    dt_pipe_free(p);
    dt_pg_free(pg);
}

static void two_rank_cut(int rank, int world, void *arg) {
    (void)world;
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_pipe *p = NULL;
    if (rank == 1) // b0.r1 reads emb.drop and b0.proj from before the cut at b0.proj
        CHECK_ERR(dt_pipe_new(&p, build(false), 1, (const char *[]){"b0.proj"}, pg, 7, NULL),
                  DT_ERR_ARG, "expected its nodes to read only 'b0.proj'");
    else
        CHECK_OK(dt_pipe_new(&p, build(false), 1, (const char *[]){"b0.proj"}, pg, 7, NULL));
    dt_pipe_free(p);
    p = NULL;
    CHECK_ERR(dt_pipe_new(&p, build(false), 1, (const char *[]){"nope"}, pg, 7, NULL), DT_ERR_ARG,
              "no node named 'nope'");
    dt_pg_free(pg);
}

// A loss that fails on the second step: the last stage aborts, the first one's step
// fails at once (not at the 60 s timeout) naming the failed stage.
static dt_status bad_loss(void *user, const float *out, int first, int n, float *loss,
                          float *dout) {
    int *calls = user;
    if (++*calls > 2)
        return dt_fail(DT_ERR_ARG, "the test's loss refuses micro-batch %d", first);
    return ce(g_tok[0], out, first, n, loss, dout);
}

static void failed_loss(int rank, int world, void *arg) {
    (void)world;
    (void)arg;
    shared *sh = mp_shared();
    dt_pg  *pg = mp_pg_init(60000);
    if (!CHECK(pg != NULL))
        return;
    dt_pipe *p = NULL;
    CHECK_OK(dt_pipe_new(&p, build(false), 1, (const char *[]){"b1.out"}, pg, 7,
                         &(dt_pipe_opts){DT_PIPE_1F1B, 2}));
    static int32_t idx[B * T]; // token 0 everywhere; targets: g_tok's first rows
    int            calls = 0;
    double         t0    = dt_now();
    dt_status      st    = DT_OK;
    for (int s = 0; s < 2 && st == DT_OK; s++)
        st = dt_pipe_step(p, rank == 0 ? (const void *[]){idx, idx} : NULL, B, NULL, bad_loss,
                          &calls, NULL);
    CHECK(st != DT_OK);
    sh->fail_s[rank] = dt_now() - t0;
    sh->named[rank]  = strstr(dt_last_error(), "pipeline stage 1 failed") != NULL;
    if (!sh->named[rank])
        fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
    dt_pipe_free(p);
    dt_pg_free(pg);
}

static void errors(void) {
    mp_opts o = {.world = 1};
    MP_RUN(&o, one_rank_cut, NULL);
    o.world = 2;
    MP_RUN(&o, two_rank_cut, NULL);
    o.timeout_ms = 60000;
    MP_RUN(&o, failed_loss, NULL);
    const shared *sh = mp_shared();
    CHECK(sh->named[0] && sh->named[1]);
    CHECK(sh->fail_s[0] < 20.0); // the group's timeout is 60 s
    dt_pipe_schedule s;
    CHECK_OK(dt_pipe_schedule_parse("1f1b", &s));
    CHECK(s == DT_PIPE_1F1B);
    CHECK_ERR(dt_pipe_schedule_parse("zb", &s), DT_ERR_ARG, "gpipe or 1f1b");
}

int main(void) {
    make_data();
    RUN(equality);
    RUN(errors);
    RUN(balancing);
    mp_opts o     = {.world = 2, .timeout_ms = 60000};
    check_current = "timed";
    MP_RUN(&o, timed, NULL);
    RUN(killed);
    return check_summary();
}
