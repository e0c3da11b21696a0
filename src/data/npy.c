// npy.c: a strict reader of numpy's .npy files (format versions 1.0, 2.0 and 3.0).
//
// Layout: the magic "\x93NUMPY", a major and a minor version byte, the header length
// (little-endian u16 for 1.0, u32 for 2.0 and 3.0), then the header: a Python dict
// literal with exactly the keys 'descr', 'fortran_order' and 'shape', padded with spaces
// and ended by a newline; the data follows, C or Fortran order, nothing after it.
//
// Nothing in the header is trusted: the header length is bounded, the dict is parsed by
// a small grammar (no evaluation), every dimension and product is overflow-checked and
// the data size must equal what the file holds, before any allocation of data size.
#include "data_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NPY_MAGIC_LEN 6
static const uint8_t npy_magic[NPY_MAGIC_LEN] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads little-endian data in place: port the conversions for this host"
#endif

static const struct {
    char         kind; // numpy's kind letter: u, i, f
    int          size;
    dt_npy_dtype dtype;
    const char  *name;
} npy_types[] = {
    {'u', 1, DT_NPY_U8, "|u1"},  {'u', 2, DT_NPY_U16, "<u2"}, {'i', 4, DT_NPY_I32, "<i4"},
    {'i', 8, DT_NPY_I64, "<i8"}, {'f', 4, DT_NPY_F32, "<f4"}, {'f', 8, DT_NPY_F64, "<f8"},
};
#define NPY_NTYPES (sizeof npy_types / sizeof npy_types[0])

const char *dt_npy_dtype_name(dt_npy_dtype t) {
    for (size_t i = 0; i < NPY_NTYPES; i++)
        if (npy_types[i].dtype == t)
            return npy_types[i].name;
    return "unknown";
}

size_t dt_npy_dtype_size(dt_npy_dtype t) {
    for (size_t i = 0; i < NPY_NTYPES; i++)
        if (npy_types[i].dtype == t)
            return (size_t)npy_types[i].size;
    return 0;
}

// ----------------------------------------------------------------- header grammar

typedef struct hp {
    const char *s, *end, *name;
} hp;

static void skip_ws(hp *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static bool eat(hp *p, char c) {
    skip_ws(p);
    if (p->s < p->end && *p->s == c) {
        p->s++;
        return true;
    }
    return false;
}

// Shows the header near the parse position, printable bytes only.
static const char *near(const hp *p, char *buf, size_t n) {
    size_t k = 0;
    for (const char *c = p->s; c < p->end && k + 1 < n && k < 24; c++)
        buf[k++] = (*c >= 32 && *c < 127) ? *c : '?';
    buf[k] = 0;
    return k ? buf : "the end of the header";
}

static dt_status bad(const hp *p, const char *expected) {
    char buf[32];
    return dt_fail(DT_ERR_FORMAT, "%s: npy header: expected %s, found \"%s\"", p->name, expected,
                   near(p, buf, sizeof buf));
}

// A Python string literal in single or double quotes, no escapes (numpy writes none
// for the keys and simple descrs).
static dt_status str_lit(hp *p, char *out, size_t n, const char *what) {
    skip_ws(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"'))
        return bad(p, what);
    char        q = *p->s;
    const char *b = p->s + 1, *e = b;
    while (e < p->end && *e != q && *e != '\\' && *e != '\n')
        e++;
    if (e >= p->end || *e != q)
        return bad(p, "a closed string literal without escapes");
    if ((size_t)(e - b) >= n)
        return dt_fail(DT_ERR_FORMAT, "%s: npy header: %s is longer than %zu characters", p->name,
                       what, n - 1);
    memcpy(out, b, (size_t)(e - b));
    out[e - b] = 0;
    p->s       = e + 1;
    return DT_OK;
}

static bool word(hp *p, const char *w) {
    skip_ws(p);
    size_t n = strlen(w);
    if ((size_t)(p->end - p->s) >= n && memcmp(p->s, w, n) == 0) {
        p->s += n;
        return true;
    }
    return false;
}

// A non-negative decimal integer (Python 2 files may end it with L).
static dt_status dim_lit(hp *p, uint64_t *out) {
    skip_ws(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        return bad(p, "a non-negative integer dimension");
    uint64_t v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        if (v > (UINT64_MAX - 9) / 10)
            return dt_fail(DT_ERR_FORMAT, "%s: npy header: a dimension overflows 64 bits", p->name);
        v = v * 10 + (uint64_t)(*p->s++ - '0');
    }
    if (p->s < p->end && *p->s == 'L')
        p->s++;
    *out = v;
    return DT_OK;
}

static dt_status parse_descr(hp *p, dt_npy *out) {
    skip_ws(p);
    if (p->s < p->end && *p->s == '[')
        return dt_fail(DT_ERR_FORMAT,
                       "%s: npy: expected a plain dtype (one of |u1 <u2 <i4 <i8 <f4 <f8), found "
                       "a structured dtype (a list of fields)",
                       p->name);
    char d[32];
    DT_TRY(str_lit(p, d, sizeof d, "the 'descr' string"));
    char order = d[0], kind = d[1];
    int  size = 0;
    bool ok   = strchr("<>|=", order) && order && kind && d[2] >= '1' && d[2] <= '9' && !d[3];
    if (ok)
        size = d[2] - '0';
    const char *supported = "one of |u1 <u2 <i4 <i8 <f4 <f8";
    for (size_t i = 0; ok && i < NPY_NTYPES; i++) {
        if (npy_types[i].kind != kind || npy_types[i].size != size)
            continue;
        if (size == 1 || order == '<' || order == '=') {
            out->dtype     = npy_types[i].dtype;
            out->elem_size = (size_t)size;
            return DT_OK;
        }
        if (order == '>')
            return dt_fail(DT_ERR_FORMAT,
                           "%s: npy: expected little-endian data ('<%c%d'), found big-endian "
                           "'%s' (convert with a.astype('<%c%d'))",
                           p->name, kind, size, d, kind, size);
        break; // '|' on a multi-byte type
    }
    return dt_fail(DT_ERR_FORMAT, "%s: npy: expected dtype %s, found descr '%s'", p->name,
                   supported, d);
}

static dt_status parse_shape(hp *p, uint64_t *dims, int *ndim) {
    if (!eat(p, '('))
        return bad(p, "'(' opening the shape tuple");
    *ndim = 0;
    if (eat(p, ')'))
        return DT_OK; // a scalar
    for (;;) {
        uint64_t v = 0;
        DT_TRY(dim_lit(p, &v));
        if (*ndim == DT_NPY_MAX_DIMS)
            return dt_fail(DT_ERR_FORMAT, "%s: npy: expected at most %d dimensions, found more",
                           p->name, DT_NPY_MAX_DIMS);
        dims[(*ndim)++] = v;
        bool comma      = eat(p, ',');
        if (eat(p, ')')) {
            if (*ndim == 1 && !comma)
                return dt_fail(DT_ERR_FORMAT,
                               "%s: npy header: expected a tuple '(n,)' for a 1-d shape, found "
                               "'(n)'",
                               p->name);
            return DT_OK;
        }
        if (!comma)
            return bad(p, "',' or ')' in the shape tuple");
    }
}

// Parses the dict literal into out (dtype, elem_size, fortran, ndim, shape).
static dt_status parse_dict(hp *p, dt_npy *out, bool *fortran) {
    bool     have_descr = false, have_fortran = false, have_shape = false;
    uint64_t dims[DT_NPY_MAX_DIMS] = {0};
    if (!eat(p, '{'))
        return bad(p, "'{' opening the header dict");
    for (;;) {
        if (eat(p, '}'))
            break;
        char key[32];
        DT_TRY(str_lit(p, key, sizeof key, "a quoted key"));
        if (!eat(p, ':'))
            return bad(p, "':' after a key");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            DT_TRY(parse_descr(p, out));
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
            if (word(p, "True"))
                *fortran = true;
            else if (word(p, "False"))
                *fortran = false;
            else
                return bad(p, "True or False for 'fortran_order'");
            have_fortran = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            DT_TRY(parse_shape(p, dims, &out->ndim));
            have_shape = true;
        } else {
            return dt_fail(DT_ERR_FORMAT,
                           "%s: npy header: expected the keys 'descr', 'fortran_order' and "
                           "'shape' once each, found '%s'%s",
                           p->name, key,
                           strcmp(key, "descr") && strcmp(key, "fortran_order") &&
                                   strcmp(key, "shape")
                               ? ""
                               : " twice");
        }
        if (eat(p, '}'))
            break;
        if (!eat(p, ','))
            return bad(p, "',' or '}' in the header dict");
    }
    if (!have_descr || !have_fortran || !have_shape)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: npy header: expected the keys 'descr', "
                       "'fortran_order' and 'shape', found no '%s'",
                       p->name,
                       !have_descr     ? "descr"
                       : !have_fortran ? "fortran_order"
                                       : "shape");
    skip_ws(p);
    if (p->s != p->end)
        return bad(p, "only spaces and a newline after the header dict");
    // Element count, overflow-checked; bytes too.
    size_t count = 1;
    for (int i = 0; i < out->ndim; i++) {
        if (dims[i] > SIZE_MAX || !dt_size_mul(&count, count, (size_t)dims[i]))
            return dt_fail(DT_ERR_FORMAT, "%s: npy: the shape's element count overflows size_t",
                           p->name);
        out->shape[i] = (size_t)dims[i];
    }
    if (!dt_size_mul(&out->nbytes, count, out->elem_size))
        return dt_fail(DT_ERR_FORMAT, "%s: npy: the shape's byte count overflows size_t", p->name);
    out->count = count;
    return DT_OK;
}

static void shape_str(const dt_npy *a, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < a->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%zu%s", a->shape[i],
                              a->ndim == 1      ? ","
                              : i + 1 < a->ndim ? ", "
                                                : "");
    if (k < n)
        snprintf(buf + k, n - k, ")");
}

// Parses the preamble and header at buf (n bytes available, file of `total` bytes):
// fills out's description and *offset (where the data starts).
static dt_status parse_header(const uint8_t *buf, size_t n, uint64_t total, const char *name,
                              dt_npy *out, bool *fortran, size_t *offset) {
    if (n < 8 || memcmp(buf, npy_magic, NPY_MAGIC_LEN) != 0)
        return dt_fail(DT_ERR_FORMAT, "%s: expected the npy magic \\x93NUMPY, found %s", name,
                       n < 8 ? "a file shorter than the 8-byte preamble" : "other bytes");
    int major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected npy format version 1.0, 2.0 or 3.0, found %d.%d", name, major,
                       minor);
    size_t lenlen = major == 1 ? 2 : 4, pre = 6 + 2 + lenlen;
    if (n < pre)
        return dt_fail(DT_ERR_FORMAT, "%s: expected a %zu-byte npy preamble, found %zu bytes", name,
                       pre, n);
    uint64_t hlen = buf[8] | (uint64_t)buf[9] << 8;
    if (lenlen == 4)
        hlen |= (uint64_t)buf[10] << 16 | (uint64_t)buf[11] << 24;
    if (hlen > DT_NPY_MAX_HEADER)
        return dt_fail(DT_ERR_FORMAT, "%s: expected an npy header of at most %d bytes, found %llu",
                       name, DT_NPY_MAX_HEADER, (unsigned long long)hlen);
    if (pre + hlen > n)
        return dt_fail(DT_ERR_FORMAT, "%s: truncated npy header: expected %llu bytes, found %llu",
                       name, (unsigned long long)hlen, (unsigned long long)(total - pre));
    const char *h = (const char *)buf + pre;
    for (size_t i = 0; i < hlen; i++) {
        // 1.0 and 2.0 headers are latin-1; 3.0 is utf-8. The dict we accept is ASCII.
        if ((uint8_t)h[i] >= 127 ||
            ((uint8_t)h[i] < 32 && h[i] != '\n' && h[i] != '\t' && h[i] != '\r'))
            return dt_fail(DT_ERR_FORMAT,
                           "%s: npy header: expected printable ASCII, found byte 0x%02x at "
                           "offset %zu",
                           name, (uint8_t)h[i], pre + i);
    }
    hp p = {h, h + hlen, name};
    DT_TRY(parse_dict(&p, out, fortran));
    *offset       = pre + (size_t)hlen;
    uint64_t have = total - *offset;
    if (have != out->nbytes) {
        char shp[32 * DT_NPY_MAX_DIMS];
        shape_str(out, shp, sizeof shp);
        return dt_fail(DT_ERR_FORMAT,
                       "%s: %s npy data: expected %zu bytes for shape %s of %s, found %llu", name,
                       have < out->nbytes ? "truncated" : "extra bytes after the", out->nbytes, shp,
                       dt_npy_dtype_name(out->dtype), (unsigned long long)have);
    }
    return DT_OK;
}

// Rewrites Fortran-order (column-major) data as C order, same shape.
static dt_status to_c_order(dt_npy *a) {
    if (a->ndim < 2 || a->count == 0)
        return DT_OK;
    uint8_t *c = dt_alloc(a->nbytes);
    if (!c)
        return DT_ERR_NOMEM;
    size_t es = a->elem_size, idx[DT_NPY_MAX_DIMS] = {0}, fstride[DT_NPY_MAX_DIMS];
    fstride[0] = 1;
    for (int d = 1; d < a->ndim; d++)
        fstride[d] = fstride[d - 1] * a->shape[d - 1];
    const uint8_t *f = a->data;
    for (size_t k = 0; k < a->count; k++) { // k walks C order; idx is its multi-index
        size_t src = 0;
        for (int d = 0; d < a->ndim; d++)
            src += idx[d] * fstride[d];
        memcpy(c + k * es, f + src * es, es);
        for (int d = a->ndim - 1; d >= 0; d--) {
            if (++idx[d] < a->shape[d])
                break;
            idx[d] = 0;
        }
    }
    dt_free(a->data);
    a->data = c;
    return DT_OK;
}

dt_status dt_npy_parse(const void *buf, size_t nbytes, const char *name, dt_npy *out) {
    memset(out, 0, sizeof *out);
    name           = name ? name : "npy";
    bool      fort = false;
    size_t    off  = 0;
    dt_status st   = parse_header(buf, nbytes, nbytes, name, out, &fort, &off);
    if (st == DT_OK) {
        out->data = dt_alloc(out->nbytes);
        if (!out->data)
            st = DT_ERR_NOMEM;
        else
            memcpy(out->data, (const uint8_t *)buf + off, out->nbytes);
    }
    if (st == DT_OK)
        out->hash = dt_data_hash_bytes(out->data, out->nbytes); // the stored order
    if (st == DT_OK && fort)
        st = to_c_order(out);
    if (st)
        dt_npy_free(out);
    return st;
}

dt_status dt_npy_read(const char *path, dt_npy *out) {
    memset(out, 0, sizeof *out);
    FILE    *f;
    uint64_t fsize;
    DT_TRY(dt_open_regular(path, &f, &fsize));
    dt_status st   = DT_OK;
    uint8_t  *head = NULL;
    size_t    want = 12 + DT_NPY_MAX_HEADER;
    if (fsize < want)
        want = (size_t)fsize;
    head = dt_alloc(want);
    if (!head) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    size_t got = fread(head, 1, want, f);
    if (got < want) {
        st = ferror(f) ? dt_fail_errno(DT_ERR_IO, "%s: read failed", path)
                       : dt_fail(DT_ERR_IO, "%s: the file shrank while read", path);
        goto done;
    }
    bool   fort = false;
    size_t off  = 0;
    st          = parse_header(head, got, fsize, path, out, &fort, &off);
    if (st)
        goto done;
    out->data = dt_alloc(out->nbytes); // == the file's remaining bytes, checked above
    if (!out->data) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    size_t       first = got - off < out->nbytes ? got - off : out->nbytes;
    dt_data_hash h;
    dt_data_hash_init(&h);
    memcpy(out->data, head + off, first);
    dt_data_hash_add(&h, out->data, first);
    if (first < out->nbytes) {
        size_t r = dt_data_read_hashed((uint8_t *)out->data + first, out->nbytes - first, f, &h);
        if (r != out->nbytes - first) {
            st = ferror(f) ? dt_fail_errno(DT_ERR_IO, "%s: read failed", path)
                           : dt_fail(DT_ERR_FORMAT,
                                     "%s: truncated npy data: expected %zu bytes, found %zu", path,
                                     out->nbytes, first + r);
            goto done;
        }
    }
    out->hash = dt_data_hash_end(&h); // of the stored order, before any transposition
    if (fort)
        st = to_c_order(out);
done:
    dt_free(head);
    fclose(f);
    if (st)
        dt_npy_free(out);
    return st;
}

void dt_npy_free(dt_npy *a) {
    if (!a)
        return;
    dt_free(a->data);
    memset(a, 0, sizeof *a);
}

// ------------------------------------------------------------------- conversion

static double get_f(const dt_npy *a, size_t i) {
    const uint8_t *p = (const uint8_t *)a->data + i * a->elem_size;
    switch (a->dtype) {
    case DT_NPY_U8:
        return *p;
    case DT_NPY_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case DT_NPY_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case DT_NPY_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case DT_NPY_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case DT_NPY_F64: {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    }
    return 0;
}

static bool is_int(dt_npy_dtype t) {
    return t == DT_NPY_U8 || t == DT_NPY_U16 || t == DT_NPY_I32 || t == DT_NPY_I64;
}

dt_status dt_npy_convert(dt_npy *a, dt_npy_dtype to, const char *name) {
    name = name ? name : "npy";
    if (a->dtype == to)
        return DT_OK;
    size_t es = dt_npy_dtype_size(to), nbytes;
    if (!es)
        return dt_fail(DT_ERR_ARG, "%s: expected a target dtype of dt_npy_dtype, found %d", name,
                       (int)to);
    if (is_int(to) && !is_int(a->dtype))
        return dt_fail(DT_ERR_FORMAT, "%s: expected integer data for %s, found %s", name,
                       dt_npy_dtype_name(to), dt_npy_dtype_name(a->dtype));
    if (!dt_size_mul(&nbytes, a->count, es))
        return dt_fail(DT_ERR_ARG, "%s: %zu elements of %zu bytes overflow size_t", name, a->count,
                       es);
    double lo = 0, hi = 0;
    switch (to) {
    case DT_NPY_U8:
        hi = 255;
        break;
    case DT_NPY_U16:
        hi = 65535;
        break;
    case DT_NPY_I32:
        lo = INT32_MIN, hi = INT32_MAX;
        break;
    default:
        lo = -INFINITY, hi = INFINITY;
    }
    uint8_t *out = dt_alloc(nbytes);
    if (!out)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < a->count; i++) {
        uint8_t *d = out + i * es;
        double   v = get_f(a, i);
        if (is_int(to) && (v < lo || v > hi)) {
            dt_free(out);
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected values in [%.0f, %.0f] for %s, found %.0f "
                           "at element %zu",
                           name, lo, hi, dt_npy_dtype_name(to), v, i);
        }
        switch (to) {
        case DT_NPY_U8:
            *d = (uint8_t)v;
            break;
        case DT_NPY_U16: {
            uint16_t w = (uint16_t)v;
            memcpy(d, &w, 2);
            break;
        }
        case DT_NPY_I32: {
            int32_t w = (int32_t)v;
            memcpy(d, &w, 4);
            break;
        }
        case DT_NPY_I64: {
            int64_t w = (int64_t)v; // from a narrower integer: exact
            memcpy(d, &w, 8);
            break;
        }
        case DT_NPY_F32: {
            float w = (float)v;
            memcpy(d, &w, 4);
            break;
        }
        case DT_NPY_F64:
            memcpy(d, &v, 8);
            break;
        }
    }
    dt_free(a->data);
    a->data      = out;
    a->dtype     = to;
    a->elem_size = es;
    a->nbytes    = nbytes;
    return DT_OK;
}
