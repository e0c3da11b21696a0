// store_proto.c: the TCP store's wire protocol (comm_impl.h): parsing a message (hostile
// bytes: every length is checked before it is used), walking its parts, checking a
// request's parts for its command, and building a message in a growable buffer. Used by
// the client (store_tcp.c), the server (store_server.c) and the fuzz target.
#include "comm/store/store_impl.h"
#include "core/le.h"

#include <string.h>

dt_status dt_store_msg_parse(const uint8_t *buf, size_t n, bool is_request, dt_store_msg *msg,
                             size_t *consumed) {
    *consumed = 0;
    if (n < DT_STORE_HEADER_BYTES)
        return DT_OK;
    uint32_t magic = dt_get_le32(buf);
    if (magic != DT_STORE_MAGIC)
        return dt_fail(DT_ERR_FORMAT,
                       "store message: expected magic 0x%08x, found 0x%08x (not a dtrain store "
                       "client or server?)",
                       DT_STORE_MAGIC, magic);
    uint8_t  code    = buf[4];
    uint16_t nparts  = dt_get_le16(buf + 6);
    uint32_t payload = dt_get_le32(buf + 16);
    if (buf[5] != 0 || dt_get_le32(buf + 20) != 0)
        return dt_fail(DT_ERR_FORMAT, "store message: expected zero reserved bytes");
    if (is_request && (code < DT_STORE_HELLO || code >= DT_STORE_CMD_COUNT_))
        return dt_fail(DT_ERR_FORMAT, "store message: expected a command in 1..%d, found %u",
                       DT_STORE_CMD_COUNT_ - 1, code);
    if (!is_request && code >= DT_STATUS_COUNT_)
        return dt_fail(DT_ERR_FORMAT, "store message: expected a status below %d, found %u",
                       DT_STATUS_COUNT_, code);
    if (payload > DT_STORE_MAX_PAYLOAD)
        return dt_fail(DT_ERR_FORMAT, "store message: expected at most %u payload bytes, found %u",
                       DT_STORE_MAX_PAYLOAD, payload);
    if ((uint64_t)nparts * 4 > payload)
        return dt_fail(DT_ERR_FORMAT,
                       "store message: %u parts need at least %u bytes, found a payload of %u",
                       nparts, (unsigned)nparts * 4, payload);
    if (n - DT_STORE_HEADER_BYTES < payload)
        return DT_OK;
    // The parts must tile the payload exactly.
    const uint8_t *p   = buf + DT_STORE_HEADER_BYTES;
    uint64_t       off = 0;
    for (uint32_t i = 0; i < nparts; i++) {
        if (payload - off < 4)
            return dt_fail(DT_ERR_FORMAT, "store message: part %u: length field past the end", i);
        uint32_t len = dt_get_le32(p + off);
        off += 4;
        if (len > payload - off)
            return dt_fail(DT_ERR_FORMAT,
                           "store message: part %u: expected at most %llu bytes, found %u", i,
                           (unsigned long long)(payload - off), len);
        off += len;
    }
    if (off != payload)
        return dt_fail(DT_ERR_FORMAT,
                       "store message: parts add up to %llu bytes, the header says %u",
                       (unsigned long long)off, payload);
    msg->code          = code;
    msg->nparts        = nparts;
    msg->arg           = (int64_t)dt_get_le64(buf + 8);
    msg->payload       = p;
    msg->payload_bytes = payload;
    *consumed          = DT_STORE_HEADER_BYTES + (size_t)payload;
    return DT_OK;
}

bool dt_store_msg_part(const dt_store_msg *msg, size_t *cursor, const uint8_t **part,
                       uint32_t *len) {
    if (*cursor + 4 > msg->payload_bytes)
        return false;
    *len  = dt_get_le32(msg->payload + *cursor);
    *part = msg->payload + *cursor + 4;
    *cursor += 4 + (size_t)*len;
    return true;
}

dt_status dt_store_msg_check_request(const dt_store_msg *m) {
    static const char *const names[] = {"",      "hello", "set",         "get",    "wait",
                                        "check", "add",   "compare_set", "delete", "auth"};
    int min = 1, max = 1, keys = 1; // keys: how many leading parts are keys (-1 = all)
    switch ((dt_store_cmd)m->code) {
    case DT_STORE_HELLO:
        min = max = 2, keys = 0;
        break;
    case DT_STORE_AUTH:
        keys = 0;
        break;
    case DT_STORE_SET:
        min = max = 2;
        break;
    case DT_STORE_GET:
    case DT_STORE_ADD:
    case DT_STORE_DELETE:
        break;
    case DT_STORE_WAIT:
    case DT_STORE_CHECK:
        min = 0, max = DT_STORE_MAX_PARTS, keys = -1;
        break;
    case DT_STORE_CAS:
        min = max = 3;
        break;
    default:
        return dt_fail(DT_ERR_FORMAT, "store message: unknown command %u", m->code);
    }
    if (m->nparts < min || m->nparts > max)
        return dt_fail(DT_ERR_FORMAT, "store %s: expected %d..%d parts, found %u", names[m->code],
                       min, max, m->nparts);
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    for (int i = 0; dt_store_msg_part(m, &cur, &p, &len); i++) {
        bool is_key = keys < 0 || i < keys;
        if (is_key && (len == 0 || len > DT_STORE_MAX_KEY || memchr(p, 0, len)))
            return dt_fail(DT_ERR_FORMAT,
                           "store %s: expected a key of 1..%d bytes without NUL, found %u bytes",
                           names[m->code], DT_STORE_MAX_KEY, len);
        if (!is_key && len > DT_STORE_MAX_VALUE)
            return dt_fail(DT_ERR_FORMAT, "store %s: value of %u bytes exceeds %u", names[m->code],
                           len, DT_STORE_MAX_VALUE);
    }
    return DT_OK;
}

// Appends header + parts of a message to a growable buffer.

dt_status dt_buf_reserve(dt_buf *b, size_t more) {
    if (b->len + more <= b->cap)
        return DT_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *np = dt_alloc(cap);
    if (!np)
        return DT_ERR_NOMEM;
    if (b->len)
        memcpy(np, b->p, b->len);
    dt_free(b->p);
    b->p   = np;
    b->cap = cap;
    return DT_OK;
}

dt_status dt_buf_message(dt_buf *b, uint8_t code, int64_t arg, int nparts, const void *const *parts,
                         const size_t *lens) {
    size_t payload = 0;
    for (int i = 0; i < nparts; i++)
        payload += 4 + lens[i];
    DT_TRY(dt_buf_reserve(b, DT_STORE_HEADER_BYTES + payload));
    uint8_t *h = b->p + b->len;
    memset(h, 0, DT_STORE_HEADER_BYTES);
    dt_put_le32(h, DT_STORE_MAGIC);
    h[4] = code;
    dt_put_le16(h + 6, (uint16_t)nparts);
    dt_put_le64(h + 8, (uint64_t)arg);
    dt_put_le32(h + 16, (uint32_t)payload);
    uint8_t *p = h + DT_STORE_HEADER_BYTES;
    for (int i = 0; i < nparts; i++) {
        dt_put_le32(p, (uint32_t)lens[i]);
        if (lens[i])
            memcpy(p + 4, parts[i], lens[i]);
        p += 4 + lens[i];
    }
    b->len += DT_STORE_HEADER_BYTES + payload;
    return DT_OK;
}
