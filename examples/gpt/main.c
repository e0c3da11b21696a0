// dtrain-gpt: a GPT-2-style byte-level language model (the PyTorch peer
// bench/peer/gpt_bytes.py) on Debian's `fortunes` text or any file of bytes, in one
// process, data-parallel over many, or cut and split over a device mesh.
//
//   wte (256 x C) + wpe (T x C); n_layer pre-LN blocks
//     x = x + c_proj(attn(c_attn(ln_1(x))))      causal, n_head heads
//     x = x + c_proj(gelu_tanh(c_fc(ln_2(x))))   C -> 4C -> C
//   ln_f; logits = ln_f(x) wte^T (the head tied to the token embedding)
//
// Defaults (4 layers, 4 heads, C 128, T 128): 842,496 parameters. AdamW (betas 0.9,
// 0.95, weight decay 0.1 on matrices only), gradients clipped at norm 1, 20 warm-up
// steps then a cosine to 0.1 x lr at the last step, global batch 32 x 128 tokens.
// `--batch-size` is the GLOBAL batch, as in the peer: at step s every rank draws the
// global batch's offsets from an MT19937 seeded seed * 1000 + s (at one process, the
// peer's batches exactly) and takes its replica's rows (r, r + P, ...), so the batch does
// not depend on the number of processes. Under elastic membership (dtrun --nnodes
// MIN:MAX, docs/dtrun.md) P changes between steps: the share and the replica are read at
// every step, and at a step where the group changed (dt_trainer_regrouped) the program
// makes no collective call of its own.
//
// Every layout is one program (docs/parallel.md): --dp x --pp x --tp ranks, the model
// cut into --pp stages on the residual stream (after "emb" or a block's "h.i.res_1" or
// "h.i.res_2"; the head, tied to wte, on the last stage) and each block's attention and MLP split
// over --tp ranks (Megatron: c_attn and c_fc by columns, the c_proj by rows), with the embedding,
// the head and the cross-entropy split over the vocabulary. The initial weights are
// drawn in the whole model's order, so every layout trains the model of one process.
//
// The plumbing (flags, launch, mesh, DDP, checkpoints and --resume, --load,
// --save-model, SIGTERM) is the trainer's (dtrain/train.h), in its step-based mode:
// what is left is the model, the loop, the evaluation and the peer's printed lines.
// `--sample N` prints text from a saved model instead of training.
#include "dtrain/ckpt.h"
#include "dtrain/tp.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define VOCAB        256
#define EVAL_WINDOWS 64

typedef struct args {
    long steps, batch, n_layer, n_head, n_embd, block, eval_every, limit, sample, micro, top_k,
        warmup;
    double      lr, min_lr_ratio, weight_decay, grad_clip, temperature;
    const char *data, *prompt;
} args;

// ------------------------------------------------------------------------- the model

static dt_status add_named(dt_graph *g, dt_layer *l, const char *in, const char *fmt, ...) {
    char    name[DT_GRAPH_NAME_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return dt_graph_add(g, name, l, in);
}

// A Linear layer, whole (tp NULL) or this rank's shard over tp (mode: column or row).
static dt_status linear(dt_layer **l, int in, int out, bool bias, int groups, dt_tp_mode mode,
                        dt_pg *tp) {
    if (!tp)
        return dt_layer_linear_new(l, in, out, &(dt_linear_opts){.bias = bias});
    dt_linear_tp_opts o = dt_linear_tp_opts_default();
    dt_tp_sum_opts(&o, tp);
    o.bias = bias, o.groups = groups;
    return dt_layer_linear_tp_new(l, in, out, mode, dt_pg_size(tp), dt_pg_rank(tp), &o);
}

// The whole model, not finalized. Node names follow the peer's state_dict:
// "h.0.attn.c_attn" holds h.0.attn.c_attn.weight, whichever layout holds it.
static dt_status gpt_build(dt_graph *g, const args *a, dt_pg *tp) {
    int       C = (int)a->n_embd, T = (int)a->block, heads = (int)a->n_head;
    int       parts = tp ? dt_pg_size(tp) : 1;
    dt_layer *l;
    char      x[64], y[64];
    if (heads % parts || VOCAB % parts)
        return dt_fail(DT_ERR_ARG,
                       "--tp %d: expected it to divide --n-head %d and the vocabulary %d", parts,
                       heads, VOCAB);
    DT_TRY(dt_graph_input(g, "idx", &(dt_shape){1, {T}, DT_ELEM_I32}));
    DT_TRY(dt_graph_input(g, "pos", &(dt_shape){1, {T}, DT_ELEM_I32}));
    if (tp) { // the vocabulary split, as the head's
        dt_linear_tp_opts o = dt_linear_tp_opts_default();
        dt_tp_sum_opts(&o, tp);
        DT_TRY(dt_layer_embedding_tp_new(&l, VOCAB, C, parts, dt_pg_rank(tp), &o));
    } else {
        DT_TRY(dt_layer_embedding_new(&l, VOCAB, C, NULL));
    }
    DT_TRY(dt_graph_add(g, "wte", l, "idx"));
    DT_TRY(dt_layer_embedding_new(&l, T, C, NULL));
    DT_TRY(dt_graph_add(g, "wpe", l, "pos"));
    DT_TRY(dt_layer_add_new(&l, NULL));
    DT_TRY(dt_graph_add(g, "emb", l, "wte", "wpe"));
    snprintf(x, sizeof x, "emb");
    for (int i = 0; i < a->n_layer; i++) {
        char p[16], n[64];
        snprintf(p, sizeof p, "h.%d.", i);
#define PREV(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
        DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
        DT_TRY(add_named(g, l, x, "%sln_1", p));
        DT_TRY(linear(&l, C, 3 * C, true, 3, DT_TP_COLUMN, tp)); // q|k|v of this rank's heads
        DT_TRY(add_named(g, l, PREV("ln_1"), "%sattn.c_attn", p));
        DT_TRY(dt_layer_attention_new(&l, heads / parts, NULL));
        DT_TRY(add_named(g, l, PREV("attn.c_attn"), "%sattn.heads", p));
        DT_TRY(linear(&l, C, C, true, 1, DT_TP_ROW, tp));
        DT_TRY(add_named(g, l, PREV("attn.heads"), "%sattn.c_proj", p));
        DT_TRY(dt_layer_add_new(&l, NULL));
        snprintf(y, sizeof y, "%sres_1", p);
        DT_TRY(dt_graph_add(g, y, l, x, PREV("attn.c_proj")));
        DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
        DT_TRY(add_named(g, l, y, "%sln_2", p));
        DT_TRY(linear(&l, C, 4 * C, true, 1, DT_TP_COLUMN, tp));
        DT_TRY(add_named(g, l, PREV("ln_2"), "%smlp.c_fc", p));
        DT_TRY(dt_layer_act_new(&l, DT_ACT_GELU_TANH, NULL));
        DT_TRY(add_named(g, l, PREV("mlp.c_fc"), "%smlp.gelu", p));
        DT_TRY(linear(&l, 4 * C, C, true, 1, DT_TP_ROW, tp));
        DT_TRY(add_named(g, l, PREV("mlp.gelu"), "%smlp.c_proj", p));
        DT_TRY(dt_layer_add_new(&l, NULL));
        snprintf(x, sizeof x, "%sres_2", p);
        DT_TRY(dt_graph_add(g, x, l, y, PREV("mlp.c_proj")));
#undef PREV
    }
    DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
    DT_TRY(dt_graph_add(g, "ln_f", l, x));
    DT_TRY(linear(&l, C, VOCAB, false, 1, DT_TP_COLUMN, tp)); // logits split like wte
    DT_TRY(dt_graph_add(g, "head", l, "ln_f"));
    return dt_graph_tie(g, "head.weight", "wte.weight");
}

// The peer's init, one pass over the whole model's tensors in order: weights N(0, 0.02),
// the two c_proj weights per block N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1
// and 0. The trainer keeps each rank's part (dt_trainer_init_params).
typedef struct init_draws {
    dt_rng r;
    double std, proj_std;
} init_draws;

static void gpt_fill(void *user, const dt_param_info *t, float *w) {
    init_draws *d    = user;
    size_t      n    = strlen(t->name);
    bool        bias = n > 5 && !strcmp(t->name + n - 5, ".bias");
    bool        ln   = strstr(t->name, "ln_") != NULL;
    double      s    = strstr(t->name, "c_proj.weight") ? d->proj_std : d->std;
    for (size_t k = 0; k < t->count; k++)
        w[k] = bias ? 0.0f : ln ? 1.0f : (float)(s * dt_rng_normal(&d->r));
}

// The whole model's parameter count (the parts of a mesh hold a share each).
static size_t gpt_numel(const args *a) {
    size_t C = (size_t)a->n_embd, L = (size_t)a->n_layer;
    return VOCAB * C + (size_t)a->block * C + L * (12 * C * C + 13 * C) + 2 * C;
}

// A replica's batch of b sequences (the pipeline cuts it into micro-batches) and the
// evaluation's windows; the loss's context.
typedef struct gpt {
    dt_trainer    *t;
    dt_pg         *tp;          // the vocabulary's split (NULL: whole)
    int            b, T, M;     // M: the pipeline's micro-batches
    int32_t       *x, *y, *pos; // (max(b, EVAL_WINDOWS), T)
    int32_t       *ex, *ey;     // the evaluation's (EVAL_WINDOWS, T)
    uint64_t      *offsets;     // (global batch)
    const int32_t *tgt;         // the targets the loss reads: y or ey
} gpt;

static dt_status gpt_buffers(gpt *m, const args *a, int b) {
    m->b = b, m->T = (int)a->block;
    size_t rows = (size_t)(b > EVAL_WINDOWS ? b : EVAL_WINDOWS), bt = rows * (size_t)m->T;
    m->x       = calloc(bt, sizeof(int32_t));
    m->y       = calloc(bt, sizeof(int32_t));
    m->pos     = calloc(bt, sizeof(int32_t));
    m->ex      = calloc(bt, sizeof(int32_t));
    m->ey      = calloc(bt, sizeof(int32_t));
    m->offsets = calloc((size_t)a->batch, sizeof(uint64_t));
    if (!m->x || !m->y || !m->pos || !m->ex || !m->ey || !m->offsets)
        return dt_fail(DT_ERR_NOMEM, "dtrain-gpt: out of memory for a batch of %zu tokens", bt);
    for (size_t i = 0; i < bt; i++)
        m->pos[i] = (int32_t)(i % (size_t)m->T);
    return DT_OK;
}

static void gpt_free_buffers(gpt *m) { // the graph is the trainer's
    free(m->x), free(m->y), free(m->pos), free(m->ex), free(m->ey), free(m->offsets);
}

// The pipeline's loss on the last stage: mean cross-entropy of sequences
// [first, first + n) (over the vocabulary's split with --tp), fp16's scale on dout.
static dt_status gpt_ce(void *user, const float *out, int first, int n, float *loss, float *dout) {
    gpt           *m     = user;
    const int32_t *tgt   = m->tgt + (size_t)first * (size_t)m->T;
    int            parts = m->tp ? dt_pg_size(m->tp) : 1;
    if (m->tp)
        DT_TRY(dt_tp_cross_entropy(m->tp, out, tgt, n * m->T, VOCAB, -100, loss, dout));
    else
        DT_TRY(dt_loss_cross_entropy_ex(out, tgt, n * m->T, VOCAB, -100, 0.0f, loss, dout));
    dt_trainer_scale_loss_grad(m->t, dout, (size_t)n * (size_t)m->T * (VOCAB / parts));
    return DT_OK;
}

// The peer's evaluation: the first 64 windows of T + 1 bytes of val, through the
// pipeline (every rank of the first replica). Under ZeRO-3 (sharded) every rank takes
// part in each forward's gathers: with a world dividing the windows, each rank takes its
// share and the means are summed over the ranks; otherwise every rank runs them all.
static dt_status gpt_eval(gpt *m, const dt_tokens *val, bool sharded, float *out) {
    uint64_t off[EVAL_WINDOWS];
    for (int k = 0; k < EVAL_WINDOWS; k++)
        off[k] = (uint64_t)k * (uint64_t)(m->T + 1);
    DT_TRY(dt_tokens_windows(val, off, EVAL_WINDOWS, (size_t)m->T, m->ex, m->ey));
    int world = dt_trainer_world(m->t), n = EVAL_WINDOWS, lo = 0;
    if (sharded && EVAL_WINDOWS % world == 0 && EVAL_WINDOWS / world >= m->M)
        n = EVAL_WINDOWS / world, lo = dt_trainer_rank(m->t) * n;
    else
        sharded = false;
    const int32_t *x = m->ex + (size_t)lo * (size_t)m->T;
    m->tgt           = m->ey + (size_t)lo * (size_t)m->T;
    dt_status st     = dt_trainer_pipe_eval(m->t, (const void *[]){x, m->pos}, n, gpt_ce, m, out);
    m->tgt           = m->y;
    if (st == DT_OK && sharded) { // the mean over all windows: the shares' means, summed
        *out /= (float)world;
        st = dt_trainer_all_reduce(m->t, out, 1, DT_FLOAT32, DT_REDUCE_SUM);
    }
    return st;
}

// The peer's schedule: warm-up (s + 1) / warmup, then a cosine to min_lr at the last step.
static double lr_at(int64_t s, void *user) {
    const args *a = user;
    if (s < a->warmup)
        return (double)(s + 1) / (double)a->warmup;
    double min = a->min_lr_ratio, den = (double)(a->steps - 1 - a->warmup);
    double r = den > 0 ? (double)(s - a->warmup) / den : 1.0;
    return min + 0.5 * (1.0 + cos(M_PI * r)) * (1.0 - min);
}

static double flops_per_token(const args *a) {
    double L = (double)a->n_layer, C = (double)a->n_embd, T = (double)a->block;
    return 3.0 * (2.0 * (12.0 * L * C * C + C * VOCAB) + 4.0 * L * T * C);
}

// ------------------------------------------------------------------------- training

typedef struct job {
    args      a;
    dt_tokens all, train, val;
    size_t    nfiles;
} job;

static void print_stats(dt_trainer *t, const job *j, size_t params, int64_t steps, double evals,
                        double setup, float val, float last, double last10, const double *mem);

typedef struct builder {
    const args *a;
    dt_pg      *tp;
} builder;

static dt_status build_whole(void *user, dt_graph **whole) {
    const builder *bd = user;
    DT_TRY(dt_graph_new(whole, NULL));
    return gpt_build(*whole, bd->a, bd->tp);
}

static dt_status train(dt_trainer *t, void *user) {
    const job           *j  = user;
    const args          *a  = &j->a;
    const dt_train_args *ta = dt_trainer_args(t);
    int  dp = dt_trainer_mesh_size(t, DT_MESH_DP), dpr = dt_trainer_mesh_coord(t, DT_MESH_DP);
    int  pp = dt_trainer_mesh_size(t, DT_MESH_PP), world = dt_trainer_world(t);
    bool first_replica = dpr == 0; // evaluates (its ranks hold one whole model between them)
    bool sharded       = ta->zero == 3 && dp > 1; // ZeRO-3: every rank takes part in each forward
    if (a->batch % dp)
        return dt_fail(DT_ERR_ARG,
                       "--batch-size %ld (global) is not divisible by %d data-parallel replicas",
                       a->batch, dp);
    int  b  = (int)(a->batch / dp);
    long mb = a->micro < 0 ? (b % 16 == 0 ? 16 : 0) : a->micro; // default 16 when it divides
    mb      = mb > 0 && mb < b ? mb : b;
    if (b % mb)
        return dt_fail(DT_ERR_ARG, "--micro-batch %ld must divide the batch of each replica (%d)",
                       mb, b);
    // The pipeline's micro-batches: the sequences per forward, and with stages at least
    // one micro-batch per stage unless --micro-batch says otherwise.
    int M = b / (int)mb;
    if (pp > 1 && a->micro < 0 && M < pp)
        M = pp < b ? pp : b;
    gpt m = {.t = t, .tp = dt_trainer_mesh_group(t, DT_MESH_TP), .M = M};
    DT_TRY(gpt_buffers(&m, a, b));
    m.tgt = m.y;
    // Where a stage may end: after the embeddings, and after each block's two residual
    // adds (the stream is all a later stage reads): half blocks, for balance.
    int ncand         = 2 * (int)a->n_layer + 1;
    char(*cn)[24]     = calloc((size_t)ncand, sizeof *cn);
    const char **cand = calloc((size_t)ncand, sizeof *cand);
    dt_status    st   = cn && cand ? DT_OK : DT_ERR_NOMEM;
    for (int i = 0; st == DT_OK && i < ncand; i++) {
        if (i == 0)
            snprintf(cn[i], sizeof cn[i], "emb");
        else
            snprintf(cn[i], sizeof cn[i], "h.%d.res_%d", (i - 1) / 2, 2 - i % 2);
        cand[i] = cn[i];
    }
    builder   bd  = {a, m.tp};
    dt_graph *g   = NULL;
    dt_optim *opt = NULL;
    dt_sched *sch = NULL;
    if (st == DT_OK)
        st = dt_trainer_set_steps(t, a->steps, 1, (size_t)b);
    if (st == DT_OK)
        st = dt_trainer_pipeline(t, build_whole, &bd, ncand, cand, M, &g);
    free(cn), free(cand);
    init_draws draws = {dt_rng_init((uint64_t)ta->seed), 0.02,
                        0.02 / sqrt(2.0 * (double)a->n_layer)};
    if (st == DT_OK)
        st = dt_trainer_init_params(t, gpt_fill, &draws);
    dt_params   *p  = g ? dt_graph_params(g) : NULL;
    dt_adam_opts ao = dt_adamw_opts_default();
    ao.lr = (float)a->lr, ao.beta2 = 0.95f, ao.weight_decay = (float)a->weight_decay;
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0; // biases and LayerNorm
    dt_sched_opts so       = dt_sched_opts_default();
    args          la       = *a; // the schedule's copy
    so.kind = DT_SCHED_LAMBDA, so.lambda = lr_at, so.user = &la;
    if (st == DT_OK)
        st = dt_adamw_new(&opt, p, &ao);
    if (st == DT_OK)
        st = dt_optim_add_group(opt, dt_param_no_decay, NULL, &nd, NULL);
    if (st == DT_OK)
        st = dt_sched_new(&sch, &so);
    dt_trainer_set_clip_grad(t, a->grad_clip);
    if (st == DT_OK) // what --device cuda computes on the GPU (gpt_ce on the CPU)
        st = dt_trainer_set_loss(t, &(dt_loss_spec){DT_LOSS_CROSS_ENTROPY, -100, 0.0f, 1.0f});
    // From here the trainer owns the optimizer and schedule: --load, --resume, DDP.
    if (st == DT_OK)
        st = dt_trainer_prepare_graph(t, g, opt, sch);
    else
        dt_sched_free(sch), dt_optim_free(opt);
    if (st) {
        gpt_free_buffers(&m);
        return st;
    }
    dt_trainer_print(t,
                     "model: n_layer %ld, n_head %ld, n_embd %ld, block %ld, vocab %d | "
                     "parameters: %zu | %.3f MFLOP per trained token (fwd+bwd) | threads %d\n",
                     a->n_layer, a->n_head, a->n_embd, a->block, VOCAB, gpt_numel(a),
                     flops_per_token(a) / 1e6, dt_trainer_threads(t));
    dt_trainer_print(t,
                     "data: %zu file(s), train %zu bytes, val %zu bytes | batch %ld x %ld tokens "
                     "over %d rank(s), %ld steps\n",
                     j->nfiles, j->train.n, j->val.n, a->batch, a->block, world, a->steps);
    // Elastic membership (dtrun --nnodes MIN:MAX): a joiner comes out of the preparation
    // while the members come out of a step, so neither meets the others here.
    if (!dt_trainer_regrouped(t))
        st = dt_trainer_wait_for_everyone(t);
    int64_t  step0 = dt_trainer_step_count(t), mark_step = step0;
    double   mark = dt_now(), evals = 0, evals_mark = 0, last10[10] = {0};
    double   setup = mark - dt_trainer_start_time(t);
    float    val = NAN, last = NAN;
    dt_batch bt;
    while (!st && dt_trainer_next(t, &bt)) {
        // This replica's slice of the global batch drawn at this step, through the
        // pipeline's micro-batches; DDP reduces the gradients during the last one's
        // backward, then the trainer clips and steps AdamW at the scheduled lr. An
        // elastic job's world changes between steps: the replica and the share are read
        // at each (bt.size: the global batch over the current world).
        int64_t s = dt_trainer_step_count(t);
        float   l;
        dp = dt_trainer_mesh_size(t, DT_MESH_DP), dpr = dt_trainer_mesh_coord(t, DT_MESH_DP);
        first_replica = dpr == 0;
        if ((st = dt_tokens_batch(&j->train, (uint64_t)(ta->seed * 1000 + s), (size_t)a->batch,
                                  (size_t)m.T, dpr, dp, m.offsets, m.x, m.y)) ||
            (st = dt_trainer_on_gpu(t) // --device cuda: the step on the GPU
                      ? dt_trainer_device_step(t, (const void *[]){m.x, m.pos}, m.y, (int)bt.size,
                                               &l)
                      : dt_trainer_pipe_step(t, (const void *[]){m.x, m.pos}, (int)bt.size, NULL,
                                             gpt_ce, &m, &l)) ||
            (st = dt_trainer_step(t, l)))
            break;
        float loss = l; // the global batch's mean: the replicas' means averaged
        if (dt_trainer_regrouped(t) && dt_trainer_step_count(t) == s)
            continue; // a member was lost in the step: the new group does it again
        if (!dt_trainer_regrouped(t) && // else this rank's mean (the old group is gone)
            (st = dt_trainer_all_reduce(t, &loss, 1, DT_FLOAT32, DT_REDUCE_AVG)))
            break;
        last = loss, last10[s % 10] = loss, s++;
        if (s == 1 || s % ta->log_every == 0 || s == a->steps) {
            double now = dt_now(), dt = (now - mark) - (evals - evals_mark);
            dt_trainer_print(t, "step %lld/%ld | loss %.6f | lr %.4e | tok/s %.0f\n", (long long)s,
                             a->steps, (double)loss, (double)dt_optim_lr(opt),
                             (double)a->batch * (double)a->block * (double)(s - mark_step) / dt);
            mark = now, evals_mark = evals, mark_step = s;
        }
        if (a->eval_every > 0 && s % a->eval_every == 0 && s < a->steps &&
            (first_replica || sharded)) {
            double te = dt_now();
            if ((st = gpt_eval(&m, &j->val, sharded, &val)) || (st = dt_trainer_log_val(t, val)))
                break;
            dt_trainer_print(t, "step %lld/%ld | val loss %.4f\n", (long long)s, a->steps,
                             (double)val);
            evals += dt_now() - te;
            dt_trainer_exclude_time(t, dt_now() - te);
        }
    }
    int64_t steps = dt_trainer_step_count(t) - step0, n10 = steps < 10 ? steps : 10;
    double  mean10 = 0;
    for (int64_t i = 0; i < n10; i++)
        mean10 += last10[(dt_trainer_step_count(t) - 1 - i) % 10] / (double)n10;
    double mem[2]; // the state's peak and traffic of the training steps (not the final eval)
    dt_trainer_state_bytes(t, &mem[0], &mem[1]);
    if (!st)
        st = dt_trainer_finish(t); // "Finished training", the checkpoint, --save-model
    if (!st && (first_replica || sharded) && !(st = gpt_eval(&m, &j->val, sharded, &val))) {
        dt_trainer_print(t, "val loss: %.4f\n", (double)val);
        st = dt_trainer_log_val(t, val);
    }
    if (!st)
        print_stats(t, j, gpt_numel(a), steps, evals, setup, val, last, mean10, mem);
    if (!st)
        st = dt_trainer_report(t, NAN); // --plot
    gpt_free_buffers(&m);
    return st;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

// One STATS line per rank, in rank order, as the peer prints them.
static void print_stats(dt_trainer *t, const job *j, size_t params, int64_t steps, double evals,
                        double setup, float val, float last, double last10, const double *mem) {
    const args *a      = &j->a;
    double      tokens = (double)a->batch * (double)a->block * (double)steps,
           loop        = dt_trainer_loop_secs(t);
    char v[32]         = "null";
    if (dt_trainer_rank(t) == 0 && isfinite(val))
        snprintf(v, sizeof v, "%.6f", (double)val);
    for (int r = 0; r < dt_trainer_world(t); r++) {
        if (dt_trainer_wait_for_everyone(t) || r != dt_trainer_rank(t))
            continue;
        printf("STATS {\"rank\": %d, \"world\": %d, \"steps\": %lld, \"tokens\": %.0f, "
               "\"loop_secs\": %.3f, \"tokens_per_sec\": %.1f, \"eval_secs\": %.3f, "
               "\"setup_secs\": %.3f, "
               "\"params\": %zu, \"flops_per_token\": %.0f, \"gflops_per_sec\": %.2f, "
               "\"last_loss\": %.6f, \"last10_mean_loss\": %.6f, \"val_loss\": %s, "
               "\"peak_rss_mib\": %.1f, \"state_peak_mib\": %.2f, \"moved_mib_per_step\": %.3f, "
               "\"threads\": %d}\n",
               r, dt_trainer_world(t), (long long)steps, tokens, loop,
               loop > 0 ? tokens / loop : 0.0, evals, setup, params, flops_per_token(a),
               loop > 0 ? flops_per_token(a) * tokens / loop / 1e9 : 0.0, (double)last, last10, v,
               peak_rss_mib(), mem[0] / 1048576.0, mem[1] / 1048576.0, dt_trainer_threads(t));
        fflush(stdout);
    }
}

// ------------------------------------------------------------------------- sampling

// Text from a saved model: the prompt, then n bytes, each the argmax (temperature 0) or
// a draw (seeded by --seed) from softmax(logits / temperature) over the top-k logits
// (--top-k 0: all), the context the last T bytes.
static int sample(const args *a, const dt_train_args *ta) {
    gpt       m  = {0};
    dt_graph *g  = NULL;
    dt_status st = dt_graph_new(&g, NULL);
    if (!st)
        st = gpt_build(g, a, NULL);
    if (!st)
        st = dt_graph_finalize(g, 0);
    if (!st)
        st = dt_graph_set_threads(g, ta->threads ? (int)ta->threads : 1);
    if (!st)
        st = gpt_buffers(&m, a, 1);
    if (!st)
        st = dt_ckpt_load_params(ta->load, dt_graph_params(g));
    size_t   plen = strlen(a->prompt), n = plen + (size_t)a->sample;
    uint8_t *text = calloc(n + 1, 1);
    dt_rng   r    = dt_rng_init((uint64_t)ta->seed);
    if (!st && !text)
        st = DT_ERR_NOMEM;
    if (!st)
        memcpy(text, a->prompt, plen);
    dt_graph_train(g, false);
    for (size_t len = plen; !st && len < n; len++) {
        size_t from = len > (size_t)m.T ? len - (size_t)m.T : 0, ctx = len - from;
        memset(m.x, 0, sizeof(int32_t) * (size_t)m.T); // past the context: causal, unread
        for (size_t i = 0; i < ctx; i++)
            m.x[i] = text[from + i];
        if (ctx == 0) { // no prompt: start from a newline
            m.x[0] = '\n';
            ctx    = 1;
        }
        if ((st = dt_graph_forward(g, (const void *[]){m.x, m.pos}, 1)))
            break;
        const float *lg   = dt_graph_output(g) + (ctx - 1) * VOCAB;
        int          best = 0;
        for (int v = 1; v < VOCAB; v++)
            best = lg[v] > lg[best] ? v : best;
        if (a->temperature > 0) {
            // The k-th largest logit (ties kept): logits below it are left out.
            float cut = -INFINITY;
            if (a->top_k > 0 && a->top_k < VOCAB) {
                float s[VOCAB];
                memcpy(s, lg, sizeof s);
                for (int k = 0; k < a->top_k; k++) { // partial selection, k <= 256
                    int i = k;
                    for (int v = k + 1; v < VOCAB; v++)
                        i = s[v] > s[i] ? v : i;
                    float x = s[k];
                    s[k] = s[i], s[i] = x;
                }
                cut = s[a->top_k - 1];
            }
            double p[VOCAB], z = 0, u = dt_rng_uniform(&r);
            for (int v = 0; v < VOCAB; v++)
                z += p[v] = lg[v] < cut ? 0.0 : exp((lg[v] - lg[best]) / a->temperature);
            for (best = 0; best < VOCAB - 1 && (u -= p[best] / z) > 0; best++)
                ;
            while (p[best] == 0 && best > 0) // rounding ran past the last kept byte
                best--;
        }
        text[len] = (uint8_t)best;
    }
    if (!st)
        fwrite(text, 1, n, stdout), putchar('\n');
    else
        fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
    free(text), dt_graph_free(g), gpt_free_buffers(&m);
    return st ? 1 : 0;
}

// ------------------------------------------------------------------------- main

static const char summary[] =
    "The PyTorch peer gpt_bytes.py's model, flags and meaning: --batch-size is the GLOBAL\n"
    "batch (each of P ranks takes B/P sequences), and \"Finished training in S secs\" times\n"
    "the training loop only (evaluations excluded); the PARENT line's wall_secs includes\n"
    "start-up. Prints `step N/S | loss X | lr Y | tok/s Z`, `val loss: X.XXXX`, a STATS\n"
    "line per rank and a PARENT line.\n";

static const char epilogue[] =
    "--sample N --prompt TEXT [--temperature X --top-k K --seed S] --load PATH prints N\n"
    "bytes after TEXT from a saved model instead of training (give the model flags it was\n"
    "trained with). Exit status: 0 done, 1 failed, 2 usage error, 75 stopped by SIGTERM.\n";

int main(int argc, char **argv) {
    job            j = {0};
    args          *a = &j.a;
    const unsigned R = DT_FLAG_SHARED | DT_FLAG_CKPT_REFUSE, W = DT_FLAG_SHARED | DT_FLAG_CKPT_WARN;
    const char    *M = "model and training (the peer's)", *S = "sampling";
    const dt_flag  flags[] = {
         {"steps", DT_FLAG_LONG, &a->steps, "300", 1, 1L << 40, "N", "optimizer steps (default 300)",
          M, R, 0, 0},
         {"batch-size", DT_FLAG_LONG, &a->batch, "32", 1, 1 << 20, "B",
          "the GLOBAL batch in sequences: each of P ranks takes B/P (default 32)", M, R, 0, 0},
         {"block-size", DT_FLAG_LONG, &a->block, "128", 1, 1 << 16, "T", "context (default 128)", M,
          R, 0, 0},
         {"n-layer", DT_FLAG_LONG, &a->n_layer, "4", 1, 1024, "L", "blocks (default 4)", M, R, 0, 0},
         {"n-head", DT_FLAG_LONG, &a->n_head, "4", 1, 1024, "H", "heads (default 4)", M, R, 0, 0},
         {"n-embd", DT_FLAG_LONG, &a->n_embd, "128", 1, 1 << 16, "C", "width (default 128)", M, R, 0,
          0},
         {"lr", DT_FLAG_DOUBLE, &a->lr, "1e-3", 0, 10, "X", "AdamW's peak rate (default 1e-3)", M, W,
          0, 0},
         {"warmup", DT_FLAG_LONG, &a->warmup, "20", 1, 1L << 40, "N", "warm-up steps (default 20)",
          M, W, 0, 0},
         {"min-lr-ratio", DT_FLAG_DOUBLE, &a->min_lr_ratio, "0.1", 0, 1, "R",
          "the cosine ends at R x lr at the last step (default 0.1)", M, W, 0, 0},
         {"weight-decay", DT_FLAG_DOUBLE, &a->weight_decay, "0.1", 0, 10, "W",
          "on matrices only (default 0.1)", M, W, 0, 0},
         {"grad-clip", DT_FLAG_DOUBLE, &a->grad_clip, "1.0", 1e-12, 1e12, "G",
          "clip the gradients' global norm (default 1.0)", M, W, 0, 0},
         {"data", DT_FLAG_STRING, &a->data, NULL, 0, 0, "PATH",
          "a file of bytes, or a directory: its files without a dot, sorted\n"
           "(default " DT_FORTUNES_DIR ")",
          M, 0, 0, 0},
         {"limit", DT_FLAG_LONG, &a->limit, "0", 0, 1L << 50, "N",
          "the corpus's first N bytes only (default 0: all)", M, DT_FLAG_SHARED, 0, 0},
         {"eval-every", DT_FLAG_LONG, &a->eval_every, "100", 0, 1L << 40, "N",
          "validation loss every N steps (default 100; 0: at the end only)", M, 0, 0, 0},
         {"micro-batch", DT_FLAG_LONG, &a->micro, "-1", 0, 1 << 20, "N",
          "sequences per forward (gradient accumulation: less memory, the\n"
           "same step up to rounding; default 16 when it divides the batch\n"
           "of a process, else the whole batch, as 0 does)",
          M, R, 0, 0},
         {"sample", DT_FLAG_LONG, &a->sample, "0", 1, 1 << 24, "N",
          "print N bytes generated from --load's model after --prompt", S, 0, 0, 0},
         {"prompt", DT_FLAG_STRING, &a->prompt, "", 0, 0, "TEXT", "the text to continue", S, 0, 0,
          0},
         {"temperature", DT_FLAG_DOUBLE, &a->temperature, "0", 0, 100, "X",
          "divides the logits before the draw (default 0: greedy, the argmax)", S, 0, 0, 0},
         {"top-k", DT_FLAG_LONG, &a->top_k, "0", 0, VOCAB, "K",
          "draw among the K most likely bytes only (default 0: all)", S, 0, 0, 0},
         {0}};
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "dtrain-gpt";
    o.summary         = summary;
    o.epilogue        = epilogue;
    o.flags           = flags;
    o.hide_flags      = "epochs accumulate clip-grad invariant no-test stats profile";
    o.own_progress    = true;
    o.model_parallel  = true;
    o.loop_time       = true;
    double      start = dt_now();
    dt_trainer *t;
    dt_status   st = dt_trainer_new(&t, argc, argv, &o);
    if (st || !t)
        return st == DT_ERR_ARG ? 2 : st ? 1 : 0;
    const dt_train_args *ta    = dt_trainer_args(t);
    long                 procs = ta->num_processes ? ta->num_processes * ta->num_machines : 1;
    long dp         = ta->dp ? ta->dp : procs / ((ta->pp ? ta->pp : 1) * (ta->tp ? ta->tp : 1));
    dp              = dp > 0 ? dp : 1; // a launcher's world: checked again in each worker
    const char *bad = NULL;
    if (a->n_embd % a->n_head)
        bad = "--n-embd must be divisible by --n-head";
    else if (ta->tp > 1 && (a->n_head % ta->tp || VOCAB % ta->tp))
        bad = "--tp must divide --n-head and the vocabulary (256)";
    else if (ta->pp > 2 * a->n_layer + 1)
        bad = "--pp can be at most 2 x --n-layer + 1 (cuts after the embeddings and after each "
              "block's two residual adds)";
    else if (a->batch % dp)
        bad = "--batch-size (global) must be divisible by the data-parallel replicas (--dp)";
    else if (a->micro > 0 && (a->batch / dp) % a->micro)
        bad = "--micro-batch must divide the batch of each replica (--batch-size / --dp)";
    else if (a->sample && !ta->load)
        bad = "--sample needs --load (a model saved with --save-model)";
    else if (a->sample && ta->num_processes)
        bad = "--sample runs in one process: drop --num-processes";
    if (bad) {
        fprintf(stderr, "dtrain-gpt: %s\n", bad);
        dt_trainer_exit(t, DT_OK);
        return 2;
    }
    int rc = 1;
    if (a->sample) {
        rc = sample(a, ta);
    } else if (dt_corpus_read(a->data, (size_t)a->limit, &j.all, &j.nfiles)) {
        fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
    } else if (dt_tokens_split(&j.all, &j.train, &j.val),
               j.val.n < (size_t)EVAL_WINDOWS * (size_t)(a->block + 1) ||
                   j.train.n <= (size_t)a->block + 1) {
        // Name the corpus: a too-small file is the usual cause (the default folder is
        // read when --data is not given).
        fprintf(stderr,
                "dtrain-gpt: --data %s: %zu bytes%s, split 9:1; expected a validation split of "
                "at least %d windows of %ld bytes and a training split longer than %ld bytes, "
                "found %zu and %zu bytes (give a larger corpus, or a smaller --block-size)\n",
                a->data && *a->data ? a->data : DT_FORTUNES_DIR, j.all.n,
                a->limit > 0 ? " (--limit)" : "", EVAL_WINDOWS, a->block + 1, a->block + 1, j.val.n,
                j.train.n);
    } else if (dt_trainer_add_setting(t, "the training split's size (--data, --limit)",
                                      (int64_t)j.train.n) ||
               dt_trainer_add_content(t, "the corpus's content (--data, --limit)", j.all.hash)) {
        fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
    } else {
        // The launching process prints PARENT: the parent of forked workers (after them),
        // or the only process.
        bool worker = dt_trainer_start(t);
        bool parent = !worker || (ta->num_processes == 0 && dt_trainer_world(t) == 1);
        rc          = dt_trainer_exit(t, worker ? train(t, &j) : DT_OK);
        t           = NULL;
        if (parent)
            printf("PARENT {\"peak_rss_mib\": %.1f, \"wall_secs\": %.3f}\n", peak_rss_mib(),
                   dt_now() - start);
    }
    dt_tokens_free(&j.all);
    if (t) // it never started (--sample, or the corpus refused)
        dt_trainer_exit(t, DT_OK);
    return rc;
}
