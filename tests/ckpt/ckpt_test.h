// ckpt_test.h: helpers shared by the checkpoint tests (static functions, header only):
// temporary directories, whole-file reads and writes, a small model, and a reading of
// the file layout written here from docs/checkpoint-format.md (not from the library),
// so corruption tests can aim at a given header field or section.
#ifndef DTRAIN_TESTS_CKPT_TEST_H
#define DTRAIN_TESTS_CKPT_TEST_H

#include "../check.h"
#include "dtrain/ckpt.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int ct_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

static inline void ct_rm_tree(const char *dir) {
    nftw(dir, ct_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

// A fresh directory under /tmp named after the test (caller frees with ct_rm_tree).
static inline void ct_tmpdir(char *out, size_t n, const char *tag) {
    snprintf(out, n, "/tmp/dtrain-%s-XXXXXX", tag);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        abort();
    }
}

// Whole file into a malloc'd buffer; NULL if missing.
static inline unsigned char *ct_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    *n               = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

static inline void ct_write(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        abort();
    }
    fwrite(p, 1, n, f);
    fclose(f);
}

static inline bool ct_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

// Little-endian fields, as the format document defines them.
static inline uint32_t ct_get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ct_get64(const unsigned char *p) {
    return (uint64_t)ct_get32(p) | (uint64_t)ct_get32(p + 4) << 32;
}
static inline void ct_put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

// The sections of a file image: header of 64 bytes (section count at 20), then per
// section a 24-byte header (tag at 0, length at 8) and its payload.
typedef struct ct_section {
    char   tag[5];
    size_t header_at, payload_at, len;
} ct_section;

static inline int ct_sections(const unsigned char *p, size_t n, ct_section *out, int max) {
    int    k   = (int)ct_get32(p + 20);
    size_t off = 64;
    for (int i = 0; i < k && i < max && off + 24 <= n; i++) {
        memcpy(out[i].tag, p + off, 4);
        out[i].tag[4]     = '\0';
        out[i].header_at  = off;
        out[i].len        = (size_t)ct_get64(p + off + 8);
        out[i].payload_at = off + 24;
        off += 24 + out[i].len;
    }
    return k;
}

static inline void ct_put64(unsigned char *p, uint64_t v) {
    ct_put32(p, (uint32_t)v);
    ct_put32(p + 4, (uint32_t)(v >> 32));
}

// The section of a file image with `tag`, or NULL.
static inline const ct_section *ct_find(const ct_section *s, int k, const char *tag) {
    for (int i = 0; i < k; i++)
        if (strcmp(s[i].tag, tag) == 0)
            return &s[i];
    return NULL;
}

// Every CRC of a file image recomputed as a writer computes them (each section's, the
// section table's, the header's), after bytes were patched in place: a forged file
// that checks out.
static inline void ct_reseal(unsigned char *p, size_t n) {
    ct_section s[64];
    int        k    = ct_sections(p, n, s, 64);
    uint32_t   tcrc = 0;
    for (int i = 0; i < k && i < 64; i++) {
        unsigned char *h = p + s[i].header_at;
        ct_put32(h + 16, dt_crc32c(dt_crc32c(0, h, 16), p + s[i].payload_at, s[i].len));
        tcrc = dt_crc32c(tcrc, h, 24);
    }
    ct_put32(p + 48, tcrc);
    ct_put32(p + 60, dt_crc32c(0, p, 60));
}

// Section `tag` of the image *p (*n bytes, malloc'd) given the payload q (m bytes): the
// lengths, the file size and every CRC follow.
static inline void ct_set_section(unsigned char **p, size_t *n, const char *tag, const void *q,
                                  size_t m) {
    ct_section        s[64];
    int               k  = ct_sections(*p, *n, s, 64);
    const ct_section *at = ct_find(s, k, tag);
    if (!at)
        abort();
    size_t         n2 = *n - at->len + m;
    unsigned char *b  = malloc(n2);
    memcpy(b, *p, at->payload_at);
    memcpy(b + at->payload_at, q, m);
    memcpy(b + at->payload_at + m, *p + at->payload_at + at->len, *n - at->payload_at - at->len);
    ct_put64(b + at->header_at + 8, m);
    ct_put64(b + 40, n2);
    ct_reseal(b, n2);
    free(*p);
    *p = b, *n = n2;
}

// After file `name` of checkpoint cdir was rewritten: its size and header CRC put into
// the marker's manifest, and the marker resealed, so that only the forged field is off.
static inline void ct_fix_marker(const char *cdir, const char *name) {
    char path[1024], mpath[1024];
    snprintf(path, sizeof path, "%s/%s", cdir, name);
    snprintf(mpath, sizeof mpath, "%s/complete.dtck", cdir);
    size_t            n, mn;
    unsigned char    *f = ct_read(path, &n), *m = ct_read(mpath, &mn);
    ct_section        s[4];
    int               k  = ct_sections(m, mn, s, 4);
    const ct_section *ms = ct_find(s, k, "MANI");
    if (!f || !m || !ms)
        abort();
    unsigned char *q = m + ms->payload_at + 4;
    for (uint32_t i = 0; i < ct_get32(m + ms->payload_at); i++) {
        uint32_t len = ct_get32(q);
        if (len == strlen(name) && memcmp(q + 4, name, len) == 0) {
            ct_put64(q + 4 + len, n);
            ct_put32(q + 12 + len, ct_get32(f + 60));
        }
        q += 16 + len;
    }
    ct_reseal(m, mn);
    ct_write(mpath, m, mn);
    free(f);
    free(m);
}

// A small model: conv(1->3, 3x3) ReLU flatten linear(hidden) ReLU linear(4).
static inline dt_model *ct_model(uint64_t seed, int hidden) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 6, 6);
    if (!m || dt_model_add_conv2d(m, 3, 3, 1, 0) || dt_model_add_relu(m) ||
        dt_model_add_flatten(m) || dt_model_add_linear(m, hidden) || dt_model_add_relu(m) ||
        dt_model_add_linear(m, 4) || dt_model_add_log_softmax(m) || dt_model_finalize(m, seed)) {
        fprintf(stderr, "ct_model: %s\n", dt_last_error());
        abort();
    }
    return m;
}

static inline void ct_fill(float *x, size_t n, uint64_t seed) {
    dt_rng r = dt_rng_init(seed);
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_uniform_range(&r, -1.0f, 1.0f);
}

#endif // DTRAIN_TESTS_CKPT_TEST_H
