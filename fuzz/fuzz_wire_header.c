// fuzz_wire_header.c: arbitrary bytes as a tcp message header: decoding must fail with
// DT_ERR_FORMAT or succeed, never read past the input; what decodes re-encodes to the
// same bytes.
#include "comm/tcp/wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // Copy so the sanitizer sees exactly `size` bytes.
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    dt_wire_header h;
    if (dt_wire_decode(copy, size, &h) == DT_OK) {
        uint8_t again[DT_WIRE_HEADER_BYTES];
        dt_wire_encode(&h, again);
        if (memcmp(again, copy, DT_WIRE_HEADER_BYTES) != 0)
            abort(); // decode and encode disagree
        char fp[200];
        dt_fp_format(&h.fp, fp, sizeof fp);
    }
    free(copy);
    return 0;
}
