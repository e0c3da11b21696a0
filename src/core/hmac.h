// hmac.h: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the challenge-response
// that proves knowledge of a job token without sending it or anything replayable (the
// store handshake, the tcp backend's peer handshake). Internal to the library.
#ifndef DTRAIN_CORE_HMAC_H
#define DTRAIN_CORE_HMAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DT_SHA256_BYTES 32
#define DT_NONCE_BYTES  32

typedef struct dt_sha256 {
    uint32_t h[8];
    uint64_t total; // bytes hashed so far
    uint8_t  buf[64];
    size_t   nbuf;
} dt_sha256;

void dt_sha256_init(dt_sha256 *s);
void dt_sha256_update(dt_sha256 *s, const void *data, size_t n);
void dt_sha256_final(dt_sha256 *s, uint8_t out[DT_SHA256_BYTES]);

// HMAC-SHA256 of the concatenation of `nparts` message parts under `key`.
void dt_hmac_sha256(const void *key, size_t keylen, int nparts, const void *const *parts,
                    const size_t *lens, uint8_t out[DT_SHA256_BYTES]);

// Compares n bytes in time that does not depend on where they differ.
bool dt_ct_equal(const void *a, const void *b, size_t n);

// Fills buf with n unpredictable bytes (getrandom; a clock-and-pid mix if that fails).
void dt_random_bytes(void *buf, size_t n);

#endif // DTRAIN_CORE_HMAC_H
