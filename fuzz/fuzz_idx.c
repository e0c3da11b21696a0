// fuzz_idx.c: libFuzzer target for the IDX parser (plain and gzip) over arbitrary
// bytes. Every input must either parse into consistent dims and data or fail with a
// DT_ERR_FORMAT message naming the input; nothing else (crash, leak, huge allocation,
// other status) is acceptable. A read limited to the first record must fail exactly
// when the whole read fails (the gzip CRC-32 and every size are checked under a limit
// too) and, when both succeed, hold the same first record.
#include "dtrain/data.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_idx    x, first;
    dt_status st = dt_idx_parse(data, size, "fuzz", &x);
    if (st == DT_OK) {
        size_t total = 1;
        for (int i = 1; i < x.ndim; i++)
            total *= x.dims[i];
        if (x.ndim < 1 || x.ndim > DT_IDX_MAX_DIMS || x.record_bytes != total ||
            x.nrecords != x.dims[0])
            abort();
        // Touch every byte so the sanitizers see an undersized buffer.
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < x.nrecords * x.record_bytes; i++)
            sum ^= x.data[i];
        (void)sum;
    } else if (st != DT_ERR_FORMAT || strncmp(dt_last_error(), "fuzz: ", 6) != 0) {
        abort();
    }
    dt_status sf = dt_idx_parse_first(data, size, "fuzz", 1, &first);
    if (sf != st || (sf && strncmp(dt_last_error(), "fuzz: ", 6) != 0))
        abort();
    if (sf == DT_OK) {
        size_t keep = x.nrecords < 1 ? x.nrecords : 1;
        if (first.nrecords != keep || first.ndim != x.ndim ||
            memcmp(first.dims, x.dims, sizeof x.dims) != 0 ||
            memcmp(first.data, x.data, keep * x.record_bytes) != 0)
            abort();
    }
    dt_idx_free(&first);
    dt_idx_free(&x);
    return 0;
}
