// convnet.c: the seed chapter's ConvNet (convnet.h).
#include "convnet.h"

dt_status mnist_convnet_new(dt_model **out, uint64_t seed, float drop2d, float drop) {
    *out        = NULL;
    dt_model *m = NULL;
    DT_TRY(dt_model_new(&m, 1, 28, 28));
    dt_status st;
    if ((st = dt_model_add_conv2d(m, 16, 3, 1, 0)) || (st = dt_model_add_relu(m)) ||
        (st = dt_model_add_conv2d(m, 32, 3, 1, 0)) || (st = dt_model_add_relu(m)) ||
        (st = dt_model_add_maxpool2d(m, 2, 0)) || (st = dt_model_add_dropout2d(m, drop2d)) ||
        (st = dt_model_add_flatten(m)) || (st = dt_model_add_linear(m, 64)) ||
        (st = dt_model_add_relu(m)) || (st = dt_model_add_dropout(m, drop)) ||
        (st = dt_model_add_linear(m, 10)) || (st = dt_model_add_log_softmax(m)) ||
        (st = dt_model_finalize(m, seed))) {
        dt_model_free(m);
        return st;
    }
    *out = m;
    return DT_OK;
}
