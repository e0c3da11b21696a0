// store_server.c: the TCP store's server: one thread with a poll loop, inside the
// process that creates it (rank 0). It serves the protocol of comm_impl.h to clients
// that have proven the job token (auth.c) and treats everyone else as hostile:
// small messages, few connections and little time before the proof.
#include "comm/store/store_impl.h"
#include "core/hmac.h"
#include "core/le.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// Until a client has proven the job token it may send at most this many payload bytes
// per message (a hello is 50), it may hold no more than MAX_PREAUTH connections open
// (the oldest is dropped for a new one), and it must finish within DT_STORE_AUTH_MS.
#define PREAUTH_PAYLOAD 1024
#define PREAUTH_LIMIT   (2 * (DT_STORE_HEADER_BYTES + PREAUTH_PAYLOAD))
#define MAX_PREAUTH     64
#define MAX_CONNS       65536
// A proven client whose message stops half-way for this long is dropped.
#define STALL_MS 60000

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct srv_conn {
    int      fd;
    char     peer[160]; // "10.0.0.2:45678 (host b pid 77)" for the log
    uint8_t  stage;     // 0: new, 1: hello answered, 2: proven (greeted)
    uint8_t  cnonce[DT_NONCE_BYTES], snonce[DT_NONCE_BYTES];
    uint64_t accepted; // when it connected
    uint64_t last_rx;  // when a byte last arrived
    dt_buf   in;       // bytes received, not yet handled
    dt_buf   out;      // bytes to send
    size_t   out_off;  // sent so far
    bool     greeted;  // HELLO accepted
    bool     closing;  // close once `out` is flushed
    bool     blocked;  // a get/wait at the front of `in` waits for keys
    uint64_t deadline; // of the blocked request (UINT64_MAX = none)
    uint64_t started;  // when the blocked request arrived
} srv_conn;

typedef struct dt_store_server {
    int        listen_fd;
    int        wake[2]; // a byte here stops the loop
    pthread_t  thread;
    char      *token;        // NULL = accept any client
    int        spare_fd;     // held for the moment the process runs out of descriptors
    uint64_t   accept_pause; // listen fd not polled before this (out of descriptors)
    uint64_t   auth_ns, stall_ns;
    dt_kv_map  kv;    // server thread only
    srv_conn **conns; // server thread only
    size_t     nconns, cap;
} dt_store_server;

static void conn_reply(srv_conn *c, dt_status st, int nparts, const void *const *parts,
                       const size_t *lens) {
    if (dt_buf_message(&c->out, (uint8_t)st, 0, nparts, parts, lens) != DT_OK)
        c->closing = true; // out of memory: drop the client rather than lie to it
}

static void conn_reply_text(srv_conn *c, dt_status st, const char *text) {
    const void *parts[1] = {text};
    size_t      lens[1]  = {strlen(text)};
    conn_reply(c, st, 1, parts, lens);
}

// Handles the request at the front of c->in (msg). Returns false when the request must
// wait for keys (stays at the front, c->blocked set).
static bool srv_handle(dt_store_server *s, srv_conn *c, const dt_store_msg *m) {
    char           key[DT_STORE_MAX_KEY + 1];
    size_t         cur = 0;
    const uint8_t *p   = NULL;
    uint32_t       len = 0;
    if (dt_store_msg_check_request(m) != DT_OK) {
        conn_reply_text(c, DT_ERR_FORMAT, dt_last_error());
        c->closing = true;
        return true;
    }
    if (!c->greeted && m->code != DT_STORE_HELLO && m->code != DT_STORE_AUTH) {
        conn_reply_text(c, DT_ERR_FORMAT, "expected a hello and the job token's proof first");
        c->closing = true;
        return true;
    }
    switch ((dt_store_cmd)m->code) {
    case DT_STORE_HELLO: {
        dt_store_msg_part(m, &cur, &p, &len);
        const uint8_t *cn   = p;
        uint32_t       cnl  = len;
        const uint8_t *desc = NULL;
        uint32_t       dl   = 0;
        dt_store_msg_part(m, &cur, &desc, &dl);
        if (c->stage != 0) {
            conn_reply_text(c, DT_ERR_FORMAT, "expected one hello, found a second");
            c->closing = true;
        } else if (m->arg != DT_STORE_PROTOCOL_VERSION) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "expected store protocol version %d, found %lld (every machine needs the "
                     "same dtrain version)",
                     DT_STORE_PROTOCOL_VERSION, (long long)m->arg);
            conn_reply_text(c, DT_ERR_MISMATCH, msg);
            c->closing = true;
        } else if (cnl != DT_NONCE_BYTES) {
            conn_reply_text(c, DT_ERR_FORMAT, "hello: expected a 32-byte nonce");
            c->closing = true;
        } else {
            memcpy(c->cnonce, cn, DT_NONCE_BYTES);
            dt_random_bytes(c->snonce, DT_NONCE_BYTES);
            // What the client says it is, printable bytes only, for the log.
            size_t o = strlen(c->peer);
            if (dl && o + 4 < sizeof c->peer) {
                c->peer[o++] = ' ', c->peer[o++] = '(';
                for (uint32_t i = 0; i < dl && o + 2 < sizeof c->peer; i++)
                    c->peer[o++] = desc[i] >= 32 && desc[i] < 127 ? (char)desc[i] : '?';
                c->peer[o++] = ')', c->peer[o] = '\0';
            }
            c->stage             = 1;
            const void *parts[2] = {c->snonce, s->token ? "1" : "0"};
            size_t      lens[2]  = {DT_NONCE_BYTES, 1};
            conn_reply(c, DT_OK, 2, parts, lens);
        }
        return true;
    }
    case DT_STORE_AUTH: {
        dt_store_msg_part(m, &cur, &p, &len);
        const char *why = NULL;
        uint8_t     want[DT_SHA256_BYTES];
        if (c->stage != 1) {
            why = "expected a hello before auth";
        } else if (s->token) {
            dt_token_proof(s->token, DT_STORE_PROOF_CLIENT, c->snonce, c->cnonce, NULL, 0, want);
            if (len == 0)
                why = "job token mismatch: this store expects a job token and the client has "
                      "none (give every machine the same --job-token or DT_JOB_TOKEN)";
            else if (len != DT_SHA256_BYTES || !dt_ct_equal(p, want, DT_SHA256_BYTES))
                why = "job token mismatch: the client's job token is not this store's (give "
                      "every machine the same --job-token or DT_JOB_TOKEN; a process of "
                      "another job or an earlier run?)";
        } // A store without a token admits every client.
        if (why) {
            dt_log_refusal("store: refused the client at %s: %s", c->peer, why);
            conn_reply_text(c, c->stage == 1 ? DT_ERR_MISMATCH : DT_ERR_FORMAT, why);
            c->closing = true;
            return true;
        }
        c->stage   = 2;
        c->greeted = true;
        uint8_t proof[DT_SHA256_BYTES];
        if (s->token)
            dt_token_proof(s->token, DT_STORE_PROOF_SERVER, c->cnonce, c->snonce, NULL, 0, proof);
        const void *parts[1] = {proof};
        size_t      lens[1]  = {s->token ? DT_SHA256_BYTES : 0};
        conn_reply(c, DT_OK, 1, parts, lens);
        return true;
    }
    case DT_STORE_SET: {
        dt_store_msg_part(m, &cur, &p, &len);
        uint32_t       klen = len;
        const uint8_t *kp   = p;
        dt_store_msg_part(m, &cur, &p, &len);
        if (dt_kv_set(&s->kv, (const char *)kp, klen, p, len) != DT_OK)
            conn_reply_text(c, DT_ERR_NOMEM, "set: out of memory in the store server");
        else
            conn_reply(c, DT_OK, 0, NULL, NULL);
        return true;
    }
    case DT_STORE_GET: {
        dt_store_msg_part(m, &cur, &p, &len);
        dt_kv_entry *e = dt_kv_find(&s->kv, dt_store_part_key(p, len, key));
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
            all = dt_kv_find(&s->kv, dt_store_part_key(p, len, key)) != NULL;
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
        if (dt_kv_add(&s->kv, dt_store_part_key(p, len, key), m->arg, &nv) != DT_OK) {
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
        dt_store_part_key(p, len, key);
        const uint8_t *exp = NULL, *des = NULL;
        uint32_t       explen = 0, deslen = 0;
        dt_store_msg_part(m, &cur, &exp, &explen);
        dt_store_msg_part(m, &cur, &des, &deslen);
        bool swapped;
        if (dt_kv_cas(&s->kv, key, (m->arg & 1) != 0, exp, explen, des, deslen, &swapped) !=
            DT_OK) {
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
        bool        del      = dt_kv_delete(&s->kv, dt_store_part_key(p, len, key));
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
        if (dt_kv_find(&s->kv, dt_store_part_key(p, len, key)))
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
static void srv_pump(dt_store_server *s, srv_conn *c) {
    while (!c->closing) {
        dt_store_msg m;
        size_t       used;
        if (!c->greeted && c->in.len >= DT_STORE_HEADER_BYTES &&
            dt_get_le32(c->in.p) == DT_STORE_MAGIC && dt_get_le32(c->in.p + 16) > PREAUTH_PAYLOAD) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "store message: expected at most %u payload bytes before the client has "
                     "proven the job token, found %u",
                     PREAUTH_PAYLOAD, dt_get_le32(c->in.p + 16));
            conn_reply_text(c, DT_ERR_FORMAT, msg);
            c->closing = true;
            return;
        }
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

static srv_conn *srv_add(dt_store_server *s, int fd) {
    if (s->nconns == s->cap) {
        size_t     cap = s->cap ? s->cap * 2 : 16;
        srv_conn **nc  = dt_alloc(cap * sizeof *nc);
        if (!nc)
            return NULL;
        if (s->nconns)
            memcpy(nc, s->conns, s->nconns * sizeof *nc);
        dt_free(s->conns);
        s->conns = nc;
        s->cap   = cap;
    }
    srv_conn *c = dt_alloc_zero(sizeof *c);
    if (!c)
        return NULL;
    c->fd       = fd;
    c->accepted = c->last_rx               = dt_now_ns();
    struct sockaddr_in a                   = {0};
    socklen_t          alen                = sizeof a;
    char               ip[INET_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&a, &alen) == 0 && a.sin_family == AF_INET)
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    snprintf(c->peer, sizeof c->peer, "%s:%u", ip, (unsigned)ntohs(a.sin_port));
    s->conns[s->nconns++] = c;
    return c;
}

// The process is out of file descriptors: accept with the spare one, tell the client
// why in a reply it reads as the answer to its hello, and close; else stop polling
// the listening socket for a while (an unaccepted connection keeps it readable, and
// polling it again at once would spin).
static void srv_out_of_fds(dt_store_server *s, int err) {
    struct rlimit rl  = {0};
    long          lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
    char          msg[400];
    snprintf(msg, sizeof msg,
             "the store server (in the process of rank 0) cannot accept connections: %s "
             "(RLIMIT_NOFILE %ld); raise the limit (ulimit -n) or run fewer processes",
             strerror(err), lim);
    dt_log_refusal("store: cannot accept a connection: %s (RLIMIT_NOFILE %ld)", strerror(err), lim);
    if (s->spare_fd >= 0) {
        close(s->spare_fd);
        s->spare_fd = -1;
        int fd      = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            srv_conn *c = srv_add(s, fd);
            if (!c) {
                close(fd);
            } else {
                conn_reply_text(c, DT_ERR_IO, msg);
                c->closing = true;
                c->greeted = true; // its bytes are not parsed: it is only told and closed
            }
            return;
        }
    }
    s->accept_pause = dt_now_ns() + 200 * 1000000ull;
}

static void srv_accept(dt_store_server *s) {
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                srv_out_of_fds(s, errno);
            return; // EAGAIN, or a transient error: try again on the next wake-up
        }
        dt_sock_tune(fd, 0);
        // Connections that have not proven the token are capped: the oldest makes room.
        size_t   npre = 0, oldest = SIZE_MAX;
        uint64_t t = UINT64_MAX;
        for (size_t i = 0; i < s->nconns; i++) {
            srv_conn *o = s->conns[i];
            if (!o->greeted && !o->closing) {
                npre++;
                if (o->accepted < t)
                    t = o->accepted, oldest = i;
            }
        }
        if (npre >= MAX_PREAUTH && oldest != SIZE_MAX) {
            dt_log_refusal("store: %d connections have not proven the job token; dropped the "
                           "oldest, from %s",
                           MAX_PREAUTH, s->conns[oldest]->peer);
            s->conns[oldest]->closing = true;
        }
        if (s->nconns >= MAX_CONNS || !srv_add(s, fd)) {
            close(fd);
            return;
        }
    }
}

// Reads what a client sent; false when the connection is finished.
static bool srv_read(srv_conn *c) {
    for (;;) {
        // Before the token is proven, a client gets a small buffer and no more.
        size_t room = c->greeted ? 65536 : PREAUTH_LIMIT - c->in.len;
        if (!c->greeted && c->in.len >= PREAUTH_LIMIT)
            return false;
        if (dt_buf_reserve(&c->in, room) != DT_OK)
            return false;
        if (c->greeted)
            room = c->in.cap - c->in.len;
        ssize_t k = recv(c->fd, c->in.p + c->in.len, room, 0);
        if (k > 0) {
            c->in.len += (size_t)k;
            c->last_rx = dt_now_ns();
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
    int k = dt_sock_send_frame(c->fd, c->out.p, c->out.len, NULL, 0, &c->out_off, 0, 0);
    if (k == 0)
        return true; // the socket is full: go on when poll says it has room
    if (k < 0)
        return false;
    c->out.len = c->out_off = 0;
    return !c->closing;
}

// When the connection must make progress next: its blocked request's deadline, the
// end of its time to prove the token, or the end of a stalled message.
static uint64_t conn_deadline(const dt_store_server *s, const srv_conn *c) {
    if (c->blocked)
        return c->deadline;
    if (c->closing)
        return UINT64_MAX;
    if (!c->greeted)
        return c->accepted + s->auth_ns;
    if (c->in.len > 0)
        return c->last_rx + s->stall_ns;
    return UINT64_MAX;
}

static void *srv_main(void *arg) {
    dt_store_server *s    = arg;
    struct pollfd   *pfds = NULL;
    size_t           pcap = 0;
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
        uint64_t now = dt_now_ns();
        if (s->spare_fd < 0)
            s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        bool paused      = now < s->accept_pause;
        pfds[0]          = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pfds[1]          = (struct pollfd){.fd = paused ? -1 : s->listen_fd, .events = POLLIN};
        uint64_t next_dl = paused ? s->accept_pause : UINT64_MAX;
        for (size_t i = 0; i < s->nconns; i++) {
            srv_conn *c  = s->conns[i];
            short     ev = c->closing ? 0 : POLLIN;
            if (c->out_off < c->out.len)
                ev |= POLLOUT;
            pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
            uint64_t dl = conn_deadline(s, c);
            if (dl < next_dl)
                next_dl = dl;
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
        // Connections that never proved the token, or stopped half-way through a message.
        now = dt_now_ns();
        for (size_t i = 0; i < s->nconns; i++) {
            srv_conn *c = s->conns[i];
            if (!c || c->closing || now < conn_deadline(s, c) || c->blocked)
                continue;
            dt_log_refusal("store: dropped the connection from %s: %s", c->peer,
                           c->greeted ? "a message stopped half-way"
                                      : "it did not prove the job token in time");
            conn_free(c);
            s->conns[i] = NULL;
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

void dt_store_server_free(dt_store_server *s) {
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
    dt_kv_free(&s->kv);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->spare_fd >= 0)
        close(s->spare_fd);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    dt_free(s->token);
    dt_free(s);
}

dt_status dt_store_server_start(int port, const char *token, bool loopback, dt_store_server **out,
                                int *bound) {
    dt_store_server *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    s->spare_fd                            = open("/dev/null", O_RDONLY | O_CLOEXEC);
    long      auth_ms;
    dt_status st = dt_setting_int("DT_STORE_AUTH_MS", &auth_ms);
    if (st != DT_OK)
        goto fail;
    s->auth_ns  = (uint64_t)auth_ms * 1000000ull;
    s->stall_ns = (uint64_t)(auth_ms > STALL_MS ? auth_ms : STALL_MS) * 1000000ull;
    st          = dt_sock_listen_on(loopback, port, 1024, "store", &s->listen_fd, bound);
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
    dt_store_server_free(s);
    return st;
}

#ifdef DT_FUZZ
// Feeds `n` bytes from one client to a server that has no sockets: parsing, checks and
// every command handler run as they do for a real client. For fuzz/fuzz_store_msg.c.
void dt_store_fuzz_serve(const uint8_t *data, size_t n);
void dt_store_fuzz_serve(const uint8_t *data, size_t n) {
    dt_store_server s = {.listen_fd = -1, .wake = {-1, -1}, .spare_fd = -1};
    srv_conn        c = {.fd = -1};
    // Feed in two pieces so partial messages are exercised too.
    size_t         half      = n / 2;
    const uint8_t *pieces[2] = {data, data + half};
    size_t         lens[2]   = {half, n - half};
    for (int i = 0; i < 2 && !c.closing; i++) {
        if (dt_buf_reserve(&c.in, lens[i]) != DT_OK)
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
    dt_kv_free(&s.kv);
}
#endif
