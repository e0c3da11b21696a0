// test_graph_ckpt.c: a model graph with BatchNorm buffers through a model file.
//
// A ResNet basic block trains two steps (the running statistics move away from 0 and
// 1, the weights from their initialisation), is saved with dt_ckpt_save_params, and is
// loaded into the same graph built from another seed: every parameter and buffer must
// come back bit for bit, so an evaluation forward (which reads the running statistics)
// gives the same output bit for bit. A graph of another width is refused with
// DT_ERR_MISMATCH and left untouched.
#include "../check.h"
#include "../lib/graphs.h"
#include "dtrain/ckpt.h"

#include <stdlib.h>
#include <unistd.h>

enum { C = 3, H = 5, W = 4, N = 4 };

static dt_graph *block(int c, uint64_t seed) {
    dt_graph *g = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, c, H, W, NULL));
    CHECK_OK(dt_graph_finalize(g, seed));
    return g;
}

int main(void) {
    char dir[] = "/tmp/dt_graph_ckpt_XXXXXX", path[64];
    if (!CHECK(mkdtemp(dir) != NULL))
        return check_summary();
    snprintf(path, sizeof path, "%s/model.dtck", dir);

    dt_graph *a = block(C, 1);
    float     x[N * C * H * W], dy[N * C * H * W];
    dt_rng    r = dt_rng_init(4);
    for (int i = 0; i < N * C * H * W; i++) {
        x[i]  = dt_rng_normal(&r) + 0.5f;
        dy[i] = dt_rng_normal(&r);
    }
    dt_params *pa = dt_graph_params(a);
    CHECK_EQ(dt_params_buffer_count(pa), 4); // bn1, bn2: running_mean, running_var
    for (int step = 0; step < 2; step++) {
        CHECK_OK(dt_graph_forward(a, (const void *[]){x}, N));
        dt_params_zero_grad(pa);
        CHECK_OK(dt_graph_backward(a, dy));
        for (size_t i = 0; i < dt_params_numel(pa); i++)
            dt_params_data(pa)[i] -= 0.1f * dt_params_grads(pa)[i];
    }
    const dt_param_info *rv = dt_params_buffer_info(pa, dt_params_buffer_count(pa) - 1);
    CHECK(strcmp(rv->name, "bn2.running_var") == 0);
    CHECK(fabsf(dt_params_buffers(pa)[rv->offset] - 1.0f) > 1e-3f); // the stats moved
    CHECK_OK(dt_ckpt_save_params(path, pa));

    dt_graph  *b  = block(C, 2);
    dt_params *pb = dt_graph_params(b);
    CHECK(memcmp(dt_params_data(pa), dt_params_data(pb), sizeof(float) * dt_params_numel(pa)));
    CHECK_OK(dt_ckpt_load_params(path, pb));
    CHECK(!memcmp(dt_params_data(pa), dt_params_data(pb), sizeof(float) * dt_params_numel(pa)));
    CHECK(!memcmp(dt_params_buffers(pa), dt_params_buffers(pb),
                  sizeof(float) * dt_params_buffer_numel(pa)));
    dt_graph_train(a, false);
    dt_graph_train(b, false);
    CHECK_OK(dt_graph_forward(a, (const void *[]){x}, N));
    CHECK_OK(dt_graph_forward(b, (const void *[]){x}, N));
    CHECK(!memcmp(dt_graph_output(a), dt_graph_output(b), sizeof x));

    dt_graph *wide  = block(C + 1, 3);
    float     first = dt_params_data(dt_graph_params(wide))[0];
    CHECK_ERR(dt_ckpt_load_params(path, dt_graph_params(wide)), DT_ERR_MISMATCH, "conv1.weight");
    CHECK(dt_params_data(dt_graph_params(wide))[0] == first);

    dt_graph_free(wide);
    dt_graph_free(a);
    dt_graph_free(b);
    unlink(path);
    rmdir(dir);
    return check_summary();
}
