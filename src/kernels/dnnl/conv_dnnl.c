// conv_dnnl.c: oneDNN's convolutions as the kernel table's provider rows (conv_ext_*),
// built where oneDNN is found (Debian's libdnnl-dev), filled on AVX2 CPUs only.
//
// Chosen by measurement (bench/dnnl_conv.c, bench/RESULTS.md: an AMD Zen 3, one thread,
// oneDNN 2.6.3's jit:avx2 with its reorders from and to NCHW, against dtrain's AVX2
// kernels of main 161fbbc): 3x3 convolutions with 16 or more input channels at stride 2
// (where dtrain runs im2col + GEMM) ran 1.4-2.9x faster forward and backward; at stride 1
// dtrain's direct kernels are level forward (1.0-1.4x) and oneDNN wins backward with 32
// or more input channels (1.3-1.8x per sample); 16-channel backward at stride 1
// (1.1-1.3x), 1x1 convolutions and the 1-channel stems did not reach 1.2x and stay
// dtrain's. On AVX-512 CPUs oneDNN was not measured: the rows are taken out there.
//
// Invariance. A call computes its samples as one oneDNN primitive with one OpenMP thread
// (omp_set_num_threads(1) on each calling thread: dtrain's threads are the parallelism),
// so a sample's forward output and input gradient do not depend on which other samples
// share the call (the tests check it bit for bit). The weight gradient is oneDNN's sum
// over the call's samples, added to dw: under gradient shards the graph calls backward
// once per sample, so a shard's gradient is the same sequence of additions whatever the
// thread or process count.
//
// Primitives are made per thread (a thread-local cache keyed by shape, batch and
// direction), with the layouts oneDNN prefers and reorders from and to dtrain's NCHW /
// OIHW around each call, CHUNK samples at a time; the reordered copies and oneDNN's
// scratchpad live in one workspace per thread (see tcache). A failure (oneDNN refuses a
// shape, memory) turns the provider off for the process with a warning, and the caller
// runs its own path.
#include "dtrain/core.h"
#include "kernels/fill.h"
#include "kernels/table.h"

#include <oneapi/dnnl/dnnl.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

void omp_set_num_threads(int n); // libgomp, which Debian's oneDNN runs on

// A call's samples run CHUNK at a time, and the remainder one at a time: the primitives
// are then of batch CHUNK or 1 only (two per shape and direction, so the cache needs no
// eviction), and the workspace holds CHUNK samples' copies, not a whole batch's
// (bench/RESULTS.md: with whole batches of 128 it was 9.5 MiB on the ResNet).
enum { KIND_FWD, KIND_BWD_DATA, KIND_BWD_WEIGHTS, CHUNK = 16 };

// One argument: the caller's buffer (its handle set per call) and, when oneDNN wants
// another layout, oneDNN's memory (at byte `off` of the thread's workspace) and the
// reorder between the two.
typedef struct arg {
    int              id;
    bool             out;
    dnnl_memory_t    user, prim;
    dnnl_primitive_t re;
    size_t           off;
} arg;

typedef struct entry {
    dt_kconv         p;
    int              n, h, w, kind;
    dnnl_primitive_t prim;
    int              nargs;
    arg              a[4];
    dnnl_memory_t    scratch;         // oneDNN's scratchpad (user mode), NULL where it needs none
    size_t           scratch_off, ws; // its place in the workspace; the bytes e needs there
    float           *dw, *db;         // backward weights: oneDNN's result, added to the caller's
    size_t           nw;
} entry;

// A thread's primitives, stream and workspace, freed when the thread ends. The workspace
// holds the reordered copies and the scratchpad of whichever primitive runs: one buffer,
// grown to the largest entry's need, instead of one set per primitive (bench/RESULTS.md:
// per primitive they were 60 MiB on the ResNet).
typedef struct tcache {
    entry       **e;
    int           n, cap;
    dnnl_stream_t s;
    void         *ws;
    size_t        wscap;
    float        *acc; // the weight gradient summed over a call's chunks
    size_t        acccap;
} tcache;

static atomic_bool           broken;
static _Thread_local tcache *tc;
static dnnl_engine_t         eng;
static dnnl_primitive_attr_t attr; // the scratchpad in the caller's hands (the workspace)
static pthread_key_t         tc_key;
static pthread_once_t        eng_once = PTHREAD_ONCE_INIT;

static void entry_free(entry *e);

static void tcache_free(void *v) {
    tcache *c = v;
    for (int i = 0; i < c->n; i++)
        entry_free(c->e[i]);
    if (c->s)
        dnnl_stream_destroy(c->s);
    free(c->e);
    free(c->ws);
    free(c->acc);
    free(c);
}

static void make_engine(void) {
    // DT_ISA's cap for oneDNN too: its JIT would otherwise pick AVX-512 where the CPU has it
    dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    if (pthread_key_create(&tc_key, tcache_free) != 0 ||
        dnnl_primitive_attr_create(&attr) != dnnl_success ||
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success ||
        dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success)
        eng = NULL;
}

// This thread's cache, made on its first call (with its stream and one OpenMP thread).
static tcache *thread_cache(void) {
    if (tc)
        return tc;
    pthread_once(&eng_once, make_engine);
    tcache *c = eng ? calloc(1, sizeof *c) : NULL;
    if (!c || dnnl_stream_create(&c->s, eng, dnnl_stream_default_flags) != dnnl_success) {
        free(c);
        return NULL;
    }
    omp_set_num_threads(1);
    pthread_setspecific(tc_key, c);
    return tc = c;
}

static void give_up(const char *what) {
    if (!atomic_exchange(&broken, true))
        DT_WARN("kernels", "oneDNN: %s failed: its convolutions are off for this process", what);
}

static bool plain(dnnl_memory_desc_t *md, int nd, dnnl_dim_t a, dnnl_dim_t b, dnnl_dim_t h,
                  dnnl_dim_t w, bool any) {
    dnnl_dims_t dims = {a, b, h, w};
    return dnnl_memory_desc_init_by_tag(md, nd, dims, dnnl_f32,
                                        any       ? dnnl_format_tag_any
                                        : nd == 4 ? dnnl_abcd
                                                  : dnnl_a) == dnnl_success;
}

enum { WS_ALIGN = 64 };

// n bytes of the workspace for e: their offset
static size_t ws_take(entry *e, size_t n) {
    size_t off = e->ws;
    e->ws += (n + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
    return off;
}

// the argument `id` of e, in oneDNN's layout (query q, index i) against the user's md
static bool add_arg(entry *e, const_dnnl_primitive_desc_t pd, int id, dnnl_query_t q, int i,
                    const dnnl_memory_desc_t *user_md, bool out) {
    arg                      *a  = &e->a[e->nargs++];
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, q, i);
    a->id = id, a->out = out;
    if (!md || dnnl_memory_create(&a->user, user_md, eng, DNNL_MEMORY_NONE) != dnnl_success)
        return false;
    if (dnnl_memory_desc_equal(md, user_md)) {
        a->prim = a->user;
        return true;
    }
    if (dnnl_memory_create(&a->prim, md, eng, DNNL_MEMORY_NONE) != dnnl_success)
        return false;
    a->off = ws_take(e, dnnl_memory_desc_get_size(md));
    dnnl_primitive_desc_t rpd;
    if (dnnl_reorder_primitive_desc_create(&rpd, out ? md : user_md, eng, out ? user_md : md, eng,
                                           NULL) != dnnl_success)
        return false;
    dnnl_status_t st = dnnl_primitive_create(&a->re, rpd);
    dnnl_primitive_desc_destroy(rpd);
    return st == dnnl_success;
}

// e's scratchpad, where it needs one
static bool add_scratch(entry *e, const_dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t                    n  = md ? dnnl_memory_desc_get_size(md) : 0;
    if (n == 0)
        return true;
    e->scratch_off = ws_take(e, n);
    return dnnl_memory_create(&e->scratch, md, eng, DNNL_MEMORY_NONE) == dnnl_success;
}

static void entry_free(entry *e) {
    for (int i = 0; i < e->nargs; i++) {
        if (e->a[i].re)
            dnnl_primitive_destroy(e->a[i].re);
        if (e->a[i].prim && e->a[i].prim != e->a[i].user)
            dnnl_memory_destroy(e->a[i].prim);
        if (e->a[i].user)
            dnnl_memory_destroy(e->a[i].user);
    }
    if (e->scratch)
        dnnl_memory_destroy(e->scratch);
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    free(e->dw);
    free(e);
}

// field by field: a dt_kconv's padding bytes are not set by the callers
static bool same_conv(const dt_kconv *a, const dt_kconv *b) {
    return a->cin == b->cin && a->cout == b->cout && a->kh == b->kh && a->kw == b->kw &&
           a->sh == b->sh && a->sw == b->sw && a->ph == b->ph && a->pw == b->pw &&
           a->groups == b->groups && a->bias == b->bias;
}

// The output's height and width for an input of h x w.
static void out_hw(const dt_kconv *p, int h, int w, int *ho, int *wo) {
    *ho = (h + 2 * p->ph - p->kh) / p->sh + 1;
    *wo = (w + 2 * p->pw - p->kw) / p->sw + 1;
}

// The primitive of (p, n, h, w, kind), made on first use by this thread.
static entry *lookup(const dt_kconv *p, int n, int h, int w, int kind) {
    tcache *c = thread_cache();
    if (!c)
        return give_up("an engine or stream"), NULL;
    for (int i = 0; i < c->n; i++) {
        entry *e = c->e[i];
        if (e->n == n && e->h == h && e->w == w && e->kind == kind && same_conv(&e->p, p))
            return e;
    }
    int ho, wo;
    out_hw(p, h, w, &ho, &wo);
    dnnl_memory_desc_t ux, uw, ub, uy, ax, aw, ab, ay;
    bool ok = plain(&ux, 4, n, p->cin, h, w, false) && plain(&ax, 4, n, p->cin, h, w, true) &&
              plain(&uw, 4, p->cout, p->cin, p->kh, p->kw, false) &&
              plain(&aw, 4, p->cout, p->cin, p->kh, p->kw, true) &&
              plain(&ub, 1, p->cout, 0, 0, 0, false) && plain(&ab, 1, p->cout, 0, 0, 0, true) &&
              plain(&uy, 4, n, p->cout, ho, wo, false) && plain(&ay, 4, n, p->cout, ho, wo, true);
    dnnl_dims_t               st = {p->sh, p->sw}, pad = {p->ph, p->pw};
    dnnl_convolution_desc_t   fd, od;
    dnnl_primitive_desc_t     fpd = NULL, pd = NULL;
    const dnnl_memory_desc_t *bias = p->bias ? &ab : NULL;
    ok                             = ok &&
         dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                            &ax, &aw, bias, &ay, st, pad, pad) == dnnl_success &&
         dnnl_primitive_desc_create(&fpd, &fd, attr, eng, NULL) == dnnl_success;
    if (ok && kind == KIND_FWD)
        pd = fpd, fpd = NULL;
    else if (ok && kind == KIND_BWD_DATA)
        ok = dnnl_convolution_backward_data_desc_init(&od, dnnl_convolution_direct, &ax, &aw, &ay,
                                                      st, pad, pad) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &od, attr, eng, fpd) == dnnl_success;
    else if (ok)
        ok = dnnl_convolution_backward_weights_desc_init(&od, dnnl_convolution_direct, &ax, &aw,
                                                         bias, &ay, st, pad, pad) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &od, attr, eng, fpd) == dnnl_success;
    entry *e = ok ? calloc(1, sizeof *e) : NULL;
    if (e) {
        e->p = *p, e->n = n, e->h = h, e->w = w, e->kind = kind;
        ok = dnnl_primitive_create(&e->prim, pd) == dnnl_success && add_scratch(e, pd);
        if (kind == KIND_FWD)
            ok =
                ok && add_arg(e, pd, DNNL_ARG_SRC, dnnl_query_src_md, 0, &ux, false) &&
                add_arg(e, pd, DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, &uw, false) &&
                (!p->bias || add_arg(e, pd, DNNL_ARG_BIAS, dnnl_query_weights_md, 1, &ub, false)) &&
                add_arg(e, pd, DNNL_ARG_DST, dnnl_query_dst_md, 0, &uy, true);
        else if (kind == KIND_BWD_DATA)
            ok = ok && add_arg(e, pd, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, &uy, false) &&
                 add_arg(e, pd, DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, &uw, false) &&
                 add_arg(e, pd, DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, &ux, true);
        else {
            e->nw = (size_t)p->cout * p->cin * p->kh * p->kw;
            ok    = ok && (e->dw = malloc(sizeof(float) * (e->nw + (size_t)p->cout))) &&
                 add_arg(e, pd, DNNL_ARG_SRC, dnnl_query_src_md, 0, &ux, false) &&
                 add_arg(e, pd, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, &uy, false) &&
                 add_arg(e, pd, DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, &uw, true) &&
                 (!p->bias ||
                  add_arg(e, pd, DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1, &ub, true));
            if (e->dw)
                e->db = e->dw + e->nw;
        }
    }
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        if (e)
            entry_free(e);
        return give_up("making a convolution primitive"), NULL;
    }
    if (c->n == c->cap) {
        int     cap = c->cap ? 2 * c->cap : 16;
        entry **ne  = realloc(c->e, sizeof *ne * (size_t)cap);
        if (!ne) {
            entry_free(e);
            return give_up("growing the primitive cache"), NULL;
        }
        c->e = ne, c->cap = cap;
    }
    c->e[c->n++] = e;
    return e;
}

// This thread's workspace, grown (never shrunk) to n bytes.
static bool workspace(size_t n) {
    if (n <= tc->wscap)
        return true;
    free(tc->ws);
    tc->ws    = aligned_alloc(WS_ALIGN, (n + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN);
    tc->wscap = tc->ws ? n : 0;
    return tc->ws != NULL;
}

// Runs e on the buffers, in e->a's order; the reorders around it.
static bool run(entry *e, void *const *data) {
    dnnl_stream_t   s = tc->s;
    dnnl_exec_arg_t ex[5];
    bool            ok = workspace(e->ws);
    char           *ws = tc->ws;
    for (int i = 0; i < e->nargs && ok; i++) {
        arg *a = &e->a[i];
        ok     = dnnl_memory_set_data_handle(a->user, data[i]) == dnnl_success &&
             (a->prim == a->user ||
              dnnl_memory_set_data_handle(a->prim, ws + a->off) == dnnl_success);
        ex[i] = (dnnl_exec_arg_t){a->id, a->prim};
        if (ok && a->re && !a->out) {
            dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, a->user}, {DNNL_ARG_TO, a->prim}};
            ok                   = dnnl_primitive_execute(a->re, s, 2, r) == dnnl_success;
        }
    }
    int nex = e->nargs;
    if (ok && e->scratch) {
        ok        = dnnl_memory_set_data_handle(e->scratch, ws + e->scratch_off) == dnnl_success;
        ex[nex++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch};
    }
    ok = ok && dnnl_primitive_execute(e->prim, s, nex, ex) == dnnl_success;
    for (int i = 0; i < e->nargs && ok; i++) {
        arg *a = &e->a[i];
        if (a->re && a->out) {
            dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, a->prim}, {DNNL_ARG_TO, a->user}};
            ok                   = dnnl_primitive_execute(a->re, s, 2, r) == dnnl_success;
        }
    }
    ok = ok && dnnl_stream_wait(s) == dnnl_success;
    if (!ok)
        give_up("running a convolution");
    return ok;
}

// ------------------------------------------------------------------ the rows

// oneDNN's memory takes a non-const handle; inputs are only read through it
static void *in(const float *p) {
    return (void *)(uintptr_t)p;
}

// 3x3, no groups, 16 input channels or more, stride 2; backward also at stride 1 from 32
// input channels: where oneDNN won by 1.2x or more. On by default (DT_CONV_DNNL=0 turns it
// off): the ResNet's CPU time 0.91x and its peak RSS within 2 MiB of dtrain's own kernels
// (bench/RESULTS.md).
static bool conv_ok(const dt_kconv *p, int w, bool backward) {
    (void)w, (void)backward;
    int choice = 0;
    if (dt_setting_choice("DT_CONV_DNNL", &choice) != DT_OK)
        dt_clear_error(); // reported where the settings are read at start-up
    bool strided = p->sh == 2 && p->sw == 2;
    return choice == 1 && !atomic_load(&broken) && p->kh == 3 && p->kw == 3 && p->groups == 1 &&
           p->cin >= 16 && (strided || (backward && p->cin >= 32));
}

// one sample's output floats (cout x oh x ow) for an input of h x w
static size_t out_floats(const dt_kconv *p, int h, int w) {
    int ho, wo;
    out_hw(p, h, w, &ho, &wo);
    return (size_t)p->cout * (size_t)ho * (size_t)wo;
}

// samples in the chunk that starts at s0 of n
static int chunk_len(int s0, int n) {
    return n - s0 >= CHUNK ? CHUNK : 1;
}

static bool conv_fwd(const dt_kconv *p, int n, int h, int w, const float *x, const float *wt,
                     const float *b, float *y) {
    size_t xs = (size_t)p->cin * h * w, ys = out_floats(p, h, w);
    for (int s0 = 0, ns; s0 < n; s0 += ns) {
        ns             = chunk_len(s0, n);
        entry *e       = lookup(p, ns, h, w, KIND_FWD);
        float *yc      = y + (size_t)s0 * ys;
        void  *data[4] = {in(x + (size_t)s0 * xs), in(wt), p->bias ? in(b) : yc, yc};
        if (!e || !run(e, data))
            return false; // the caller's path then computes all of y
    }
    return true;
}

// The weight gradient is summed in the thread's acc over the chunks and added to dw and
// db at the end, so that a failure part way leaves them as they were for the caller's path.
static bool conv_bwd(const dt_kconv *p, int n, int h, int w, const float *x, const float *wt,
                     const float *dy, float *dx, float *dw, float *db) {
    size_t xs = (size_t)p->cin * h * w, ys = out_floats(p, h, w);
    size_t nw = (size_t)p->cout * p->cin * p->kh * p->kw, na = nw + (p->bias ? (size_t)p->cout : 0);
    if (!thread_cache())
        return give_up("an engine or stream"), false;
    if (na > tc->acccap) {
        free(tc->acc);
        tc->acc    = malloc(sizeof(float) * na);
        tc->acccap = tc->acc ? na : 0;
        if (!tc->acc)
            return give_up("a weight-gradient buffer"), false;
    }
    float *acc = tc->acc;
    for (int s0 = 0, ns; s0 < n; s0 += ns) {
        ns        = chunk_len(s0, n);
        entry *ew = lookup(p, ns, h, w, KIND_BWD_WEIGHTS);
        entry *ed = dx ? lookup(p, ns, h, w, KIND_BWD_DATA) : NULL;
        if (!ew || (dx && !ed))
            return false;
        const float *xc = x + (size_t)s0 * xs, *dyc = dy + (size_t)s0 * ys;
        void        *dd[3] = {in(dyc), in(wt), dx ? dx + (size_t)s0 * xs : NULL};
        if (dx && !run(ed, dd))
            return false;
        void *dwd[4] = {in(xc), in(dyc), ew->dw, ew->db};
        if (!run(ew, dwd))
            return false;
        for (size_t i = 0; i < na; i++) // ew->db follows ew->dw
            acc[i] = s0 == 0 ? ew->dw[i] : acc[i] + ew->dw[i];
    }
    for (size_t i = 0; i < nw; i++)
        dw[i] += acc[i];
    for (int o = 0; p->bias && o < p->cout; o++)
        db[o] += acc[nw + o];
    return true;
}

void dt_kfill_dnnl(dt_ktab *t) {
    t->conv_ext_ok  = conv_ok;
    t->conv_ext_fwd = conv_fwd;
    t->conv_ext_bwd = conv_bwd;
}

void dt_kfill_dnnl_off(dt_ktab *t) {
    t->conv_ext_ok  = NULL;
    t->conv_ext_fwd = NULL;
    t->conv_ext_bwd = NULL;
}
