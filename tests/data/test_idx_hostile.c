// test_idx_hostile.c: data files crafted to hurt the reader.
//
// - A 4 MB gzip file whose trailer claims about 4 GiB of data (and whose data really
//   inflates to that) while its IDX header claims 10 small images: refused in well
//   under a second with the RSS growth of a child process (getrusage) below 64 MiB,
//   from a file and from memory. The header is checked before anything is sized on
//   the trailer's word.
// - A bit flipped inside the first records of a gzip file is reported as a CRC-32
//   mismatch also when only those records are read (--limit), and so is one after them.
// - A directory, a FIFO and a character device under a data file's name are refused
//   naming what they are; the FIFO without blocking.
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/rng.h"

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static char tmpdir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int  next;
    char       *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ(fwrite(p, 1, n, f), n);
    fclose(f);
}

// An IDX unsigned-byte header written by hand; returns its length.
static size_t make_header(uint8_t *h, int ndim, const uint32_t *dims) {
    h[0] = 0;
    h[1] = 0;
    h[2] = 0x08;
    h[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++)
        for (int b = 0; b < 4; b++)
            h[4 + 4 * i + b] = (uint8_t)(dims[i] >> (24 - 8 * b));
    return 4 + 4 * (size_t)ndim;
}

// Appends what deflate produces for `n` input bytes with `flush` to out at *len.
static void deflate_into(z_stream *z, const uint8_t *p, size_t n, int flush, uint8_t *out,
                         size_t *len, size_t cap) {
    z->next_in   = (Bytef *)(uintptr_t)p;
    z->avail_in  = (uInt)n;
    z->next_out  = out + *len;
    z->avail_out = (uInt)(cap - *len);
    int ret      = deflate(z, flush);
    CHECK(ret == Z_OK || ret == Z_STREAM_END);
    CHECK_EQ(z->avail_in, 0);
    CHECK(z->avail_out > 0);
    *len = cap - z->avail_out;
}

#define MIB         ((size_t)1 << 20)
#define ZERO_MIBS   4095u // the data inflates to 4095 MiB + 7856 bytes, just below 4 GiB
#define SMALL_DIMS0 10u

// A gzip file of one member: an IDX header claiming (10, 28, 28), those 7840 bytes,
// then 4095 MiB of zeros, with a correct CRC-32 and ISIZE in the trailer. Built without
// deflating 4 GiB: after a full flush deflate emits the same bytes for each further MiB
// of zeros, so that block is copied.
static uint8_t *lying_gzip(size_t *n, uint64_t *inflated) {
    size_t   cap = ZERO_MIBS * 1100 + 65536, len = 0;
    uint8_t *out = malloc(cap);
    uint8_t *zer = calloc(MIB, 1);
    uint8_t  head[16 + SMALL_DIMS0 * 784];
    uint32_t dims[3] = {SMALL_DIMS0, 28, 28};
    size_t   hn      = make_header(head, 3, dims);
    for (size_t i = hn; i < sizeof head; i++)
        head[i] = (uint8_t)(i * 7);
    z_stream z = {0};
    CHECK(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    deflate_into(&z, head, sizeof head, Z_FULL_FLUSH, out, &len, cap);
    size_t at[4];
    for (int k = 0; k < 3; k++) {
        at[k] = len;
        deflate_into(&z, zer, MIB, Z_FULL_FLUSH, out, &len, cap);
    }
    at[3]        = len;
    size_t block = at[3] - at[2];
    CHECK_EQ(at[2] - at[1], block);
    CHECK(memcmp(out + at[1], out + at[2], block) == 0); // the steady state
    for (unsigned k = 3; k < ZERO_MIBS; k++) {
        memcpy(out + len, out + at[2], block);
        len += block;
    }
    deflate_into(&z, NULL, 0, Z_FINISH, out, &len, cap); // final block and trailer
    deflateEnd(&z);
    uLong crc_zero = crc32(0, zer, (uInt)MIB);
    uLong crc      = crc32(0, head, (uInt)sizeof head);
    for (unsigned k = 0; k < ZERO_MIBS; k++)
        crc = crc32_combine(crc, crc_zero, (z_off_t)MIB);
    *inflated      = sizeof head + (uint64_t)ZERO_MIBS * MIB;
    uint32_t isize = (uint32_t)*inflated;
    for (int b = 0; b < 4; b++) {
        out[len - 8 + b] = (uint8_t)(crc >> (8 * b));
        out[len - 4 + b] = (uint8_t)(isize >> (8 * b));
    }
    free(zer);
    *n = len;
    return out;
}

typedef struct probe {
    int    status;
    long   rss_before_kib, rss_after_kib;
    double secs;
    char   msg[512];
} probe;

// Runs one read in a child process (so its peak RSS is its own) and reports the
// status, the growth of the peak RSS, the time and the message.
static probe probe_read(const char *path, size_t limit, const uint8_t *buf, size_t n) {
    probe r = {.status = -1};
    int   fd[2];
    if (!CHECK(pipe(fd) == 0))
        return r;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        alarm(60);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        probe  p  = {.rss_before_kib = ru.ru_maxrss};
        double t0 = dt_now();
        dt_idx x  = {0};
        p.status = path ? dt_idx_read_first(path, limit, &x) : dt_idx_parse(buf, n, "lying.gz", &x);
        p.secs   = dt_now() - t0;
        getrusage(RUSAGE_SELF, &ru);
        p.rss_after_kib = ru.ru_maxrss;
        snprintf(p.msg, sizeof p.msg, "%s", dt_last_error());
        dt_idx_free(&x);
        ssize_t w = write(fd[1], &p, sizeof p);
        _exit(w == (ssize_t)sizeof p ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], &r, sizeof r);
    close(fd[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (got != (ssize_t)sizeof r)
        r.status = -1;
    return r;
}

static void check_refused(probe p, const char *what) {
    long grown_mib = (p.rss_after_kib - p.rss_before_kib) / 1024;
    fprintf(stderr, "  %s: status %d in %.3f s, peak RSS +%ld MiB: %s\n", what, p.status, p.secs,
            grown_mib, p.msg);
    CHECK_EQ(p.status, DT_ERR_FORMAT);
    CHECK(strstr(p.msg, "dims (10, 28, 28)") != NULL);
    CHECK(strstr(p.msg, "trailing data") != NULL);
    CHECK(grown_mib < 64); // the file is 4 MiB; the trailer claims 4 GiB
    CHECK(p.secs < 3.0);   // ~0.01 s; inflating the 4 GiB takes several seconds
}

static void test_lying_trailer(void) {
    size_t   n;
    uint64_t inflated;
    uint8_t *gz = lying_gzip(&n, &inflated);
    CHECK(n < 5 * MIB);
    CHECK(inflated > 4000 * MIB && inflated < ((uint64_t)1 << 32));
    // Within the 1032:1 bound of deflate, so the size check alone cannot refuse it.
    CHECK((uint64_t)n * 1032 > inflated);
    const char *path = tmp_path("lying-images.gz");
    write_bytes(path, gz, n);
    check_refused(probe_read(path, 0, NULL, 0), "file");
    check_refused(probe_read(path, 5, NULL, 0), "file, first 5 records");
    check_refused(probe_read(NULL, 0, gz, n), "memory");

    // The same stream with a trailer that agrees with the header: the data beyond the
    // header's claim is refused after one byte of it.
    uint32_t small = 16 + SMALL_DIMS0 * 784;
    for (int b = 0; b < 4; b++)
        gz[n - 4 + b] = (uint8_t)(small >> (8 * b));
    check_refused(probe_read(NULL, 0, gz, n), "memory, agreeing trailer");
    free(gz);
}

// ------------------------------------------------------------------- CRC under a limit

// gzip with stored (uncompressed) deflate blocks, so a flipped data bit leaves a valid
// deflate stream and only the CRC-32 can tell.
static uint8_t *gzip_stored(const uint8_t *p, size_t n, size_t *out_n) {
    z_stream z = {0};
    CHECK(deflateInit2(&z, 0, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t   cap = deflateBound(&z, (uLong)n) + 64, len = 0;
    uint8_t *out = malloc(cap);
    deflate_into(&z, p, n, Z_FINISH, out, &len, cap);
    deflateEnd(&z);
    *out_n = len;
    return out;
}

static void test_limit_crc(void) {
    enum { N = 100, REC = 784 };
    size_t   fn      = 16 + (size_t)N * REC;
    uint8_t *file    = malloc(fn);
    uint32_t dims[3] = {N, 28, 28};
    make_header(file, 3, dims);
    dt_rng rng = dt_rng_init(9);
    for (size_t i = 16; i < fn; i++)
        file[i] = (uint8_t)dt_rng_u32(&rng);
    size_t      gn;
    uint8_t    *gz   = gzip_stored(file, fn, &gn);
    const char *path = tmp_path("crc-images.gz");
    write_bytes(path, gz, gn);
    dt_idx x;
    CHECK_OK(dt_idx_read_first(path, 10, &x)); // the reference reads
    CHECK(x.nrecords == 10 && memcmp(x.data, file + 16, 10 * REC) == 0);
    dt_idx_free(&x);

    for (int rec = 0; rec < 2; rec++) {
        // Record 3 (inside the 10 kept) and record 90 (after them).
        size_t         r   = rec == 0 ? 3 : 90;
        const uint8_t *raw = memmem(gz, gn, file + 16 + r * REC, REC);
        if (!CHECK(raw != NULL))
            continue;
        uint8_t *bad = malloc(gn);
        memcpy(bad, gz, gn);
        bad[(size_t)(raw - gz) + REC / 2] ^= 0x10;
        write_bytes(path, bad, gn);
        CHECK_ERR(dt_idx_read_first(path, 10, &x), DT_ERR_FORMAT,
                  "the CRC-32 of the decompressed data does not match the one in the gzip "
                  "trailer");
        CHECK(x.data == NULL);
        CHECK_ERR(dt_idx_read_first(path, 1, &x), DT_ERR_FORMAT, "CRC-32");
        CHECK_ERR(dt_idx_read(path, &x), DT_ERR_FORMAT, "CRC-32");
        CHECK_ERR(dt_idx_parse(bad, gn, "mem.gz", &x), DT_ERR_FORMAT, "mem.gz: expected");
        CHECK(strstr(dt_last_error(), "CRC-32") != NULL);
        free(bad);
    }

    // Through a dataset with a limit, as dtrain-mnist --limit reads it.
    uint8_t  labels[N];
    uint32_t dl[1] = {N};
    for (int i = 0; i < N; i++)
        labels[i] = (uint8_t)(i % 10);
    const char *lab = tmp_path("crc-labels.gz");
    CHECK_OK(dt_idx_write(lab, labels, 1, dl, true));
    dt_dataset_opts o = dt_dataset_opts_default();
    o.limit           = 5;
    dt_dataset ds;
    CHECK_ERR(dt_dataset_load_idx(&ds, path, lab, &o), DT_ERR_FORMAT, "CRC-32");
    write_bytes(path, gz, gn);
    CHECK_OK(dt_dataset_load_idx(&ds, path, lab, &o));
    CHECK_EQ(ds.n, 5);
    dt_dataset_free(&ds);

    // Two gzip members (the fast path declines them): the records after the limit are
    // inflated through the scratch buffer, and a flip there is still caught.
    size_t   g1, g2;
    uint8_t *m1 = gzip_stored(file, 16 + 20 * REC, &g1);
    uint8_t *m2 = gzip_stored(file + 16 + 20 * REC, fn - 16 - 20 * REC, &g2);
    uint8_t *mm = malloc(g1 + g2);
    memcpy(mm, m1, g1);
    memcpy(mm + g1, m2, g2);
    write_bytes(path, mm, g1 + g2);
    CHECK_OK(dt_idx_read_first(path, 10, &x));
    CHECK(x.nrecords == 10 && x.data && memcmp(x.data, file + 16, 10 * REC) == 0);
    dt_idx_free(&x);
    const uint8_t *late = memmem(mm + g1, g2, file + 16 + 90 * REC, REC);
    if (CHECK(late != NULL)) {
        mm[(size_t)(late - mm) + 7] ^= 0x01;
        write_bytes(path, mm, g1 + g2);
        CHECK_ERR(dt_idx_read_first(path, 10, &x), DT_ERR_FORMAT, "CRC-32");
    }
    free(m1);
    free(m2);
    free(mm);

    // A stream cut after the records kept is truncated, also under a limit.
    write_bytes(path, gz, gn - 2000);
    CHECK_ERR(dt_idx_read_first(path, 10, &x), DT_ERR_FORMAT, "truncated");
    free(gz);
    free(file);
}

// ---------------------------------------------------------------- non-regular files

static void on_alarm(int sig) {
    (void)sig;
}

static void test_non_regular(void) {
    // A ticking timer whose handler has no SA_RESTART: an open that blocks on a FIFO
    // fails with EINTR within a second (and the check on its message fails) instead of
    // hanging the test.
    struct sigaction sa = {0};
    sa.sa_handler       = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval tick = {{1, 0}, {1, 0}};
    setitimer(ITIMER_REAL, &tick, NULL);

    dt_idx x;
    CHECK_ERR(dt_idx_read(tmpdir, &x), DT_ERR_IO, "expected a regular file, found a directory");
    const char *fifo = tmp_path("fifo.idx");
    CHECK(mkfifo(fifo, 0600) == 0);
    double t0 = dt_now();
    CHECK_ERR(dt_idx_read(fifo, &x), DT_ERR_IO,
              "fifo.idx: expected a regular file, found a FIFO (named pipe)");
    CHECK_ERR(dt_idx_read_first(fifo, 3, &x), DT_ERR_IO, "found a FIFO (named pipe)");
    CHECK(dt_now() - t0 < 2.0);
    CHECK_ERR(dt_idx_read("/dev/zero", &x), DT_ERR_IO,
              "/dev/zero: expected a regular file, found a character device");

    // In a data directory: each kind under the training images' name, named as such.
    char dir[128], name[256], want[512];
    snprintf(dir, sizeof dir, "%s/data", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(name, sizeof name, "%s/train-images-idx3-ubyte", dir);
    dt_dataset ds;
    static const struct {
        const char *kind;
        int         how; // 0 directory, 1 FIFO, 2 symlink to /dev/zero
    } cases[] = {{"a directory", 0}, {"a FIFO (named pipe)", 1}, {"a character device", 2}};
    for (int i = 0; i < 3; i++) {
        int made = cases[i].how == 0   ? mkdir(name, 0700)
                   : cases[i].how == 1 ? mkfifo(name, 0600)
                                       : symlink("/dev/zero", name);
        CHECK(made == 0);
        snprintf(want, sizeof want, "%s is %s, expected a regular file", name, cases[i].kind);
        t0 = dt_now();
        CHECK_ERR(dt_dataset_load_mnist(&ds, dir, true, NULL), DT_ERR_IO, want);
        CHECK(strstr(dt_last_error(), "found neither") == NULL);
        CHECK(dt_now() - t0 < 2.0);
        CHECK(remove(name) == 0);
    }
    // The same for the .gz name when the plain name is absent.
    snprintf(name, sizeof name, "%s/train-images-idx3-ubyte.gz", dir);
    CHECK(mkfifo(name, 0600) == 0);
    snprintf(want, sizeof want, "%s is a FIFO (named pipe), expected a regular file", name);
    CHECK_ERR(dt_dataset_load_mnist(&ds, dir, true, NULL), DT_ERR_IO, want);
    CHECK(remove(name) == 0);
    // Nothing at either name: the old message, listing both.
    CHECK_ERR(dt_dataset_load_mnist(&ds, dir, true, NULL), DT_ERR_IO, "found neither");
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dtrain-test-hostile-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_lying_trailer);
    RUN(test_limit_crc);
    RUN(test_non_regular);
    nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    return check_summary();
}
