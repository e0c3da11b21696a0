// table.c: building and naming the kernel tables (table.h).
//
// The host's tables are built together on first use: for every cap, the fill steps below
// run in order (ref, then each target up the levels) when the CPU has the step's target
// and the cap allows it; a row a step changes is recorded as that target's. The steps are
// the one list of what each target contributes: a new target adds its lines here and a
// folder under src/kernels (docs/kernels.md).
#include "kernels/table.h"
#include "kernels/fill.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

typedef struct fill_step {
    dt_isa target;
    void (*fill)(dt_ktab *t);
} fill_step;

static const fill_step host_steps[] = {
    {DT_ISA_REF, dt_kvec_fill_ref},
    {DT_ISA_REF, dt_kfill_ref},
#if defined(__x86_64__)
    {DT_ISA_AVX2, dt_kvec_fill_avx2},
    {DT_ISA_AVX2, dt_kfill_avx2},
    {DT_ISA_AVX512, dt_kvec_fill_avx512},
    {DT_ISA_AVX512, dt_kfill_avx512},
    {DT_ISA_AVX512BF16, dt_kfill_avx512bf16},
    {DT_ISA_AMX, dt_kfill_amx},
#elif defined(__aarch64__)
    {DT_ISA_NEON, dt_kvec_fill_neon},
    {DT_ISA_NEON, dt_kfill_neon},
#endif
// oneDNN's convolutions, where it is built: measured faster on AVX2, unmeasured above
#if defined(__x86_64__) && defined(DT_HAVE_DNNL)
    {DT_ISA_AVX2, dt_kfill_dnnl},
    {DT_ISA_AVX512, dt_kfill_dnnl_off},
#endif
};

// ------------------------------------------------------------------ rows by index

#define ROW_OP_(name, type, op, variant) op,
static const char *const row_ops[DT_KROW_COUNT_] = {DT_KROWS(ROW_OP_)};
#undef ROW_OP_
#define ROW_VARIANT_(name, type, op, variant) variant,
static const char *const row_variants[DT_KROW_COUNT_] = {DT_KROWS(ROW_VARIANT_)};
#undef ROW_VARIANT_

static bool row_set(const dt_ktab *t, dt_krow r) {
    switch (r) {
#define ROW_SET_(name, type, op, variant)                                                          \
    case DT_KROW_##name:                                                                           \
        return t->name != NULL;
        DT_KROWS(ROW_SET_)
#undef ROW_SET_
    default:
        return false;
    }
}

// Runs one fill on t and records `who` as the source of every row it changed.
static void apply(dt_ktab *t, void (*fill)(dt_ktab *t), const char *who) {
    dt_ktab before = *t;
    fill(t);
#define ROW_MARK_(name, type, op, variant)                                                         \
    if (t->name != before.name) {                                                                  \
        t->from[DT_KROW_##name] = who;                                                             \
        if (t->how[DT_KROW_##name] == before.how[DT_KROW_##name])                                  \
            t->how[DT_KROW_##name] = NULL;                                                         \
    }
    DT_KROWS(ROW_MARK_)
#undef ROW_MARK_
}

// ------------------------------------------------------------------ the host's tables

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static dt_ktab        host_capped[DT_ISA_COUNT_]; // [cap]
static dt_ktab        host_only[DT_ISA_COUNT_];   // [target]

static bool has(dt_isa t) {
    return dt_cpu_get()->has[t];
}

static void build_host(void) {
    for (int cap = 0; cap < DT_ISA_COUNT_; cap++)
        for (size_t i = 0; i < sizeof host_steps / sizeof host_steps[0]; i++) {
            const fill_step *s = &host_steps[i];
            if (has(s->target) && (int)s->target <= cap)
                apply(&host_capped[cap], s->fill, dt_isa_name(s->target));
        }
    for (size_t i = 0; i < sizeof host_steps / sizeof host_steps[0]; i++) {
        const fill_step *s = &host_steps[i];
        if (has(s->target))
            apply(&host_only[s->target], s->fill, dt_isa_name(s->target));
    }
}

const dt_ktab *dt_ktab_only(dt_isa t) {
    if (t < 0 || t >= DT_ISA_COUNT_ || !has(t))
        return NULL;
    pthread_once(&host_once, build_host);
    return &host_only[t];
}

// ------------------------------------------------------------------ other devices

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *name;
    void (*fill)(dt_ktab *t);
    dt_ktab table;
    bool    built;
} devs[DT_KDEV_COUNT_];

dt_status dt_kdev_add(dt_kdev dev, const char *name, void (*fill)(dt_ktab *t)) {
    if (dev <= DT_KDEV_HOST || dev >= DT_KDEV_COUNT_ || !name || !fill)
        return dt_fail(DT_ERR_ARG,
                       "kernels: expected a device 1 to %d, a name and a fill "
                       "function",
                       DT_KDEV_COUNT_ - 1);
    pthread_mutex_lock(&dev_lock);
    bool taken = devs[dev].fill != NULL;
    if (!taken) {
        devs[dev].name = name;
        devs[dev].fill = fill;
    }
    pthread_mutex_unlock(&dev_lock);
    if (taken)
        return dt_fail(DT_ERR_STATE, "kernels: device %d already has kernels (%s)", (int)dev,
                       devs[dev].name);
    return DT_OK;
}

const dt_ktab *dt_ktab_get(dt_kdev dev, dt_isa cap) {
    if (dev == DT_KDEV_HOST) {
        if (cap < 0 || cap >= DT_ISA_COUNT_)
            return NULL;
        pthread_once(&host_once, build_host);
        return &host_capped[cap];
    }
    if (dev < 0 || dev >= DT_KDEV_COUNT_)
        return NULL;
    pthread_mutex_lock(&dev_lock);
    const dt_ktab *t = NULL;
    if (devs[dev].fill) {
        if (!devs[dev].built) {
            apply(&devs[dev].table, devs[dev].fill, devs[dev].name);
            devs[dev].built = true;
        }
        t = &devs[dev].table;
    }
    pthread_mutex_unlock(&dev_lock);
    return t;
}

const dt_ktab *dt_k(void) {
    static const dt_ktab *_Atomic cur;
    const dt_ktab                *t = atomic_load_explicit(&cur, memory_order_acquire);
    if (!t) {
        t = dt_ktab_get(DT_KDEV_HOST, dt_isa_top());
        atomic_store_explicit(&cur, t, memory_order_release);
    }
    return t;
}

// ------------------------------------------------------------------ naming

const char *dt_krow_op(dt_krow r) {
    return r >= 0 && r < DT_KROW_COUNT_ ? row_ops[r] : "?";
}

const char *dt_krow_describe(const dt_ktab *t, dt_krow r, char *buf, size_t n) {
    if (r < 0 || r >= DT_KROW_COUNT_ || !t || !row_set(t, r)) {
        snprintf(buf, n, "%s: none", dt_krow_op(r));
        return buf;
    }
    const char *how = t->how[r] ? t->how[r] : row_variants[r];
    snprintf(buf, n, "%s: %s%s%s", row_ops[r], t->from[r], *how ? "/" : "", how);
    return buf;
}

const char *dt_ktab_summary(char *buf, size_t n) {
    const dt_ktab *t                    = dt_k();
    int            count[DT_ISA_COUNT_] = {0};
    for (int r = 0; r < DT_KROW_COUNT_; r++)
        for (int i = 0; i < DT_ISA_COUNT_; i++)
            if (row_set(t, (dt_krow)r) && strcmp(t->from[r], dt_isa_name((dt_isa)i)) == 0)
                count[i]++;
    size_t k = (size_t)snprintf(buf, n, "rows:");
    for (int i = 0; i < DT_ISA_COUNT_ && k < n; i++)
        if (count[i])
            k += (size_t)snprintf(buf + k, n - k, "%s %s %d", k > 5 ? "," : "",
                                  dt_isa_name((dt_isa)i), count[i]);
    return buf;
}

const char *dt_kernels_describe(char *buf, size_t n) {
    char cpu[256], rows[128];
    snprintf(buf, n, "%s; %s", dt_cpu_describe(cpu, sizeof cpu),
             dt_ktab_summary(rows, sizeof rows));
    return buf;
}
