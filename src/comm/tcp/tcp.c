// tcp.c: the tcp backend. A full mesh of TCP connections (one per pair of ranks, set
// up through the store at init), non-blocking sockets driven by one poll() loop on the
// thread that runs the operation, and point-to-point transfers for the generic
// algorithms (algo.c). Every message is a 48-byte header (wire.h: the operation's
// fingerprint, the transfer's step, the payload size) followed by the payload, which
// goes straight from the sender's buffer to the receiver's (no staging copies).
//
// Failure detection: every connection is polled for hang-ups during every wait, so
// the death of any rank is seen at once by all others, whoever they were waiting for.
// A rank that fails sends an "abort" message with its reason to every peer and shuts
// its connections down; a rank that leaves normally sends "bye". Reading what a closed
// connection still holds tells the three apart: abort (adopt the reason), bye (fine
// unless we needed more data), nothing (the rank died: "rank 3 closed the connection").
#include "comm/comm_impl.h"
#include "comm/tcp/handshake.h"
#include "comm/tcp/wire.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

// Time an aborting rank spends finishing the message in flight on each connection
// (so that its abort message starts on a message boundary), in total.
#define ABORT_BUDGET_MS 200
// Time an aborting rank, or one that found a connection closed, spends on the store
// (which may be unreachable: a cut link, a frozen rank 0).
#define STORE_BUDGET_MS 1000
// Time dt_pg_free spends saying bye.
#define BYE_BUDGET_MS 200

typedef struct peer {
    int  rank;
    int  fd;
    bool eof;     // the socket is drained to its end: reads come from `tail` only
    bool hungup;  // hang-up seen and processed
    bool bye;     // the peer left cleanly (its bye message was read)
    bool wr_shut; // we shut our sending side down

    // Inbound: the frame being parsed.
    uint8_t        hdr[DT_WIRE_HEADER_BYTES];
    size_t         hdr_have;
    bool           in_payload;
    uint64_t       payload_left;
    dt_wire_header cur;
    char           reason[DT_WIRE_MAX_REASON + 1]; // abort/bye text being read
    size_t         reason_have;

    // Bytes read ahead after a hang-up (all the socket still had).
    uint8_t *tail;
    size_t   tail_len, tail_off;

    // Posted transfers, in order.
    dt_xfer *rq_head, *rq_tail;
    dt_xfer *sq_head, *sq_tail;
    uint8_t  out_hdr[DT_WIRE_HEADER_BYTES]; // header of sq_head
    bool     out_hdr_ready;

    // After a failure the transfers belong to nobody (the algorithm has returned), but
    // a message half written must still be finished before an abort message can follow
    // on this connection: what is left of it, copied out of its transfer.
    bool        pend;
    uint8_t     pend_hdr[DT_WIRE_HEADER_BYTES];
    const char *pend_buf; // the payload (the caller's buffer, alive until abort returns)
    size_t      pend_total, pend_done;
} peer;

typedef struct tcp_ctx {
    dt_pg         *pg;
    dt_store      *store;
    int            rank, world;
    peer          *peers;
    struct pollfd *pfds;
    int           *pfd_peer;
    bool           aborted;
    uint64_t       spin_ns; // busy-wait before sleeping in poll (DT_TCP_SPIN_US)
    size_t         chunk;   // bytes per send/recv call (DT_TCP_CHUNK_BYTES)
} tcp_ctx;

// ------------------------------------------------------------------- reading

// Reads up to n bytes for peer p: first from the read-ahead tail, then the socket.
// Returns bytes read (> 0), 0 if nothing is available now, -1 at the end of the stream
// (errno 0) or on a socket error (errno set).
static ssize_t peer_read(peer *p, void *buf, size_t n) {
    if (n == 0)
        return 0;
    if (p->tail_off < p->tail_len) {
        size_t k = p->tail_len - p->tail_off;
        if (k > n)
            k = n;
        memcpy(buf, p->tail + p->tail_off, k);
        p->tail_off += k;
        return (ssize_t)k;
    }
    if (p->eof) {
        errno = 0;
        return -1;
    }
    for (;;) {
        ssize_t k = recv(p->fd, buf, n, MSG_DONTWAIT);
        if (k > 0)
            return k;
        if (k == 0) {
            p->eof = true;
            errno  = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        p->eof = true;
        return -1;
    }
}

// A closed connection that did not say why: look for an abort record the peer may have
// left in the store (when its abort message could not be sent on a message boundary).
static dt_status fail_closed(tcp_ctx *c, const dt_op *op, peer *p) {
    char key[32];
    snprintf(key, sizeof key, "abort/%d", p->rank);
    const char *keys[1] = {key};
    bool        have    = false;
    dt_status   saved   = DT_ERR_PEER;
    uint64_t    cap     = dt_store_cap_io(dt_deadline_ns(STORE_BUDGET_MS));
    bool        found   = dt_store_check(c->store, keys, 1, &have) == DT_OK && have;
    if (found) {
        void  *v = NULL;
        size_t n = 0;
        if (dt_store_get(c->store, key, &v, &n) == DT_OK && n > 1) {
            int st = ((char *)v)[0] - 'A';
            if (st <= DT_OK || st >= DT_STATUS_COUNT_ || st == DT_ERR_STATE)
                st = DT_ERR_PEER;
            saved = (dt_status)st;
            dt_store_cap_io(cap);
            dt_fail(saved, "%s (reported by rank %d)", (char *)v + 1, p->rank);
            dt_free(v);
            return saved;
        }
        dt_free(v);
    }
    dt_store_cap_io(cap);
    return dt_op_fail_peer(op, p->rank, "closed the connection");
}

static dt_status fail_abort_msg(const dt_op *op, peer *p) {
    (void)op;
    dt_status st = (dt_status)p->cur.fp.op;
    // The sender's own abort (DT_ERR_STATE there) is a peer failure here.
    if (st <= DT_OK || st >= DT_STATUS_COUNT_ || st == DT_ERR_STATE)
        st = DT_ERR_PEER;
    p->reason[p->reason_have] = '\0';
    return dt_fail(st, "%s (reported by rank %d)", p->reason, p->rank);
}

// The peer hung up: read everything it still had for us, then decide whether this is
// an abort (return its reason), a clean bye (DT_OK, p->bye) or a death.
static dt_status on_hangup(tcp_ctx *c, const dt_op *op, peer *p) {
    if (p->hungup)
        return p->bye ? DT_OK : fail_closed(c, op, p);
    p->hungup = true;
    // Drain the socket into the tail (bounded by what the kernel buffered).
    if (!p->eof) {
        size_t cap = p->tail_len + 65536;
        for (;;) {
            if (p->tail_len + 4096 > cap || !p->tail) {
                size_t   ncap = cap * 2;
                uint8_t *nt   = dt_alloc(ncap);
                if (!nt)
                    return dt_op_fail(op, DT_ERR_NOMEM, "out of memory reading rank %d", p->rank);
                if (p->tail_len)
                    memcpy(nt, p->tail, p->tail_len);
                dt_free(p->tail);
                p->tail = nt;
                cap     = ncap;
            }
            ssize_t k = recv(p->fd, p->tail + p->tail_len, cap - p->tail_len, MSG_DONTWAIT);
            if (k > 0) {
                p->tail_len += (size_t)k;
                continue;
            }
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break; // half-closed the other way only: more may come, stop here
            p->eof = true;
            break;
        }
    }
    // Walk the frames that follow the current parse position.
    const uint8_t *t = p->tail + p->tail_off;
    size_t         n = p->tail_len - p->tail_off, pos = 0;
    bool           bye = false;
    if (p->in_payload) {
        if (p->payload_left > n)
            return fail_closed(c, op, p); // ended inside a message
        pos = (size_t)p->payload_left;
        if (p->cur.kind == DT_WIRE_ABORT) {
            size_t have = p->reason_have, k = (size_t)p->payload_left;
            memcpy(p->reason + have, t, k);
            p->reason_have += k;
            return fail_abort_msg(op, p);
        }
    }
    uint8_t hdr[DT_WIRE_HEADER_BYTES];
    size_t  hpre = p->in_payload ? 0 : p->hdr_have; // header bytes already consumed
    while (pos < n || hpre) {
        if (n - pos + hpre < DT_WIRE_HEADER_BYTES)
            return fail_closed(c, op, p);
        memcpy(hdr, p->hdr, hpre);
        memcpy(hdr + hpre, t + pos, DT_WIRE_HEADER_BYTES - hpre);
        pos += DT_WIRE_HEADER_BYTES - hpre;
        hpre = 0;
        dt_wire_header h;
        if (dt_wire_decode(hdr, sizeof hdr, &h) != DT_OK)
            return fail_closed(c, op, p);
        if (h.nbytes > n - pos)
            return fail_closed(c, op, p);
        if (h.kind == DT_WIRE_ABORT) {
            p->cur = h;
            memcpy(p->reason, t + pos, (size_t)h.nbytes);
            p->reason_have = (size_t)h.nbytes;
            return fail_abort_msg(op, p);
        }
        bye = h.kind == DT_WIRE_BYE;
        pos += (size_t)h.nbytes;
    }
    if (bye && p->eof) {
        p->bye = true;
        return DT_OK;
    }
    if (!p->eof)
        return DT_OK; // only their reading side is gone; writes will tell
    return fail_closed(c, op, p);
}

// Reads and dispatches frames from p while it has receives posted.
static dt_status pump_in(tcp_ctx *c, const dt_op *op, peer *p) {
    for (;;) {
        if (!p->in_payload) {
            if (!p->rq_head)
                return DT_OK; // nothing expected: leave the bytes in the socket
            while (p->hdr_have < DT_WIRE_HEADER_BYTES) {
                ssize_t k = peer_read(p, p->hdr + p->hdr_have, DT_WIRE_HEADER_BYTES - p->hdr_have);
                if (k == 0)
                    return DT_OK;
                if (k < 0) {
                    if (p->bye)
                        return dt_op_fail_peer(
                            op, p->rank,
                            "left the group (dt_pg_free) while this rank "
                            "waited for data from it; did it skip a collective?");
                    return fail_closed(c, op, p);
                }
                p->hdr_have += (size_t)k;
            }
            p->hdr_have = 0;
            if (dt_wire_decode(p->hdr, sizeof p->hdr, &p->cur) != DT_OK)
                return dt_op_fail(op, DT_ERR_FORMAT, "rank %d sent a malformed message: %s",
                                  p->rank, dt_last_error());
            p->in_payload   = true;
            p->payload_left = p->cur.nbytes;
            p->reason_have  = 0;
            dt_xfer *x      = p->rq_head;
            switch (p->cur.kind) {
            case DT_WIRE_DATA:
                if (!dt_fp_match(&op->fp, &p->cur.fp))
                    return dt_op_fail_mismatch(op, p->rank, &p->cur.fp);
                if (p->cur.step != x->step || p->cur.nbytes != x->nbytes)
                    return dt_op_fail(
                        op, DT_ERR_MISMATCH,
                        "rank %d sent message %u.%u of %llu bytes, this rank expected message "
                        "%u.%u of %zu bytes (ranks chose different algorithms: are "
                        "DT_ALLREDUCE_ALGO, DT_SEGMENT_BYTES, DT_SMALL_BYTES and DT_RING_LAG "
                        "equal on every rank?)",
                        p->rank, p->cur.step >> 24, p->cur.step & 0xffffff,
                        (unsigned long long)p->cur.nbytes, x->step >> 24, x->step & 0xffffff,
                        x->nbytes);
                x->done_bytes_ = 0;
                break;
            case DT_WIRE_ABORT:
                break; // the reason follows
            case DT_WIRE_BYE:
                p->bye = true;
                return dt_op_fail_peer(op, p->rank,
                                       "left the group (dt_pg_free) while this rank waited for "
                                       "data from it; did it skip a collective?");
            default:
                return dt_op_fail(op, DT_ERR_FORMAT, "rank %d sent an unexpected %s message",
                                  p->rank, p->cur.kind == DT_WIRE_HELLO ? "hello" : "unknown");
            }
        }
        if (p->cur.kind == DT_WIRE_ABORT) {
            while (p->payload_left) {
                ssize_t k = peer_read(p, p->reason + p->reason_have, (size_t)p->payload_left);
                if (k == 0)
                    return DT_OK;
                if (k < 0)
                    return fail_abort_msg(op, p); // what arrived of the reason
                p->reason_have += (size_t)k;
                p->payload_left -= (uint64_t)k;
            }
            return fail_abort_msg(op, p);
        }
        dt_xfer *x = p->rq_head;
        while (p->payload_left) {
            size_t want = (size_t)p->payload_left;
            if (want > c->chunk)
                want = c->chunk;
            ssize_t k = peer_read(p, (char *)x->buf + x->done_bytes_, want);
            if (k == 0)
                return DT_OK;
            if (k < 0)
                return fail_closed(c, op, p);
            x->done_bytes_ += (size_t)k;
            p->payload_left -= (uint64_t)k;
        }
        p->in_payload = false;
        x->done       = true;
        p->rq_head    = x->next_;
        if (!p->rq_head)
            p->rq_tail = NULL;
    }
}

// ------------------------------------------------------------------- writing

static void encode_data_header(const tcp_ctx *c, const dt_op *op, const dt_xfer *x,
                               uint8_t out[DT_WIRE_HEADER_BYTES]) {
    dt_wire_header h = {.kind     = DT_WIRE_DATA,
                        .fp       = op->fp,
                        .step     = x->step,
                        .nbytes   = x->nbytes,
                        .src_rank = (uint32_t)c->rank};
    dt_wire_encode(&h, out);
}

// A write failed because the peer is gone: find out why.
static dt_status on_write_error(tcp_ctx *c, const dt_op *op, peer *p, int err) {
    if (err == EPIPE || err == ECONNRESET) {
        dt_status st = on_hangup(c, op, p);
        if (st != DT_OK)
            return st;
        if (p->bye)
            return dt_op_fail_peer(op, p->rank,
                                   "left the group (dt_pg_free) while this rank still sent to "
                                   "it; did it skip a collective?");
        return fail_closed(c, op, p);
    }
    errno = err;
    return dt_fail_errno(DT_ERR_IO, "%s: sending to rank %d", op->name, p->rank);
}

// Writes queued sends to p until the socket is full.
static dt_status pump_out(tcp_ctx *c, const dt_op *op, peer *p) {
    while (p->sq_head) {
        dt_xfer *x = p->sq_head;
        if (!p->out_hdr_ready) {
            encode_data_header(c, op, x, p->out_hdr);
            p->out_hdr_ready = true;
        }
        int k = dt_sock_send_frame(p->fd, p->out_hdr, DT_WIRE_HEADER_BYTES, x->buf, x->nbytes,
                                   &x->done_bytes_, c->chunk, 0);
        if (k == 0)
            return DT_OK; // the socket is full
        if (k < 0)
            return on_write_error(c, op, p, errno);
        x->done          = true;
        p->out_hdr_ready = false;
        p->sq_head       = x->next_;
        if (!p->sq_head)
            p->sq_tail = NULL;
    }
    return DT_OK;
}

// ------------------------------------------------------------------- transfers

static dt_status xfer_post(void *ctx, const dt_op *op, dt_xfer *x) {
    tcp_ctx *c = ctx;
    if (c->aborted)
        return dt_op_fail(op, DT_ERR_STATE, "the group was aborted");
    peer *p        = &c->peers[x->peer];
    x->done        = false;
    x->done_bytes_ = 0;
    x->next_       = NULL;
    if (x->is_send) {
        if (p->sq_tail)
            p->sq_tail->next_ = x;
        else
            p->sq_head = x;
        p->sq_tail = x;
        // Start at once: small messages usually leave right here.
        if (p->sq_head == x)
            return pump_out(c, op, p);
        return DT_OK;
    }
    if (p->rq_tail)
        p->rq_tail->next_ = x;
    else
        p->rq_head = x;
    p->rq_tail = x;
    return DT_OK;
}

// Describes what is still pending, for a timeout message.
static void pending_desc(const tcp_ctx *c, char *buf, size_t n) {
    size_t off = 0;
    buf[0]     = '\0';
    for (int r = 0; r < c->world && off < n - 80; r++) {
        const peer *p = &c->peers[r];
        if (r == c->rank)
            continue;
        if (p->rq_head)
            off += (size_t)snprintf(buf + off, n - off, "%srank %d (to send %zu bytes)",
                                    off ? ", " : "", r, p->rq_head->nbytes);
        else if (p->sq_head)
            off += (size_t)snprintf(buf + off, n - off, "%srank %d (to accept %zu bytes)",
                                    off ? ", " : "", r, p->sq_head->nbytes);
    }
    if (!buf[0])
        snprintf(buf, n, "the other ranks");
}

static dt_status xfer_wait(void *ctx, const dt_op *op, dt_xfer *x) {
    tcp_ctx *c    = ctx;
    bool     spun = false;
    for (;;) {
        dt_pg_progress(c->pg); // the liveness thread's sign of a working comm thread
        if (c->aborted)
            return dt_op_fail(op, DT_ERR_STATE, "the group was aborted");
        // Make progress on everything that can move without waiting.
        for (int r = 0; r < c->world; r++) {
            if (r == c->rank)
                continue;
            peer *p = &c->peers[r];
            if (p->sq_head)
                DT_TRY(pump_out(c, op, p));
            if (p->rq_head || p->in_payload)
                DT_TRY(pump_in(c, op, p));
        }
        if (x->done)
            return DT_OK;
        // A reply to a small message usually comes within microseconds: retry for a
        // short while before paying for a sleep and a wake-up in poll.
        if (c->spin_ns && !spun) {
            spun           = true;
            uint64_t until = dt_now_ns() + c->spin_ns;
            while (!x->done && dt_now_ns() < until && !dt_pg_aborted(c->pg)) {
                for (int r = 0; r < c->world; r++) {
                    peer *p = &c->peers[r];
                    if (r == c->rank)
                        continue;
                    if (p->sq_head)
                        DT_TRY(pump_out(c, op, p));
                    if (p->rq_head || p->in_payload)
                        DT_TRY(pump_in(c, op, p));
                }
            }
            continue;
        }
        // Sleep in poll: data, room to write, hang-ups on every connection, abort.
        int n = 0;
        for (int r = 0; r < c->world; r++) {
            peer *p = &c->peers[r];
            if (r == c->rank || p->fd < 0 || p->hungup)
                continue;
            short ev = POLLRDHUP;
            if (p->rq_head || p->in_payload)
                ev |= POLLIN;
            if (p->sq_head)
                ev |= POLLOUT;
            c->pfds[n]     = (struct pollfd){.fd = p->fd, .events = ev};
            c->pfd_peer[n] = r;
            n++;
        }
        c->pfds[n]     = (struct pollfd){.fd = dt_pg_abort_fd(c->pg), .events = POLLIN};
        c->pfd_peer[n] = -1;
        // Wake at least every 500 ms, to report progress while waiting (liveness).
        int ms = dt_op_poll_ms(op, 500);
        if (ms == 0) {
            char who[512];
            pending_desc(c, who, sizeof who);
            return dt_op_fail_timeout(op, who);
        }
        int rc = poll(c->pfds, (nfds_t)(n + 1), ms);
        if (rc < 0 && errno != EINTR)
            return dt_fail_errno(DT_ERR_IO, "%s: poll", op->name);
        if (rc <= 0)
            continue;
        if (c->pfds[n].revents)
            return dt_op_fail(op, DT_ERR_STATE, "the group was aborted");
        for (int i = 0; i < n; i++) {
            short re = c->pfds[i].revents;
            if (re & (POLLRDHUP | POLLHUP | POLLERR)) {
                peer *p = &c->peers[c->pfd_peer[i]];
                // Let pending data be consumed normally first if we expect it. When that
                // completes the transfer waited for, the peer sent it before it left:
                // this wait succeeded, and the hang-up is for the next one to report.
                if (p->rq_head || p->in_payload)
                    DT_TRY(pump_in(c, op, p));
                if (x->done)
                    return DT_OK;
                DT_TRY(on_hangup(c, op, p));
            }
        }
    }
}

// A transfer failed: the algorithm returns now and its transfers go away with it.
// Keep only what an abort needs (the rest of a half-written message) and forget them.
static void drop_transfers(tcp_ctx *c) {
    for (int r = 0; r < c->world; r++) {
        peer    *p = &c->peers[r];
        dt_xfer *x = p->sq_head;
        if (x && x->done_bytes_ > 0 && !p->pend) {
            p->pend = true;
            memcpy(p->pend_hdr, p->out_hdr, sizeof p->pend_hdr);
            p->pend_buf   = x->buf;
            p->pend_total = DT_WIRE_HEADER_BYTES + x->nbytes;
            p->pend_done  = x->done_bytes_;
        }
        p->sq_head = p->sq_tail = NULL;
        p->rq_head = p->rq_tail = NULL;
        p->out_hdr_ready        = false;
    }
}

static dt_status tcp_xfer_post(void *ctx, const dt_op *op, dt_xfer *x) {
    dt_status st = xfer_post(ctx, op, x);
    if (st != DT_OK)
        drop_transfers(ctx);
    return st;
}

static dt_status tcp_xfer_wait(void *ctx, const dt_op *op, dt_xfer *x) {
    dt_status st = xfer_wait(ctx, op, x);
    if (st != DT_OK)
        drop_transfers(ctx);
    return st;
}

// Something from `r` to read now: a message begun (or read ahead), or the connection's
// end, which the receive that follows reports.
static bool tcp_xfer_ready(void *ctx, int r) {
    tcp_ctx *c = ctx;
    peer    *p = &c->peers[r];
    if (c->aborted || p->in_payload || p->hdr_have || p->tail_off < p->tail_len || p->eof ||
        p->fd < 0)
        return true;
    char    b;
    ssize_t k = recv(p->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// ------------------------------------------------------------------- abort, free

// Writes the rest of a half-written message; false if the peer does not take it by
// the deadline.
static bool finish_pending(peer *p, uint64_t deadline) {
    if (dt_sock_send_frame(p->fd, p->pend_hdr, DT_WIRE_HEADER_BYTES, p->pend_buf,
                           p->pend_total - DT_WIRE_HEADER_BYTES, &p->pend_done, 0, deadline) != 1)
        return false;
    p->pend = false;
    return true;
}

// Writes the rest of the frame in flight to p, then a control frame (abort/bye) with
// `text`; gives up at deadline. Returns true when the control frame was sent whole.
static bool send_control(tcp_ctx *c, peer *p, uint8_t kind, dt_status st, const char *text,
                         uint64_t deadline) {
    if (p->fd < 0 || p->wr_shut)
        return false;
    // Finish the message in flight so the control message starts on a boundary.
    if (p->pend && !finish_pending(p, deadline))
        return false;
    size_t len = text ? strlen(text) : 0;
    if (len > DT_WIRE_MAX_REASON)
        len = DT_WIRE_MAX_REASON;
    dt_wire_header h = {.kind = kind, .nbytes = len, .src_rank = (uint32_t)c->rank};
    h.fp.op          = (uint8_t)st;
    uint8_t buf[DT_WIRE_HEADER_BYTES + DT_WIRE_MAX_REASON];
    dt_wire_encode(&h, buf);
    if (len)
        memcpy(buf + DT_WIRE_HEADER_BYTES, text, len);
    size_t sent = 0;
    return dt_sock_send_frame(p->fd, buf, DT_WIRE_HEADER_BYTES + len, NULL, 0, &sent, 0,
                              deadline) == 1;
}

static void tcp_abort(void *ctx, dt_status st, const char *msg) {
    tcp_ctx *c = ctx;
    if (c->aborted)
        return;
    c->aborted = true;
    // Tell every peer on its connection first (bounded: ABORT_BUDGET_MS in all), then,
    // only for the peers that could not get the whole message (a half-written message
    // that a peer does not drain, a cut link), leave the reason in the store, where such
    // a peer looks when the connection closes. The store may be unreachable (a cut link,
    // a frozen rank 0): that write gets STORE_BUDGET_MS, never the store's timeout.
    uint64_t deadline = dt_deadline_ns(ABORT_BUDGET_MS);
    bool     missed   = false;
    for (int r = 0; r < c->world; r++) {
        peer *p = &c->peers[r];
        if (r != c->rank && p->fd >= 0 && !send_control(c, p, DT_WIRE_ABORT, st, msg, deadline))
            missed = missed || !p->hungup;
    }
    // The record goes in before the connections close: a peer looks for it on the close.
    char *rec = missed ? dt_alloc(strlen(msg) + 2) : NULL;
    if (rec) {
        rec[0] = (char)('A' + (int)st);
        strcpy(rec + 1, msg);
        char key[32];
        snprintf(key, sizeof key, "abort/%d", c->rank);
        uint64_t cap = dt_store_cap_io(dt_deadline_ns(STORE_BUDGET_MS));
        dt_store_set(c->store, key, rec, strlen(rec));
        dt_store_cap_io(cap);
        dt_free(rec);
    }
    for (int r = 0; r < c->world; r++) {
        peer *p = &c->peers[r];
        if (r == c->rank || p->fd < 0)
            continue;
        shutdown(p->fd, SHUT_WR);
        p->wr_shut = true;
        p->rq_head = p->rq_tail = NULL;
        p->sq_head = p->sq_tail = NULL;
    }
}

static void tcp_free(void *ctx) {
    tcp_ctx *c = ctx;
    if (!c)
        return;
    uint64_t deadline = dt_deadline_ns(BYE_BUDGET_MS);
    for (int r = 0; c->peers && r < c->world; r++) {
        peer *p = &c->peers[r];
        if (r == c->rank || p->fd < 0)
            continue;
        if (!c->aborted && !p->wr_shut) {
            send_control(c, p, DT_WIRE_BYE, DT_OK, "left the group", deadline);
            shutdown(p->fd, SHUT_WR);
        }
        // Read what is left so closing does not turn into a reset that could destroy
        // our bye before the peer reads it.
        char junk[4096];
        while (recv(p->fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {
        }
        close(p->fd);
        dt_free(p->tail);
    }
    dt_free(c->peers);
    dt_free(c->pfds);
    dt_free(c->pfd_peer);
    dt_free(c);
}

// ------------------------------------------------------------------- init

// The address the other ranks can reach us at.
static void local_address(tcp_ctx *c, char *buf, size_t n) {
    dt_sock_public_addr(c->store, c->rank, dt_pg_all_local(c->pg), buf, n);
}

void (*dt_tcp_init_hook)(int rank);

static dt_status tcp_init(dt_pg *pg, dt_store *store, uint64_t deadline, void **out) {
    tcp_ctx *c = dt_alloc_zero(sizeof *c);
    if (!c)
        return DT_ERR_NOMEM;
    c->pg         = pg;
    c->store      = store;
    c->rank       = dt_pg_rank(pg);
    c->world      = dt_pg_size(pg);
    c->peers      = dt_alloc_zero((size_t)c->world * sizeof *c->peers);
    c->pfds       = dt_alloc((size_t)(c->world + 1) * sizeof *c->pfds);
    c->pfd_peer   = dt_alloc((size_t)(c->world + 1) * sizeof *c->pfd_peer);
    int       lfd = -1;
    dt_status st  = DT_OK;
    if (!c->peers || !c->pfds || !c->pfd_peer) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    for (int r = 0; r < c->world; r++) {
        c->peers[r].rank = r;
        c->peers[r].fd   = -1;
    }
    if (c->world == 1) {
        *out = c;
        return DT_OK;
    }
    int port;
    st = dt_sock_listen(0, c->world + 16, "tcp", &lfd, &port);
    if (st != DT_OK)
        goto fail;
    char addr[300], key[32];
    local_address(c, addr, sizeof addr - 8);
    size_t al = strlen(addr);
    snprintf(addr + al, sizeof addr - al, ":%d", port);
    snprintf(key, sizeof key, "addr/%d", c->rank);
    if ((st = dt_store_set(store, key, addr, strlen(addr))) != DT_OK)
        goto fail;
    if (dt_tcp_init_hook)
        dt_tcp_init_hook(c->rank);
    const dt_tcp_self self = {.token = dt_pg_token(pg), .rank = c->rank, .world = c->world};
    // Connect to every lower rank; the higher ones connect to us.
    for (int r = 0; r < c->rank; r++) {
        snprintf(key, sizeof key, "addr/%d", r);
        void *v = NULL;
        if ((st = dt_store_get(store, key, &v, NULL)) != DT_OK)
            goto fail;
        char *colon = strrchr(v, ':');
        if (!colon) {
            st = dt_fail(DT_ERR_FORMAT,
                         "tcp init: rank %d published address \"%s\", expected "
                         "host:port",
                         r, (char *)v);
            dt_free(v);
            goto fail;
        }
        *colon  = '\0';
        int  fd = -1;
        char what[64];
        snprintf(what, sizeof what, "tcp init: connecting to rank %d", r);
        st = dt_sock_connect(v, atoi(colon + 1), deadline, what, NULL, &fd);
        dt_free(v);
        if (st != DT_OK)
            goto fail;
        c->peers[r].fd = fd;
        if ((st = dt_tcp_handshake_connect(&self, fd, r, deadline, what)) != DT_OK)
            goto fail;
    }
    // The higher ranks connect to us: their handshakes run side by side, so strangers on
    // the port delay none of them (handshake.c).
    int *fds = dt_alloc((size_t)c->world * sizeof *fds);
    if (!fds) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    for (int r = 0; r < c->world; r++)
        fds[r] = r < c->rank ? c->peers[r].fd : -1;
    st = dt_tcp_accept_ranks(&self, lfd, fds, deadline);
    for (int r = c->rank + 1; r < c->world; r++)
        c->peers[r].fd = fds[r];
    dt_free(fds);
    if (st != DT_OK)
        goto fail;
    close(lfd);
    lfd = -1;
    // Socket buffers: 0 leaves Linux's autotuning, which measured as well as fixed
    // sizes on loopback; DT_SOCKET_BUF_BYTES overrides for other networks.
    long bufsz = 0, spin_us = 0;
    if ((st = dt_setting_int("DT_SOCKET_BUF_BYTES", &bufsz)) != DT_OK)
        goto fail;
    if ((st = dt_setting_int("DT_TCP_SPIN_US", &spin_us)) != DT_OK)
        goto fail;
    c->spin_ns = (uint64_t)spin_us * 1000;
    // Bytes per send and receive call. Small enough that what the sender copies into
    // the kernel is still in cache when the receiver copies it out (on loopback this
    // doubled large-message bandwidth against whole-message calls), large enough to
    // keep the syscall count low.
    long chunk = 0;
    if ((st = dt_setting_int("DT_TCP_CHUNK_BYTES", &chunk)) != DT_OK) // default 128 KiB
        goto fail;
    c->chunk = (size_t)chunk;
    // Congestion control: DT_TCP_CONGESTION for every connection when set. Otherwise a
    // connection to a rank on this host leaves BBR (a common system default) for reno:
    // BBR paces its sends, which on loopback only costs throughput (measured: ~25%).
    const char *cc_env = dt_setting_str("DT_TCP_CONGESTION");
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank)
            continue;
        int         fd = c->peers[r].fd;
        const char *cc = cc_env && *cc_env ? cc_env : NULL;
        if (!cc && strcmp(dt_pg_host_id(pg, r), dt_pg_host_id(pg, c->rank)) == 0) {
            char      cur[32] = "";
            socklen_t len     = sizeof cur - 1;
            if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cur, &len) == 0 &&
                strncmp(cur, "bbr", 3) == 0)
                cc = "reno";
        }
        if (cc && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0 &&
            cc_env)
            DT_WARN("comm", "DT_TCP_CONGESTION=%s: %s; keeping the system's choice", cc,
                    strerror(errno));
        dt_sock_tune(fd, (int)bufsz);
        dt_sock_set_nonblocking(c->peers[r].fd, true);
    }
    *out = c;
    return DT_OK;
fail:
    if (lfd >= 0)
        close(lfd);
    c->aborted = true;
    tcp_free(c);
    return st;
}

const dt_backend_ops dt_backend_tcp = {
    .name             = "tcp",
    .init             = tcp_init,
    .free             = tcp_free,
    .abort            = tcp_abort,
    .xfer_post        = tcp_xfer_post,
    .xfer_wait        = tcp_xfer_wait,
    .xfer_ready       = tcp_xfer_ready,
    .reports_progress = true,
    .built            = true,
};
