// reduce.h: comm's kernels, in one unit: the element-wise reductions every collective
// algorithm uses (sum, avg, max, min, prod over float32, int32 and int64; the 16-bit
// gradient compression of src/ddp sums its widened blocks with them too), the division
// that ends an average, and the copy that the shared-memory algorithms stream with.
// Each entry point is a plain function over plain buffers; the loops are the kernel
// table's rows (reduce, reduce_sum2, reduce_div: src/kernels/vec/reduce.c), so DT_ISA
// caps them like every other kernel.
#ifndef DTRAIN_COMM_REDUCE_H
#define DTRAIN_COMM_REDUCE_H

#include "dtrain/comm.h"

// dst[i] = a[i] op b[i] for i < count. dst may be a or b (the same pointer), but must
// not otherwise overlap them. op is SUM, MAX, MIN or PROD (AVG adds like SUM: the caller
// divides with dt_reduce_div). The operand order is part of the result only for floats
// (a + b == b + a bitwise, but callers keep a fixed rank order anyway so that sums of
// three or more operands are reproducible). Integer SUM/PROD wrap around (two's
// complement). MAX/MIN on floats: NaN in either operand gives NaN (like torch.maximum).
void dt_reduce(dt_dtype dtype, dt_reduce_op op, void *dst, const void *a, const void *b,
               size_t count);

// out = the reduction of in[0], ..., in[nin-1], element by element, in `order`:
//   DT_ORDER_ANY (rank order):  ((in[0] op in[1]) op in[2]) op ...
//   DT_ORDER_TREE:              in[k] op= in[k + h] for h = the largest power of two
//                               below nin, then h/2, ..., 1; the result is in[0]
//                               (comm.h, dt_reduce_order; for 4: (x0+x2) + (x1+x3)).
// AVG is the SUM divided by nin (integers: truncated). Written to out1 and to out2 when
// not NULL; an output may alias an input at the same position (in place), never
// partially. nt: write out2 with non-temporal stores (large results nobody reads soon);
// the caller then fences with dt_store_fence before handing them on. nin >= 1.
void dt_reduce_n(void *out1, void *out2, bool nt, const void *const *in, int nin, size_t count,
                 dt_dtype dtype, dt_reduce_op op, dt_reduce_order order);

// buf[i] /= divisor for float32 (AVG: sum, then divide, as Gloo does). Integer dtypes
// are left alone (the process group refuses AVG on them).
void dt_reduce_div(dt_dtype dtype, void *buf, size_t count, int divisor);

// memcpy, with non-temporal stores when nt (whole cache lines go to memory without
// first being read into the cache).
void dt_copy_nt(void *dst, const void *src, size_t nbytes, bool nt);
// Orders earlier non-temporal stores before later stores.
void dt_store_fence(void);

#endif // DTRAIN_COMM_REDUCE_H
