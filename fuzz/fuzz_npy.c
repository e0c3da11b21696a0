// fuzz_npy.c: libFuzzer target for the .npy parser over arbitrary bytes. Every input
// must either parse into a consistent array (count the product of the shape, nbytes
// count * elem_size, every byte readable) or fail with a DT_ERR_FORMAT message naming
// the input; nothing else (crash, leak, huge allocation, other status) is acceptable.
// A parsed array must also survive conversion to float32.
#include "dtrain/data.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_npy    a;
    dt_status st = dt_npy_parse(data, size, "fuzz", &a);
    if (st == DT_OK) {
        size_t count = 1;
        for (int i = 0; i < a.ndim; i++)
            count *= a.shape[i];
        if (a.ndim < 0 || a.ndim > DT_NPY_MAX_DIMS || a.count != count ||
            a.elem_size != dt_npy_dtype_size(a.dtype) || a.nbytes != count * a.elem_size ||
            a.nbytes > size)
            abort();
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < a.nbytes; i++)
            sum ^= ((const uint8_t *)a.data)[i];
        (void)sum;
        if (dt_npy_convert(&a, DT_NPY_F32, "fuzz") != DT_OK || a.dtype != DT_NPY_F32)
            abort();
    } else if (st != DT_ERR_FORMAT || strncmp(dt_last_error(), "fuzz: ", 6) != 0) {
        abort();
    }
    dt_npy_free(&a);
    return 0;
}
