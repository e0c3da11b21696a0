// params.c: the parameter contract (params.h): tensor tables over flat buffers, owned
// or borrowed storage, and the gradient-ready hook that fans out to consumers.
#include "dtrain/params.h"
#include "dtrain/device.h"

#include <stdio.h>
#include <string.h>

typedef struct hook {
    dt_grad_ready_fn fn;
    void            *user;
} hook;

typedef struct table {
    dt_param_info *t;
    int            n, cap;
    size_t         numel;
} table;

struct dt_params {
    table  par, buf;
    float *data, *grads, *buffers;
    bool   owned, ready;
    bool   discard_grads; // dt_params_set_discard_grads
    bool   announces;     // dt_params_set_announces_use
    hook  *hooks;
    int    nhooks, max_hooks;
    // The parameter-use consumer (dt_params_set_use_hook).
    dt_param_use_fn use_fn;
    void           *use_user;
    // Storage on a device (dt_params_bind_device): data, grads and buffers stay NULL.
    dt_device *dev;
    void      *dev_data, *dev_grads, *dev_buffers;
};

dt_params_opts dt_params_opts_default(void) {
    return (dt_params_opts){.max_hooks = 4};
}

dt_status dt_params_new(dt_params **out, const dt_params_opts *opts) {
    *out             = NULL;
    dt_params_opts o = opts ? *opts : dt_params_opts_default();
    if (o.max_hooks == 0)
        o.max_hooks = 4;
    if (o.max_hooks < 1 || o.max_hooks > 64)
        return dt_fail(DT_ERR_ARG, "params: expected max_hooks in [1, 64], found %d", o.max_hooks);
    dt_params *p = dt_alloc_zero(sizeof *p);
    if (!p)
        return DT_ERR_NOMEM;
    p->hooks = dt_alloc_zero(sizeof(hook) * (size_t)o.max_hooks);
    if (!p->hooks) {
        dt_free(p);
        return DT_ERR_NOMEM;
    }
    p->max_hooks = o.max_hooks;
    *out         = p;
    return DT_OK;
}

void dt_params_free(dt_params *p) {
    if (!p)
        return;
    if (p->owned) {
        size_t n = sizeof(float) * (p->par.numel ? p->par.numel : 1);
        dt_free_pages(p->data, n);
        dt_free_pages(p->grads, n);
        dt_free(p->buffers);
    }
    dt_free(p->par.t);
    dt_free(p->buf.t);
    dt_free(p->hooks);
    dt_free(p);
}

static int table_find(const table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->t[i].name, name) == 0)
            return i;
    return -1;
}

dt_status dt_params_add_ex(dt_params *p, const char *name, int ndim, const int64_t *shape,
                           uint32_t flags, int layer, bool buffer) {
    const char *what = buffer ? "buffer" : "parameter";
    if (!p)
        return dt_fail(DT_ERR_ARG, "params: NULL table");
    if (p->ready)
        return dt_fail(DT_ERR_STATE, "params: cannot add %s \"%s\" after the storage is set", what,
                       name ? name : "");
    size_t len = name ? strlen(name) : 0;
    if (len < 1 || len > DT_PARAM_NAME_MAX)
        return dt_fail(DT_ERR_ARG, "params: expected a %s name of 1..%d bytes, found %zu bytes",
                       what, DT_PARAM_NAME_MAX, len);
    if (ndim < 1 || ndim > DT_PARAM_MAX_DIMS || !shape)
        return dt_fail(DT_ERR_ARG, "params: %s \"%s\": expected 1..%d dimensions, found %d", what,
                       name, DT_PARAM_MAX_DIMS, shape ? ndim : 0);
    if (flags & ~(uint32_t)(DT_PARAM_FROZEN | DT_PARAM_NO_DECAY))
        return dt_fail(DT_ERR_ARG, "params: %s \"%s\": unknown flags 0x%x", what, name, flags);
    table *t = buffer ? &p->buf : &p->par;
    if (table_find(&p->par, name) >= 0 || table_find(&p->buf, name) >= 0)
        return dt_fail(DT_ERR_ARG, "params: expected unique tensor names, found \"%s\" twice",
                       name);
    size_t count = 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 1 || !dt_size_mul(&count, count, (size_t)shape[d]))
            return dt_fail(DT_ERR_ARG,
                           "params: %s \"%s\": expected dimensions >= 1, found %lld in "
                           "dimension %d (or an overflowing size)",
                           what, name, (long long)shape[d], d);
    size_t end;
    if (!dt_size_add(&end, t->numel, count) || end > SIZE_MAX / sizeof(float) / 4)
        return dt_fail(DT_ERR_ARG, "params: %s \"%s\": the table grows too large", what, name);
    if (t->n == t->cap) {
        int            cap = t->cap ? 2 * t->cap : 16;
        dt_param_info *n   = dt_alloc(sizeof *n * (size_t)cap);
        if (!n)
            return DT_ERR_NOMEM;
        if (t->n)
            memcpy(n, t->t, sizeof *n * (size_t)t->n);
        dt_free(t->t);
        t->t   = n;
        t->cap = cap;
    }
    dt_param_info *e = &t->t[t->n++];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, len + 1);
    e->offset = t->numel;
    e->count  = count;
    e->ndim   = ndim;
    for (int d = 0; d < DT_PARAM_MAX_DIMS; d++)
        e->shape[d] = d < ndim ? shape[d] : 1;
    e->layer     = layer;
    e->flags     = flags;
    e->trainable = !buffer && !(flags & DT_PARAM_FROZEN);
    t->numel     = end;
    return DT_OK;
}

dt_status dt_params_add(dt_params *p, const char *name, int ndim, const int64_t *shape,
                        uint32_t flags) {
    return dt_params_add_ex(p, name, ndim, shape, flags, -1, false);
}

dt_status dt_params_add_buffer(dt_params *p, const char *name, int ndim, const int64_t *shape,
                               uint32_t flags) {
    return dt_params_add_ex(p, name, ndim, shape, flags, -1, true);
}

dt_status dt_params_set_split(dt_params *p, int i, const dt_param_split *split) {
    if (!p || !split || i < 0 || i >= p->par.n)
        return dt_fail(DT_ERR_ARG,
                       "params: expected a table, a split and a parameter index below "
                       "%d, found index %d",
                       p ? p->par.n : 0, i);
    if (p->ready)
        return dt_fail(DT_ERR_STATE, "params: cannot split \"%s\" after the storage is set",
                       p->par.t[i].name);
    dt_param_info *e = &p->par.t[i];
    dt_param_split s = *split;
    int            g = s.groups ? s.groups : 1;
    if (s.parts < 0 || (s.parts > 1 && (s.part < 0 || s.part >= s.parts || s.axis < 0 ||
                                        s.axis >= e->ndim || g < 1 || e->shape[s.axis] % g)))
        return dt_fail(DT_ERR_ARG,
                       "params: \"%s\": expected 0 <= part < parts, an axis below %d and its "
                       "dimension divisible by the groups; found part %d of %d, axis %d, %d groups",
                       e->name, e->ndim, s.part, s.parts, s.axis, g);
    e->split = s.parts > 1 ? s : (dt_param_split){0};
    return DT_OK;
}

bool dt_param_split_on(const dt_param_split *s) {
    return s && s->parts > 1;
}

void dt_param_split_whole_shape(const dt_param_split *s, int ndim, const int64_t *part,
                                int64_t *whole) {
    for (int d = 0; d < ndim; d++)
        whole[d] = part[d] * (dt_param_split_on(s) && d == s->axis ? s->parts : 1);
}

void dt_param_split_copy(const dt_param_split *s, int ndim, const int64_t *part_shape, float *whole,
                         float *part, bool to_whole) {
    size_t outer = 1, inner = 1;
    for (int d = 0; d < ndim; d++)
        if (!dt_param_split_on(s) || d < s->axis)
            outer *= (size_t)part_shape[d];
        else if (d > s->axis)
            inner *= (size_t)part_shape[d];
    if (!dt_param_split_on(s)) { // the part is the whole
        if (to_whole)
            memcpy(whole, part, sizeof(float) * outer);
        else
            memcpy(part, whole, sizeof(float) * outer);
        return;
    }
    // Along the axis: the part's index j is piece row j % lo of block j / lo; in the
    // whole, that block starts at (j / lo) * blk and the piece at part * lo within it.
    size_t ax = (size_t)part_shape[s->axis], groups = (size_t)(s->groups ? s->groups : 1);
    size_t lo = ax / groups, blk = lo * (size_t)s->parts, wax = ax * (size_t)s->parts;
    for (size_t o = 0; o < outer; o++)
        for (size_t j = 0; j < ax; j++) {
            size_t wj = (j / lo) * blk + (size_t)s->part * lo + j % lo;
            float *w = whole + (o * wax + wj) * inner, *q = part + (o * ax + j) * inner;
            if (to_whole)
                memcpy(w, q, sizeof(float) * inner);
            else
                memcpy(q, w, sizeof(float) * inner);
        }
}

dt_status dt_params_alloc(dt_params *p) {
    if (!p || p->ready)
        return dt_fail(DT_ERR_STATE, "params: storage already set (or NULL table)");
    size_t n = p->par.numel, nb = p->buf.numel, bytes = sizeof(float) * (n ? n : 1);
    p->data    = dt_alloc_pages(bytes); // zeroed; pages appear as they are written
    p->grads   = dt_alloc_pages(bytes);
    p->buffers = nb ? dt_alloc_zero(sizeof(float) * nb) : NULL;
    p->owned   = true;
    if (!p->data || !p->grads || (nb && !p->buffers)) {
        dt_free_pages(p->data, bytes), dt_free_pages(p->grads, bytes), dt_free(p->buffers);
        p->data = p->grads = p->buffers = NULL;
        return DT_ERR_NOMEM;
    }
    p->ready = true;
    return DT_OK;
}

dt_status dt_params_bind(dt_params *p, float *params, float *grads, float *buffers) {
    if (!p || p->ready)
        return dt_fail(DT_ERR_STATE, "params: storage already set (or NULL table)");
    size_t n = p->par.numel, nb = p->buf.numel;
    if ((n && (!params || !grads)) || (nb && !buffers))
        return dt_fail(DT_ERR_ARG,
                       "params: expected storage for %zu parameters and %zu buffer floats, "
                       "found a NULL pointer",
                       n, nb);
    if (n && params < grads + n && grads < params + n)
        return dt_fail(DT_ERR_ARG,
                       "params: expected separate parameter and gradient buffers, found "
                       "overlapping ones");
    p->data    = params;
    p->grads   = grads;
    p->buffers = nb ? buffers : NULL;
    p->owned   = false;
    p->ready   = true;
    return DT_OK;
}

bool dt_params_ready(const dt_params *p) {
    return p && p->ready;
}

// NULL and a recorded error for storage on a device: host code must not touch it.
static float *host_view(dt_params *p, float *f, const char *what) {
    if (p->dev)
        dt_fail(DT_ERR_STATE, "params: the %s live on %s (dt_params_device_%s, dt_params_to_host)",
                what, dt_device_name(p->dev), what[0] == 'p' ? "data" : what);
    return f;
}
float *dt_params_data(dt_params *p) {
    return host_view(p, p->data, "parameters");
}
float *dt_params_grads(dt_params *p) {
    return host_view(p, p->grads, "grads");
}
float *dt_params_buffers(dt_params *p) {
    return host_view(p, p->buffers, "buffers");
}
size_t dt_params_numel(const dt_params *p) {
    return p->par.numel;
}
size_t dt_params_buffer_numel(const dt_params *p) {
    return p->buf.numel;
}
int dt_params_count(const dt_params *p) {
    return p->par.n;
}
int dt_params_buffer_count(const dt_params *p) {
    return p->buf.n;
}
const dt_param_info *dt_params_info(const dt_params *p, int i) {
    return i >= 0 && i < p->par.n ? &p->par.t[i] : NULL;
}
const dt_param_info *dt_params_buffer_info(const dt_params *p, int i) {
    return i >= 0 && i < p->buf.n ? &p->buf.t[i] : NULL;
}
int dt_params_find(const dt_params *p, const char *name) {
    return name ? table_find(&p->par, name) : -1;
}

size_t dt_params_trainable_numel(const dt_params *p) {
    size_t n = 0;
    for (int i = 0; i < p->par.n; i++)
        n += p->par.t[i].trainable ? p->par.t[i].count : 0;
    return n;
}

void dt_params_zero_grad(dt_params *p) {
    if (p->dev && p->par.numel) {
        if (dt_device_memset(p->dev, p->dev_grads, 0, sizeof(float) * p->par.numel, NULL))
            DT_ERROR("nn", "params: zeroing the gradients on %s: %s", dt_device_name(p->dev),
                     dt_last_error());
    } else if (p->ready && p->par.numel && p->discard_grads)
        dt_params_discard(p, true, 0, p->par.numel);
    else if (p->ready && p->par.numel)
        memset(p->grads, 0, sizeof(float) * p->par.numel);
}

// ------------------------------------------------------------------------- pages

dt_status dt_params_discard(dt_params *p, bool grads, size_t offset, size_t count) {
    size_t n = p->par.numel;
    if (p->dev)
        return dt_fail(DT_ERR_UNSUPPORTED, "params: discard on %s (host storage only)",
                       dt_device_name(p->dev));
    if (!p->ready || offset > n || count > n - offset)
        return dt_fail(DT_ERR_ARG, "params: discard [%zu, %zu) outside the %zu parameters", offset,
                       offset + count, n);
    float *base = grads ? p->grads : p->data;
    if (!count)
        return DT_OK;
    if (!p->owned) {
        memset(base + offset, 0, sizeof(float) * count);
        return DT_OK;
    }
    size_t bytes = sizeof(float) * count;
    if (offset + count == n) { // the padding of the last page goes with it
        size_t pg = dt_page_bytes(), end = sizeof(float) * n;
        bytes += (end + pg - 1) / pg * pg - end;
    }
    dt_discard(base + offset, bytes);
    return DT_OK;
}

size_t dt_params_resident(dt_params *p, bool grads, size_t offset, size_t count) {
    if (p->dev)
        return 0;
    if (!p->ready || offset > p->par.numel || count > p->par.numel - offset)
        return 0;
    return dt_resident_bytes((grads ? p->grads : p->data) + offset, sizeof(float) * count);
}

void dt_params_set_discard_grads(dt_params *p, bool on) {
    p->discard_grads = on;
}

// ------------------------------------------------------------ parameter-use hook

dt_status dt_params_use(dt_params *p, dt_param_use what, bool backward, const int *tensors, int n) {
    if (!p->use_fn)
        return DT_OK;
    for (int i = 0; i < n; i++)
        if (tensors[i] < 0 || tensors[i] >= p->par.n)
            return dt_fail(DT_ERR_ARG, "params: use of tensor %d, expected one of [0, %d)",
                           tensors[i], p->par.n);
    return p->use_fn(p->use_user, what, backward, tensors, n);
}

void dt_params_set_announces_use(dt_params *p, bool on) {
    p->announces = on;
}
bool dt_params_announces_use(const dt_params *p) {
    return p->announces;
}

dt_status dt_params_set_use_hook(dt_params *p, dt_param_use_fn fn, void *user) {
    if (fn && p->use_fn && (p->use_fn != fn || p->use_user != user))
        return dt_fail(DT_ERR_STATE, "params: expected one parameter-use consumer, found a "
                                     "second (is a ZeRO-3 wrapper still alive on these "
                                     "parameters?)");
    p->use_fn   = fn;
    p->use_user = fn ? user : NULL;
    return DT_OK;
}
bool dt_params_has_use_hook(const dt_params *p) {
    return p->use_fn != NULL;
}

bool dt_param_no_decay(const dt_param_info *t, void *user) {
    (void)user;
    return (t->flags & DT_PARAM_NO_DECAY) != 0;
}

dt_status dt_params_grad_ready(dt_params *p, size_t offset, size_t count) {
    if (offset > p->par.numel || count > p->par.numel - offset)
        return dt_fail(DT_ERR_ARG,
                       "params: gradient range [%zu, %zu) is outside the %zu parameters", offset,
                       offset + count, p->par.numel);
    dt_status st = DT_OK;
    for (int i = 0; i < p->nhooks; i++) {
        dt_status s = p->hooks[i].fn(p->hooks[i].user, offset, count);
        if (st == DT_OK)
            st = s;
    }
    return st;
}

dt_status dt_params_add_grad_hook(dt_params *p, dt_grad_ready_fn fn, void *user) {
    if (!fn)
        return dt_fail(DT_ERR_ARG, "params: expected a hook function, found NULL");
    if (p->nhooks == p->max_hooks)
        return dt_fail(DT_ERR_STATE,
                       "params: expected at most %d gradient-ready consumers, found one more "
                       "(is a DDP wrapper still alive on these parameters?)",
                       p->max_hooks);
    p->hooks[p->nhooks++] = (hook){fn, user};
    return DT_OK;
}

void dt_params_remove_grad_hook(dt_params *p, dt_grad_ready_fn fn, void *user) {
    for (int i = 0; i < p->nhooks; i++)
        if (p->hooks[i].fn == fn && p->hooks[i].user == user) {
            memmove(&p->hooks[i], &p->hooks[i + 1], sizeof(hook) * (size_t)(p->nhooks - i - 1));
            p->nhooks--;
            return;
        }
}

// ------------------------------------------------------------------------ devices

dt_status dt_params_bind_device(dt_params *p, dt_device *d, void *params, void *grads,
                                void *buffers) {
    if (!p || p->ready)
        return dt_fail(DT_ERR_STATE, "params: storage already set (or NULL table)");
    if (!d)
        return dt_fail(DT_ERR_ARG, "params: expected a device, found NULL");
    if ((p->par.numel && (!params || !grads)) || (p->buf.numel && !buffers))
        return dt_fail(DT_ERR_ARG,
                       "params: expected device storage for %zu parameters and %zu "
                       "buffer floats, found a NULL pointer",
                       p->par.numel, p->buf.numel);
    p->dev       = d;
    p->dev_data  = params;
    p->dev_grads = grads, p->dev_buffers = p->buf.numel ? buffers : NULL;
    p->owned = false, p->ready = true;
    return DT_OK;
}

dt_device *dt_params_device(const dt_params *p) {
    return p ? p->dev : NULL;
}
void *dt_params_device_data(dt_params *p) {
    return p->dev ? p->dev_data : p->data;
}
void *dt_params_device_grads(dt_params *p) {
    return p->dev ? p->dev_grads : p->grads;
}
void *dt_params_device_buffers(dt_params *p) {
    return p->dev ? p->dev_buffers : p->buffers;
}

// Copies parameters and buffers from `src` to `dst`, tables of one layout.
static dt_status copy_between(dt_params *dst, dt_params *src, const char *what) {
    if (!dst || !src || !dst->ready || !src->ready)
        return dt_fail(DT_ERR_ARG, "%s: expected two tables with storage", what);
    if (dst->par.numel != src->par.numel || dst->buf.numel != src->buf.numel ||
        dst->par.n != src->par.n || dst->buf.n != src->buf.n)
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: expected tables of one layout, found %d tensors of %zu floats (+%zu "
                       "buffer floats) and %d of %zu (+%zu)",
                       what, src->par.n, src->par.numel, src->buf.numel, dst->par.n, dst->par.numel,
                       dst->buf.numel);
    dt_device *d = src->dev ? src->dev : dst->dev;
    if (!d)
        DT_TRY(dt_device_get(&d, "cpu"));
    DT_TRY(dt_device_copy(d, dt_params_device_data(dst), dt_params_device_data(src),
                          sizeof(float) * src->par.numel, NULL));
    return dt_device_copy(d, dt_params_device_buffers(dst), dt_params_device_buffers(src),
                          sizeof(float) * src->buf.numel, NULL);
}

dt_status dt_params_to_host(dt_params *src, dt_params *host) {
    if (host && host->dev)
        return dt_fail(DT_ERR_ARG, "dt_params_to_host: the destination is on %s",
                       dt_device_name(host->dev));
    return copy_between(host, src, "dt_params_to_host");
}

dt_status dt_params_from_host(dt_params *dst, dt_params *host) {
    if (host && host->dev)
        return dt_fail(DT_ERR_ARG, "dt_params_from_host: the source is on %s",
                       dt_device_name(host->dev));
    return copy_between(dst, host, "dt_params_from_host");
}
