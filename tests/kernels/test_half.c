// test_half.c: every target's conversion rows between fp32 and bf16 / fp16 give the bits
// of the one-value functions (kernels/half.h) on every fp16 pattern and a few million
// fp32 patterns (random bits, plus patterns near the fp16 range boundaries), at lengths
// that leave every tail length; all targets this machine runs, in one process.
#include "targets.h"

#include "kernels/half.h"

enum { N = 1 << 16 };

static uint32_t f_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float bits_f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void fp16(const dt_ktab *t) {
    uint16_t *h = malloc(N * 2), *h2 = malloc(N * 2);
    float    *f = malloc(N * 4);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    t->f16_to_f32(h, f, N - 3); // a tail
    int bad = 0, rt = 0;
    for (int i = 0; i < N - 3; i++)
        bad += f_bits(f[i]) != f_bits(dt_f16_to_f32_1(h[i]));
    CHECK_EQ(bad, 0);
    t->f32_to_f16(f, h2, N - 3); // every non-NaN fp16 survives fp16 -> fp32 -> fp16
    for (int i = 0; i < N - 3; i++)
        rt += !isnan(f[i]) && h2[i] != h[i];
    CHECK_EQ(rt, 0);
    int bad16 = 0;
    for (int round = 0; round < 48; round++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = kt_bits();
            if (round % 3 == 1) // near the fp16 exponent range
                u = (u & 0x80000000u) | (0x33000000u + (u & 0x14ffffffu));
            else if (round % 3 == 2)
                u = (u & 0x80000000u) | (0x47700000u + (u & 0x001fffffu));
            f[i] = bits_f(u);
        }
        size_t n = N - (size_t)round % 17;
        t->f32_to_f16(f, h, n);
        for (size_t i = 0; i < n; i++)
            bad16 += h[i] != dt_f32_to_f16_1(f[i]);
    }
    CHECK_EQ(bad16, 0);
    free(h), free(h2), free(f);
}

static void bf16(const dt_ktab *t) {
    uint16_t *h = malloc(N * 2);
    float    *f = malloc(N * 4), *g = malloc(N * 4);
    int       bad = 0, back = 0, rnd = 0;
    for (int round = 0; round < 16; round++) {
        for (int i = 0; i < N; i++)
            f[i] = bits_f(kt_bits());
        size_t n = N - (size_t)round % 17;
        t->f32_to_bf16(f, h, n);
        for (size_t i = 0; i < n; i++)
            bad += h[i] != dt_f32_to_bf16_1(f[i]);
        t->bf16_to_f32(h, g, n);
        for (size_t i = 0; i < n; i++)
            back += f_bits(g[i]) != f_bits(dt_bf16_to_f32_1(h[i]));
        t->f32_round_bf16(f, g, n);
        for (size_t i = 0; i < n; i++)
            rnd += f_bits(g[i]) != f_bits(dt_bf16_to_f32_1(dt_f32_to_bf16_1(f[i])));
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(back, 0);
    CHECK_EQ(rnd, 0);
    free(h), free(f), free(g);
}

// The bf16 rounding of Linear's output gradient with its column sums riding along: the
// bits of the conversion, and sums in double in row order (so exactly those of a plain
// loop).
static void round_sum(const dt_ktab *t) {
    enum { ROWS = 37, OUT = 27 };
    float   *dy = kt_floats(ROWS * OUT, -3, 3);
    uint16_t dy16[ROWS * OUT];
    double   acc[OUT], want[OUT];
    for (int o = 0; o < OUT; o++)
        acc[o] = want[o] = o;
    t->bf16_round_sum(dy, ROWS, OUT, dy16, acc);
    int bad = 0;
    for (int s = 0; s < ROWS; s++)
        for (int o = 0; o < OUT; o++) {
            want[o] += dy[s * OUT + o];
            bad += dy16[s * OUT + o] != dt_f32_to_bf16_1(dy[s * OUT + o]);
        }
    CHECK_EQ(bad, 0);
    CHECK(memcmp(acc, want, sizeof acc) == 0);
    t->bf16_round_sum(dy, ROWS, OUT, dy16, NULL); // no sums wanted
    free(dy);
}

int main(void) {
    char   line[320];
    dt_isa ts[DT_ISA_COUNT_];
    int    nt = kt_targets(ts);
    printf("# %s\n", dt_kernels_describe(line, sizeof line));
    for (int i = 0; i < nt; i++) {
        const dt_ktab *t = dt_ktab_only(ts[i]);
        check_current    = dt_isa_name(ts[i]);
        if (t->f32_to_f16) {
            fp16(t);
            fprintf(stderr, "ok   %s fp16\n", check_current);
        }
        if (t->f32_to_bf16) {
            bf16(t);
            round_sum(t);
            fprintf(stderr, "ok   %s bf16\n", check_current);
        }
    }
    return check_summary();
}
