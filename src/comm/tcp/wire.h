// wire.h: the header in front of every message between two ranks of the tcp backend.
// 48 bytes, little-endian, with its own CRC32C so a corrupt or foreign byte stream is
// rejected before any length in it is trusted.
//
//   offset  size  field
//        0     4  magic "DTW1"
//        4     1  kind (data, hello, abort, bye)
//        5     1  collective kind (dt_coll)      |
//        6     1  dtype                           |
//        7     1  reduce op | reduce order << 4  |  the fingerprint of the operation
//        8     8  sequence number                 |  (hello: 0)
//       16     8  count                           |  (hello: world size)
//       24     4  root / tag (signed)            /   (hello: group id)
//       28     4  step (algorithm << 24 | index)
//       32     8  payload bytes that follow
//       40     4  sender's rank
//       44     4  CRC32C of bytes 0..43
#ifndef DTRAIN_COMM_WIRE_H
#define DTRAIN_COMM_WIRE_H

#include "comm/backend.h"

#define DT_WIRE_HEADER_BYTES 48
#define DT_WIRE_MAGIC        0x31575444u // "DTW1" read as a little-endian u32
// An abort or bye message carries a text reason of at most this many bytes.
#define DT_WIRE_MAX_REASON 1024
// A hello carries nonces and proofs of the job token (tcp.c's handshake), no more.
#define DT_WIRE_MAX_HELLO 64
// No single message carries more (the algorithms cut buffers into segments).
#define DT_WIRE_MAX_PAYLOAD ((uint64_t)1 << 40)

typedef enum dt_wire_kind {
    DT_WIRE_DATA  = 1, // payload = bytes of a transfer
    DT_WIRE_HELLO = 2, // the handshake of a new connection: who is calling, and proofs
                       // of the job token (step 1, 2, 3; see tcp.c)
    DT_WIRE_ABORT = 3, // the sender failed; payload = its error message; fp.op = status
    DT_WIRE_BYE   = 4, // the sender left the group cleanly (dt_pg_free)
    DT_WIRE_KIND_COUNT_
} dt_wire_kind;

typedef struct dt_wire_header {
    uint8_t        kind; // dt_wire_kind
    dt_fingerprint fp;
    uint32_t       step;
    uint64_t       nbytes;
    uint32_t       src_rank;
} dt_wire_header;

void dt_wire_encode(const dt_wire_header *h, uint8_t out[DT_WIRE_HEADER_BYTES]);
// Decodes and validates `n` bytes (n must be DT_WIRE_HEADER_BYTES; fewer is an error).
// DT_ERR_FORMAT naming the first check that failed (magic, checksum, kind, field
// ranges, payload size) with the expected and found values. Never reads past n.
dt_status dt_wire_decode(const uint8_t *buf, size_t n, dt_wire_header *h);

#endif // DTRAIN_COMM_WIRE_H
