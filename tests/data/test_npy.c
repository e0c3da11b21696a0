// test_npy.c: the .npy reader against files written by numpy (tests/data/fixtures,
// made by make_fixtures.py there), and every refusal: malformed headers, unsupported
// and big-endian dtypes, truncation, extra bytes, absurd shapes, non-regular files.
// Run from the repository root (as `make test` does).
#include "../check.h"
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/data/fixtures/"

// The fixtures' values: v(i) over the C-order flat index i (see make_fixtures.py).
static double ramp(dt_npy_dtype t, size_t i) {
    switch (t) {
    case DT_NPY_F32:
    case DT_NPY_F64:
        return (double)i * 0.5 - 3;
    case DT_NPY_U8:
        return (double)(i % 251);
    case DT_NPY_U16:
        return (double)i * 7;
    default:
        return (double)i * 7 - 11;
    }
}

static double elem(const dt_npy *a, size_t i) {
    const uint8_t *p = (const uint8_t *)a->data + i * a->elem_size;
    switch (a->dtype) {
    case DT_NPY_U8:
        return *p;
    case DT_NPY_U16:
        return *(const uint16_t *)(const void *)p;
    case DT_NPY_I32:
        return *(const int32_t *)(const void *)p;
    case DT_NPY_I64:
        return (double)*(const int64_t *)(const void *)p;
    case DT_NPY_F32:
        return *(const float *)(const void *)p;
    case DT_NPY_F64:
        return *(const double *)(const void *)p;
    }
    return NAN;
}

static void check_ramp(const char *file, dt_npy_dtype t, int ndim, const size_t *shape) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s", file);
    dt_npy    a;
    dt_status st = dt_npy_read(path, &a);
    if (!check_report(st == DT_OK, file, __FILE__, __LINE__)) {
        fprintf(stderr, "     %s (run from the repository root)\n", dt_last_error());
        return;
    }
    CHECK_EQ(a.dtype, t);
    CHECK_EQ(a.elem_size, dt_npy_dtype_size(t));
    CHECK_EQ(a.ndim, ndim);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        CHECK_EQ(a.shape[i], shape[i]);
        count *= shape[i];
    }
    CHECK_EQ(a.count, count);
    CHECK_EQ(a.nbytes, count * a.elem_size);
    size_t bad = 0;
    for (size_t i = 0; i < a.count; i++)
        bad += elem(&a, i) != ramp(t, i);
    CHECK_EQ(bad, 0);
    dt_npy_free(&a);
    CHECK(a.data == NULL && a.count == 0);
}

static void test_numpy_files(void) {
    check_ramp("npy_f4_2x3.npy", DT_NPY_F32, 2, (size_t[]){2, 3});
    check_ramp("npy_f8_5.npy", DT_NPY_F64, 1, (size_t[]){5});
    check_ramp("npy_u1_4x2x3.npy", DT_NPY_U8, 3, (size_t[]){4, 2, 3});
    check_ramp("npy_u2_6.npy", DT_NPY_U16, 1, (size_t[]){6});
    check_ramp("npy_i4_7.npy", DT_NPY_I32, 1, (size_t[]){7});
    check_ramp("npy_i8_3x2.npy", DT_NPY_I64, 2, (size_t[]){3, 2});
    check_ramp("npy_f4_v2_3x2.npy", DT_NPY_F32, 2, (size_t[]){3, 2});
    check_ramp("npy_f4_v3_3x2.npy", DT_NPY_F32, 2, (size_t[]){3, 2});
    // Fortran order comes back in C order: the same values as the C ramp.
    check_ramp("npy_f4_fortran_2x3x4.npy", DT_NPY_F32, 3, (size_t[]){2, 3, 4});
    check_ramp("npy_f4_0x3.npy", DT_NPY_F32, 2, (size_t[]){0, 3});
    dt_npy a;
    CHECK_OK(dt_npy_read(FIX "npy_f4_scalar.npy", &a));
    CHECK_EQ(a.ndim, 0);
    CHECK_EQ(a.count, 1);
    CHECK(a.data && elem(&a, 0) == 3.5);
    dt_npy_free(&a);
}

static void test_refused_dtypes(void) {
    dt_npy a;
    CHECK_ERR(dt_npy_read(FIX "npy_bad_bigendian.npy", &a), DT_ERR_FORMAT, "big-endian '>f4'");
    CHECK(a.data == NULL);
    CHECK_ERR(dt_npy_read(FIX "npy_bad_complex.npy", &a), DT_ERR_FORMAT, "found descr '<c8'");
    CHECK_ERR(dt_npy_read(FIX "npy_bad_f2.npy", &a), DT_ERR_FORMAT, "found descr '<f2'");
    CHECK_ERR(dt_npy_read(FIX "npy_bad_structured.npy", &a), DT_ERR_FORMAT, "structured dtype");
    CHECK_ERR(dt_npy_read(FIX "no-such-file.npy", &a), DT_ERR_IO, "no-such-file.npy");
    CHECK_ERR(dt_npy_read(FIX, &a), DT_ERR_IO, "expected a regular file, found a directory");
    // A FIFO is refused at once, not waited on (the alarm fails the test if it hangs).
    char fifo[] = "/tmp/dt_npy_fifo_XXXXXX";
    int  fd     = mkstemp(fifo);
    if (CHECK(fd >= 0)) {
        close(fd);
        unlink(fifo);
        CHECK(mkfifo(fifo, 0600) == 0);
        alarm(20);
        CHECK_ERR(dt_npy_read(fifo, &a), DT_ERR_IO, "found a FIFO (named pipe)");
        alarm(0);
        unlink(fifo);
    }
}

// Builds a v1.0 file from a header dict text and `nbytes` data bytes (value i % 256).
static size_t build(uint8_t *buf, size_t cap, const char *dict, size_t nbytes) {
    size_t dl = strlen(dict), hl = dl + 1, n = 10 + hl + nbytes;
    if (n > cap)
        return 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)hl;
    buf[9] = (uint8_t)(hl >> 8);
    memcpy(buf + 10, dict, dl);
    buf[10 + dl] = '\n';
    for (size_t i = 0; i < nbytes; i++)
        buf[10 + hl + i] = (uint8_t)i;
    return n;
}

static dt_status parse_dict_text(const char *dict, size_t nbytes, dt_npy *a) {
    static uint8_t buf[4096];
    size_t         n = build(buf, sizeof buf, dict, nbytes);
    return dt_npy_parse(buf, n, "mem", a);
}

static void test_headers(void) {
    dt_npy a;
    // Well-formed variants: key order, double quotes, spacing, no trailing comma, '='.
    CHECK_OK(parse_dict_text("{\"shape\": (2,), 'fortran_order': False, 'descr': '=i4'}", 8, &a));
    CHECK(a.dtype == DT_NPY_I32 && a.ndim == 1 && a.shape[0] == 2);
    CHECK_EQ(*(int32_t *)a.data, 0x03020100);
    dt_npy_free(&a);
    CHECK_OK(parse_dict_text("{'descr':'<u1','fortran_order':False,'shape':(3L, 1L),}   ", 3, &a));
    CHECK(a.dtype == DT_NPY_U8 && a.ndim == 2 && a.shape[0] == 3 && a.shape[1] == 1);
    dt_npy_free(&a);
    // Malformed ones, each with its message.
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False}", 0, &a), DT_ERR_FORMAT,
              "found no 'shape'");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "
                              "'extra': 1}",
                              4, &a),
              DT_ERR_FORMAT, "found 'extra'");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                              "'shape': (1,)}",
                              4, &a),
              DT_ERR_FORMAT, "'descr' twice");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4, &a),
              DT_ERR_FORMAT, "True or False");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (4)}", 16, &a),
              DT_ERR_FORMAT, "'(n,)'");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 0, &a),
              DT_ERR_FORMAT, "non-negative integer");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (1,) x", 4, &a),
              DT_ERR_FORMAT, "',' or '}'");
    CHECK_ERR(parse_dict_text("('descr', '<f4')", 0, &a), DT_ERR_FORMAT, "'{'");
    CHECK_ERR(parse_dict_text("{'descr': '|f4', 'fortran_order': False, 'shape': (1,)}", 4, &a),
              DT_ERR_FORMAT, "found descr '|f4'");
    CHECK_ERR(
        parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk", 4, &a),
        DT_ERR_FORMAT, "only spaces");
    CHECK_ERR(parse_dict_text("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", 4, &a),
              DT_ERR_FORMAT, "without escapes");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': "
                              "(1,1,1,1,1,1,1,1,1)}",
                              4, &a),
              DT_ERR_FORMAT, "at most 8 dimensions");
    // Absurd shapes: overflowing products and sizes beyond the file, refused before
    // any allocation of their size.
    CHECK_ERR(parse_dict_text("{'descr': '<f8', 'fortran_order': False, 'shape': "
                              "(4294967296, 4294967296)}",
                              0, &a),
              DT_ERR_FORMAT, "overflows");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': "
                              "(99999999999999999999,)}",
                              0, &a),
              DT_ERR_FORMAT, "overflows 64 bits");
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': "
                              "(1000000000, 1000)}",
                              16, &a),
              DT_ERR_FORMAT,
              "expected 4000000000000 bytes for shape (1000000000, 1000) of <f4, "
              "found 16");
    // Truncated and over-long data.
    CHECK_ERR(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 23, &a),
              DT_ERR_FORMAT,
              "truncated npy data: expected 24 bytes for shape (2, 3) of <f4, "
              "found 23");
    CHECK_ERR(parse_dict_text("{'descr': '<i8', 'fortran_order': False, 'shape': (2,)}", 17, &a),
              DT_ERR_FORMAT, "extra bytes after the npy data: expected 16 bytes");
    CHECK(a.data == NULL && a.ndim == 0);
}

static void test_preamble(void) {
    uint8_t buf[256];
    size_t n = build(buf, sizeof buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4);
    dt_npy a;
    CHECK_OK(dt_npy_parse(buf, n, "mem", &a));
    dt_npy_free(&a);
    CHECK_ERR(dt_npy_parse(buf, 5, "mem", &a), DT_ERR_FORMAT, "shorter than the 8-byte preamble");
    buf[1] = 'X';
    CHECK_ERR(dt_npy_parse(buf, n, "mem", &a), DT_ERR_FORMAT, "expected the npy magic");
    buf[1] = 'N';
    buf[6] = 4;
    CHECK_ERR(dt_npy_parse(buf, n, "mem", &a), DT_ERR_FORMAT, "version 1.0, 2.0 or 3.0, found 4.0");
    buf[6] = 1;
    buf[7] = 1;
    CHECK_ERR(dt_npy_parse(buf, n, "mem", &a), DT_ERR_FORMAT, "found 1.1");
    buf[7] = 0;
    // Header cut short, header length absurd, a non-ASCII byte in the header.
    CHECK_ERR(dt_npy_parse(buf, 30, "mem", &a), DT_ERR_FORMAT, "truncated npy header");
    buf[9] = 0xff;
    CHECK_ERR(dt_npy_parse(buf, n, "mem", &a), DT_ERR_FORMAT, "truncated npy header");
    uint8_t v2[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0x7f};
    CHECK_ERR(dt_npy_parse(v2, sizeof v2, "mem", &a), DT_ERR_FORMAT, "at most 65536 bytes");
    buf[9]  = 0;
    buf[20] = 0xe9;
    CHECK_ERR(dt_npy_parse(buf, n, "mem", &a), DT_ERR_FORMAT, "byte 0xe9 at offset 20");
    // Every truncation of a real numpy file fails cleanly.
    FILE   *f = fopen(FIX "npy_f4_fortran_2x3x4.npy", "rb");
    uint8_t file[512];
    size_t  len = f ? fread(file, 1, sizeof file, f) : 0;
    if (f)
        fclose(f);
    CHECK(len == 224);
    size_t bad = 0;
    for (size_t k = 0; k < len; k++) {
        dt_status st = dt_npy_parse(file, k, "cut", &a);
        bad += st != DT_ERR_FORMAT || strncmp(dt_last_error(), "cut: ", 5) != 0 || a.data;
    }
    CHECK_EQ(bad, 0);
    CHECK_OK(dt_npy_parse(file, len, "whole", &a));
    dt_npy_free(&a);
}

static void test_file_truncated(void) {
    char dir[] = "/tmp/dt_npy_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/cut.npy", dir);
    uint8_t buf[256];
    size_t  n =
        build(buf, sizeof buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (5,)}", 20);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n - 3, f) == n - 3);
    if (f)
        fclose(f);
    dt_npy a;
    CHECK_ERR(dt_npy_read(path, &a), DT_ERR_FORMAT,
              "expected 20 bytes for shape (5,) of <i4, found 17");
    f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n);
    if (f)
        fclose(f);
    CHECK_OK(dt_npy_read(path, &a));
    CHECK(a.count == 5 && ((int32_t *)a.data)[1] == 0x07060504);
    dt_npy_free(&a);
    remove(path);
    rmdir(dir);
}

static void test_convert(void) {
    dt_npy a;
    CHECK_OK(dt_npy_read(FIX "npy_i8_3x2.npy", &a));
    CHECK_OK(dt_npy_convert(&a, DT_NPY_I32, "labels"));
    CHECK(a.dtype == DT_NPY_I32 && a.elem_size == 4 && a.nbytes == 24);
    CHECK_EQ(((int32_t *)a.data)[5], 5 * 7 - 11);
    CHECK_OK(dt_npy_convert(&a, DT_NPY_F32, "labels"));
    CHECK(((float *)a.data)[0] == -11.0f);
    CHECK_ERR(dt_npy_convert(&a, DT_NPY_I32, "labels"), DT_ERR_FORMAT, "expected integer data");
    dt_npy_free(&a);
    CHECK_OK(dt_npy_read(FIX "npy_i4_7.npy", &a)); // -11, -4, 3, ...
    CHECK_ERR(dt_npy_convert(&a, DT_NPY_U8, "labels"), DT_ERR_FORMAT, "found -11 at element 0");
    CHECK(a.dtype == DT_NPY_I32); // unchanged on failure
    dt_npy_free(&a);
    CHECK_OK(dt_npy_read(FIX "npy_f8_5.npy", &a));
    CHECK_OK(dt_npy_convert(&a, DT_NPY_F32, NULL));
    CHECK(((float *)a.data)[4] == -1.0f);
    dt_npy_free(&a);
    CHECK(strcmp(dt_npy_dtype_name(DT_NPY_U16), "<u2") == 0);
}

int main(void) {
    RUN(test_numpy_files);
    RUN(test_refused_dtypes);
    RUN(test_headers);
    RUN(test_preamble);
    RUN(test_file_truncated);
    RUN(test_convert);
    return check_summary();
}
