// alloc.c: the caching allocator of device memory. cudaMalloc and cudaFree are slow
// (cudaFree synchronises the device), so freed blocks are kept in free lists by size
// class and handed out again: after the first training step, a step allocates nothing
// from CUDA. Sizes are rounded up to a class: multiples of 512 bytes up to 8 KiB, then
// four classes per power of two (at most 25% more than asked for). A request that
// cudaMalloc cannot meet first gives every cached block back and tries once more.
//
// A block must not be freed while work queued on a stream still uses it (the caller
// waits for the stream first): freeing does not synchronise, which is the point.
#include "cuda/cuda_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64
#define NCLASSES    (16 + 4 * 51) // 16 small classes, then 4 per power of two above 8 KiB
#define LIVE_MIN    1024          // live-table slots at first (a power of two)

typedef struct block {
    void         *p;
    size_t        size; // the class size
    struct block *next;
} block;

typedef struct pool {
    pthread_mutex_t lock;
    block          *free[NCLASSES];
    block          *spare; // block records to reuse
    // Live blocks by address: open addressing, linear probing, tombstones (p == 1).
    block **live;
    size_t  live_cap, live_n, live_used;
    size_t  held, in_use; // bytes from CUDA, and handed out
} pool;

static pool           pools[MAX_DEVICES];
static pthread_once_t pools_once = PTHREAD_ONCE_INIT;
static block *const   TOMB       = (block *)1;

static void init_pools(void) {
    for (int d = 0; d < MAX_DEVICES; d++)
        pthread_mutex_init(&pools[d].lock, NULL);
}

// The class of a size and the class's size.
static int class_of(size_t bytes, size_t *csize) {
    if (bytes <= 8192) {
        size_t k = bytes ? (bytes + 511) / 512 : 1; // 1..16
        *csize   = k * 512;
        return (int)k - 1;
    }
    int    e    = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); // 2^e < bytes <= 2^(e+1)
    size_t base = (size_t)1 << e, step = base / 4;
    size_t q = (bytes - base + step - 1) / step; // 1..4
    *csize   = base + q * step;
    return 16 + 4 * (e - 13) + (int)q - 1;
}

static size_t hash_ptr(const void *p, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

static bool live_grow(pool *pl) {
    size_t  cap = pl->live_cap ? 2 * pl->live_cap : LIVE_MIN;
    block **t   = cu_host->alloc_zero(cap * sizeof *t);
    if (!t)
        return false;
    for (size_t i = 0; i < pl->live_cap; i++) {
        block *b = pl->live[i];
        if (!b || b == TOMB)
            continue;
        size_t j = hash_ptr(b->p, cap);
        while (t[j])
            j = (j + 1) & (cap - 1);
        t[j] = b;
    }
    cu_host->free(pl->live);
    pl->live      = t;
    pl->live_cap  = cap;
    pl->live_used = pl->live_n;
    return true;
}

static bool live_add(pool *pl, block *b) {
    if ((pl->live_used + 1) * 2 > pl->live_cap && !live_grow(pl))
        return false;
    size_t j = hash_ptr(b->p, pl->live_cap);
    while (pl->live[j] && pl->live[j] != TOMB)
        j = (j + 1) & (pl->live_cap - 1);
    if (!pl->live[j])
        pl->live_used++;
    pl->live[j] = b;
    pl->live_n++;
    return true;
}

static block *live_take(pool *pl, const void *p) {
    if (!pl->live_cap)
        return NULL;
    for (size_t j = hash_ptr(p, pl->live_cap);; j = (j + 1) & (pl->live_cap - 1)) {
        block *b = pl->live[j];
        if (!b)
            return NULL;
        if (b != TOMB && b->p == p) {
            pl->live[j] = TOMB;
            pl->live_n--;
            return b;
        }
    }
}

static void release_cached(int dev, pool *pl) {
    for (int c = 0; c < NCLASSES; c++)
        while (pl->free[c]) {
            block *b    = pl->free[c];
            pl->free[c] = b->next;
            cudaError_t e;
            if ((e = cudaFree(b->p)) != cudaSuccess)
                CU_LOG(DT_LOG_WARN, "cudaFree on device %d: %s", dev, cudaGetErrorString(e));
            pl->held -= b->size;
            b->next   = pl->spare;
            pl->spare = b;
        }
}

dt_status cu_mem_alloc(int dev, size_t bytes, void **out) {
    *out = NULL;
    pthread_once(&pools_once, init_pools);
    DT_TRY(cu_use(dev));
    size_t csize;
    int    c  = class_of(bytes, &csize);
    pool  *pl = &pools[dev];
    pthread_mutex_lock(&pl->lock);
    block *b = pl->free[c];
    if (b) {
        pl->free[c] = b->next;
    } else {
        if ((b = pl->spare) != NULL)
            pl->spare = b->next;
        else if (!(b = cu_host->alloc(sizeof *b))) {
            pthread_mutex_unlock(&pl->lock);
            return DT_ERR_NOMEM;
        }
        cudaError_t e = cudaMalloc(&b->p, csize);
        if (e == cudaErrorMemoryAllocation) { // the cache back to CUDA, and once more
            cudaGetLastError();
            release_cached(dev, pl);
            e = cudaMalloc(&b->p, csize);
        }
        if (e != cudaSuccess) {
            b->next   = pl->spare;
            pl->spare = b;
            pthread_mutex_unlock(&pl->lock);
            return cu_fail(cu_status_of(e),
                           "cudaMalloc of %zu bytes on device %d (%zu held by dtrain): %s", csize,
                           dev, pl->held, cudaGetErrorString(e));
        }
        b->size = csize;
        pl->held += csize;
        cu_mem_trim_at_exit(); // the first block of a device: the runtime has started
    }
    if (!live_add(pl, b)) {
        b->next     = pl->free[c];
        pl->free[c] = b;
        pthread_mutex_unlock(&pl->lock);
        return DT_ERR_NOMEM;
    }
    pl->in_use += b->size;
    pthread_mutex_unlock(&pl->lock);
    *out = b->p;
    return DT_OK;
}

void cu_mem_free(int dev, void *p) {
    if (!p || dev < 0 || dev >= MAX_DEVICES)
        return;
    pool *pl = &pools[dev];
    pthread_mutex_lock(&pl->lock);
    block *b = live_take(pl, p);
    if (b) {
        size_t csize;
        int    c    = class_of(b->size, &csize);
        b->next     = pl->free[c];
        pl->free[c] = b;
        pl->in_use -= b->size;
    }
    pthread_mutex_unlock(&pl->lock);
    if (!b)
        CU_LOG(DT_LOG_ERROR, "dt_device_free: %p is no block of device %d (freed twice?)", p, dev);
}

size_t cu_mem_held(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES)
        return 0;
    pthread_once(&pools_once, init_pools);
    pool *pl = &pools[dev];
    pthread_mutex_lock(&pl->lock);
    size_t h = pl->held;
    pthread_mutex_unlock(&pl->lock);
    return h;
}

void cu_mem_trim(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES)
        return;
    pthread_once(&pools_once, init_pools);
    if (cu_use(dev) != DT_OK)
        return;
    pool *pl = &pools[dev];
    pthread_mutex_lock(&pl->lock);
    release_cached(dev, pl);
    pthread_mutex_unlock(&pl->lock);
}

// At exit: every device's cached blocks back to CUDA, so that what a leak check finds
// when the context goes is only what was never freed (the cache is not a leak). The
// CUDA runtime's own exit handler was registered when it started, before this one
// (cu_mem_alloc starts it), so it runs after.
static void trim_all(void) {
    for (int d = 0; d < MAX_DEVICES; d++)
        if (pools[d].held)
            cu_mem_trim(d);
}

void cu_mem_trim_at_exit(void) {
    static bool registered;
    if (!__atomic_exchange_n(&registered, true, __ATOMIC_ACQ_REL))
        atexit(trim_all);
}
