// conv_cl.h: Conv2d kernels with channels in the vector lanes (conv_cl.c), for the
// small images of the ResNet workload. Internal to src/nn (ops_conv.c routes to them).
#ifndef DTRAIN_NN_CONV_CL_H
#define DTRAIN_NN_CONV_CL_H

#include "nn/ops.h"

#include <stdbool.h>
#include <stddef.h>

// Which parts the kernels take: forward needs groups 1 and cout a multiple of 16; the
// input gradient needs cin a multiple of 16 too; the weight gradient cout a multiple
// of 16 and cin a multiple of 8, or a 1-channel 3x3 stride-1 stem of rows up to 32
// wide (w the input's width) without the input gradient.
bool dt_nn_conv_cl_forward_ok(const dt_nn_conv2d *p);
bool dt_nn_conv_cl_backward_ok(const dt_nn_conv2d *p, int w, bool input_grad);
// Scratch in floats for either direction.
size_t dt_nn_conv_cl_scratch(const dt_nn_conv2d *p, int h, int w);
// As dt_nn_conv2d_forward / _backward (ops.h).
void dt_nn_conv_cl_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                           const float *wt, const float *b, float *y, float *scratch);
void dt_nn_conv_cl_backward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                            const float *wt, const float *dy, float *dx, float *dw, float *db,
                            float *scratch);

#endif // DTRAIN_NN_CONV_CL_H
