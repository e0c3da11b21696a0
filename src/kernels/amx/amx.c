// amx.c: the bf16 GEMM through AMX tiles (TDPBF16PS), the amx target's bf16 gemm row, and
// a software model of the same tile operations that tests the driver and the packing on
// any CPU (amx.h). The folder adds only the tile instructions to the baseline x86-64
// (Makefile), and only block_amx and the tile configuration use them: the model and the
// packing run anywhere.
//
// STATUS: written on a Zen 4 machine without AMX; the real tiles have run once, on an
// Intel Xeon with AMX (Sapphire Rapids class, 2026-11-28): tests/unit/test_prec against
// the fp32 reference and an 8-step bf16 GPT, untimed against avx512bf16. It is never
// chosen automatically: only DT_PRECISION_PATH=amx (or dt_prec_path_set(DT_PATH_AMX))
// selects it, and test_prec checks it wherever AMX is usable (and the model everywhere).
//
// Tiles: C 16 x 16 fp32 (64-byte rows); A 16 rows x 32 bf16 (k contiguous); B 16
// k-pairs x 16 columns, each row the 16 pairs (b[2p][j], b[2p+1][j]) (64 bytes).
// TDPBF16PS C, A, B: C[i][j] += sum_p A[i][2p] B[p][2j] + A[i][2p+1] B[p][2j+1].
// Eight tile registers: C0..C3 hold a 32 x 32 block of C, A0, A1 two row panels, B0, B1
// two column panels; each 32-deep k step is 4 loads and 4 TDPBF16PS.
//
// Packing (per KC block, k padded with zeros to a multiple of 32): A in 16-row panels,
// row-major with kcpad bf16 per row; B in 16-column panels of kcpad / 2 pair rows. Rows
// and columns are padded to multiples of 32 with zeros, and every C block goes through
// a 32 x 32 buffer, so the tiles are always full (simple; the first thing to optimise
// once this can be measured).
#include "kernels/amx/amx.h"
#include "kernels/fill.h"
#include "kernels/half.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KC 256 // a multiple of 32
#define MB 32  // rows per C block (two A panels)
#define NB 32  // columns per C block (two B panels)

static inline uint16_t rnd16(float x) {
    return dt_f32_to_bf16_1(x);
}

static inline uint16_t elem(dt_gemm_opnd x, size_t r, size_t c) {
    return x.f32 ? rnd16(((const float *)x.p)[r * x.ld + c])
                 : ((const uint16_t *)x.p)[r * x.ld + c];
}

// ------------------------------------------------------------------ availability
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static bool           amx_ok;

// The CPU's AMX-TILE and AMX-BF16 come from cpu.c (the amx target, within DT_ISA); the
// kernel's permission for tile data is asked here, once.
static void amx_probe(void) {
    if (!dt_isa_on(DT_ISA_AMX))
        return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool dt_amx_usable(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

// ------------------------------------------------------------------ packing
// A rows [m0, m0 + mc) x k [k0, k0 + kc) into 16-row panels (mc rounded up to MB).
static void pack_a(bool ta, dt_gemm_opnd a, int m0, int mc, int k0, int kc, int kcpad,
                   uint16_t *out) {
    int mpad = (mc + MB - 1) / MB * MB;
    for (int i = 0; i < mpad; i++) {
        uint16_t *row = out + (size_t)i * kcpad;
        for (int kk = 0; kk < kcpad; kk++)
            row[kk] = i < mc && kk < kc ? (ta ? elem(a, (size_t)(k0 + kk), (size_t)(m0 + i))
                                              : elem(a, (size_t)(m0 + i), (size_t)(k0 + kk)))
                                        : 0;
    }
}

// B k [k0, k0 + kc) x columns [n0, n0 + nc) into 16-column panels of pair rows.
static void pack_b(bool tb, dt_gemm_opnd b, int k0, int kc, int kcpad, int n0, int nc,
                   uint16_t *out) {
    int npad = (nc + NB - 1) / NB * NB;
    for (int jp = 0; jp < npad; jp += 16)
        for (int p = 0; p < kcpad / 2; p++)
            for (int j = 0; j < 16; j++)
                for (int h = 0; h < 2; h++) {
                    int kk = 2 * p + h, col = jp + j;
                    *out++ = kk < kc && col < nc
                                 ? (tb ? elem(b, (size_t)(n0 + col), (size_t)(k0 + kk))
                                       : elem(b, (size_t)(k0 + kk), (size_t)(n0 + col)))
                                 : 0;
                }
}

// ------------------------------------------------------------------ tile operations
typedef struct tilecfg {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} tilecfg;

static void make_cfg(tilecfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->rows[t]  = 16;
        cfg->colsb[t] = 64;
    }
}

// The software model: eight 16 x 64-byte registers.
typedef struct emu {
    unsigned char t[8][16][64];
} emu;

static void emu_load(emu *e, int t, const void *base, size_t stride) {
    for (int r = 0; r < 16; r++)
        memcpy(e->t[t][r], (const char *)base + r * stride, 64);
}
static void emu_store(emu *e, int t, void *base, size_t stride) {
    for (int r = 0; r < 16; r++)
        memcpy((char *)base + r * stride, e->t[t][r], 64);
}
static void emu_dp(emu *e, int tc, int ta, int tb) {
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float acc;
            memcpy(&acc, &e->t[tc][i][4 * j], 4);
            for (int p = 0; p < 16; p++) {
                uint16_t a0, a1, b0, b1;
                memcpy(&a0, &e->t[ta][i][4 * p], 2);
                memcpy(&a1, &e->t[ta][i][4 * p + 2], 2);
                memcpy(&b0, &e->t[tb][p][4 * j], 2);
                memcpy(&b1, &e->t[tb][p][4 * j + 2], 2);
                acc += dt_bf16_to_f32_1(a0) * dt_bf16_to_f32_1(b0) +
                       dt_bf16_to_f32_1(a1) * dt_bf16_to_f32_1(b1);
            }
            memcpy(&e->t[tc][i][4 * j], &acc, 4);
        }
}

// One 32 x 32 C block (ct, 128-byte rows, already holding the start values) +=
// A panels at ap (2 x 16 rows of kcpad bf16) x B panels at bp (2 x kcpad / 2 pair rows).
static void block_emu(emu *e, int kcpad, const uint16_t *ap, const uint16_t *bp, float *ct) {
    size_t as = (size_t)kcpad * 2, bpan = (size_t)kcpad / 2 * 32; // bytes; elements
    for (int t = 0; t < 4; t++)
        emu_load(e, t, ct + (t / 2) * 16 * 32 + (t % 2) * 16, 128);
    for (int s = 0; s < kcpad / 32; s++) {
        emu_load(e, 4, ap + s * 32, as);
        emu_load(e, 5, ap + 16 * (size_t)kcpad + s * 32, as);
        emu_load(e, 6, bp + (size_t)s * 16 * 32, 64);
        emu_load(e, 7, bp + bpan + (size_t)s * 16 * 32, 64);
        emu_dp(e, 0, 4, 6);
        emu_dp(e, 1, 4, 7);
        emu_dp(e, 2, 5, 6);
        emu_dp(e, 3, 5, 7);
    }
    for (int t = 0; t < 4; t++)
        emu_store(e, t, ct + (t / 2) * 16 * 32 + (t % 2) * 16, 128);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TARGET_AMX __attribute__((target("amx-tile,amx-bf16")))

TARGET_AMX static void block_amx(int kcpad, const uint16_t *ap, const uint16_t *bp, float *ct) {
    size_t as = (size_t)kcpad * 2, bpan = (size_t)kcpad / 2 * 32;
    _tile_loadd(0, ct, 128);
    _tile_loadd(1, ct + 16, 128);
    _tile_loadd(2, ct + 16 * 32, 128);
    _tile_loadd(3, ct + 16 * 32 + 16, 128);
    for (int s = 0; s < kcpad / 32; s++) {
        _tile_loadd(4, ap + s * 32, as);
        _tile_loadd(5, ap + 16 * (size_t)kcpad + s * 32, as);
        _tile_loadd(6, bp + (size_t)s * 16 * 32, 64);
        _tile_loadd(7, bp + bpan + (size_t)s * 16 * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, ct, 128);
    _tile_stored(1, ct + 16, 128);
    _tile_stored(2, ct + 16 * 32, 128);
    _tile_stored(3, ct + 16 * 32 + 16, 128);
}
TARGET_AMX static void amx_begin(const tilecfg *cfg) {
    _tile_loadconfig(cfg);
}
TARGET_AMX static void amx_end(void) {
    _tile_release();
}
#define HAVE_AMX_CODE 1
#endif

// ------------------------------------------------------------------ driver
dt_status dt_gemm_amx(bool emulate, bool ta, bool tb, int m, int n, int k, dt_gemm_opnd a,
                      dt_gemm_opnd b, float *c, int ldc, bool accumulate) {
#ifndef HAVE_AMX_CODE
    if (!emulate)
        return dt_fail(DT_ERR_UNSUPPORTED, "bf16 GEMM: AMX code is not built with this compiler");
#endif
    if (!emulate && !dt_amx_usable())
        return dt_fail(DT_ERR_UNSUPPORTED, "bf16 GEMM: expected a CPU with AMX-BF16 and the "
                                           "kernel's permission for tile data, found neither");
    if (m <= 0 || n <= 0)
        return DT_OK;
    int    mpad = (m + MB - 1) / MB * MB, npad = (n + NB - 1) / NB * NB;
    size_t abytes = (size_t)mpad * KC * 2, bbytes = (size_t)npad * KC * 2;
    char  *mem = dt_alloc(abytes + bbytes + sizeof(emu) + MB * NB * sizeof(float));
    if (!mem)
        return dt_fail(DT_ERR_NOMEM, "bf16 GEMM (amx): expected %zu bytes of packing buffers",
                       abytes + bbytes + sizeof(emu));
    uint16_t *pa = (uint16_t *)mem, *pb = (uint16_t *)(mem + abytes);
    emu      *e  = (emu *)(mem + abytes + bbytes);
    float    *ct = (float *)(mem + abytes + bbytes + sizeof(emu));
    tilecfg   cfg;
    make_cfg(&cfg);
#ifdef HAVE_AMX_CODE
    if (!emulate)
        amx_begin(&cfg);
#endif
    int kk = k > 0 ? k : 0;
    for (int k0 = 0; k0 < kk || (k0 == 0 && kk == 0); k0 += KC) {
        int  kc = kk - k0 < KC ? kk - k0 : KC, kcpad = (kc + 31) / 32 * 32;
        bool add = accumulate || k0 > 0;
        pack_b(tb, b, k0, kc, kcpad, 0, n, pb);
        pack_a(ta, a, 0, m, k0, kc, kcpad, pa);
        for (int i0 = 0; i0 < m; i0 += MB)
            for (int j0 = 0; j0 < n; j0 += NB) {
                int rows = m - i0 < MB ? m - i0 : MB, cols = n - j0 < NB ? n - j0 : NB;
                for (int i = 0; i < MB; i++)
                    for (int j = 0; j < NB; j++)
                        ct[i * NB + j] =
                            add && i < rows && j < cols ? c[(size_t)(i0 + i) * ldc + j0 + j] : 0;
                const uint16_t *ap = pa + (size_t)i0 * kcpad;
                const uint16_t *bp = pb + (size_t)(j0 / 16) * (kcpad / 2) * 32;
                if (kcpad > 0) {
#ifdef HAVE_AMX_CODE
                    if (!emulate)
                        block_amx(kcpad, ap, bp, ct);
                    else
#endif
                        block_emu(e, kcpad, ap, bp, ct);
                }
                for (int i = 0; i < rows; i++)
                    memcpy(c + (size_t)(i0 + i) * ldc + j0, ct + i * NB,
                           sizeof(float) * (size_t)cols);
            }
        if (kk == 0)
            break;
    }
#ifdef HAVE_AMX_CODE
    if (!emulate)
        amx_end();
#endif
    dt_free(mem);
    return DT_OK;
}

// The row: the tiles, on the amx target (the bias is always the caller's: nn/gemm16.c
// starts C from it on this path).
static dt_status amx_row(bool ta, bool tb, int m, int n, int k, dt_gemm_opnd a, dt_gemm_opnd b,
                         const float *bias, float *c, int ldc, bool accumulate) {
    DT_ASSERT(bias == NULL);
    return dt_gemm_amx(false, ta, tb, m, n, k, a, b, c, ldc, accumulate);
}

void dt_kfill_amx(dt_ktab *t) {
    t->gemm_amx = amx_row;
}
