// alloc.c: the one allocator. 64-byte aligned (a cache line, and an AVX-512 vector),
// counted, and able to fail on purpose (DT_FAIL_ALLOC_AFTER=N) so that error paths
// run in tests instead of being hoped for.
#include "dtrain/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define DT_ALIGN 64

static atomic_size_t live_count;
static atomic_size_t total_count;
static atomic_long   fail_after = -2; // -2: not read yet; -1: never fail

static bool should_fail(void) {
    long f = atomic_load(&fail_after);
    if (f == -2) {
        long        v = -1;
        const char *s = getenv("DT_FAIL_ALLOC_AFTER");
        if (s && *s) {
            char *end;
            long  x = strtol(s, &end, 10);
            if (*end == '\0' && x >= 0)
                v = x;
        }
        atomic_store(&fail_after, v);
        f = v;
    }
    if (f < 0)
        return false;
    return (long)atomic_load(&total_count) >= f;
}

void *dt_alloc(size_t nbytes) {
    if (should_fail()) {
        dt_fail(DT_ERR_NOMEM, "allocation of %zu bytes refused (DT_FAIL_ALLOC_AFTER)", nbytes);
        return NULL;
    }
    size_t rounded = (nbytes + DT_ALIGN - 1) & ~(size_t)(DT_ALIGN - 1);
    if (rounded < nbytes || rounded == 0)
        rounded = rounded < nbytes ? 0 : DT_ALIGN;
    void *p = rounded ? aligned_alloc(DT_ALIGN, rounded) : NULL;
    if (!p) {
        dt_fail(DT_ERR_NOMEM, "out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    atomic_fetch_add(&live_count, 1);
    atomic_fetch_add(&total_count, 1);
    return p;
}

void *dt_alloc_zero(size_t nbytes) {
    void *p = dt_alloc(nbytes);
    if (p)
        memset(p, 0, nbytes);
    return p;
}

void dt_free(void *p) {
    if (!p)
        return;
    atomic_fetch_sub(&live_count, 1);
    free(p);
}

size_t dt_alloc_live_count(void) {
    return atomic_load(&live_count);
}
size_t dt_alloc_total_count(void) {
    return atomic_load(&total_count);
}

char *dt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char  *p = dt_alloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}
