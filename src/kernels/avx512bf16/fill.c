// fill.c: the avx512bf16 target's rows (AVX-512 with VDPBF16PS): the bf16 products.
#include "kernels/fill.h"

void dt_kfill_avx512bf16(dt_ktab *t) {
    (void)t;
}
