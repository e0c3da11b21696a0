// store.c: the rendezvous key-value stores behind dt_store: a TCP server (one thread
// with a poll loop, inside the process that creates it) and its clients, a file store
// for shared file systems, and prefix views. The wire protocol is in comm_impl.h.
// What this file does not do: anything about ranks; pg.c builds rendezvous on top.
#include "comm/comm_impl.h"
#include "core/le.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 1
// Slack added to a blocking request's I/O deadline: the server answers a timed-out
// get/wait itself; the client only gives up on its own if the server went silent.
#define CLIENT_SLACK_MS 10000

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
    const char *t = opt ? opt : getenv("DT_JOB_TOKEN");
    return (t && *t) ? t : NULL;
}

dt_status dt_default_timeout_ms(int64_t *out) {
    long v;
    // 30 minutes, PyTorch's default for CPU backends (Gloo, MPI).
    DT_TRY(dt_env_int("DT_TIMEOUT_MS", -1, 100L * 24 * 3600 * 1000, 30L * 60 * 1000, &v));
    *out = v == 0 ? 30L * 60 * 1000 : v;
    return DT_OK;
}

static uint64_t deadline_for(int64_t timeout_ms) {
    return timeout_ms < 0 ? UINT64_MAX : dt_deadline_ns(timeout_ms);
}

// This thread's cap on the I/O of TCP store requests (dt_store_cap_io); UINT64_MAX = none.
static _Thread_local uint64_t io_cap_ns = UINT64_MAX;

uint64_t dt_store_cap_io(uint64_t deadline_ns) {
    uint64_t old = io_cap_ns;
    io_cap_ns    = deadline_ns;
    return old;
}

// Takes a TCP store's request lock; under a cap, gives up at the cap.
static dt_status store_lock(dt_store *s);

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
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

// Parses a whole decimal int64 ("-12"); false otherwise.
static bool parse_i64(const uint8_t *p, size_t n, int64_t *out) {
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

typedef struct kv_entry {
    char            *key;
    uint8_t         *val;
    size_t           len;
    struct kv_entry *next;
} kv_entry;

typedef struct kv_map {
    kv_entry **buckets;
    size_t     nbuckets;
    size_t     count;
} kv_map;

static size_t kv_hash(const char *k, size_t nbuckets) {
    return (size_t)(dt_token_hash(k) & (nbuckets - 1));
}

static kv_entry *kv_find(const kv_map *m, const char *key) {
    if (!m->nbuckets)
        return NULL;
    for (kv_entry *e = m->buckets[kv_hash(key, m->nbuckets)]; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

static dt_status kv_grow(kv_map *m) {
    size_t     nb = m->nbuckets ? m->nbuckets * 2 : 64;
    kv_entry **b  = dt_alloc_zero(nb * sizeof *b);
    if (!b)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        kv_entry *e = m->buckets[i];
        while (e) {
            kv_entry *next = e->next;
            size_t    h    = kv_hash(e->key, nb);
            e->next        = b[h];
            b[h]           = e;
            e              = next;
        }
    }
    dt_free(m->buckets);
    m->buckets  = b;
    m->nbuckets = nb;
    return DT_OK;
}

// Sets key to a copy of val (plus a NUL byte after it, so values read as C strings).
static dt_status kv_set(kv_map *m, const char *key, size_t keylen, const void *val, size_t len) {
    char kbuf[DT_STORE_MAX_KEY + 1];
    memcpy(kbuf, key, keylen);
    kbuf[keylen]  = '\0';
    uint8_t *copy = dt_alloc(len + 1);
    if (!copy)
        return DT_ERR_NOMEM;
    if (len)
        memcpy(copy, val, len);
    copy[len]   = 0;
    kv_entry *e = kv_find(m, kbuf);
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

static bool kv_delete(kv_map *m, const char *key) {
    if (!m->nbuckets)
        return false;
    kv_entry **pp = &m->buckets[kv_hash(key, m->nbuckets)];
    for (; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key) == 0) {
            kv_entry *e = *pp;
            *pp         = e->next;
            dt_free(e->key);
            dt_free(e->val);
            dt_free(e);
            m->count--;
            return true;
        }
    }
    return false;
}

static void kv_free(kv_map *m) {
    for (size_t i = 0; i < m->nbuckets; i++) {
        kv_entry *e = m->buckets[i];
        while (e) {
            kv_entry *next = e->next;
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
static const char *part_key(const uint8_t *p, uint32_t len, char buf[DT_STORE_MAX_KEY + 1]) {
    memcpy(buf, p, len);
    buf[len] = '\0';
    return buf;
}

// Applies an ADD to the table; *out = new value. DT_ERR_FORMAT if not an integer.
static dt_status kv_add(kv_map *m, const char *key, int64_t delta, int64_t *out) {
    kv_entry *e   = kv_find(m, key);
    int64_t   cur = 0;
    if (e && !parse_i64(e->val, e->len, &cur))
        return dt_fail(DT_ERR_FORMAT,
                       "add \"%s\": the key holds a value that is not a decimal "
                       "integer",
                       key);
    int64_t nv = (int64_t)((uint64_t)cur + (uint64_t)delta);
    char    txt[24];
    int     n = snprintf(txt, sizeof txt, "%" PRId64, nv);
    if (kv_set(m, key, strlen(key), txt, (size_t)n) != DT_OK)
        return dt_fail(DT_ERR_NOMEM, "add \"%s\": out of memory", key);
    *out = nv;
    return DT_OK;
}

// Applies a compare-and-set; *swapped says whether it happened.
static dt_status kv_cas(kv_map *m, const char *key, bool expect_present, const uint8_t *exp,
                        size_t explen, const uint8_t *des, size_t deslen, bool *swapped) {
    kv_entry *e = kv_find(m, key);
    bool      eq =
        expect_present ? (e && e->len == explen && memcmp(e->val, exp, explen) == 0) : (e == NULL);
    *swapped = false;
    if (!eq)
        return DT_OK;
    if (kv_set(m, key, strlen(key), des, deslen) != DT_OK)
        return dt_fail(DT_ERR_NOMEM, "compare_set \"%s\": out of memory", key);
    *swapped = true;
    return DT_OK;
}

// ------------------------------------------------------------------ protocol parsing

dt_status dt_store_msg_parse(const uint8_t *buf, size_t n, bool is_request, dt_store_msg *msg,
                             size_t *consumed) {
    *consumed = 0;
    if (n < DT_STORE_HEADER_BYTES)
        return DT_OK;
    uint32_t magic = dt_get_le32(buf);
    if (magic != DT_STORE_MAGIC)
        return dt_fail(DT_ERR_FORMAT,
                       "store message: expected magic 0x%08x, found 0x%08x (not a dtrain store "
                       "client or server?)",
                       DT_STORE_MAGIC, magic);
    uint8_t  code    = buf[4];
    uint16_t nparts  = dt_get_le16(buf + 6);
    uint32_t payload = dt_get_le32(buf + 16);
    if (buf[5] != 0 || dt_get_le32(buf + 20) != 0)
        return dt_fail(DT_ERR_FORMAT, "store message: expected zero reserved bytes");
    if (is_request && (code < DT_STORE_HELLO || code >= DT_STORE_CMD_COUNT_))
        return dt_fail(DT_ERR_FORMAT, "store message: expected a command in 1..%d, found %u",
                       DT_STORE_CMD_COUNT_ - 1, code);
    if (!is_request && code >= DT_STATUS_COUNT_)
        return dt_fail(DT_ERR_FORMAT, "store message: expected a status below %d, found %u",
                       DT_STATUS_COUNT_, code);
    if (payload > DT_STORE_MAX_PAYLOAD)
        return dt_fail(DT_ERR_FORMAT, "store message: expected at most %u payload bytes, found %u",
                       DT_STORE_MAX_PAYLOAD, payload);
    if ((uint64_t)nparts * 4 > payload)
        return dt_fail(DT_ERR_FORMAT,
                       "store message: %u parts need at least %u bytes, found a payload of %u",
                       nparts, (unsigned)nparts * 4, payload);
    if (n - DT_STORE_HEADER_BYTES < payload)
        return DT_OK;
    // The parts must tile the payload exactly.
    const uint8_t *p   = buf + DT_STORE_HEADER_BYTES;
    uint64_t       off = 0;
    for (uint32_t i = 0; i < nparts; i++) {
        if (payload - off < 4)
            return dt_fail(DT_ERR_FORMAT, "store message: part %u: length field past the end", i);
        uint32_t len = dt_get_le32(p + off);
        off += 4;
        if (len > payload - off)
            return dt_fail(DT_ERR_FORMAT,
                           "store message: part %u: expected at most %llu bytes, found %u", i,
                           (unsigned long long)(payload - off), len);
        off += len;
    }
    if (off != payload)
        return dt_fail(DT_ERR_FORMAT,
                       "store message: parts add up to %llu bytes, the header says %u",
                       (unsigned long long)off, payload);
    msg->code          = code;
    msg->nparts        = nparts;
    msg->arg           = (int64_t)dt_get_le64(buf + 8);
    msg->payload       = p;
    msg->payload_bytes = payload;
    *consumed          = DT_STORE_HEADER_BYTES + (size_t)payload;
    return DT_OK;
}

bool dt_store_msg_part(const dt_store_msg *msg, size_t *cursor, const uint8_t **part,
                       uint32_t *len) {
    if (*cursor + 4 > msg->payload_bytes)
        return false;
    *len  = dt_get_le32(msg->payload + *cursor);
    *part = msg->payload + *cursor + 4;
    *cursor += 4 + (size_t)*len;
    return true;
}

dt_status dt_store_msg_check_request(const dt_store_msg *m) {
    static const char *const names[] = {"",      "hello", "set",         "get",   "wait",
                                        "check", "add",   "compare_set", "delete"};
    int min = 1, max = 1, keys = 1; // keys: how many leading parts are keys (-1 = all)
    switch ((dt_store_cmd)m->code) {
    case DT_STORE_HELLO:
        min = max = 2, keys = 0;
        break;
    case DT_STORE_SET:
        min = max = 2;
        break;
    case DT_STORE_GET:
    case DT_STORE_ADD:
    case DT_STORE_DELETE:
        break;
    case DT_STORE_WAIT:
    case DT_STORE_CHECK:
        min = 0, max = DT_STORE_MAX_PARTS, keys = -1;
        break;
    case DT_STORE_CAS:
        min = max = 3;
        break;
    default:
        return dt_fail(DT_ERR_FORMAT, "store message: unknown command %u", m->code);
    }
    if (m->nparts < min || m->nparts > max)
        return dt_fail(DT_ERR_FORMAT, "store %s: expected %d..%d parts, found %u", names[m->code],
                       min, max, m->nparts);
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    for (int i = 0; dt_store_msg_part(m, &cur, &p, &len); i++) {
        bool is_key = keys < 0 || i < keys;
        if (is_key && (len == 0 || len > DT_STORE_MAX_KEY || memchr(p, 0, len)))
            return dt_fail(DT_ERR_FORMAT,
                           "store %s: expected a key of 1..%d bytes without NUL, found %u bytes",
                           names[m->code], DT_STORE_MAX_KEY, len);
        if (!is_key && len > DT_STORE_MAX_VALUE)
            return dt_fail(DT_ERR_FORMAT, "store %s: value of %u bytes exceeds %u", names[m->code],
                           len, DT_STORE_MAX_VALUE);
    }
    return DT_OK;
}

// Appends header + parts of a message to a growable buffer.
typedef struct buf_t {
    uint8_t *p;
    size_t   len, cap;
} buf_t;

static dt_status buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap)
        return DT_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *np = dt_alloc(cap);
    if (!np)
        return DT_ERR_NOMEM;
    if (b->len)
        memcpy(np, b->p, b->len);
    dt_free(b->p);
    b->p   = np;
    b->cap = cap;
    return DT_OK;
}

static dt_status buf_message(buf_t *b, uint8_t code, int64_t arg, int nparts,
                             const void *const *parts, const size_t *lens) {
    size_t payload = 0;
    for (int i = 0; i < nparts; i++)
        payload += 4 + lens[i];
    DT_TRY(buf_reserve(b, DT_STORE_HEADER_BYTES + payload));
    uint8_t *h = b->p + b->len;
    memset(h, 0, DT_STORE_HEADER_BYTES);
    dt_put_le32(h, DT_STORE_MAGIC);
    h[4] = code;
    dt_put_le16(h + 6, (uint16_t)nparts);
    dt_put_le64(h + 8, (uint64_t)arg);
    dt_put_le32(h + 16, (uint32_t)payload);
    uint8_t *p = h + DT_STORE_HEADER_BYTES;
    for (int i = 0; i < nparts; i++) {
        dt_put_le32(p, (uint32_t)lens[i]);
        if (lens[i])
            memcpy(p + 4, parts[i], lens[i]);
        p += 4 + lens[i];
    }
    b->len += DT_STORE_HEADER_BYTES + payload;
    return DT_OK;
}

// ------------------------------------------------------------------------ TCP server

typedef struct srv_conn {
    int      fd;
    buf_t    in;       // bytes received, not yet handled
    buf_t    out;      // bytes to send
    size_t   out_off;  // sent so far
    bool     greeted;  // HELLO accepted
    bool     closing;  // close once `out` is flushed
    bool     blocked;  // a get/wait at the front of `in` waits for keys
    uint64_t deadline; // of the blocked request (UINT64_MAX = none)
    uint64_t started;  // when the blocked request arrived
} srv_conn;

typedef struct store_server {
    int        listen_fd;
    int        wake[2]; // a byte here stops the loop
    pthread_t  thread;
    char      *token; // NULL = accept any client
    kv_map     kv;    // server thread only
    srv_conn **conns; // server thread only
    size_t     nconns, cap;
} store_server;

static void conn_reply(srv_conn *c, dt_status st, int nparts, const void *const *parts,
                       const size_t *lens) {
    if (buf_message(&c->out, (uint8_t)st, 0, nparts, parts, lens) != DT_OK)
        c->closing = true; // out of memory: drop the client rather than lie to it
}

static void conn_reply_text(srv_conn *c, dt_status st, const char *text) {
    const void *parts[1] = {text};
    size_t      lens[1]  = {strlen(text)};
    conn_reply(c, st, 1, parts, lens);
}

// Handles the request at the front of c->in (msg). Returns false when the request must
// wait for keys (stays at the front, c->blocked set).
static bool srv_handle(store_server *s, srv_conn *c, const dt_store_msg *m) {
    char           key[DT_STORE_MAX_KEY + 1];
    size_t         cur = 0;
    const uint8_t *p   = NULL;
    uint32_t       len = 0;
    if (dt_store_msg_check_request(m) != DT_OK) {
        conn_reply_text(c, DT_ERR_FORMAT, dt_last_error());
        c->closing = true;
        return true;
    }
    if (!c->greeted && m->code != DT_STORE_HELLO) {
        conn_reply_text(c, DT_ERR_FORMAT, "expected a hello first");
        c->closing = true;
        return true;
    }
    switch ((dt_store_cmd)m->code) {
    case DT_STORE_HELLO: {
        dt_store_msg_part(m, &cur, &p, &len);
        char   tok[4096];
        size_t tl = len < sizeof tok - 1 ? len : sizeof tok - 1;
        memcpy(tok, p, tl);
        tok[tl] = '\0';
        if (m->arg != PROTOCOL_VERSION) {
            char msg[160];
            snprintf(msg, sizeof msg, "expected store protocol version %d, found %lld",
                     PROTOCOL_VERSION, (long long)m->arg);
            conn_reply_text(c, DT_ERR_MISMATCH, msg);
            c->closing = true;
        } else if (s->token && (len != strlen(s->token) || strcmp(tok, s->token) != 0)) {
            char msg[256];
            if (len == 0)
                snprintf(msg, sizeof msg,
                         "job token mismatch: the store expects a token (hash %016llx), the "
                         "client has none (set DT_JOB_TOKEN like the other ranks)",
                         (unsigned long long)dt_token_hash(s->token));
            else
                snprintf(msg, sizeof msg,
                         "job token mismatch: expected token hash %016llx, found %016llx (a "
                         "process of another job or an earlier run?)",
                         (unsigned long long)dt_token_hash(s->token),
                         (unsigned long long)dt_token_hash(tok));
            conn_reply_text(c, DT_ERR_MISMATCH, msg);
            c->closing = true;
        } else {
            c->greeted = true;
            conn_reply(c, DT_OK, 0, NULL, NULL);
        }
        return true;
    }
    case DT_STORE_SET: {
        dt_store_msg_part(m, &cur, &p, &len);
        uint32_t       klen = len;
        const uint8_t *kp   = p;
        dt_store_msg_part(m, &cur, &p, &len);
        if (kv_set(&s->kv, (const char *)kp, klen, p, len) != DT_OK)
            conn_reply_text(c, DT_ERR_NOMEM, "set: out of memory in the store server");
        else
            conn_reply(c, DT_OK, 0, NULL, NULL);
        return true;
    }
    case DT_STORE_GET: {
        dt_store_msg_part(m, &cur, &p, &len);
        kv_entry *e = kv_find(&s->kv, part_key(p, len, key));
        if (e) {
            const void *parts[1] = {e->val};
            size_t      lens[1]  = {e->len};
            conn_reply(c, DT_OK, 1, parts, lens);
            return true;
        }
        break; // wait below
    }
    case DT_STORE_WAIT:
    case DT_STORE_CHECK: {
        bool all = true;
        while (all && dt_store_msg_part(m, &cur, &p, &len))
            all = kv_find(&s->kv, part_key(p, len, key)) != NULL;
        if (m->code == DT_STORE_CHECK) {
            const void *parts[1] = {all ? "1" : "0"};
            size_t      lens[1]  = {1};
            conn_reply(c, DT_OK, 1, parts, lens);
            return true;
        }
        if (all) {
            conn_reply(c, DT_OK, 0, NULL, NULL);
            return true;
        }
        break;
    }
    case DT_STORE_ADD: {
        dt_store_msg_part(m, &cur, &p, &len);
        int64_t nv;
        if (kv_add(&s->kv, part_key(p, len, key), m->arg, &nv) != DT_OK) {
            conn_reply_text(c, dt_last_status(), dt_last_error());
        } else {
            char        txt[24];
            int         n        = snprintf(txt, sizeof txt, "%" PRId64, nv);
            const void *parts[1] = {txt};
            size_t      lens[1]  = {(size_t)n};
            conn_reply(c, DT_OK, 1, parts, lens);
        }
        return true;
    }
    case DT_STORE_CAS: {
        dt_store_msg_part(m, &cur, &p, &len);
        part_key(p, len, key);
        const uint8_t *exp = NULL, *des = NULL;
        uint32_t       explen = 0, deslen = 0;
        dt_store_msg_part(m, &cur, &exp, &explen);
        dt_store_msg_part(m, &cur, &des, &deslen);
        bool swapped;
        if (kv_cas(&s->kv, key, (m->arg & 1) != 0, exp, explen, des, deslen, &swapped) != DT_OK) {
            conn_reply_text(c, dt_last_status(), dt_last_error());
        } else {
            const void *parts[1] = {swapped ? "1" : "0"};
            size_t      lens[1]  = {1};
            conn_reply(c, DT_OK, 1, parts, lens);
        }
        return true;
    }
    case DT_STORE_DELETE: {
        dt_store_msg_part(m, &cur, &p, &len);
        bool        del      = kv_delete(&s->kv, part_key(p, len, key));
        const void *parts[1] = {del ? "1" : "0"};
        size_t      lens[1]  = {1};
        conn_reply(c, DT_OK, 1, parts, lens);
        return true;
    }
    default:
        break;
    }
    // A get or wait whose keys are missing.
    uint64_t now = dt_now_ns();
    if (!c->blocked) {
        c->blocked  = true;
        c->started  = now;
        c->deadline = m->arg < 0 ? UINT64_MAX : now + (uint64_t)m->arg * 1000000ull;
    }
    if (now < c->deadline)
        return false;
    // Timed out: name the keys still missing.
    char   msg[1024];
    size_t off = (size_t)snprintf(msg, sizeof msg, "timed out after %lld ms waiting for key%s",
                                  (long long)((now - c->started) / 1000000ull),
                                  m->code == DT_STORE_WAIT && m->nparts > 1 ? "s" : "");
    cur        = 0;
    int shown  = 0;
    while (dt_store_msg_part(m, &cur, &p, &len) && off < sizeof msg - 64) {
        if (kv_find(&s->kv, part_key(p, len, key)))
            continue;
        off +=
            (size_t)snprintf(msg + off, sizeof msg - off, "%s \"%.200s\"", shown ? "," : "", key);
        shown++;
    }
    conn_reply_text(c, DT_ERR_TIMEOUT, msg);
    c->blocked = false;
    return true;
}

// Handles every complete request of a client until one blocks.
static void srv_pump(store_server *s, srv_conn *c) {
    while (!c->closing) {
        dt_store_msg m;
        size_t       used;
        if (dt_store_msg_parse(c->in.p, c->in.len, true, &m, &used) != DT_OK) {
            conn_reply_text(c, DT_ERR_FORMAT, dt_last_error());
            c->closing = true;
            return;
        }
        if (used == 0)
            return;
        if (!srv_handle(s, c, &m))
            return;
        c->blocked = false;
        memmove(c->in.p, c->in.p + used, c->in.len - used);
        c->in.len -= used;
    }
}

static void conn_free(srv_conn *c) {
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    dt_free(c->in.p);
    dt_free(c->out.p);
    dt_free(c);
}

static void srv_accept(store_server *s) {
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; // EAGAIN, or a transient error: try again on the next wake-up
        dt_sock_tune(fd, 0);
        if (s->nconns == s->cap) {
            size_t     cap = s->cap ? s->cap * 2 : 16;
            srv_conn **nc  = dt_alloc(cap * sizeof *nc);
            if (!nc) {
                close(fd);
                return;
            }
            if (s->nconns)
                memcpy(nc, s->conns, s->nconns * sizeof *nc);
            dt_free(s->conns);
            s->conns = nc;
            s->cap   = cap;
        }
        srv_conn *c = dt_alloc_zero(sizeof *c);
        if (!c) {
            close(fd);
            return;
        }
        c->fd                 = fd;
        s->conns[s->nconns++] = c;
    }
}

// Reads what a client sent; false when the connection is finished.
static bool srv_read(srv_conn *c) {
    for (;;) {
        if (buf_reserve(&c->in, 65536) != DT_OK)
            return false;
        ssize_t k = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, 0);
        if (k > 0) {
            c->in.len += (size_t)k;
            // A client may not queue more than one maximal message ahead.
            if (c->in.len > 2 * (size_t)(DT_STORE_HEADER_BYTES + DT_STORE_MAX_PAYLOAD))
                return false;
            continue;
        }
        if (k == 0)
            return false;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
}

static bool srv_write(srv_conn *c) {
    while (c->out_off < c->out.len) {
        ssize_t k = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            c->out_off += (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return true;
        return false;
    }
    c->out.len = c->out_off = 0;
    return !c->closing;
}

static void *srv_main(void *arg) {
    store_server  *s    = arg;
    struct pollfd *pfds = NULL;
    size_t         pcap = 0;
    for (;;) {
        size_t want = s->nconns + 2;
        if (want > pcap) {
            dt_free(pfds);
            pcap = want * 2;
            pfds = dt_alloc(pcap * sizeof *pfds);
            if (!pfds) {
                pcap = 0;
                sleep_ms(10);
                continue;
            }
        }
        pfds[0]          = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pfds[1]          = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
        uint64_t next_dl = UINT64_MAX;
        for (size_t i = 0; i < s->nconns; i++) {
            srv_conn *c  = s->conns[i];
            short     ev = c->closing ? 0 : POLLIN;
            if (c->out_off < c->out.len)
                ev |= POLLOUT;
            pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
            if (c->blocked && c->deadline < next_dl)
                next_dl = c->deadline;
        }
        int timeout = next_dl == UINT64_MAX ? -1 : dt_ms_left(next_dl) + 1;
        int n       = poll(pfds, (nfds_t)(s->nconns + 2), timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (pfds[0].revents)
            break; // stop requested
        size_t nold = s->nconns;
        if (pfds[1].revents & POLLIN)
            srv_accept(s);
        // Serve existing connections (new ones have no poll result yet).
        for (size_t i = 0; i < nold; i++) {
            srv_conn *c  = s->conns[i];
            short     re = pfds[i + 2].revents;
            bool      ok = true;
            if (re & (POLLIN | POLLHUP | POLLERR))
                ok = srv_read(c);
            if (ok)
                srv_pump(s, c);
            if (ok && (c->out_off < c->out.len || c->closing))
                ok = srv_write(c);
            if (!ok) {
                conn_free(c);
                s->conns[i] = NULL;
            }
        }
        // A set may have released blocked clients; deadlines may have passed. A
        // released request can itself set keys (it cannot: only get/wait block), so
        // one pass suffices.
        for (size_t i = 0; i < s->nconns; i++) {
            srv_conn *c = s->conns[i];
            if (c && c->blocked) {
                srv_pump(s, c);
                if (!srv_write(c)) {
                    conn_free(c);
                    s->conns[i] = NULL;
                }
            }
        }
        size_t k = 0;
        for (size_t i = 0; i < s->nconns; i++)
            if (s->conns[i])
                s->conns[k++] = s->conns[i];
        s->nconns = k;
    }
    dt_free(pfds);
    return NULL;
}

static void server_free(store_server *s) {
    if (!s)
        return;
    if (s->wake[1] >= 0) {
        char    b = 1;
        ssize_t w = write(s->wake[1], &b, 1);
        (void)w;
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s->conns[i]);
    dt_free(s->conns);
    kv_free(&s->kv);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    dt_free(s->token);
    dt_free(s);
}

static dt_status server_start(int port, const char *token, store_server **out, int *bound) {
    store_server *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    dt_status st = dt_sock_listen(port, 1024, "store", &s->listen_fd, bound);
    if (st != DT_OK)
        goto fail;
    dt_sock_set_nonblocking(s->listen_fd, true);
    if (token && !(s->token = dt_strdup(token))) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        st = dt_fail_errno(DT_ERR_IO, "store: pipe");
        goto fail;
    }
    int rc = pthread_create(&s->thread, NULL, srv_main, s);
    if (rc != 0) {
        close(s->wake[1]);
        s->wake[1] = -1;
        errno      = rc;
        st         = dt_fail_errno(DT_ERR_IO, "store: starting the server thread");
        goto fail;
    }
    *out = s;
    return DT_OK;
fail:
    server_free(s);
    return st;
}

#ifdef DT_FUZZ
// Feeds `n` bytes from one client to a server that has no sockets: parsing, checks and
// every command handler run as they do for a real client. For fuzz/fuzz_store_msg.c.
void dt_store_fuzz_serve(const uint8_t *data, size_t n);
void dt_store_fuzz_serve(const uint8_t *data, size_t n) {
    store_server s = {.listen_fd = -1, .wake = {-1, -1}};
    srv_conn     c = {.fd = -1};
    // Feed in two pieces so partial messages are exercised too.
    size_t         half      = n / 2;
    const uint8_t *pieces[2] = {data, data + half};
    size_t         lens[2]   = {half, n - half};
    for (int i = 0; i < 2 && !c.closing; i++) {
        if (buf_reserve(&c.in, lens[i]) != DT_OK)
            break;
        if (lens[i])
            memcpy(c.in.p + c.in.len, pieces[i], lens[i]);
        c.in.len += lens[i];
        srv_pump(&s, &c);
        c.out.len = c.out_off = 0; // replies go nowhere
    }
    // Parse whatever replies would look like to a client, too.
    dt_store_msg m;
    size_t       used;
    if (dt_store_msg_parse(data, n, false, &m, &used) == DT_OK && used) {
        size_t         cur = 0;
        const uint8_t *p;
        uint32_t       len;
        while (dt_store_msg_part(&m, &cur, &p, &len)) {
        }
    }
    dt_free(c.in.p);
    dt_free(c.out.p);
    kv_free(&s.kv);
}
#endif

// ------------------------------------------------------------------------- handles

typedef enum store_kind { STORE_TCP, STORE_FILE, STORE_PREFIX } store_kind;

struct dt_store {
    store_kind      kind;
    int64_t         timeout_ms; // resolved: < 0 = none
    pthread_mutex_t mu;         // serialises requests (tcp, file)
    // tcp
    int           fd;
    char          host[256];
    int           port;
    char          broken[512]; // set once the connection is unusable: the reason
    store_server *server;      // in the server's process
    // file
    char    *path;
    int      ffd;
    uint64_t read_off; // bytes of the file already applied to kv
    kv_map   kv;
    // prefix
    dt_store *base;
    char     *prefix;
};

dt_store_opts dt_store_opts_default(void) {
    return (dt_store_opts){0};
}

static dt_store *store_new(store_kind kind, const dt_store_opts *o) {
    int64_t timeout = o ? o->timeout_ms : 0;
    if (timeout == 0 && dt_default_timeout_ms(&timeout) != DT_OK)
        return NULL;
    dt_store *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return NULL;
    s->kind       = kind;
    s->timeout_ms = timeout;
    s->fd = s->ffd = -1;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

int dt_store_port(const dt_store *s) {
    while (s && s->kind == STORE_PREFIX)
        s = s->base;
    return s && s->kind == STORE_TCP ? s->port : -1;
}

bool dt_store_local_addr(dt_store *s, char *buf, size_t n) {
    while (s && s->kind == STORE_PREFIX)
        s = s->base;
    if (!s || s->kind != STORE_TCP)
        return false;
    pthread_mutex_lock(&s->mu);
    bool ok = s->fd >= 0 && dt_sock_local_addr(s->fd, buf, n);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void dt_store_set_timeout(dt_store *s, int64_t timeout_ms) {
    if (!s)
        return;
    if (timeout_ms == 0 && dt_default_timeout_ms(&timeout_ms) != DT_OK)
        timeout_ms = 30L * 60 * 1000;
    s->timeout_ms = timeout_ms;
}

static dt_status store_lock(dt_store *s) {
    if (io_cap_ns == UINT64_MAX) {
        pthread_mutex_lock(&s->mu);
        return DT_OK;
    }
    uint64_t        left = io_cap_ns > dt_now_ns() ? io_cap_ns - dt_now_ns() : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + left % 1000000000ull;
    ts.tv_sec += (time_t)(left / 1000000000ull + ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    if (pthread_mutex_timedlock(&s->mu, &ts) != 0)
        return dt_fail(DT_ERR_TIMEOUT,
                       "store %s:%d: busy with another request past this call's "
                       "deadline",
                       s->host, s->port);
    return DT_OK;
}

// One request/reply exchange on a TCP store. On success *reply views into *rbuf
// (owned by the caller, dt_free). The reply's status becomes the return value, with
// the server's message.
static dt_status tcp_exchange(dt_store *s, uint8_t cmd, int64_t arg, int nparts,
                              const void *const *parts, const size_t *lens, int64_t wait_ms,
                              dt_store_msg *reply, uint8_t **rbuf) {
    *rbuf = NULL;
    char what[300];
    snprintf(what, sizeof what, "store %s:%d", s->host, s->port);
    if (s->broken[0])
        return dt_fail(DT_ERR_PEER, "%s", s->broken);
    buf_t req = {0};
    if (buf_message(&req, cmd, arg, nparts, parts, lens) != DT_OK)
        return dt_fail(DT_ERR_NOMEM, "%s: out of memory building a request", what);
    // I/O deadline: the request's own wait (answered by the server) plus slack, or
    // the store timeout for requests that do not wait.
    int64_t  io_ms = wait_ms < 0 ? -1 : (wait_ms > 0 ? wait_ms : s->timeout_ms);
    uint64_t dl    = io_ms < 0 ? UINT64_MAX : dt_deadline_ns(io_ms + CLIENT_SLACK_MS);
    if (dl > io_cap_ns)
        dl = io_cap_ns;
    dt_status st = dt_sock_write_all(s->fd, req.p, req.len, dl, what);
    dt_free(req.p);
    uint8_t hdr[DT_STORE_HEADER_BYTES];
    if (st == DT_OK)
        st = dt_sock_read_all(s->fd, hdr, sizeof hdr, dl, what);
    dt_store_msg m;
    size_t       used;
    if (st == DT_OK) {
        st = dt_store_msg_parse(hdr, sizeof hdr, false, &m, &used);
        if (st == DT_OK) {
            uint32_t payload = dt_get_le32(hdr + 16);
            uint8_t *b       = dt_alloc(DT_STORE_HEADER_BYTES + (size_t)payload + 1);
            if (!b) {
                st = DT_ERR_NOMEM;
            } else {
                memcpy(b, hdr, sizeof hdr);
                st = dt_sock_read_all(s->fd, b + DT_STORE_HEADER_BYTES, payload, dl, what);
                if (st == DT_OK)
                    st = dt_store_msg_parse(b, DT_STORE_HEADER_BYTES + payload, false, &m, &used);
                if (st == DT_OK && used == 0)
                    st = dt_fail(DT_ERR_FORMAT, "%s: truncated reply", what);
                if (st != DT_OK)
                    dt_free(b);
                else
                    *rbuf = b;
            }
        }
    }
    if (st != DT_OK) {
        // The stream may be out of step now: every later request fails the same way.
        if (st == DT_ERR_PEER)
            dt_fail(DT_ERR_PEER,
                    "%s closed the connection (did the process of rank 0, "
                    "which runs the store, exit?)",
                    what);
        snprintf(s->broken, sizeof s->broken, "%s", dt_last_error());
        return st;
    }
    *reply = m;
    if (m.code != DT_OK) {
        size_t         cur = 0;
        const uint8_t *p   = (const uint8_t *)"";
        uint32_t       len = 0;
        dt_store_msg_part(&m, &cur, &p, &len);
        dt_status code = (dt_status)m.code;
        dt_fail(code, "%s: %.*s", what, (int)(len > 900 ? 900 : len), (const char *)p);
        dt_free(*rbuf);
        *rbuf = NULL;
        return code;
    }
    return DT_OK;
}

dt_store *dt_store_init_tcp(const char *host, int port, bool is_server, const dt_store_opts *opts) {
    if (!is_server && (!host || !*host)) {
        dt_fail(DT_ERR_ARG, "store: expected the server's host name or address, found %s",
                host ? "an empty string" : "NULL");
        return NULL;
    }
    if (port < 0 || port > 65535 || (!is_server && port == 0)) {
        dt_fail(DT_ERR_ARG, "store: expected a port in [%d, 65535], found %d", is_server ? 0 : 1,
                port);
        return NULL;
    }
    dt_store *s = store_new(STORE_TCP, opts);
    if (!s)
        return NULL;
    const char *token = dt_token_resolve(opts ? opts->token : NULL);
    if (is_server) {
        if (server_start(port, token, &s->server, &s->port) != DT_OK)
            goto fail;
        // The server's own process talks to it over loopback like any client.
        snprintf(s->host, sizeof s->host, "127.0.0.1");
    } else {
        snprintf(s->host, sizeof s->host, "%s", host);
        s->port = port;
    }
    if (dt_sock_connect(s->host, s->port, deadline_for(s->timeout_ms), "store", &s->fd) != DT_OK)
        goto fail;
    const void  *parts[2] = {token ? token : "", "dtrain"};
    size_t       lens[2]  = {token ? strlen(token) : 0, 6};
    dt_store_msg reply;
    uint8_t     *rbuf;
    if (tcp_exchange(s, DT_STORE_HELLO, PROTOCOL_VERSION, 2, parts, lens, 0, &reply, &rbuf) !=
        DT_OK)
        goto fail;
    dt_free(rbuf);
    return s;
fail:
    dt_store_free(s);
    return NULL;
}

// ------------------------------------------------------------------------ file store
//
// Record: u32 magic "DTFR" | u8 type (1 set, 2 delete) | 3 zero bytes | u32 key bytes |
// u32 value bytes | key | value | u32 CRC32C of everything before it in the record.

#define FILE_MAGIC     0x52465444u // "DTFR"
#define FILE_REC_SET   1
#define FILE_REC_DEL   2
#define FILE_TOKEN_KEY "\x01token"

static dt_status file_catch_up(dt_store *s) {
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
            if (kv_set(&s->kv, key, klen, r + 16 + klen, vlen) != DT_OK) {
                st = dt_fail(DT_ERR_NOMEM, "file store %s: out of memory", s->path);
                break;
            }
        } else {
            kv_delete(&s->kv, key);
        }
        off += total;
    }
    if (st == DT_OK)
        s->read_off = size;
    dt_free(buf);
    return st;
}

static dt_status file_append(dt_store *s, uint8_t type, const char *key, const void *val,
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
static dt_status file_lock(dt_store *s) {
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

static void file_unlock(dt_store *s) {
    flock(s->ffd, LOCK_UN);
    pthread_mutex_unlock(&s->mu);
}

dt_store *dt_store_init_file(const char *path, const dt_store_opts *opts) {
    if (!path || !*path) {
        dt_fail(DT_ERR_ARG, "file store: expected a path, found %s", path ? "\"\"" : "NULL");
        return NULL;
    }
    dt_store *s = store_new(STORE_FILE, opts);
    if (!s)
        return NULL;
    if (!(s->path = dt_strdup(path)))
        goto fail;
    s->ffd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->ffd < 0) {
        dt_fail_errno(DT_ERR_IO, "file store %s: open", path);
        goto fail;
    }
    const char *token = dt_token_resolve(opts ? opts->token : NULL);
    if (token) {
        char want[24];
        snprintf(want, sizeof want, "%016llx", (unsigned long long)dt_token_hash(token));
        if (file_lock(s) != DT_OK)
            goto fail;
        kv_entry *e  = kv_find(&s->kv, FILE_TOKEN_KEY);
        dt_status st = DT_OK;
        if (!e)
            st = file_append(s, FILE_REC_SET, FILE_TOKEN_KEY, want, strlen(want));
        else if (e->len != strlen(want) || memcmp(e->val, want, e->len) != 0)
            st = dt_fail(DT_ERR_MISMATCH,
                         "file store %s: job token mismatch: expected token hash %s, the file "
                         "holds %.*s (a stale file of another job? use a fresh file per job)",
                         path, want, (int)(e->len > 32 ? 32 : e->len), (const char *)e->val);
        file_unlock(s);
        if (st != DT_OK)
            goto fail;
    }
    return s;
fail:
    dt_store_free(s);
    return NULL;
}

// ----------------------------------------------------------------------- prefix views

dt_store *dt_store_init_prefix(dt_store *base, const char *prefix) {
    if (!base || !prefix || !*prefix) {
        dt_fail(DT_ERR_ARG, "store prefix: expected a store and a non-empty prefix");
        return NULL;
    }
    dt_store *s = store_new(STORE_PREFIX, NULL);
    if (!s)
        return NULL;
    s->base       = base;
    s->timeout_ms = base->timeout_ms;
    if (!(s->prefix = dt_strdup(prefix))) {
        dt_store_free(s);
        return NULL;
    }
    return s;
}

// Resolves a prefix chain: *root = the real store, full key in buf.
static dt_status full_key(dt_store *s, const char *key, char *buf, size_t n, dt_store **root) {
    DT_TRY(check_key(key));
    // Collect the prefixes from the innermost view outwards.
    const char *pre[16];
    int         np = 0;
    while (s->kind == STORE_PREFIX) {
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
    if (s->kind == STORE_FILE) {
        DT_TRY(file_lock(s));
        dt_status st = file_append(s, FILE_REC_SET, k, value, nbytes);
        file_unlock(s);
        return st;
    }
    const void  *parts[2] = {k, value ? value : ""};
    size_t       lens[2]  = {strlen(k), nbytes};
    dt_store_msg reply;
    uint8_t     *rbuf;
    DT_TRY(store_lock(s));
    dt_status st = tcp_exchange(s, DT_STORE_SET, 0, 2, parts, lens, 0, &reply, &rbuf);
    pthread_mutex_unlock(&s->mu);
    dt_free(rbuf);
    return st;
}

static dt_status file_wait_keys(dt_store *s, const char *const *keys, size_t nkeys,
                                int64_t timeout_ms, void **value, size_t *nbytes) {
    uint64_t dl    = deadline_for(timeout_ms);
    int      delay = 1;
    for (;;) {
        DT_TRY(file_lock(s));
        size_t missing = nkeys;
        for (size_t i = 0; i < nkeys; i++)
            if (kv_find(&s->kv, keys[i]))
                missing--;
        if (missing == 0) {
            dt_status st = DT_OK;
            if (value) {
                kv_entry *e = kv_find(&s->kv, keys[0]);
                *value      = dt_alloc(e->len + 1);
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
            if (!kv_find(&s->kv, keys[i]))
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

dt_status dt_store_get(dt_store *store, const char *key, void **value, size_t *nbytes) {
    if (!store || !value)
        return dt_fail(DT_ERR_ARG, "store get: store and value must not be NULL");
    *value = NULL;
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    int64_t timeout = store->timeout_ms;
    if (s->kind == STORE_FILE) {
        const char *keys[1] = {k};
        return file_wait_keys(s, keys, 1, timeout, value, nbytes);
    }
    const void  *parts[1] = {k};
    size_t       lens[1]  = {strlen(k)};
    dt_store_msg reply;
    uint8_t     *rbuf;
    DT_TRY(store_lock(s));
    dt_status st = tcp_exchange(s, DT_STORE_GET, timeout, 1, parts, lens, timeout, &reply, &rbuf);
    pthread_mutex_unlock(&s->mu);
    if (st != DT_OK)
        return st;
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    if (!dt_store_msg_part(&reply, &cur, &p, &len)) {
        dt_free(rbuf);
        return dt_fail(DT_ERR_FORMAT, "store get \"%s\": reply without a value", k);
    }
    // Reuse the reply buffer: move the value to its front and NUL-terminate it.
    memmove(rbuf, p, len);
    rbuf[len] = 0;
    *value    = rbuf;
    if (nbytes)
        *nbytes = len;
    return DT_OK;
}

static dt_status keys_request(dt_store *store, uint8_t cmd, const char *const *keys, size_t nkeys,
                              int64_t timeout_ms, bool *all_exist) {
    if (!store || (nkeys && !keys))
        return dt_fail(DT_ERR_ARG, "store wait/check: store and keys must not be NULL");
    if (nkeys > DT_STORE_MAX_PARTS)
        return dt_fail(DT_ERR_ARG, "store wait/check: expected at most %d keys, found %zu",
                       DT_STORE_MAX_PARTS, nkeys);
    if (timeout_ms == 0)
        timeout_ms = store->timeout_ms;
    dt_store *s = store;
    while (s->kind == STORE_PREFIX)
        s = s->base;
    // Full keys in one allocation.
    char        *kb    = dt_alloc(nkeys * (DT_STORE_MAX_KEY + 1) + 1);
    const void **parts = dt_alloc((nkeys + 1) * sizeof *parts);
    size_t      *lens  = dt_alloc((nkeys + 1) * sizeof *lens);
    dt_status    st    = DT_OK;
    if (!kb || !parts || !lens) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < nkeys; i++) {
        char     *k = kb + i * (DT_STORE_MAX_KEY + 1);
        dt_store *root;
        st = full_key(store, keys[i], k, DT_STORE_MAX_KEY + 1, &root);
        if (st != DT_OK)
            goto done;
        parts[i] = k;
        lens[i]  = strlen(k);
    }
    if (s->kind == STORE_FILE) {
        if (cmd == DT_STORE_CHECK) {
            st = file_lock(s);
            if (st != DT_OK)
                goto done;
            bool all = true;
            for (size_t i = 0; i < nkeys && all; i++)
                all = kv_find(&s->kv, parts[i]) != NULL;
            file_unlock(s);
            *all_exist = all;
        } else {
            st = file_wait_keys(s, (const char *const *)parts, nkeys, timeout_ms, NULL, NULL);
        }
        goto done;
    }
    dt_store_msg reply;
    uint8_t     *rbuf;
    if ((st = store_lock(s)) != DT_OK)
        goto done;
    st = tcp_exchange(s, cmd, timeout_ms, (int)nkeys, parts, lens,
                      cmd == DT_STORE_WAIT ? timeout_ms : 0, &reply, &rbuf);
    pthread_mutex_unlock(&s->mu);
    if (st == DT_OK && cmd == DT_STORE_CHECK) {
        size_t         cur = 0;
        const uint8_t *p;
        uint32_t       len;
        *all_exist = dt_store_msg_part(&reply, &cur, &p, &len) && len == 1 && p[0] == '1';
    }
    dt_free(rbuf);
done:
    dt_free(kb);
    dt_free(parts);
    dt_free(lens);
    return st;
}

dt_status dt_store_wait(dt_store *store, const char *const *keys, size_t nkeys,
                        int64_t timeout_ms) {
    return keys_request(store, DT_STORE_WAIT, keys, nkeys, timeout_ms, NULL);
}

dt_status dt_store_check(dt_store *store, const char *const *keys, size_t nkeys, bool *all_exist) {
    if (!all_exist)
        return dt_fail(DT_ERR_ARG, "store check: all_exist must not be NULL");
    return keys_request(store, DT_STORE_CHECK, keys, nkeys, 0, all_exist);
}

dt_status dt_store_add(dt_store *store, const char *key, int64_t delta, int64_t *value) {
    if (!store)
        return dt_fail(DT_ERR_ARG, "store add: store is NULL");
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    int64_t nv = 0;
    if (s->kind == STORE_FILE) {
        DT_TRY(file_lock(s));
        dt_status st = kv_add(&s->kv, k, delta, &nv);
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
    const void  *parts[1] = {k};
    size_t       lens[1]  = {strlen(k)};
    dt_store_msg reply;
    uint8_t     *rbuf;
    pthread_mutex_lock(&s->mu);
    dt_status st = tcp_exchange(s, DT_STORE_ADD, delta, 1, parts, lens, 0, &reply, &rbuf);
    pthread_mutex_unlock(&s->mu);
    if (st != DT_OK)
        return st;
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    if (!dt_store_msg_part(&reply, &cur, &p, &len) || !parse_i64(p, len, &nv))
        st = dt_fail(DT_ERR_FORMAT, "store add \"%s\": reply is not an integer", k);
    dt_free(rbuf);
    if (st == DT_OK && value)
        *value = nv;
    return st;
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
    if (s->kind == STORE_FILE) {
        DT_TRY(file_lock(s));
        bool      present = expected != NULL;
        kv_entry *e       = kv_find(&s->kv, k);
        bool      eq      = present ? (e && e->len == expected_nbytes &&
                             memcmp(e->val, expected, expected_nbytes) == 0)
                                    : e == NULL;
        dt_status st      = DT_OK;
        *swapped          = false;
        if (eq) {
            st       = file_append(s, FILE_REC_SET, k, desired, desired_nbytes);
            *swapped = st == DT_OK;
        }
        file_unlock(s);
        return st;
    }
    const void  *parts[3] = {k, expected ? expected : "", desired ? desired : ""};
    size_t       lens[3]  = {strlen(k), expected ? expected_nbytes : 0, desired_nbytes};
    dt_store_msg reply;
    uint8_t     *rbuf;
    pthread_mutex_lock(&s->mu);
    dt_status st =
        tcp_exchange(s, DT_STORE_CAS, expected ? 1 : 0, 3, parts, lens, 0, &reply, &rbuf);
    pthread_mutex_unlock(&s->mu);
    if (st != DT_OK)
        return st;
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    *swapped = dt_store_msg_part(&reply, &cur, &p, &len) && len == 1 && p[0] == '1';
    dt_free(rbuf);
    return DT_OK;
}

dt_status dt_store_delete(dt_store *store, const char *key, bool *deleted) {
    if (!store)
        return dt_fail(DT_ERR_ARG, "store delete: store is NULL");
    char      k[DT_STORE_MAX_KEY + 1];
    dt_store *s;
    DT_TRY(full_key(store, key, k, sizeof k, &s));
    bool del = false;
    if (s->kind == STORE_FILE) {
        DT_TRY(file_lock(s));
        dt_status st = DT_OK;
        if (kv_find(&s->kv, k)) {
            st  = file_append(s, FILE_REC_DEL, k, NULL, 0);
            del = st == DT_OK;
        }
        file_unlock(s);
        if (deleted)
            *deleted = del;
        return st;
    }
    const void  *parts[1] = {k};
    size_t       lens[1]  = {strlen(k)};
    dt_store_msg reply;
    uint8_t     *rbuf;
    pthread_mutex_lock(&s->mu);
    dt_status st = tcp_exchange(s, DT_STORE_DELETE, 0, 1, parts, lens, 0, &reply, &rbuf);
    pthread_mutex_unlock(&s->mu);
    if (st != DT_OK)
        return st;
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    del = dt_store_msg_part(&reply, &cur, &p, &len) && len == 1 && p[0] == '1';
    dt_free(rbuf);
    if (deleted)
        *deleted = del;
    return DT_OK;
}

void dt_store_free(dt_store *s) {
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    server_free(s->server);
    if (s->ffd >= 0)
        close(s->ffd);
    kv_free(&s->kv);
    dt_free(s->path);
    dt_free(s->prefix);
    pthread_mutex_destroy(&s->mu);
    dt_free(s);
}
