// kernel_name.c: which kernel a built-in layer runs, named from the kernel table (the
// row and the target that filled it), for the profile's rows (dt_graph_node_profile).
#include "kernels/table.h"
#include "nn/conv16.h"
#include "nn/layers/conv_fused.h"
#include "nn/layers/layers_impl.h"
#include "nn/nn_impl.h"

#include <stdio.h>
#include <string.h>

static const char *row(dt_krow r, char *buf, size_t n) {
    return dt_krow_describe(dt_k(), r, buf, n);
}

const char *lay_kernel_name(const dt_layer *l, const dt_shape *in, char *buf, size_t n) {
    dt_nn_conv2d cp;
    const char  *k = l->ops->kind;
    buf[0]         = 0;
    if (dt_fused_is(l)) { // the fused convolution: shifted tiles (direct) or a GEMM a sample
        const nn_layer *nl = dt_fused_nn(l);
        const dt_ktab  *t  = dt_k();
        // bf16: conv16.c's kernels, else bf16 operands on the fp32 shifted GEMMs, else
        // im2col and the bf16 GEMM's path (conv_team.c decides at each call alike)
        bool d16 = nl->direct16 && dt_c16_usable(),
             r16 = nl->direct16 && !d16 && dt_nn_want_direct();
        snprintf(buf, n, "conv2d fwd: %s/%s",
                 t->from[d16                 ? DT_KROW_c16_shifted
                         : nl->direct || r16 ? DT_KROW_shifted_gemm
                                             : DT_KROW_sgemm],
                 d16          ? "bf16 direct"
                 : r16        ? "direct, bf16 operands"
                 : nl->direct ? "direct"
                              : "im2col");
    } else if (lay_as_conv2d(l, &cp)) {
        dt_nn_conv2d_kernel(&cp, in && in->ndim == 3 ? (int)in->d[2] : 0, false, false, buf, n);
    } else if (strcmp(k, "linear") == 0) {
        snprintf(buf, n, "linear: %s/%s",
                 dt_k()->from[lay_linear_direct(l) ? DT_KROW_shifted_gemm_nt : DT_KROW_sgemm],
                 lay_linear_direct(l) ? "shifted" : "gemm");
    } else if (strncmp(k, "batchnorm", 9) == 0) {
        row(DT_KROW_bn_apply, buf, n);
    } else if (strcmp(k, "layernorm") == 0) {
        row(DT_KROW_ln_fwd, buf, n);
    } else if (strcmp(k, "attention") == 0) {
        row(DT_KROW_attn_fwd, buf, n);
    } else if (strcmp(k, "relu") == 0) {
        row(DT_KROW_relu_fwd, buf, n);
    } else if (strncmp(k, "gelu", 4) == 0) {
        row(DT_KROW_gelu_fwd, buf, n);
    } else if (strcmp(k, "softmax") == 0) {
        row(DT_KROW_softmax_fwd, buf, n);
    } else if (strncmp(k, "dropout", 7) == 0) {
        row(DT_KROW_mask_scale, buf, n);
    }
    return buf;
}
