// graph_impl.h: the model graph's private layout, shared by graph.c (building,
// finalize), graph_run.c (buffers, threads, forward, backward), graph_pass.c (the passes
// finalize applies: fusion, in-place aliases) and graph_pipe.c (what pipelines need:
// slots of values per micro-batch, the ties, and the extraction of a stage's subgraph).
// model.c builds the Sequential dt_model on it.
#ifndef DTRAIN_NN_GRAPH_IMPL_H
#define DTRAIN_NN_GRAPH_IMPL_H

#include "dtrain/graph.h"

#include "nn/pool.h"

#include <time.h>

typedef struct gval {
    char           name[DT_GRAPH_NAME_MAX + 1];
    dt_layer      *layer; // NULL: a graph input
    int            nin;
    int            in[DT_LAYER_MAX_INPUTS];
    dt_shape       shape; // per-sample output
    dt_layer_setup su;
    int            nconsumers;
    int            layer_no; // position among the layer nodes (0 = the first added): its
                             // random streams, as a Sequential model's layer index
    int param_layer;         // dt_param_info.layer of its tensors (default: the node)
    int alias;               // in-place (graph_pass.c): the value whose output and
                             // gradient buffers this node shares, or -1
    // After finalize: tensor indices into the dt_params tables; alias_of: -1 or the
    // (value, tensor) this node's parameter k is tied to.
    int          pidx[DT_LAYER_MAX_TENSORS], bidx[DT_LAYER_MAX_TENSORS];
    int          tie_val[DT_LAYER_MAX_TENSORS], tie_k[DT_LAYER_MAX_TENSORS];
    float       *w[DT_LAYER_MAX_TENSORS], *dw[DT_LAYER_MAX_TENSORS], *buf[DT_LAYER_MAX_TENSORS];
    float       *y, *dy, *saved;
    const float *ext;     // graph input: the caller's buffer
    bool         written; // backward: dy holds a gradient
    bool         fwd_training;
    bool         moved; // its layer went to another graph (dt_graph_extract)
    // dt_graph_extract: parameter k was tied to a node left behind; it is a tensor of
    // its own here, registered under its owner's name (empty: not such a copy).
    char copy_of[DT_LAYER_MAX_TENSORS][DT_PARAM_NAME_MAX + 1];
    // The node whose name its tensors are registered under (a node a fusion pass
    // made: the convolution's or the BatchNorm's); empty: its own.
    char  tensor_node[DT_GRAPH_NAME_MAX + 1];
    void *w16[DT_LAYER_MAX_TENSORS]; // 16-bit shadows (su.lowp_params), per precision
    // The backward plan (graph_run.c, made before the threads start): where each input's
    // gradient goes (dx[j]: the input's dy, or a temporary added into it after), whether
    // this node's dy must be zeroed first (it feeds nothing that reaches the output) and
    // whether the threads must meet before it.
    float   *bdx[DT_LAYER_MAX_INPUTS];
    bool     bdirect[DT_LAYER_MAX_INPUTS];
    bool     bzero, bmeet;
    uint64_t fwd_ns, bwd_ns;     // profile (dt_graph_set_profile), on thread 0
    double   fwd_flop, bwd_flop; // and the operations the layer declares
} gval;

// One set of the values a forward leaves for its backward (dt_graph_set_slots): the
// selected slot's are in the gvals, the others wait here.
typedef struct gslot {
    float       **y, **saved; // [nvals], owned (an alias's y is its root's: not owned)
    const float **ext;        // [nvals]
    bool         *fwd_training;
    int           batch;
    uint64_t     *keys; // owned
    int           nkeys;
} gslot;

struct dt_graph {
    gval *vals;
    int   nvals, cap, output;
    bool  finalized, training, input_grad;
    bool  no_fusion;    // dt_graph_opts.no_fusion
    bool  merge_ready;  // one gradient-ready call per node (its tensors' span), as a
                        // Sequential model reports per layer; else one per tensor
    bool       profile; // dt_graph_set_profile
    dt_params *params;
    int       *first_user; // per parameter tensor: the earliest node using it
    dt_rng     rng;
    uint64_t  *keys;
    int        nkeys;
    int        reserved;   // batch the buffers hold
    bool       reserved16; // and whether they hold the 16-bit saved state (saved16)
    int        batch;      // of the last forward
    float     *scratch, *tmp;
    size_t     scratch_n, tmp_n;
    // Threads (dt_graph_set_threads): samples split in nthreads contiguous ranges.
    dt_pool     *pool;
    int          nthreads;
    int          split;    // the thread count of the last forward (backward reuses it)
    float      **partial;  // [thread] gradient partials of threads 1.. (0 adds into grads)
    float      **tscratch; // [thread] scratch of threads 1.. (thread 0 uses `scratch`)
    int          tbuf_n;   // threads the two arrays above were made for
    size_t       tscratch_n;
    uint64_t    *pos_keys; // 0, 1, ..: the sample keys of a split batch without keys
    dt_status   *tstatus;  // [thread] status of the current task
    int         *tfail;    // [thread] the node whose call failed there, or -1
    int          failed;   // a thread failed in the current task (read relaxed)
    float      **dyslot;   // the buffers the nodes' gradients share (see share_dy)
    int          ndy;
    float      **plan_buf; // [nvals] backward's plan: buffers touched since the threads met
    size_t      *plan_lay; // [nvals] and their layouts
    gslot       *slots;    // dt_graph_set_slots: nslots sets of values, `slot` selected
    int          nslots, slot;
    double      *times;    // dt_graph_set_timing: forward and backward seconds per value
    dt_precision prec;     // dt_graph_set_precision
    dt_precision w16_prec; // the format the shadows (gval.w16) were made for
    bool         hooked;   // the parameters have a use consumer (ZeRO-3): this pass
                           // announces each node's tensors (params.h)
    // Gradient shards (dt_graph_set_grad_shards): 0 off, else `shards` buffers of the
    // parameters' size, shard k at k * numel.
    int    shards;
    float *shard_buf;
};

// The 16-bit saved state of a value (su.saved16_per_sample, dt_layer_args.saved16): after
// its float state, in the same buffer, in 16-bit precision modes only; a forward after
// dt_graph_set_precision reserves again when that changes (reserved16). Floats it takes
// for `batch` samples, and its samples from `off` (NULL in fp32, or when the buffers were
// reserved without it: the layer then takes its fp32-operand fallback).
static inline size_t dt_graph_saved16_floats(const dt_graph *g, const gval *v, int batch) {
    return g->prec == DT_PREC_FP32 ? 0 : (v->su.saved16_per_sample * (size_t)batch + 1) / 2;
}
static inline uint16_t *dt_graph_saved16_at(const dt_graph *g, const gval *v, size_t off) {
    if (!g->reserved16 || g->prec == DT_PREC_FP32 || !v->su.saved16_per_sample)
        return NULL;
    float *end = v->saved + v->su.saved_per_sample * (size_t)g->reserved + v->su.saved_fixed;
    return (uint16_t *)(void *)end + off * v->su.saved16_per_sample;
}

// The clock of dt_graph_set_timing: this process's CPU time (all its threads), which
// other jobs sharing the machine do not inflate as they do the wall time.
static inline uint64_t dt_graph_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// Frees the values' buffers (outputs, saved state, gradients, scratch) and the slots
// of dt_graph_set_slots; both leave the graph ready for another reserve.
void dt_graph_release_buffers(dt_graph *g);
void dt_graph_release_slots(dt_graph *g);
void dt_graph_free_thread_buffers(dt_graph *g);

// The pass of dt_graph_finalize (graph_pass.c), before the tensors are registered:
// fusion (conv2d + ReLU (+ 2x2 max pool) into one node of the Sequential kind; nodes
// removed, the rest renumbered).
dt_status dt_graph_run_passes(dt_graph *g);
// In-place nodes (Sequential ReLU, dropout and flatten nodes that are their input's
// only reader share its buffers), planned with the buffers (graph_buffers.c's reserve):
// whether an input is the output may change until then (dt_graph_set_output).
void dt_graph_plan_aliases(dt_graph *g);
void dt_graph_free_shadows(dt_graph *g);
// The name node v's tensors are registered under ("<it>.weight").
static inline const char *dt_graph_tensor_node(const gval *v) {
    return v->tensor_node[0] ? v->tensor_node : v->name;
}
// The layer nodes in the order their tensors are registered (returned: how many):
// their layer position (layer_no) order, which is node order but for the nodes of
// dt_graph_fuse, which keep their BatchNorm's place (and so the unfused model's
// parameter order). order: room for nvals.
int dt_graph_tensor_order(const dt_graph *g, int *order);
// The value whose buffers node i's output lives in (itself unless an alias).
static inline int dt_graph_root(const dt_graph *g, int i) {
    while (g->vals[i].alias >= 0)
        i = g->vals[i].alias;
    return i;
}

// The precision changed: every node's setup runs again (dt_layer_setup.precision) and
// the buffers are made anew.
dt_status dt_graph_setup_again(dt_graph *g);
// Node i's setup again with the graph's precision (dt_layer_setup.precision).
dt_status dt_graph_setup_node(dt_graph *g, int i);

// ------------------------------------------------------- between graph_buffers.c and graph_run.c

static inline size_t dt_graph_val_floats(const gval *v, int batch) {
    return dt_shape_numel(&v->shape) * (size_t)batch;
}
static inline const float *dt_graph_val_data(const gval *v) {
    return v->layer ? v->y : v->ext;
}
// A layer with batch-wide state in forward (BatchNorm's statistics: saved_fixed) runs
// on the whole batch on thread 0, as one that asks for it (DT_LAYER_WHOLE); a team
// layer is called by every thread at once; every other layer is split by samples.
static inline bool dt_graph_whole(const gval *v) {
    return v->su.run == DT_LAYER_WHOLE || (v->su.run == DT_LAYER_RANGE && v->su.saved_fixed != 0);
}
static inline bool dt_graph_team(const gval *v) {
    return v->su.run == DT_LAYER_TEAM;
}
// Whether the graph forms the node's parameter gradient per shard (a team layer with a
// shared gradient sums its shards itself).
static inline bool dt_graph_sharded(const dt_graph *g, const gval *v) {
    return g->shards && v->su.nparams && !dt_graph_whole(v) &&
           (!dt_graph_team(v) || v->su.grad == DT_LAYER_GRAD_PARTIAL);
}
// The buffers for `batch` samples; the threads' buffers (after dt_graph_set_threads);
// the weights' 16-bit shadows for the graph's precision (graph_buffers.c).
dt_status dt_graph_reserve_buffers(dt_graph *g, int batch);
dt_status dt_graph_thread_buffers(dt_graph *g);
dt_status dt_graph_fill_shadows(dt_graph *g);
// ZeRO-3's parameter-use announcements (params.h) around a pass and a node; whether a
// node must run alone between announcements.
dt_status dt_graph_pass_use(dt_graph *g, dt_param_use what, bool backward);
dt_status dt_graph_node_use(dt_graph *g, gval *v, dt_param_use what, bool backward);
bool      dt_graph_used_alone(const dt_graph *g, const gval *v);
// Operations of node v in a forward (or backward) of the last batch, for the profile.
double dt_graph_node_flop(const dt_graph *g, const gval *v, bool backward);

#endif
