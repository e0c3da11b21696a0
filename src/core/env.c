// env.c: strict number parsing for environment variables and command-line flags.
// Every failure names the variable or flag, the expected form and what was found.
#include "dtrain/core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

dt_status dt_parse_long(const char *s, long lo, long hi, const char *what, long *out) {
    if (!s || !*s)
        return dt_fail(DT_ERR_ARG, "%s expects an integer in [%ld, %ld], found nothing", what, lo,
                       hi);
    char *end;
    errno  = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return dt_fail(DT_ERR_ARG, "%s expects an integer in [%ld, %ld], found \"%s\"", what, lo,
                       hi, s);
    *out = v;
    return DT_OK;
}

dt_status dt_parse_double(const char *s, double lo, double hi, const char *what, double *out) {
    if (!s || !*s)
        return dt_fail(DT_ERR_ARG, "%s expects a number in [%g, %g], found nothing", what, lo, hi);
    char *end;
    errno    = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || !isfinite(v) || v < lo || v > hi)
        return dt_fail(DT_ERR_ARG, "%s expects a number in [%g, %g], found \"%s\"", what, lo, hi,
                       s);
    *out = v;
    return DT_OK;
}

dt_status dt_env_int(const char *name, long lo, long hi, long def, long *out) {
    const char *s = getenv(name);
    if (!s || !*s) {
        *out = def;
        return DT_OK;
    }
    return dt_parse_long(s, lo, hi, name, out);
}
