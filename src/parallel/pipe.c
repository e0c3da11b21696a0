// pipe.c: the pipeline of pipe.h: cutting a graph into stages, and the GPipe and 1F1B
// schedules over dt_pg_send / dt_pg_recv.
//
// Both schedules are one loop (Megatron-LM's non-interleaved schedule): stage s of P
// runs w forwards (warm-up), then M - w rounds of one forward and one backward, then
// the w remaining backwards. w = M is GPipe; w = min(P-s-1, M) is 1F1B. Sends may wait
// for the peer's receive and a process runs its sends and receives one at a time, so
// where two neighbours exchange (a forward going up while a backward comes down) the
// lower stage sends first and the upper one receives first; every pair of neighbours
// then issues its messages in the same order:
//
//   stage s   : F0 .. Fw  | F(w+1) B0 | F(w+2) B1 | ...  (F sent up, B received)
//   stage s+1 : F0 .. Fw  | F(w+1) B0 | F(w+2) B1 | ...  (F received, B sent down)
//
// Micro-batch m keeps its activations in graph slot m % slots (dt_graph_use_slot):
// M slots for GPipe, w + 1 for 1F1B (micro-batches in flight are consecutive).
#include "dtrain/pipe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { TAG_BASE = 0x5000 }; // + 2m forward, + 2m + 1 backward: a schedule bug mismatches
enum { TAG_TIE = 0x4000, MAX_TIES = 8 };

// A parameter tied across stages (a GPT's head and its token embedding): the owner's
// stage keeps the tensor, the other stage a copy under the same name.
typedef struct pipe_tie {
    int  owner, copy; // stages
    char name[DT_PARAM_NAME_MAX + 1];
} pipe_tie;

struct dt_pipe {
    dt_graph    *g;
    dt_pg       *pg; // borrowed
    int          stage, nstages;
    int          first, last; // this stage's nodes in the whole graph
    int          nwhole;      // nodes of the whole graph
    dt_pipe_opts o;
    dt_ddp      *ddp;                           // borrowed, may be NULL
    int          nslots;                        // activation slots the graph holds
    int          nin;                           // graph inputs (stage 0: the model's; others: 1)
    size_t       in_numel[DT_LAYER_MAX_INPUTS]; // per sample, of each graph input
    size_t       out_numel;
    float       *act;  // stages > 0: received activations, nslots x mb_max x in_numel
    float       *dout; // received (or the loss's) output gradient, mb_max x out_numel
    int          cap;  // micro-batch size the two buffers hold
    double       compute_s, total_s;
    pipe_tie     ties[MAX_TIES]; // ties across stages
    int          nties;
    bool         ties_copied; // the copies hold their owners' values
    float       *tie_tmp;
    size_t       tie_cap;
    // The current step.
    const void *const *inputs;
    int                batch;
    const uint64_t    *keys;
    uint64_t          *pos; // keys 0..batch-1 when the caller gave none
    int                pos_n;
    dt_pipe_loss_fn    loss;
    void              *user;
    double             loss_sum;
};

dt_pipe_opts dt_pipe_opts_default(void) {
    return (dt_pipe_opts){.schedule = DT_PIPE_GPIPE, .micro_batches = 0};
}

dt_status dt_pipe_schedule_parse(const char *name, dt_pipe_schedule *out) {
    if (name && out && strcmp(name, "gpipe") == 0)
        *out = DT_PIPE_GPIPE;
    else if (name && out && strcmp(name, "1f1b") == 0)
        *out = DT_PIPE_1F1B;
    else
        return dt_fail(DT_ERR_ARG, "pipeline schedule: expected gpipe or 1f1b, found '%s'",
                       name ? name : "(null)");
    return DT_OK;
}

const char *dt_pipe_schedule_name(dt_pipe_schedule s) {
    return s == DT_PIPE_1F1B ? "1f1b" : s == DT_PIPE_GPIPE ? "gpipe" : "?";
}

// Nodes [first, last] of stage `stage` given the cut nodes.
static dt_status stage_range(dt_graph *whole, int ncuts, const char *const *cuts, int stage,
                             int *first, int *last) {
    int prev = -1;
    for (int c = 0; c < ncuts; c++) {
        int i = cuts[c] ? dt_graph_find(whole, cuts[c]) : -1;
        if (i < 0)
            return dt_fail(DT_ERR_ARG, "pipeline: cut %d: no node named '%s'", c,
                           cuts[c] ? cuts[c] : "(null)");
        if (strcmp(dt_graph_node_kind(whole, i), "input") == 0)
            return dt_fail(DT_ERR_ARG, "pipeline: cut %d: '%s' is a graph input, not a node", c,
                           cuts[c]);
        if (i <= prev || i == dt_graph_num_nodes(whole) - 1)
            return dt_fail(DT_ERR_ARG,
                           "pipeline: expected cuts in node order, each before the last node; "
                           "found '%s' (node %d) after node %d",
                           cuts[c], i, prev);
        if (c == stage - 1)
            *first = i + 1;
        if (c == stage)
            *last = i;
        prev = i;
    }
    if (stage == 0)
        *first = 0;
    if (stage == ncuts)
        *last = dt_graph_num_nodes(whole) - 1;
    return DT_OK;
}

static int stage_of(dt_graph *whole, int ncuts, const char *const *cuts, int node) {
    int s = 0;
    for (int c = 0; c < ncuts; c++)
        if (node > dt_graph_find(whole, cuts[c]))
            s = c + 1;
    return s;
}

// The ties whose two nodes fall on different stages.
static dt_status find_ties(dt_graph *whole, int ncuts, const char *const *cuts, pipe_tie *ties,
                           int *n) {
    *n = 0;
    for (int t = 0; t < dt_graph_num_ties(whole); t++) {
        pipe_tie x;
        int      on, pn;
        DT_TRY(dt_graph_tie_at(whole, t, x.name, &on, &pn));
        x.owner = stage_of(whole, ncuts, cuts, on);
        x.copy  = stage_of(whole, ncuts, cuts, pn);
        if (x.owner == x.copy)
            continue;
        if (*n == MAX_TIES)
            return dt_fail(DT_ERR_UNSUPPORTED, "pipeline: more than %d ties across stages",
                           MAX_TIES);
        ties[(*n)++] = x;
    }
    return DT_OK;
}

dt_status dt_pipe_new(dt_pipe **out, dt_graph *whole, int ncuts, const char *const *cuts, dt_pg *pg,
                      uint64_t seed, const dt_pipe_opts *opts) {
    if (out)
        *out = NULL;
    if (!out || !whole || (ncuts > 0 && !cuts)) {
        dt_graph_free(whole);
        return dt_fail(DT_ERR_ARG, "dt_pipe_new: expected an output pointer, a graph and cuts");
    }
    dt_pipe_opts o = opts ? *opts : dt_pipe_opts_default();
    int          P = pg ? dt_pg_size(pg) : 1, s = pg ? dt_pg_rank(pg) : 0;
    if (ncuts != P - 1) {
        dt_graph_free(whole);
        return dt_fail(DT_ERR_ARG, "dt_pipe_new: expected %d cuts for %d stages, found %d", P - 1,
                       P, ncuts);
    }
    if (o.schedule < 0 || o.schedule >= DT_PIPE_SCHEDULE_COUNT_ || o.micro_batches < 0) {
        dt_graph_free(whole);
        return dt_fail(DT_ERR_ARG, "dt_pipe_new: bad schedule %d or micro-batches %d",
                       (int)o.schedule, o.micro_batches);
    }
    if (o.micro_batches == 0)
        o.micro_batches = P;
    int       first = 0, last = 0;
    dt_graph *g = NULL;
    pipe_tie  ties[MAX_TIES];
    int       nties = 0;
    dt_status st    = find_ties(whole, ncuts, cuts, ties, &nties);
    if (st == DT_OK)
        st = stage_range(whole, ncuts, cuts, s, &first, &last);
    if (st == DT_OK)
        st = dt_graph_extract(&g, whole, first, last);
    char prev_out[DT_GRAPH_NAME_MAX + 1] = "";
    if (st == DT_OK && s > 0)
        snprintf(prev_out, sizeof prev_out, "%s", dt_graph_node_name(whole, first - 1));
    int nwhole = dt_graph_num_nodes(whole);
    dt_graph_free(whole);
    if (st != DT_OK)
        return dt_fail_context("pipeline stage %d of %d", s, P);
    dt_pipe *p = dt_alloc_zero(sizeof *p);
    if (!p) {
        dt_graph_free(g);
        return DT_ERR_NOMEM;
    }
    p->g       = g;
    p->pg      = pg;
    p->first   = first;
    p->last    = last;
    p->stage   = s;
    p->nstages = P;
    p->o       = o;
    p->nties   = nties;
    p->nwhole  = nwhole;
    memcpy(p->ties, ties, sizeof ties);
    for (int i = 0; i < dt_graph_num_nodes(g); i++) {
        if (strcmp(dt_graph_node_kind(g, i), "input") != 0)
            continue;
        const dt_shape *sh = dt_graph_node_shape(g, i);
        if (s > 0 && (p->nin > 0 || strcmp(dt_graph_node_name(g, i), prev_out) != 0 ||
                      sh->dtype != DT_ELEM_F32)) {
            st = dt_fail(DT_ERR_ARG,
                         "pipeline stage %d of %d: expected its nodes to read only '%s' (the "
                         "last node of stage %d) from earlier stages, found '%s' read too",
                         s, P, prev_out, s - 1, dt_graph_node_name(g, i));
            break;
        }
        if (p->nin == DT_LAYER_MAX_INPUTS) {
            st = dt_fail(DT_ERR_ARG, "pipeline: more than %d graph inputs", DT_LAYER_MAX_INPUTS);
            break;
        }
        p->in_numel[p->nin++] = dt_shape_numel(sh);
    }
    if (st == DT_OK)
        st = dt_graph_finalize(g, seed);
    if (st != DT_OK) {
        dt_pipe_free(p);
        return dt_fail_context("pipeline stage %d of %d", s, P);
    }
    p->out_numel = dt_shape_numel(dt_graph_node_shape(g, -1));
    dt_graph_set_input_grad(g, s > 0);
    *out = p;
    return DT_OK;
}

void dt_pipe_free(dt_pipe *p) {
    if (!p)
        return;
    dt_graph_free(p->g);
    dt_free(p->act);
    dt_free(p->dout);
    dt_free(p->pos);
    dt_free(p->tie_tmp);
    dt_free(p);
}

dt_graph *dt_pipe_graph(dt_pipe *p) {
    return p ? p->g : NULL;
}
dt_params *dt_pipe_params(dt_pipe *p) {
    return p ? dt_graph_params(p->g) : NULL;
}
int dt_pipe_stage(const dt_pipe *p) {
    return p ? p->stage : -1;
}
int dt_pipe_stages(const dt_pipe *p) {
    return p ? p->nstages : 0;
}
dt_status dt_pipe_set_micro_batches(dt_pipe *p, int m) {
    if (!p || m < 1)
        return dt_fail(DT_ERR_ARG, "dt_pipe_set_micro_batches: expected m >= 1, found %d", m);
    p->o.micro_batches = m;
    return DT_OK;
}

void dt_pipe_set_ddp(dt_pipe *p, dt_ddp *ddp) {
    if (p)
        p->ddp = ddp;
}

void dt_pipe_range(const dt_pipe *p, int *first, int *last) {
    if (first)
        *first = p ? p->first : -1;
    if (last)
        *last = p ? p->last : -1;
}

bool dt_pipe_is_tie_copy(const dt_pipe *p, int tensor) {
    const dt_param_info *i = p ? dt_params_info(dt_graph_params(p->g), tensor) : NULL;
    for (int t = 0; i && t < p->nties; t++)
        if (p->ties[t].copy == p->stage && strcmp(p->ties[t].name, i->name) == 0)
            return true;
    return false;
}

void dt_pipe_stats(dt_pipe *p, double *compute_s, double *total_s, bool reset) {
    if (!p)
        return;
    if (compute_s)
        *compute_s = p->compute_s;
    if (total_s)
        *total_s = p->total_s;
    if (reset)
        p->compute_s = p->total_s = 0.0;
}

// ------------------------------------------------------------------------- the step

// Micro-batch m's first sample and size: the first batch % M get one sample more, so
// micro-batch 0 is the largest (the graph sizes its slots on the first forward).
static int mb_first(const dt_pipe *p, int m) {
    int M = p->o.micro_batches, q = p->batch / M, r = p->batch % M;
    return m * q + (m < r ? m : r);
}
static int mb_size(const dt_pipe *p, int m) {
    return mb_first(p, m + 1) - mb_first(p, m);
}

static float *act_buf(dt_pipe *p, int m) {
    return p->act + (size_t)(m % p->nslots) * (size_t)p->cap * p->in_numel[0];
}

static dt_status recv_fwd(dt_pipe *p, int m) {
    if (p->stage == 0)
        return DT_OK;
    return dt_pg_recv(p->pg, act_buf(p, m), (size_t)mb_size(p, m) * p->in_numel[0], DT_FLOAT32,
                      p->stage - 1, TAG_BASE + 2 * m);
}

static dt_status send_fwd(dt_pipe *p, int m) {
    if (p->stage == p->nstages - 1)
        return DT_OK;
    DT_TRY(dt_graph_use_slot(p->g, m % p->nslots));
    return dt_pg_send(p->pg, dt_graph_output(p->g), (size_t)mb_size(p, m) * p->out_numel,
                      DT_FLOAT32, p->stage + 1, TAG_BASE + 2 * m);
}

static dt_status recv_bwd(dt_pipe *p, int m) {
    if (p->stage == p->nstages - 1)
        return DT_OK;
    return dt_pg_recv(p->pg, p->dout, (size_t)mb_size(p, m) * p->out_numel, DT_FLOAT32,
                      p->stage + 1, TAG_BASE + 2 * m + 1);
}

static dt_status send_bwd(dt_pipe *p, int m) {
    if (p->stage == 0)
        return DT_OK;
    const float *dx = dt_graph_input_grad(p->g, 0);
    if (!dx)
        return dt_fail(DT_ERR_INTERNAL, "pipeline stage %d: no input gradient", p->stage);
    return dt_pg_send(p->pg, dx, (size_t)mb_size(p, m) * p->in_numel[0], DT_FLOAT32, p->stage - 1,
                      TAG_BASE + 2 * m + 1);
}

static dt_status fwd(dt_pipe *p, int m) {
    double t0 = dt_now();
    int    b0 = mb_first(p, m), n = mb_size(p, m);
    DT_TRY(dt_graph_use_slot(p->g, m % p->nslots));
    DT_TRY(dt_graph_set_sample_keys(p->g, (p->keys ? p->keys : p->pos) + b0, n));
    const void *in[DT_LAYER_MAX_INPUTS];
    if (p->stage == 0)
        for (int i = 0; i < p->nin; i++)
            in[i] = (const char *)p->inputs[i] + (size_t)b0 * p->in_numel[i] * 4;
    else
        in[0] = act_buf(p, m);
    dt_status st = dt_graph_forward(p->g, in, n);
    p->compute_s += dt_now() - t0;
    return st == DT_OK ? DT_OK : dt_fail_context("pipeline stage %d, micro-batch %d", p->stage, m);
}

static dt_status bwd(dt_pipe *p, int m) {
    double t0 = dt_now();
    int    n  = mb_size(p, m);
    DT_TRY(dt_graph_use_slot(p->g, m % p->nslots));
    if (p->stage == p->nstages - 1) {
        float l = 0.0f;
        DT_TRY(p->loss(p->user, dt_graph_output(p->g), mb_first(p, m), n, &l, p->dout));
        float  wgt = (float)n / (float)p->batch;
        size_t cnt = (size_t)n * p->out_numel;
        for (size_t i = 0; i < cnt; i++)
            p->dout[i] *= wgt;
        p->loss_sum += (double)l * n / p->batch;
    }
    if (p->ddp)
        dt_ddp_set_sync(p->ddp, m == p->o.micro_batches - 1);
    dt_status st = dt_graph_backward(p->g, p->dout);
    p->compute_s += dt_now() - t0;
    return st == DT_OK ? DT_OK : dt_fail_context("pipeline stage %d, micro-batch %d", p->stage, m);
}

// Ties across stages: `copy` sends the owner's values to the copy (once, before the
// first step), `sum` makes both gradients owner + copy, in that order on both stages,
// so the two tensors stay bitwise equal under the same optimizer. The lower stage of a
// pair sends first.
static dt_status tie_exchange(dt_pipe *p, bool copy) {
    dt_params *ps = dt_graph_params(p->g);
    for (int t = 0; t < p->nties; t++) {
        const pipe_tie *x = &p->ties[t];
        if (p->stage != x->owner && p->stage != x->copy)
            continue;
        int k = dt_params_find(ps, x->name);
        if (k < 0)
            return dt_fail(DT_ERR_INTERNAL, "pipeline stage %d: no tensor '%s'", p->stage, x->name);
        const dt_param_info *i    = dt_params_info(ps, k);
        float               *w    = dt_params_data(ps) + i->offset;
        float               *gr   = dt_params_grads(ps) + i->offset;
        int                  peer = p->stage == x->owner ? x->copy : x->owner;
        int                  tag  = TAG_TIE + t;
        if (copy) {
            if (p->stage == x->owner)
                DT_TRY(dt_pg_send(p->pg, w, i->count, DT_FLOAT32, peer, tag));
            else
                DT_TRY(dt_pg_recv(p->pg, w, i->count, DT_FLOAT32, peer, tag));
            continue;
        }
        if (i->count > p->tie_cap) { // once: the steady step allocates nothing
            dt_free(p->tie_tmp);
            p->tie_cap = 0;
            p->tie_tmp = dt_alloc(sizeof(float) * i->count);
            if (!p->tie_tmp)
                return DT_ERR_NOMEM;
            p->tie_cap = i->count;
        }
        if (p->stage < peer) {
            DT_TRY(dt_pg_send(p->pg, gr, i->count, DT_FLOAT32, peer, tag));
            DT_TRY(dt_pg_recv(p->pg, p->tie_tmp, i->count, DT_FLOAT32, peer, tag));
        } else {
            DT_TRY(dt_pg_recv(p->pg, p->tie_tmp, i->count, DT_FLOAT32, peer, tag));
            DT_TRY(dt_pg_send(p->pg, gr, i->count, DT_FLOAT32, peer, tag));
        }
        bool owner = p->stage == x->owner;
        for (size_t e = 0; e < i->count; e++)
            gr[e] = owner ? gr[e] + p->tie_tmp[e] : p->tie_tmp[e] + gr[e];
    }
    return DT_OK;
}

static dt_status run_schedule(dt_pipe *p) {
    int M = p->o.micro_batches, w = M;
    if (p->o.schedule == DT_PIPE_1F1B && p->nstages - 1 - p->stage < M)
        w = p->nstages - 1 - p->stage;
    int rem = M - w;
    for (int i = 0; i < w; i++) {
        DT_TRY(recv_fwd(p, i));
        DT_TRY(fwd(p, i));
        DT_TRY(send_fwd(p, i));
    }
    if (rem > 0)
        DT_TRY(recv_fwd(p, w));
    for (int i = 0; i < rem; i++) {
        int k = w + i;
        DT_TRY(fwd(p, k));
        DT_TRY(send_fwd(p, k)); // up: send first ...
        DT_TRY(recv_bwd(p, i)); // ... then receive
        DT_TRY(bwd(p, i));
        if (i < rem - 1)
            DT_TRY(recv_fwd(p, k + 1)); // down: receive first, then send
        DT_TRY(send_bwd(p, i));
    }
    for (int i = rem; i < M; i++) {
        DT_TRY(recv_bwd(p, i));
        DT_TRY(bwd(p, i));
        DT_TRY(send_bwd(p, i));
    }
    return DT_OK;
}

// Sizes the slots and buffers for this step's micro-batches.
static dt_status prepare(dt_pipe *p) {
    int M = p->o.micro_batches, w = M;
    if (p->o.schedule == DT_PIPE_1F1B && p->nstages - 1 - p->stage < M)
        w = p->nstages - 1 - p->stage;
    int slots = w + 1 < M ? w + 1 : M, cap = mb_size(p, 0);
    if (slots != p->nslots) {
        DT_TRY(dt_graph_set_slots(p->g, slots));
        p->nslots = slots;
        p->cap    = 0; // the activation buffer's layout follows the slots
    }
    if (cap > p->cap) {
        dt_free(p->act);
        dt_free(p->dout);
        p->act  = NULL;
        p->dout = dt_alloc(sizeof(float) * (size_t)cap * p->out_numel);
        if (p->stage > 0)
            p->act = dt_alloc(sizeof(float) * (size_t)slots * (size_t)cap * p->in_numel[0]);
        if (!p->dout || (p->stage > 0 && !p->act))
            return DT_ERR_NOMEM;
        p->cap = cap;
    }
    if (!p->keys && p->batch > p->pos_n) {
        dt_free(p->pos);
        p->pos = dt_alloc(sizeof(uint64_t) * (size_t)p->batch);
        if (!p->pos)
            return DT_ERR_NOMEM;
        for (int i = 0; i < p->batch; i++)
            p->pos[i] = (uint64_t)i;
        p->pos_n = p->batch;
    }
    return DT_OK;
}

// A step or an evaluation failed with st. The other stages wait for this one's
// messages: poison the group so they fail now, naming this stage, not at the group's
// timeout. One stage (--tp or --zero 3 alone, or no model parallelism) has nobody
// waiting and no stage to name: the error stays as it was.
static dt_status stage_failed(dt_pipe *p, dt_status st) {
    if (p->nstages <= 1)
        return st;
    char why[256];
    snprintf(why, sizeof why, "pipeline stage %d failed: %s", p->stage, dt_last_error());
    if (p->pg)
        dt_pg_abort(p->pg, why);
    return dt_fail(st, "%s", why);
}

dt_status dt_pipe_step(dt_pipe *p, const void *const *inputs, int batch, const uint64_t *keys,
                       dt_pipe_loss_fn loss, void *user, float *loss_out) {
    if (!p)
        return dt_fail(DT_ERR_ARG, "dt_pipe_step: expected a pipeline, found NULL");
    bool last = p->stage == p->nstages - 1;
    if (batch < p->o.micro_batches || (p->stage == 0 && !inputs) || (last && !loss))
        return dt_fail(DT_ERR_ARG,
                       "dt_pipe_step (stage %d): expected batch >= %d micro-batches, inputs on "
                       "stage 0 and a loss on the last stage; found batch %d",
                       p->stage, p->o.micro_batches, batch);
    double t0    = dt_now();
    p->inputs    = inputs;
    p->batch     = batch;
    p->keys      = keys;
    p->loss      = loss;
    p->user      = user;
    p->loss_sum  = 0.0;
    dt_status st = prepare(p);
    if (st == DT_OK && !p->ties_copied && p->nties > 0) {
        st             = tie_exchange(p, true);
        p->ties_copied = st == DT_OK;
    }
    if (st == DT_OK)
        st = run_schedule(p);
    if (st == DT_OK && p->nties > 0)
        st = tie_exchange(p, false);
    if (p->ddp)
        dt_ddp_set_sync(p->ddp, true);
    if (st != DT_OK)
        return stage_failed(p, st);
    float l = (float)p->loss_sum;
    if (p->nstages > 1)
        DT_TRY(dt_pg_broadcast(p->pg, &l, 1, DT_FLOAT32, p->nstages - 1));
    if (loss_out)
        *loss_out = l;
    p->total_s += dt_now() - t0;
    return DT_OK;
}

dt_status dt_pipe_eval(dt_pipe *p, const void *const *inputs, int batch, dt_pipe_loss_fn loss,
                       void *user, float *loss_out) {
    if (!p)
        return dt_fail(DT_ERR_ARG, "dt_pipe_eval: expected a pipeline, found NULL");
    bool last = p->stage == p->nstages - 1;
    if (batch < p->o.micro_batches || (p->stage == 0 && !inputs) || (last && !loss))
        return dt_fail(DT_ERR_ARG,
                       "dt_pipe_eval (stage %d): expected batch >= %d micro-batches, inputs on "
                       "stage 0 and a loss on the last stage; found batch %d",
                       p->stage, p->o.micro_batches, batch);
    p->inputs    = inputs;
    p->batch     = batch;
    p->keys      = NULL;
    p->loss      = loss;
    p->user      = user;
    p->loss_sum  = 0.0;
    dt_status st = prepare(p);
    dt_graph_train(p->g, false);
    // Forwards only, in order: a micro-batch's activations are dropped as soon as the
    // next stage has them, so slot 0 (and act_buf(0)) serve every micro-batch.
    for (int m = 0; st == DT_OK && m < p->o.micro_batches; m++) {
        int saved = p->nslots;
        p->nslots = 1;
        st        = recv_fwd(p, m);
        p->nslots = saved;
        if (st == DT_OK) {
            double t0 = dt_now();
            int    b0 = mb_first(p, m), n = mb_size(p, m);
            st = dt_graph_use_slot(p->g, 0);
            if (st == DT_OK)
                st = dt_graph_set_sample_keys(p->g, NULL, 0);
            const void *in[DT_LAYER_MAX_INPUTS];
            for (int i = 0; i < p->nin; i++)
                in[i] = p->stage == 0 ? (const char *)inputs[i] + (size_t)b0 * p->in_numel[i] * 4
                                      : (const void *)p->act;
            if (st == DT_OK)
                st = dt_graph_forward(p->g, in, n);
            if (st == DT_OK && last) {
                float l = 0.0f;
                st      = loss(user, dt_graph_output(p->g), b0, n, &l, p->dout);
                p->loss_sum += (double)l * n / batch;
            }
            p->compute_s += dt_now() - t0;
        }
        if (st == DT_OK && !last)
            st = dt_pg_send(p->pg, dt_graph_output(p->g), (size_t)mb_size(p, m) * p->out_numel,
                            DT_FLOAT32, p->stage + 1, TAG_BASE + 2 * m);
    }
    dt_graph_train(p->g, true);
    if (st != DT_OK)
        return stage_failed(p, st);
    float l = (float)p->loss_sum;
    if (p->nstages > 1)
        DT_TRY(dt_pg_broadcast(p->pg, &l, 1, DT_FLOAT32, p->nstages - 1));
    if (loss_out)
        *loss_out = l;
    return DT_OK;
}

// ------------------------------------------------------------------------ balancing

dt_status dt_pipe_time_nodes(dt_pipe *p, int micro_batch, int reps, int nwhole, double *cost) {
    if (!p || micro_batch < 1 || reps < 1 || !cost || nwhole != p->nwhole)
        return dt_fail(DT_ERR_ARG,
                       "dt_pipe_time_nodes: expected a pipeline, micro_batch >= 1, reps >= 1 and "
                       "costs for the whole graph's %d nodes; found %d, %d and %d",
                       p ? p->nwhole : 0, micro_batch, reps, nwhole);
    // Zeros of each input's shape (token 0 is an index every embedding has) and of the
    // output gradient: layer cost does not depend on the values.
    void     *in[DT_LAYER_MAX_INPUTS] = {0};
    float    *dout                    = dt_alloc_zero(sizeof(float) * p->out_numel * micro_batch);
    dt_status st                      = dout ? DT_OK : DT_ERR_NOMEM;
    for (int i = 0; i < p->nin && st == DT_OK; i++)
        if (!(in[i] = dt_alloc_zero(4 * p->in_numel[i] * (size_t)micro_batch)))
            st = DT_ERR_NOMEM;
    if (st == DT_OK)
        st = dt_graph_set_sample_keys(p->g, NULL, 0);
    // One untimed round (first-touch allocations, caches), then `reps` timed ones; each
    // node's fastest round counts (a round the scheduler interrupted is slower, never
    // faster).
    int ext = p->stage > 0 ? p->nin : 0; // the stage graph's inputs from earlier stages
    for (int r = 0; r <= reps && st == DT_OK; r++) {
        st = dt_graph_set_timing(p->g, r > 0); // on: the counters from 0
        if (st == DT_OK)
            st = dt_graph_forward(p->g, (const void *const *)in, micro_batch);
        if (st == DT_OK)
            st = dt_graph_backward(p->g, dout);
        for (int j = ext; r > 0 && j < dt_graph_num_nodes(p->g) && st == DT_OK; j++) {
            double f, b, *c = &cost[p->first + j - ext];
            dt_graph_node_seconds(p->g, j, &f, &b);
            *c = r == 1 || f + b < *c ? f + b : *c;
        }
    }
    dt_graph_set_timing(p->g, false);
    dt_params_zero_grad(dt_graph_params(p->g));
    for (int i = 0; i < p->nin; i++)
        dt_free(in[i]);
    dt_free(dout);
    return st == DT_OK ? DT_OK : dt_fail_context("pipeline stage %d: timing its nodes", p->stage);
}

dt_status dt_pipe_balance(int nnodes, const double *cost, int ncand, const int *cand, int stages,
                          int *chosen, double *slowest) {
    if (nnodes < 1 || !cost || stages < 1 || ncand < stages - 1 || (ncand > 0 && !cand) ||
        (stages > 1 && !chosen))
        return dt_fail(DT_ERR_ARG,
                       "dt_pipe_balance: expected costs of %d nodes and at least %d candidate "
                       "cuts for %d stages, found %d",
                       nnodes, stages - 1, stages, ncand);
    for (int i = 0; i < ncand; i++)
        if (cand[i] < 0 || cand[i] >= nnodes - 1 || (i > 0 && cand[i] <= cand[i - 1]))
            return dt_fail(DT_ERR_ARG,
                           "dt_pipe_balance: expected candidate nodes in increasing order below "
                           "the last node %d, found %d at %d",
                           nnodes - 1, cand[i], i);
    double *pre = dt_alloc(sizeof(double) * (size_t)(nnodes + 1));
    // best[k * ncand + j]: the least largest stage cost of stages 0..k with stage k
    // ending at (and including) node cand[j]; from[...]: the cut before that stage.
    size_t  cells = (size_t)(stages > 1 ? stages - 1 : 1) * (size_t)(ncand ? ncand : 1);
    double *best  = dt_alloc(sizeof(double) * cells);
    int    *from  = dt_alloc(sizeof(int) * cells);
    if (!pre || !best || !from) {
        dt_free(pre), dt_free(best), dt_free(from);
        return DT_ERR_NOMEM;
    }
    pre[0] = 0;
    for (int i = 0; i < nnodes; i++)
        pre[i + 1] = pre[i] + (cost[i] > 0 ? cost[i] : 0);
#define UPTO(j) pre[cand[j] + 1] // the cost of nodes 0..cand[j]
    for (int k = 0; k < stages - 1; k++)
        for (int j = 0; j < ncand; j++) {
            double *b                   = &best[(size_t)k * ncand + j];
            *b                          = k == 0 ? UPTO(j) : INFINITY;
            from[(size_t)k * ncand + j] = -1;
            for (int i = 0; k > 0 && i < j; i++) { // the first minimum: ties cut early
                double prev = best[(size_t)(k - 1) * ncand + i], mine = UPTO(j) - UPTO(i);
                double m = prev > mine ? prev : mine;
                if (m < *b)
                    *b = m, from[(size_t)k * ncand + j] = i;
            }
        }
    double top = pre[nnodes];
    int    end = -1;
    for (int j = 0; stages > 1 && j < ncand; j++) {
        double b = best[(size_t)(stages - 2) * ncand + j], last = pre[nnodes] - UPTO(j);
        double m = b > last ? b : last;
        if (end < 0 || m < top)
            top = m, end = j;
    }
#undef UPTO
    for (int k = stages - 2; k >= 0; k--) { // back from the last cut
        chosen[k] = end;
        end       = from[(size_t)k * ncand + end];
    }
    if (slowest)
        *slowest = top;
    dt_free(pre), dt_free(best), dt_free(from);
    return DT_OK;
}
