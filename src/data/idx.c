// idx.c: reading and writing IDX files (the MNIST format), plain or gzip.
//
// The reader trusts nothing in the header: sizes are multiplied with overflow checks,
// compared with the real file size (plain) or with what the compressed size can hold
// (gzip), and buffers grow only as decompressed bytes actually arrive. Only unsigned
// byte data is supported; that is what every MNIST-format dataset ships.
#include "data_impl.h"

#define ZLIB_CONST
#include <errno.h>
#include <libdeflate.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_TYPE_UBYTE 0x08
#define IN_CHUNK       (256u * 1024u)
// Deflate cannot expand data by more than about 1032:1 (zlib's FAQ: 258-byte matches
// coded in 2 bits), so a header claiming more than this many bytes per compressed byte
// is lying, whatever the rest of the stream says.
#define GZ_MAX_RATIO 1032u
// First buffer for gzip data: a few times the compressed size covers real image data
// (MNIST compresses about 2:1) in one allocation, yet stays proportional to the file.
#define GZ_FIRST_RATIO 4u
#define GZ_FIRST_MIN   (1u << 20)
// The fast path takes gzip files up to GZ_FAST_MAX bytes; under a limit, files and
// their inflated data up to GZ_FAST_LIMITED bytes (inflating the whole data is then
// faster than zlib's streaming through the records not kept, and costs little memory).
#define GZ_FAST_MAX     ((size_t)1 << 30)
#define GZ_FAST_LIMITED ((size_t)256 << 20)
// Scratch buffer for the gzip data after the records kept under a limit.
#define GZ_SCRATCH (64u * 1024u)

// One input: a file or a memory block, raw or through zlib.
typedef struct src {
    const char    *name;     // path or caller-given name, for messages
    FILE          *f;        // NULL for memory input
    uint8_t       *ibuf;     // file input window (IN_CHUNK bytes)
    const uint8_t *in;       // current window: ibuf, or the whole memory block
    size_t         in_len;   // bytes in the window
    size_t         in_pos;   // bytes of the window consumed
    uint64_t       raw_size; // size of the whole input (file or memory block)
    uint64_t       fetched;  // raw bytes brought into windows so far
    bool           gz;
    bool           z_live; // inflateInit2 succeeded
    bool           z_end;  // the last gzip member ended with no input left
    z_stream       z;
} src;

static const char *type_name(unsigned t) {
    switch (t) {
    case 0x08:
        return "unsigned byte";
    case 0x09:
        return "signed byte";
    case 0x0B:
        return "short (16-bit)";
    case 0x0C:
        return "int (32-bit)";
    case 0x0D:
        return "float (32-bit)";
    case 0x0E:
        return "double (64-bit)";
    default:
        return "not an IDX type";
    }
}

static void *z_alloc(void *opaque, uInt items, uInt size) {
    (void)opaque;
    size_t n;
    if (!dt_size_mul(&n, items, size))
        return NULL;
    return dt_alloc(n);
}

static void z_free(void *opaque, void *p) {
    (void)opaque;
    dt_free(p);
}

static size_t avail(const src *s) {
    return s->in_len - s->in_pos;
}

// Slides the unread bytes of a file window to its front and reads more behind them.
static dt_status fill(src *s) {
    if (!s->f)
        return DT_OK;
    size_t left = avail(s);
    memmove(s->ibuf, s->ibuf + s->in_pos, left);
    size_t got = fread(s->ibuf + left, 1, IN_CHUNK - left, s->f);
    if (got < IN_CHUNK - left && ferror(s->f))
        return dt_fail_errno(DT_ERR_IO, "%s: read failed", s->name);
    s->in_len = left + got;
    s->in_pos = 0;
    s->fetched += got;
    return DT_OK;
}

// Reads raw bytes: the window first, then (files) straight into dst.
static dt_status raw_read(src *s, uint8_t *dst, size_t n, size_t *got) {
    size_t take = avail(s) < n ? avail(s) : n;
    memcpy(dst, s->in + s->in_pos, take);
    s->in_pos += take;
    size_t done = take;
    if (done < n && s->f) {
        size_t r = fread(dst + done, 1, n - done, s->f);
        if (r < n - done && ferror(s->f))
            return dt_fail_errno(DT_ERR_IO, "%s: read failed", s->name);
        s->fetched += r;
        done += r;
    }
    *got = done;
    return DT_OK;
}

// Inflates up to n bytes into dst; *got < n only when the gzip data ended cleanly.
static dt_status gz_read(src *s, uint8_t *dst, size_t n, size_t *got) {
    size_t done = 0;
    while (done < n && !s->z_end) {
        if (avail(s) == 0) {
            DT_TRY(fill(s));
            if (avail(s) == 0)
                return dt_fail(DT_ERR_FORMAT,
                               "%s: expected more gzip data, found the end of the file "
                               "(truncated gzip stream)",
                               s->name);
        }
        uInt in_n      = avail(s) > UINT_MAX ? UINT_MAX : (uInt)avail(s);
        uInt out_n     = n - done > UINT_MAX ? UINT_MAX : (uInt)(n - done);
        s->z.next_in   = s->in + s->in_pos;
        s->z.avail_in  = in_n;
        s->z.next_out  = dst + done;
        s->z.avail_out = out_n;
        int ret        = inflate(&s->z, Z_NO_FLUSH);
        s->in_pos += in_n - s->z.avail_in;
        done += out_n - s->z.avail_out;
        if (ret == Z_STREAM_END) {
            // Concatenated gzip members form one valid gzip file; anything else after
            // a member is garbage.
            if (avail(s) < 2)
                DT_TRY(fill(s));
            if (avail(s) == 0) {
                s->z_end = true;
                break;
            }
            if (avail(s) >= 2 && s->in[s->in_pos] == 0x1f && s->in[s->in_pos + 1] == 0x8b) {
                inflateReset(&s->z);
                continue;
            }
            uint64_t consumed = s->fetched - avail(s);
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected the file to end with the gzip stream at byte %llu, "
                           "found %llu more bytes",
                           s->name, (unsigned long long)consumed,
                           (unsigned long long)(s->raw_size - consumed));
        }
        if (ret == Z_MEM_ERROR)
            return dt_fail(DT_ERR_NOMEM, "%s: out of memory while decompressing", s->name);
        if (ret == Z_NEED_DICT)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected a plain gzip stream, found one needing a preset "
                           "dictionary",
                           s->name);
        if (ret == Z_DATA_ERROR && s->z.msg && strcmp(s->z.msg, "incorrect data check") == 0)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected a valid gzip stream, found corrupt data (zlib: "
                           "incorrect data check): the CRC-32 of the decompressed data does not "
                           "match the one in the gzip trailer",
                           s->name);
        if (ret != Z_OK && ret != Z_BUF_ERROR)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected a valid gzip stream, found corrupt data (zlib: %s)",
                           s->name, s->z.msg ? s->z.msg : "unknown error");
        if (ret == Z_BUF_ERROR && s->z.avail_in == in_n && s->z.avail_out == out_n)
            return dt_fail(DT_ERR_INTERNAL, "%s: zlib made no progress", s->name);
    }
    *got = done;
    return DT_OK;
}

static dt_status src_read(src *s, uint8_t *dst, size_t n, size_t *got) {
    return s->gz ? gz_read(s, dst, n, got) : raw_read(s, dst, n, got);
}

// Looks at the first bytes and switches to gzip when they are its magic.
static dt_status src_start(src *s) {
    if (avail(s) < 2)
        DT_TRY(fill(s));
    if (avail(s) >= 2 && s->in[s->in_pos] == 0x1f && s->in[s->in_pos + 1] == 0x8b) {
        s->gz       = true;
        s->z.zalloc = z_alloc;
        s->z.zfree  = z_free;
        // 15 window bits + 16: gzip wrapper only (no zlib or raw deflate).
        int ret = inflateInit2(&s->z, 15 + 16);
        if (ret != Z_OK)
            return dt_fail(ret == Z_MEM_ERROR ? DT_ERR_NOMEM : DT_ERR_INTERNAL,
                           "%s: cannot start gzip decompression (zlib error %d)", s->name, ret);
        s->z_live = true;
    }
    return DT_OK;
}

static void src_close(src *s) {
    if (s->z_live)
        inflateEnd(&s->z);
    if (s->f)
        fclose(s->f);
    dt_free(s->ibuf);
}

// src_read in pieces of at most 1 MiB, each added to h while it is still in the cache:
// the records' hash (dt_idx.hash) costs no second pass over the data.
static dt_status src_read_hashed(src *s, uint8_t *dst, size_t n, size_t *got, dt_data_hash *h) {
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < (1u << 20) ? n - done : (1u << 20), k = 0;
        DT_TRY(src_read(s, dst + done, want, &k));
        dt_data_hash_add(h, dst + done, k);
        done += k;
        if (k < want)
            break;
    }
    *got = done;
    return DT_OK;
}

static void dims_str(const dt_idx *x, char *buf, size_t n) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, n - at, "(");
    for (int i = 0; i < x->ndim && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, i ? ", %u" : "%u", x->dims[i]);
    if (at < n)
        snprintf(buf + at, n - at, "%s", x->ndim == 1 ? ",)" : ")");
}

// Inflates the `rest` data bytes of a gzip stream that follow the records kept into a
// scratch buffer and drops them, then checks that the stream ends there: zlib verifies
// the CRC-32 and length of the trailer only when it reaches the end. Memory stays at
// GZ_SCRATCH bytes whatever the header claims; time is that of inflating the rest.
static dt_status gz_finish(src *s, size_t rest, size_t total, size_t hdr_bytes, const char *dstr) {
    uint8_t  one;
    uint8_t *scratch = rest ? dt_alloc(rest < GZ_SCRATCH ? rest : GZ_SCRATCH) : &one;
    if (!scratch)
        return dt_fail_context("%s: scratch buffer for the gzip check", s->name);
    dt_status st = DT_OK;
    size_t    got;
    while (rest && st == DT_OK) {
        size_t n = rest < GZ_SCRATCH ? rest : GZ_SCRATCH;
        st       = src_read(s, scratch, n, &got);
        if (st == DT_OK && got < n)
            st = dt_fail(DT_ERR_FORMAT,
                         "%s: expected %zu bytes of data after the %zu-byte header for dims %s, "
                         "found %zu (after gzip decompression) (truncated data)",
                         s->name, total, hdr_bytes, dstr, total - rest + got);
        rest -= n;
    }
    if (st == DT_OK) {
        st = src_read(s, scratch, 1, &got);
        if (st == DT_OK && got)
            st = dt_fail(DT_ERR_FORMAT,
                         "%s: expected the data to end after %zu bytes for dims %s, found "
                         "more decompressed bytes (trailing data)",
                         s->name, total, dstr);
    }
    if (scratch != &one)
        dt_free(scratch);
    return st;
}

// Reads the whole header, checks it, then the data (the first max_records records).
static dt_status parse(src *s, size_t max_records, dt_idx *out) {
    const char *gzn = s->gz ? " (after gzip decompression)" : "";
    uint8_t     hdr[4 + 4 * DT_IDX_MAX_DIMS];
    size_t      got;
    DT_TRY(src_read(s, hdr, 4, &got));
    if (got < 4)
        return dt_fail(DT_ERR_FORMAT, "%s: expected a 4-byte IDX header%s, found %zu bytes",
                       s->name, gzn, got);
    if (hdr[0] != 0 || hdr[1] != 0)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected an IDX file starting with bytes 00 00%s, found %02x %02x",
                       s->name, gzn, hdr[0], hdr[1]);
    if (hdr[2] != IDX_TYPE_UBYTE)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected IDX data type 0x08 (unsigned byte), found 0x%02X (%s)",
                       s->name, hdr[2], type_name(hdr[2]));
    int ndim = hdr[3];
    if (ndim < 1 || ndim > DT_IDX_MAX_DIMS)
        return dt_fail(DT_ERR_FORMAT, "%s: expected 1 to %d dimensions, found %d", s->name,
                       DT_IDX_MAX_DIMS, ndim);
    size_t dim_bytes = 4 * (size_t)ndim;
    DT_TRY(src_read(s, hdr + 4, dim_bytes, &got));
    if (got < dim_bytes)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected %d dimension sizes (%zu bytes) after the magic, found "
                       "%zu bytes",
                       s->name, ndim, dim_bytes, got);
    out->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        const uint8_t *p = hdr + 4 + 4 * i;
        out->dims[i]     = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    }
    char dstr[80];
    dims_str(out, dstr, sizeof dstr);
    size_t record = 1, total;
    for (int i = 1; i < ndim; i++)
        if (!dt_size_mul(&record, record, out->dims[i]))
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected dimensions whose product fits in memory, found %s",
                           s->name, dstr);
    if (!dt_size_mul(&total, record, out->dims[0]))
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected dimensions whose product fits in memory, found %s", s->name,
                       dstr);
    size_t hdr_bytes = 4 + dim_bytes;
    if (!s->gz) {
        uint64_t have = s->raw_size - hdr_bytes;
        if (have < total)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected %zu bytes of data after the %zu-byte header for dims "
                           "%s, found %llu (truncated file)",
                           s->name, total, hdr_bytes, dstr, (unsigned long long)have);
        if (have > total)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected the file to end after %zu bytes of data for dims %s, "
                           "found %llu trailing bytes",
                           s->name, total, dstr, (unsigned long long)(have - total));
    } else if (total / GZ_MAX_RATIO > s->raw_size) {
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected at most %llu bytes of data from a %llu-byte gzip file, "
                       "found dims %s claiming %zu",
                       s->name, (unsigned long long)s->raw_size * GZ_MAX_RATIO,
                       (unsigned long long)s->raw_size, dstr, total);
    }

    size_t keep = out->dims[0];
    if (max_records && max_records < keep)
        keep = max_records;
    size_t want = keep * record;
    size_t cap  = want;
    if (s->gz) {
        uint64_t first = s->raw_size * GZ_FIRST_RATIO;
        if (first < GZ_FIRST_MIN)
            first = GZ_FIRST_MIN;
        if (first < cap)
            cap = (size_t)first;
    }
    uint8_t *buf = dt_alloc(cap);
    if (!buf)
        return dt_fail_context("%s: data buffer for dims %s", s->name, dstr);
    size_t       filled = 0;
    dt_data_hash h;
    dt_data_hash_init(&h);
    for (;;) {
        dt_status st = src_read_hashed(s, buf + filled, cap - filled, &got, &h);
        if (st) {
            dt_free(buf);
            return st;
        }
        filled += got;
        if (filled < cap) {
            dt_free(buf);
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected %zu bytes of data after the %zu-byte header for dims "
                           "%s, found %zu%s (truncated data)",
                           s->name, total, hdr_bytes, dstr, filled, gzn);
        }
        if (filled == want)
            break;
        // The data keeps coming: double the buffer, never past what the header claims.
        size_t   next = cap > want / 2 ? want : cap * 2;
        uint8_t *nb   = dt_alloc(next);
        if (!nb) {
            dt_free(buf);
            return dt_fail_context("%s: data buffer for dims %s", s->name, dstr);
        }
        memcpy(nb, buf, filled);
        dt_free(buf);
        buf = nb;
        cap = next;
    }
    // Reading on to the end of a gzip stream verifies its CRC and length, also under a
    // limit: the records not kept pass through a small scratch buffer.
    if (s->gz) {
        dt_status st = gz_finish(s, total - want, total, hdr_bytes, dstr);
        if (st) {
            dt_free(buf);
            return st;
        }
    }
    out->data         = buf;
    out->nrecords     = keep;
    out->record_bytes = record;
    out->hash         = dt_data_hash_end(&h);
    return DT_OK;
}

// ------------------------------------------------------- whole gzip files, fast path
//
// A whole gzip file that holds one well-formed unsigned-byte IDX image is inflated in
// one call by libdeflate into a buffer of the size the gzip trailer announces: about
// twice as fast as zlib's streaming inflate here (Fashion-MNIST's training images:
// 0.09 s against 0.16 s), and this time is spent before every run trains. The trailer
// is only a claim, so the IDX header is inflated first (zlib, a few bytes) and the
// buffer is allocated only when header and trailer agree exactly on the size. Whatever
// does not fit that description (several gzip members, a trailer or a header that
// lies, a size mismatch, corrupt data) returns false and is read again by the
// streaming reader, which never inflates more than the header claims (plus one byte)
// and whose messages say precisely what is wrong.

// Parses an IDX unsigned-byte header at the start of `p` (n bytes): its length, dims,
// total data bytes and record bytes. False when it is not one or its sizes overflow.
static bool header_of(const uint8_t *p, size_t n, size_t *hdr, uint32_t dims[DT_IDX_MAX_DIMS],
                      int *ndim, size_t *total, size_t *record) {
    if (n < 4 || p[0] != 0 || p[1] != 0 || p[2] != IDX_TYPE_UBYTE || p[3] < 1 ||
        p[3] > DT_IDX_MAX_DIMS)
        return false;
    *ndim = p[3];
    *hdr  = 4 + 4 * (size_t)*ndim;
    if (n < *hdr)
        return false;
    *total = *record = 1;
    for (int i = 0; i < *ndim; i++) {
        const uint8_t *d = p + 4 + 4 * i;
        dims[i]          = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3];
        if (!dt_size_mul(total, *total, dims[i]) ||
            (i > 0 && !dt_size_mul(record, *record, dims[i])))
            return false;
    }
    return true;
}

// Inflates at most `n` bytes from the start of the gzip stream `in` into `out` (zlib,
// stopping as soon as they are out); the count in *got. False on any zlib error.
static bool gz_peek(const uint8_t *in, size_t in_n, uint8_t *out, size_t n, size_t *got) {
    z_stream z = {0};
    z.zalloc   = z_alloc;
    z.zfree    = z_free;
    if (inflateInit2(&z, 15 + 16) != Z_OK)
        return false;
    z.next_in   = in;
    z.avail_in  = in_n > UINT_MAX ? UINT_MAX : (uInt)in_n;
    z.next_out  = out;
    z.avail_out = (uInt)n;
    int ret     = Z_OK;
    while (ret == Z_OK && z.avail_out > 0)
        ret = inflate(&z, Z_NO_FLUSH);
    *got = n - z.avail_out;
    inflateEnd(&z);
    return ret == Z_OK || ret == Z_STREAM_END || ret == Z_BUF_ERROR;
}

// `max_records` (0: all) keeps only the first records, copied out of the whole inflated
// data; then the data may be at most `max_isize` bytes, else false.
static bool fast_gzip(const uint8_t *in, size_t n, size_t max_records, size_t max_isize,
                      dt_idx *out) {
    if (n < 18 || in[0] != 0x1f || in[1] != 0x8b)
        return false;
    size_t isize = (size_t)in[n - 4] | (size_t)in[n - 3] << 8 | (size_t)in[n - 2] << 16 |
                   (size_t)in[n - 1] << 24;
    size_t limit;
    if (isize < 4 || !dt_size_mul(&limit, n, GZ_MAX_RATIO) || isize > limit)
        return false;
    // The header first: two zero bytes, type 0x08, 1..4 dims, and exactly their product
    // after it, as the trailer says. Only then is the trailer's size allocated.
    uint8_t  head[4 + 4 * DT_IDX_MAX_DIMS];
    uint32_t dims[DT_IDX_MAX_DIMS] = {0};
    size_t   got, hdr, total, record;
    int      ndim;
    if (!gz_peek(in, n, head, sizeof head, &got) ||
        !header_of(head, got, &hdr, dims, &ndim, &total, &record) || isize < hdr ||
        total != isize - hdr)
        return false;
    size_t keep = dims[0];
    if (max_records && max_records < keep) {
        keep = max_records;
        if (isize > max_isize)
            return false;
    }
    uint8_t *buf = dt_alloc(isize);
    if (!buf)
        return false;
    struct libdeflate_decompressor *d    = libdeflate_alloc_decompressor();
    size_t                          used = 0;
    bool                            ok =
        d &&
        libdeflate_gzip_decompress_ex(d, in, n, buf, isize, &used, &got) == LIBDEFLATE_SUCCESS &&
        used == n && got == isize && memcmp(buf, head, hdr) == 0;
    libdeflate_free_decompressor(d);
    if (!ok) {
        dt_free(buf);
        return false;
    }
    if (keep < dims[0]) { // the records kept, in a buffer of their size
        uint8_t *kept = dt_alloc(keep * record);
        if (kept)
            memcpy(kept, buf + hdr, keep * record);
        dt_free(buf);
        if (!kept)
            return false;
        buf = kept;
    } else {
        memmove(buf, buf + hdr, total); // the data starts the buffer, which dt_idx owns
    }
    memset(out, 0, sizeof *out);
    out->data         = buf;
    out->ndim         = ndim;
    out->nrecords     = keep;
    out->record_bytes = record;
    // Inflated in one call: the records are hashed after it, a pass far faster than the
    // inflation (the same value as the streaming reader's).
    out->hash = dt_data_hash_bytes(buf, keep * record);
    memcpy(out->dims, dims, sizeof dims);
    return true;
}

// Reads the whole of the open file f (`size` bytes, at its start) into memory if it is
// a gzip file no larger than `max`; NULL (nothing recorded) otherwise, with f rewound.
static uint8_t *slurp_gzip(FILE *f, uint64_t size, size_t max, size_t *n) {
    uint8_t *buf = NULL;
    uint8_t  magic[2];
    if (size <= max && fread(magic, 1, 2, f) == 2 && magic[0] == 0x1f && magic[1] == 0x8b &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = dt_alloc((size_t)size))) {
        if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
            dt_free(buf);
            buf = NULL;
        }
        *n = (size_t)size;
    }
    rewind(f);
    return buf;
}

dt_status dt_idx_parse_first(const void *buf, size_t nbytes, const char *name, size_t max_records,
                             dt_idx *out) {
    memset(out, 0, sizeof *out);
    if (fast_gzip(buf, nbytes, max_records, GZ_FAST_LIMITED, out))
        return DT_OK;
    src s        = {0};
    s.name       = name ? name : "<memory>";
    s.in         = buf;
    s.in_len     = nbytes;
    s.raw_size   = nbytes;
    s.fetched    = nbytes;
    dt_status st = src_start(&s);
    if (st == DT_OK)
        st = parse(&s, max_records, out);
    src_close(&s);
    if (st)
        memset(out, 0, sizeof *out);
    return st;
}

dt_status dt_idx_parse(const void *buf, size_t nbytes, const char *name, dt_idx *out) {
    return dt_idx_parse_first(buf, nbytes, name, 0, out);
}

dt_status dt_idx_read_first(const char *path, size_t max_records, dt_idx *out) {
    memset(out, 0, sizeof *out);
    src s  = {0};
    s.name = path;
    DT_TRY(dt_open_regular(path, &s.f, &s.raw_size));
    // The fast path first: whole gzip files up to 1 GiB, or up to GZ_FAST_LIMITED with a
    // limit (whose data is inflated whole, then the records kept copied out).
    {
        size_t   n;
        uint8_t *raw = slurp_gzip(s.f, s.raw_size, max_records ? GZ_FAST_LIMITED : GZ_FAST_MAX, &n);
        bool     ok  = raw && fast_gzip(raw, n, max_records, GZ_FAST_LIMITED, out);
        dt_free(raw);
        if (ok) {
            fclose(s.f);
            return DT_OK;
        }
    }
    dt_status st = DT_OK;
    s.ibuf       = dt_alloc(IN_CHUNK);
    s.in         = s.ibuf;
    if (!s.ibuf)
        st = dt_last_status();
    if (st == DT_OK)
        st = src_start(&s);
    if (st == DT_OK)
        st = parse(&s, max_records, out);
    src_close(&s);
    if (st)
        memset(out, 0, sizeof *out);
    return st;
}

dt_status dt_idx_read(const char *path, dt_idx *out) {
    return dt_idx_read_first(path, 0, out);
}

void dt_idx_free(dt_idx *idx) {
    if (!idx)
        return;
    dt_free(idx->data);
    memset(idx, 0, sizeof *idx);
}

// ------------------------------------------------------------------------- writing

static dt_status write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n)
        return dt_fail_errno(DT_ERR_IO, "%s: write failed", path);
    return DT_OK;
}

// Deflates `n` bytes into f; `finish` ends the gzip stream.
static dt_status deflate_to(z_stream *z, FILE *f, const uint8_t *p, size_t n, bool finish,
                            const char *path) {
    uint8_t out[16384];
    do {
        uInt chunk  = n > UINT_MAX ? UINT_MAX : (uInt)n;
        z->next_in  = p;
        z->avail_in = chunk;
        p += chunk;
        n -= chunk;
        int flush = finish && n == 0 ? Z_FINISH : Z_NO_FLUSH;
        int ret;
        do {
            z->next_out  = out;
            z->avail_out = sizeof out;
            ret          = deflate(z, flush);
            if (ret == Z_STREAM_ERROR)
                return dt_fail(DT_ERR_INTERNAL, "%s: deflate failed", path);
            DT_TRY(write_all(f, out, sizeof out - z->avail_out, path));
        } while (z->avail_out == 0);
        if (flush == Z_FINISH && ret != Z_STREAM_END)
            return dt_fail(DT_ERR_INTERNAL, "%s: deflate did not finish", path);
    } while (n > 0);
    return DT_OK;
}

dt_status dt_idx_write(const char *path, const uint8_t *data, int ndim, const uint32_t *dims,
                       bool gzip) {
    if (ndim < 1 || ndim > DT_IDX_MAX_DIMS)
        return dt_fail(DT_ERR_ARG, "dt_idx_write %s: expected 1 to %d dimensions, found %d", path,
                       DT_IDX_MAX_DIMS, ndim);
    uint8_t hdr[4 + 4 * DT_IDX_MAX_DIMS] = {0, 0, IDX_TYPE_UBYTE, (uint8_t)ndim};
    size_t  total                        = 1;
    for (int i = 0; i < ndim; i++) {
        if (!dt_size_mul(&total, total, dims[i]))
            return dt_fail(DT_ERR_ARG, "dt_idx_write %s: dimensions overflow size_t", path);
        uint8_t *p = hdr + 4 + 4 * i;
        p[0]       = (uint8_t)(dims[i] >> 24);
        p[1]       = (uint8_t)(dims[i] >> 16);
        p[2]       = (uint8_t)(dims[i] >> 8);
        p[3]       = (uint8_t)dims[i];
    }
    size_t hdr_bytes = 4 + 4 * (size_t)ndim;

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return dt_fail(DT_ERR_ARG, "dt_idx_write: path too long (%zu bytes)", strlen(path));
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return dt_fail_errno(DT_ERR_IO, "%s: cannot create", tmp);
    dt_status st = DT_OK;
    if (!gzip) {
        st = write_all(f, hdr, hdr_bytes, tmp);
        if (st == DT_OK)
            st = write_all(f, data, total, tmp);
    } else {
        z_stream z = {0};
        z.zalloc   = z_alloc;
        z.zfree    = z_free;
        // 15 window bits + 16: write a gzip wrapper; 8: zlib's default memory level.
        if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
            Z_OK)
            st = dt_fail(DT_ERR_NOMEM, "%s: cannot start gzip compression", tmp);
        else {
            st = deflate_to(&z, f, hdr, hdr_bytes, false, tmp);
            if (st == DT_OK)
                st = deflate_to(&z, f, data, total, true, tmp);
            deflateEnd(&z);
        }
    }
    if (fclose(f) != 0 && st == DT_OK)
        st = dt_fail_errno(DT_ERR_IO, "%s: close failed", tmp);
    if (st == DT_OK && rename(tmp, path) != 0)
        st = dt_fail_errno(DT_ERR_IO, "rename %s to %s failed", tmp, path);
    if (st)
        unlink(tmp);
    return st;
}
