// precision.c: the names of the precision modes (core.h's dt_precision).
#include "dtrain/core.h"

#include <string.h>

static const char *const names[] = {"fp32", "bf16", "fp16"};

const char *dt_precision_name(dt_precision p) {
    return (unsigned)p < 3 ? names[p] : "?";
}

dt_status dt_precision_parse(const char *s, dt_precision *out) {
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = (dt_precision)i;
            return DT_OK;
        }
    return dt_fail(DT_ERR_ARG, "precision: expected fp32, bf16 or fp16, found \"%.40s\"",
                   s ? s : "(null)");
}
