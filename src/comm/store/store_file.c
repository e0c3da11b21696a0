// store_file.c: the file store (init method file://path), for ranks that share a file
// system but cannot reach each other's ports: an append-only log of checksummed records
// under flock, replayed into a key-value table (store_kv.c) before every operation.
// Waiting is polling the file with a growing sleep (1 to 50 ms).
#include "comm/store/store_impl.h"
#include "core/hmac.h"
#include "core/le.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct file_store {
    dt_store        h;
    pthread_mutex_t mu; // serialises this handle's operations
    char           *path;
    int             ffd;
    uint64_t        read_off; // bytes of the file already applied to kv
    dt_kv_map       kv;
} file_store;

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// ------------------------------------------------------------------------ file store
//
// Record: u32 magic "DTFR" | u8 type (1 set, 2 delete) | 3 zero bytes | u32 key bytes |
// u32 value bytes | key | value | u32 CRC32C of everything before it in the record.

#define FILE_MAGIC     0x52465444u // "DTFR"
#define FILE_REC_SET   1
#define FILE_REC_DEL   2
#define FILE_TOKEN_KEY "\x01token"

static dt_status file_catch_up(file_store *s) {
    struct stat sb;
    if (fstat(s->ffd, &sb) != 0)
        return dt_fail_errno(DT_ERR_IO, "file store %s: fstat", s->path);
    uint64_t size = (uint64_t)sb.st_size;
    if (size == s->read_off)
        return DT_OK;
    if (size < s->read_off)
        return dt_fail(DT_ERR_FORMAT,
                       "file store %s: the file shrank from %llu to %llu bytes "
                       "(truncated or replaced while in use?)",
                       s->path, (unsigned long long)s->read_off, (unsigned long long)size);
    size_t   n   = (size_t)(size - s->read_off);
    uint8_t *buf = dt_alloc(n);
    if (!buf)
        return DT_ERR_NOMEM;
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(s->ffd, buf + got, n - got, (off_t)(s->read_off + got));
        if (k <= 0) {
            dt_free(buf);
            return k == 0 ? dt_fail(DT_ERR_FORMAT, "file store %s: short read", s->path)
                          : dt_fail_errno(DT_ERR_IO, "file store %s: read", s->path);
        }
        got += (size_t)k;
    }
    size_t    off = 0;
    dt_status st  = DT_OK;
    while (off < n) {
        uint64_t at = s->read_off + off;
        if (n - off < 16) {
            st = dt_fail(DT_ERR_FORMAT, "file store %s: truncated record at byte %llu", s->path,
                         (unsigned long long)at);
            break;
        }
        const uint8_t *r    = buf + off;
        uint32_t       klen = dt_get_le32(r + 8), vlen = dt_get_le32(r + 12);
        if (dt_get_le32(r) != FILE_MAGIC || (r[4] != FILE_REC_SET && r[4] != FILE_REC_DEL) ||
            klen == 0 || klen > DT_STORE_MAX_KEY || vlen > DT_STORE_MAX_VALUE) {
            st = dt_fail(DT_ERR_FORMAT,
                         "file store %s: expected a record at byte %llu, found garbage (not a "
                         "dtrain store file?)",
                         s->path, (unsigned long long)at);
            break;
        }
        size_t total = 16 + (size_t)klen + vlen + 4;
        if (n - off < total) {
            st = dt_fail(DT_ERR_FORMAT, "file store %s: truncated record at byte %llu", s->path,
                         (unsigned long long)at);
            break;
        }
        if (dt_get_le32(r + total - 4) != dt_crc32c(0, r, total - 4)) {
            st = dt_fail(DT_ERR_FORMAT,
                         "file store %s: checksum mismatch in the record at byte %llu", s->path,
                         (unsigned long long)at);
            break;
        }
        char key[DT_STORE_MAX_KEY + 1];
        memcpy(key, r + 16, klen);
        key[klen] = '\0';
        if (r[4] == FILE_REC_SET) {
            if (dt_kv_set(&s->kv, key, klen, r + 16 + klen, vlen) != DT_OK) {
                st = dt_fail(DT_ERR_NOMEM, "file store %s: out of memory", s->path);
                break;
            }
        } else {
            dt_kv_delete(&s->kv, key);
        }
        off += total;
    }
    if (st == DT_OK)
        s->read_off = size;
    dt_free(buf);
    return st;
}

static dt_status file_append(file_store *s, uint8_t type, const char *key, const void *val,
                             size_t vlen) {
    size_t   klen  = strlen(key);
    size_t   total = 16 + klen + vlen + 4;
    uint8_t *r     = dt_alloc(total);
    if (!r)
        return DT_ERR_NOMEM;
    memset(r, 0, 16);
    dt_put_le32(r, FILE_MAGIC);
    r[4] = type;
    dt_put_le32(r + 8, (uint32_t)klen);
    dt_put_le32(r + 12, (uint32_t)vlen);
    memcpy(r + 16, key, klen);
    if (vlen)
        memcpy(r + 16 + klen, val, vlen);
    dt_put_le32(r + total - 4, dt_crc32c(0, r, total - 4));
    size_t    done = 0;
    dt_status st   = DT_OK;
    while (done < total) {
        ssize_t k = pwrite(s->ffd, r + done, total - done, (off_t)(s->read_off + done));
        if (k <= 0) {
            st = dt_fail_errno(DT_ERR_IO, "file store %s: write", s->path);
            break;
        }
        done += (size_t)k;
    }
    dt_free(r);
    if (st == DT_OK) {
        // Apply our own record the same way a reader would.
        st = file_catch_up(s);
    }
    return st;
}

// Locks the file (and the handle) and brings the in-memory table up to date.
static dt_status file_lock(file_store *s) {
    pthread_mutex_lock(&s->mu);
    while (flock(s->ffd, LOCK_EX) != 0) {
        if (errno == EINTR)
            continue;
        dt_status st = dt_fail_errno(DT_ERR_IO, "file store %s: flock", s->path);
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    dt_status st = file_catch_up(s);
    if (st != DT_OK) {
        flock(s->ffd, LOCK_UN);
        pthread_mutex_unlock(&s->mu);
    }
    return st;
}

static void file_unlock(file_store *s) {
    flock(s->ffd, LOCK_UN);
    pthread_mutex_unlock(&s->mu);
}

// ------------------------------------------------------------------ the operations

static dt_status file_set(dt_store *h, const char *k, const void *value, size_t nbytes) {
    file_store *s = (file_store *)h;
    DT_TRY(file_lock(s));
    dt_status st = file_append(s, FILE_REC_SET, k, value, nbytes);
    file_unlock(s);
    return st;
}

static dt_status file_wait_keys(file_store *s, const char *const *keys, size_t nkeys,
                                int64_t timeout_ms, void **value, size_t *nbytes) {
    uint64_t dl    = dt_store_deadline(timeout_ms);
    int      delay = 1;
    for (;;) {
        DT_TRY(file_lock(s));
        size_t missing = nkeys;
        for (size_t i = 0; i < nkeys; i++)
            if (dt_kv_find(&s->kv, keys[i]))
                missing--;
        if (missing == 0) {
            dt_status st = DT_OK;
            if (value) {
                dt_kv_entry *e = dt_kv_find(&s->kv, keys[0]);
                *value         = dt_alloc(e->len + 1);
                if (!*value) {
                    st = DT_ERR_NOMEM;
                } else {
                    memcpy(*value, e->val, e->len + 1);
                    if (nbytes)
                        *nbytes = e->len;
                }
            }
            file_unlock(s);
            return st;
        }
        char   msg[600];
        size_t off = 0;
        for (size_t i = 0; i < nkeys && off < sizeof msg - 80; i++)
            if (!dt_kv_find(&s->kv, keys[i]))
                off += (size_t)snprintf(msg + off, sizeof msg - off, "%s \"%.200s\"",
                                        off ? "," : "", keys[i]);
        file_unlock(s);
        if (dt_now_ns() >= dl)
            return dt_fail(DT_ERR_TIMEOUT, "file store %s: timed out after %lld ms waiting for%s",
                           s->path, (long long)timeout_ms, msg);
        int left = dt_ms_left(dl);
        sleep_ms(delay < left ? delay : left);
        delay = delay * 2 > 50 ? 50 : delay * 2;
    }
}

static dt_status file_get(dt_store *h, const char *k, int64_t timeout, void **value,
                          size_t *nbytes) {
    const char *keys[1] = {k};
    return file_wait_keys((file_store *)h, keys, 1, timeout, value, nbytes);
}

static dt_status file_wait(dt_store *h, const char *const *keys, size_t nkeys, int64_t timeout_ms) {
    return file_wait_keys((file_store *)h, keys, nkeys, timeout_ms, NULL, NULL);
}

static dt_status file_check(dt_store *h, const char *const *keys, size_t nkeys, int64_t timeout_ms,
                            bool *all_exist) {
    (void)timeout_ms;
    file_store *s = (file_store *)h;
    DT_TRY(file_lock(s));
    bool all = true;
    for (size_t i = 0; i < nkeys && all; i++)
        all = dt_kv_find(&s->kv, keys[i]) != NULL;
    file_unlock(s);
    *all_exist = all;
    return DT_OK;
}

static dt_status file_add(dt_store *h, const char *k, int64_t delta, int64_t *value) {
    file_store *s  = (file_store *)h;
    int64_t     nv = 0;
    DT_TRY(file_lock(s));
    dt_status st = dt_kv_add(&s->kv, k, delta, &nv);
    if (st == DT_OK) {
        char txt[24];
        int  n = snprintf(txt, sizeof txt, "%" PRId64, nv);
        st     = file_append(s, FILE_REC_SET, k, txt, (size_t)n);
    } else {
        dt_fail_context("file store %s", s->path);
    }
    file_unlock(s);
    if (st == DT_OK && value)
        *value = nv;
    return st;
}

static dt_status file_compare_set(dt_store *h, const char *k, const void *expected,
                                  size_t expected_nbytes, const void *desired,
                                  size_t desired_nbytes, bool *swapped) {
    file_store *s = (file_store *)h;
    DT_TRY(file_lock(s));
    bool         present = expected != NULL;
    dt_kv_entry *e       = dt_kv_find(&s->kv, k);
    bool         eq =
        present ? (e && e->len == expected_nbytes && memcmp(e->val, expected, expected_nbytes) == 0)
                        : e == NULL;
    dt_status st = DT_OK;
    *swapped     = false;
    if (eq) {
        st       = file_append(s, FILE_REC_SET, k, desired, desired_nbytes);
        *swapped = st == DT_OK;
    }
    file_unlock(s);
    return st;
}

static dt_status file_delete(dt_store *h, const char *k, bool *deleted) {
    file_store *s   = (file_store *)h;
    bool        del = false;
    DT_TRY(file_lock(s));
    dt_status st = DT_OK;
    if (dt_kv_find(&s->kv, k)) {
        st  = file_append(s, FILE_REC_DEL, k, NULL, 0);
        del = st == DT_OK;
    }
    file_unlock(s);
    if (deleted)
        *deleted = del;
    return st;
}

static void file_free(dt_store *h) {
    file_store *s = (file_store *)h;
    if (s->ffd >= 0)
        close(s->ffd);
    dt_kv_free(&s->kv);
    dt_free(s->path);
    pthread_mutex_destroy(&s->mu);
    dt_free(s);
}

static const dt_store_ops file_ops = {
    .kind        = "file",
    .set         = file_set,
    .get         = file_get,
    .wait        = file_wait,
    .check       = file_check,
    .add         = file_add,
    .compare_set = file_compare_set,
    .del         = file_delete,
    .free        = file_free,
};

// -------------------------------------------------------------------- the constructor

dt_status dt_store_new_file(dt_store **out, const char *path, const dt_store_opts *opts) {
    *out = NULL;
    if (!path || !*path)
        return dt_fail(DT_ERR_ARG, "file store: expected a path, found %s", path ? "\"\"" : "NULL");
    file_store *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->ffd = -1;
    pthread_mutex_init(&s->mu, NULL);
    dt_status st = dt_store_init_base(&s->h, &file_ops, opts);
    if (st != DT_OK)
        goto fail;
    st = DT_ERR_NOMEM;
    if (!(s->path = dt_strdup(path)))
        goto fail;
    s->ffd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->ffd < 0) {
        st = dt_fail_errno(DT_ERR_IO, "file store %s: open", path);
        goto fail;
    }
    const char *token = dt_token_resolve(opts ? opts->token : NULL);
    if (token) {
        // The file records HMAC-SHA256(token, "dtrain file store"), not the token or a
        // hash that could be inverted: reading the file does not yield a usable token.
        uint8_t     mac[DT_SHA256_BYTES];
        const void *parts[1] = {"dtrain file store"};
        size_t      lens[1]  = {17};
        dt_hmac_sha256(token, strlen(token), 1, parts, lens, mac);
        char want[2 * DT_SHA256_BYTES + 1];
        for (int i = 0; i < DT_SHA256_BYTES; i++)
            snprintf(want + 2 * i, 3, "%02x", mac[i]);
        if ((st = file_lock(s)) != DT_OK)
            goto fail;
        dt_kv_entry *e = dt_kv_find(&s->kv, FILE_TOKEN_KEY);
        st             = DT_OK;
        if (!e)
            st = file_append(s, FILE_REC_SET, FILE_TOKEN_KEY, want, strlen(want));
        else if (e->len != strlen(want) || memcmp(e->val, want, e->len) != 0)
            st = dt_fail(DT_ERR_MISMATCH,
                         "file store %s: job token mismatch: the file belongs to a job with "
                         "another token (a stale file of another job? use a fresh file per job)",
                         path);
        file_unlock(s);
        if (st != DT_OK)
            goto fail;
    }
    *out = &s->h;
    return DT_OK;
fail:
    file_free(&s->h);
    return st;
}
