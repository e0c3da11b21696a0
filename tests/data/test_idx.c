// test_idx.c: IDX reading and writing (plain and gzip), every malformed-file error,
// datasets built from IDX files, and the per-pixel normalisation.
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/rng.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
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

// Reads a whole file; the caller frees with free().
static uint8_t *read_bytes(const char *path, size_t *n) {
    *n      = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    *n         = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

// An IDX header written independently of the library: 00 00 type ndim, then
// big-endian dims. Returns its length.
static size_t make_header(uint8_t *h, int type, int ndim, const uint32_t *dims) {
    h[0] = 0;
    h[1] = 0;
    h[2] = (uint8_t)type;
    h[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        h[4 + 4 * i]     = (uint8_t)(dims[i] >> 24);
        h[4 + 4 * i + 1] = (uint8_t)(dims[i] >> 16);
        h[4 + 4 * i + 2] = (uint8_t)(dims[i] >> 8);
        h[4 + 4 * i + 3] = (uint8_t)(dims[i]);
    }
    return 4 + 4 * (size_t)ndim;
}

// gzip-compresses n bytes with zlib directly (not through dt_idx_write).
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

static void test_round_trip(void) {
    dt_rng rng = dt_rng_init(11);
    for (int trial = 0; trial < 24; trial++) {
        int      ndim = 1 + trial % 4;
        uint32_t dims[4];
        size_t   total = 1;
        for (int i = 0; i < ndim; i++) {
            dims[i] = 1 + (uint32_t)dt_rng_below(&rng, i == 0 ? 40 : 9);
            total *= dims[i];
        }
        if (trial == 23) // an empty file is a valid IDX file
            dims[0] = 0, total = 0;
        uint8_t *data = malloc(total + 1);
        for (size_t i = 0; i < total; i++)
            data[i] = (uint8_t)dt_rng_u32(&rng);
        bool        gz   = trial % 2;
        const char *path = tmp_path(gz ? "rt.idx.gz" : "rt.idx");
        CHECK_OK(dt_idx_write(path, data, ndim, dims, gz));

        // The file as written: header by hand, then data (gunzipped when gz).
        size_t   fn   = 0;
        uint8_t *file = read_bytes(path, &fn);
        CHECK(file != NULL);
        CHECK_EQ(fn >= 2 && file[0] == 0x1f && file[1] == 0x8b, gz);
        if (!gz) {
            uint8_t h[20];
            size_t  hn = make_header(h, 0x08, ndim, dims);
            CHECK_EQ(fn, hn + total);
            CHECK(memcmp(file, h, hn) == 0 && memcmp(file + hn, data, total) == 0);
        }

        dt_idx x;
        CHECK_OK(dt_idx_read(path, &x));
        CHECK_EQ(x.ndim, ndim);
        for (int i = 0; i < ndim; i++)
            CHECK_EQ(x.dims[i], dims[i]);
        CHECK_EQ(x.nrecords, dims[0]);
        CHECK_EQ(x.nrecords * x.record_bytes, total);
        CHECK(memcmp(x.data, data, total) == 0);
        dt_idx_free(&x);

        // The memory parser agrees with the file reader.
        CHECK_OK(dt_idx_parse(file, fn, "mem", &x));
        CHECK_EQ(x.ndim, ndim);
        CHECK(memcmp(x.data, data, total) == 0);
        dt_idx_free(&x);

        // A prefix of the records.
        if (dims[0] > 2) {
            CHECK_OK(dt_idx_read_first(path, 2, &x));
            CHECK_EQ(x.nrecords, 2);
            CHECK_EQ(x.dims[0], dims[0]);
            CHECK(memcmp(x.data, data, 2 * x.record_bytes) == 0);
            dt_idx_free(&x);
        }
        free(file);
        free(data);
    }
}

// A gzip stream larger than the first buffer guess exercises the buffer growth.
static void test_gzip_growth(void) {
    uint32_t dims[3] = {3000, 28, 28};
    size_t   total   = 3000 * 28 * 28;
    uint8_t *data    = calloc(total, 1); // zeros compress ~1000:1
    for (size_t i = 0; i < total; i += 4099)
        data[i] = (uint8_t)i;
    const char *path = tmp_path("zeros.idx.gz");
    CHECK_OK(dt_idx_write(path, data, 3, dims, true));
    dt_idx x;
    CHECK_OK(dt_idx_read(path, &x));
    CHECK_EQ(x.nrecords, 3000);
    CHECK(x.data && memcmp(x.data, data, total) == 0);
    dt_idx_free(&x);
    free(data);
}

// Concatenated gzip members are one valid gzip file.
static void test_gzip_members(void) {
    uint32_t dims[2] = {4, 5};
    uint8_t  file[24 + 8];
    size_t   hn = make_header(file, 0x08, 2, dims);
    for (int i = 0; i < 20; i++)
        file[hn + i] = (uint8_t)(3 * i + 1);
    size_t   n1, n2;
    uint8_t *a    = gzip_bytes(file, 9, &n1);
    uint8_t *b    = gzip_bytes(file + 9, hn + 20 - 9, &n2);
    uint8_t *both = malloc(n1 + n2);
    memcpy(both, a, n1);
    memcpy(both + n1, b, n2);
    dt_idx x;
    CHECK_OK(dt_idx_parse(both, n1 + n2, "two-members", &x));
    CHECK_EQ(x.nrecords, 4);
    CHECK(x.data && memcmp(x.data, file + hn, 20) == 0);
    dt_idx_free(&x);
    free(a);
    free(b);
    free(both);
}

// Each malformed input is checked both as a file and from memory.
static void expect_bad(const uint8_t *p, size_t n, const char *needle) {
    const char *path = tmp_path("bad.idx");
    write_bytes(path, p, n);
    dt_idx x;
    CHECK_ERR(dt_idx_read(path, &x), DT_ERR_FORMAT, needle);
    CHECK(strstr(dt_last_error(), path) == dt_last_error()); // message starts with the path
    CHECK(x.data == NULL);
    CHECK_ERR(dt_idx_parse(p, n, "membuf", &x), DT_ERR_FORMAT, needle);
    CHECK(strncmp(dt_last_error(), "membuf: ", 8) == 0);
}

static void test_bad_files(void) {
    uint8_t  buf[256] = {0};
    uint32_t d3[3]    = {2, 3, 4};
    size_t   hn       = make_header(buf, 0x08, 3, d3);
    for (size_t i = 0; i < 24; i++)
        buf[hn + i] = (uint8_t)i;
    dt_idx x;
    CHECK_OK(dt_idx_parse(buf, hn + 24, "good", &x)); // the reference is valid
    dt_idx_free(&x);

    expect_bad(buf, hn + 23,
               "expected 24 bytes of data after the 16-byte header for dims (2, 3, 4), found 23");
    expect_bad(buf, hn + 23, "truncated");
    expect_bad(buf, hn + 25, "found 1 trailing bytes");
    expect_bad(buf, 0, "expected a 4-byte IDX header, found 0 bytes");
    expect_bad(buf, 10, "expected 3 dimension sizes (12 bytes) after the magic, found 6 bytes");

    uint8_t m[64];
    memcpy(m, buf, hn + 24);
    m[0] = 0x01;
    expect_bad(m, hn + 24, "expected an IDX file starting with bytes 00 00, found 01 00");
    memcpy(m, "P5\n28 28\n255\n", 13); // a PGM image is not an IDX file
    expect_bad(m, hn + 24, "found 50 35");

    static const struct {
        int         type;
        const char *name;
    } types[] = {{0x09, "0x09 (signed byte)"},     {0x0B, "0x0B (short (16-bit))"},
                 {0x0C, "0x0C (int (32-bit))"},    {0x0D, "0x0D (float (32-bit))"},
                 {0x0E, "0x0E (double (64-bit))"}, {0x07, "0x07 (not an IDX type)"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        memcpy(m, buf, hn + 24);
        m[2] = (uint8_t)types[i].type;
        expect_bad(m, hn + 24, "expected IDX data type 0x08 (unsigned byte)");
        expect_bad(m, hn + 24, types[i].name);
    }

    memcpy(m, buf, hn + 24);
    m[3] = 0;
    expect_bad(m, hn + 24, "expected 1 to 4 dimensions, found 0");
    m[3] = 5;
    expect_bad(m, hn + 24, "expected 1 to 4 dimensions, found 5");

    // Dimensions whose product overflows size_t.
    uint32_t big[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    size_t   bn     = make_header(m, 0x08, 4, big);
    expect_bad(m, bn + 8,
               "expected dimensions whose product fits in memory, found (4294967295, 4294967295, "
               "4294967295, 4294967295)");
    uint32_t big2[3] = {0xFFFFFFFFu, 0xFFFFFFFFu, 3}; // record fits, total does not
    bn               = make_header(m, 0x08, 3, big2);
    expect_bad(m, bn, "product fits in memory");

    // A header claiming 12 GB in a 30-byte file: rejected before any allocation.
    uint32_t huge[2] = {3000000000u, 4};
    bn               = make_header(m, 0x08, 2, huge);
    size_t before    = dt_alloc_total_count();
    expect_bad(m, bn + 4, "expected 12000000000 bytes of data");
    CHECK(dt_alloc_total_count() - before <= 4); // input windows only
}

static void test_bad_gzip(void) {
    uint8_t  plain[4 + 12 + 600];
    uint32_t d3[3] = {6, 10, 10};
    size_t   hn    = make_header(plain, 0x08, 3, d3);
    dt_rng   rng   = dt_rng_init(5);
    for (size_t i = 0; i < 600; i++)
        plain[hn + i] = (uint8_t)dt_rng_below(&rng, 7);
    size_t   gn;
    uint8_t *gz = gzip_bytes(plain, hn + 600, &gn);
    dt_idx   x;
    CHECK_OK(dt_idx_parse(gz, gn, "good.gz", &x));
    CHECK(x.data && memcmp(x.data, plain + hn, 600) == 0);
    dt_idx_free(&x);

    uint8_t *m = malloc(gn + 64);
    // The trailer's CRC32 (bytes gn-8..gn-5) no longer matches.
    memcpy(m, gz, gn);
    m[gn - 6] ^= 0x40;
    expect_bad(m, gn,
               "expected a valid gzip stream, found corrupt data (zlib: incorrect data check)");
    // The trailer's length (ISIZE) no longer matches.
    memcpy(m, gz, gn);
    m[gn - 3] ^= 0x01;
    expect_bad(m, gn, "zlib: incorrect length check");
    // Cut in the middle of the deflate data, and just before the trailer.
    expect_bad(gz, gn / 2, "truncated gzip stream");
    expect_bad(gz, gn - 4, "truncated gzip stream");
    // Garbage after the gzip stream.
    memcpy(m, gz, gn);
    memcpy(m + gn, "garbage!", 8);
    expect_bad(m, gn + 8, "expected the file to end with the gzip stream");
    expect_bad(m, gn + 8, "found 8 more bytes");
    // A bad header flag byte.
    memcpy(m, gz, gn);
    m[3] = 0xE0; // reserved FLG bits set
    expect_bad(m, gn, "expected a valid gzip stream");
    // Random corruption anywhere after the gzip header: always a clean FORMAT error.
    for (int t = 0; t < 200; t++) {
        memcpy(m, gz, gn);
        size_t at = 10 + (size_t)dt_rng_below(&rng, gn - 10);
        m[at] ^= (uint8_t)(1 + dt_rng_below(&rng, 255));
        dt_status st = dt_idx_parse(m, gn, "rnd.gz", &x);
        CHECK(st == DT_ERR_FORMAT || (st == DT_OK && x.nrecords == 6));
        if (st == DT_ERR_FORMAT)
            CHECK(strncmp(dt_last_error(), "rnd.gz: expected ", 17) == 0);
        dt_idx_free(&x);
    }
    free(m);
    free(gz);

    // Decompressed data shorter and longer than the header says.
    gz = gzip_bytes(plain, hn + 599, &gn);
    expect_bad(gz, gn, "found 599 (after gzip decompression) (truncated data)");
    free(gz);
    uint8_t longer[4 + 12 + 601];
    memcpy(longer, plain, sizeof plain);
    longer[sizeof plain] = 9;
    gz                   = gzip_bytes(longer, sizeof longer, &gn);
    expect_bad(gz, gn, "found more decompressed bytes (trailing data)");
    free(gz);

    // The magic checked after decompression; the message says so.
    plain[1] = 0x03;
    gz       = gzip_bytes(plain, hn + 600, &gn);
    expect_bad(gz, gn, "starting with bytes 00 00 (after gzip decompression), found 00 03");
    free(gz);
    plain[1] = 0;

    // A header claiming far more than any gzip stream of this size can hold: no
    // allocation proportional to the claim.
    uint32_t huge[3] = {100000000u, 28, 28};
    size_t   hh      = make_header(plain, 0x08, 3, huge);
    gz               = gzip_bytes(plain, hh + 600, &gn);
    expect_bad(gz, gn, "found dims (100000000, 28, 28) claiming 78400000000");
    free(gz);
    // A claim within the ratio bound but beyond the data: grows as data arrives, then
    // reports the truncation (the buffer stays near the real size).
    uint32_t more[3] = {2000u, 10, 10};
    hh               = make_header(plain, 0x08, 3, more);
    gz               = gzip_bytes(plain, hh + 600, &gn);
    expect_bad(gz, gn,
               "expected 200000 bytes of data after the 16-byte header for dims (2000, 10, 10), "
               "found 600");
    free(gz);
}

static void test_write_and_open_errors(void) {
    dt_idx   x;
    uint32_t d[1] = {3};
    uint8_t  v[3] = {1, 2, 3};
    CHECK_ERR(dt_idx_read(tmp_path("missing.idx"), &x), DT_ERR_IO,
              "missing.idx: cannot open: No such file");
    CHECK_ERR(dt_idx_read(tmpdir, &x), DT_ERR_IO, "expected a regular file, found a directory");
    CHECK_ERR(dt_idx_write(tmp_path("x.idx"), v, 0, d, false), DT_ERR_ARG,
              "expected 1 to 4 dimensions, found 0");
    CHECK_ERR(dt_idx_write("/nonexistent-dir/x.idx", v, 1, d, false), DT_ERR_IO, "cannot create");
    CHECK(access("/nonexistent-dir/x.idx", F_OK) != 0);
}

// ------------------------------------------------------------------------- dataset

static void write_set(const char *img, const char *lab, size_t n, int h, int w,
                      const uint8_t *images, const uint8_t *labels, size_t nlabels, bool gz) {
    uint32_t di[3] = {(uint32_t)n, (uint32_t)h, (uint32_t)w};
    uint32_t dl[1] = {(uint32_t)nlabels};
    CHECK_OK(dt_idx_write(img, images, 3, di, gz));
    CHECK_OK(dt_idx_write(lab, labels, 1, dl, gz));
}

static void test_dataset(void) {
    size_t   n = 57;
    int      h = 5, w = 7;
    uint8_t *images = malloc(n * 35), labels[64];
    dt_rng   rng    = dt_rng_init(3);
    for (size_t i = 0; i < n * 35; i++)
        images[i] = (uint8_t)dt_rng_u32(&rng);
    for (size_t i = 0; i < 64; i++)
        labels[i] = (uint8_t)dt_rng_below(&rng, 10);
    const char *img = tmp_path("ds-images.gz"), *lab = tmp_path("ds-labels.gz");
    write_set(img, lab, n, h, w, images, labels, n, true);

    dt_dataset ds;
    CHECK_OK(dt_dataset_load_idx(&ds, img, lab, NULL));
    CHECK_EQ(ds.n, n);
    CHECK_EQ(ds.h, h);
    CHECK_EQ(ds.w, w);
    CHECK_EQ(ds.num_classes, 10);
    CHECK(memcmp(ds.images, images, n * 35) == 0);
    CHECK(memcmp(ds.labels, labels, n) == 0);

    // Normalisation: gathered floats against (p / 255 - mean) / std in double; the
    // defaults are mean 0, std 1 (ToTensor alone).
    CHECK(ds.mean == 0.0f && ds.std == 1.0f);
    uint32_t idx[5] = {56, 0, 13, 13, 40};
    float    x[5 * 35];
    int32_t  y[5];
    dt_dataset_gather(&ds, idx, 5, x, y);
    double worst = 0;
    for (int i = 0; i < 5; i++) {
        CHECK_EQ(y[i], labels[idx[i]]);
        for (int j = 0; j < 35; j++) {
            double p   = images[idx[i] * 35 + (size_t)j];
            double ref = p / 255.0;
            double d   = fabs(x[i * 35 + j] - ref);
            worst      = d > worst ? d : worst;
        }
    }
    CHECK(worst < 2e-6);
    dt_dataset_free(&ds);

    // Options: a limit, other constants, fewer classes.
    dt_dataset_opts o = dt_dataset_opts_default();
    o.limit           = 10;
    o.mean            = 0.5f;
    o.std             = 0.25f;
    CHECK_OK(dt_dataset_load_idx(&ds, img, lab, &o));
    CHECK_EQ(ds.n, 10);
    CHECK(memcmp(ds.images, images, 10 * 35) == 0);
    CHECK_NEAR(ds.lut[0], -2.0, 1e-6);
    CHECK_NEAR(ds.lut[255], 2.0, 1e-6);
    CHECK_NEAR(ds.lut[51], (0.2 - 0.5) / 0.25, 1e-6);
    dt_dataset_free(&ds);

    o             = dt_dataset_opts_default();
    o.num_classes = 3;
    size_t bad    = 0;
    while (labels[bad] < 3)
        bad++;
    char want[96];
    snprintf(want, sizeof want, "expected labels in [0, 3), found %d at index %zu", labels[bad],
             bad);
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, &o), DT_ERR_FORMAT, want);
    CHECK(ds.images == NULL);

    // A label >= 10 in the file.
    labels[7] = 12;
    write_set(img, lab, n, h, w, images, labels, n, false);
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, NULL), DT_ERR_FORMAT,
              "expected labels in [0, 10), found 12 at index 7");
    labels[7] = 1;

    // Label count differs from image count: both counts and both files named.
    write_set(img, lab, n, h, w, images, labels, n - 1, false);
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, NULL), DT_ERR_FORMAT,
              "expected as many labels as images, found 57 images in");
    CHECK(strstr(dt_last_error(), img) && strstr(dt_last_error(), lab));
    CHECK(strstr(dt_last_error(), "and 56 labels in"));
    o       = dt_dataset_opts_default();
    o.limit = 5; // still caught under a limit
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, &o), DT_ERR_FORMAT, "found 57 images");

    // Images that are not (N, H, W).
    uint32_t d2[2] = {(uint32_t)n, 35};
    CHECK_OK(dt_idx_write(img, images, 2, d2, false));
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, NULL), DT_ERR_FORMAT,
              "expected images of 3 dimensions (N, H, W), found 2");
    // Labels that are not (N).
    write_set(img, lab, n, h, w, images, labels, n, false);
    CHECK_OK(dt_idx_write(lab, images, 2, d2, false));
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, NULL), DT_ERR_FORMAT,
              "expected labels of 1 dimension (N), found 2");

    // Bad options.
    o     = dt_dataset_opts_default();
    o.std = 0;
    CHECK_ERR(dt_dataset_load_idx(&ds, img, lab, &o), DT_ERR_ARG, "expected std > 0");

    // From memory.
    CHECK_OK(dt_dataset_init(&ds, images, labels, n, h, w, NULL));
    CHECK_EQ(ds.n, n);
    CHECK(memcmp(ds.images, images, n * 35) == 0);
    dt_dataset_free(&ds);
    dt_dataset_free(&ds); // freeing twice is harmless: free zeroes
    free(images);
}

static void test_load_mnist_dir(void) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/mnist", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    dt_dataset ds;
    CHECK_ERR(dt_dataset_load_mnist(&ds, dir, true, NULL), DT_ERR_IO,
              "expected the MNIST-format file train-images-idx3-ubyte in");
    char want[512];
    snprintf(want, sizeof want,
             "found neither %s/train-images-idx3-ubyte nor %s/train-images-idx3-ubyte.gz", dir,
             dir);
    CHECK(strstr(dt_last_error(), want) != NULL);

    uint8_t images[4 * 6], labels[4] = {3, 1, 4, 1};
    for (int i = 0; i < 24; i++)
        images[i] = (uint8_t)(i * 10);
    char img[256], lab[256];
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte", dir);
    write_set(img, lab, 4, 2, 3, images, labels, 4, true);
    // The labels are plain here; rewrite them uncompressed.
    uint32_t dl[1] = {4};
    CHECK_OK(dt_idx_write(lab, labels, 1, dl, false));
    CHECK_OK(dt_dataset_load_mnist(&ds, dir, false, NULL));
    CHECK_EQ(ds.n, 4);
    CHECK_EQ(ds.h, 2);
    CHECK_EQ(ds.w, 3);
    CHECK(memcmp(ds.labels, labels, 4) == 0);
    dt_dataset_free(&ds);
    CHECK_ERR(dt_dataset_load_mnist(&ds, dir, true, NULL), DT_ERR_IO, "train-images-idx3-ubyte");

    // DT_DATA_DIR is the directory when none is given.
    setenv("DT_DATA_DIR", dir, 1);
    CHECK_OK(dt_dataset_load_mnist(&ds, NULL, false, NULL));
    CHECK_EQ(ds.n, 4);
    dt_dataset_free(&ds);
    setenv("DT_DATA_DIR", "/nonexistent-dtrain-data", 1);
    CHECK_ERR(dt_dataset_load_mnist(&ds, NULL, false, NULL), DT_ERR_IO,
              "/nonexistent-dtrain-data/t10k-images-idx3-ubyte.gz");
    unsetenv("DT_DATA_DIR"); // and without it, no folder: the library has no default
    CHECK_ERR(dt_dataset_load_mnist(&ds, NULL, false, NULL), DT_ERR_ARG, "DT_DATA_DIR unset");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dtrain-test-idx-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_round_trip);
    RUN(test_gzip_growth);
    RUN(test_gzip_members);
    RUN(test_bad_files);
    RUN(test_bad_gzip);
    RUN(test_write_and_open_errors);
    RUN(test_dataset);
    RUN(test_load_mnist_dir);
    nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    return check_summary();
}
