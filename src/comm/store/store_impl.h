// store_impl.h: what the pieces of the stores share. store.c is the handle every caller
// holds: it checks arguments, prepends prefix views' prefixes, and calls the store's
// kind through one table of operations (dt_store_ops below): the TCP client
// (store_tcp.c, which speaks the protocol of store_proto.c to store_server.c) or the
// file store (store_file.c). Below them: the key-value table (store_kv.c) and the token
// proofs (auth.c). Internal to src/comm.
#ifndef DTRAIN_COMM_STORE_IMPL_H
#define DTRAIN_COMM_STORE_IMPL_H

#include "comm/comm_impl.h"

// 2: challenge-response (auth.c) instead of the token in the hello.
#define DT_STORE_PROTOCOL_VERSION 2
#define DT_STORE_PROOF_CLIENT     "dtrain store client"
#define DT_STORE_PROOF_SERVER     "dtrain store server"

// ------------------------------------------------------------------ store kinds

// One kind of store. store.c calls these after checking the arguments, with full keys
// (every prefix view's prefix prepended, at most DT_STORE_MAX_KEY bytes) and values
// within DT_STORE_MAX_VALUE; `s` is the kind's own handle (its struct starts with a
// dt_store). Each returns a dt_status with the message recorded, as the public calls do.
typedef struct dt_store_ops {
    const char *kind; // "tcp", "file"
    dt_status (*set)(dt_store *s, const char *key, const void *val, size_t n);
    // Waits up to timeout_ms (< 0: no limit) for the key; *val as dt_store_get gives it.
    dt_status (*get)(dt_store *s, const char *key, int64_t timeout_ms, void **val, size_t *n);
    dt_status (*wait)(dt_store *s, const char *const *keys, size_t nkeys, int64_t timeout_ms);
    // timeout_ms: the handle's (the TCP request carries it; nothing waits).
    dt_status (*check)(dt_store *s, const char *const *keys, size_t nkeys, int64_t timeout_ms,
                       bool *all_exist);
    dt_status (*add)(dt_store *s, const char *key, int64_t delta, int64_t *value);
    // expected NULL: swap only when the key is absent.
    dt_status (*compare_set)(dt_store *s, const char *key, const void *expected, size_t en,
                             const void *desired, size_t dn, bool *swapped);
    dt_status (*del)(dt_store *s, const char *key, bool *deleted);
    // The TCP store's port, and the local address of its connection (optional: -1, false).
    int (*port)(const dt_store *s);
    bool (*local_addr)(dt_store *s, char *buf, size_t n);
    // Frees the kind's handle (the dt_store in it included).
    void (*free)(dt_store *s);
} dt_store_ops;

// The handle. A kind's handle starts with one (struct tcp_store { dt_store h; ... });
// a prefix view is a bare one with ops NULL.
struct dt_store {
    const dt_store_ops *ops;        // NULL for a prefix view
    int64_t             timeout_ms; // resolved: < 0 = none
    dt_store           *base;       // prefix view: the store it views
    char               *prefix;     // prefix view: prepended with '/'
};

// Fills the common part of a new handle: ops and the timeout of `o` (0 or o NULL:
// dt_default_timeout_ms).
dt_status dt_store_init_base(dt_store *s, const dt_store_ops *ops, const dt_store_opts *o);
// The dt_now_ns() deadline of a timeout in ms (< 0: UINT64_MAX).
static inline uint64_t dt_store_deadline(int64_t timeout_ms) {
    return timeout_ms < 0 ? UINT64_MAX : dt_deadline_ns(timeout_ms);
}

// ---------------------------------------------------------------- key-value table

typedef struct dt_kv_entry {
    char               *key;
    uint8_t            *val;
    size_t              len;
    struct dt_kv_entry *next;
} dt_kv_entry;

typedef struct dt_kv_map {
    dt_kv_entry **buckets;
    size_t        nbuckets;
    size_t        count;
} dt_kv_map;

dt_kv_entry *dt_kv_find(const dt_kv_map *m, const char *key);
// Sets key to a copy of val (plus a NUL byte after it, so values read as C strings).
dt_status dt_kv_set(dt_kv_map *m, const char *key, size_t keylen, const void *val, size_t len);
bool      dt_kv_delete(dt_kv_map *m, const char *key);
void      dt_kv_free(dt_kv_map *m);
// Applies an ADD to the table; *out = new value. DT_ERR_FORMAT if not an integer.
dt_status dt_kv_add(dt_kv_map *m, const char *key, int64_t delta, int64_t *out);
// Applies a compare-and-set; *swapped says whether it happened.
dt_status dt_kv_cas(dt_kv_map *m, const char *key, bool expect_present, const uint8_t *exp,
                    size_t explen, const uint8_t *des, size_t deslen, bool *swapped);
// Parses a whole decimal int64 ("-12"); false otherwise.
bool dt_store_parse_i64(const uint8_t *p, size_t n, int64_t *out);
// Key of a message part as a C string in buf (parts are validated to be <= MAX_KEY).
const char *dt_store_part_key(const uint8_t *p, uint32_t len, char buf[DT_STORE_MAX_KEY + 1]);

// ------------------------------------------------------------------ message buffer

typedef struct dt_buf {
    uint8_t *p;
    size_t   len, cap;
} dt_buf;

dt_status dt_buf_reserve(dt_buf *b, size_t more);
// Appends header + parts of a message.
dt_status dt_buf_message(dt_buf *b, uint8_t code, int64_t arg, int nparts, const void *const *parts,
                         const size_t *lens);

// ------------------------------------------------------------------------ TCP server

typedef struct dt_store_server dt_store_server;

// Starts the server thread listening on `port` (0 = free; *bound = the port), on
// 127.0.0.1 only with `loopback`. token NULL = admit every client.
dt_status dt_store_server_start(int port, const char *token, bool loopback, dt_store_server **out,
                                int *bound);
// Stops the thread and frees everything; NULL is a no-op.
void dt_store_server_free(dt_store_server *s);

#endif // DTRAIN_COMM_STORE_IMPL_H
