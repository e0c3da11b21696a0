// test_content_hash.c: the hashes the readers take of what they read (dt_idx.hash,
// dt_npy.hash, dt_tokens.hash, dt_dataset.content_hash), which ranks compare to know
// they train on the same data. The value depends on the bytes kept only: plain or gzip,
// the streaming reader or the one-call inflation, a file or memory, one file or the
// same bytes over several, read in any pieces. One changed byte changes it; bytes
// beyond a limit (not kept) do not.
#include "../check.h"
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char tmpdir[64];

static const char *tmp(const char *name) {
    static char buf[4][256];
    static int  k;
    char       *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n);
    if (f)
        fclose(f);
}

static uint8_t *bytes(size_t n, uint32_t seed) {
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
    return b;
}

// gzip-compresses n bytes with zlib (one member).
static uint8_t *gzip_bytes(const uint8_t *p, size_t n, size_t *out_n) {
    z_stream z = {0};
    CHECK(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t   cap = deflateBound(&z, (uLong)n) + 64;
    uint8_t *out = malloc(cap);
    z.next_in    = (Bytef *)(uintptr_t)p;
    z.avail_in   = (uInt)n;
    z.next_out   = out;
    z.avail_out  = (uInt)cap;
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

static uint64_t idx_hash(const char *path, size_t limit) {
    dt_idx x = {0};
    CHECK_OK(dt_idx_read_first(path, limit, &x));
    uint64_t h = x.hash;
    dt_idx_free(&x);
    return h;
}

static void test_idx(void) {
    // 3000 records of 28x28 (2.2 MiB: several of the reader's 1 MiB pieces).
    uint32_t dims[3] = {3000, 28, 28};
    size_t   n       = 3000 * 28 * 28;
    uint8_t *d       = bytes(n, 7);
    CHECK_OK(dt_idx_write(tmp("a"), d, 3, dims, false));
    CHECK_OK(dt_idx_write(tmp("a.gz"), d, 3, dims, true));
    uint64_t plain = idx_hash(tmp("a"), 0);
    CHECK(plain != 0);
    CHECK(idx_hash(tmp("a.gz"), 0) == plain); // libdeflate's one call
    // Two gzip members (the header and 1.5 MiB of records, then the rest) are not the
    // one-call path's: zlib's streaming reader, the same hash; from memory too.
    size_t   half     = 16 + 1536 * 1024, an, bn;
    uint8_t *whole    = malloc(16 + n);
    uint8_t  head[16] = {0, 0, 8, 3, 0, 0, 0x0b, 0xb8, 0, 0, 0, 28, 0, 0, 0, 28};
    memcpy(whole, head, 16);
    memcpy(whole + 16, d, n);
    uint8_t *za = gzip_bytes(whole, half, &an), *zb = gzip_bytes(whole + half, 16 + n - half, &bn);
    uint8_t *two = malloc(an + bn);
    memcpy(two, za, an);
    memcpy(two + an, zb, bn);
    write_file(tmp("two.gz"), two, an + bn);
    CHECK(idx_hash(tmp("two.gz"), 0) == plain);
    dt_idx m = {0};
    CHECK_OK(dt_idx_parse(two, an + bn, "two.gz", &m));
    CHECK(m.hash == plain);
    dt_idx_free(&m);
    free(whole), free(za), free(zb), free(two);
    // Under a limit: the records kept, whatever follows them.
    uint64_t first = idx_hash(tmp("a"), 100);
    CHECK(first != plain);
    CHECK(idx_hash(tmp("a.gz"), 100) == first);
    d[n - 1] ^= 1; // after the records kept
    CHECK_OK(dt_idx_write(tmp("b"), d, 3, dims, false));
    CHECK(idx_hash(tmp("b"), 100) == first);
    CHECK(idx_hash(tmp("b"), 0) != plain);
    d[n - 1] ^= 1;
    d[5] ^= 0x80; // one bit in the first record
    CHECK_OK(dt_idx_write(tmp("c.gz"), d, 3, dims, true));
    CHECK(idx_hash(tmp("c.gz"), 100) != first);
    free(d);
}

// A v1.0 .npy header for shape (n,) of dtype <f4.
static size_t npy_file(uint8_t *out, const float *x, size_t n) {
    char dict[128];
    int  dl = snprintf(dict, sizeof dict,
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu,), }", n);
    int  hl = (int)((10 + dl + 1 + 63) / 64 * 64 - 10);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)hl, out[9] = (uint8_t)(hl >> 8);
    memcpy(out + 10, dict, (size_t)dl);
    memset(out + 10 + dl, ' ', (size_t)(hl - dl - 1));
    out[10 + hl - 1] = '\n';
    memcpy(out + 10 + hl, x, n * 4);
    return 10 + (size_t)hl + n * 4;
}

static void test_npy(void) {
    size_t   n = 700000; // 2.8 MiB of data
    float   *x = malloc(n * 4);
    uint8_t *f = malloc(n * 4 + 256);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i * 0.5f;
    size_t len = npy_file(f, x, n);
    write_file(tmp("x.npy"), f, len);
    dt_npy r = {0}, p = {0};
    CHECK_OK(dt_npy_read(tmp("x.npy"), &r));
    CHECK_OK(dt_npy_parse(f, len, "x", &p));
    CHECK(r.hash != 0 && r.hash == p.hash);
    uint64_t before = r.hash;
    dt_npy_free(&r);
    dt_npy_free(&p);
    x[n / 2] += 1.0f; // the same size, one value apart
    write_file(tmp("y.npy"), f, npy_file(f, x, n));
    CHECK_OK(dt_npy_read(tmp("y.npy"), &r));
    CHECK(r.hash != before);
    dt_npy_free(&r);
    // A dataset of the first file, and of the changed one: their content hashes differ;
    // the same file twice: equal.
    dt_dataset a = {0}, b = {0}, c = {0};
    CHECK_OK(dt_dataset_load_npy(&a, tmp("x.npy"), NULL, NULL));
    CHECK_OK(dt_dataset_load_npy(&b, tmp("y.npy"), NULL, NULL));
    CHECK_OK(dt_dataset_load_npy(&c, tmp("x.npy"), NULL, NULL));
    CHECK(a.content_hash != 0 && a.content_hash != b.content_hash);
    CHECK(a.content_hash == c.content_hash);
    // Targets are part of it.
    dt_dataset_free(&c);
    CHECK_OK(dt_dataset_load_npy(&c, tmp("x.npy"), tmp("x.npy"), NULL));
    CHECK(c.content_hash != a.content_hash);
    dt_dataset_free(&a);
    dt_dataset_free(&b);
    dt_dataset_free(&c);
    // From memory: no files, no hash.
    uint8_t img[4] = {1, 2, 3, 4}, lab[1] = {1};
    CHECK_OK(dt_dataset_init(&a, img, lab, 1, 2, 2, NULL));
    CHECK(a.content_hash == 0);
    dt_dataset_free(&a);
    free(x);
    free(f);
}

static void test_tokens(void) {
    size_t   n = 3 << 20;
    uint8_t *b = bytes(n, 11);
    write_file(tmp("all"), b, n);
    mkdir(tmp("parts"), 0755);
    write_file(tmp("parts/a"), b, 1000001); // split at an odd place
    write_file(tmp("parts/b"), b + 1000001, n - 1000001);
    dt_tokens t = {0}, c = {0}, d = {0};
    CHECK_OK(dt_tokens_read(tmp("all"), 1, &t));
    CHECK_OK(dt_corpus_read(tmp("all"), 0, &c, NULL));
    CHECK_OK(dt_corpus_read(tmp("parts"), 0, &d, NULL));
    CHECK(t.hash != 0 && t.hash == c.hash && c.hash == d.hash);
    uint64_t whole = t.hash;
    dt_tokens_free(&c);
    CHECK_OK(dt_corpus_read(tmp("parts"), 5000, &c, NULL)); // --limit: the bytes kept
    CHECK(c.hash != whole);
    dt_tokens v;
    CHECK_OK(dt_tokens_slice(&t, 0, 10, &v));
    CHECK(v.hash == 0); // a view
    dt_tokens_free(&t);
    dt_tokens_free(&c);
    dt_tokens_free(&d);
    b[n - 2] ^= 4;
    write_file(tmp("all"), b, n);
    CHECK_OK(dt_tokens_read(tmp("all"), 1, &t));
    CHECK(t.hash != whole);
    dt_tokens_free(&t);
    // What it costs: reading and hashing 3 MiB from the page cache.
    double t0 = dt_now();
    for (int i = 0; i < 10; i++) {
        CHECK_OK(dt_tokens_read(tmp("all"), 1, &t));
        dt_tokens_free(&t);
    }
    printf("     dt_tokens_read with its hash: %.2f GB/s from the page cache\n",
           10.0 * (double)n / (dt_now() - t0) / 1e9);
    free(b);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dtrain-content-hash-XXXXXX");
    if (!CHECK(mkdtemp(tmpdir)))
        return check_summary();
    RUN(test_idx);
    RUN(test_npy);
    RUN(test_tokens);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (check_failed == 0 && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_summary();
}
