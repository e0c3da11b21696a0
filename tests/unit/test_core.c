// test_core.c: errors, number parsing, allocation, CRC32C, the Philox RNG and tensors.
#include "../check.h"
#include "dtrain/rng.h"
#include "dtrain/tensor.h"

#include <stdlib.h>

static void test_errors(void) {
    dt_clear_error();
    CHECK(dt_last_status() == DT_OK);
    CHECK_EQ(strlen(dt_last_error()), 0);
    dt_status s = dt_fail(DT_ERR_FORMAT, "file %s: expected %d, found %d", "x.idx", 3, 4);
    CHECK(s == DT_ERR_FORMAT);
    CHECK(strcmp(dt_last_error(), "file x.idx: expected 3, found 4") == 0);
    dt_fail_context("loading %s", "dataset");
    CHECK(strcmp(dt_last_error(), "loading dataset: file x.idx: expected 3, found 4") == 0);
    CHECK(dt_last_status() == DT_ERR_FORMAT);
    CHECK(strcmp(dt_status_str(DT_ERR_PEER), "DT_ERR_PEER") == 0);
    CHECK(strcmp(dt_status_str((dt_status)999), "DT_ERR_UNKNOWN") == 0);
    // A message built from the previous message must not corrupt itself.
    dt_fail(DT_ERR_IO, "%s", "abc");
    dt_fail(DT_ERR_IO, "%s/%s", dt_last_error(), dt_last_error());
    CHECK(strcmp(dt_last_error(), "abc/abc") == 0);
}

static void test_parse(void) {
    long   v;
    double d;
    CHECK_OK(dt_parse_long("42", 1, 100, "--n", &v));
    CHECK_EQ(v, 42);
    CHECK_ERR(dt_parse_long("4x", 1, 100, "--n", &v), DT_ERR_ARG,
              "--n expects an integer in [1, 100], found \"4x\"");
    CHECK_ERR(dt_parse_long("101", 1, 100, "--n", &v), DT_ERR_ARG, "found \"101\"");
    CHECK_ERR(dt_parse_long("", 1, 100, "--n", &v), DT_ERR_ARG, "found nothing");
    CHECK_ERR(dt_parse_long("99999999999999999999", 1, 100, "--n", &v), DT_ERR_ARG, "--n");
    CHECK_OK(dt_parse_double("0.5", 0, 10, "--lr", &d));
    CHECK_NEAR(d, 0.5, 0);
    CHECK_ERR(dt_parse_double("nan", 0, 10, "--lr", &d), DT_ERR_ARG, "--lr expects a number");
    setenv("DT_TEST_ENV", "17", 1);
    CHECK_OK(dt_env_int("DT_TEST_ENV", 0, 20, 5, &v));
    CHECK_EQ(v, 17);
    unsetenv("DT_TEST_ENV");
    CHECK_OK(dt_env_int("DT_TEST_ENV", 0, 20, 5, &v));
    CHECK_EQ(v, 5);
    setenv("DT_TEST_ENV", "seventeen", 1);
    CHECK_ERR(dt_env_int("DT_TEST_ENV", 0, 20, 5, &v), DT_ERR_ARG, "DT_TEST_ENV expects");
}

static void test_alloc(void) {
    size_t live = dt_alloc_live_count();
    float *p    = dt_alloc(1000 * sizeof(float));
    CHECK(p != NULL);
    CHECK(((uintptr_t)p & 63) == 0);
    CHECK_EQ(dt_alloc_live_count(), live + 1);
    void *z = dt_alloc(0);
    CHECK(z != NULL);
    unsigned char *q       = dt_alloc_zero(77);
    int            allzero = 1;
    for (int i = 0; i < 77; i++)
        allzero &= q[i] == 0;
    CHECK(allzero);
    dt_free(p);
    dt_free(z);
    dt_free(q);
    dt_free(NULL);
    CHECK_EQ(dt_alloc_live_count(), live);
    void *huge = dt_alloc(SIZE_MAX - 10);
    CHECK(huge == NULL);
    CHECK(dt_last_status() == DT_ERR_NOMEM);
    size_t a;
    CHECK(!dt_size_mul(&a, SIZE_MAX / 2, 3));
    CHECK(dt_size_mul(&a, 1000, 1000) && a == 1000000);
}

static void test_crc32c(void) {
    // Standard check value of CRC-32C (RFC 3720 appendix B.4 family).
    CHECK_EQ(dt_crc32c(0, "123456789", 9), 0xE3069283u);
    unsigned char zeros[32] = {0};
    CHECK_EQ(dt_crc32c(0, zeros, 32), 0x8A9136AAu); // RFC 3720 B.4: 32 bytes of zeros
    // Continuing a CRC equals computing it at once, at every split point.
    const char *s     = "the quick brown fox jumps over the lazy dog";
    uint32_t    whole = dt_crc32c(0, s, strlen(s));
    int         same  = 1;
    for (size_t k = 0; k <= strlen(s); k++)
        same &= dt_crc32c(dt_crc32c(0, s, k), s + k, strlen(s) - k) == whole;
    CHECK(same);
}

static void test_philox_kat(void) {
    // Known-answer vectors of Random123 (kat_vectors: counter, key -> output).
    uint32_t out[4];
    uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    dt_philox4x32_10(c0, k0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu &&
          out[3] == 0x9b00dbd8u);
    uint32_t c1[4] = {~0u, ~0u, ~0u, ~0u}, k1[2] = {~0u, ~0u};
    dt_philox4x32_10(c1, k1, out);
    CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u &&
          out[3] == 0x6d5451fdu);
    uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    uint32_t k2[2] = {0xa4093822u, 0x299f31d0u};
    dt_philox4x32_10(c2, k2, out);
    CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u &&
          out[3] == 0x24126ea1u);
}

static void test_rng_streams(void) {
    // Stream = Philox blocks of (counter 0, 1, ...) under key = seed.
    dt_rng   r = dt_rng_init(0);
    uint32_t first[4];
    for (int i = 0; i < 4; i++)
        first[i] = dt_rng_u32(&r);
    CHECK(first[0] == 0x6627e8d5u && first[3] == 0x9b00dbd8u);
    // Determinism and independence of split streams.
    dt_rng a = dt_rng_init(1234), b = dt_rng_init(1234);
    dt_rng a1 = dt_rng_split(&a, 7), b1 = dt_rng_split(&b, 7), a2 = dt_rng_split(&a, 8);
    int    same = 1, differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint32_t x = dt_rng_u32(&a1), y = dt_rng_u32(&b1), z = dt_rng_u32(&a2);
        same &= x == y;
        differ += x != z;
    }
    CHECK(same);
    CHECK(differ > 990);
    // uniform in [0, 1) with mean 1/2 and variance 1/12 (n = 1e5: 5 sigma bounds).
    dt_rng u = dt_rng_init(99);
    double s = 0, s2 = 0;
    int    inrange = 1;
    int    n       = 100000;
    for (int i = 0; i < n; i++) {
        float x = dt_rng_uniform(&u);
        inrange &= x >= 0.0f && x < 1.0f;
        s += x;
        s2 += (double)x * x;
    }
    CHECK(inrange);
    CHECK_NEAR(s / n, 0.5, 5 * sqrt(1.0 / 12 / n));
    CHECK_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.003);
    // normal: mean 0, variance 1
    double m = 0, v = 0;
    for (int i = 0; i < n; i++) {
        double x = dt_rng_normal(&u);
        m += x;
        v += x * x;
    }
    CHECK_NEAR(m / n, 0.0, 5 / sqrt(n));
    CHECK_NEAR(v / n, 1.0, 0.03);
    // below(n): every residue, chi-square with 9 dof below 30 (p ~ 4e-4).
    int counts[10] = {0};
    for (int i = 0; i < n; i++)
        counts[dt_rng_below(&u, 10)]++;
    double chi = 0;
    for (int i = 0; i < 10; i++)
        chi += (counts[i] - n / 10.0) * (counts[i] - n / 10.0) / (n / 10.0);
    CHECK(chi < 30);
    // permutation: a bijection, and not the identity
    uint32_t perm[1000];
    int      seen[1000] = {0};
    dt_rng_permutation(&u, perm, 1000);
    int ok = 1, fixed = 0;
    for (int i = 0; i < 1000; i++) {
        ok &= perm[i] < 1000 && !seen[perm[i]];
        if (perm[i] < 1000)
            seen[perm[i]] = 1;
        fixed += perm[i] == (uint32_t)i;
    }
    CHECK(ok);
    CHECK(fixed < 10);
}

static void test_tensor(void) {
    dt_tensor t;
    int64_t   shape[3] = {2, 3, 4};
    CHECK_OK(dt_tensor_init(&t, 3, shape));
    CHECK_EQ(t.numel, 24);
    CHECK(((uintptr_t)t.data & 63) == 0);
    dt_tensor_fill(&t, 2.5f);
    CHECK(t.data[23] == 2.5f);
    int64_t flat[1] = {24};
    CHECK_OK(dt_tensor_reshape(&t, 1, flat));
    int64_t bad[2] = {5, 5};
    CHECK_ERR(dt_tensor_reshape(&t, 2, bad), DT_ERR_ARG, "holds 24 elements, new shape holds 25");
    char buf[64];
    CHECK(strcmp(dt_tensor_shape_str(&t, buf, sizeof buf), "(24)") == 0);
    dt_tensor v;
    float     mem[24] = {0};
    CHECK_OK(dt_tensor_view(&v, mem, 3, shape));
    CHECK_OK(dt_tensor_copy(&v, &t));
    CHECK(mem[0] == 2.5f && mem[23] == 2.5f);
    dt_tensor_free(&v); // a view frees nothing
    CHECK(mem[5] == 2.5f);
    dt_tensor_free(&t);
    CHECK(t.data == NULL);
    int64_t neg[2] = {3, -1};
    CHECK_ERR(dt_tensor_init(&t, 2, neg), DT_ERR_ARG, "negative");
    int64_t over[4] = {1ll << 40, 1ll << 40, 1ll << 40, 1};
    CHECK_ERR(dt_tensor_init(&t, 4, over), DT_ERR_ARG, "overflows");
}

int main(void) {
    RUN(test_errors);
    RUN(test_parse);
    RUN(test_alloc);
    RUN(test_crc32c);
    RUN(test_philox_kat);
    RUN(test_rng_streams);
    RUN(test_tensor);
    return check_summary();
}
