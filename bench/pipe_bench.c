// pipe_bench.c: step time of one training step of a small GPT (no tied head) on 2
// processes of this machine: a 2-stage pipeline under GPipe and under 1F1B, against
// 2-way data parallelism (DDP, B/2 each) and one process with the whole batch B. Each
// rank runs one thread. Prints one line per layout: the median step time over STEPS
// timed steps (after WARM), tokens/s, and for the pipeline each stage's measured
// bubble (1 - compute / step time, from dt_pipe_stats) beside the theory
// (P-1)/(M+P-1). Usage: pipe_bench MODE [M] with MODE gpipe, 1f1b, dp, tp (2-way
// Megatron tensor parallelism, the whole batch on both ranks) or one. CUT (pipelines):
// the node after which stage 0 ends (default h.1.out: two blocks each), or auto: the
// stages' nodes timed (dt_pipe_time_nodes) and the cut that makes the slower stage
// fastest (dt_pipe_balance), as the trainer's --cuts auto does, among the residual
// stream's nodes after the embeddings and each block's two adds. VOCAB (default 256)
// widens the head: a real tokenizer's head weighs blocks, which is what balancing
// moves. Beside the theory
// (P-1)/(M+P-1) of equal stages, the theory of the measured ones: with a and b a
// micro-batch's forward + backward on stages 0 and 1, a step of either schedule takes
// a + b + (M-1) max(a, b), and stage s idles 1 - M t_s / step of it.
// bench/pipe_bench.sh runs the layouts interleaved and takes medians of the runs.
#include "dtrain/ddp.h"
#include "dtrain/graph.h"
#include "dtrain/pipe.h"
#include "dtrain/tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 64, C = 128, HEADS = 4, NBLK = 4, B = 16, WARM = 2, STEPS = 12 };
static int g_vocab = 256; // the head's width: argv[4]

static const char *g_mode  = "1f1b";
static int         g_micro = 4;
static const char *g_cut   = "h.1.out";

static dt_status add(dt_graph *g, const char *name, dt_layer *l, const char *a, const char *b) {
    return b ? dt_graph_add(g, name, l, a, b) : dt_graph_add(g, name, l, a);
}

static dt_status build(dt_graph **out, dt_pg *tp) {
    dt_graph *g;
    dt_layer *l;
    DT_TRY(dt_graph_new(&g, NULL));
    *out = g;
    DT_TRY(dt_graph_input(g, "idx", &(dt_shape){1, {T, 1, 1, 1}, DT_ELEM_I32}));
    DT_TRY(dt_graph_input(g, "pos", &(dt_shape){1, {T, 1, 1, 1}, DT_ELEM_I32}));
    DT_TRY(dt_layer_embedding_new(&l, g_vocab, C, NULL));
    DT_TRY(add(g, "wte", l, "idx", NULL));
    DT_TRY(dt_layer_embedding_new(&l, T, C, NULL));
    DT_TRY(add(g, "wpe", l, "pos", NULL));
    DT_TRY(dt_layer_add_new(&l, NULL));
    DT_TRY(add(g, "h.-1", l, "wte", "wpe"));
    char x[32] = "h.-1", n[32], m[32];
    for (int b = 0; b < NBLK; b++) {
#define N(s) (snprintf(n, sizeof n, "h.%d.%s", b, s), n)
#define M(s) (snprintf(m, sizeof m, "h.%d.%s", b, s), m)
        DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
        DT_TRY(add(g, N("ln1"), l, x, NULL));
        char pre[32];
        snprintf(pre, sizeof pre, "h.%d.", b);
        if (tp) { // Megatron: heads split, one all-reduce each way
            DT_TRY(dt_tp_attention_add(g, pre, M("ln1"), C, HEADS, tp));
        } else {
            DT_TRY(dt_layer_linear_new(&l, C, 3 * C, NULL));
            DT_TRY(add(g, N("qkv"), l, M("ln1"), NULL));
            DT_TRY(dt_layer_attention_new(&l, HEADS, NULL));
            DT_TRY(add(g, N("attn"), l, M("qkv"), NULL));
            DT_TRY(dt_layer_linear_new(&l, C, C, NULL));
            DT_TRY(add(g, N("proj"), l, M("attn"), NULL));
        }
        DT_TRY(dt_layer_add_new(&l, NULL));
        DT_TRY(add(g, N("r1"), l, x, M("proj")));
        DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
        DT_TRY(add(g, N("ln2"), l, M("r1"), NULL));
        if (tp) { // column then row
            DT_TRY(dt_tp_mlp_add(g, pre, M("ln2"), C, 4 * C, true, tp));
        } else {
            DT_TRY(dt_layer_linear_new(&l, C, 4 * C, NULL));
            DT_TRY(add(g, N("fc"), l, M("ln2"), NULL));
            DT_TRY(dt_layer_act_new(&l, DT_ACT_GELU_TANH, NULL));
            DT_TRY(add(g, N("gelu"), l, M("fc"), NULL));
            DT_TRY(dt_layer_linear_new(&l, 4 * C, C, NULL));
            DT_TRY(add(g, N("fc2"), l, M("gelu"), NULL));
        }
        DT_TRY(dt_layer_add_new(&l, NULL));
        DT_TRY(add(g, N("out"), l, M("r1"), M("fc2")));
        snprintf(x, sizeof x, "h.%d.out", b);
#undef N
#undef M
    }
    DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
    DT_TRY(add(g, "ln_f", l, x, NULL));
    DT_TRY(dt_layer_linear_new(&l, C, g_vocab, &(dt_linear_opts){.bias = false}));
    return add(g, "head", l, "ln_f", NULL);
}

static int32_t g_idx[B * T], g_pos[B * T], g_tgt[B * T];
static char    g_cut_used[48];

static dt_status ce(void *user, const float *out, int first, int n, float *loss, float *dout) {
    (void)user;
    return dt_loss_cross_entropy_ex(out, g_tgt + first * T, n * T, g_vocab, -1, 0.0f, loss, dout);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what) {
    fprintf(stderr, "pipe_bench: %s: %s\n", what, dt_last_error());
    return 1;
}

static int worker(int local_rank, void *arg) {
    (void)arg;
    (void)local_rank;
    bool   one = !strcmp(g_mode, "one"), dp = !strcmp(g_mode, "dp"), tp = !strcmp(g_mode, "tp");
    dt_pg *pg = NULL;
    if (!one && dt_pg_new_from_env(&pg, NULL) != DT_OK)
        return fail("group");
    int       rank = pg ? dt_pg_rank(pg) : 0;
    dt_graph *g    = NULL;
    if (build(&g, tp ? pg : NULL) != DT_OK)
        return fail("build");
    dt_pipe *pp  = NULL;
    dt_ddp  *ddp = NULL;
    int      nb = dp ? B / 2 : B, lo = dp ? rank * nb : 0;
    if (one || dp || tp) {
        if (dt_graph_finalize(g, 1) != DT_OK)
            return fail("finalize");
        if (dp && dt_ddp_new(&ddp, dt_graph_params(g), pg, NULL) != DT_OK)
            return fail("ddp");
    } else {
        dt_pipe_opts po  = dt_pipe_opts_default();
        po.micro_batches = g_micro;
        const char *cut  = g_cut;
        char        best[32];
        if (!strcmp(cut, "auto")) { // time a first cut's stages, then cut where they say
            // The residual stream: after the embeddings and each block's two adds.
            enum { NC = 2 * NBLK + 1 };
            const char *cand[NC];
            char        names[NC][16];
            int         cn[NC], ch = 0, n = dt_graph_num_nodes(g);
            double     *cost = calloc((size_t)n, sizeof(double));
            float      *sum  = calloc((size_t)n, sizeof(float));
            for (int i = 0; i < NC; i++) {
                if (i == 0)
                    snprintf(names[i], sizeof names[0], "h.-1");
                else
                    snprintf(names[i], sizeof names[0], "h.%d.%s", (i - 1) / 2,
                             i % 2 ? "r1" : "out");
                cand[i] = names[i];
                cn[i]   = dt_graph_find(g, names[i]);
            }
            if (dt_pipe_new(&pp, g, 1, (const char *[]){"h.1.out"}, pg, 1, &po) != DT_OK ||
                dt_pipe_time_nodes(pp, B / g_micro, 3, n, cost) != DT_OK)
                return fail("timing");
            for (int i = 0; i < n; i++)
                sum[i] = (float)cost[i];
            if (dt_pg_all_reduce(pg, sum, sum, (size_t)n, DT_FLOAT32, DT_REDUCE_SUM) != DT_OK)
                return fail("timing");
            for (int i = 0; i < n; i++)
                cost[i] = sum[i];
            if (dt_pipe_balance(n, cost, NC, cn, 2, &ch, NULL) != DT_OK)
                return fail("balance");
            snprintf(best, sizeof best, "%s", cand[ch]);
            cut = best;
            dt_pipe_free(pp);
            free(cost), free(sum);
            if (build(&g, NULL) != DT_OK)
                return fail("build");
        }
        if (dt_pipe_schedule_parse(g_mode, &po.schedule) != DT_OK ||
            dt_pipe_new(&pp, g, 1, (const char *[]){cut}, pg, 1, &po) != DT_OK)
            return fail("pipeline");
        g = dt_pipe_graph(pp);
        if (rank == 0) // "auto:" and the cut it chose
            snprintf(g_cut_used, sizeof g_cut_used, "%s%s",
                     strcmp(g_cut, "auto") ? "" : "auto:", cut);
    }
    dt_params *p  = dt_graph_params(g);
    float     *dl = malloc(sizeof(float) * B * T * g_vocab);
    double     t[WARM + STEPS], comp = 0, tot = 0;
    for (int s = 0; s < WARM + STEPS; s++) {
        if (s == WARM && pp)
            dt_pipe_stats(pp, NULL, NULL, true);
        if (pg)
            dt_pg_barrier(pg);
        double t0 = dt_now();
        dt_params_zero_grad(p);
        float     loss;
        dt_status st;
        if (pp) {
            st = dt_pipe_step(pp, rank == 0 ? (const void *[]){g_idx, g_pos} : NULL, B, NULL, ce,
                              NULL, &loss);
        } else {
            st = dt_graph_forward(g, (const void *[]){g_idx + lo * T, g_pos + lo * T}, nb);
            if (st == DT_OK)
                st = ce(NULL, dt_graph_output(g), lo, nb, &loss, dl);
            if (st == DT_OK)
                st = dt_graph_backward(g, dl);
            if (st == DT_OK && ddp)
                st = dt_ddp_sync(ddp);
        }
        if (st != DT_OK)
            return fail("step");
        float *w = dt_params_data(p), *gr = dt_params_grads(p);
        for (size_t i = 0; i < dt_params_numel(p); i++)
            w[i] -= 0.01f * gr[i];
        t[s] = dt_now() - t0;
    }
    if (pp)
        dt_pipe_stats(pp, &comp, &tot, false);
    qsort(t + WARM, STEPS, sizeof(double), cmp);
    double med = t[WARM + STEPS / 2];
    // Both stages' compute per micro-batch: the theory of these stages (see the top).
    float mb[2] = {0, 0};
    if (pp) {
        float mine = (float)(comp / STEPS / g_micro);
        if (dt_pg_all_gather(pg, &mine, mb, 1, DT_FLOAT32) != DT_OK)
            return fail("gather");
    }
    double step_th = mb[0] + mb[1] + (g_micro - 1) * (mb[0] > mb[1] ? mb[0] : mb[1]);
    if (rank == 0 || pp)
        printf("%s M=%d V=%d rank %d: step %.2f ms, %.0f tokens/s%s", g_mode, pp ? g_micro : 1,
               g_vocab, rank, med * 1e3, B * T / med, pp ? "" : "\n");
    if (pp)
        printf(", bubble %.3f (theory %.3f), stage %.3f ms per micro-batch, these stages' "
               "theory %.3f, cut %s\n",
               1.0 - comp / tot, 1.0 / (g_micro + 1), mb[rank] * 1e3,
               1.0 - g_micro * mb[rank] / step_th, rank == 0 ? g_cut_used : "(rank 0's)");
    fflush(stdout);
    free(dl);
    dt_ddp_free(ddp);
    if (pp)
        dt_pipe_free(pp);
    else
        dt_graph_free(g);
    dt_pg_free(pg);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pipe_bench gpipe|1f1b|dp|tp|one [M [CUT|auto [g_vocab]]]\n");
        return 2;
    }
    g_mode = argv[1];
    if (argc > 2)
        g_micro = atoi(argv[2]);
    if (argc > 3)
        g_cut = argv[3];
    if (argc > 4)
        g_vocab = atoi(argv[4]);
    dt_rng r = dt_rng_init(3);
    for (int i = 0; i < B * T; i++) {
        g_idx[i] = (int32_t)dt_rng_below(&r, g_vocab);
        g_tgt[i] = (int32_t)dt_rng_below(&r, g_vocab);
        g_pos[i] = i % T;
    }
    if (!strcmp(g_mode, "one"))
        return worker(0, NULL);
    dt_spawn_result res;
    return dt_spawn(2, worker, NULL, &res) == DT_OK ? 0 : 1;
}
