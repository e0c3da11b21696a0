// mnist.h: the seed's ConvNet and data for the tests, as the dtrain-mnist example has
// them (examples/mnist/convnet.c is compiled in, so the tests train its network).
#ifndef DTRAIN_TESTS_MNIST_H
#define DTRAIN_TESTS_MNIST_H

#include "../../examples/mnist/convnet.h"
#include "../../examples/mnist/fmnist.h"

// The Fashion-MNIST folder: $DT_DATA_DIR, else the Debian package's.
static inline const char *tl_fmnist_dir(void) {
    const char *d = dt_setting_str("DT_DATA_DIR");
    return d && *d ? d : FMNIST_DIR;
}

#endif // DTRAIN_TESTS_MNIST_H
