// convnet.h: the seed chapter's ConvNet for 28x28 single-channel images, as a
// Sequential dt_model (nn.h), finalized:
//   conv(1->16, 3x3) ReLU conv(16->32, 3x3) ReLU maxpool(2) Dropout2d(drop2d) flatten
//   linear(4608->64) ReLU dropout(drop) linear(64->10) log_softmax
// The seed uses drop2d = 0.10 and drop = 0.25. Free with dt_model_free. Also built by
// the tests (tests/lib/mnist.c), so that they train the network this program does.
#ifndef DTRAIN_EXAMPLES_CONVNET_H
#define DTRAIN_EXAMPLES_CONVNET_H

#include "dtrain/nn.h"

dt_status mnist_convnet_new(dt_model **out, uint64_t seed, float drop2d, float drop);

#endif // DTRAIN_EXAMPLES_CONVNET_H
