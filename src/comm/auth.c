// auth.c: how a process proves it holds the job token without sending it or
// anything a listener could replay, for the store handshake (store/store_tcp.c,
// store/store_server.c) and the tcp backend's peer handshake (tcp/tcp.c); and the
// rate-limited log of refused connections. Shared by both folders, so it sits above
// them, beside sock.c.
//
// Each side draws a fresh 32-byte random nonce and sends it in the clear; each then
// sends HMAC-SHA256(token, label | its peer's nonce | its own nonce | context). The
// labels differ by direction, so a proof cannot be reflected back to its sender, and
// the nonces are fresh, so a recorded proof is worth nothing in a later handshake.
// Refusals say that the proofs differ, never anything derived from the expected token.
#include "comm/comm_impl.h"
#include "core/hmac.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

void dt_token_proof(const char *token, const char *label, const uint8_t *theirs,
                    const uint8_t *mine, const void *ctx, size_t ctx_len,
                    uint8_t out[DT_SHA256_BYTES]) {
    const char *k        = token ? token : "";
    const void *parts[4] = {label, theirs, mine, ctx};
    size_t      lens[4]  = {strlen(label) + 1, DT_NONCE_BYTES, DT_NONCE_BYTES, ctx ? ctx_len : 0};
    dt_hmac_sha256(k, strlen(k), 4, parts, lens, out);
}

// The first few refusals are logged, then one in a hundred, so a flood of strangers
// cannot fill the log of rank 0 while the first (the usual mistake) is always shown.
void dt_log_refusal(const char *fmt, ...) {
    static atomic_long count;
    long               n = atomic_fetch_add(&count, 1) + 1;
    if (n > 5 && n % 100 != 0)
        return;
    char    msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n > 5)
        DT_WARN("comm", "%s (%ld connections refused so far)", msg, n);
    else
        DT_WARN("comm", "%s", msg);
}
