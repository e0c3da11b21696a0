// alloc.c: the one allocator. 64-byte aligned (a cache line, and an AVX-512 vector),
// counted, and able to fail on purpose (DT_FAIL_ALLOC_AFTER=N) so that error paths
// run in tests instead of being hoped for.
#include "dtrain/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DT_ALIGN 64
// From this size on, blocks are aligned to 2 MiB and asked to be backed by transparent
// huge pages (where the system leaves that to madvise): one page fault per 2 MiB
// instead of 512. Faults on fresh memory are what a data set and a model's activations
// cost at start-up, and on some virtual machines each one is expensive.
#define DT_HUGE_MIN   ((size_t)4 << 20)
#define DT_HUGE_ALIGN ((size_t)2 << 20)

static atomic_size_t live_count;
static atomic_size_t total_count;
static atomic_long   fail_after = -2; // -2: not read yet; -1: never fail

static bool should_fail(void) {
    long f = atomic_load(&fail_after);
    if (f == -2) {
        long v = -1;
        if (dt_setting_int("DT_FAIL_ALLOC_AFTER", &v) != DT_OK)
            v = -1; // no allocation to report with: a bad value means "never"
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
    size_t align   = nbytes >= DT_HUGE_MIN ? DT_HUGE_ALIGN : DT_ALIGN;
    size_t rounded = (nbytes + align - 1) & ~(align - 1);
    if (rounded < nbytes || rounded == 0)
        rounded = rounded < nbytes ? 0 : DT_ALIGN;
    void *p = rounded ? aligned_alloc(align, rounded) : NULL;
    if (!p) {
        dt_fail(DT_ERR_NOMEM, "out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (align == DT_HUGE_ALIGN)
        madvise(p, rounded, MADV_HUGEPAGE); // a hint: failure only means small pages
#endif
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

// ------------------------------------------------------------------ page-backed blocks

size_t dt_page_bytes(void) {
    long v = sysconf(_SC_PAGESIZE); // from the auxiliary vector: cheap, and no shared state
    return v > 0 ? (size_t)v : 4096;
}

static size_t round_pages(size_t nbytes) {
    size_t pg = dt_page_bytes();
    return nbytes ? (nbytes + pg - 1) / pg * pg : pg;
}

void *dt_alloc_pages(size_t nbytes) {
    if (should_fail()) {
        dt_fail(DT_ERR_NOMEM, "allocation of %zu bytes refused (DT_FAIL_ALLOC_AFTER)", nbytes);
        return NULL;
    }
    size_t len = round_pages(nbytes);
    if (len < nbytes) {
        dt_fail(DT_ERR_NOMEM, "out of memory mapping %zu bytes", nbytes);
        return NULL;
    }
    // NORESERVE: a ZeRO-3 rank maps every parameter and gradient but writes its share.
    void *p =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        dt_fail_errno(DT_ERR_NOMEM, "out of memory mapping %zu bytes", nbytes);
        return NULL;
    }
    atomic_fetch_add(&live_count, 1);
    atomic_fetch_add(&total_count, 1);
    return p;
}

void dt_free_pages(void *p, size_t nbytes) {
    if (!p)
        return;
    atomic_fetch_sub(&live_count, 1);
    munmap(p, round_pages(nbytes));
}

void dt_discard(void *p, size_t nbytes) {
    if (!p || !nbytes)
        return;
    size_t    pg = dt_page_bytes();
    uintptr_t a = (uintptr_t)p, e = a + nbytes;
    uintptr_t a1 = (a + pg - 1) / pg * pg, e1 = e / pg * pg;
    if (a1 >= e1 || madvise((void *)a1, e1 - a1, MADV_DONTNEED) != 0) {
        memset(p, 0, nbytes); // no whole page (or the system refused): zeros only
        return;
    }
    memset(p, 0, a1 - a);
    memset((void *)e1, 0, e - e1);
}

size_t dt_resident_bytes(const void *p, size_t nbytes) {
    if (!p || !nbytes)
        return 0;
    size_t        pg = dt_page_bytes();
    uintptr_t     a = (uintptr_t)p / pg * pg, e = ((uintptr_t)p + nbytes + pg - 1) / pg * pg;
    size_t        n = (e - a) / pg, res = 0;
    unsigned char vec[4096];
    for (size_t i = 0; i < n; i += sizeof vec) {
        size_t k = n - i < sizeof vec ? n - i : sizeof vec;
        if (mincore((void *)(a + i * pg), k * pg, vec) != 0)
            return 0;
        for (size_t j = 0; j < k; j++)
            res += vec[j] & 1;
    }
    return res * pg;
}
