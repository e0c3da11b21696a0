// store.c: the rendezvous key-value stores behind dt_store: the TCP store's client
// (its server is store_server.c, its table store_kv.c), a file store for shared file
// systems, and prefix views. The wire protocol is in comm_impl.h.
// What this file does not do: anything about ranks; pg.c builds rendezvous on top.
#include "comm/store_impl.h"
#include "core/hmac.h"
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
    static const char *const names[] = {"",      "hello", "set",         "get",    "wait",
                                        "check", "add",   "compare_set", "delete", "auth"};
    int min = 1, max = 1, keys = 1; // keys: how many leading parts are keys (-1 = all)
    switch ((dt_store_cmd)m->code) {
    case DT_STORE_HELLO:
        min = max = 2, keys = 0;
        break;
    case DT_STORE_AUTH:
        keys = 0;
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

// ------------------------------------------------------------------------- handles

typedef enum store_kind { STORE_TCP, STORE_FILE, STORE_PREFIX } store_kind;

struct dt_store {
    store_kind      kind;
    int64_t         timeout_ms; // resolved: < 0 = none
    pthread_mutex_t mu;         // serialises requests (tcp, file)
    // tcp
    int              fd;
    char             host[256];
    int              port;
    char             broken[512]; // set once the connection is unusable: the reason
    dt_store_server *server;      // in the server's process
    // file
    char     *path;
    int       ffd;
    uint64_t  read_off; // bytes of the file already applied to kv
    dt_kv_map kv;
    // prefix
    dt_store *base;
    char     *prefix;
};

dt_store_opts dt_store_opts_default(void) {
    return (dt_store_opts){0};
}

static dt_status store_new(store_kind kind, const dt_store_opts *o, dt_store **out) {
    int64_t timeout = o ? o->timeout_ms : 0;
    if (timeout == 0)
        DT_TRY(dt_default_timeout_ms(&timeout));
    dt_store *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->kind       = kind;
    s->timeout_ms = timeout;
    s->fd = s->ffd = -1;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return DT_OK;
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
    dt_buf req = {0};
    if (dt_buf_message(&req, cmd, arg, nparts, parts, lens) != DT_OK)
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

// The client's half of the handshake (store_auth.c): nonces both ways, then each side
// proves the token. Neither the token nor anything replayable crosses the wire.
static dt_status client_handshake(dt_store *s, const char *token) {
    uint8_t cnonce[DT_NONCE_BYTES], snonce[DT_NONCE_BYTES], proof[DT_SHA256_BYTES];
    dt_random_bytes(cnonce, sizeof cnonce);
    char desc[128], host[64] = "?";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    snprintf(desc, sizeof desc, "host %s pid %d", host, (int)getpid());
    const void    *parts[2] = {cnonce, desc};
    size_t         lens[2]  = {DT_NONCE_BYTES, strlen(desc)};
    dt_store_msg   reply;
    uint8_t       *rbuf;
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    DT_TRY(tcp_exchange(s, DT_STORE_HELLO, DT_STORE_PROTOCOL_VERSION, 2, parts, lens, 0, &reply,
                        &rbuf));
    bool ok = dt_store_msg_part(&reply, &cur, &p, &len) && len == DT_NONCE_BYTES;
    if (ok)
        memcpy(snonce, p, DT_NONCE_BYTES);
    bool server_has_token =
        ok && dt_store_msg_part(&reply, &cur, &p, &len) && len == 1 && *p == '1';
    dt_free(rbuf);
    if (!ok)
        return dt_fail(DT_ERR_FORMAT, "store %s:%d: expected a 32-byte nonce in the hello reply",
                       s->host, s->port);
    if (token)
        dt_token_proof(token, DT_STORE_PROOF_CLIENT, snonce, cnonce, NULL, 0, proof);
    const void *ap[1] = {proof};
    size_t      al[1] = {token ? DT_SHA256_BYTES : 0};
    DT_TRY(tcp_exchange(s, DT_STORE_AUTH, 0, 1, ap, al, 0, &reply, &rbuf));
    cur = 0;
    ok  = dt_store_msg_part(&reply, &cur, &p, &len);
    if (token && !server_has_token) {
        // A store without a token admits anyone, and has nothing to prove.
        ok = ok && len == 0;
    } else if (token) {
        uint8_t want[DT_SHA256_BYTES];
        dt_token_proof(token, DT_STORE_PROOF_SERVER, cnonce, snonce, NULL, 0, want);
        ok = ok && len == DT_SHA256_BYTES && dt_ct_equal(p, want, DT_SHA256_BYTES);
    }
    dt_free(rbuf);
    if (!ok) {
        snprintf(s->broken, sizeof s->broken, "store %s:%d: the server failed the token check",
                 s->host, s->port);
        return dt_fail(DT_ERR_MISMATCH,
                       "store %s:%d: job token mismatch: the server could not prove it holds "
                       "this job's token (a store of another job on this port?)",
                       s->host, s->port);
    }
    return DT_OK;
}

dt_status dt_store_new_tcp(dt_store **out, const char *host, int port, bool is_server,
                           const dt_store_opts *opts) {
    *out = NULL;
    if (!is_server && (!host || !*host))
        return dt_fail(DT_ERR_ARG, "store: expected the server's host name or address, found %s",
                       host ? "an empty string" : "NULL");
    if (port < 0 || port > 65535 || (!is_server && port == 0))
        return dt_fail(DT_ERR_ARG, "store: expected a port in [%d, 65535], found %d",
                       is_server ? 0 : 1, port);
    dt_store *s = NULL;
    DT_TRY(store_new(STORE_TCP, opts, &s));
    const char *token = dt_token_resolve(opts ? opts->token : NULL);
    dt_status   st    = DT_OK;
    if (is_server) {
        st = dt_store_server_start(port, token, opts && opts->loopback_only, &s->server, &s->port);
        if (st != DT_OK)
            goto fail;
        // The server's own process talks to it over loopback like any client.
        snprintf(s->host, sizeof s->host, "127.0.0.1");
    } else {
        snprintf(s->host, sizeof s->host, "%s", host);
        s->port = port;
    }
    if ((st = dt_sock_connect(s->host, s->port, deadline_for(s->timeout_ms), "store", &s->fd)) !=
        DT_OK)
        goto fail;
    if ((st = client_handshake(s, token)) != DT_OK)
        goto fail;
    *out = s;
    return DT_OK;
fail:
    dt_store_free(s);
    return st;
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

dt_status dt_store_new_file(dt_store **out, const char *path, const dt_store_opts *opts) {
    *out = NULL;
    if (!path || !*path)
        return dt_fail(DT_ERR_ARG, "file store: expected a path, found %s", path ? "\"\"" : "NULL");
    dt_store *s = NULL;
    DT_TRY(store_new(STORE_FILE, opts, &s));
    dt_status st = DT_ERR_NOMEM;
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
    *out = s;
    return DT_OK;
fail:
    dt_store_free(s);
    return st;
}

// ----------------------------------------------------------------------- prefix views

dt_status dt_store_new_prefix(dt_store **out, dt_store *base, const char *prefix) {
    *out = NULL;
    if (!base || !prefix || !*prefix)
        return dt_fail(DT_ERR_ARG, "store prefix: expected a store and a non-empty prefix");
    dt_store *s = NULL;
    DT_TRY(store_new(STORE_PREFIX, NULL, &s));
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
                all = dt_kv_find(&s->kv, parts[i]) != NULL;
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
    if (!dt_store_msg_part(&reply, &cur, &p, &len) || !dt_store_parse_i64(p, len, &nv))
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
        bool         present = expected != NULL;
        dt_kv_entry *e       = dt_kv_find(&s->kv, k);
        bool         eq      = present ? (e && e->len == expected_nbytes &&
                             memcmp(e->val, expected, expected_nbytes) == 0)
                                       : e == NULL;
        dt_status    st      = DT_OK;
        *swapped             = false;
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
        if (dt_kv_find(&s->kv, k)) {
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
    dt_store_server_free(s->server);
    if (s->ffd >= 0)
        close(s->ffd);
    dt_kv_free(&s->kv);
    dt_free(s->path);
    dt_free(s->prefix);
    pthread_mutex_destroy(&s->mu);
    dt_free(s);
}
