// tensor.h: float32 tensors of up to 4 dimensions, contiguous, 64-byte aligned.
// A tensor either owns its buffer (dt_tensor_init) or is a view into memory
// someone else owns (dt_tensor_view); dt_tensor_free frees only what it owns.
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_TENSOR_MAX_DIMS 4

typedef struct dt_tensor {
    float  *data;                      // numel floats, row-major (last dim fastest)
    int     ndim;                      // 0..4; 0 is a scalar with numel 1
    int64_t shape[DT_TENSOR_MAX_DIMS]; // unused dims are 1
    size_t  numel;
    bool    owns; // data was allocated by dt_tensor_init
} dt_tensor;

// Allocates a zeroed tensor of the given shape. Dims must be >= 0 and the element
// count must not overflow; otherwise DT_ERR_ARG naming the shape.
DT_API dt_status dt_tensor_init(dt_tensor *t, int ndim, const int64_t *shape);
// A non-owning view of `data` with the given shape (the caller keeps `data` alive).
DT_API dt_status dt_tensor_view(dt_tensor *t, float *data, int ndim, const int64_t *shape);
DT_API void      dt_tensor_free(dt_tensor *t); // frees owned data; NULL-safe; resets *t

// Changes the shape without moving data; the element count must stay the same.
DT_API dt_status dt_tensor_reshape(dt_tensor *t, int ndim, const int64_t *shape);
DT_API void      dt_tensor_fill(dt_tensor *t, float v);
// Copies src into dst; the element counts must match (shapes may differ).
DT_API dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src);
// Writes "(2, 3, 4)" into buf; returns buf.
DT_API const char *dt_tensor_shape_str(const dt_tensor *t, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_TENSOR_H
