// test_shape.c: a dataset meets a model. dt_dataset_check_shape accepts exactly the
// model's per-sample input shape and names both shapes otherwise; the seed's ConvNet
// reports (1, 28, 28) through dt_model_input_shape, and a model built for another
// shape reports that one.
#include "../check.h"
#include "../lib/mnist.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"

#include <stdlib.h>

static void set_of(dt_dataset *ds, int h, int w) {
    size_t   n   = 3;
    uint8_t *img = calloc(n * (size_t)h * (size_t)w, 1), lab[3] = {0, 1, 2};
    CHECK_OK(dt_dataset_init(ds, img, lab, n, h, w, NULL));
    free(img);
}

static void test_check_shape(void) {
    dt_model *m = NULL;
    CHECK_OK(mnist_convnet_new(&m, 1, 0.1f, 0.25f));
    int c = 0, h = 0, w = 0;
    dt_model_input_shape(m, &c, &h, &w);
    CHECK_EQ(c, 1);
    CHECK_EQ(h, 28);
    CHECK_EQ(w, 28);
    CHECK_EQ(dt_model_input_size(m), (size_t)c * (size_t)h * (size_t)w);
    dt_model_input_shape(m, NULL, &h, NULL); // NULL pointers are skipped
    CHECK_EQ(h, 28);
    dt_model_free(m);

    dt_dataset ds;
    set_of(&ds, 28, 28);
    CHECK_OK(dt_dataset_check_shape(&ds, "training set", 1, 28, 28));
    CHECK_ERR(dt_dataset_check_shape(&ds, "training set", 3, 28, 28), DT_ERR_ARG,
              "training set: expected samples of the model's input shape (3, 28, 28) (C, H, W), "
              "found (1, 28, 28)");
    CHECK_ERR(dt_dataset_check_shape(&ds, NULL, 1, 28, 27), DT_ERR_ARG,
              "dataset: expected samples of the model's input shape (1, 28, 27)");
    dt_dataset_free(&ds);

    // Smaller, larger, and with the same pixel count but another layout.
    static const int sides[][2] = {{1, 1}, {14, 14}, {56, 56}, {14, 56}, {784, 1}};
    for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
        set_of(&ds, sides[i][0], sides[i][1]);
        char want[160];
        snprintf(want, sizeof want,
                 "test set: expected samples of the model's input shape (1, 28, 28) (C, H, W), "
                 "found (1, %d, %d)",
                 sides[i][0], sides[i][1]);
        CHECK_ERR(dt_dataset_check_shape(&ds, "test set", 1, 28, 28), DT_ERR_ARG, want);
        dt_dataset_free(&ds);
    }
    CHECK_ERR(dt_dataset_check_shape(&ds, "empty", 1, 28, 28), DT_ERR_ARG,
              "empty: expected a loaded dataset, found none");
    CHECK_ERR(dt_dataset_check_shape(NULL, NULL, 1, 28, 28), DT_ERR_ARG, "dataset: expected");

    // A model of another input shape: its own shape is the one asked for.
    dt_model *m2 = NULL;
    dt_model_new(&m2, 1, 14, 14);
    CHECK(m2 != NULL);
    CHECK_OK(dt_model_add_flatten(m2));
    CHECK_OK(dt_model_add_linear(m2, 10));
    CHECK_OK(dt_model_finalize(m2, 3));
    dt_model_input_shape(m2, &c, &h, &w);
    set_of(&ds, 14, 14);
    CHECK_OK(dt_dataset_check_shape(&ds, "small", c, h, w));
    dt_dataset_free(&ds);
    dt_model_free(m2);
}

// General datasets: float samples of any shape against 3-d and flat models.
static void test_general(void) {
    float           x[2 * 3 * 8 * 8] = {0};
    int32_t         y[2]             = {0, 1};
    dt_dataset_desc d                = {.n      = 2,
                                        .ndim   = 3,
                                        .shape  = {3, 8, 8},
                                        .type   = DT_SAMPLE_F32,
                                        .data   = x,
                                        .target = DT_TARGET_LABEL,
                                        .labels = y};
    dt_dataset      ds;
    CHECK_OK(dt_dataset_init_desc(&ds, &d, NULL));
    CHECK_OK(dt_dataset_check_shape(&ds, "rgb", 3, 8, 8));
    CHECK_ERR(dt_dataset_check_shape(&ds, "rgb", 1, 8, 8), DT_ERR_ARG,
              "rgb: expected samples of the model's input shape (1, 8, 8) (C, H, W), found (3, "
              "8, 8)");
    CHECK_ERR(dt_dataset_check_shape(&ds, "rgb", 8, 8, 3), DT_ERR_ARG, "found (3, 8, 8)");
    CHECK_ERR(dt_dataset_check_shape(&ds, "rgb", 192, 1, 1), DT_ERR_ARG, "(192, 1, 1)");
    dt_dataset_free(&ds);

    // Flat samples (F) fit a flat model (F, 1, 1), and nothing else of F elements.
    d.ndim     = 1;
    d.shape[0] = 192;
    CHECK_OK(dt_dataset_init_desc(&ds, &d, NULL));
    CHECK_OK(dt_dataset_check_shape(&ds, "flat", 192, 1, 1));
    CHECK_ERR(dt_dataset_check_shape(&ds, "flat", 3, 8, 8), DT_ERR_ARG,
              "flat: expected samples of the model's input shape (3, 8, 8) (C, H, W), found "
              "(192,)");
    CHECK_ERR(dt_dataset_check_shape(&ds, "flat", 191, 1, 1), DT_ERR_ARG, "found (192,)");
    // any rank (a graph input's shape): (192) and (192, 1) fit, (20) does not, nor (8, 24)
    CHECK_OK(dt_dataset_check_dims(&ds, "flat", 1, (const int64_t[]){192}));
    CHECK_OK(dt_dataset_check_dims(&ds, "flat", 2, (const int64_t[]){192, 1}));
    CHECK_ERR(dt_dataset_check_dims(&ds, "flat", 1, (const int64_t[]){20}), DT_ERR_ARG,
              "flat: expected samples of the model's input shape (20,), found (192,)");
    CHECK_ERR(dt_dataset_check_dims(&ds, "flat", 2, (const int64_t[]){8, 24}), DT_ERR_ARG,
              "(8, 24), found (192,)");
    CHECK_ERR(dt_dataset_check_dims(&ds, "flat", 1, (const int64_t[]){0}), DT_ERR_ARG, "positive");
    dt_dataset_free(&ds);

    // (H, W) samples fit a (1, H, W) model; (H, W, 1) too; (1, H, 1, W) does not.
    d.ndim     = 2;
    d.shape[0] = 8;
    d.shape[1] = 24;
    CHECK_OK(dt_dataset_init_desc(&ds, &d, NULL));
    CHECK_OK(dt_dataset_check_shape(&ds, "2d", 1, 8, 24));
    CHECK_OK(dt_dataset_check_shape(&ds, "2d", 8, 24, 1));
    CHECK_ERR(dt_dataset_check_shape(&ds, "2d", 1, 24, 8), DT_ERR_ARG, "found (8, 24)");
    dt_dataset_free(&ds);
}

int main(void) {
    RUN(test_check_shape);
    RUN(test_general);
    return check_summary();
}
