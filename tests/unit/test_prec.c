// test_prec.c: 16-bit conversions and the bf16 GEMM (nn/prec.h) on every path this CPU
// has, the fp32 fallback included.
#include "../check.h"
#include "nn/prec.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { // uniform in [-1, 1)
    return (float)((double)rnd32() / 2147483648.0 - 1.0);
}
static float bits_f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// Hand-computed roundings.
static void test_bf16_values(void) {
    CHECK_EQ(dt_f32_to_bf16_1(1.0f), 0x3f80);
    CHECK_EQ(dt_f32_to_bf16_1(-2.0f), 0xc000);
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x3f808000)), 0x3f80); // tie, even below
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x3f818000)), 0x3f82); // tie, even above
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x3f808001)), 0x3f81); // just above the tie
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x7f7fffff)), 0x7f80); // FLT_MAX rounds to inf
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x7f800000)), 0x7f80);
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x7f800001)), 0x7fc0); // sNaN -> qNaN, not inf
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0xffc12345)), 0xffc1);
    CHECK_EQ(dt_f32_to_bf16_1(bits_f(0x00018000)), 0x0002); // denormal tie to even (up)
    CHECK_EQ(dt_f32_to_bf16_1(-0.0f), 0x8000);
    CHECK(dt_bf16_to_f32_1(0x3f81) == 1.0078125f);
}

static void test_f16_values(void) {
    CHECK_EQ(dt_f32_to_f16_1(1.0f), 0x3c00);
    CHECK_EQ(dt_f32_to_f16_1(-2.5f), 0xc100);
    CHECK_EQ(dt_f32_to_f16_1(65504.0f), 0x7bff);
    CHECK_EQ(dt_f32_to_f16_1(65519.99f), 0x7bff);
    CHECK_EQ(dt_f32_to_f16_1(65520.0f), 0x7c00); // tie above the max: to even = inf
    CHECK_EQ(dt_f32_to_f16_1(1e10f), 0x7c00);
    CHECK_EQ(dt_f32_to_f16_1(0x1p-14f), 0x0400);          // smallest normal
    CHECK_EQ(dt_f32_to_f16_1(0x1p-24f), 0x0001);          // smallest denormal
    CHECK_EQ(dt_f32_to_f16_1(0x1p-25f), 0x0000);          // tie: to even (0)
    CHECK_EQ(dt_f32_to_f16_1(0x1.8p-25f), 0x0001);        // above the tie
    CHECK_EQ(dt_f32_to_f16_1(0x1.8p-24f), 0x0002);        // 1.5 units: tie to even (2)
    CHECK_EQ(dt_f32_to_f16_1(0x1.4p-24f), 0x0001);        // 1.25 units
    CHECK_EQ(dt_f32_to_f16_1(-0x1p-30f), 0x8000);         // underflow keeps the sign
    CHECK_EQ(dt_f32_to_f16_1(1.0f + 0x1p-11f), 0x3c00);   // tie, even below
    CHECK_EQ(dt_f32_to_f16_1(1.0f + 0x1.8p-10f), 0x3c02); // tie, even above
    CHECK_EQ(dt_f32_to_f16_1(bits_f(0x7f800001)), 0x7e00);
    CHECK_EQ(dt_f32_to_f16_1(bits_f(0xff800000)), 0xfc00);
    CHECK(dt_f16_to_f32_1(0x0001) == 0x1p-24f);
    CHECK(dt_f16_to_f32_1(0x03ff) == 0x3ffp-24f);
    CHECK(dt_f16_to_f32_1(0xfbff) == -65504.0f);
    CHECK(isnan(dt_f16_to_f32_1(0x7e00)));
}

// (That every target's conversion rows give these functions' bits is tests/kernels/
// test_half's.)

// ------------------------------------------------------------------ GEMM
// Checks one product on one path. A is (m, k) (stored (k, m) when ta), B (k, n), with
// row strides padded by 3 so that ld != width is exercised; C starts random when
// accumulating.
//  (1) against the exact product of the bf16 inputs (double): the products are exact
//      in fp32 (8 + 8 significant bits), so only fp32 summation errs: at most
//      gamma_k = k u / (1 - k u), u = 2^-24, times sum |a||b| (plus |c0| u per step of
//      the accumulation); we allow (k + 4) 2^-23 sum |a||b| for the pairwise sums of
//      VDPBF16PS.
//  (2) against fp32 inputs before rounding (what a layer's fp32 product would be):
//      each input moved by at most u = 2^-8 relative (bf16 keeps 8 significant bits),
//      a product by at most 2u + u^2, so |error| <= (2^-7 + 2^-16) sum |a||b| + (1).
// AMX's software model instead of the path's code (tests the AMX driver and packing
// on any CPU).
static bool use_amx_model;

static dt_status run_gemm(dt_prec_path path, bool ta, bool tb, int m, int n, int k, const void *a,
                          int lda, bool af, const void *b, int ldb, bool bf, float *c, int ldc,
                          bool acc) {
#if defined(__x86_64__) // the amx folder is built on x86-64 only
    if (use_amx_model)
        return dt_gemm_amx(true, ta, tb, m, n, k, (dt_gemm_opnd){a, (size_t)lda, af},
                           (dt_gemm_opnd){b, (size_t)ldb, bf}, c, ldc, acc);
#endif
    return dt_gemm_bf16_mixed(path, ta, tb, m, n, k, a, lda, af, b, ldb, bf, c, ldc, acc);
}

static int gemm_case(dt_prec_path path, bool ta, bool tb, int m, int n, int k, bool acc) {
    int       lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 3, ldc = n + 5;
    size_t    asz = (size_t)(ta ? k : m) * lda, bsz = (size_t)(tb ? n : k) * ldb;
    float    *af = malloc(sizeof(float) * (asz + 1)), *bf = malloc(sizeof(float) * (bsz + 1));
    uint16_t *a = malloc(2 * (asz + 1)), *b = malloc(2 * (bsz + 1));
    float    *c = malloc(sizeof(float) * ((size_t)m * ldc + 1)),
          *c0   = malloc(sizeof(float) * ((size_t)m * ldc + 1));
    for (size_t i = 0; i < asz; i++)
        af[i] = rndf() * 3, a[i] = dt_f32_to_bf16_1(af[i]);
    for (size_t i = 0; i < bsz; i++)
        bf[i] = rndf(), b[i] = dt_f32_to_bf16_1(bf[i]);
    for (size_t i = 0; i < (size_t)m * ldc; i++)
        c[i] = c0[i] = rndf();
    if (use_amx_model)
        CHECK_OK(run_gemm(path, ta, tb, m, n, k, a, lda, false, b, ldb, false, c, ldc, acc));
    else
        CHECK_OK(dt_gemm_bf16_path(path, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc));
    int bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double exact = acc ? c0[(size_t)i * ldc + j] : 0, ref32 = exact, mag = 0;
            for (int p = 0; p < k; p++) {
                size_t ia = ta ? (size_t)p * lda + i : (size_t)i * lda + p;
                size_t ib = tb ? (size_t)j * ldb + p : (size_t)p * ldb + j;
                exact += (double)dt_bf16_to_f32_1(a[ia]) * dt_bf16_to_f32_1(b[ib]);
                ref32 += (double)af[ia] * bf[ib];
                mag += fabs((double)af[ia] * bf[ib]);
            }
            double got = c[(size_t)i * ldc + j];
            double t1  = (k + 4) * 0x1p-23 * (mag * 1.01 + fabs(exact)) + 1e-30;
            double t2  = (0x1p-7 + 0x1p-16) * mag * 1.01 + t1;
            if (!(fabs(got - exact) <= t1) || !(fabs(got - ref32) <= t2)) {
                if (bad++ < 3)
                    fprintf(stderr,
                            "  %s %c%c %dx%dx%d acc=%d: C[%d][%d] = %.9g, exact %.9g (tol %.3g), "
                            "fp32 %.9g (tol %.3g)\n",
                            dt_prec_path_name(path), ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, acc,
                            i, j, got, exact, t1, ref32, t2);
            }
        }
    // fp32 operands rounded while packing: the same bits as converting them first
    float *c2 = malloc(sizeof(float) * ((size_t)m * ldc + 1));
    for (int v = 1; v < 4; v++) {
        memcpy(c2, c0, sizeof(float) * (size_t)m * ldc);
        CHECK_OK(run_gemm(path, ta, tb, m, n, k, v & 1 ? (const void *)af : a, lda, v & 1,
                          v & 2 ? (const void *)bf : b, ldb, v & 2, c2, ldc, acc));
        for (int i = 0; i < m; i++)
            bad += memcmp(c2 + (size_t)i * ldc, c + (size_t)i * ldc, sizeof(float) * n) != 0;
    }
    free(c2);
    // padding past n in each row untouched
    for (int i = 0; i < m; i++)
        for (int j = n; j < ldc; j++)
            bad += c[(size_t)i * ldc + j] != c0[(size_t)i * ldc + j];
    free(af), free(bf), free(a), free(b), free(c), free(c0);
    return bad;
}

static void test_gemm_paths(void) {
    static const int shapes[][3] = {{1, 1, 1},      {17, 33, 65},   {8, 48, 2},     {9, 49, 3},
                                    {3, 5, 7},      {96, 768, 256}, {97, 769, 257}, {130, 17, 600},
                                    {64, 128, 384}, {33, 100, 1},   {5, 200, 513},  {7, 64, 40},
                                    {20, 112, 6}}; // n 64, 112: 32 + 32 panels
    int              nshapes     = (int)(sizeof shapes / sizeof shapes[0]);
    for (int p = 0; p < DT_PATH_COUNT_; p++) {
        if (!dt_prec_path_supported((dt_prec_path)p)) {
            fprintf(stderr, "path %s: not on this CPU, skipped\n",
                    dt_prec_path_name((dt_prec_path)p));
            continue;
        }
        fprintf(stderr, "path %s: tested\n", dt_prec_path_name((dt_prec_path)p));
        int bad = 0;
        for (int s = 0; s < nshapes; s++)
            for (int t = 0; t < 4; t++)
                bad += gemm_case((dt_prec_path)p, t & 1, t & 2, shapes[s][0], shapes[s][1],
                                 shapes[s][2], (s + t) & 1);
        CHECK_EQ(bad, 0);
    }
}

// The AMX driver and packing through the software model of the tiles (any x86-64 CPU), on
// shapes that cross the 32-row, 32-column, 32-deep and KC = 256 boundaries.
static void test_gemm_amx_model(void) {
#if !defined(__x86_64__)
    return; // no amx folder on other machine families
#endif
    static const int shapes[][3] = {{1, 1, 1},     {17, 33, 65},  {32, 32, 32}, {33, 31, 257},
                                    {40, 70, 300}, {5, 100, 513}, {64, 16, 0}};
    use_amx_model                = true;
    int bad                      = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            bad += gemm_case(DT_PATH_FP32, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2],
                             (s + (size_t)t) & 1);
    use_amx_model = false;
    CHECK_EQ(bad, 0);
    fprintf(stderr, "AMX tiles usable here: %s\n", dt_amx_usable() ? "yes" : "no");
}

// Two paths agree with each other within the summation tolerance, and the avx512bf16
// path is reproducible bit for bit.
static void test_gemm_reproducible(void) {
    if (!dt_prec_path_supported(DT_PATH_AVX512BF16))
        return;
    int       m = 37, n = 70, k = 300;
    uint16_t *a = malloc(2 * (size_t)m * k), *b = malloc(2 * (size_t)k * n);
    float    *c1 = malloc(4 * (size_t)m * n), *c2 = malloc(4 * (size_t)m * n);
    for (int i = 0; i < m * k; i++)
        a[i] = dt_f32_to_bf16_1(rndf());
    for (int i = 0; i < k * n; i++)
        b[i] = dt_f32_to_bf16_1(rndf());
    CHECK_OK(
        dt_gemm_bf16_path(DT_PATH_AVX512BF16, false, false, m, n, k, a, k, b, n, c1, n, false));
    CHECK_OK(
        dt_gemm_bf16_path(DT_PATH_AVX512BF16, false, false, m, n, k, a, k, b, n, c2, n, false));
    CHECK(memcmp(c1, c2, 4 * (size_t)m * n) == 0);
    free(a), free(b), free(c1), free(c2);
}

// k = 0: C = 0 or unchanged.
static void test_gemm_empty_k(void) {
    float    c[6] = {1, 2, 3, 4, 5, 6};
    uint16_t z    = 0;
    CHECK_OK(dt_gemm_bf16(false, false, 2, 3, 0, &z, 1, &z, 3, c, 3, true));
    CHECK(c[5] == 6.0f);
    CHECK_OK(dt_gemm_bf16(false, false, 2, 3, 0, &z, 1, &z, 3, c, 3, false));
    CHECK(c[0] == 0.0f && c[5] == 0.0f);
}

// DT_PRECISION_PATH, read in a fresh process: forcing fp32 works on every machine; an
// unknown name and a path the CPU lacks are errors naming the value.
static int child_path(const char *value, int *path, int *status) {
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        setenv("DT_PRECISION_PATH", value, 1);
        execl("/proc/self/exe", "test_prec", "--report-path", (char *)NULL);
        _exit(3);
    }
    close(fd[1]);
    char    buf[64] = {0};
    ssize_t got     = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return got > 0 && sscanf(buf, "%d %d", status, path) == 2 && WIFEXITED(st) &&
                   WEXITSTATUS(st) == 0
               ? 0
               : -1;
}

// dt_gemm_bf16_bias: bitwise C = bias, then C += op(A) op(B), on every path this CPU has
// (the avx512bf16 path starts its sums from the bias; the others add to a copy of it).
static void test_gemm_bias(void) {
    static const int shapes[][3] = {{1, 1, 1}, {9, 49, 3}, {17, 33, 64}, {130, 100, 256}};
    for (int p = 0; p < DT_PATH_COUNT_; p++) {
        if (p == DT_PATH_AMX || !dt_prec_path_supported((dt_prec_path)p))
            continue;
        CHECK_OK(dt_prec_path_set((dt_prec_path)p));
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++) {
                int       m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                bool      ta = t & 1, tb = t & 2;
                int       lda = ta ? m : k, ldb = tb ? k : n;
                uint16_t *a = malloc(2 * (size_t)m * k), *b = malloc(2 * (size_t)k * n);
                float    *bias = malloc(4 * (size_t)n), *c1 = malloc(4 * (size_t)m * n),
                      *c2 = malloc(4 * (size_t)m * n);
                for (int i = 0; i < m * k; i++)
                    a[i] = dt_f32_to_bf16_1(rndf());
                for (int i = 0; i < k * n; i++)
                    b[i] = dt_f32_to_bf16_1(rndf());
                for (int j = 0; j < n; j++)
                    bias[j] = rndf() * 4;
                for (int i = 0; i < m; i++)
                    memcpy(c2 + (size_t)i * n, bias, 4 * (size_t)n);
                CHECK_OK(dt_gemm_bf16_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c1, n));
                CHECK_OK(dt_gemm_bf16(ta, tb, m, n, k, a, lda, b, ldb, c2, n, true));
                CHECK(memcmp(c1, c2, 4 * (size_t)m * n) == 0);
                free(a), free(b), free(bias), free(c1), free(c2);
            }
    }
    CHECK_OK(dt_prec_path_set(dt_prec_path_supported(DT_PATH_AVX512BF16) ? DT_PATH_AVX512BF16
                                                                         : DT_PATH_FP32));
}

static void test_env_forcing(void) {
    int path, st;
    CHECK_EQ(child_path("fp32", &path, &st), 0);
    CHECK_EQ(st, DT_OK);
    CHECK_EQ(path, DT_PATH_FP32);
    CHECK_EQ(child_path("auto", &path, &st), 0);
    CHECK_EQ(path, dt_prec_path_supported(DT_PATH_AVX512BF16) ? DT_PATH_AVX512BF16 : DT_PATH_FP32);
    CHECK_EQ(child_path("tf32", &path, &st), 0);
    CHECK_EQ(st, DT_ERR_ARG);
    CHECK_EQ(path, DT_PATH_FP32);
    CHECK_EQ(child_path("amx", &path, &st), 0); // opt-in; refused where unusable
    CHECK_EQ(st, dt_amx_usable() ? DT_OK : DT_ERR_ARG);
    CHECK_EQ(path, dt_amx_usable() ? DT_PATH_AMX : DT_PATH_FP32);
    CHECK_EQ(child_path("auto", &path, &st), 0); // auto never picks AMX
    CHECK(path != DT_PATH_AMX);
    if (dt_prec_path_supported(DT_PATH_AVX512BF16)) {
        CHECK_EQ(child_path("avx512bf16", &path, &st), 0);
        CHECK_EQ(path, DT_PATH_AVX512BF16);
    }
    if (!dt_amx_usable())
        CHECK_ERR(dt_prec_path_set(DT_PATH_AMX), DT_ERR_ARG, "amx");
    CHECK_OK(dt_prec_path_set(DT_PATH_FP32));
    CHECK_EQ(dt_prec_path_get(), DT_PATH_FP32);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--report-path") == 0) { // child of test_env_forcing
        int st = (int)dt_prec_path_init();
        printf("%d %d\n", st, (int)dt_prec_path_get());
        return 0;
    }
    RUN(test_bf16_values);
    RUN(test_f16_values);
    RUN(test_gemm_paths);
    RUN(test_gemm_amx_model);
    RUN(test_gemm_reproducible);
    RUN(test_gemm_empty_k);
    RUN(test_gemm_bias);
    RUN(test_env_forcing);
    return check_summary();
}
