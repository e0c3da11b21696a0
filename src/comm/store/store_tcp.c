// store_tcp.c: the TCP store's client: one connection to the server (store_server.c,
// run by rank 0), the handshake that proves the job token both ways (auth.c), and
// one request/reply exchange per operation in the protocol of store_proto.c. Requests
// on one handle are serialised by its lock; a stream that went out of step (an I/O
// error, a cap, a bad reply) leaves the handle failing with the first reason.
#include "comm/store/store_impl.h"
#include "core/hmac.h"
#include "core/le.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// Slack added to a blocking request's I/O deadline: the server answers a timed-out
// get/wait itself; the client only gives up on its own if the server went silent.
#define CLIENT_SLACK_MS 10000

typedef struct tcp_store {
    dt_store         h;
    pthread_mutex_t  mu; // serialises requests
    int              fd;
    char             host[256];
    int              port;
    char             broken[512]; // set once the connection is unusable: the reason
    dt_store_server *server;      // in the server's process
} tcp_store;

// This thread's cap on the I/O of TCP store requests (dt_store_cap_io); UINT64_MAX = none.
static _Thread_local uint64_t io_cap_ns = UINT64_MAX;

uint64_t dt_store_cap_io(uint64_t deadline_ns) {
    uint64_t old = io_cap_ns;
    io_cap_ns    = deadline_ns;
    return old;
}

// Takes the request lock; under a cap, gives up at the cap.
static dt_status store_lock(tcp_store *s) {
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
// One request/reply exchange on a TCP store. On success *reply views into *rbuf
// (owned by the caller, dt_free). The reply's status becomes the return value, with
// the server's message.
static dt_status tcp_exchange(tcp_store *s, uint8_t cmd, int64_t arg, int nparts,
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
    int64_t  io_ms = wait_ms < 0 ? -1 : (wait_ms > 0 ? wait_ms : s->h.timeout_ms);
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

// The client's half of the handshake (auth.c): nonces both ways, then each side
// proves the token. Neither the token nor anything replayable crosses the wire.
static dt_status client_handshake(tcp_store *s, const char *token) {
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

// ------------------------------------------------------------------ the operations

static dt_status tcp_set(dt_store *h, const char *k, const void *value, size_t nbytes) {
    tcp_store   *s        = (tcp_store *)h;
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

static dt_status tcp_get(dt_store *h, const char *k, int64_t timeout, void **value,
                         size_t *nbytes) {
    tcp_store   *s        = (tcp_store *)h;
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

// WAIT or CHECK of full keys.
static dt_status keys_request(tcp_store *s, uint8_t cmd, const char *const *keys, size_t nkeys,
                              int64_t timeout_ms, bool *all_exist) {
    size_t *lens = dt_alloc((nkeys + 1) * sizeof *lens);
    if (!lens)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < nkeys; i++)
        lens[i] = strlen(keys[i]);
    dt_store_msg reply;
    uint8_t     *rbuf;
    dt_status    st = store_lock(s);
    if (st != DT_OK)
        goto done;
    st = tcp_exchange(s, cmd, timeout_ms, (int)nkeys, (const void *const *)keys, lens,
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
    dt_free(lens);
    return st;
}

static dt_status tcp_wait(dt_store *h, const char *const *keys, size_t nkeys, int64_t timeout_ms) {
    return keys_request((tcp_store *)h, DT_STORE_WAIT, keys, nkeys, timeout_ms, NULL);
}

static dt_status tcp_check(dt_store *h, const char *const *keys, size_t nkeys, int64_t timeout_ms,
                           bool *all_exist) {
    return keys_request((tcp_store *)h, DT_STORE_CHECK, keys, nkeys, timeout_ms, all_exist);
}

static dt_status tcp_add(dt_store *h, const char *k, int64_t delta, int64_t *value) {
    tcp_store   *s        = (tcp_store *)h;
    int64_t      nv       = 0;
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

static dt_status tcp_compare_set(dt_store *h, const char *k, const void *expected,
                                 size_t expected_nbytes, const void *desired, size_t desired_nbytes,
                                 bool *swapped) {
    tcp_store   *s        = (tcp_store *)h;
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

static dt_status tcp_delete(dt_store *h, const char *k, bool *deleted) {
    tcp_store   *s        = (tcp_store *)h;
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
    bool           del = dt_store_msg_part(&reply, &cur, &p, &len) && len == 1 && p[0] == '1';
    dt_free(rbuf);
    if (deleted)
        *deleted = del;
    return DT_OK;
}

static int tcp_port(const dt_store *h) {
    return ((const tcp_store *)h)->port;
}

static bool tcp_local_addr(dt_store *h, char *buf, size_t n) {
    tcp_store *s = (tcp_store *)h;
    pthread_mutex_lock(&s->mu);
    bool ok = s->fd >= 0 && dt_sock_local_addr(s->fd, buf, n);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static void tcp_free(dt_store *h) {
    tcp_store *s = (tcp_store *)h;
    if (s->fd >= 0)
        close(s->fd);
    dt_store_server_free(s->server);
    pthread_mutex_destroy(&s->mu);
    dt_free(s);
}

static const dt_store_ops tcp_ops = {
    .kind        = "tcp",
    .set         = tcp_set,
    .get         = tcp_get,
    .wait        = tcp_wait,
    .check       = tcp_check,
    .add         = tcp_add,
    .compare_set = tcp_compare_set,
    .del         = tcp_delete,
    .port        = tcp_port,
    .local_addr  = tcp_local_addr,
    .free        = tcp_free,
};

// -------------------------------------------------------------------- the constructor

dt_status dt_store_new_tcp(dt_store **out, const char *host, int port, bool is_server,
                           const dt_store_opts *opts) {
    *out = NULL;
    if (!is_server && (!host || !*host))
        return dt_fail(DT_ERR_ARG, "store: expected the server's host name or address, found %s",
                       host ? "an empty string" : "NULL");
    if (port < 0 || port > 65535 || (!is_server && port == 0))
        return dt_fail(DT_ERR_ARG, "store: expected a port in [%d, 65535], found %d",
                       is_server ? 0 : 1, port);
    tcp_store *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    dt_status st = dt_store_init_base(&s->h, &tcp_ops, opts);
    if (st != DT_OK)
        goto fail;
    const char *token = dt_token_resolve(opts ? opts->token : NULL);
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
    if ((st = dt_sock_connect(s->host, s->port, dt_store_deadline(s->h.timeout_ms), "store",
                              "rank 0 runs the store: is it running, and are MASTER_ADDR and "
                              "MASTER_PORT right?",
                              &s->fd)) != DT_OK)
        goto fail;
    if ((st = client_handshake(s, token)) != DT_OK)
        goto fail;
    *out = &s->h;
    return DT_OK;
fail:
    tcp_free(&s->h);
    return st;
}
