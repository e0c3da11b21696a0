// format.c: checkpoint files as bytes. Writing (sections with CRC32C, then an atomic
// tmp/fsync/rename/fsync-directory commit), parsing (magic, version, sizes, checksums)
// and decoding each section with bounds checks on every field. Knows nothing about
// directories or ranks (ckpt.c). Layout: docs/checkpoint-format.md.
#include "ckpt_impl.h"
#include "core/file.h"
#include "core/le.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Fuzzing builds accept wrong checksums (and still compute them), so that mutated
// inputs reach the section decoders instead of stopping at the first CRC.
#ifdef DT_FUZZ
#define CRC_ENFORCED 0
#else
#define CRC_ENFORCED 1
#endif

static const char *tag_name(uint32_t tag, char out[8]) {
    for (int i = 0; i < 4; i++) {
        char c = (char)(tag >> (8 * i));
        out[i] = c >= 0x20 && c < 0x7f ? c : '?';
    }
    out[4] = '\0';
    return out;
}

const char *dt_ckpt_kind_name(uint32_t kind) {
    switch (kind) {
    case CK_KIND_STATE:
        return "state";
    case CK_KIND_RANK:
        return "rank";
    case CK_KIND_MARKER:
        return "completion marker";
    case CK_KIND_MODEL:
        return "model";
    default:
        return "unknown";
    }
}

// -------------------------------------------------------------------------- buffer

static bool buf_reserve(ck_buf *b, size_t more) {
    if (b->oom)
        return false;
    size_t need;
    if (!dt_size_add(&need, b->len, more)) {
        b->oom = true;
        return false;
    }
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    uint8_t *p = dt_alloc(cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    if (b->len)
        memcpy(p, b->p, b->len);
    dt_free(b->p);
    b->p   = p;
    b->cap = cap;
    return true;
}

void dt_ckpt_buf_u32(ck_buf *b, uint32_t v) {
    if (buf_reserve(b, 4)) {
        dt_put_le32(b->p + b->len, v);
        b->len += 4;
    }
}

void dt_ckpt_buf_u64(ck_buf *b, uint64_t v) {
    if (buf_reserve(b, 8)) {
        dt_put_le64(b->p + b->len, v);
        b->len += 8;
    }
}

void dt_ckpt_buf_bytes(ck_buf *b, const void *p, size_t n) {
    if (n && buf_reserve(b, n)) {
        memcpy(b->p + b->len, p, n);
        b->len += n;
    }
}

void dt_ckpt_buf_str(ck_buf *b, const char *s) {
    size_t n = strlen(s);
    dt_ckpt_buf_u32(b, (uint32_t)n);
    dt_ckpt_buf_bytes(b, s, n);
}

void dt_ckpt_buf_free(ck_buf *b) {
    dt_free(b->p);
    *b = (ck_buf){0};
}

// ------------------------------------------------------------------------- writing

static dt_status write_all(int fd, const void *p, size_t n) {
    const uint8_t *q = p;
    while (n > 0) {
        // Bounded chunks: some file systems dislike single writes above 2 GiB.
        size_t  chunk = n < (1u << 30) ? n : (1u << 30);
        ssize_t k     = write(fd, q, chunk);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return DT_ERR_IO;
        }
        q += k;
        n -= (size_t)k;
    }
    return DT_OK;
}

static void dir_of(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else if (slash == path)
        snprintf(dir, n, "/");
    else
        snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

dt_status dt_ckpt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot open directory %s to fsync it", dir);
    int rc = fsync(fd);
    close(fd);
    if (rc != 0)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: fsync of directory %s failed", dir);
    return DT_OK;
}

dt_status dt_ckpt_write_file(const char *path, const ck_header *h, const ck_section *secs,
                             int nsecs, uint64_t *size_out, uint32_t *crc_out) {
    if (nsecs < 0 || nsecs > CK_MAX_SECTIONS)
        return dt_fail(DT_ERR_INTERNAL, "checkpoint: %d sections", nsecs);
    // Section headers first: each CRC covers its header's first 16 bytes and the
    // payload, so a flipped tag or length is caught like a flipped payload byte.
    uint8_t  sechdr[CK_MAX_SECTIONS][CK_SECHDR_SIZE];
    uint64_t size = CK_HEADER_SIZE;
    for (int i = 0; i < nsecs; i++) {
        if (secs[i].head.oom)
            return dt_fail(DT_ERR_NOMEM, "checkpoint: out of memory building %s", path);
        uint64_t len = (uint64_t)secs[i].head.len + (uint64_t)secs[i].data_len;
        uint8_t *sh  = sechdr[i];
        memset(sh, 0, CK_SECHDR_SIZE);
        dt_put_le32(sh, secs[i].tag);
        dt_put_le64(sh + 8, len);
        uint32_t crc = dt_crc32c(0, sh, 16);
        crc          = dt_crc32c(crc, secs[i].head.p, secs[i].head.len);
        if (secs[i].data_len)
            crc = dt_crc32c(crc, secs[i].data, secs[i].data_len);
        dt_put_le32(sh + 16, crc);
        size += CK_SECHDR_SIZE + len;
    }
    uint8_t hdr[CK_HEADER_SIZE] = {0};
    memcpy(hdr, CK_MAGIC, 8);
    dt_put_le32(hdr + 8, DT_CKPT_VERSION);
    dt_put_le32(hdr + 12, CK_HEADER_SIZE);
    dt_put_le32(hdr + 16, h->kind);
    dt_put_le32(hdr + 20, (uint32_t)nsecs);
    dt_put_le64(hdr + 24, (uint64_t)h->step);
    dt_put_le32(hdr + 32, h->world);
    dt_put_le32(hdr + 36, h->rank);
    dt_put_le64(hdr + 40, size);
    // The header's CRC covers the section table's CRC, so the header CRC alone
    // fingerprints the whole file (the manifest records it).
    dt_put_le32(hdr + 48, dt_crc32c(0, sechdr, (size_t)nsecs * CK_SECHDR_SIZE));
    uint32_t hcrc = dt_crc32c(0, hdr, 60);
    dt_put_le32(hdr + 60, hcrc);

    char tmp[4096 + 32], dir[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return dt_fail(DT_ERR_ARG, "checkpoint: path too long: %s", path);
    dir_of(path, dir, sizeof dir);
    const char *op = "open";
    int         fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        goto fail;
    op = "write";
    if (write_all(fd, hdr, sizeof hdr))
        goto fail;
    for (int i = 0; i < nsecs; i++)
        if (write_all(fd, sechdr[i], CK_SECHDR_SIZE) ||
            write_all(fd, secs[i].head.p, secs[i].head.len) ||
            (secs[i].data_len && write_all(fd, secs[i].data, secs[i].data_len)))
            goto fail;
    op = "fsync";
    if (fsync(fd) != 0)
        goto fail;
    op     = "close";
    int rc = close(fd);
    fd     = -1;
    if (rc != 0)
        goto fail;
    op = "rename";
    if (rename(tmp, path) != 0)
        goto fail;
    DT_TRY(dt_ckpt_fsync_dir(dir));
    if (size_out)
        *size_out = size;
    if (crc_out)
        *crc_out = hcrc;
    return DT_OK;
fail:;
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    errno = e;
    return dt_fail_errno(DT_ERR_IO, "checkpoint: writing %s failed at %s of %s", path, op, tmp);
}

// ------------------------------------------------------------------------- reading

static void hex8(const uint8_t *p, size_t n, char *out) {
    out[0] = '\0';
    for (size_t i = 0, k = 0; i < n && i < 8; i++)
        k += (size_t)sprintf(out + k, i ? " %02x" : "%02x", p[i]);
    if (n == 0)
        strcpy(out, "nothing");
}

// The 64-byte header: `avail` bytes of it at p, of a file of n bytes. Everything a
// header can be checked for is checked here, before a reader reads or allocates for
// the rest of the file.
static dt_status parse_header(const uint8_t *p, size_t avail, uint64_t n, const char *name,
                              ck_file *f) {
    memset(f, 0, sizeof *f);
    f->name = name;
    // Magic and version come before anything else: a file of another kind or of a
    // later format says so, rather than "corrupt".
    if (avail < 8 && (avail == 0 || memcmp(p, CK_MAGIC, avail) == 0))
        return dt_fail(DT_ERR_FORMAT,
                       "%s: truncated: expected at least %d bytes (the header), "
                       "found %zu",
                       name, CK_HEADER_SIZE, avail);
    if (avail < 8 || memcmp(p, CK_MAGIC, 8) != 0) {
        char found[32], want[32];
        hex8(p, avail, found);
        hex8((const uint8_t *)CK_MAGIC, 8, want);
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected the magic of a dtrain checkpoint file (%s), found %s", name,
                       want, found);
    }
    if (avail < CK_HEADER_SIZE)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: truncated: expected at least %d bytes (the header), "
                       "found %zu",
                       name, CK_HEADER_SIZE, avail);
    uint32_t version = dt_get_le32(p + 8);
    if (version < DT_CKPT_VERSION_MIN || version > DT_CKPT_VERSION)
        return dt_fail(DT_ERR_FORMAT, "%s: expected format version %d..%d, found version %u", name,
                       DT_CKPT_VERSION_MIN, DT_CKPT_VERSION, version);
    uint32_t hsize = dt_get_le32(p + 12);
    if (hsize != CK_HEADER_SIZE)
        return dt_fail(DT_ERR_FORMAT, "%s: expected a header of %d bytes, found %u", name,
                       CK_HEADER_SIZE, hsize);
    uint32_t hcrc = dt_crc32c(0, p, 60), stored = dt_get_le32(p + 60);
    if (hcrc != stored && CRC_ENFORCED)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: corrupt header: expected CRC32C %08x (stored), found %08x", name,
                       stored, hcrc);
    f->version    = version;
    f->kind       = dt_get_le32(p + 16);
    f->nsec       = dt_get_le32(p + 20);
    f->step       = (int64_t)dt_get_le64(p + 24);
    f->world      = dt_get_le32(p + 32);
    f->rank       = dt_get_le32(p + 36);
    f->size       = dt_get_le64(p + 40);
    f->header_crc = hcrc;
    if (f->size != n)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: %s: expected %llu bytes (the size in its header), "
                       "found %llu",
                       name, n < f->size ? "truncated" : "bytes after the end",
                       (unsigned long long)f->size, (unsigned long long)n);
    if (f->kind < CK_KIND_STATE || f->kind > CK_KIND_MODEL)
        return dt_fail(DT_ERR_FORMAT, "%s: expected a file kind in 1..4, found %u", name, f->kind);
    if (f->nsec > CK_MAX_SECTIONS)
        return dt_fail(DT_ERR_FORMAT, "%s: expected at most %d sections, found %u", name,
                       CK_MAX_SECTIONS, f->nsec);
    if (f->step < 0 || f->world < 1 || f->rank >= f->world)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected step >= 0 and rank < world size >= 1, found step %lld, "
                       "rank %u, world size %u",
                       name, (long long)f->step, f->rank, f->world);
    return DT_OK;
}

dt_status dt_ckpt_parse(const void *buf, size_t n, const char *name, ck_file *f) {
    const uint8_t *p = buf;
    DT_TRY(parse_header(p, n, n, name, f));
    // The section table.
    size_t   off  = CK_HEADER_SIZE;
    uint32_t tcrc = 0;
    for (uint32_t i = 0; i < f->nsec; i++) {
        char tn[8];
        if (n - off < CK_SECHDR_SIZE)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: section %u: expected a %d-byte section header at byte %zu, found "
                           "%zu bytes left",
                           name, i, CK_SECHDR_SIZE, off, n - off);
        const uint8_t *sh  = p + off;
        uint64_t       len = dt_get_le64(sh + 8);
        tcrc               = dt_crc32c(tcrc, sh, CK_SECHDR_SIZE);
        off += CK_SECHDR_SIZE;
        if (len > n - off)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: section %u (%s): expected a length within the %zu bytes left, "
                           "found %llu (corrupt length or truncated file)",
                           name, i, tag_name(dt_get_le32(sh), tn), n - off,
                           (unsigned long long)len);
        uint32_t crc = dt_crc32c(dt_crc32c(0, sh, 16), p + off, (size_t)len);
        if (crc != dt_get_le32(sh + 16) && CRC_ENFORCED)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: corrupt section %u (%s): expected CRC32C %08x (stored), found %08x",
                           name, i, tag_name(dt_get_le32(sh), tn), dt_get_le32(sh + 16), crc);
        uint32_t tag = dt_get_le32(sh);
        for (uint32_t j = 0; j < i; j++)
            if (f->sec[j].tag == tag)
                return dt_fail(DT_ERR_FORMAT, "%s: expected one %s section, found two", name,
                               tag_name(tag, tn));
        f->sec[i] = (ck_sec){.tag = tag, .p = p + off, .len = len};
        off += (size_t)len;
    }
    if (off != n)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected the sections to end at byte %zu (the file's "
                       "end), found them ending at byte %zu",
                       name, n, off);
    if (tcrc != dt_get_le32(p + 48) && CRC_ENFORCED)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: corrupt section table: expected CRC32C %08x (stored), found %08x", name,
                       dt_get_le32(p + 48), tcrc);
    return DT_OK;
}

// --------------------------------------------------------------------- files

static dt_status read_exact(FILE *fp, uint8_t *p, size_t n, size_t *got, const char *path) {
    *got = fread(p, 1, n, fp);
    if (*got < n && ferror(fp))
        return dt_fail_errno(DT_ERR_IO, "checkpoint: reading %s failed", path);
    return DT_OK; // short: the file shrank meanwhile, and the size checks say so
}

dt_status dt_ckpt_open(const char *path, ck_reader *r, ck_file *f) {
    memset(r, 0, sizeof *r);
    r->path = path;
    DT_TRY(dt_open_regular(path, &r->fp, &r->size));
    size_t    want = r->size < CK_HEADER_SIZE ? (size_t)r->size : CK_HEADER_SIZE, got;
    dt_status s    = read_exact(r->fp, r->hdr, want, &got, path);
    if (!s)
        s = parse_header(r->hdr, got, got < want ? got : r->size, path, f);
    if (s)
        dt_ckpt_close(r);
    return s;
}

dt_status dt_ckpt_read_body(ck_reader *r, uint8_t **buf, ck_file *f) {
    *buf = NULL;
    // The allocation is the file's real size, which its checked header also records.
    size_t    n = (size_t)r->size, got = 0;
    uint8_t  *p = dt_alloc(n ? n : 1);
    dt_status s = p ? DT_OK : DT_ERR_NOMEM;
    if (!s) {
        memcpy(p, r->hdr, CK_HEADER_SIZE);
        s = read_exact(r->fp, p + CK_HEADER_SIZE, n - CK_HEADER_SIZE, &got, r->path);
    }
    if (!s)
        s = dt_ckpt_parse(p, CK_HEADER_SIZE + got, r->path, f);
    dt_ckpt_close(r);
    if (s) {
        dt_free(p);
        return s;
    }
    *buf = p;
    return DT_OK;
}

void dt_ckpt_close(ck_reader *r) {
    if (r->fp)
        fclose(r->fp);
    r->fp = NULL;
}

dt_status dt_ckpt_read(const char *path, uint8_t **buf, ck_file *f) {
    ck_reader r;
    *buf = NULL;
    DT_TRY(dt_ckpt_open(path, &r, f));
    return dt_ckpt_read_body(&r, buf, f);
}

const ck_sec *dt_ckpt_find(const ck_file *f, uint32_t tag) {
    for (uint32_t i = 0; i < f->nsec; i++)
        if (f->sec[i].tag == tag)
            return &f->sec[i];
    return NULL;
}

dt_status dt_ckpt_need(const ck_file *f, uint32_t tag, const ck_sec **out) {
    if ((*out = dt_ckpt_find(f, tag)))
        return DT_OK;
    char tn[8];
    return dt_fail(DT_ERR_FORMAT, "%s: expected a %s section in a %s file, found none", f->name,
                   tag_name(tag, tn), dt_ckpt_kind_name(f->kind));
}

dt_status dt_ckpt_expect_kind(const ck_file *f, uint32_t kind, uint32_t also) {
    if (f->kind == kind || (also && f->kind == also))
        return DT_OK;
    if (also)
        return dt_fail(DT_ERR_FORMAT, "%s: expected a %s or %s file, found a %s file", f->name,
                       dt_ckpt_kind_name(kind), dt_ckpt_kind_name(also),
                       dt_ckpt_kind_name(f->kind));
    return dt_fail(DT_ERR_FORMAT, "%s: expected a %s file, found a %s file", f->name,
                   dt_ckpt_kind_name(kind), dt_ckpt_kind_name(f->kind));
}

// ------------------------------------------------------------------- section reader

// A cursor over one section's payload; reading past its end sets `bad` and yields 0.
typedef struct rd {
    const uint8_t *p;
    size_t         left;
    bool           bad;
} rd;

static rd rd_of(const ck_sec *s) {
    return (rd){.p = s->p, .left = (size_t)s->len};
}

static const uint8_t *rd_take(rd *r, size_t n) {
    if (r->bad || r->left < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *q = r->p;
    r->p += n;
    r->left -= n;
    return q;
}
static uint32_t rd_u32(rd *r) {
    const uint8_t *q = rd_take(r, 4);
    return q ? dt_get_le32(q) : 0;
}
static uint64_t rd_u64(rd *r) {
    const uint8_t *q = rd_take(r, 8);
    return q ? dt_get_le64(q) : 0;
}
// A length-prefixed name of 1..max bytes without NUL bytes, copied into out (max + 1).
// Returns false (with *why set) when it is malformed; r->bad when it runs out.
static bool rd_name(rd *r, char *out, size_t max, size_t min, const char **why) {
    uint32_t len = rd_u32(r);
    if (r->bad)
        return false;
    if (len < min || len > max) {
        *why = "length";
        return false;
    }
    const uint8_t *q = rd_take(r, len);
    if (!q)
        return false;
    if (memchr(q, '\0', len)) {
        *why = "NUL byte";
        return false;
    }
    memcpy(out, q, len);
    out[len] = '\0';
    return true;
}

static dt_status bad_section(const ck_file *f, const ck_sec *s, const char *what) {
    char tn[8];
    return dt_fail(DT_ERR_FORMAT, "%s: section %s: %s", f->name, tag_name(s->tag, tn), what);
}

static dt_status expect_end(const ck_file *f, const ck_sec *s, const rd *r) {
    if (r->bad)
        return bad_section(f, s, "expected more bytes than the section holds (truncated entry)");
    if (r->left) {
        char tn[8];
        return dt_fail(DT_ERR_FORMAT, "%s: section %s: expected it to end, found %zu more bytes",
                       f->name, tag_name(s->tag, tn), r->left);
    }
    return DT_OK;
}

// --------------------------------------------------------------------- the sections

dt_status dt_ckpt_decode_parm(const ck_file *f, const ck_sec *s, ck_parm *out) {
    rd       r     = rd_of(s);
    uint64_t count = rd_u64(&r);
    if (r.bad || count > r.left / 4)
        return bad_section(f, s, "expected a float count that the section holds");
    out->count  = count;
    out->floats = rd_take(&r, (size_t)count * 4);
    return expect_end(f, s, &r);
}

dt_status dt_ckpt_decode_optm(const ck_file *f, const ck_sec *s, ck_optm *out) {
    rd          r   = rd_of(s);
    const char *why = "";
    if (!rd_name(&r, out->name, DT_CKPT_NAME_MAX, 1, &why))
        return bad_section(f, s, r.bad ? "truncated optimizer name" : "malformed optimizer name");
    out->steps      = (int64_t)rd_u64(&r);
    out->num_params = rd_u64(&r);
    out->nfloats    = rd_u64(&r);
    if (r.bad || out->steps < 0 || out->nfloats > r.left / 4)
        return bad_section(f, s, "expected a step count >= 0 and a float count the section holds");
    out->floats = rd_take(&r, (size_t)out->nfloats * 4);
    return expect_end(f, s, &r);
}

dt_status dt_ckpt_decode_smpl(const ck_file *f, const ck_sec *s, ck_smpl *out) {
    rd r              = rd_of(s);
    out->epoch        = rd_u64(&r);
    out->position     = rd_u64(&r);
    out->num_samples  = rd_u64(&r);
    out->total_size   = rd_u64(&r);
    out->dataset_size = rd_u64(&r);
    DT_TRY(expect_end(f, s, &r));
    if (out->position > out->num_samples)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: section SMPL: expected a position <= %llu (samples per pass), found "
                       "%llu",
                       f->name, (unsigned long long)out->num_samples,
                       (unsigned long long)out->position);
    return DT_OK;
}

static void shape_str(const int64_t *shape, uint32_t ndim, char *out, size_t n) {
    size_t k = (size_t)snprintf(out, n, "(");
    for (uint32_t d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n)
        snprintf(out + k, n - k, ")");
}

dt_status dt_ckpt_check_ptab(const ck_file *f, const ck_sec *s, uint64_t nparams,
                             const dt_params *m, bool buffers) {
    rd          r     = rd_of(s);
    uint32_t    count = rd_u32(&r);
    const char *tab   = buffers ? "BTAB" : "PTAB";
    const char *what  = buffers ? "buffer" : "parameter";
    int         mine  = m ? (buffers ? dt_params_buffer_count(m) : dt_params_count(m)) : 0;
    if (r.bad)
        return bad_section(f, s, "expected a tensor count");
    if (m && (int64_t)count != mine)
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: model mismatch: expected %d %s tensors (the model's), found %u",
                       f->name, mine, what, count);
    uint64_t next = 0; // tensors are contiguous, in order, from offset 0
    for (uint32_t i = 0; i < count; i++) {
        char        name[DT_CKPT_NAME_MAX + 1];
        const char *why = "";
        if (!rd_name(&r, name, DT_CKPT_NAME_MAX, 1, &why))
            return dt_fail(DT_ERR_FORMAT, "%s: section %s: tensor %u: %s name", f->name, tab, i,
                           r.bad ? "truncated" : "malformed");
        uint32_t ndim = rd_u32(&r);
        if (r.bad || ndim < 1 || ndim > 4)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: section %s: tensor %u (%s): expected 1..4 dimensions, found %u",
                           f->name, tab, i, name, ndim);
        int64_t  shape[4];
        uint64_t prod = 1;
        bool     ok   = true;
        for (uint32_t d = 0; d < ndim; d++) {
            shape[d] = (int64_t)rd_u64(&r);
            ok = ok && shape[d] > 0 && !__builtin_mul_overflow(prod, (uint64_t)shape[d], &prod);
        }
        uint64_t offset = rd_u64(&r), cnt = rd_u64(&r);
        int32_t  layer = (int32_t)rd_u32(&r);
        // Version 2: flags (DT_PARAM_*), and layer -1 for tensors of no layer.
        uint32_t flags     = f->version >= 2 ? rd_u32(&r) : 0;
        int32_t  min_layer = f->version >= 2 ? -1 : 0;
        if (r.bad)
            return bad_section(f, s,
                               "expected more bytes than the section holds (truncated entry)");
        if (!ok || prod != cnt || offset != next || cnt > nparams - next || layer < min_layer ||
            (flags & ~(uint32_t)(DT_PARAM_FROZEN | DT_PARAM_NO_DECAY))) {
            char sh[128];
            shape_str(shape, ndim, sh, sizeof sh);
            return dt_fail(DT_ERR_FORMAT,
                           "%s: section %s: tensor %u (%s): expected positive dimensions whose "
                           "product is its count, at offset %llu within %llu floats, a layer >= "
                           "%d and known flags, found shape %s, count %llu, offset %llu, layer "
                           "%d, flags 0x%x",
                           f->name, tab, i, name, (unsigned long long)next,
                           (unsigned long long)nparams, min_layer, sh, (unsigned long long)cnt,
                           (unsigned long long)offset, layer, flags);
        }
        next += cnt;
        if (m) {
            const dt_param_info *pi =
                buffers ? dt_params_buffer_info(m, (int)i) : dt_params_info(m, (int)i);
            bool same = strcmp(pi->name, name) == 0 && (uint32_t)pi->ndim == ndim &&
                        pi->offset == offset && pi->count == cnt;
            for (uint32_t d = 0; same && d < ndim; d++)
                same = pi->shape[d] == shape[d];
            if (!same) {
                char want[128], got[128];
                shape_str(pi->shape, (uint32_t)pi->ndim, want, sizeof want);
                shape_str(shape, ndim, got, sizeof got);
                return dt_fail(DT_ERR_MISMATCH,
                               "%s: model mismatch: %s tensor %u: expected \"%s\" of shape "
                               "%s (the model's), found \"%s\" of shape %s",
                               f->name, what, i, pi->name, want, name, got);
            }
        }
    }
    DT_TRY(expect_end(f, s, &r));
    if (next != nparams)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: section %s: expected tensors covering the %llu floats, found "
                       "them covering %llu",
                       f->name, tab, (unsigned long long)nparams, (unsigned long long)next);
    return DT_OK;
}

dt_status dt_ckpt_check_rngs(const ck_file *f, const ck_sec *s, const char *name, dt_rng *out,
                             bool *found) {
    rd       r     = rd_of(s);
    uint32_t count = rd_u32(&r);
    if (found)
        *found = false;
    if (r.bad)
        return bad_section(f, s, "expected a generator count");
    for (uint32_t i = 0; i < count; i++) {
        char        nm[DT_CKPT_NAME_MAX + 1];
        const char *why = "";
        if (!rd_name(&r, nm, DT_CKPT_NAME_MAX, 1, &why))
            return dt_fail(DT_ERR_FORMAT, "%s: section RNGS: generator %u: %s name", f->name, i,
                           r.bad ? "truncated" : "malformed");
        dt_rng g;
        g.key[0] = rd_u32(&r);
        g.key[1] = rd_u32(&r);
        for (int k = 0; k < 4; k++)
            g.ctr[k] = rd_u32(&r);
        for (int k = 0; k < 4; k++)
            g.buf[k] = rd_u32(&r);
        g.left = (int)rd_u32(&r);
        if (r.bad)
            return bad_section(f, s,
                               "expected more bytes than the section holds (truncated entry)");
        if (g.left < 0 || g.left > 4)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: section RNGS: generator \"%s\": expected 0..4 buffered words, "
                           "found %d",
                           f->name, nm, g.left);
        if (name && !*found && strcmp(nm, name) == 0) {
            *out   = g;
            *found = true;
        }
    }
    return expect_end(f, s, &r);
}

dt_status dt_ckpt_decode_kval(const ck_file *f, const ck_sec *s, dt_ckpt_kv **out, int *n) {
    rd       r     = rd_of(s);
    uint32_t count = rd_u32(&r);
    if (out) {
        *out = NULL;
        *n   = 0;
    }
    // Each entry takes at least 9 bytes (two lengths and a 1-byte key), which bounds the
    // count before anything is allocated for it.
    if (r.bad || count > r.left / 9 || count > INT32_MAX)
        return bad_section(f, s, "expected an entry count that the section can hold");
    // First pass: validate and size the copy.
    rd     v     = r;
    size_t bytes = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t       klen = rd_u32(&v);
        const uint8_t *k    = rd_take(&v, klen);
        uint32_t       vlen = rd_u32(&v);
        const uint8_t *val  = v.bad ? NULL : rd_take(&v, vlen);
        if (v.bad)
            return bad_section(f, s,
                               "expected more bytes than the section holds (truncated entry)");
        if (klen < 1 || klen > DT_CKPT_NAME_MAX || vlen > DT_CKPT_VALUE_MAX ||
            memchr(k, '\0', klen) || memchr(val, '\0', vlen))
            return dt_fail(DT_ERR_FORMAT,
                           "%s: section KVAL: entry %u: expected a key of 1..%d bytes and a value "
                           "of at most %d bytes, without NUL bytes; found %u and %u bytes",
                           f->name, i, DT_CKPT_NAME_MAX, DT_CKPT_VALUE_MAX, klen, vlen);
        bytes += (size_t)klen + vlen + 2;
    }
    DT_TRY(expect_end(f, s, &v));
    if (!out)
        return DT_OK;
    size_t      head = sizeof(dt_ckpt_kv) * count;
    dt_ckpt_kv *kv   = dt_alloc(head + bytes);
    if (!kv)
        return DT_ERR_NOMEM;
    char *text = (char *)kv + head;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t klen = rd_u32(&r);
        memcpy(text, rd_take(&r, klen), klen);
        text[klen] = '\0';
        kv[i].key  = text;
        text += klen + 1;
        uint32_t vlen = rd_u32(&r);
        if (vlen)
            memcpy(text, rd_take(&r, vlen), vlen);
        text[vlen]  = '\0';
        kv[i].value = text;
        text += vlen + 1;
    }
    *out = kv;
    *n   = (int)count;
    return DT_OK;
}

// A manifest names files in the checkpoint's own directory: plain names only, so a
// crafted manifest cannot point a reader elsewhere.
static bool plain_file_name(const char *s) {
    return strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

bool dt_ckpt_mani_entry(const ck_sec *s, uint32_t i, char *name, uint64_t *size, uint32_t *crc) {
    rd       r     = rd_of(s);
    uint32_t count = rd_u32(&r);
    if (i >= count)
        return false;
    for (uint32_t j = 0; j <= i; j++) {
        const char *why = "";
        if (!rd_name(&r, name, DT_CKPT_NAME_MAX, 1, &why))
            return false;
        *size = rd_u64(&r);
        *crc  = rd_u32(&r);
    }
    return !r.bad;
}

// The slot of a marker's entry: 0 for the state file, 1 + R for rank R's file, -1 for
// any other name (or a rank not below world).
static int64_t mani_slot(const char *name, uint32_t world) {
    if (strcmp(name, CK_STATE_FILE) == 0)
        return 0;
    char    want[32];
    int64_t r = 0;
    if (strncmp(name, "rank-", 5) != 0)
        return -1;
    for (const char *p = name + 5; *p >= '0' && *p <= '9' && r < (int64_t)world; p++)
        r = r * 10 + (*p - '0');
    if (r >= (int64_t)world)
        return -1;
    snprintf(want, sizeof want, CK_RANK_FILE_FMT, (int)r);
    return strcmp(want, name) == 0 ? 1 + r : -1;
}

dt_status dt_ckpt_check_mani(const ck_file *f, const ck_sec *s, const char *name, uint64_t *size,
                             uint32_t *crc, bool *found) {
    rd       r      = rd_of(s);
    uint32_t count  = rd_u32(&r);
    bool     marker = f->kind == CK_KIND_MARKER;
    if (found)
        *found = false;
    if (r.bad)
        return bad_section(f, s, "expected a file count");
    // A marker lists the state file and every rank's file, each once, and nothing else:
    // loading and verifying go by its list, so a forged list must not leave one out.
    if (marker && count != (uint64_t)f->world + 1)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: section MANI: expected %llu files (%s and one per rank of world size "
                       "%u), found %u",
                       f->name, (unsigned long long)f->world + 1, CK_STATE_FILE, f->world, count);
    // Each entry takes at least 17 bytes, which bounds the count before it sizes anything.
    if (count > r.left / 17)
        return bad_section(f, s, "expected a file count that the section can hold");
    uint8_t  *seen = marker ? dt_alloc_zero((size_t)count / 8 + 1) : NULL;
    dt_status st   = marker && !seen ? DT_ERR_NOMEM : DT_OK;
    for (uint32_t i = 0; !st && i < count; i++) {
        char        nm[DT_CKPT_NAME_MAX + 1];
        const char *why = "";
        if (!rd_name(&r, nm, DT_CKPT_NAME_MAX, 1, &why)) {
            st = dt_fail(DT_ERR_FORMAT, "%s: section MANI: file %u: %s name", f->name, i,
                         r.bad ? "truncated" : "malformed");
            break;
        }
        uint64_t sz   = rd_u64(&r);
        uint32_t c    = rd_u32(&r);
        int64_t  slot = marker ? mani_slot(nm, f->world) : 0;
        if (r.bad)
            st = bad_section(f, s, "expected more bytes than the section holds (truncated entry)");
        else if (!plain_file_name(nm))
            st = dt_fail(DT_ERR_FORMAT, "%s: section MANI: expected plain file names, found \"%s\"",
                         f->name, nm);
        else if (marker && (slot < 0 || seen[slot / 8] & (1u << (slot % 8))))
            st = dt_fail(DT_ERR_FORMAT,
                         "%s: section MANI: file %u: expected %s or rank-<R>.dtck for a rank "
                         "below %u, each once, found \"%s\"%s",
                         f->name, i, CK_STATE_FILE, f->world, nm, slot < 0 ? "" : " again");
        if (st)
            break;
        if (marker)
            seen[slot / 8] |= (uint8_t)(1u << (slot % 8));
        if (name && !*found && strcmp(nm, name) == 0) {
            *size  = sz;
            *crc   = c;
            *found = true;
        }
    }
    dt_free(seen);
    return st ? st : expect_end(f, s, &r);
}

// ------------------------------------------------------------------- whole-file check

// The index of the first of n floats at p (unaligned) that is infinite or NaN, else n.
static uint64_t first_nonfinite(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if ((dt_get_le32(p + 4 * i) & 0x7f800000u) == 0x7f800000u)
            return i;
    return n;
}

// Weights, buffers and optimizer state are finite in every state a run can continue
// from: a NaN or an infinity there (a diverged run's, or a forged file's) would load
// and train to "loss nan". The message names the tensor (from the table tab, already
// checked) and the element.
static dt_status check_finite(const ck_file *f, const ck_sec *data, const ck_sec *tab,
                              const uint8_t *floats, uint64_t n) {
    uint64_t i = first_nonfinite(floats, n);
    if (i == n)
        return DT_OK;
    char     tn[8], dn[8], name[DT_CKPT_NAME_MAX + 1] = "?";
    uint64_t first = 0;
    rd       r     = tab ? rd_of(tab) : (rd){0};
    uint32_t count = tab ? rd_u32(&r) : 0;
    for (uint32_t k = 0; k < count && !r.bad; k++) { // the entry holding float i
        const char *why = "";
        char        nm[DT_CKPT_NAME_MAX + 1];
        if (!rd_name(&r, nm, DT_CKPT_NAME_MAX, 1, &why))
            break;
        uint32_t ndim = rd_u32(&r);
        for (uint32_t d = 0; d < ndim && d < 4; d++)
            rd_u64(&r);
        uint64_t off = rd_u64(&r), cnt = rd_u64(&r);
        rd_u32(&r);
        if (f->version >= 2)
            rd_u32(&r);
        if (!r.bad && i >= off && i - off < cnt) {
            snprintf(name, sizeof name, "%s", nm);
            first = off;
            break;
        }
    }
    float    v;
    uint32_t bits = dt_get_le32(floats + 4 * i);
    memcpy(&v, &bits, sizeof v);
    if (!tab)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: section %s: float %llu: expected a finite value, found %g", f->name,
                       tag_name(data->tag, dn), (unsigned long long)i, (double)v);
    return dt_fail(DT_ERR_FORMAT,
                   "%s: section %s: tensor \"%s\" (%s) element %llu: expected a finite value, "
                   "found %g",
                   f->name, tag_name(data->tag, dn), name, tag_name(tab->tag, tn),
                   (unsigned long long)(i - first), (double)v);
}

dt_status dt_ckpt_check_file(const ck_file *f) {
    const ck_sec *s;
    switch (f->kind) {
    case CK_KIND_STATE:
    case CK_KIND_MODEL: {
        const ck_sec *pt;
        ck_parm       parm;
        DT_TRY(dt_ckpt_need(f, CK_TAG_PARM, &s));
        DT_TRY(dt_ckpt_decode_parm(f, s, &parm));
        DT_TRY(dt_ckpt_need(f, CK_TAG_PTAB, &pt));
        DT_TRY(dt_ckpt_check_ptab(f, pt, parm.count, NULL, false));
        DT_TRY(check_finite(f, s, pt, parm.floats, parm.count));
        if (f->version >= 2) { // buffers: always present from version 2, maybe empty
            DT_TRY(dt_ckpt_need(f, CK_TAG_BUFS, &s));
            DT_TRY(dt_ckpt_decode_parm(f, s, &parm));
            DT_TRY(dt_ckpt_need(f, CK_TAG_BTAB, &pt));
            DT_TRY(dt_ckpt_check_ptab(f, pt, parm.count, NULL, true));
            DT_TRY(check_finite(f, s, pt, parm.floats, parm.count));
        }
        if (f->kind == CK_KIND_STATE)
            DT_TRY(dt_ckpt_need(f, CK_TAG_KVAL, &s));
        break;
    }
    case CK_KIND_RANK:
        DT_TRY(dt_ckpt_need(f, CK_TAG_RNGS, &s));
        break;
    case CK_KIND_MARKER:
        DT_TRY(dt_ckpt_need(f, CK_TAG_MANI, &s));
        break;
    }
    // Every known section, wherever it appears, must decode.
    for (uint32_t i = 0; i < f->nsec; i++) {
        s = &f->sec[i];
        if (s->tag == CK_TAG_OPTM) {
            ck_optm o;
            DT_TRY(dt_ckpt_decode_optm(f, s, &o));
            DT_TRY(check_finite(f, s, NULL, o.floats, o.nfloats));
        } else if (s->tag == CK_TAG_SMPL) {
            ck_smpl sm;
            DT_TRY(dt_ckpt_decode_smpl(f, s, &sm));
        } else if (s->tag == CK_TAG_RNGS) {
            DT_TRY(dt_ckpt_check_rngs(f, s, NULL, NULL, NULL));
        } else if (s->tag == CK_TAG_KVAL) {
            DT_TRY(dt_ckpt_decode_kval(f, s, NULL, NULL));
        } else if (s->tag == CK_TAG_MANI) {
            DT_TRY(dt_ckpt_check_mani(f, s, NULL, NULL, NULL, NULL));
        } else if (s->tag == CK_TAG_PARM && f->kind != CK_KIND_STATE && f->kind != CK_KIND_MODEL) {
            ck_parm parm;
            DT_TRY(dt_ckpt_decode_parm(f, s, &parm));
        }
    }
    return DT_OK;
}

dt_status dt_ckpt_verify_bytes(const void *buf, size_t n, const char *name) {
    ck_file f;
    DT_TRY(dt_ckpt_parse(buf, n, name ? name : "checkpoint", &f));
    return dt_ckpt_check_file(&f);
}
