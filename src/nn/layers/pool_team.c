// pool_team.c: the 2x2 max pool a fused convolution (conv_fused.c) applies while it
// writes its output (conv_team.c computes it): its shape and saved state. Windows
// without padding (torch.nn.MaxPool2d with padding 0, dilation 1, floor mode); one byte
// per output records which element of its window won, and ties go to the first maximum
// in row-major window order, as PyTorch's CPU kernel.
#include "nn/nn_impl.h"

dt_status dt_team_pool_setup(nn_layer *l) {
    if (l->stride == 0)
        l->stride = l->k;
    if (l->k < 1 || l->k > 15 || l->stride < 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d maxpool2d: expected kernel in [1, 15] and stride >= 1, found "
                       "kernel %d, stride %d",
                       l->index, l->k, l->stride);
    if (l->in.h < l->k || l->in.w < l->k)
        return dt_fail(DT_ERR_ARG,
                       "layer %d maxpool2d: window %d does not fit the input (%d, %d, %d)",
                       l->index, l->k, l->in.c, l->in.h, l->in.w);
    l->out.c          = l->in.c;
    l->out.h          = (l->in.h - l->k) / l->stride + 1;
    l->out.w          = (l->in.w - l->k) / l->stride + 1;
    l->aux_per_sample = nn_shape_size(l->out); // one byte per output: the winner's index
    return DT_OK;
}
