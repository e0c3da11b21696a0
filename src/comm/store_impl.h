// store_impl.h: what the pieces of the TCP and file stores share: the key-value table
// (store_kv.c), the growable message buffer, and the TCP server (store_server.c). The
// handles, the client and the file store are in store.c; the token proofs in
// store_auth.c. Internal to src/comm.
#ifndef DTRAIN_COMM_STORE_IMPL_H
#define DTRAIN_COMM_STORE_IMPL_H

#include "comm/comm_impl.h"

// 2: challenge-response (store_auth.c) instead of the token in the hello.
#define DT_STORE_PROTOCOL_VERSION 2
#define DT_STORE_PROOF_CLIENT     "dtrain store client"
#define DT_STORE_PROOF_SERVER     "dtrain store server"

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
