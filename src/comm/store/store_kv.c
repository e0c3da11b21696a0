// store_kv.c: the key-value table of the store server and the file store (a chained
// hash table of byte strings).
#include "comm/store/store_impl.h"
#include "core/le.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Parses a whole decimal int64 ("-12"); false otherwise.
bool dt_store_parse_i64(const uint8_t *p, size_t n, int64_t *out) {
    if (n == 0 || n > 20)
        return false;
    char tmp[24];
    memcpy(tmp, p, n);
    tmp[n] = '\0';
    char *end;
    errno       = 0;
    long long v = strtoll(tmp, &end, 10);
    if (errno || *end || end == tmp)
        return false;
    *out = v;
    return true;
}

// ---------------------------------------------------------------- key-value table

static size_t kv_hash(const char *k, size_t nbuckets) {
    return (size_t)(dt_token_hash(k) & (nbuckets - 1));
}

dt_kv_entry *dt_kv_find(const dt_kv_map *m, const char *key) {
    if (!m->nbuckets)
        return NULL;
    for (dt_kv_entry *e = m->buckets[kv_hash(key, m->nbuckets)]; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

static dt_status kv_grow(dt_kv_map *m) {
    size_t        nb = m->nbuckets ? m->nbuckets * 2 : 64;
    dt_kv_entry **b  = dt_alloc_zero(nb * sizeof *b);
    if (!b)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        dt_kv_entry *e = m->buckets[i];
        while (e) {
            dt_kv_entry *next = e->next;
            size_t       h    = kv_hash(e->key, nb);
            e->next           = b[h];
            b[h]              = e;
            e                 = next;
        }
    }
    dt_free(m->buckets);
    m->buckets  = b;
    m->nbuckets = nb;
    return DT_OK;
}

// Sets key to a copy of val (plus a NUL byte after it, so values read as C strings).
dt_status dt_kv_set(dt_kv_map *m, const char *key, size_t keylen, const void *val, size_t len) {
    char kbuf[DT_STORE_MAX_KEY + 1];
    memcpy(kbuf, key, keylen);
    kbuf[keylen]  = '\0';
    uint8_t *copy = dt_alloc(len + 1);
    if (!copy)
        return DT_ERR_NOMEM;
    if (len)
        memcpy(copy, val, len);
    copy[len]      = 0;
    dt_kv_entry *e = dt_kv_find(m, kbuf);
    if (e) {
        dt_free(e->val);
        e->val = copy;
        e->len = len;
        return DT_OK;
    }
    if (m->count + 1 > m->nbuckets && kv_grow(m) != DT_OK) {
        dt_free(copy);
        return DT_ERR_NOMEM;
    }
    e       = dt_alloc_zero(sizeof *e);
    char *k = dt_strdup(kbuf);
    if (!e || !k) {
        dt_free(e);
        dt_free(k);
        dt_free(copy);
        return DT_ERR_NOMEM;
    }
    e->key        = k;
    e->val        = copy;
    e->len        = len;
    size_t h      = kv_hash(k, m->nbuckets);
    e->next       = m->buckets[h];
    m->buckets[h] = e;
    m->count++;
    return DT_OK;
}

bool dt_kv_delete(dt_kv_map *m, const char *key) {
    if (!m->nbuckets)
        return false;
    dt_kv_entry **pp = &m->buckets[kv_hash(key, m->nbuckets)];
    for (; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key) == 0) {
            dt_kv_entry *e = *pp;
            *pp            = e->next;
            dt_free(e->key);
            dt_free(e->val);
            dt_free(e);
            m->count--;
            return true;
        }
    }
    return false;
}

void dt_kv_free(dt_kv_map *m) {
    for (size_t i = 0; i < m->nbuckets; i++) {
        dt_kv_entry *e = m->buckets[i];
        while (e) {
            dt_kv_entry *next = e->next;
            dt_free(e->key);
            dt_free(e->val);
            dt_free(e);
            e = next;
        }
    }
    dt_free(m->buckets);
    memset(m, 0, sizeof *m);
}

// Key of a message part as a C string in buf (parts are validated to be <= MAX_KEY).
const char *dt_store_part_key(const uint8_t *p, uint32_t len, char buf[DT_STORE_MAX_KEY + 1]) {
    memcpy(buf, p, len);
    buf[len] = '\0';
    return buf;
}

// Applies an ADD to the table; *out = new value. DT_ERR_FORMAT if not an integer.
dt_status dt_kv_add(dt_kv_map *m, const char *key, int64_t delta, int64_t *out) {
    dt_kv_entry *e   = dt_kv_find(m, key);
    int64_t      cur = 0;
    if (e && !dt_store_parse_i64(e->val, e->len, &cur))
        return dt_fail(DT_ERR_FORMAT,
                       "add \"%s\": the key holds a value that is not a decimal "
                       "integer",
                       key);
    int64_t nv = (int64_t)((uint64_t)cur + (uint64_t)delta);
    char    txt[24];
    int     n = snprintf(txt, sizeof txt, "%" PRId64, nv);
    if (dt_kv_set(m, key, strlen(key), txt, (size_t)n) != DT_OK)
        return dt_fail(DT_ERR_NOMEM, "add \"%s\": out of memory", key);
    *out = nv;
    return DT_OK;
}

// Applies a compare-and-set; *swapped says whether it happened.
dt_status dt_kv_cas(dt_kv_map *m, const char *key, bool expect_present, const uint8_t *exp,
                    size_t explen, const uint8_t *des, size_t deslen, bool *swapped) {
    dt_kv_entry *e = dt_kv_find(m, key);
    bool         eq =
        expect_present ? (e && e->len == explen && memcmp(e->val, exp, explen) == 0) : (e == NULL);
    *swapped = false;
    if (!eq)
        return DT_OK;
    if (dt_kv_set(m, key, strlen(key), des, deslen) != DT_OK)
        return dt_fail(DT_ERR_NOMEM, "compare_set \"%s\": out of memory", key);
    *swapped = true;
    return DT_OK;
}
