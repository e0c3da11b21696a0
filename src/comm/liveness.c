// liveness.c: finds frozen, dead and unreachable peers, and a stuck communication
// thread, in seconds, whatever the backend and whatever the training loop does.
//
// Every rank runs one liveness thread. It sends a small UDP datagram (a heartbeat) to
// every peer every DT_HEARTBEAT_MS (500) and reads theirs. A peer not heard from for
// DT_LIVENESS_MS (5000) is declared "unreachable (frozen, dead or link cut)": the group
// is failed (dt_pg_fail) with a message naming every silent peer and its host, so the
// operation in flight returns and every later one fails at once. The heartbeats go
// peer to peer, not through the store (which freezes with rank 0), and are sent by
// this thread, not by the training loop: a long compute step between collectives
// never trips it.
//
// A heartbeat also carries how long this rank's operation in the backend has made no
// progress (the backend calls dt_pg_progress while it waits; tcp and shm do at least
// every 500 ms): an operation stuck for DT_LIVENESS_MS (a deadlocked communication
// thread, a blocking call that never returns) fails the group here and on the peers,
// naming the stuck rank. Once this rank's group failed, its heartbeats say so at once,
// and dt_pg_free sends a last "bye": peers never blame a rank that failed or left for
// going quiet afterwards (they learn why through the backend's own abort path).
//
// Datagrams are hostile input: fixed layout, checked sizes, and authenticated. Each rank
// draws a 32-byte secret per group (its incarnation), published with its address through
// the (token-protected) store and never sent in a heartbeat. Every datagram carries
// HMAC-SHA256(job token, "dtrain heartbeat" | sender's secret | receiver's secret |
// bytes 0..39) (auth.c's dt_token_proof), so only a holder of the token and of the two
// secrets can make one: a datagram seen on the wire cannot be altered ("stuck", "bye",
// "failed"), sent to another rank, or passed off as another incarnation's. Its heartbeat
// number must exceed the last one accepted from that sender, so a replayed datagram is
// dropped too. Layout (little-endian):
//   0 u32 magic "DTL1" | 4 u16 version (2) | 6 u16 flags (1 bye, 2 failed)
//   8 u32 sender rank | 12 u32 world | 16 u32 receiver rank
//   20 u32 ms the sender's operation made no progress | 24 u64 heartbeat number (from 1)
//   32 u64 the sender's operation in the backend ((seq << 8) | kind + 1, 0 none)
//   40 32 bytes HMAC-SHA256 as above
#include "comm/comm_impl.h"
#include "core/hmac.h"
#include "core/le.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAGIC       0x314c5444u // "DTL1"
#define VERSION     2           // 1: the sender's key in clear, no MAC
#define MAC_AT      40          // bytes before the MAC: what it covers
#define HB_BYTES    (MAC_AT + DT_SHA256_BYTES)
#define FLAG_BYE    1
#define FLAG_FAILED 2
#define PROOF_LABEL "dtrain heartbeat"
// Datagrams read per turn of the thread: a flood of forged ones (each costs an HMAC)
// must not keep it from sending its own heartbeats and judging the peers.
#define MAX_READS_PER_TURN 4096

typedef struct live_peer {
    struct sockaddr_in addr;
    uint8_t            secret[DT_NONCE_BYTES]; // its incarnation's, from the store
    uint64_t           last_seq;               // heartbeat number last accepted
    char               host[96];               // host name part of the host identity
    char               ip[64];                 // the address it published
    uint64_t           heard_ns;               // last valid datagram (or the start)
    atomic_bool        ever;                   // heard at least once
    bool               gone;                   // left (bye) or failed: never blamed for silence
    bool               left;                   // bye: not judged at all
    uint32_t           stuck_ms;               // from its last heartbeat
    uint64_t           op;
} live_peer;

struct dt_live {
    dt_pg      *pg;
    int         rank, world, fd, stop_fd;
    uint8_t     secret[DT_NONCE_BYTES]; // this rank's incarnation
    const char *token;                  // the group's (NULL: none; the MAC is keyed by "")
    int64_t     hb_ms, live_ms;
    live_peer  *peers;
    pthread_t   thread;
    bool        started;
    uint64_t    hb_seq;
    // Own progress: the counter and operation at the last sample, and since when the
    // operation has not moved.
    uint64_t last_progress, last_op, stuck_since;
    bool     reported; // this thread failed the group (or saw it failed)
    // Guarded by mu: for dt_live_wait_peers.
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             heard_count;
};

dt_status dt_live_config(int64_t *heartbeat_ms, int64_t *liveness_ms) {
    long hb, live;
    DT_TRY(dt_setting_int("DT_HEARTBEAT_MS", &hb));
    DT_TRY(dt_setting_int("DT_LIVENESS_MS", &live));
    if (live > 0 && live < 2 * hb)
        return dt_fail(DT_ERR_ARG,
                       "DT_LIVENESS_MS=%ld must be 0 (off) or at least twice DT_HEARTBEAT_MS=%ld",
                       live, hb);
    *heartbeat_ms = hb;
    *liveness_ms  = live;
    return DT_OK;
}

// "rank 2 (host b, 10.0.0.2)"
static void name_peer(const dt_live *l, int r, char *buf, size_t n) {
    snprintf(buf, n, "rank %d (host %s, %s)", r, l->peers[r].host, l->peers[r].ip);
}

static void describe_op(uint64_t op, char *buf, size_t n) {
    if (!op)
        snprintf(buf, n, "an operation");
    else
        snprintf(buf, n, "%s #%" PRIu64, dt_coll_name((dt_coll)((op & 0xff) - 1)), op >> 8);
}

// The MAC of a datagram from `from` (its secret) to `to` over its first MAC_AT bytes.
static void heartbeat_mac(const dt_live *l, const uint8_t *from, const uint8_t *to,
                          const uint8_t *b, uint8_t out[DT_SHA256_BYTES]) {
    dt_token_proof(l->token, PROOF_LABEL, from, to, b, MAC_AT, out);
}

static void send_all(dt_live *l, uint16_t flags, uint32_t stuck_ms, uint64_t op) {
    uint8_t b[HB_BYTES] = {0};
    dt_put_le32(b, MAGIC);
    dt_put_le16(b + 4, VERSION);
    dt_put_le16(b + 6, flags);
    dt_put_le32(b + 8, (uint32_t)l->rank);
    dt_put_le32(b + 12, (uint32_t)l->world);
    dt_put_le32(b + 20, stuck_ms);
    dt_put_le64(b + 24, ++l->hb_seq);
    dt_put_le64(b + 32, op);
    for (int r = 0; r < l->world; r++) {
        if (r == l->rank)
            continue;
        dt_put_le32(b + 16, (uint32_t)r);
        heartbeat_mac(l, l->secret, l->peers[r].secret, b, b + MAC_AT);
        // Best effort: a full buffer or an unreachable host is what liveness measures.
        ssize_t k = sendto(l->fd, b, sizeof b, MSG_DONTWAIT | MSG_NOSIGNAL,
                           (const struct sockaddr *)&l->peers[r].addr, sizeof l->peers[r].addr);
        (void)k;
    }
}

// Reads the waiting datagrams (at most MAX_READS_PER_TURN).
static void receive_all(dt_live *l, uint64_t now) {
    uint8_t b[HB_BYTES + 1], want[DT_SHA256_BYTES];
    int     errors = 0;
    for (int reads = 0; reads < MAX_READS_PER_TURN; reads++) {
        ssize_t k = recv(l->fd, b, sizeof b, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (k < 0 && ++errors > 64)
            return; // not one of the transient ones below: try again next turn
        if (k < 0)
            continue; // ICMP errors of earlier sends (ECONNREFUSED ...): not data
        if (k != HB_BYTES || dt_get_le32(b) != MAGIC || dt_get_le16(b + 4) != VERSION)
            continue;
        uint32_t r = dt_get_le32(b + 8);
        if (r >= (uint32_t)l->world || (int)r == l->rank ||
            dt_get_le32(b + 12) != (uint32_t)l->world || dt_get_le32(b + 16) != (uint32_t)l->rank)
            continue;
        live_peer *p   = &l->peers[r];
        uint64_t   seq = dt_get_le64(b + 24);
        // A number already seen is a replay (or a datagram the network delivered late,
        // after a newer one: nothing is lost by dropping it).
        if (seq <= p->last_seq)
            continue;
        heartbeat_mac(l, p->secret, l->secret, b, want);
        if (!dt_ct_equal(want, b + MAC_AT, DT_SHA256_BYTES))
            continue;
        p->last_seq = seq;
        p->heard_ns = now;
        p->stuck_ms = dt_get_le32(b + 20);
        p->op       = dt_get_le64(b + 32);
        uint16_t fl = dt_get_le16(b + 6);
        if (fl & (FLAG_BYE | FLAG_FAILED))
            p->gone = true;
        if (fl & FLAG_BYE)
            p->left = true;
        if (!atomic_load(&p->ever)) {
            atomic_store(&p->ever, true);
            pthread_mutex_lock(&l->mu);
            l->heard_count++;
            pthread_cond_broadcast(&l->cv);
            pthread_mutex_unlock(&l->mu);
        }
    }
}

// Judges the peers and this rank's own operation; fails the group on the first
// problem. `stuck_ms`: how long this rank's operation has not moved.
static void judge(dt_live *l, uint64_t now, uint32_t stuck_ms) {
    if (l->reported || dt_pg_aborted(l->pg))
        return;
    uint64_t limit = (uint64_t)l->live_ms * 1000000ull;
    char     msg[1000], who[256];
    size_t   off = 0;
    // Silent peers: every one past the bound, and those past half of it (they went quiet
    // together: a cut link, a frozen host) once one is past it.
    bool any = false;
    for (int r = 0; r < l->world && !any; r++)
        any = r != l->rank && !l->peers[r].gone && now - l->peers[r].heard_ns > limit;
    if (any) {
        for (int r = 0; r < l->world && off < sizeof msg - 300; r++) {
            live_peer *p = &l->peers[r];
            if (r == l->rank || p->gone || now - p->heard_ns <= limit / 2)
                continue;
            name_peer(l, r, who, sizeof who);
            off += (size_t)snprintf(msg + off, sizeof msg - off,
                                    "%s%s unreachable (frozen, dead or link cut): no heartbeat "
                                    "for %.1f s",
                                    off ? "; " : "", who, (double)(now - p->heard_ns) / 1e9);
        }
        snprintf(msg + off, sizeof msg - off,
                 " (liveness bound DT_LIVENESS_MS=%lld, heartbeats every DT_HEARTBEAT_MS=%lld)",
                 (long long)l->live_ms, (long long)l->hb_ms);
        l->reported = true;
        dt_pg_fail(l->pg, DT_ERR_PEER, "%s", msg);
        return;
    }
    for (int r = 0; r < l->world; r++) {
        live_peer *p = &l->peers[r];
        // (A rank that failed still counts here: its own liveness thread may have
        // failed it for this very reason.)
        if (r == l->rank || p->left || p->stuck_ms <= (uint64_t)l->live_ms)
            continue;
        char op[64];
        name_peer(l, r, who, sizeof who);
        describe_op(p->op, op, sizeof op);
        l->reported = true;
        dt_pg_fail(l->pg, DT_ERR_PEER,
                   "%s is alive but its communication thread made no progress for %.1f s in %s "
                   "(deadlocked or blocked; DT_LIVENESS_MS=%lld)",
                   who, p->stuck_ms / 1e3, op, (long long)l->live_ms);
        return;
    }
    if (stuck_ms > (uint64_t)l->live_ms) {
        char op[64];
        describe_op(l->last_op, op, sizeof op);
        l->reported = true;
        dt_pg_fail(l->pg, DT_ERR_STATE,
                   "this rank's communication thread made no progress for %.1f s in %s "
                   "(deadlocked or blocked; DT_LIVENESS_MS=%lld)",
                   stuck_ms / 1e3, op, (long long)l->live_ms);
    }
}

static void *live_main(void *arg) {
    dt_live *l = arg;
    pthread_setname_np(pthread_self(), "dt-liveness");
    uint64_t hb_ns = (uint64_t)l->hb_ms * 1000000ull, next = 0, prev = dt_now_ns();
    bool     failed_sent = false;
    for (;;) {
        uint64_t now = dt_now_ns();
        // This thread did not run for a while (the process was stopped, the machine
        // paused): the peers' silence meanwhile says nothing about them. Start afresh.
        if (now - prev > 2 * hb_ns + 200000000ull) {
            receive_all(l, now);
            for (int r = 0; r < l->world; r++)
                if (l->peers[r].heard_ns < now)
                    l->peers[r].heard_ns = now;
            l->stuck_since = now;
        }
        prev = now;
        receive_all(l, now);
        // Own progress.
        uint64_t op = dt_pg_current_op(l->pg), pr = dt_pg_progress_count(l->pg);
        if (!op || op != l->last_op || pr != l->last_progress || !dt_pg_reports_progress(l->pg))
            l->stuck_since = now;
        l->last_op       = op;
        l->last_progress = pr;
        uint32_t stuck   = (uint32_t)((now - l->stuck_since) / 1000000ull);
        bool     failed  = dt_pg_aborted(l->pg);
        if (now >= next || (failed && !failed_sent)) {
            send_all(l, failed ? FLAG_FAILED : 0, stuck, op);
            failed_sent = failed;
            next        = now + hb_ns;
        }
        if (l->live_ms > 0)
            judge(l, now, stuck);
        struct pollfd pf[2] = {{.fd = l->fd, .events = POLLIN},
                               {.fd = l->stop_fd, .events = POLLIN}};
        uint64_t      wait  = next > now ? next - now : 0;
        // Wake at least every 100 ms: a failure of the group goes out at once.
        if (wait > 100000000ull)
            wait = 100000000ull;
        int rc = poll(pf, 2, (int)(wait / 1000000ull) + 1);
        if (rc > 0 && pf[1].revents)
            break;
    }
    return NULL;
}

// A UDP port on every interface, or on loopback only when the peers reach this rank at
// a loopback address (every rank on this host).
static dt_status bind_udp(dt_live *l, const char *addr, int *port) {
    l->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->fd < 0)
        return dt_fail_errno(DT_ERR_IO, "liveness: socket(UDP)");
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr    = htonl(strncmp(addr, "127.", 4) == 0 ? INADDR_LOOPBACK : INADDR_ANY);
    socklen_t len        = sizeof a;
    if (bind(l->fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(l->fd, (struct sockaddr *)&a, &len) != 0)
        return dt_fail_errno(DT_ERR_IO, "liveness: binding a UDP port");
    *port = ntohs(a.sin_port);
    return DT_OK;
}

// n bytes from exactly 2n hex digits.
static bool hex_decode(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n)
        return false;
    for (size_t i = 0; i < 2 * n; i++) {
        char c = s[i];
        int  v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return false;
        out[i / 2] = (uint8_t)(i % 2 ? out[i / 2] | v : v << 4);
    }
    return true;
}

static dt_status read_peer(dt_live *l, dt_store *store, int r, uint64_t deadline) {
    char key[48], whom[32];
    snprintf(key, sizeof key, "dt/live/%d", r);
    snprintf(whom, sizeof whom, "rank %d", r);
    DT_TRY(dt_store_wait_noted(store, key, deadline, "liveness: the ranks' addresses", whom));
    void *v = NULL;
    DT_TRY(dt_store_get(store, key, &v, NULL));
    char            ip[64], secret[2 * DT_NONCE_BYTES + 2];
    int             port = 0;
    long long       hb = 0, live = 0;
    live_peer      *p     = &l->peers[r];
    dt_status       st    = DT_OK;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (sscanf(v, "%63s %d %65s %lld %lld", ip, &port, secret, &hb, &live) != 5 || port < 0 ||
        port > 65535 || !hex_decode(secret, p->secret, sizeof p->secret))
        st = dt_fail(DT_ERR_FORMAT,
                     "liveness: expected \"<address> <port> <secret: %d hex digits> <heartbeat "
                     "ms> <liveness ms>\" for rank %d in the store, found \"%.160s\"",
                     2 * DT_NONCE_BYTES, r, (char *)v);
    else if (hb != l->hb_ms || live != l->live_ms)
        st = dt_fail(DT_ERR_MISMATCH,
                     "liveness: rank %d has DT_HEARTBEAT_MS=%lld DT_LIVENESS_MS=%lld, but this "
                     "rank (%d) has DT_HEARTBEAT_MS=%lld DT_LIVENESS_MS=%lld; set them alike on "
                     "every rank",
                     r, hb, live, l->rank, (long long)l->hb_ms, (long long)l->live_ms);
    else if (l->live_ms == 0)
        ; // off everywhere: nothing to reach
    else if (port == 0 || getaddrinfo(ip, NULL, &hints, &res) != 0 || !res)
        st = dt_fail(DT_ERR_ARG, "liveness: cannot resolve rank %d's address \"%s\"", r, ip);
    else
        p->addr = *(struct sockaddr_in *)res->ai_addr;
    if (res)
        freeaddrinfo(res);
    dt_free(v);
    DT_TRY(st);
    p->addr.sin_family = AF_INET;
    p->addr.sin_port   = htons((uint16_t)port);
    snprintf(p->ip, sizeof p->ip, "%s", ip);
    const char *hid = dt_pg_host_id(l->pg, r);
    size_t      hl  = strcspn(hid, "/");
    snprintf(p->host, sizeof p->host, "%.*s", (int)(hl < 95 ? hl : 95), hid);
    return DT_OK;
}

dt_status dt_live_new(dt_live **out, dt_pg *pg, dt_store *store, const char *addr,
                      uint64_t deadline_ns) {
    *out = NULL;
    int64_t hb, live;
    DT_TRY(dt_live_config(&hb, &live));
    int world = dt_pg_size(pg);
    if (world < 2)
        return DT_OK; // nothing to watch
    dt_live *l = dt_alloc_zero(sizeof *l);
    if (!l)
        return DT_ERR_NOMEM;
    l->pg      = pg;
    l->rank    = dt_pg_rank(pg);
    l->world   = world;
    l->hb_ms   = hb;
    l->live_ms = live;
    l->fd = l->stop_fd = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    dt_status st   = DT_OK;
    int       port = 0;
    l->peers       = dt_alloc_zero((size_t)world * sizeof *l->peers);
    l->stop_fd     = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!l->peers || l->stop_fd < 0) {
        st = l->peers ? dt_fail_errno(DT_ERR_IO, "liveness: eventfd") : DT_ERR_NOMEM;
        goto fail;
    }
    l->token = dt_pg_token(pg);
    dt_random_bytes(l->secret, sizeof l->secret);
    // Off (DT_LIVENESS_MS=0) still publishes its settings: every rank must agree.
    if (live > 0 && (st = bind_udp(l, addr, &port)) != DT_OK)
        goto fail;
    char key[48], val[400], hex[2 * DT_NONCE_BYTES + 1];
    for (size_t i = 0; i < sizeof l->secret; i++)
        snprintf(hex + 2 * i, 3, "%02x", l->secret[i]);
    snprintf(key, sizeof key, "dt/live/%d", l->rank);
    snprintf(val, sizeof val, "%s %d %s %lld %lld", addr, port, hex, (long long)hb,
             (long long)live);
    if ((st = dt_store_set(store, key, val, strlen(val))) != DT_OK)
        goto fail;
    // Read everyone's, then say so and wait until all have read before judging: a rank
    // that finds other settings must not take the store away (rank 0) before the others
    // have read what they need to say the same.
    dt_status bad          = DT_OK;
    char      bad_msg[600] = "";
    for (int r = 0; r < world && st == DT_OK; r++) {
        if (r == l->rank)
            continue;
        dt_status rs = read_peer(l, store, r, deadline_ns);
        if (rs == DT_ERR_MISMATCH && bad == DT_OK) {
            bad = rs;
            snprintf(bad_msg, sizeof bad_msg, "%s", dt_last_error());
        } else if (rs != DT_OK && rs != DT_ERR_MISMATCH) {
            st = rs;
        }
    }
    if (st == DT_OK) {
        snprintf(key, sizeof key, "dt/live/read/%d", l->rank);
        st = dt_store_set(store, key, "1", 1);
    }
    for (int r = 0; r < world && st == DT_OK; r++) {
        char whom[32];
        snprintf(key, sizeof key, "dt/live/read/%d", r);
        snprintf(whom, sizeof whom, "rank %d", r);
        st = dt_store_wait_noted(store, key, deadline_ns, "liveness: the ranks' settings", whom);
    }
    if (st == DT_OK && bad != DT_OK) {
        // Every rank sees a difference (each differs from someone). Rank 0 runs the
        // store: it leaves only once the others are done with it (at most 2 s).
        snprintf(key, sizeof key, "dt/live/done/%d", l->rank);
        dt_store_set(store, key, "1", 1);
        uint64_t until = dt_deadline_ns(2000);
        for (int r = 1; l->rank == 0 && r < world; r++) {
            snprintf(key, sizeof key, "dt/live/done/%d", r);
            const char *keys[1] = {key};
            int         ms      = dt_ms_left(until);
            if (dt_store_wait(store, keys, 1, ms > 0 ? ms : 1) != DT_OK)
                break;
        }
        st = dt_fail(bad, "%s", bad_msg);
    }
    if (st != DT_OK)
        goto fail;
    if (live == 0) {
        dt_live_free(l);
        return DT_OK;
    }
    uint64_t now = dt_now_ns();
    for (int r = 0; r < world; r++)
        l->peers[r].heard_ns = now;
    l->stuck_since = now;
    if (pthread_create(&l->thread, NULL, live_main, l) != 0) {
        st = dt_fail(DT_ERR_IO, "liveness: could not start the liveness thread");
        goto fail;
    }
    l->started = true;
    *out       = l;
    return DT_OK;
fail:
    dt_fail_context("init: liveness");
    st = dt_last_status();
    dt_live_free(l);
    return st;
}

dt_status dt_live_wait_peers(dt_live *l, uint64_t deadline_ns) {
    if (!l)
        return DT_OK;
    // Everyone's thread runs by now (they started before the init barrier): a peer not
    // heard within the liveness bound cannot be reached over UDP at all.
    uint64_t until = dt_deadline_ns(l->live_ms);
    if (until > deadline_ns)
        until = deadline_ns;
    pthread_mutex_lock(&l->mu);
    while (l->heard_count < l->world - 1 && dt_now_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    }
    bool all = l->heard_count == l->world - 1;
    pthread_mutex_unlock(&l->mu);
    if (all)
        return DT_OK;
    char   msg[600];
    size_t off = 0;
    for (int r = 0; r < l->world && off < sizeof msg - 120; r++) {
        if (r == l->rank || atomic_load(&l->peers[r].ever))
            continue;
        char who[256];
        name_peer(l, r, who, sizeof who);
        off += (size_t)snprintf(msg + off, sizeof msg - off, "%s%s port %d", off ? ", " : "", who,
                                ntohs(l->peers[r].addr.sin_port));
    }
    return dt_fail(DT_ERR_IO,
                   "init: liveness: no heartbeat arrived within %lld ms from %s; UDP between the "
                   "ranks seems blocked (a firewall?) or the address is wrong (DT_SOCKET_IFADDR); "
                   "DT_LIVENESS_MS=0 turns liveness off (then a frozen rank is only found at "
                   "DT_TIMEOUT_MS)",
                   (long long)l->live_ms, msg);
}

void dt_live_free(dt_live *l) {
    if (!l)
        return;
    if (l->started) {
        uint64_t one = 1;
        ssize_t  w   = write(l->stop_fd, &one, sizeof one);
        (void)w;
        pthread_join(l->thread, NULL);
        // Tell the peers this rank leaves on purpose (or has failed).
        send_all(l, dt_pg_aborted(l->pg) ? FLAG_FAILED : FLAG_BYE, 0, 0);
    }
    if (l->fd >= 0)
        close(l->fd);
    if (l->stop_fd >= 0)
        close(l->stop_fd);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    dt_free(l->peers);
    dt_free(l);
}
