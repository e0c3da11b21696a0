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
