// bf16.c: the entry points of the fp32 <-> bf16 and fp32 <-> fp16 conversions (rows of
// the kernel table: kernels/vec/half.c, kernels/ref/half_ref.c and the avx2 and avx512
// folders' fp16 instructions), and the choice of the mixed-precision path (prec.h).
#include "kernels/table.h"
#include "nn/prec.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

void dt_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    dt_k()->f32_to_bf16(src, dst, n);
}
void dt_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    dt_k()->bf16_to_f32(src, dst, n);
}
void dt_f32_round_bf16(const float *src, float *dst, size_t n) {
    dt_k()->f32_round_bf16(src, dst, n);
}
void dt_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    dt_k()->f32_to_f16(src, dst, n);
}
void dt_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    dt_k()->f16_to_f32(src, dst, n);
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
        return dt_isa_on(DT_ISA_AVX512BF16);
    case DT_PATH_AMX:
        return dt_amx_usable(); // opt-in only: see kernels/amx/amx.h
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

const char *dt_prec_describe(dt_precision p, char *buf, size_t n) {
    if (p == DT_PREC_FP16) // autocast.c: exact fp16 values, fp32 products and sums
        snprintf(buf, n, "fp16: operands rounded to fp16, products on the fp32 kernels%s",
                 dt_isa_on(DT_ISA_AVX2) ? " (F16C conversions)" : "");
    else if (p == DT_PREC_BF16 && dt_prec_path_get() == DT_PATH_FP32)
        snprintf(buf, n, "bf16: %soperands rounded to bf16, products on the fp32 kernels",
                 dt_isa_on(DT_ISA_AVX512BF16) ? "DT_PRECISION_PATH=fp32: " : "no bf16 hardware: ");
    else if (p == DT_PREC_BF16)
        snprintf(buf, n, "bf16: %s",
                 dt_prec_path_get() == DT_PATH_AMX ? "AMX tiles (TDPBF16PS)"
                                                   : "avx512bf16 dot products (VDPBF16PS)");
    else
        snprintf(buf, n, "%s", "");
    return buf;
}
