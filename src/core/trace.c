// The trace recorder (include/dtrain/trace.h): per-thread chunked span buffers behind
// one global flag, and their serialization as Chrome-trace events.
//
// Each thread that records gets a record of its own on first use (registered under a
// mutex, the only lock). Its spans go into 4096-event chunks; the chunk's fill count is
// published with a release store after each event, so dt_trace_serialize on another
// thread reads only complete events. Records live until the next dt_trace_start or
// dt_trace_reset; a thread notices a new generation and registers again.
#include "dtrain/trace.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK_EVENTS 4096
#define NAME_MAX_LEN 48

typedef struct event {
    const char *cat, *name, *arg_name;
    int64_t     arg;
    uint64_t    t0, dur;
} event;

typedef struct chunk {
    struct chunk *next;
    int           n; // published with a release store
    event         ev[CHUNK_EVENTS];
} chunk;

typedef struct thread_rec {
    struct thread_rec *next;
    int                tid;
    char               name[NAME_MAX_LEN];
    chunk             *head, *tail;
} thread_rec;

int dt_trace_on_;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static thread_rec     *threads;
static int             nthreads;
static uint64_t        generation = 1; // changes when the records are freed
static uint64_t        origin_ns;
static int64_t         max_events = 4000000;
static int64_t         kept, dropped; // atomics

static _Thread_local thread_rec *tl_rec;
static _Thread_local uint64_t    tl_gen;
static _Thread_local char        tl_name[NAME_MAX_LEN];

dt_trace_opts dt_trace_opts_default(void) {
    dt_trace_opts o = {.max_events = 4000000};
    return o;
}

static void free_records(void) {
    for (thread_rec *t = threads; t;) {
        for (chunk *c = t->head; c;) {
            chunk *n = c->next;
            free(c);
            c = n;
        }
        thread_rec *n = t->next;
        free(t);
        t = n;
    }
    threads  = NULL;
    nthreads = 0;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&kept, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&dropped, 0, __ATOMIC_RELAXED);
}

dt_status dt_trace_start(const dt_trace_opts *opts) {
    dt_trace_opts o = opts ? *opts : dt_trace_opts_default();
    if (o.max_events < 0)
        return dt_fail(DT_ERR_ARG, "trace: expected max_events >= 0 (0 = default), found %lld",
                       (long long)o.max_events);
    pthread_mutex_lock(&lock);
    if (__atomic_load_n(&dt_trace_on_, __ATOMIC_RELAXED)) {
        pthread_mutex_unlock(&lock);
        return dt_fail(DT_ERR_STATE, "trace: dt_trace_start while already recording");
    }
    free_records();
    max_events = o.max_events ? o.max_events : 4000000;
    origin_ns  = dt_now_ns();
    __atomic_store_n(&dt_trace_on_, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    return DT_OK;
}

void dt_trace_stop(void) {
    __atomic_store_n(&dt_trace_on_, 0, __ATOMIC_RELEASE);
}

void dt_trace_reset(void) {
    pthread_mutex_lock(&lock);
    __atomic_store_n(&dt_trace_on_, 0, __ATOMIC_RELEASE);
    free_records();
    origin_ns = 0;
    pthread_mutex_unlock(&lock);
}

uint64_t dt_trace_origin(void) {
    return origin_ns;
}

void dt_trace_counts(int64_t *k, int64_t *d) {
    if (k)
        *k = __atomic_load_n(&kept, __ATOMIC_RELAXED);
    if (d)
        *d = __atomic_load_n(&dropped, __ATOMIC_RELAXED);
}

static void copy_name(char *dst, const char *src) {
    size_t n = strlen(src);
    if (n >= NAME_MAX_LEN)
        n = NAME_MAX_LEN - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

void dt_trace_thread_name(const char *name) {
    copy_name(tl_name, name ? name : "");
    if (tl_rec && tl_gen == __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&lock);
        copy_name(tl_rec->name, tl_name);
        pthread_mutex_unlock(&lock);
    }
}

// The calling thread's record, registered on first use in this generation.
static thread_rec *my_record(void) {
    uint64_t g = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (tl_rec && tl_gen == g)
        return tl_rec;
    thread_rec *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    pthread_mutex_lock(&lock);
    if (g != __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) { // freed meanwhile
        pthread_mutex_unlock(&lock);
        free(t);
        return NULL;
    }
    t->tid = nthreads++;
    if (tl_name[0])
        copy_name(t->name, tl_name);
    else {
        char os[16] = "thread";
        pthread_getname_np(pthread_self(), os, sizeof os);
        snprintf(t->name, sizeof t->name, "%.16s (%d)", os, t->tid);
    }
    // Appended, so the first thread that records (usually main) is listed first.
    thread_rec **pp = &threads;
    while (*pp)
        pp = &(*pp)->next;
    *pp = t;
    pthread_mutex_unlock(&lock);
    tl_rec = t;
    tl_gen = g;
    return t;
}

void dt_trace_span(const char *cat, const char *name, const char *arg_name, int64_t arg,
                   uint64_t t0_ns) {
    uint64_t now = dt_now_ns();
    if (!__atomic_load_n(&dt_trace_on_, __ATOMIC_RELAXED))
        return;
    if (__atomic_add_fetch(&kept, 1, __ATOMIC_RELAXED) > max_events) {
        __atomic_sub_fetch(&kept, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&dropped, 1, __ATOMIC_RELAXED);
        return;
    }
    thread_rec *t = my_record();
    chunk      *c = t ? t->tail : NULL;
    if (t && (!c || c->n == CHUNK_EVENTS)) {
        chunk *nc = malloc(sizeof *nc);
        if (nc) {
            nc->next = NULL;
            nc->n    = 0;
            pthread_mutex_lock(&lock); // the reader walks the list under the lock
            if (c)
                c->next = nc;
            else
                t->head = nc;
            t->tail = nc;
            pthread_mutex_unlock(&lock);
        }
        c = nc;
    }
    if (!c) {
        __atomic_sub_fetch(&kept, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&dropped, 1, __ATOMIC_RELAXED);
        return;
    }
    event *e    = &c->ev[c->n];
    e->cat      = cat;
    e->name     = name;
    e->arg_name = arg_name;
    e->arg      = arg;
    e->t0       = t0_ns;
    e->dur      = now >= t0_ns ? now - t0_ns : 0;
    __atomic_store_n(&c->n, c->n + 1, __ATOMIC_RELEASE);
}

// ------------------------------------------------------------------ serialization

typedef struct sbuf {
    char  *p;
    size_t n, cap;
    bool   failed;
} sbuf;

static void sb_reserve(sbuf *b, size_t more) {
    if (b->failed || b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return;
    }
    b->p   = p;
    b->cap = cap;
}

static void sb_printf(sbuf *b, const char *fmt, ...) DT_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int  k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if ((size_t)k >= sizeof tmp)
        k = (int)sizeof tmp - 1;
    sb_reserve(b, (size_t)k);
    if (b->failed)
        return;
    memcpy(b->p + b->n, tmp, (size_t)k);
    b->n += (size_t)k;
    b->p[b->n] = 0;
}

// A JSON string literal, quotes included: ", \ and control bytes escaped.
static void sb_json_str(sbuf *b, const char *s) {
    sb_reserve(b, strlen(s) * 6 + 2);
    if (b->failed)
        return;
    char *o = b->p + b->n;
    *o++    = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            o += sprintf(o, "\\u%04x", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o++ = '"';
    *o   = 0;
    b->n = (size_t)(o - b->p);
}

// Nanoseconds as microseconds with three decimals, exactly (no float rounding).
static void sb_us(sbuf *b, int64_t ns) {
    const char *sign = ns < 0 ? "-" : "";
    uint64_t    a    = ns < 0 ? (uint64_t)(-(ns + 1)) + 1 : (uint64_t)ns;
    sb_printf(b, "%s%llu.%03llu", sign, (unsigned long long)(a / 1000),
              (unsigned long long)(a % 1000));
}

static void sep(sbuf *b, bool *first) {
    if (!*first)
        sb_printf(b, ",\n");
    *first = false;
}

dt_status dt_trace_serialize(int rank, int64_t offset_ns, uint64_t origin, char **out,
                             size_t *len) {
    *out       = NULL;
    *len       = 0;
    sbuf b     = {0};
    bool first = true;
    char host[256];
    if (gethostname(host, sizeof host - 1) != 0)
        strcpy(host, "?");
    host[sizeof host - 1] = 0;
    char pname[320];
    snprintf(pname, sizeof pname, "rank %d (%s)", rank, host);
    sep(&b, &first);
    sb_printf(
        &b,
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":", rank);
    sb_json_str(&b, pname);
    sb_printf(&b, "}}");
    sep(&b, &first);
    sb_printf(&b,
              "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
              "\"args\":{\"sort_index\":%d}}",
              rank, rank);
    pthread_mutex_lock(&lock);
    for (const thread_rec *t = threads; t; t = t->next) {
        sep(&b, &first);
        sb_printf(
            &b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
            rank, t->tid);
        sb_json_str(&b, t->name);
        sb_printf(&b, "}}");
        sep(&b, &first);
        sb_printf(&b,
                  "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                  "\"args\":{\"sort_index\":%d}}",
                  rank, t->tid, t->tid);
        for (const chunk *c = t->head; c; c = c->next) {
            int n = __atomic_load_n(&c->n, __ATOMIC_ACQUIRE);
            for (int i = 0; i < n; i++) {
                const event *e = &c->ev[i];
                sep(&b, &first);
                sb_printf(&b, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"name\":", rank, t->tid);
                sb_json_str(&b, e->name ? e->name : "?");
                sb_printf(&b, ",\"cat\":");
                sb_json_str(&b, e->cat ? e->cat : "");
                sb_printf(&b, ",\"ts\":");
                sb_us(&b, (int64_t)(e->t0 - origin) + offset_ns);
                sb_printf(&b, ",\"dur\":");
                sb_us(&b, (int64_t)e->dur);
                if (e->arg_name) {
                    sb_printf(&b, ",\"args\":{");
                    sb_json_str(&b, e->arg_name);
                    sb_printf(&b, ":%lld}", (long long)e->arg);
                }
                sb_printf(&b, "}");
            }
        }
    }
    pthread_mutex_unlock(&lock);
    if (b.failed) {
        free(b.p);
        return dt_fail(DT_ERR_NOMEM, "trace: out of memory serializing %lld spans",
                       (long long)__atomic_load_n(&kept, __ATOMIC_RELAXED));
    }
    *out = b.p;
    *len = b.n;
    return DT_OK;
}
