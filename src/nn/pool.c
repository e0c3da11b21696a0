// pool.c: a fixed set of worker threads woken per task through a generation counter.
// Both the task start and the barrier spin for a short while before sleeping on a
// futex: steps are milliseconds long and start back to back, so a sleeping worker
// would add a wake-up latency to every layer, while a worker that never sleeps
// would steal a core from another process when cores are oversubscribed.
#include "nn/pool.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN_ITERS 4000 // tens of microseconds of pause instructions

struct dt_pool {
    int        n;
    pthread_t *threads;
    dt_pool_fn fn; // the current task; written before `gen` is bumped
    void      *arg;
    // Futex words are plain unsigned ints accessed with __atomic builtins (a futex
    // needs the address of a 32-bit int, which _Atomic types do not promise).
    unsigned    gen;       // task generation: workers run when it changes
    unsigned    done;      // workers finished with the current task
    unsigned    bar_gen;   // barrier generation
    atomic_int  bar_count; // threads arrived at the current barrier
    atomic_bool stop;
};

typedef struct worker_arg {
    dt_pool *pool;
    int      ith;
} worker_arg;

static void futex_wait(unsigned *addr, unsigned expected) {
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(unsigned *addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static unsigned load_acq(unsigned *addr) {
    return __atomic_load_n(addr, __ATOMIC_ACQUIRE);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Waits until *addr differs from `seen`.
static void wait_change(unsigned *addr, unsigned seen) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (load_acq(addr) != seen)
            return;
        cpu_relax();
    }
    while (load_acq(addr) == seen)
        futex_wait(addr, seen);
}

static void *worker_main(void *p) {
    worker_arg *wa   = p;
    dt_pool    *pool = wa->pool;
    int         ith  = wa->ith;
    dt_free(wa);
    pthread_setname_np(pthread_self(), "dt-compute"); // for top -H, gdb and traces
    unsigned seen = 0;
    for (;;) {
        wait_change(&pool->gen, seen);
        seen = load_acq(&pool->gen);
        if (atomic_load(&pool->stop))
            return NULL;
        pool->fn(pool->arg, ith, pool->n);
        if (__atomic_add_fetch(&pool->done, 1, __ATOMIC_ACQ_REL) == (unsigned)pool->n - 1)
            futex_wake_all(&pool->done);
    }
}

dt_pool *dt_pool_init(int nthreads) {
    if (nthreads < 1 || nthreads > 256) {
        dt_fail(DT_ERR_ARG, "thread pool: expected 1 to 256 threads, found %d", nthreads);
        return NULL;
    }
    dt_pool *p = dt_alloc_zero(sizeof *p);
    if (!p)
        return NULL;
    p->n       = nthreads;
    p->threads = dt_alloc_zero(sizeof(pthread_t) * (size_t)nthreads);
    if (!p->threads) {
        dt_free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = dt_alloc(sizeof *wa);
        if (wa)
            *wa = (worker_arg){.pool = p, .ith = i};
        int rc = wa ? pthread_create(&p->threads[i], NULL, worker_main, wa) : ENOMEM;
        if (rc != 0) {
            // pthread_create copied nothing on failure; wa is ours to free.
            dt_free(wa);
            p->n = i;
            dt_pool_free(p);
            dt_fail(DT_ERR_NOMEM, "thread pool: could not start thread %d of %d: %s", i, nthreads,
                    strerror(rc));
            return NULL;
        }
    }
    return p;
}

void dt_pool_free(dt_pool *p) {
    if (!p)
        return;
    atomic_store(&p->stop, true);
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
    futex_wake_all(&p->gen);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    dt_free(p->threads);
    dt_free(p);
}

int dt_pool_size(const dt_pool *p) {
    return p ? p->n : 1;
}

void dt_pool_run(dt_pool *p, dt_pool_fn fn, void *arg) {
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn  = fn;
    p->arg = arg;
    __atomic_store_n(&p->done, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
    futex_wake_all(&p->gen);
    fn(arg, 0, p->n);
    for (;;) {
        unsigned d = load_acq(&p->done);
        if (d == (unsigned)p->n - 1)
            break;
        wait_change(&p->done, d);
    }
}

void dt_pool_barrier(dt_pool *p) {
    if (!p || p->n == 1)
        return;
    unsigned g = load_acq(&p->bar_gen);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == p->n - 1) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        __atomic_add_fetch(&p->bar_gen, 1, __ATOMIC_RELEASE);
        futex_wake_all(&p->bar_gen);
        return;
    }
    wait_change(&p->bar_gen, g);
}
