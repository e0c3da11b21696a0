// test_losses.c: what the classification losses do with a batch that has no class
// targets. A dataset whose labels are floats (an .npy of <f4 labels) has regression
// targets, dt_batch.t, and dt_batch.y is NULL; dt_loss_nll, dt_loss_cross_entropy and
// dt_loss_cross_entropy_ex took that NULL and read through it (a segfault). They now
// refuse it, saying why and what to do.
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"

#include <stdlib.h>

// A dataset of 4 samples of 3 features with float labels, as dt_dataset_load_npy makes
// of an <f4 label file, and one batch of it.
static void test_float_labels(void) {
    float           x[12] = {0}, t[4] = {0.5f, 1.5f, 0.0f, 2.0f}, logits[2 * 3] = {0}, loss = 0;
    dt_dataset      ds;
    dt_dataset_desc d = {.n            = 4,
                         .ndim         = 1,
                         .shape        = {3},
                         .type         = DT_SAMPLE_F32,
                         .data         = x,
                         .target       = DT_TARGET_FLOAT,
                         .targets      = t,
                         .target_elems = 1};
    CHECK_OK(dt_dataset_init_desc(&ds, &d, NULL));
    float    bx[2 * 3], bt[2];
    uint32_t idx[2] = {0, 1};
    CHECK_OK(dt_dataset_gather_at(&ds, 0, idx, 2, bx, NULL, bt));
    const int32_t *y = NULL; // what such a batch carries as labels
    CHECK_ERR(dt_loss_nll(logits, y, 2, 3, &loss, NULL), DT_ERR_ARG, "regression targets");
    CHECK_ERR(dt_loss_cross_entropy(logits, y, 2, 3, &loss, NULL), DT_ERR_ARG, "integer .npy");
    CHECK_ERR(dt_loss_cross_entropy_ex(logits, y, 2, 3, -100, 0.0f, &loss, NULL), DT_ERR_ARG,
              "store the labels as integers");
    // the same data as a regression: the loss it was meant for
    CHECK_OK(dt_loss_mse(logits, bt, 2, &loss, NULL));
    dt_dataset_free(&ds);
}

int main(void) {
    RUN(test_float_labels);
    return check_summary();
}
