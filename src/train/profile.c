// profile.c: --profile's tables at the end of a run (rank 0): time per layer or graph
// node with its kernel, then per kind of layer with its rate of floating-point operations.
#include "train_impl.h"

#include <stdio.h>
#include <string.h>

void dt_train_print_profile(dt_model *m, double train_secs) {
    double          total = 0;
    const dt_graph *g     = dt_model_graph(m);
    printf("%-4s %-12s %10s %10s %7s  %s\n", "layer", "kind", "forward_s", "backward_s", "share",
           "kernel");
    for (int i = 0; i < dt_model_num_layers(m); i++) {
        double           f, b;
        dt_graph_profile p    = {0};
        int              node = dt_model_layer_node(m, i);
        dt_model_profile(m, i, &f, &b);
        total += f + b;
        if (node >= 0)
            dt_graph_node_profile(g, node, &p);
        else
            snprintf(p.kernel, sizeof p.kernel, "(fused into the layer before)");
        printf("%-4d %-12s %10.3f %10.3f %6.1f%%  %s\n", i, dt_model_layer_kind(m, i), f, b,
               100.0 * (f + b) / train_secs, p.kernel);
    }
    printf("%-17s %21.3f %6.1f%%  (the rest: data, loss, optimizer, gradient sync)\n", "all layers",
           total, 100.0 * total / train_secs);
}

// The graph's profile: a row per node, then per kind of layer with the rate of its
// floating-point operations (where the layers declare them), then the sum.
void dt_train_print_graph_profile(const dt_graph *g, double train_secs) {
    enum { KINDS = 32 };
    const char      *kind[KINDS];
    dt_graph_profile sum[KINDS] = {{0}}, all = {0};
    int              nk = 0;
    printf("%-4s %-22s %-20s %10s %10s %7s  %s\n", "node", "name", "kind", "forward_s",
           "backward_s", "share", "kernel");
    for (int i = 0; i < dt_graph_num_nodes(g); i++) {
        dt_graph_profile p;
        const char      *k = dt_graph_node_kind(g, i);
        if (strcmp(k, "input") == 0 || dt_graph_node_profile(g, i, &p) != DT_OK)
            continue;
        printf("%-4d %-22s %-20s %10.3f %10.3f %6.1f%%  %s\n", i, dt_graph_node_name(g, i), k,
               p.fwd_s, p.bwd_s, 100.0 * (p.fwd_s + p.bwd_s) / train_secs, p.kernel);
        int j = 0;
        while (j < nk && strcmp(kind[j], k) != 0)
            j++;
        if (j == nk && nk < KINDS)
            kind[nk++] = k;
        if (j < nk) {
            sum[j].fwd_s += p.fwd_s, sum[j].bwd_s += p.bwd_s;
            sum[j].fwd_flop += p.fwd_flop, sum[j].bwd_flop += p.bwd_flop;
        }
        all.fwd_s += p.fwd_s, all.bwd_s += p.bwd_s;
    }
    printf("%-27s %-20s %10s %10s %7s %11s %11s\n", "by kind", "", "forward_s", "backward_s",
           "share", "fwd_GFLOP/s", "bwd_GFLOP/s");
    for (int j = 0; j < nk; j++) {
        const dt_graph_profile *p = &sum[j];
        printf("%-27s %-20s %10.3f %10.3f %6.1f%%", "", kind[j], p->fwd_s, p->bwd_s,
               100.0 * (p->fwd_s + p->bwd_s) / train_secs);
        if (p->fwd_flop > 0 && p->fwd_s > 0 && p->bwd_s > 0)
            printf(" %11.1f %11.1f", p->fwd_flop / p->fwd_s * 1e-9, p->bwd_flop / p->bwd_s * 1e-9);
        printf("\n");
    }
    printf("%-48s %10.3f %10.3f %6.1f%%  (the rest: data, loss, optimizer, gradient sync)\n",
           "all nodes", all.fwd_s, all.bwd_s, 100.0 * (all.fwd_s + all.bwd_s) / train_secs);
}
