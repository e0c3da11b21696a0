// half_ref.c: the scalar conversions between fp32 and bf16 / fp16 (kernels/half.h), and
// the fp16 conversions' ref rows: one value at a time, in integer arithmetic, so they give
// the bits the hardware conversions of the other targets give (VCVTPS2PH / VCVTPH2PS).
#include "kernels/fill.h"
#include "kernels/half.h"

#include <string.h>

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

static void f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dt_f32_to_f16_1(src[i]);
}

static void f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dt_f16_to_f32_1(src[i]);
}

void dt_kfill_half_ref(dt_ktab *t) {
    t->f32_to_f16 = f32_to_f16;
    t->f16_to_f32 = f16_to_f32;
}
