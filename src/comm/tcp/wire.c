// wire.c: encoding and validation of the tcp message header (layout in wire.h).
#include "comm/tcp/wire.h"
#include "core/le.h"

#include <string.h>

void dt_wire_encode(const dt_wire_header *h, uint8_t out[DT_WIRE_HEADER_BYTES]) {
    dt_put_le32(out + 0, DT_WIRE_MAGIC);
    out[4] = h->kind;
    out[5] = h->fp.coll;
    out[6] = h->fp.dtype;
    out[7] = (uint8_t)(h->fp.op | h->fp.order << 4); // op < 16, order < 16
    dt_put_le64(out + 8, h->fp.seq);
    dt_put_le64(out + 16, h->fp.count);
    dt_put_le32(out + 24, (uint32_t)h->fp.root);
    dt_put_le32(out + 28, h->step);
    dt_put_le64(out + 32, h->nbytes);
    dt_put_le32(out + 40, h->src_rank);
    dt_put_le32(out + 44, dt_crc32c(0, out, 44));
}

dt_status dt_wire_decode(const uint8_t *buf, size_t n, dt_wire_header *h) {
    if (n < DT_WIRE_HEADER_BYTES)
        return dt_fail(DT_ERR_FORMAT, "message header: expected %d bytes, found %zu",
                       DT_WIRE_HEADER_BYTES, n);
    uint32_t magic = dt_get_le32(buf);
    if (magic != DT_WIRE_MAGIC)
        return dt_fail(DT_ERR_FORMAT,
                       "message header: expected magic 0x%08x, found 0x%08x (not a dtrain "
                       "peer, or the byte stream lost its place)",
                       DT_WIRE_MAGIC, magic);
    uint32_t crc = dt_get_le32(buf + 44), want = dt_crc32c(0, buf, 44);
    if (crc != want)
        return dt_fail(DT_ERR_FORMAT, "message header: expected checksum 0x%08x, found 0x%08x",
                       want, crc);
    memset(h, 0, sizeof *h);
    h->kind     = buf[4];
    h->fp.coll  = buf[5];
    h->fp.dtype = buf[6];
    h->fp.op    = buf[7] & 0x0f;
    h->fp.order = buf[7] >> 4;
    h->fp.seq   = dt_get_le64(buf + 8);
    h->fp.count = dt_get_le64(buf + 16);
    h->fp.root  = (int32_t)dt_get_le32(buf + 24);
    h->step     = dt_get_le32(buf + 28);
    h->nbytes   = dt_get_le64(buf + 32);
    h->src_rank = dt_get_le32(buf + 40);
    if (h->kind < DT_WIRE_DATA || h->kind >= DT_WIRE_KIND_COUNT_)
        return dt_fail(DT_ERR_FORMAT, "message header: expected kind 1..%d, found %u",
                       DT_WIRE_KIND_COUNT_ - 1, h->kind);
    if (h->kind == DT_WIRE_DATA) {
        if (h->fp.coll >= DT_COLL_COUNT_)
            return dt_fail(DT_ERR_FORMAT, "message header: expected operation kind < %d, found %u",
                           DT_COLL_COUNT_, h->fp.coll);
        if (h->fp.dtype >= DT_DTYPE_COUNT_)
            return dt_fail(DT_ERR_FORMAT, "message header: expected dtype < %d, found %u",
                           DT_DTYPE_COUNT_, h->fp.dtype);
        if (h->fp.op >= DT_REDUCE_COUNT_)
            return dt_fail(DT_ERR_FORMAT, "message header: expected reduce op < %d, found %u",
                           DT_REDUCE_COUNT_, h->fp.op);
        if (h->fp.order >= DT_ORDER_COUNT_)
            return dt_fail(DT_ERR_FORMAT, "message header: expected reduce order < %d, found %u",
                           DT_ORDER_COUNT_, h->fp.order);
        if (h->nbytes > DT_WIRE_MAX_PAYLOAD)
            return dt_fail(DT_ERR_FORMAT,
                           "message header: expected at most %llu payload bytes, found %llu",
                           (unsigned long long)DT_WIRE_MAX_PAYLOAD, (unsigned long long)h->nbytes);
    } else if (h->kind == DT_WIRE_ABORT || h->kind == DT_WIRE_BYE) {
        if (h->nbytes > DT_WIRE_MAX_REASON)
            return dt_fail(DT_ERR_FORMAT,
                           "message header: expected a reason of at most %d bytes, found %llu",
                           DT_WIRE_MAX_REASON, (unsigned long long)h->nbytes);
    } else if (h->nbytes > DT_WIRE_MAX_HELLO) {
        return dt_fail(DT_ERR_FORMAT,
                       "message header: expected at most %d payload bytes in a hello, found %llu",
                       DT_WIRE_MAX_HELLO, (unsigned long long)h->nbytes);
    }
    return DT_OK;
}
