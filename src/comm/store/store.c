// store.c: the handle behind dt_store (comm.h): argument checks, prefix views, and the
// dispatch to the store's kind through its table of operations (store_impl.h): the TCP
// client (store_tcp.c; its server is store_server.c, its protocol store_proto.c) or the
// file store (store_file.c). Also the token and timeout defaults the stores share.
// What this file does not do: anything about ranks; pg_init.c builds rendezvous on top.
#include "comm/store/store_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------------ common bits

uint64_t dt_token_hash(const char *token) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)token; p && *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

const char *dt_token_resolve(const char *opt) {
    const char *t = opt ? opt : dt_setting_str("DT_JOB_TOKEN");
    return (t && *t) ? t : NULL;
}

dt_status dt_default_timeout_ms(int64_t *out) {
    long v;
    // The table's default: 30 minutes, PyTorch's for CPU backends (Gloo, MPI).
    DT_TRY(dt_setting_int("DT_TIMEOUT_MS", &v));
    *out = v == 0 ? 30L * 60 * 1000 : v;
    return DT_OK;
}

static dt_status check_key(const char *key) {
    if (!key)
        return dt_fail(DT_ERR_ARG, "store: expected a key, found NULL");
    size_t n = strlen(key);
    if (n == 0 || n > DT_STORE_MAX_KEY)
        return dt_fail(DT_ERR_ARG, "store: expected a key of 1..%d bytes, found %zu bytes",
                       DT_STORE_MAX_KEY, n);
    return DT_OK;
}

static dt_status check_value(const void *v, size_t n) {
    if (n > DT_STORE_MAX_VALUE)
        return dt_fail(DT_ERR_ARG, "store: expected a value of at most %u bytes, found %zu",
                       DT_STORE_MAX_VALUE, n);
    if (n > 0 && !v)
        return dt_fail(DT_ERR_ARG, "store: value is NULL but its size is %zu", n);
    return DT_OK;
}

// ------------------------------------------------------------------------- handles

dt_store_opts dt_store_opts_default(void) {
    return (dt_store_opts){0};
}

dt_status dt_store_init_base(dt_store *s, const dt_store_ops *ops, const dt_store_opts *o) {
    int64_t timeout = o ? o->timeout_ms : 0;
    if (timeout == 0)
        DT_TRY(dt_default_timeout_ms(&timeout));
    s->ops        = ops;
    s->timeout_ms = timeout;
    return DT_OK;
}

// The store a (possibly nested) prefix view views.
static dt_store *root_of(dt_store *s) {
    while (s && !s->ops)
        s = s->base;
    return s;
}

int dt_store_port(const dt_store *s) {
    while (s && !s->ops)
        s = s->base;
    return s && s->ops->port ? s->ops->port(s) : -1;
}

bool dt_store_local_addr(dt_store *s, char *buf, size_t n) {
    s = root_of(s);
    return s && s->ops->local_addr && s->ops->local_addr(s, buf, n);
}

void dt_store_set_timeout(dt_store *s, int64_t timeout_ms) {
    if (!s)
        return;
    if (timeout_ms == 0 && dt_default_timeout_ms(&timeout_ms) != DT_OK)
        timeout_ms = 30L * 60 * 1000;
    s->timeout_ms = timeout_ms;
}

// ----------------------------------------------------------------------- prefix views

dt_status dt_store_new_prefix(dt_store **out, dt_store *base, const char *prefix) {
    *out = NULL;
    if (!base || !prefix || !*prefix)
        return dt_fail(DT_ERR_ARG, "store prefix: expected a store and a non-empty prefix");
    dt_store *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->base       = base;
    s->timeout_ms = base->timeout_ms;
    if (!(s->prefix = dt_strdup(prefix))) {
        dt_store_free(s);
        return DT_ERR_NOMEM;
    }
    *out = s;
    return DT_OK;
}

// Resolves a prefix chain: *root = the real store, full key in buf.
static dt_status full_key(dt_store *s, const char *key, char *buf, size_t n, dt_store **root) {
    DT_TRY(check_key(key));
    // Collect the prefixes from the innermost view outwards.
    const char *pre[16];
    int         np = 0;
    while (!s->ops) {
        if (np == 16)
            return dt_fail(DT_ERR_ARG, "store: more than 16 nested prefix views");
        pre[np++] = s->prefix;
        s         = s->base;
    }
    size_t off = 0;
    for (int i = np - 1; i >= 0; i--) {
        int k = snprintf(buf + off, n - off, "%s/", pre[i]);
        if (k < 0 || (size_t)k >= n - off)
            goto too_long;
        off += (size_t)k;
    }
    int k = snprintf(buf + off, n - off, "%s", key);
    if (k < 0 || (size_t)k >= n - off || off + (size_t)k > DT_STORE_MAX_KEY)
        goto too_long;
    *root = s;
    return DT_OK;
too_long:
    return dt_fail(DT_ERR_ARG, "store: key \"%.64s...\" with its prefixes exceeds %d bytes", key,
                   DT_STORE_MAX_KEY);
}

// ------------------------------------------------------------------------ operations

dt_status dt_store_set(dt_store *store, const char *key, const void *value, size_t nbytes) {
    if (!store)
        return dt_fail(DT_ERR_ARG, "store set: store is NULL");
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    DT_TRY(check_value(value, nbytes));
    return s->ops->set(s, k, value, nbytes);
}

dt_status dt_store_get(dt_store *store, const char *key, void **value, size_t *nbytes) {
    if (!store || !value)
        return dt_fail(DT_ERR_ARG, "store get: store and value must not be NULL");
    *value = NULL;
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    return s->ops->get(s, k, store->timeout_ms, value, nbytes);
}

static dt_status keys_request(dt_store *store, bool wait, const char *const *keys, size_t nkeys,
                              int64_t timeout_ms, bool *all_exist) {
    if (!store || (nkeys && !keys))
        return dt_fail(DT_ERR_ARG, "store wait/check: store and keys must not be NULL");
    if (nkeys > DT_STORE_MAX_PARTS)
        return dt_fail(DT_ERR_ARG, "store wait/check: expected at most %d keys, found %zu",
                       DT_STORE_MAX_PARTS, nkeys);
    if (timeout_ms == 0)
        timeout_ms = store->timeout_ms;
    dt_store *s = root_of(store);
    // Full keys in one allocation.
    char        *kb   = dt_alloc(nkeys * (DT_STORE_MAX_KEY + 1) + 1);
    const char **full = dt_alloc((nkeys + 1) * sizeof *full);
    dt_status    st   = DT_OK;
    if (!kb || !full) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < nkeys; i++) {
        char     *k = kb + i * (DT_STORE_MAX_KEY + 1);
        dt_store *root;
        st = full_key(store, keys[i], k, DT_STORE_MAX_KEY + 1, &root);
        if (st != DT_OK)
            goto done;
        full[i] = k;
    }
    st = wait ? s->ops->wait(s, full, nkeys, timeout_ms)
              : s->ops->check(s, full, nkeys, timeout_ms, all_exist);
done:
    dt_free(kb);
    dt_free(full);
    return st;
}

dt_status dt_store_wait(dt_store *store, const char *const *keys, size_t nkeys,
                        int64_t timeout_ms) {
    return keys_request(store, true, keys, nkeys, timeout_ms, NULL);
}

dt_status dt_store_check(dt_store *store, const char *const *keys, size_t nkeys, bool *all_exist) {
    if (!all_exist)
        return dt_fail(DT_ERR_ARG, "store check: all_exist must not be NULL");
    return keys_request(store, false, keys, nkeys, 0, all_exist);
}

dt_status dt_store_add(dt_store *store, const char *key, int64_t delta, int64_t *value) {
    if (!store)
        return dt_fail(DT_ERR_ARG, "store add: store is NULL");
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    return s->ops->add(s, k, delta, value);
}

dt_status dt_store_compare_set(dt_store *store, const char *key, const void *expected,
                               size_t expected_nbytes, const void *desired, size_t desired_nbytes,
                               bool *swapped) {
    if (!store || !swapped)
        return dt_fail(DT_ERR_ARG, "store compare_set: store and swapped must not be NULL");
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    DT_TRY(check_value(desired, desired_nbytes));
    DT_TRY(check_value(expected, expected ? expected_nbytes : 0));
    return s->ops->compare_set(s, k, expected, expected_nbytes, desired, desired_nbytes, swapped);
}

dt_status dt_store_delete(dt_store *store, const char *key, bool *deleted) {
    if (!store)
        return dt_fail(DT_ERR_ARG, "store delete: store is NULL");
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    return s->ops->del(s, k, deleted);
}

void dt_store_free(dt_store *s) {
    if (!s)
        return;
    if (s->ops) {
        s->ops->free(s);
        return;
    }
    dt_free(s->prefix);
    dt_free(s);
}
