// graph_impl.h: the model graph's private layout, shared by graph.c (building, forward,
// backward) and graph_pipe.c (what pipelines need: slots of values per micro-batch, the
// ties, and the extraction of a stage's subgraph).
#ifndef DTRAIN_NN_GRAPH_IMPL_H
#define DTRAIN_NN_GRAPH_IMPL_H

#include "dtrain/graph.h"

#include "nn/pool.h"

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
    // dt_graph_fuse: the node whose name its tensors are registered under (the fused
    // BatchNorm's); empty: its own.
    char             tensor_node[DT_GRAPH_NAME_MAX + 1];
    void            *w16[DT_LAYER_MAX_TENSORS]; // 16-bit shadows (su.lowp_params), per precision
    dt_graph_profile prof;                      // dt_graph_set_profile's sums
} gval;

// One set of the values a forward leaves for its backward (dt_graph_set_slots): the
// selected slot's are in the gvals, the others wait here.
typedef struct gslot {
    float       **y, **saved; // [nvals], owned
    const float **ext;        // [nvals]
    bool         *fwd_training;
    int           batch;
    uint64_t     *keys; // owned
    int           nkeys;
} gslot;

struct dt_graph {
    gval      *vals;
    int        nvals, cap, output;
    bool       finalized, training, input_grad;
    dt_params *params;
    int       *first_user; // per parameter tensor: the earliest node using it
    dt_rng     rng;
    uint64_t  *keys;
    int        nkeys;
    int        reserved; // batch the buffers hold
    int        batch;    // of the last forward
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
    float      **dyslot;   // the buffers the nodes' gradients share (see share_dy)
    int          ndy;
    gslot       *slots; // dt_graph_set_slots: nslots sets of values, `slot` selected
    int          nslots, slot;
    dt_precision prec;     // dt_graph_set_precision
    dt_precision w16_prec; // the format the shadows (gval.w16) were made for
    bool         profile;  // dt_graph_set_profile
};

// Frees the values' buffers (outputs, saved state, gradients, scratch) and the slots
// of dt_graph_set_slots; both leave the graph ready for another reserve.
void dt_graph_release_buffers(dt_graph *g);
void dt_graph_release_slots(dt_graph *g);

#endif
