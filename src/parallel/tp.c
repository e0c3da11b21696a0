// tp.c: the all-reduce of the tensor-parallel shards, and the Megatron blocks of tp.h.
#include "dtrain/tp.h"

#include <stdio.h>

static dt_status sum_over(void *user, float *v, size_t n) {
    return dt_pg_all_reduce(user, v, v, n, DT_FLOAT32, DT_REDUCE_SUM);
}

void dt_tp_sum_opts(dt_linear_tp_opts *opts, dt_pg *pg) {
    if (!opts)
        return;
    opts->reduce      = sum_over;
    opts->reduce_user = pg;
}

static dt_status node(dt_graph *g, const char *prefix, const char *name, dt_layer *l,
                      const char *in) {
    char n[DT_GRAPH_NAME_MAX + 2];
    if (snprintf(n, sizeof n, "%s%s", prefix, name) > DT_GRAPH_NAME_MAX) {
        dt_layer_free(l);
        return dt_fail(DT_ERR_ARG, "tp: node name '%s%s' is too long", prefix, name);
    }
    return dt_graph_add(g, n, l, in);
}

static dt_status name_of(char *buf, size_t n, const char *prefix, const char *name) {
    snprintf(buf, n, "%s%s", prefix, name);
    return DT_OK;
}

dt_status dt_tp_mlp_add(dt_graph *g, const char *prefix, const char *in, int c, int hidden,
                        bool gelu_tanh, dt_pg *pg) {
    if (!g || !prefix || !in || !pg)
        return dt_fail(DT_ERR_ARG, "dt_tp_mlp_add: expected a graph, names and a group");
    int               tp = dt_pg_size(pg), r = dt_pg_rank(pg);
    dt_linear_tp_opts o = dt_linear_tp_opts_default();
    dt_tp_sum_opts(&o, pg);
    dt_layer *l;
    char      a[DT_GRAPH_NAME_MAX + 2];
    DT_TRY(dt_layer_linear_tp_new(&l, c, hidden, DT_TP_COLUMN, tp, r, &o));
    DT_TRY(node(g, prefix, "fc", l, in));
    DT_TRY(dt_layer_act_new(&l, gelu_tanh ? DT_ACT_GELU_TANH : DT_ACT_GELU, NULL));
    DT_TRY(name_of(a, sizeof a, prefix, "fc"));
    DT_TRY(node(g, prefix, "gelu", l, a));
    DT_TRY(dt_layer_linear_tp_new(&l, hidden, c, DT_TP_ROW, tp, r, &o));
    DT_TRY(name_of(a, sizeof a, prefix, "gelu"));
    return node(g, prefix, "fc2", l, a);
}

dt_status dt_tp_attention_add(dt_graph *g, const char *prefix, const char *in, int c, int heads,
                              dt_pg *pg) {
    if (!g || !prefix || !in || !pg)
        return dt_fail(DT_ERR_ARG, "dt_tp_attention_add: expected a graph, names and a group");
    int tp = dt_pg_size(pg), r = dt_pg_rank(pg);
    if (heads < 1 || heads % tp != 0 || c % heads != 0)
        return dt_fail(DT_ERR_ARG,
                       "dt_tp_attention_add: expected heads divisible by the %d ranks and "
                       "dividing c %d; found %d heads",
                       tp, c, heads);
    dt_linear_tp_opts o = dt_linear_tp_opts_default();
    dt_tp_sum_opts(&o, pg);
    o.groups = 3; // q, k and v of this rank's heads
    dt_layer *l;
    char      a[DT_GRAPH_NAME_MAX + 2];
    DT_TRY(dt_layer_linear_tp_new(&l, c, 3 * c, DT_TP_COLUMN, tp, r, &o));
    DT_TRY(node(g, prefix, "qkv", l, in));
    DT_TRY(dt_layer_attention_new(&l, heads / tp, NULL));
    DT_TRY(name_of(a, sizeof a, prefix, "qkv"));
    DT_TRY(node(g, prefix, "attn", l, a));
    o.groups = 1;
    DT_TRY(dt_layer_linear_tp_new(&l, c, c, DT_TP_ROW, tp, r, &o));
    DT_TRY(name_of(a, sizeof a, prefix, "attn"));
    return node(g, prefix, "proj", l, a);
}
