// half.h: one value at a time between fp32 and the 16-bit formats (nn/prec.h describes
// the formats and the rounding: to nearest even, NaN kept quiet, no flush to zero). The
// vector kernels of every target use these for their last elements, so every path gives
// the same bits (kernels/ref/half_ref.c).
#ifndef DTRAIN_KERNELS_HALF_H
#define DTRAIN_KERNELS_HALF_H

#include <stdint.h>

uint16_t dt_f32_to_bf16_1(float x);
float    dt_bf16_to_f32_1(uint16_t h);
uint16_t dt_f32_to_f16_1(float x); // in software, any CPU
float    dt_f16_to_f32_1(uint16_t h);

#endif // DTRAIN_KERNELS_HALF_H
