// dtrain-gpt: a GPT-2-style byte-level language model (the PyTorch peer
// bench/peer/gpt_bytes.py) on Debian's `fortunes` text or any file of bytes, in one
// process or data-parallel over many.
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
// peer's batches exactly) and takes its slice, so the batch does not depend on the
// number of processes.
//
// The model, the step and the distributed wrapping are the first half of this file;
// the plumbing (flags, launch, checkpoints, printing) is the second.
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"
#include "dtrain/graph.h"
#include "dtrain/optim.h"
#include "dtrain/zero.h"

#include <getopt.h>
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
    long        steps, batch, n_layer, n_head, n_embd, block, eval_every, log_every, threads;
    long        warmup, seed, limit, sample, micro, zero;
    double      lr, min_lr_ratio, weight_decay, grad_clip, temperature;
    long        num_processes, num_machines, machine_id, master_port, checkpoint_every;
    const char *data, *backend, *master_addr, *checkpoint_dir, *save_model, *load, *prompt;
    bool        resume;
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

// Node names follow the peer's state_dict: "h.0.attn.c_attn" holds h.0.attn.c_attn.weight.
static dt_status gpt_build(dt_graph *g, const args *a) {
    int       C = (int)a->n_embd, T = (int)a->block;
    dt_layer *l;
    char      x[64], y[64];
    DT_TRY(dt_graph_input(g, "idx", &(dt_shape){1, {T}, DT_ELEM_I32}));
    DT_TRY(dt_graph_input(g, "pos", &(dt_shape){1, {T}, DT_ELEM_I32}));
    DT_TRY(dt_layer_embedding_new(&l, VOCAB, C, NULL));
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
        DT_TRY(dt_layer_linear_new(&l, C, 3 * C, NULL));
        DT_TRY(add_named(g, l, PREV("ln_1"), "%sattn.c_attn", p));
        DT_TRY(dt_layer_attention_new(&l, (int)a->n_head, NULL));
        DT_TRY(add_named(g, l, PREV("attn.c_attn"), "%sattn.heads", p));
        DT_TRY(dt_layer_linear_new(&l, C, C, NULL));
        DT_TRY(add_named(g, l, PREV("attn.heads"), "%sattn.c_proj", p));
        DT_TRY(dt_layer_add_new(&l, NULL));
        snprintf(y, sizeof y, "%sres_1", p);
        DT_TRY(dt_graph_add(g, y, l, x, PREV("attn.c_proj")));
        DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
        DT_TRY(add_named(g, l, y, "%sln_2", p));
        DT_TRY(dt_layer_linear_new(&l, C, 4 * C, NULL));
        DT_TRY(add_named(g, l, PREV("ln_2"), "%smlp.c_fc", p));
        DT_TRY(dt_layer_act_new(&l, DT_ACT_GELU_TANH, NULL));
        DT_TRY(add_named(g, l, PREV("mlp.c_fc"), "%smlp.gelu", p));
        DT_TRY(dt_layer_linear_new(&l, 4 * C, C, NULL));
        DT_TRY(add_named(g, l, PREV("mlp.gelu"), "%smlp.c_proj", p));
        DT_TRY(dt_layer_add_new(&l, NULL));
        snprintf(x, sizeof x, "%sres_2", p);
        DT_TRY(dt_graph_add(g, x, l, y, PREV("mlp.c_proj")));
#undef PREV
    }
    DT_TRY(dt_layer_layernorm_new(&l, C, NULL));
    DT_TRY(dt_graph_add(g, "ln_f", l, x));
    dt_linear_opts no_bias = {.bias = false};
    DT_TRY(dt_layer_linear_new(&l, C, VOCAB, &no_bias));
    DT_TRY(dt_graph_add(g, "head", l, "ln_f"));
    DT_TRY(dt_graph_tie(g, "head.weight", "wte.weight"));
    return dt_graph_finalize(g, (uint64_t)a->seed);
}

// The peer's init, one pass in parameter order: weights N(0, 0.02), the two c_proj
// weights per block N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1 and 0.
static void gpt_init(dt_params *p, const args *a) {
    dt_rng r   = dt_rng_init((uint64_t)a->seed);
    double std = 0.02, proj_std = 0.02 / sqrt(2.0 * (double)a->n_layer);
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t    = dt_params_info(p, i);
        float               *w    = dt_params_data(p) + t->offset;
        size_t               n    = strlen(t->name);
        bool                 bias = n > 5 && !strcmp(t->name + n - 5, ".bias");
        bool                 ln   = strstr(t->name, "ln_") != NULL;
        double               s    = strstr(t->name, "c_proj.weight") ? proj_std : std;
        for (size_t k = 0; k < t->count; k++)
            w[k] = bias ? 0.0f : ln ? 1.0f : (float)(s * dt_rng_normal(&r));
    }
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

typedef struct gpt {
    dt_graph  *g;
    dt_params *p;
    int        b, T;        // this rank's sequences, context
    int        mb;          // sequences per forward (micro-batch), dividing b
    int32_t   *x, *y, *pos; // (b, T)
    uint64_t  *offsets;     // (global batch)
    float     *dlogits;     // (b, T, VOCAB)
} gpt;

static dt_status gpt_new(gpt *m, const args *a, int world) {
    memset(m, 0, sizeof *m);
    m->T = (int)a->block;
    m->b = (int)(a->batch / world);
    // Default (-1): 16 sequences per forward when 16 divides b, else all of them.
    long mb = a->micro < 0 ? (m->b % 16 == 0 ? 16 : 0) : a->micro;
    m->mb   = mb > 0 && mb < m->b ? (int)mb : m->b;
    DT_TRY(dt_graph_new(&m->g, NULL));
    DT_TRY(gpt_build(m->g, a));
    m->p = dt_graph_params(m->g);
    gpt_init(m->p, a);
    DT_TRY(dt_graph_set_threads(m->g, (int)a->threads));
    size_t bt  = (size_t)m->b * (size_t)m->T;
    m->x       = calloc(bt, sizeof(int32_t));
    m->y       = calloc(bt, sizeof(int32_t));
    m->pos     = calloc(bt, sizeof(int32_t));
    m->offsets = calloc((size_t)a->batch, sizeof(uint64_t));
    m->dlogits = calloc((size_t)m->mb * (size_t)m->T * VOCAB, sizeof(float));
    if (!m->x || !m->y || !m->pos || !m->offsets || !m->dlogits)
        return dt_fail(DT_ERR_NOMEM, "dtrain-gpt: out of memory for a batch of %zu tokens", bt);
    for (size_t i = 0; i < bt; i++)
        m->pos[i] = (int32_t)(i % (size_t)m->T);
    return DT_OK;
}

static void gpt_free(gpt *m) {
    dt_graph_free(m->g);
    free(m->x), free(m->y), free(m->pos), free(m->offsets), free(m->dlogits);
}

// Mean cross-entropy of n sequences at m->x + at, m->y + at; with dlogits, its gradient.
static dt_status gpt_loss(gpt *m, int at, int n, float *loss, float *dlogits) {
    size_t o = (size_t)at * (size_t)m->T;
    DT_TRY(dt_graph_forward(m->g, (const void *[]){m->x + o, m->pos}, n));
    return dt_loss_cross_entropy_ex(dt_graph_output(m->g), m->y + o, n * m->T, VOCAB, -100, 0.0f,
                                    loss, dlogits);
}

// Forward and backward of this rank's b sequences, mb at a time (gradient accumulation:
// DDP reduces after the last); the gradient is that of the mean over all b x T tokens.
static dt_status gpt_forward_backward(gpt *m, dt_ddp *ddp, dt_zero *zero, float *loss) {
    double sum = 0;
    dt_params_zero_grad(m->p);
    for (int at = 0; at < m->b; at += m->mb) {
        float l, scale = (float)m->mb / (float)m->b;
        DT_TRY(gpt_loss(m, at, m->mb, &l, m->dlogits));
        if (m->mb < m->b)
            for (size_t i = 0, n = (size_t)m->mb * (size_t)m->T * VOCAB; i < n; i++)
                m->dlogits[i] *= scale;
        if (ddp)
            dt_ddp_set_sync(ddp, at + m->mb >= m->b);
        if (zero)
            dt_zero_set_sync(zero, at + m->mb >= m->b);
        DT_TRY(dt_graph_backward(m->g, m->dlogits));
        sum += (double)l * m->mb;
    }
    *loss = (float)(sum / m->b);
    return DT_OK;
}

// The peer's evaluation: the first 64 windows of T + 1 bytes of val, in chunks of b.
static dt_status gpt_eval(gpt *m, const dt_tokens *val, float *out) {
    double sum = 0;
    dt_graph_train(m->g, false);
    for (int i = 0; i < EVAL_WINDOWS; i += m->mb) {
        int      n = EVAL_WINDOWS - i < m->mb ? EVAL_WINDOWS - i : m->mb;
        uint64_t off[EVAL_WINDOWS];
        float    loss;
        for (int k = 0; k < n; k++)
            off[k] = (uint64_t)(i + k) * (uint64_t)(m->T + 1);
        DT_TRY(dt_tokens_windows(val, off, (size_t)n, (size_t)m->T, m->x, m->y));
        DT_TRY(gpt_loss(m, 0, n, &loss, NULL));
        sum += (double)loss * n;
    }
    dt_graph_train(m->g, true);
    *out = (float)(sum / EVAL_WINDOWS);
    return DT_OK;
}

// ------------------------------------------------------------------ plumbing (declared)
typedef struct job job;
static void        say(const job *j, const char *fmt, ...);
static dt_status   ckpt_restore(job *j, gpt *m, dt_optim *opt, int64_t *step);
static dt_status   ckpt_maybe_save(job *j, gpt *m, dt_optim *opt, int64_t done);
static void        print_stats(job *j, int64_t steps, double loop, double evals, float val,
                               const float *losses, const gpt *m);

struct job {
    const args *a;
    dt_pg      *pg;
    int         rank, world;
    dt_tokens   all, train, val;
    size_t      nfiles;
    double      start, setup;
};

// ------------------------------------------------------------------------- training

static double flops_per_token(const args *a) {
    double L = (double)a->n_layer, C = (double)a->n_embd, T = (double)a->block;
    return 3.0 * (2.0 * (12.0 * L * C * C + C * VOCAB) + 4.0 * L * T * C);
}

static int train(job *j) {
    const args *a      = j->a;
    gpt         m      = {0};
    dt_ddp     *ddp    = NULL;
    dt_zero    *zero   = NULL; // instead of ddp with --zero 1 or 2
    dt_optim   *opt    = NULL;
    dt_sched   *sch    = NULL;
    float      *losses = calloc((size_t)a->steps, sizeof(float));
    int64_t     step   = 0;
    dt_status   st     = losses ? gpt_new(&m, a, j->world) : DT_ERR_NOMEM;
    if (!st && a->load)
        st = dt_ckpt_load_params(a->load, m.p);
    if (!st && j->pg && !a->zero)
        st = dt_ddp_new(&ddp, m.p, j->pg, NULL); // same tables everywhere, rank 0's weights
    dt_adam_opts ao = dt_adamw_opts_default();
    ao.lr = (float)a->lr, ao.beta2 = 0.95f, ao.weight_decay = (float)a->weight_decay;
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0; // biases and LayerNorm
    if (!st && !(st = dt_adamw_new(&opt, m.p, &ao)))
        st = dt_optim_add_group(opt, dt_param_no_decay, NULL, &nd, NULL);
    dt_sched_opts so = dt_sched_opts_default();
    args          la = *a; // the schedule's copy
    so.kind = DT_SCHED_LAMBDA, so.lambda = lr_at, so.user = &la;
    if (!st)
        st = dt_sched_new(&sch, &so);
    if (!st)
        st = ckpt_restore(j, &m, opt, &step);
    size_t full_state = 0, rank_state = 0;
    dt_optim_state(opt, &full_state);
    if (!st && j->pg && a->zero) { // shards the optimizer (and its restored state)
        dt_zero_opts zo = dt_zero_opts_default();
        zo.stage        = (int)a->zero;
        st              = dt_zero_new(&zero, m.p, j->pg, opt, &zo);
    }
    dt_optim_state(opt, &rank_state);
    if (!st && j->pg)
        say(j, "optimizer state: %.3f MiB per rank (ZeRO-%ld; %.3f MiB unsharded)",
            (double)rank_state * 4 / 1048576, zero ? a->zero : 0L,
            (double)full_state * 4 / 1048576);
    if (!st && j->rank == 0) {
        say(j,
            "model: n_layer %ld, n_head %ld, n_embd %ld, block %ld, vocab %d | parameters: %zu "
            "| %.3f MFLOP per trained token (fwd+bwd) | threads %d",
            a->n_layer, a->n_head, a->n_embd, a->block, VOCAB, dt_params_numel(m.p),
            flops_per_token(a) / 1e6, dt_graph_threads(m.g));
        say(j,
            "data: %zu file(s), train %zu bytes, val %zu bytes | batch %ld x %ld tokens over %d "
            "rank(s), %ld steps",
            j->nfiles, j->train.n, j->val.n, a->batch, a->block, j->world, a->steps);
    }
    if (!st && j->pg)
        st = dt_pg_barrier(j->pg);
    j->setup   = dt_now() - j->start;
    double  t0 = dt_now(), mark = t0, evals = 0, evals_mark = 0;
    int64_t step0 = step, mark_step = step;
    float   val      = NAN;
    double  tok_step = (double)a->batch * (double)a->block;
    for (; !st && step < a->steps; step++) {
        // One step: the global batch's slice, forward, loss, backward (DDP reduces the
        // gradients while it runs), clip, AdamW at the scheduled lr.
        float loss, norm;
        if ((st = dt_tokens_batch(&j->train, (uint64_t)(a->seed * 1000 + step), (size_t)a->batch,
                                  (size_t)m.T, j->rank, j->world, m.offsets, m.x, m.y)) ||
            (st = gpt_forward_backward(&m, ddp, zero, &loss)) || (ddp && (st = dt_ddp_sync(ddp))) ||
            (zero && (st = dt_zero_sync(zero))) ||
            (st = zero ? dt_zero_clip_grad_norm(zero, (float)a->grad_clip, &norm)
                       : dt_clip_grad_norm(m.p, (float)a->grad_clip, &norm)) ||
            (st = dt_sched_apply(sch, opt, step)))
            break;
        if (zero && (st = dt_zero_step(zero))) // the shard's step, then the all-gather
            break;
        if (!zero)
            dt_optim_step(opt);
        if (j->pg && (st = dt_pg_all_reduce(j->pg, &loss, &loss, 1, DT_FLOAT32, DT_REDUCE_AVG)))
            break;
        losses[step] = loss;
        int64_t s    = step + 1;
        if (s == 1 || s % a->log_every == 0 || s == a->steps) {
            double now = dt_now(), dt = (now - mark) - (evals - evals_mark);
            say(j, "step %lld/%ld | loss %.6f | lr %.4e | tok/s %.0f", (long long)s, a->steps,
                (double)loss, (double)dt_optim_lr(opt), tok_step * (double)(s - mark_step) / dt);
            mark = now, evals_mark = evals, mark_step = s;
        }
        if (a->eval_every > 0 && s % a->eval_every == 0 && s < a->steps && j->rank == 0) {
            double te = dt_now();
            if ((st = gpt_eval(&m, &j->val, &val)))
                break;
            say(j, "step %lld/%ld | val loss %.4f", (long long)s, a->steps, (double)val);
            evals += dt_now() - te;
        }
        if ((st = ckpt_maybe_save(j, &m, opt, s)))
            break;
    }
    double loop = dt_now() - t0 - evals;
    if (!st && j->rank == 0) {
        say(j, "Finished training in %.3f secs", loop);
        if (!(st = gpt_eval(&m, &j->val, &val)))
            say(j, "val loss: %.4f", (double)val);
        if (!st && a->save_model && !(st = dt_ckpt_save_params(a->save_model, m.p)))
            say(j, "saved %s", a->save_model);
    }
    if (!st)
        print_stats(j, step - step0, loop, evals, val, losses, &m);
    if (st)
        fprintf(stderr, "dtrain-gpt: rank %d: %s\n", j->rank, dt_last_error());
    dt_sched_free(sch), dt_zero_free(zero), dt_optim_free(opt), dt_ddp_free(ddp);
    gpt_free(&m), free(losses);
    return st ? 1 : 0;
}

// Text from a saved model: the prompt, then n bytes, each the argmax (temperature 0) or
// a draw from softmax(logits / temperature), the context the last T bytes.
static int sample(const args *a) {
    gpt  m       = {0};
    args one     = *a;
    one.batch    = 1;
    dt_status st = gpt_new(&m, &one, 1);
    if (!st)
        st = dt_ckpt_load_params(a->load, m.p);
    size_t   plen = strlen(a->prompt), n = plen + (size_t)a->sample;
    uint8_t *text = calloc(n + 1, 1);
    dt_rng   r    = dt_rng_init((uint64_t)a->seed);
    if (!st && !text)
        st = DT_ERR_NOMEM;
    if (!st)
        memcpy(text, a->prompt, plen);
    dt_graph_train(m.g, false);
    for (size_t len = plen; !st && len < n; len++) {
        size_t from = len > (size_t)m.T ? len - (size_t)m.T : 0, ctx = len - from;
        memset(m.x, 0, sizeof(int32_t) * (size_t)m.T); // past the context: causal, unread
        for (size_t i = 0; i < ctx; i++)
            m.x[i] = text[from + i];
        if (ctx == 0) { // no prompt: start from a newline
            m.x[0] = '\n';
            ctx    = 1;
        }
        if ((st = dt_graph_forward(m.g, (const void *[]){m.x, m.pos}, 1)))
            break;
        const float *lg   = dt_graph_output(m.g) + (ctx - 1) * VOCAB;
        int          best = 0;
        for (int v = 1; v < VOCAB; v++)
            best = lg[v] > lg[best] ? v : best;
        if (a->temperature > 0) {
            double p[VOCAB], z = 0, u = dt_rng_uniform(&r);
            for (int v = 0; v < VOCAB; v++)
                z += p[v] = exp((lg[v] - lg[best]) / a->temperature);
            for (best = 0; best < VOCAB - 1 && (u -= p[best] / z) > 0; best++)
                ;
        }
        text[len] = (uint8_t)best;
    }
    if (!st)
        fwrite(text, 1, n, stdout), putchar('\n');
    else
        fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
    free(text), gpt_free(&m);
    return st ? 1 : 0;
}

// ===================================================================== plumbing
// Flags, launch, checkpoints and printing: what a one-object trainer takes over.

static void say(const job *j, const char *fmt, ...) {
    if (j->rank != 0)
        return;
    char    line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    n       = n < 0 ? 0 : n > (int)sizeof line - 2 ? (int)sizeof line - 2 : n;
    line[n] = '\n';
    fflush(stdout);
    if (write(STDOUT_FILENO, line, (size_t)n + 1) < 0) // one write per line: ranks never mix
        return;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

static void print_stats(job *j, int64_t steps, double loop, double evals, float val,
                        const float *losses, const gpt *m) {
    const args *a      = j->a;
    double      tokens = (double)a->batch * (double)a->block * (double)steps, last10 = 0;
    int64_t     n10 = steps < 10 ? steps : 10;
    for (int64_t i = a->steps - n10; i < a->steps; i++)
        last10 += losses[i] / (double)(n10 ? n10 : 1);
    char v[32] = "null";
    if (j->rank == 0 && isfinite(val))
        snprintf(v, sizeof v, "%.6f", (double)val);
    for (int r = 0; r < j->world; r++) { // rank order
        if (j->pg && dt_pg_barrier(j->pg))
            return;
        if (r != j->rank)
            continue;
        char line[1024];
        int  k = snprintf(
             line, sizeof line,
             "STATS {\"rank\": %d, \"world\": %d, \"steps\": %lld, \"tokens\": %.0f, \"loop_secs\": "
              "%.3f, \"tokens_per_sec\": %.1f, \"eval_secs\": %.3f, \"setup_secs\": %.3f, "
              "\"params\": %zu, \"flops_per_token\": %.0f, \"gflops_per_sec\": %.2f, "
              "\"last_loss\": %.6f, \"last10_mean_loss\": %.6f, \"val_loss\": %s, "
              "\"peak_rss_mib\": %.1f, \"threads\": %d}\n",
             j->rank, j->world, (long long)steps, tokens, loop, loop > 0 ? tokens / loop : 0.0,
             evals, j->setup, dt_params_numel(m->p), flops_per_token(a),
            loop > 0 ? flops_per_token(a) * tokens / loop / 1e9 : 0.0,
             (double)(a->steps > 0 ? losses[a->steps - 1] : 0), last10, v, peak_rss_mib(),
             dt_graph_threads(m->g));
        fflush(stdout);
        if (k > 0 && write(STDOUT_FILENO, line, (size_t)k) < 0)
            return;
    }
}

// Checkpoints: the parameters, AdamW's state and step count; batches and the lr are
// functions of the step, so a resumed run continues bitwise.
static dt_status ckpt_restore(job *j, gpt *m, dt_optim *opt, int64_t *step) {
    if (!j->a->resume)
        return DT_OK;
    dt_ckpt_state cs   = {.params = m->p, .optim = opt};
    dt_ckpt_info  info = {0};
    dt_status     st   = dt_ckpt_load(j->a->checkpoint_dir, j->pg, &cs, NULL, &info);
    if (!st && info.found) {
        *step = info.step;
        say(j, "resumed from %s (step %lld)", info.path, (long long)info.step);
    }
    dt_ckpt_info_free(&info);
    return st;
}

static dt_status ckpt_maybe_save(job *j, gpt *m, dt_optim *opt, int64_t done) {
    const args *a = j->a;
    if (!a->checkpoint_dir ||
        !(done == a->steps || (a->checkpoint_every > 0 && done % a->checkpoint_every == 0)))
        return DT_OK;
    dt_ckpt_state cs = {.params = m->p, .optim = opt, .step = done};
    return dt_ckpt_save(a->checkpoint_dir, j->pg, &cs, NULL);
}

static const char usage[] =
    "usage: dtrain-gpt [options]   (the PyTorch peer gpt_bytes.py's flags and meaning)\n"
    "model and training:\n"
    "  --steps N (300)  --batch-size B (32: the GLOBAL batch, each of P ranks takes B/P)\n"
    "  --block-size T (128)  --n-layer L (4)  --n-head H (4)  --n-embd C (128)\n"
    "  --lr X (1e-3)  --warmup N (20)  --min-lr-ratio R (0.1)  --weight-decay W (0.1)\n"
    "  --grad-clip G (1.0)  --seed S (0)  --threads N (per process; default: CPUs / P)\n"
    "  --data PATH (a file of bytes, or a directory: its files without a dot, sorted;\n"
    "              default /usr/share/games/fortunes)  --limit N (first N bytes; 0 all)\n"
    "  --eval-every N (100; 0 = at the end only)  --log-every N (10)\n"
    "  --micro-batch N  sequences per forward (gradient accumulation: less memory, the\n"
    "              same step up to rounding; default 16 when it divides the batch of a\n"
    "              process, else the whole batch, as 0 does)\n"
    "distributed (as dtrain-mnist; or run under dtrun / mpirun):\n"
    "  --num-processes P  --num-machines M  --machine-id K  --master-addr A\n"
    "  --master-port N  --backend auto|shm|tcp|mpi\n"
    "  --zero S  ZeRO stage (docs/zero.md): 0 plain DDP (default), 1 AdamW state sharded\n"
    "              over the ranks, 2 gradients reduce-scattered during backward too\n"
    "models and checkpoints:\n"
    "  --save-model PATH  --load PATH (a model file: start from it, or sample from it)\n"
    "  --checkpoint-dir D  --checkpoint-every N  --resume (from the newest in D, if any)\n"
    "  --sample N --prompt TEXT [--temperature X (0: greedy)]: print N bytes after TEXT\n"
    "              (give the model flags the model was trained with)\n"
    "Prints `step N/S | loss X | lr Y | tok/s Z`, `Finished training in X secs` (the\n"
    "training loop only, evaluations excluded), `val loss: X.XXXX`, a STATS line per rank\n"
    "and a PARENT line (wall_secs: from process start, start-up included).\n";

static int parse_args(int argc, char **argv, args *a) {
    *a                              = (args){.steps        = 300,
                                             .batch        = 32,
                                             .n_layer      = 4,
                                             .n_head       = 4,
                                             .n_embd       = 128,
                                             .block        = 128,
                                             .eval_every   = 100,
                                             .log_every    = 10,
                                             .warmup       = 20,
                                             .lr           = 1e-3,
                                             .min_lr_ratio = 0.1,
                                             .weight_decay = 0.1,
                                             .grad_clip    = 1.0,
                                             .num_machines = 1,
                                             .micro        = -1,
                                             .prompt       = ""};
    static const struct option lo[] = {{"steps", 1, 0, 's'},
                                       {"batch-size", 1, 0, 'b'},
                                       {"block-size", 1, 0, 'T'},
                                       {"n-layer", 1, 0, 'L'},
                                       {"n-head", 1, 0, 'H'},
                                       {"n-embd", 1, 0, 'C'},
                                       {"lr", 1, 0, 'l'},
                                       {"warmup", 1, 0, 'w'},
                                       {"min-lr-ratio", 1, 0, 'm'},
                                       {"weight-decay", 1, 0, 'd'},
                                       {"grad-clip", 1, 0, 'g'},
                                       {"seed", 1, 0, 'S'},
                                       {"threads", 1, 0, 't'},
                                       {"data", 1, 0, 'D'},
                                       {"limit", 1, 0, 'n'},
                                       {"eval-every", 1, 0, 'e'},
                                       {"log-every", 1, 0, 'o'},
                                       {"num-processes", 1, 0, 'P'},
                                       {"num-machines", 1, 0, 'M'},
                                       {"machine-id", 1, 0, 'K'},
                                       {"master-addr", 1, 0, 'A'},
                                       {"master-port", 1, 0, 'R'},
                                       {"backend", 1, 0, 'B'},
                                       {"save-model", 1, 0, 'V'},
                                       {"load", 1, 0, 'I'},
                                       {"checkpoint-dir", 1, 0, 'c'},
                                       {"checkpoint-every", 1, 0, 'E'},
                                       {"resume", 0, 0, 'r'},
                                       {"sample", 1, 0, 'X'},
                                       {"prompt", 1, 0, 'p'},
                                       {"temperature", 1, 0, 'Y'},
                                       {"micro-batch", 1, 0, 'u'},
                                       {"zero", 1, 0, 'Z'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int                        c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        dt_status   st = DT_OK;
        const char *f  = argv[optind - 1];
        switch (c) {
        case 's':
            st = dt_parse_long(optarg, 1, 1L << 40, f, &a->steps);
            break;
        case 'b':
            st = dt_parse_long(optarg, 1, 1 << 20, f, &a->batch);
            break;
        case 'T':
            st = dt_parse_long(optarg, 1, 1 << 16, f, &a->block);
            break;
        case 'L':
            st = dt_parse_long(optarg, 1, 1024, f, &a->n_layer);
            break;
        case 'H':
            st = dt_parse_long(optarg, 1, 1024, f, &a->n_head);
            break;
        case 'C':
            st = dt_parse_long(optarg, 1, 1 << 16, f, &a->n_embd);
            break;
        case 'l':
            st = dt_parse_double(optarg, 0, 10, f, &a->lr);
            break;
        case 'w':
            st = dt_parse_long(optarg, 1, 1L << 40, f, &a->warmup);
            break;
        case 'm':
            st = dt_parse_double(optarg, 0, 1, f, &a->min_lr_ratio);
            break;
        case 'd':
            st = dt_parse_double(optarg, 0, 10, f, &a->weight_decay);
            break;
        case 'g':
            st = dt_parse_double(optarg, 1e-12, 1e12, f, &a->grad_clip);
            break;
        case 'S':
            st = dt_parse_long(optarg, 0, 1L << 40, f, &a->seed);
            break;
        case 't':
            st = dt_parse_long(optarg, 1, 256, f, &a->threads);
            break;
        case 'D':
            a->data = optarg;
            break;
        case 'n':
            st = dt_parse_long(optarg, 0, 1L << 50, f, &a->limit);
            break;
        case 'e':
            st = dt_parse_long(optarg, 0, 1L << 40, f, &a->eval_every);
            break;
        case 'o':
            st = dt_parse_long(optarg, 1, 1L << 40, f, &a->log_every);
            break;
        case 'P':
            st = dt_parse_long(optarg, 1, 256, f, &a->num_processes);
            break;
        case 'M':
            st = dt_parse_long(optarg, 1, 65536, f, &a->num_machines);
            break;
        case 'K':
            st = dt_parse_long(optarg, 0, 65535, f, &a->machine_id);
            break;
        case 'Z':
            st = dt_parse_long(optarg, 0, 2, f, &a->zero);
            break;
        case 'A':
            a->master_addr = optarg;
            break;
        case 'R':
            st = dt_parse_long(optarg, 1, 65535, f, &a->master_port);
            break;
        case 'B':
            a->backend = optarg;
            break;
        case 'V':
            a->save_model = optarg;
            break;
        case 'I':
            a->load = optarg;
            break;
        case 'c':
            a->checkpoint_dir = optarg;
            break;
        case 'E':
            st = dt_parse_long(optarg, 1, 1L << 40, f, &a->checkpoint_every);
            break;
        case 'r':
            a->resume = true;
            break;
        case 'X':
            st = dt_parse_long(optarg, 1, 1 << 24, f, &a->sample);
            break;
        case 'p':
            a->prompt = optarg;
            break;
        case 'Y':
            st = dt_parse_double(optarg, 0, 100, f, &a->temperature);
            break;
        case 'u':
            st = dt_parse_long(optarg, 0, 1 << 20, f, &a->micro);
            break;
        case 'h':
            fputs(usage, stdout);
            return -1;
        default:
            st = dt_fail(DT_ERR_ARG, "unknown option or missing value: \"%s\" (see --help)", f);
        }
        if (st) {
            fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
            return 2;
        }
    }
    const char *bad = NULL;
    if (optind < argc)
        bad = "unexpected argument (see --help)";
    else if (a->n_embd % a->n_head)
        bad = "--n-embd must be divisible by --n-head";
    else if (a->batch % (a->num_processes ? a->num_processes * a->num_machines : 1))
        bad = "--batch-size (global) must be divisible by the number of processes";
    else if (a->machine_id >= a->num_machines)
        bad = "--machine-id must be below --num-machines";
    else if ((a->resume || a->checkpoint_every) && !a->checkpoint_dir)
        bad = "--resume and --checkpoint-every need --checkpoint-dir";
    else if (a->micro > 0 &&
             (a->batch / (a->num_processes ? a->num_processes * a->num_machines : 1)) % a->micro)
        bad = "--micro-batch must divide the batch of each process (--batch-size / processes)";
    else if (a->sample && !a->load)
        bad = "--sample needs --load (a model saved with --save-model)";
    if (bad) {
        fprintf(stderr, "dtrain-gpt: %s\n", bad);
        return 2;
    }
    if (!a->threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN), p = a->num_processes ? a->num_processes : 1;
        a->threads = cpus / p > 0 ? cpus / p : 1;
    }
    return 0;
}

static int run_in_group(job *j) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = j->a->backend;
    if (dt_pg_new_from_env(&j->pg, &o) != DT_OK) {
        fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
        return 1;
    }
    j->rank  = dt_pg_rank(j->pg);
    j->world = dt_pg_size(j->pg);
    int rc   = j->a->batch % j->world ? (fprintf(stderr,
                                                 "dtrain-gpt: --batch-size %ld is not "
                                                   "divisible by %d ranks\n",
                                                 j->a->batch, j->world),
                                       1)
                                      : train(j);
    if (rc)
        dt_pg_abort(j->pg, "a worker failed");
    dt_pg_free(j->pg);
    return rc;
}

static int spawned(int local_rank, void *arg) {
    (void)local_rank; // dt_spawn has set RANK, LOCAL_RANK and the rest
    return run_in_group(arg);
}

static void setenv_long(const char *name, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

int main(int argc, char **argv) {
    args a;
    int  rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (a.sample)
        return sample(&a);
    job j = {.a = &a, .world = 1, .start = dt_now()};
    if (dt_corpus_read(a.data, (size_t)a.limit, &j.all, &j.nfiles)) {
        fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
        return 1;
    }
    dt_tokens_split(&j.all, &j.train, &j.val);
    if (j.val.n < (size_t)EVAL_WINDOWS * (size_t)(a.block + 1) ||
        j.train.n <= (size_t)a.block + 1) {
        fprintf(stderr,
                "dtrain-gpt: expected a validation split of at least %d windows of %ld bytes and "
                "a training split longer than %ld bytes, found %zu and %zu bytes\n",
                EVAL_WINDOWS, a.block + 1, a.block + 1, j.val.n, j.train.n);
        dt_tokens_free(&j.all);
        return 1;
    }
    dt_launch_env le;
    if (a.num_processes > 0) { // the peer's launch: P workers forked here
        if (a.master_addr)
            setenv("MASTER_ADDR", a.master_addr, 1);
        if (a.master_port)
            setenv_long("MASTER_PORT", a.master_port);
        else if (a.num_machines > 1 && !getenv("MASTER_PORT"))
            setenv("MASTER_PORT", "29500", 1);
        setenv_long("GROUP_RANK", a.machine_id);
        setenv_long("WORLD_SIZE", a.num_machines * a.num_processes);
        if (dt_spawn((int)a.num_processes, spawned, &j, NULL) != DT_OK) {
            fprintf(stderr, "dtrain-gpt: %s\n", dt_last_error());
            rc = 1;
        }
    } else if (dt_launch_env_read(&le) != DT_OK || le.launcher != DT_LAUNCHER_NONE) {
        rc = run_in_group(&j); // dtrun, mpirun, srun, or RANK/WORLD_SIZE
    } else {
        rc = train(&j);
    }
    if (a.num_processes > 0 || j.world == 1)
        printf("PARENT {\"peak_rss_mib\": %.1f, \"wall_secs\": %.3f}\n", peak_rss_mib(),
               dt_now() - j.start);
    dt_tokens_free(&j.all);
    return rc;
}
