// reduce.h: the element-wise reduction kernels every backend shares (tcp's algorithms,
// the shm backend). Hot loops carry DT_CLONES (AVX-512 / AVX2 / baseline at load time).
#ifndef DTRAIN_COMM_REDUCE_H
#define DTRAIN_COMM_REDUCE_H

#include "dtrain/comm.h"

// dst[i] = a[i] op b[i] for i < count. dst may be a or b (the same pointer), but must
// not otherwise overlap them. op is SUM, MAX, MIN or PROD (AVG is the caller's SUM
// followed by dt_reduce_div). The operand order is part of the result only for
// floats (a + b == b + a bitwise, but callers keep a fixed rank order anyway so that
// sums of three or more operands are reproducible). Integer SUM/PROD wrap around.
// MAX/MIN on floats: NaN in either operand gives NaN (like torch.maximum).
void dt_reduce(dt_dtype dtype, dt_reduce_op op, void *dst, const void *a, const void *b,
               size_t count);

// buf[i] /= divisor for float32 (used for AVG: sum then divide, as Gloo does).
// Integer dtypes are left alone (the generic layer refuses AVG on them).
void dt_reduce_div(dt_dtype dtype, void *buf, size_t count, int divisor);

#endif // DTRAIN_COMM_REDUCE_H
