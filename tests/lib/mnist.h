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

// Sanitizer builds: one evaluation of the 10,000 test images takes about 30 s under
// AddressSanitizer (training on 512 samples about 4 s), so the e2e tests whose checks
// do not depend on the test split's size evaluate on its first n images instead. Makes a
// folder (removed at exit) of the training files (links) and those n images, gzip, under
// the usual names, and points DT_DATA_DIR at it for this process and the programs it
// starts. Call first in main. false when the folder could not be made.
bool tl_fmnist_short_test(size_t n);

#endif // DTRAIN_TESTS_MNIST_H
