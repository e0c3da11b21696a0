// bf16.c: fp32 <-> bf16 and fp32 <-> fp16 conversions, and the choice of the
// mixed-precision path (prec.h).
//
// bf16 conversions are integer operations (round to nearest even by adding 0x7fff plus
// the lowest kept bit); GCC vectorises them in the DT_CLONES versions. The hardware's
// VCVTNEPS2BF16 is not used: it treats denormal inputs as zero, which would make the
// bits depend on the CPU. fp16 conversions use VCVTPS2PH / VCVTPH2PS (AVX-512F, or F16C
// on 8 lanes), which round to nearest even like the scalar code; tests check that every
// path gives the scalar code's bits.
#include "nn/prec.h"

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------ scalar reference
static inline uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t dt_f32_to_bf16_1(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); // NaN: quiet, sign and top payload kept
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float dt_bf16_to_f32_1(uint16_t h) {
    return u2f((uint32_t)h << 16);
}

uint16_t dt_f32_to_f16_1(float x) {
    uint32_t u = f2u(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) // NaN: quiet, top 10 payload bits kept (as VCVTPS2PH does)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) // >= 65520 (half-way above 65504, the largest fp16): infinity
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { // normal in fp16 (>= 2^-14): rebias the exponent, round
        uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) // <= 2^-25: half the smallest denormal or less, rounds to 0
        return (uint16_t)sign;
    // fp16 denormal: the value in units of 2^-24 is mant * 2^(e - 126), e in [102, 112]
    uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

float dt_f16_to_f32_1(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) // infinity, or NaN made quiet (as VCVTPH2PS does)
        return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0)
        return u2f(sign | f2u((float)m * 0x1p-24f)); // zero or denormal: exact
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

// ------------------------------------------------------------------ vector loops
DT_CLONES void dt_f32_to_bf16(const float *restrict src, uint16_t *restrict dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        dt_f32_to_bf16_16(src + i, dst + i);
    for (; i < n; i++)
        dst[i] = dt_f32_to_bf16_1(src[i]);
}

DT_CLONES void dt_bf16_to_f32(const uint16_t *restrict src, float *restrict dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        dt_v16h h;
        __builtin_memcpy(&h, src + i, sizeof h);
        dt_v16u u = __builtin_convertvector(h, dt_v16u) << 16;
        __builtin_memcpy(dst + i, &u, sizeof u);
    }
    for (; i < n; i++)
        dst[i] = dt_bf16_to_f32_1(src[i]);
}

DT_CLONES void dt_f32_round_bf16(const float *restrict src, float *restrict dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        dt_v16u u;
        __builtin_memcpy(&u, src + i, sizeof u);
        u = dt_round_bf16_v16(u);
        __builtin_memcpy(dst + i, &u, sizeof u);
    }
    for (; i < n; i++)
        dst[i] = dt_bf16_to_f32_1(dt_f32_to_bf16_1(src[i]));
}

void dt_f32_to_f16_scalar(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}

void dt_f16_to_f32_scalar(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_X86 1
#define ROUND_NE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

__attribute__((target("avx512f"))) static void f32_to_f16_avx512(const float *src, uint16_t *dst,
                                                                 size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), ROUND_NE));
    for (; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}
__attribute__((target("avx512f"))) static void f16_to_f32_avx512(const uint16_t *src, float *dst,
                                                                 size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), ROUND_NE));
    for (; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}
#endif

typedef enum { CONV_SCALAR, CONV_F16C, CONV_AVX512 } conv_kind;

#ifdef HAVE_X86
// F16C (CPUID.1:ECX bit 29) with AVX enabled by the OS (not every compiler's
// __builtin_cpu_supports knows "f16c").
static bool has_f16c(void) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static int conv_forced = -1; // dt_f16_conv_set; -1: automatic

static conv_kind conv_choice(void) {
    int forced = __atomic_load_n(&conv_forced, __ATOMIC_RELAXED);
    if (forced >= 0)
        return (conv_kind)forced;
#ifdef HAVE_X86
    if (dt_prec_path_get() == DT_PATH_FP32) // the forced fallback uses no special unit
        return CONV_SCALAR;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return CONV_AVX512;
    if (has_f16c())
        return CONV_F16C;
#endif
    return CONV_SCALAR;
}

const char *dt_f16_conv_path(void) {
    static const char *names[] = {"scalar", "f16c", "avx512f"};
    return names[conv_choice()];
}

dt_status dt_f16_conv_set(const char *name) {
    static const char *names[] = {"scalar", "f16c", "avx512f"};
    if (!name || strcmp(name, "auto") == 0) {
        __atomic_store_n(&conv_forced, -1, __ATOMIC_RELAXED);
        return DT_OK;
    }
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            bool ok = i == CONV_SCALAR;
#ifdef HAVE_X86
            __builtin_cpu_init();
            ok = ok || (i == CONV_F16C && has_f16c()) ||
                 (i == CONV_AVX512 && __builtin_cpu_supports("avx512f"));
#endif
            if (!ok)
                return dt_fail(DT_ERR_ARG, "fp16 conversions: %s is not available on this CPU",
                               name);
            __atomic_store_n(&conv_forced, i, __ATOMIC_RELAXED);
            return DT_OK;
        }
    return dt_fail(DT_ERR_ARG,
                   "fp16 conversions: expected auto, scalar, f16c or avx512f; found "
                   "\"%.40s\"",
                   name);
}

void dt_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    switch (conv_choice()) {
#ifdef HAVE_X86
    case CONV_AVX512:
        f32_to_f16_avx512(src, dst, n);
        return;
    case CONV_F16C:
        f32_to_f16_f16c(src, dst, n);
        return;
#endif
    default:
        dt_f32_to_f16_scalar(src, dst, n);
    }
}

void dt_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    switch (conv_choice()) {
#ifdef HAVE_X86
    case CONV_AVX512:
        f16_to_f32_avx512(src, dst, n);
        return;
    case CONV_F16C:
        f16_to_f32_f16c(src, dst, n);
        return;
#endif
    default:
        dt_f16_to_f32_scalar(src, dst, n);
    }
}

// ------------------------------------------------------------------ path choice
static const char *const path_names[DT_PATH_COUNT_] = {"fp32", "avx512bf16", "amx"};

const char *dt_prec_path_name(dt_prec_path p) {
    return (unsigned)p < DT_PATH_COUNT_ ? path_names[p] : "?";
}

bool dt_prec_path_supported(dt_prec_path p) {
    switch (p) {
    case DT_PATH_FP32:
        return true;
    case DT_PATH_AVX512BF16:
#ifdef HAVE_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512bf16");
#else
        return false;
#endif
    case DT_PATH_AMX:
        return dt_amx_usable(); // opt-in only: see amx.c
    default:
        return false;
    }
}

static pthread_once_t path_once = PTHREAD_ONCE_INIT;
static dt_prec_path   path_cur  = DT_PATH_FP32;
static dt_status      path_err  = DT_OK;
static char           path_msg[200];

static void path_read_env(void) {
    const char  *e = dt_setting_str("DT_PRECISION_PATH"); // checked below, per CPU
    dt_prec_path best =
        dt_prec_path_supported(DT_PATH_AVX512BF16) ? DT_PATH_AVX512BF16 : DT_PATH_FP32;
    path_cur = best;
    if (!e || !*e || strcmp(e, "auto") == 0)
        return;
    for (int p = 0; p < DT_PATH_COUNT_; p++)
        if (strcmp(e, path_names[p]) == 0) {
            if (dt_prec_path_supported((dt_prec_path)p)) {
                path_cur = (dt_prec_path)p;
                return;
            }
            path_cur = DT_PATH_FP32;
            path_err = DT_ERR_ARG;
            snprintf(path_msg, sizeof path_msg,
                     "DT_PRECISION_PATH: \"%s\" is not available on this CPU/build "
                     "(available: fp32%s%s)",
                     e, best == DT_PATH_AVX512BF16 ? ", avx512bf16" : "",
                     dt_prec_path_supported(DT_PATH_AMX) ? ", amx" : "");
            return;
        }
    path_cur = DT_PATH_FP32;
    path_err = DT_ERR_ARG;
    snprintf(path_msg, sizeof path_msg,
             "DT_PRECISION_PATH: expected auto, avx512bf16, amx or fp32; found \"%.60s\"", e);
}

dt_status dt_prec_path_init(void) {
    pthread_once(&path_once, path_read_env);
    return path_err == DT_OK ? DT_OK : dt_fail(path_err, "%s", path_msg);
}

dt_prec_path dt_prec_path_get(void) {
    pthread_once(&path_once, path_read_env);
    return __atomic_load_n(&path_cur, __ATOMIC_RELAXED);
}

dt_status dt_prec_path_set(dt_prec_path p) {
    pthread_once(&path_once, path_read_env);
    if (!dt_prec_path_supported(p))
        return dt_fail(DT_ERR_ARG, "precision path: %s is not available on this CPU/build",
                       dt_prec_path_name(p));
    __atomic_store_n(&path_cur, p, __ATOMIC_RELAXED);
    return DT_OK;
}
