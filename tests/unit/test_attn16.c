// test_attn16.c: the bf16 attention (nn/attn16.c) against the fp32 one (ops_attn.c) on
// the same bf16-representable q, k, v and dy, on lengths that are and are not whole
// 64-row tiles (1, 37, 64, 65, 130), head sizes 16, 32 and 48, two samples, two heads.
//
// With operands that are already bf16 values, the bf16 version differs from fp32 only
// by rounding the probabilities (forward) and the score gradient (backward) to bf16,
// and by the order of the fp32 sums. Forward: y = sum_s p_s v_s / l with each p_s moved
// by at most 2^-8 relative, so |y16 - y32| <= 2^-8 sum_s p_s |v_s| / l <= 2^-8 max |v|
// (plus fp32 rounding). Backward: each gradient against 2^-6 of its largest magnitude,
// so a misplaced pair, row or column (an O(1) error) fails while rounding passes.
#include "../check.h"
#include "nn/ops.h"
#include "nn/prec.h"

#include <stdlib.h>

static uint64_t rng_state = 0x853c49e6748fea9bull;
static float    rnd_bf(void) { // a bf16 value in [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    float x   = (float)((double)(uint32_t)(rng_state >> 32) / 2147483648.0 - 1.0);
    return dt_bf16_to_f32_1(dt_f32_to_bf16_1(x));
}

static float max_abs(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

static void close_all(const char *what, const float *got, const float *ref, size_t n, double tol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - ref[i]) <= tol) && bad++ < 3)
            fprintf(stderr, "  %s [%zu]: %.7g vs fp32 %.7g (tol %.3g)\n", what, i, got[i], ref[i],
                    tol);
    CHECK(bad == 0);
}

static void attn_case(int T, int d) {
    enum { B = 2, H = 2 };
    int    C = H * d, ld = 3 * C;
    size_t nx = (size_t)B * T * ld, ny = (size_t)B * T * C, nl = (size_t)B * H * T;
    float *x = malloc(sizeof(float) * nx), *dy = malloc(sizeof(float) * ny);
    float *y16 = malloc(sizeof(float) * ny), *y32 = malloc(sizeof(float) * ny);
    float *l16 = malloc(sizeof(float) * nl), *l32 = malloc(sizeof(float) * nl);
    float *d16 = calloc(nx, sizeof(float)), *d32 = calloc(nx, sizeof(float));
    size_t ns  = dt_nn_attn16_scratch(T, d) > dt_nn_attn_scratch(d) ? dt_nn_attn16_scratch(T, d)
                                                                    : dt_nn_attn_scratch(d);
    float *scr = malloc(sizeof(float) * ns);
    for (size_t i = 0; i < nx; i++)
        x[i] = rnd_bf() * 2.0f; // scores of a few units: a peaked softmax in places
    for (size_t i = 0; i < ny; i++)
        dy[i] = rnd_bf();
    dt_nn_attn16_forward(B, T, C, H, ld, x, x + C, x + 2 * C, y16, l16, scr);
    dt_nn_attn_forward(B, T, C, H, ld, x, x + C, x + 2 * C, y32, l32, scr);
    float vmax = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                float v = fabsf(x[((size_t)b * T + t) * ld + 2 * C + c]);
                vmax    = v > vmax ? v : vmax;
            }
    close_all("y", y16, y32, ny, 0x1p-8 * vmax * 1.05 + 1e-5);
    close_all("lse", l16, l32, nl, 1e-4);
    dt_nn_attn16_backward(B, T, C, H, ld, x, x + C, x + 2 * C, y32, l32, dy, d16, d16 + C,
                          d16 + 2 * C, scr);
    dt_nn_attn_backward(B, T, C, H, ld, x, x + C, x + 2 * C, y32, l32, dy, d32, d32 + C,
                        d32 + 2 * C, scr);
    // dq, dk, dv each against 2^-6 of its own largest magnitude
    for (int part = 0; part < 3; part++) {
        float *g16 = malloc(sizeof(float) * ny), *g32 = malloc(sizeof(float) * ny);
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (int c = 0; c < C; c++) {
                g16[r * C + c] = d16[r * ld + (size_t)part * C + c];
                g32[r * C + c] = d32[r * ld + (size_t)part * C + c];
            }
        static const char *names[] = {"dq", "dk", "dv"};
        close_all(names[part], g16, g32, ny, 0x1p-6 * max_abs(g32, ny) + 1e-6);
        CHECK(max_abs(g32, ny) > 0 || (T == 1 && part < 2)); // one key: dq = dk = 0
        free(g16), free(g32);
    }
    free(x), free(dy), free(y16), free(y32), free(l16), free(l32), free(d16), free(d32), free(scr);
}

int main(void) {
    if (!dt_nn_attn16_ok(32, 1)) {
        printf("attn16: no avx512bf16 path here, skipped\n");
        return check_summary();
    }
    CHECK(!dt_nn_attn16_ok(40, 1) && dt_nn_attn16_ok(96, 2)); // d a multiple of 16 only
    static const int Ts[] = {1, 37, 64, 65, 130}, ds[] = {16, 32, 48};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++)
        for (size_t j = 0; j < sizeof ds / sizeof *ds; j++) {
            char name[32];
            snprintf(name, sizeof name, "T %d d %d", Ts[i], ds[j]);
            check_current = name;
            attn_case(Ts[i], ds[j]);
        }
    return check_summary();
}
