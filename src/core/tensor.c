// tensor.c: allocation, views and shape bookkeeping for dt_tensor.
#include "dtrain/tensor.h"

#include <stdio.h>
#include <string.h>

static dt_status count_elems(int ndim, const int64_t *shape, size_t *out) {
    if (ndim < 0 || ndim > DT_TENSOR_MAX_DIMS)
        return dt_fail(DT_ERR_ARG, "tensor: expected 0 to %d dimensions, found %d",
                       DT_TENSOR_MAX_DIMS, ndim);
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return dt_fail(DT_ERR_ARG, "tensor: dimension %d is negative (%lld)", i,
                           (long long)shape[i]);
        if (!dt_size_mul(&n, n, (size_t)shape[i]) || n > SIZE_MAX / sizeof(float))
            return dt_fail(DT_ERR_ARG, "tensor: element count overflows at dimension %d", i);
    }
    *out = n;
    return DT_OK;
}

static void set_shape(dt_tensor *t, int ndim, const int64_t *shape, size_t n) {
    t->ndim = ndim;
    for (int i = 0; i < DT_TENSOR_MAX_DIMS; i++)
        t->shape[i] = i < ndim ? shape[i] : 1;
    t->numel = n;
}

dt_status dt_tensor_init(dt_tensor *t, int ndim, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    size_t n;
    DT_TRY(count_elems(ndim, shape, &n));
    t->data = dt_alloc_zero(n * sizeof(float));
    if (!t->data)
        return DT_ERR_NOMEM;
    set_shape(t, ndim, shape, n);
    t->owns = true;
    return DT_OK;
}

dt_status dt_tensor_view(dt_tensor *t, float *data, int ndim, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    size_t n;
    DT_TRY(count_elems(ndim, shape, &n));
    t->data = data;
    set_shape(t, ndim, shape, n);
    t->owns = false;
    return DT_OK;
}

void dt_tensor_free(dt_tensor *t) {
    if (!t)
        return;
    if (t->owns)
        dt_free(t->data);
    memset(t, 0, sizeof *t);
}

dt_status dt_tensor_reshape(dt_tensor *t, int ndim, const int64_t *shape) {
    size_t n;
    DT_TRY(count_elems(ndim, shape, &n));
    if (n != t->numel) {
        char a[64];
        return dt_fail(DT_ERR_ARG, "tensor reshape: %s holds %zu elements, new shape holds %zu",
                       dt_tensor_shape_str(t, a, sizeof a), t->numel, n);
    }
    set_shape(t, ndim, shape, n);
    return DT_OK;
}

void dt_tensor_fill(dt_tensor *t, float v) {
    for (size_t i = 0; i < t->numel; i++)
        t->data[i] = v;
}

dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
    if (dst->numel != src->numel)
        return dt_fail(DT_ERR_ARG,
                       "tensor copy: expected %zu elements in the destination, found %zu",
                       src->numel, dst->numel);
    memmove(dst->data, src->data, src->numel * sizeof(float));
    return DT_OK;
}

const char *dt_tensor_shape_str(const dt_tensor *t, char *buf, size_t n) {
    size_t off = 0;
    int    w   = snprintf(buf, n, "(");
    off        = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < t->ndim && off < n; i++) {
        w = snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        if (w > 0)
            off += (size_t)w;
    }
    if (off < n)
        snprintf(buf + off, n - off, ")");
    return buf;
}
