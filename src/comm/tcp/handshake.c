// handshake.c: the handshake of every connection of the tcp backend's mesh, by
// challenge-response (auth.c): the connecting rank sends its nonce (step 1); the
// accepting rank answers with its own nonce and its proof of the job token over both
// (step 2); the connecting rank checks it and sends its proof (step 3). Both proofs also
// cover the world size and the two ranks. Neither the token nor anything a listener
// could replay crosses the wire, and a refusal says nothing about the expected token.
//
// The accepting side runs the handshakes of all the connections it accepted at once,
// each against its own 2 s: it once ran them one at a time, so a stranger that connected
// and said nothing held the real ranks back 2 s each (10 strangers: 20 s of start-up).
#include "comm/tcp/handshake.h"
#include "comm/tcp/wire.h"
#include "core/hmac.h"
#include "core/le.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROOF_ACCEPTOR  "dtrain tcp acceptor"
#define PROOF_CONNECTOR "dtrain tcp connector"
// A connection has this long to finish its handshake once accepted; a real rank needs
// two round trips (milliseconds, also between machines).
#define HANDSHAKE_MS 2000
// Handshakes in flight; a connection beyond them drops the oldest. A real rank finishes
// within milliseconds of connecting, so only 64 new connections within that time could
// push it out (its init then fails, naming the closed connection). The store's server
// keeps as many connections that have not proven the token.
#define MAX_PENDING 64
// Steps 1 and 3: a header and 32 bytes (a nonce, a proof).
#define STEP_BYTES (DT_WIRE_HEADER_BYTES + 32)

static void encode_hello(const dt_tcp_self *s, uint32_t step, const void *payload, size_t n,
                         uint8_t *b) {
    dt_wire_header h = {.kind = DT_WIRE_HELLO, .src_rank = (uint32_t)s->rank, .step = step};
    h.fp.count       = (uint64_t)s->world;
    h.nbytes         = n;
    dt_wire_encode(&h, b);
    memcpy(b + DT_WIRE_HEADER_BYTES, payload, n);
}

static dt_status send_hello(const dt_tcp_self *s, int fd, uint64_t deadline, uint32_t step,
                            const void *payload, size_t n, const char *what) {
    uint8_t b[DT_WIRE_HEADER_BYTES + DT_WIRE_MAX_HELLO];
    encode_hello(s, step, payload, n, b);
    return dt_sock_write_all(fd, b, DT_WIRE_HEADER_BYTES + n, deadline, what);
}

// Checks the header at b: a hello of `step` with `n` payload bytes from a rank in
// [lo, hi) of our world.
static dt_status check_hello(const dt_tcp_self *s, const uint8_t *b, uint32_t step, size_t n,
                             int lo, int hi, const char *what, dt_wire_header *h) {
    DT_TRY(dt_wire_decode(b, DT_WIRE_HEADER_BYTES, h));
    if (h->kind != DT_WIRE_HELLO || h->step != step || h->nbytes != n)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected hello step %u with %zu bytes, found kind %u step %u with "
                       "%llu bytes (not a dtrain rank of this version?)",
                       what, step, n, h->kind, h->step, (unsigned long long)h->nbytes);
    if (h->fp.count != (uint64_t)s->world)
        return dt_fail(DT_ERR_MISMATCH, "%s: a rank with world size %llu answered, expected %d",
                       what, (unsigned long long)h->fp.count, s->world);
    if ((int)h->src_rank < lo || (int)h->src_rank >= hi)
        return dt_fail(DT_ERR_MISMATCH, "%s: expected a rank in [%d, %d), found rank %u", what, lo,
                       hi, h->src_rank);
    return DT_OK;
}

// What both proofs cover besides the nonces: world size, connecting and accepting rank.
static void hello_ctx(int world, int connector, int acceptor, uint8_t out[12]) {
    dt_put_le32(out, (uint32_t)world);
    dt_put_le32(out + 4, (uint32_t)connector);
    dt_put_le32(out + 8, (uint32_t)acceptor);
}

dt_status dt_tcp_handshake_connect(const dt_tcp_self *s, int fd, int r, uint64_t deadline,
                                   const char *what) {
    uint8_t mine[DT_NONCE_BYTES], ctx[12], want[32];
    dt_random_bytes(mine, sizeof mine);
    hello_ctx(s->world, s->rank, r, ctx);
    DT_TRY(send_hello(s, fd, deadline, 1, mine, sizeof mine, what));
    // Rank r answers once it has connected to the ranks below it: the group deadline.
    uint8_t        b[DT_WIRE_HEADER_BYTES + 64];
    dt_wire_header h;
    DT_TRY(dt_sock_read_all(fd, b, DT_WIRE_HEADER_BYTES, deadline, what));
    DT_TRY(check_hello(s, b, 2, 64, r, r + 1, what, &h));
    DT_TRY(dt_sock_read_all(fd, b + DT_WIRE_HEADER_BYTES, 64, deadline, what));
    const uint8_t *theirs = b + DT_WIRE_HEADER_BYTES;
    dt_token_proof(s->token, PROOF_ACCEPTOR, mine, theirs, ctx, sizeof ctx, want);
    if (!dt_ct_equal(want, theirs + DT_NONCE_BYTES, 32))
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: the process at its address does not hold this job's token (a "
                       "process of another job, or a rank started with another DT_JOB_TOKEN?)",
                       what);
    uint8_t proof[32];
    dt_token_proof(s->token, PROOF_CONNECTOR, theirs, mine, ctx, sizeof ctx, proof);
    return send_hello(s, fd, deadline, 3, proof, sizeof proof, what);
}

// ------------------------------------------------------------------ accepting side

// A connection in its handshake.
typedef struct pending {
    int      fd;
    uint32_t step; // what it reads: 1 (the connector's nonce) or 3 (its proof)
    int      rank; // claimed in step 1
    size_t   have; // bytes of the step in buf
    bool     header_checked;
    uint64_t deadline;
    uint8_t  buf[STEP_BYTES];
    uint8_t  theirs[DT_NONCE_BYTES], mine[DT_NONCE_BYTES];
    char     from[64]; // "10.0.0.2:41234", for messages
} pending;

// Closes p's connection with a (rate-limited) warning saying why.
static void drop(pending *p, const char *fmt, ...) DT_PRINTF(2, 3);
static void drop(pending *p, const char *fmt, ...) {
    char    why[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    dt_log_refusal("%s; connection from %s ignored", why, p->from);
    close(p->fd);
    p->fd = -1;
}

// Reads what arrived on p and answers step 1. 1 when p has proven the token of rank
// p->rank, 0 while it is under way, -1 when it was dropped.
static int advance(const dt_tcp_self *s, pending *p) {
    const char *what = "tcp init: a connecting process";
    for (;;) {
        ssize_t k = recv(p->fd, p->buf + p->have, STEP_BYTES - p->have, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (k <= 0) {
            if (k == 0)
                drop(p, "%s closed the connection during the handshake", what);
            else
                drop(p, "%s: %s", what, strerror(errno));
            return -1;
        }
        p->have += (size_t)k;
        if (!p->header_checked && p->have >= DT_WIRE_HEADER_BYTES) {
            // Step 1 may come from any rank above ours, step 3 only from the one it named.
            int            lo = p->step == 1 ? s->rank + 1 : p->rank;
            int            hi = p->step == 1 ? s->world : p->rank + 1;
            dt_wire_header h;
            if (check_hello(s, p->buf, p->step, 32, lo, hi, what, &h) != DT_OK) {
                drop(p, "%s", dt_last_error());
                return -1;
            }
            p->header_checked = true;
            if (p->step == 1)
                p->rank = (int)h.src_rank;
        }
        if (p->have < STEP_BYTES)
            continue;
        const uint8_t *payload = p->buf + DT_WIRE_HEADER_BYTES;
        uint8_t        ctx[12];
        hello_ctx(s->world, p->rank, s->rank, ctx);
        if (p->step == 1) {
            uint8_t reply[64], frame[DT_WIRE_HEADER_BYTES + 64];
            memcpy(p->theirs, payload, DT_NONCE_BYTES);
            dt_random_bytes(p->mine, DT_NONCE_BYTES);
            memcpy(reply, p->mine, DT_NONCE_BYTES);
            dt_token_proof(s->token, PROOF_ACCEPTOR, p->theirs, p->mine, ctx, sizeof ctx,
                           reply + DT_NONCE_BYTES);
            encode_hello(s, 2, reply, sizeof reply, frame);
            // A new connection's send buffer takes these 112 bytes at once: never wait.
            size_t done = 0;
            if (dt_sock_send_frame(p->fd, frame, sizeof frame, NULL, 0, &done, 0, 0) != 1) {
                drop(p, "tcp init: answering a process that claims rank %d: %s", p->rank,
                     strerror(errno ? errno : EAGAIN));
                return -1;
            }
            p->step           = 3;
            p->have           = 0;
            p->header_checked = false;
            continue;
        }
        uint8_t want[32];
        dt_token_proof(s->token, PROOF_CONNECTOR, p->mine, p->theirs, ctx, sizeof ctx, want);
        if (!dt_ct_equal(want, payload, 32)) {
            drop(p, "tcp init: a process claiming rank %d does not hold this job's token", p->rank);
            return -1;
        }
        return 1;
    }
}

// Keeps the entries whose connection is open, in order; returns their count.
static int compact(pending *p, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (p[i].fd >= 0)
            p[k++] = p[i];
    return k;
}

// "2, 5": the ranks above ours without a connection.
static int missing_ranks(const dt_tcp_self *s, const int *fds, char *buf, size_t n) {
    size_t off     = 0;
    int    missing = 0;
    buf[0]         = '\0';
    for (int r = s->rank + 1; r < s->world; r++)
        if (fds[r] < 0) {
            if (off < n - 16)
                off += (size_t)snprintf(buf + off, n - off, "%s%d", missing ? ", " : "", r);
            else if (off < n - 4)
                off += (size_t)snprintf(buf + off, n - off, " ...");
            missing++;
        }
    return missing;
}

// Accepts what waits on lfd (a burst at a time); returns the new count of pending.
static int accept_new(int lfd, pending *pend, int n, uint64_t deadline, uint64_t *pause_until) {
    for (int burst = 0; burst < 16; burst++) {
        struct sockaddr_in a  = {0};
        socklen_t          al = sizeof a;
        int fd = accept4(lfd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            // Out of descriptors or memory: the listening socket stays readable, so wait
            // 100 ms for handshakes to end instead of spinning on it.
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                *pause_until = dt_now_ns() + 100000000ull;
            return n;
        }
        if (n == MAX_PENDING) {
            drop(&pend[0], "tcp init: %d connections are in their handshake; dropped the oldest",
                 MAX_PENDING);
            n = compact(pend, n);
        }
        pending *p = &pend[n++];
        memset(p, 0, sizeof *p);
        p->fd       = fd;
        p->step     = 1;
        p->deadline = dt_deadline_ns(HANDSHAKE_MS);
        if (p->deadline > deadline)
            p->deadline = deadline;
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        snprintf(p->from, sizeof p->from, "%s:%d", ip, ntohs(a.sin_port));
    }
    return n;
}

dt_status dt_tcp_accept_ranks(const dt_tcp_self *s, int lfd, int *fds, uint64_t deadline) {
    char missing[256];
    int  expected = missing_ranks(s, fds, missing, sizeof missing);
    if (expected == 0)
        return DT_OK;
    pending *pend = dt_alloc(MAX_PENDING * sizeof *pend);
    if (!pend)
        return DT_ERR_NOMEM;
    struct pollfd  pf[MAX_PENDING + 1];
    int            n           = 0;
    uint64_t       pause_until = 0;
    dt_status      st          = DT_OK;
    dt_wait_notice notice;
    dt_wait_notice_start(&notice, deadline);
    dt_sock_set_nonblocking(lfd, true);
    while (expected > 0) {
        uint64_t now = dt_now_ns();
        for (int i = 0; i < n; i++)
            if (now >= pend[i].deadline)
                drop(&pend[i],
                     "tcp init: a connecting process did not finish the handshake within %d ms",
                     HANDSHAKE_MS);
        n = compact(pend, n);
        if (now >= deadline) {
            int m = missing_ranks(s, fds, missing, sizeof missing);
            st    = dt_fail(DT_ERR_TIMEOUT, "tcp init: timed out waiting for rank%s %s to connect",
                         m > 1 ? "s" : "", missing);
            break;
        }
        if (dt_wait_notice_due(&notice)) {
            char t[160];
            int  m = missing_ranks(s, fds, missing, sizeof missing);
            dt_wait_notice_times(&notice, t, sizeof t);
            DT_WARN("comm", "tcp init: waiting for rank%s %s to connect; %s", m > 1 ? "s" : "",
                    missing, t);
        }
        // Sleep until something arrives, a handshake's or the wait's deadline, or the
        // next notice.
        int ms = dt_ms_left(deadline), nm = dt_wait_notice_ms(&notice);
        if (nm < ms)
            ms = nm;
        for (int i = 0; i < n; i++) {
            int left = dt_ms_left(pend[i].deadline);
            if (left < ms)
                ms = left;
        }
        bool listening = now >= pause_until;
        pf[0]          = (struct pollfd){.fd = listening ? lfd : -1, .events = POLLIN};
        for (int i = 0; i < n; i++)
            pf[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        if (!listening && dt_ms_left(pause_until) < ms)
            ms = dt_ms_left(pause_until);
        int rc = poll(pf, (nfds_t)n + 1, ms + 1);
        if (rc < 0 && errno != EINTR) {
            st = dt_fail_errno(DT_ERR_IO, "tcp init: poll");
            break;
        }
        if (rc <= 0)
            continue;
        for (int i = 0; i < n; i++) {
            if (!pf[i + 1].revents || advance(s, &pend[i]) <= 0)
                continue;
            int r = pend[i].rank;
            if (fds[r] >= 0) {
                DT_WARN("comm", "tcp init: rank %d connected twice; second connection ignored", r);
                close(pend[i].fd);
            } else {
                dt_sock_set_nonblocking(pend[i].fd, false);
                fds[r] = pend[i].fd;
                expected--;
            }
            pend[i].fd = -1;
        }
        n = compact(pend, n);
        if (pf[0].revents)
            n = accept_new(lfd, pend, n, deadline, &pause_until);
    }
    // Connections still in their handshake once every rank is in: strangers.
    for (int i = 0; i < n; i++)
        close(pend[i].fd);
    dt_free(pend);
    return st;
}
