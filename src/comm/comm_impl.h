// comm_impl.h: functions shared between the files of src/comm that are not part of the
// public API nor of the backend seam: socket helpers, start-up notices, liveness, and the
// store protocol parser (also used by the fuzz target). The algorithms are
// algo/algo.h.
#ifndef DTRAIN_COMM_IMPL_H
#define DTRAIN_COMM_IMPL_H

#include "comm/backend.h"

// --------------------------------------------------------------------------- sockets

// Listens on `port` (0 = any free port) on every IPv4 interface. `what` prefixes the
// messages ("store"). A port in use is DT_ERR_IO naming the port and, when it can be
// found in /proc, the process holding it.
dt_status dt_sock_listen(int port, int backlog, const char *what, int *fd /* out */,
                         int *bound_port /* out */);
// Connects to host:port, retrying refused/unreachable attempts with backoff until
// deadline_ns. DT_ERR_TIMEOUT names host:port and the last error; a host name that
// cannot be resolved is DT_ERR_ARG at once. The socket is blocking, with TCP_NODELAY.
// Every DT_WAIT_NOTICE_MS it logs that it still waits. `hint` (NULL: none) ends both
// messages: whom the caller waits for ("is rank 0, which runs the store, started ...?").
dt_status dt_sock_connect(const char *host, int port, uint64_t deadline_ns, const char *what,
                          const char *hint, int *fd /* out */);
// TCP_NODELAY, close-on-exec, and send/receive buffers of `buf_bytes` (0 = leave).
void      dt_sock_tune(int fd, int buf_bytes);
dt_status dt_sock_set_nonblocking(int fd, bool on);
// Writes / reads exactly n bytes on a blocking or non-blocking socket, waiting with
// poll() until deadline_ns. EOF or a reset is DT_ERR_PEER "<what> closed the connection".
dt_status dt_sock_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns,
                            const char *what);
dt_status dt_sock_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns, const char *what);
// The one loop that writes to a socket (dt_sock_write_all, tcp's transfers and control
// frames, the store server's replies): a frame of `hlen` header bytes and `blen` body
// bytes, from byte *done on (advanced as bytes leave), with MSG_DONTWAIT | MSG_NOSIGNAL,
// offering at most `cap` body bytes per call (0: no cap). When the socket is full it
// returns 0 if deadline_ns is 0, else waits with poll() until deadline_ns. Records no
// message (abort paths must keep theirs): 1 when the whole frame is written, -1 with
// errno (ETIMEDOUT past the deadline; EPIPE or ECONNRESET when the peer is gone).
int dt_sock_send_frame(int fd, const void *hdr, size_t hlen, const void *body, size_t blen,
                       size_t *done, size_t cap, uint64_t deadline_ns);
// dt_sock_listen on 127.0.0.1 only when loopback_only, else on every interface.
dt_status dt_sock_listen_on(bool loopback_only, int port, int backlog, const char *what,
                            int *fd /* out */, int *bound_port /* out, may be NULL */);
// True when `host` ("127.0.0.1", "localhost", "::1", ...) names this host's loopback
// interface only; NULL or "" count as loopback (the default MASTER_ADDR).
bool dt_sock_is_loopback(const char *host);
// "pid 1234 (python3)" for the process listening on TCP `port`, or "" if unknown.
void dt_sock_port_holder(int port, char *buf, size_t n);
// The local IPv4 address of a connected socket ("10.1.2.3"); false if none.
bool dt_sock_local_addr(int fd, char *buf, size_t n);

// The address this rank's peers can reach it at, for a listening socket: DT_SOCKET_IFADDR
// when set; else the interface that reaches rank 0's store (ranks > 0); 127.0.0.1 when
// every rank is on this host; for rank 0 the interface towards MASTER_ADDR, else its
// host name's address.
void dt_sock_public_addr(dt_store *store, int rank, bool all_local, char *buf, size_t n);

// ------------------------------------------------------------------- start-up notices
// (notice.c) A wait at start-up says every DT_WAIT_NOTICE_MS (10 s) whom it waits for:
//     dt_wait_notice n;
//     dt_wait_notice_start(&n, deadline);
//     while (waiting) { ... poll at most dt_wait_notice_ms(&n) ...
//         if (dt_wait_notice_due(&n)) { dt_wait_notice_times(&n, t, sizeof t);
//                                       DT_WARN("comm", "...: waiting for rank 1; %s", t); } }

typedef struct dt_wait_notice {
    uint64_t start_ns, next_ns, period_ns, deadline_ns;
} dt_wait_notice;
void dt_wait_notice_start(dt_wait_notice *w, uint64_t deadline_ns);
// True when a notice is due (and schedules the next).
bool dt_wait_notice_due(dt_wait_notice *w);
// Milliseconds until the next notice is due (0 when it is).
int dt_wait_notice_ms(const dt_wait_notice *w);
// "waited 10 s, will wait at most 1790 s more (DT_TIMEOUT_MS or the program's timeout)"
void dt_wait_notice_times(const dt_wait_notice *w, char *buf, size_t n);
// dt_store_wait for one key until deadline_ns (UINT64_MAX: none), saying every
// DT_WAIT_NOTICE_MS "<what>: waiting for <whom>; waited ..." (whom: "rank 3").
dt_status dt_store_wait_noted(dt_store *store, const char *key, uint64_t deadline_ns,
                              const char *what, const char *whom);

// ------------------------------------------------------------------------- liveness
// (liveness.c: heartbeats between the ranks over UDP, docs/comm.md "Liveness")

typedef struct dt_live dt_live;
// DT_HEARTBEAT_MS (default 500) and DT_LIVENESS_MS (default 5000, 0 = off), checked.
dt_status dt_live_config(int64_t *heartbeat_ms, int64_t *liveness_ms);
// COLLECTIVE (after the rendezvous): binds a UDP port, publishes `addr`, the port, a
// random secret and its settings under dt/live/<rank> in `store`, reads the peers' (other
// settings: DT_ERR_MISMATCH naming both), starts the liveness thread. *out stays NULL
// when liveness is off (on every rank) or the world has one rank.
dt_status dt_live_new(dt_live **out, dt_pg *pg, dt_store *store, const char *addr,
                      uint64_t deadline_ns);
// Waits until a heartbeat of every peer arrived (bounded by DT_LIVENESS_MS): UDP that
// does not pass is an error at start-up, not a false alarm later. NULL: DT_OK.
dt_status dt_live_wait_peers(dt_live *l, uint64_t deadline_ns);
// Stops the thread and tells the peers this rank leaves. NULL-safe.
void dt_live_free(dt_live *l);

// What the liveness thread reads from the group (any thread).
uint64_t dt_pg_progress_count(const dt_pg *pg);
// The operation inside the backend: (seq << 8) | (kind + 1), 0 when none.
uint64_t dt_pg_current_op(const dt_pg *pg);
bool     dt_pg_reports_progress(const dt_pg *pg);

// Called by tcp init (when set) after this rank published its address and before it
// connects to the lower ranks: tests hold a rank there to order its connections
// against a stranger's. Process-wide; NULL (the default) in every program.
extern void (*dt_tcp_init_hook)(int rank);

// ------------------------------------------------------------------ store internals

// A 64-bit hash of a job token (FNV-1a), shown in messages instead of the token.
uint64_t dt_token_hash(const char *token);
// HMAC-SHA256(token or "", label | theirs | mine | ctx): this side's proof that it holds
// the token, answering the peer's nonce `theirs` (both nonces DT_NONCE_BYTES long). See
// auth.c.
void dt_token_proof(const char *token, const char *label, const uint8_t *theirs,
                    const uint8_t *mine, const void *ctx, size_t ctx_len, uint8_t out[32]);
// Logs a refused or dropped connection as a warning: the first five, then one in 100.
void dt_log_refusal(const char *fmt, ...) DT_PRINTF(1, 2);
// The token in effect for options `opt` (NULL: DT_JOB_TOKEN env; "": none). Returns
// NULL for none.
const char *dt_token_resolve(const char *opt);
// Default timeout: DT_TIMEOUT_MS if set and valid, else 30 min. Invalid values are
// DT_ERR_ARG naming the variable.
dt_status dt_default_timeout_ms(int64_t *out);
// The job token of a group (NULL = none), for backends that check their connections.
const char *dt_pg_token(const dt_pg *pg);
// For a TCP store: the local address of the connection to the server (the interface
// that reaches rank 0), so backends can publish an address the others can reach.
bool dt_store_local_addr(dt_store *store, char *buf, size_t n);

// Caps the I/O of this thread's TCP store requests (set, get, wait, check) at
// deadline_ns until called again (UINT64_MAX: no cap); waiting for another thread's
// request on the same handle counts. A request cut short fails with DT_ERR_TIMEOUT and
// leaves the handle unusable (its stream is out of step). For the abort path, which
// must not block on an unreachable store. Returns the previous cap.
uint64_t dt_store_cap_io(uint64_t deadline_ns);

// Store wire protocol (TCP store): a request or reply is a 24-byte header followed by
// `nparts` byte strings, each a u32 little-endian length and its bytes.
//   0 u32 magic "DTS1" | 4 u8 command or status | 5 u8 0 | 6 u16 nparts
//   8 i64 argument (timeout ms, delta, flags) | 16 u32 payload bytes | 20 u32 0
#define DT_STORE_MAGIC        0x31535444u // "DTS1"
#define DT_STORE_HEADER_BYTES 24
#define DT_STORE_MAX_KEY      4096
#define DT_STORE_MAX_VALUE    (64u << 20)
#define DT_STORE_MAX_PAYLOAD  (DT_STORE_MAX_VALUE + (1u << 20))
#define DT_STORE_MAX_PARTS    65535

typedef enum dt_store_cmd {
    DT_STORE_HELLO = 1, // parts: client nonce (32 bytes), client description; arg: version
                        // reply parts: server nonce (32 bytes), "1"/"0" server has a token
    DT_STORE_SET,       // key, value
    DT_STORE_GET,       // key; arg: timeout ms (< 0 none)
    DT_STORE_WAIT,      // keys...; arg: timeout ms
    DT_STORE_CHECK,     // keys...
    DT_STORE_ADD,       // key; arg: delta
    DT_STORE_CAS,       // key, expected, desired; arg bit 0: expected is present
    DT_STORE_DELETE,    // key
    DT_STORE_AUTH,      // client proof (32 bytes, or empty without a token); reply parts:
                        // server proof (32 bytes, or empty). See auth.c.
    DT_STORE_CMD_COUNT_
} dt_store_cmd;

typedef struct dt_store_msg {
    uint8_t        code; // command (request) or dt_status (reply)
    uint16_t       nparts;
    int64_t        arg;
    const uint8_t *payload; // view into the parsed buffer
    uint32_t       payload_bytes;
} dt_store_msg;

// Parses one message from the n bytes at buf. DT_OK with *consumed = its size when a
// whole message is there; DT_OK with *consumed = 0 when more bytes are needed;
// DT_ERR_FORMAT (bad magic, sizes, part lengths that do not add up) otherwise. Never
// reads past n. `is_request` checks the command range.
dt_status dt_store_msg_parse(const uint8_t *buf, size_t n, bool is_request, dt_store_msg *msg,
                             size_t *consumed);
// Walks the parts of a parsed message: *cursor starts at 0. False when none is left.
bool dt_store_msg_part(const dt_store_msg *msg, size_t *cursor, const uint8_t **part,
                       uint32_t *len);
// Validates a request's parts for its command (count, key sizes): DT_ERR_FORMAT.
dt_status dt_store_msg_check_request(const dt_store_msg *msg);

#endif // DTRAIN_COMM_IMPL_H
