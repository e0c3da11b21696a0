// tp.c: the all-reduce of the tensor-parallel shards, and the Megatron blocks of tp.h.
#include "dtrain/tp.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

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

dt_status dt_tp_cross_entropy(dt_pg *pg, const float *logits, const int32_t *target, int n,
                              int vocab, int ignore_index, float *loss, float *dlogits) {
    int size = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    if (!logits || !target || !loss || n < 1 || vocab < 1 || vocab % size != 0)
        return dt_fail(DT_ERR_ARG,
                       "dt_tp_cross_entropy: expected logits, targets, n >= 1 and a vocabulary "
                       "divisible by the %d ranks, found n %d, vocabulary %d",
                       size, n, vocab);
    int    k = vocab / size, lo = rank * k, counted = 0;
    float *m = dt_alloc(sizeof(float) * 3 * (size_t)n); // max | sum of exp | target logit
    if (!m)
        return DT_ERR_NOMEM;
    float    *z = m + n, *tl = m + 2 * (size_t)n;
    dt_status st = DT_OK;
    for (int s = 0; s < n && st == DT_OK; s++) {
        const float *x  = logits + (size_t)s * k;
        float        mx = x[0];
        for (int j = 1; j < k; j++)
            mx = x[j] > mx ? x[j] : mx;
        m[s] = mx;
        if (target[s] != ignore_index && (target[s] < 0 || target[s] >= vocab))
            st = dt_fail(DT_ERR_ARG,
                         "dt_tp_cross_entropy: target of row %d is %d, expected 0 to %d or the "
                         "ignore_index %d",
                         s, (int)target[s], vocab - 1, ignore_index);
        counted += target[s] != ignore_index;
    }
    if (st == DT_OK && size > 1) // the rows' maximum over the whole vocabulary
        st = dt_pg_all_reduce(pg, m, m, (size_t)n, DT_FLOAT32, DT_REDUCE_MAX);
    for (int s = 0; s < n && st == DT_OK; s++) {
        const float *x   = logits + (size_t)s * k;
        double       sum = 0;
        for (int j = 0; j < k; j++)
            sum += exp((double)x[j] - m[s]);
        z[s]  = (float)sum;
        int t = target[s] - lo;
        tl[s] = target[s] != ignore_index && t >= 0 && t < k ? x[t] : 0.0f;
    }
    if (st == DT_OK && size > 1) // the sums of exponentials, and the target logits (one rank's)
        st = dt_pg_all_reduce(pg, z, z, 2 * (size_t)n, DT_FLOAT32, DT_REDUCE_SUM);
    double total = 0, inv = counted ? 1.0 / counted : 0.0;
    for (int s = 0; s < n && st == DT_OK; s++) {
        float *d = dlogits ? dlogits + (size_t)s * k : NULL;
        if (target[s] == ignore_index) {
            if (d)
                memset(d, 0, sizeof(float) * (size_t)k);
            continue;
        }
        double lse = (double)m[s] + log((double)z[s]); // -log p[t] = lse - x[t]
        total += lse - tl[s];
        if (!d)
            continue;
        const float *x = logits + (size_t)s * k;
        for (int j = 0; j < k; j++) // (softmax - onehot) / counted
            d[j] = (float)(exp((double)x[j] - lse) * inv);
        int t = target[s] - lo;
        if (t >= 0 && t < k)
            d[t] -= (float)inv;
    }
    dt_free(m);
    if (st == DT_OK)
        *loss = (float)(total * inv);
    return st;
}
