// mnist.c: the example's ConvNet constructor, built into the tests' library (mnist.h).
#include "../../examples/mnist/convnet.c"
