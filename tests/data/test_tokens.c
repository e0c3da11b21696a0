// test_tokens.c: MT19937 against its reference outputs and torch 1.13's randint draws
// (tests/data/fixtures/torch_randint.txt), token streams (uint8, uint16, llm.c's
// header), their windows and batches (world-size invariant), and the fortunes-style
// corpus reader. Run from the repository root (as `make test` does).
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

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

static void test_mt19937_reference(void) {
    // The reference implementation's outputs for init_genrand(5489) (the C++ standard's
    // default_seed): the first, and the 10000th (std::mt19937's required value).
    dt_mt19937 g;
    CHECK_OK(dt_mt19937_init(&g, 5489));
    CHECK_EQ(dt_mt19937_u32(&g), 3499211612u);
    for (int i = 2; i < 10000; i++)
        dt_mt19937_u32(&g);
    CHECK_EQ(dt_mt19937_u32(&g), 4123659995u);
    // Seeds are taken mod 2^32, as torch's manual_seed does.
    dt_mt19937 a, b;
    dt_mt19937_init(&a, 7);
    dt_mt19937_init(&b, (1ull << 32) + 7);
    CHECK_EQ(dt_mt19937_u32(&a), dt_mt19937_u32(&b));
    CHECK_ERR(dt_mt19937_randint(&a, 0, 1, (uint64_t[1]){0}), DT_ERR_ARG, "n >= 1");
}

static void test_torch_randint(void) {
    FILE *f = fopen("tests/data/fixtures/torch_randint.txt", "r");
    if (!CHECK(f != NULL)) {
        fprintf(stderr, "     run from the repository root\n");
        return;
    }
    unsigned long long seed, n;
    size_t             count, cases = 0, bad = 0, draws = 0, big = 0;
    uint64_t           got[1024];
    while (fscanf(f, "%llu %llu %zu:", &seed, &n, &count) == 3 && count <= 1024) {
        dt_mt19937 g;
        dt_mt19937_init(&g, seed);
        CHECK_OK(dt_mt19937_randint(&g, n, count, got));
        for (size_t i = 0; i < count; i++) {
            unsigned long long want;
            if (fscanf(f, "%llu", &want) != 1) {
                bad++;
                break;
            }
            if (got[i] != want && bad++ < 5)
                fprintf(stderr, "     seed %llu n %llu draw %zu: found %llu, torch %llu\n", seed, n,
                        i, (unsigned long long)got[i], want);
            draws++;
        }
        big += n >= (1ull << 32);
        cases++;
    }
    fclose(f);
    CHECK_EQ(bad, 0);
    CHECK(cases >= 90 && draws >= 1400 && big >= 20); // the whole file was read
}

static void test_streams(void) {
    uint8_t   bytes[10] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    dt_tokens t;
    CHECK_OK(dt_tokens_init(&t, bytes, 10, 1));
    bytes[0] = 99; // copied
    CHECK(t.n == 10 && dt_tokens_at(&t, 0) == 9 && dt_tokens_at(&t, 9) == 0);
    uint64_t off[2] = {0, 6};
    int32_t  x[6], y[6];
    CHECK_OK(dt_tokens_windows(&t, off, 2, 3, x, y));
    int32_t wx[6] = {9, 8, 7, 3, 2, 1}, wy[6] = {8, 7, 6, 2, 1, 0};
    CHECK(memcmp(x, wx, sizeof x) == 0 && memcmp(y, wy, sizeof y) == 0);
    off[1] = 7; // 7 + 3 + 1 > 10
    CHECK_ERR(dt_tokens_windows(&t, off, 2, 3, x, y), DT_ERR_ARG, "found offset 7 (sequence 1)");
    dt_tokens v;
    CHECK_OK(dt_tokens_slice(&t, 2, 5, &v));
    CHECK(v.n == 3 && dt_tokens_at(&v, 0) == 7 && v.owned == NULL);
    CHECK_ERR(dt_tokens_slice(&t, 5, 11, &v), DT_ERR_ARG, "begin <= end <= 10");
    dt_tokens tr, va;
    dt_tokens_split(&t, &tr, &va);
    CHECK(tr.n == 9 && va.n == 1 && dt_tokens_at(&va, 0) == 0);
    dt_tokens_free(&t);
    // The peers' split: train = 9n // 10 (Debian 12's fortunes: 2,576,674 bytes).
    dt_tokens big = {.data = bytes, .n = 2576674, .width = 1};
    dt_tokens_split(&big, &tr, &va);
    CHECK_EQ(tr.n, 2319006);
    CHECK_EQ(va.n, 2576674 - 2319006);
    big.n = 19;
    dt_tokens_split(&big, &tr, &va);
    CHECK_EQ(tr.n, 17);
    // uint16 tokens, little-endian.
    uint8_t le[6] = {0x34, 0x12, 0xff, 0xff, 0x00, 0x01};
    CHECK_OK(dt_tokens_init(&t, le, 3, 2));
    CHECK(dt_tokens_at(&t, 0) == 0x1234 && dt_tokens_at(&t, 1) == 65535 &&
          dt_tokens_at(&t, 2) == 256);
    off[0] = 1;
    CHECK_OK(dt_tokens_windows(&t, off, 1, 1, x, y));
    CHECK(x[0] == 65535 && y[0] == 256);
    dt_tokens_free(&t);
    CHECK_ERR(dt_tokens_init(&t, le, 3, 4), DT_ERR_ARG, "width of 1 or 2");
    // Vocabulary checks: 0x1234 is the largest token but 65535 is out of a 50257 vocab.
    CHECK_OK(dt_tokens_init(&t, le, 3, 2));
    CHECK_ERR(dt_tokens_check_vocab(&t, 50257, "train.bin"), DT_ERR_FORMAT,
              "train.bin: expected tokens < 50257 (the vocabulary), found 65535 at position 1");
    CHECK_OK(dt_tokens_check_vocab(&t, 65536, NULL));
    dt_tokens_free(&t);
    CHECK_OK(dt_tokens_init(&t, (uint8_t[3]){3, 200, 7}, 3, 1));
    CHECK_OK(dt_tokens_check_vocab(&t, 256, NULL));
    CHECK_ERR(dt_tokens_check_vocab(&t, 100, NULL), DT_ERR_FORMAT, "found 200 at position 1");
    CHECK_ERR(dt_tokens_check_vocab(&t, 0, NULL), DT_ERR_ARG, "at least 1");
    dt_tokens_free(&t);
}

static void test_files(void) {
    uint8_t raw[7] = {1, 2, 3, 4, 5, 6, 7};
    write_file(tmp("u8.bin"), raw, 7);
    dt_tokens t;
    CHECK_OK(dt_tokens_read(tmp("u8.bin"), 1, &t));
    CHECK(t.n == 7 && dt_tokens_at(&t, 6) == 7);
    dt_tokens_free(&t);
    CHECK_ERR(dt_tokens_read(tmp("u8.bin"), 2, &t), DT_ERR_FORMAT, "found 7 bytes");
    CHECK_ERR(dt_tokens_read(tmpdir, 1, &t), DT_ERR_IO, "found a directory");
    CHECK_ERR(dt_tokens_read(tmp("none"), 1, &t), DT_ERR_IO, "cannot open");
    CHECK(mkfifo(tmp("fifo"), 0600) == 0);
    alarm(20); // a FIFO is refused at once, never waited on
    CHECK_ERR(dt_tokens_read(tmp("fifo"), 1, &t), DT_ERR_IO, "found a FIFO (named pipe)");
    alarm(0);
    // llm.c's format: 256 int32 of header (magic, version, count), then uint16 tokens.
    size_t   ntok = 600;
    uint8_t *f    = calloc(1, 1024 + 2 * ntok);
    int32_t  h[3] = {20240520, 1, (int32_t)ntok};
    memcpy(f, h, sizeof h);
    for (size_t i = 0; i < ntok; i++) {
        f[1024 + 2 * i]     = (uint8_t)(i * 37);
        f[1024 + 2 * i + 1] = (uint8_t)(i >> 3);
    }
    write_file(tmp("llmc.bin"), f, 1024 + 2 * ntok);
    CHECK_OK(dt_tokens_read(tmp("llmc.bin"), 2, &t));
    CHECK_EQ(t.n, ntok);
    size_t bad = 0;
    for (size_t i = 0; i < ntok && t.n == ntok; i++)
        bad += dt_tokens_at(&t, i) != (((i * 37) & 0xff) | (i >> 3) << 8);
    CHECK_EQ(bad, 0);
    dt_tokens_free(&t);
    h[2] = 601;
    memcpy(f, h, sizeof h);
    write_file(tmp("llmc.bin"), f, 1024 + 2 * ntok);
    CHECK_ERR(dt_tokens_read(tmp("llmc.bin"), 2, &t), DT_ERR_FORMAT, "token count of 600");
    h[1] = 2;
    memcpy(f, h, sizeof h);
    write_file(tmp("llmc.bin"), f, 1024 + 2 * ntok);
    CHECK_ERR(dt_tokens_read(tmp("llmc.bin"), 2, &t), DT_ERR_FORMAT, "version 1");
    // Without the magic, the same bytes are a plain uint16 stream.
    h[0] = 1;
    memcpy(f, h, sizeof h);
    write_file(tmp("llmc.bin"), f, 1024 + 2 * ntok);
    CHECK_OK(dt_tokens_read(tmp("llmc.bin"), 2, &t));
    CHECK(t.n == 512 + ntok && dt_tokens_at(&t, 0) == 1);
    dt_tokens_free(&t);
    free(f);
}

// Batches: at world 1 the offsets are torch's draws (the fixture's long case), and a
// rank's share at world N is its slice of the world-1 batch.
static void test_batches(void) {
    size_t   T = 16, n = 2318878 + T, B = 12;
    uint8_t *bytes = malloc(n);
    for (size_t i = 0; i < n; i++)
        bytes[i] = (uint8_t)(i * 2654435761u >> 13);
    dt_tokens t = {.data = bytes, .n = n, .width = 1};
    uint64_t  off[12];
    CHECK_OK(dt_tokens_draw(&t, 7, B, T, off));
    FILE *f = fopen("tests/data/fixtures/torch_randint.txt", "r");
    char  line[16384];
    bool  found = false;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "7 2318878 600: ", 15) == 0) {
            found    = true;
            char *p  = line + 15;
            int   ok = 1;
            for (size_t i = 0; i < B; i++)
                ok &= strtoull(p, &p, 10) == off[i];
            CHECK(ok);
        }
    if (f)
        fclose(f);
    CHECK(found);
    int32_t *x1 = malloc(B * T * sizeof *x1), *y1 = malloc(B * T * sizeof *y1);
    int32_t *xr = malloc(B * T * sizeof *xr), *yr = malloc(B * T * sizeof *yr);
    uint64_t scratch[12];
    CHECK_OK(dt_tokens_batch(&t, 1234, B, T, 0, 1, scratch, x1, y1));
    for (size_t i = 0; i < B * T; i++)
        if (i % T + 1 < T && y1[i] != x1[i + 1]) {
            CHECK(!"y is x shifted by one");
            break;
        }
    int worlds[3] = {2, 3, 4};
    for (int wi = 0; wi < 3; wi++) {
        int    w = worlds[wi];
        size_t b = B / (size_t)w, bad = 0;
        for (int r = 0; r < w; r++) {
            CHECK_OK(dt_tokens_batch(&t, 1234, B, T, r, w, scratch, xr, yr));
            for (size_t j = 0; j < b; j++) { // global row r + w j
                size_t g = (size_t)r + (size_t)w * j;
                bad += memcmp(xr + j * T, x1 + g * T, T * sizeof *xr) != 0;
                bad += memcmp(yr + j * T, y1 + g * T, T * sizeof *yr) != 0;
            }
        }
        CHECK_EQ(bad, 0);
    }
    // A different seed gives a different batch.
    CHECK_OK(dt_tokens_batch(&t, 1235, B, T, 0, 1, scratch, xr, yr));
    CHECK(memcmp(xr, x1, B * T * sizeof *xr) != 0);
    CHECK_ERR(dt_tokens_batch(&t, 1, B, T, 0, 5, scratch, xr, yr), DT_ERR_ARG, "world 5");
    CHECK_ERR(dt_tokens_batch(&t, 1, B, T, 2, 2, scratch, xr, yr), DT_ERR_ARG, "rank 2");
    t.n = T;
    CHECK_ERR(dt_tokens_draw(&t, 1, B, T, off), DT_ERR_ARG, "longer than the window");
    free(x1), free(y1), free(xr), free(yr), free(bytes);
}

static void test_corpus(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/corpus", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    char p[400];
    const struct {
        const char *name, *text;
    } files[] = {{"b", "BBB"}, {"a", "aa"}, {"Z", "zz"}, {"c.dat", "DAT"}, {"x.u8", "U8"}};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
        write_file(p, files[i].text, strlen(files[i].text));
    }
    snprintf(p, sizeof p, "%s/sub", dir);
    CHECK(mkdir(p, 0700) == 0); // a directory without a dot: skipped
    snprintf(p, sizeof p, "%s/lnk", dir);
    CHECK(symlink("a", p) == 0); // a link to a regular file: counted (isfile follows)
    dt_tokens t;
    size_t    nf = 0;
    CHECK_OK(dt_corpus_read(dir, 0, &t, &nf));
    CHECK_EQ(nf, 4);
    const char *want = "zzaaBBBaa"; // Z, a, b, lnk in byte order
    CHECK(t.n == strlen(want) && memcmp(t.data, want, t.n) == 0);
    dt_tokens_free(&t);
    CHECK_OK(dt_corpus_read(dir, 5, &t, NULL));
    CHECK(t.n == 5 && memcmp(t.data, "zzaaB", 5) == 0);
    dt_tokens_free(&t);
    snprintf(p, sizeof p, "%s/b", dir);
    CHECK_OK(dt_corpus_read(p, 0, &t, &nf));
    CHECK(nf == 1 && t.n == 3 && memcmp(t.data, "BBB", 3) == 0);
    dt_tokens_free(&t);
    snprintf(p, sizeof p, "%s/sub", dir);
    CHECK_ERR(dt_corpus_read(p, 0, &t, &nf), DT_ERR_IO, "found none");
    CHECK_ERR(dt_corpus_read(tmp("nothing"), 0, &t, &nf), DT_ERR_IO, "apt-get install fortunes");
    // The real corpus when installed, against an independent shell reading of it.
    struct stat sb;
    if (stat(DT_FORTUNES_DIR, &sb) == 0) {
        CHECK_OK(dt_corpus_read(NULL, 0, &t, &nf));
        FILE *sh = popen("cd " DT_FORTUNES_DIR " && for f in $(LC_ALL=C ls); do case $f in *.*) "
                         ";; *) [ -f \"$f\" ] && cat \"$f\";; esac; done | cksum",
                         "r");
        unsigned long crc = 0, len = 0;
        CHECK(sh && fscanf(sh, "%lu %lu", &crc, &len) == 2);
        if (sh)
            pclose(sh);
        CHECK_EQ(t.n, len);
        fprintf(stderr, "     fortunes: %zu files, %zu bytes\n", nf, t.n);
        // cksum's CRC over the same bytes, computed here.
        uint32_t c = 0;
        for (size_t i = 0; i < t.n; i++) {
            c ^= (uint32_t)((const uint8_t *)t.data)[i] << 24;
            for (int k = 0; k < 8; k++)
                c = c & 0x80000000u ? (c << 1) ^ 0x04C11DB7u : c << 1;
        }
        for (size_t n = t.n; n; n >>= 8) {
            c ^= (uint32_t)(n & 0xff) << 24;
            for (int k = 0; k < 8; k++)
                c = c & 0x80000000u ? (c << 1) ^ 0x04C11DB7u : c << 1;
        }
        CHECK_EQ(~c, crc);
        dt_tokens_free(&t);
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_tokens_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    RUN(test_mt19937_reference);
    RUN(test_torch_randint);
    RUN(test_streams);
    RUN(test_files);
    RUN(test_batches);
    RUN(test_corpus);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_summary();
}
