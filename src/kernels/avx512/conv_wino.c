// conv_wino.c: stride-1 3x3 convolutions as Winograd F(2x2, 3x3) (conv_cl.h), on
// the register blocks of conv_cl.c: the forward, and through it the input gradient (a
// convolution of dy with the flipped weights).
#include "kernels/avx512/conv_cl.h"
#include "kernels/vmath.h"

// ------------------------------------------------------- forward, Winograd F(2x2, 3x3)

// Stride-1 3x3 convolutions as Winograd's F(2x2, 3x3): each 2x2 block of outputs is
// A^T [ (G g G^T) .* (B^T d B) ] A over the 4x4 input patch d, so the channel sums are
// 16 products per 4 outputs instead of 36: 16 GEMMs (one per transformed position xi)
// of the transformed weights U[xi] (cin x cout) and the transformed patches V[xi]
// (tiles x cin), which the register blocks above run with the tiles as "pixels". The
// transforms only add and subtract (B, A) or halve (G, done once per call in double),
// so rounding stays within a few ulps of the direct sum's.
typedef struct wino {
    int    th, tw, T, hx, lx; // tiles down, across, in all; padded input rows, row floats
    size_t u, xp, v, m, ycl;
} wino;

// Where it pays, measured on the ResNet's shapes (Zen 4): everywhere from 16 input
// channels (16->16 at 28x28: 0.83x the direct kernel's time, 32->32 at 14x14: 0.75x,
// 64->64 at 7x7, where 8x8 tiles cover the 7x7 outputs: 0.9x).
// (DT_CONV_WINO=1 takes it for every shape it fits, =0 never.)
bool dt_kwino_fits(const dt_kconv *p) {
    return CL_KERNELS && p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 && p->groups == 1 &&
           p->cout % 16 == 0;
}

bool dt_kwino_ok(const dt_kconv *p, int h, int w) {
    int tiles = ((h + 2 * p->ph - 1) / 2) * ((w + 2 * p->pw - 1) / 2);
    if (!dt_kwino_fits(p) || getenv_is("DT_CONV_WINO", "0"))
        return false;
    return getenv_is("DT_CONV_WINO", "1") || (p->cin >= 16 && tiles >= 16);
}

// Floats between the 16 planes of V and of M: 64 bytes more than their size, so that
// the 16 loads or stores of one tile's transform do not all fall in one cache set (at
// 7x7, 16 tiles x 64 channels is exactly 4 KiB).
static size_t wino_vst(const dt_kconv *p, int T) {
    return (size_t)p->cin * T + 16;
}
static size_t wino_mst(const dt_kconv *p, int T) {
    return (size_t)T * p->cout + 16;
}

static wino wino_of(const dt_kconv *p, int h, int w) {
    wino z;
    int  ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2;
    z.th  = (ho + 1) / 2;
    z.tw  = (wo + 1) / 2;
    z.T   = z.th * z.tw;
    z.hx  = 2 * z.th + 2;
    z.lx  = 2 * z.tw + 2 + 32; // a 32-float window may start at the last tile's column
    z.u   = 0;
    z.xp  = z.u + (size_t)16 * p->cin * p->cout;
    z.v   = z.xp + (size_t)p->cin * z.hx * z.lx + 32;
    z.m   = z.v + 16 * wino_vst(p, z.T);
    z.ycl = z.m + 16 * wino_mst(p, z.T);
    return z;
}

size_t dt_kwino_scratch(const dt_kconv *p, int h, int w) {
    wino z = wino_of(p, h, w);
    return z.ycl + ((size_t)4 * z.T + 16) * p->cout;
}

bool dt_kwino_dx(const dt_kconv *p, int h, int w) {
    if (p->sh != 1 || p->sw != 1)
        return false;
    dt_kconv t  = transposed_conv(p);
    int      ho = h + 2 * p->ph - p->kh + 1, wo = w + 2 * p->pw - p->kw + 1;
    return t.ph >= 0 && t.pw >= 0 && dt_kwino_ok(&t, ho, wo);
}

#if CL_KERNELS
// V[xi][c][tile] = (B^T d B)[xi] of sample xs's 4x4 patches (planes vst floats apart,
// channels T apart), through the padded input xp (zero margins, z.lx floats a row).
CL_TARGET static inline __attribute__((always_inline)) void wino_input(const dt_kconv *p,
                                                                       const wino *zp, int h, int w,
                                                                       const float *xs, float *xp,
                                                                       float *Vt, size_t vst) {
    const wino    z   = *zp;
    int           cin = p->cin, T = z.T;
    const __m512i i0 = _mm512_set_epi32(0, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0),
                  i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(1)),
                  i2 = _mm512_add_epi32(i0, _mm512_set1_epi32(2)),
                  i3 = _mm512_add_epi32(i0, _mm512_set1_epi32(3));
    for (int c = 0; c < cin; c++)
        for (int i = 0; i < h; i++)
            copy_row(xp + ((size_t)c * z.hx + i + p->ph) * z.lx + p->pw,
                     xs + ((size_t)c * h + i) * w, w);
    // V[xi][c][tile] = (B^T d B)[xi], 16 tiles of a tile row at a time
    for (int c = 0; c < cin; c++)
        for (int ti = 0; ti < z.th; ti++) {
            // columns 2tj..2tj+3 of the patch rows as vectors over 15 tiles (their 32
            // floats are one window; lane 15 is never stored), permuted in registers
            for (int tj0 = 0; tj0 < z.tw; tj0 += 15) {
                int       len = z.tw - tj0 < 15 ? z.tw - tj0 : 15;
                __mmask16 m   = (__mmask16)((1u << len) - 1);
                __m512    cr[4][4];
                UNROLL(4) for (int r = 0; r < 4; r++) {
                    const float *row = xp + ((size_t)c * z.hx + 2 * ti + r) * z.lx + 2 * tj0;
                    __m512       lo = _mm512_loadu_ps(row), hi = _mm512_loadu_ps(row + 16);
                    __m512       d0 = _mm512_permutex2var_ps(lo, i0, hi),
                           d1       = _mm512_permutex2var_ps(lo, i1, hi),
                           d2       = _mm512_permutex2var_ps(lo, i2, hi),
                           d3       = _mm512_permutex2var_ps(lo, i3, hi);
                    cr[r][0]        = _mm512_sub_ps(d0, d2);
                    cr[r][1]        = _mm512_add_ps(d1, d2);
                    cr[r][2]        = _mm512_sub_ps(d2, d1);
                    cr[r][3]        = _mm512_sub_ps(d1, d3);
                }
                float *dst  = Vt + (size_t)c * T + (size_t)ti * z.tw + tj0;
                size_t xs16 = vst; // between xi planes
                UNROLL(4) for (int bb = 0; bb < 4; bb++) {
                    _mm512_mask_storeu_ps(dst + (0 * 4 + bb) * xs16, m,
                                          _mm512_sub_ps(cr[0][bb], cr[2][bb]));
                    _mm512_mask_storeu_ps(dst + (1 * 4 + bb) * xs16, m,
                                          _mm512_add_ps(cr[1][bb], cr[2][bb]));
                    _mm512_mask_storeu_ps(dst + (2 * 4 + bb) * xs16, m,
                                          _mm512_sub_ps(cr[2][bb], cr[1][bb]));
                    _mm512_mask_storeu_ps(dst + (3 * 4 + bb) * xs16, m,
                                          _mm512_sub_ps(cr[1][bb], cr[3][bb]));
                }
            }
        }
}
#endif

#if CL_KERNELS
static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

// One call's state: the geometry, the transformed weights and the per-sample buffers.
typedef struct wino_fwd {
    const dt_kconv *p;
    wino            z;
    int             h, w, ho, wo;
    size_t          vst, mst;
    float          *U, *xp, *Vt, *M, *ycl;
} wino_fwd;

// U[xi][c][o] = (G g G^T)[xi] (in double), the padding zeroed.
CL_TARGET static void wino_fwd_begin(wino_fwd *f, const dt_kconv *p, int h, int w, const float *wt,
                                     float *scratch) {
    f->p   = p;
    f->z   = wino_of(p, h, w);
    f->h   = h;
    f->w   = w;
    f->ho  = h + 2 * p->ph - 2;
    f->wo  = w + 2 * p->pw - 2;
    f->vst = wino_vst(p, f->z.T);
    f->mst = wino_mst(p, f->z.T);
    f->U = scratch + f->z.u, f->xp = scratch + f->z.xp, f->Vt = scratch + f->z.v;
    f->M = scratch + f->z.m, f->ycl = scratch + f->z.ycl;
    int cin = p->cin, cout = p->cout;
    for (int o = 0; o < cout; o++)
        for (int c = 0; c < cin; c++) {
            const float *g = wt + ((size_t)o * cin + c) * 9;
            double       t[4][3];
            for (int a = 0; a < 4; a++)
                for (int j = 0; j < 3; j++)
                    t[a][j] = G[a][0] * g[j] + G[a][1] * g[3 + j] + G[a][2] * g[6 + j];
            for (int a = 0; a < 4; a++)
                for (int bb = 0; bb < 4; bb++)
                    f->U[((size_t)(a * 4 + bb) * cin + c) * cout + o] =
                        (float)(t[a][0] * G[bb][0] + t[a][1] * G[bb][1] + t[a][2] * G[bb][2]);
        }
    memset(f->xp, 0, sizeof(float) * ((size_t)cin * f->z.hx * f->z.lx + 32));
}

// One sample: xs (cin, h, w) -> ys (cout, ho, wo), + b (NULL: none).
CL_TARGET static void wino_fwd_sample(const wino_fwd *f, const float *xs, const float *b,
                                      float *ys) {
    const dt_kconv *p   = f->p;
    wino            z   = f->z;
    int             cin = p->cin, cout = p->cout, ho = f->ho, wo = f->wo, T = z.T, W2 = 2 * z.tw;
    size_t          vst = f->vst, mst = f->mst;
    float          *U = f->U, *Vt = f->Vt, *M = f->M, *ycl = f->ycl;
    int             V = cout % 32 == 0 ? 2 : 1, lanes = 16 * V;
    const int       zero[1] = {0};
    wino_input(p, &z, f->h, f->w, xs, f->xp, Vt, vst);
    // M[xi][og][tile][lane] = sum_c V[xi][c][tile] * U[xi][c][og*lanes + lane]: the
    // register blocks write their tiles straight into M
    for (int xi = 0; xi < 16; xi++)
        for (int t0 = 0; t0 < T;) {
            int np = 0;
            for (int o0 = 0; o0 < cout; o0 += lanes)
                np = core_run(V, T - t0, Vt + (size_t)xi * vst + t0, zero, zero, 1, cin, (size_t)T,
                              U + (size_t)xi * cin * cout + o0, cout,
                              M + (size_t)xi * mst + (size_t)o0 * T + (size_t)t0 * lanes);
            t0 += np;
        }
    // the 2x2 outputs of each tile, A^T M A, channels-last
    for (int ti = 0; ti < z.th; ti++)
        for (int tj = 0; tj < z.tw; tj++)
            for (int o0 = 0; o0 < cout; o0 += 16) {
                const float *src = M + (size_t)(o0 / lanes) * lanes * T +
                                   ((size_t)ti * z.tw + tj) * lanes + o0 % lanes;
                size_t xst = mst;
                __m512 t[2][4];
                UNROLL(4) for (int bb = 0; bb < 4; bb++) {
                    __m512 m0 = _mm512_loadu_ps(src + (0 * 4 + bb) * xst),
                           m1 = _mm512_loadu_ps(src + (1 * 4 + bb) * xst),
                           m2 = _mm512_loadu_ps(src + (2 * 4 + bb) * xst),
                           m3 = _mm512_loadu_ps(src + (3 * 4 + bb) * xst);
                    t[0][bb]  = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                    t[1][bb]  = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
                }
                UNROLL(2) for (int r = 0; r < 2; r++) {
                    float *d = ycl + ((size_t)(2 * ti + r) * W2 + 2 * tj) * cout + o0;
                    _mm512_storeu_ps(d, _mm512_add_ps(_mm512_add_ps(t[r][0], t[r][1]), t[r][2]));
                    _mm512_storeu_ps(d + cout,
                                     _mm512_sub_ps(_mm512_sub_ps(t[r][1], t[r][2]), t[r][3]));
                }
            }
    for (int i = 0; i < ho; i++)
        for (int j0 = 0; j0 < wo; j0 += 16)
            for (int c0 = 0; c0 < cout; c0 += 16)
                transpose16(ycl + ((size_t)i * W2 + j0) * cout + c0, (size_t)cout,
                            ys + ((size_t)c0 * ho + i) * wo + j0, (size_t)ho * wo,
                            p->bias ? b + c0 : NULL, wo - j0);
}

CL_TARGET void dt_kwino_forward(const dt_kconv *p, int n, int h, int w, const float *x,
                                const float *wt, const float *b, float *y, float *scratch) {
    wino_fwd f;
    wino_fwd_begin(&f, p, h, w, wt, scratch);
    for (int s = 0; s < n; s++)
        wino_fwd_sample(&f, x + (size_t)s * p->cin * h * w, b,
                        y + (size_t)s * p->cout * f.ho * f.wo);
}
#endif

// ------------------------------------------------------ weight gradient, Winograd

// The weight gradient through the same transforms: with M = U .* V per tile and
// transformed position xi, and Y = A^T M A, the gradient reaching U[xi][c][o] is the
// sum over tiles of V[xi][c][tile] * dM[xi][tile][o], where dM = A dY A^T is the tile's
// 2x2 output gradient spread over the 4x4 positions (outputs past the image count 0);
// and dW[o][c] = G^T dU[.][c][o] G. So the per-sample reduction is 16 products per tile
// (4 outputs) where the direct kernels take 36: 16 GEMMs (cin x tiles) x (tiles x cout)
// on register blocks of R input channels x 16*V output channels (a dM vector loaded, R
// V values broadcast), summed in dU over the samples; G^T dU G once per call, in double.
// (DT_CONV_WINO_DW=0: the direct kernels; 1: wherever it fits.)
bool dt_kwino_dw_ok(const dt_kconv *p, int h, int w) {
    int tiles = ((h + 2 * p->ph - 1) / 2) * ((w + 2 * p->pw - 1) / 2);
    if (!dt_kwino_fits(p) || p->cin % 8 || getenv_is("DT_CONV_WINO_DW", "0") ||
        getenv_is("DT_CONV_WINO", "0"))
        return false;
    return getenv_is("DT_CONV_WINO_DW", "1") || (p->cin >= 16 && tiles >= 16);
}

// Scratch: dU, the padded input, V, dy channels-last (+ one row of slack), dM.
typedef struct wino_dw_layout {
    size_t du, xp, v, dycl, dm;
} wino_dw_layout;

static wino_dw_layout wino_dw_of(const dt_kconv *p, int h, int w, const wino *z) {
    wino_dw_layout d;
    size_t         ho = (size_t)h + 2 * p->ph - 2, wo = (size_t)w + 2 * p->pw - 2;
    d.du   = 0;
    d.xp   = d.du + (size_t)16 * p->cin * p->cout;
    d.v    = d.xp + (size_t)p->cin * z->hx * z->lx + 32;
    d.dycl = d.v + 16 * wino_vst(p, z->T);
    d.dm   = d.dycl + (ho * wo + 16) * p->cout;
    return d;
}

size_t dt_kwino_dw_scratch(const dt_kconv *p, int h, int w) {
    wino z = wino_of(p, h, w);
    return wino_dw_of(p, h, w, &z).dm + 16 * wino_mst(p, z.T);
}

size_t dt_kwino_backward_scratch(const dt_kconv *p, int h, int w) {
    dt_kconv t  = transposed_conv(p);
    int      ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2;
    return (size_t)9 * p->cin * p->cout + dt_kwino_scratch(&t, ho, wo) +
           dt_kwino_dw_scratch(p, h, w);
}

#if CL_KERNELS
// dst[(c0 + r)*cout + o0 + 16v] += sum over tiles t of v[(c0 + r)*T + t] *
// dm[t*cout + o0 + 16v], r < R, v < V.
// clang-format off
#define DEFINE_WDW(name, R, V)                                                                \
    CL_TARGET static inline __attribute__((always_inline)) void name(                        \
        const float *restrict v, const float *restrict dm, int T, int cout, int c0, int o0,  \
        float *restrict dst) {                                                               \
        dt_v16f acc[R][V];                                                                   \
        UNROLL(16) for (int r = 0; r < R; r++) UNROLL(4) for (int q = 0; q < V; q++)         \
            acc[r][q] = ZERO16();                                                            \
        const float *vs = v + (size_t)c0 * T, *gs = dm + o0;                                 \
        for (int t = 0; t < T; t++, vs++, gs += cout) {                                      \
            dt_v16f gv[V];                                                                   \
            UNROLL(4) for (int q = 0; q < V; q++) gv[q] = LOAD16(gs + 16 * q);               \
            UNROLL(16) for (int r = 0; r < R; r++) {                                         \
                dt_v16f xb = BCAST(vs + (size_t)r * T);                                      \
                UNROLL(4) for (int q = 0; q < V; q++) acc[r][q] += xb * gv[q];               \
            }                                                                                \
        }                                                                                    \
        UNROLL(16) for (int r = 0; r < R; r++) UNROLL(4) for (int q = 0; q < V; q++) {       \
            float *d = dst + (size_t)(c0 + r) * cout + o0 + 16 * q;                          \
            STORE16(d, LOAD16(d) + acc[r][q]);                                               \
        }                                                                                    \
    }

// clang-format on
DEFINE_WDW(wdw_16x1, 16, 1)
DEFINE_WDW(wdw_8x1, 8, 1)
DEFINE_WDW(wdw_8x2, 8, 2)

// One call's state.
typedef struct wino_dwc {
    const dt_kconv *p;
    wino            z;
    int             h, w, ho, wo;
    size_t          vst, mst;
    float          *dU, *xp, *Vt, *dycl, *dM;
} wino_dwc;

CL_TARGET static void wino_dw_begin(wino_dwc *d, const dt_kconv *p, int h, int w, float *scratch) {
    d->p              = p;
    d->z              = wino_of(p, h, w);
    wino_dw_layout lo = wino_dw_of(p, h, w, &d->z);
    d->h              = h;
    d->w              = w;
    d->ho             = h + 2 * p->ph - 2;
    d->wo             = w + 2 * p->pw - 2;
    d->vst            = wino_vst(p, d->z.T);
    d->mst            = wino_mst(p, d->z.T);
    d->dU = scratch + lo.du, d->xp = scratch + lo.xp, d->Vt = scratch + lo.v;
    d->dycl = scratch + lo.dycl, d->dM = scratch + lo.dm;
    memset(d->dU, 0, sizeof(float) * 16 * p->cin * p->cout);
    memset(d->xp, 0, sizeof(float) * ((size_t)p->cin * d->z.hx * d->z.lx + 32));
}

// One sample's products into dU (and db += the sums of dy when p->bias and db).
CL_TARGET static void wino_dw_sample(const wino_dwc *d, const float *xs, const float *dys,
                                     float *db) {
    const dt_kconv *p   = d->p;
    wino            z   = d->z;
    int             cin = p->cin, cout = p->cout, ho = d->ho, wo = d->wo, T = z.T;
    size_t          vst = d->vst, mst = d->mst, hwo = (size_t)ho * wo;
    float          *dU = d->dU, *xp = d->xp, *Vt = d->Vt, *dycl = d->dycl, *dM = d->dM;
    int             Vw = cout % 32 == 0 ? 2 : 1, R = Vw == 1 && cin % 16 == 0 ? 16 : 8;
    const __m512    zero = _mm512_setzero_ps();
    wino_input(p, &z, d->h, d->w, xs, xp, Vt, vst);
    if (p->bias && db)
        for (int o = 0; o < cout; o++) {
            double acc = 0.0;
            for (size_t q = 0; q < hwo; q++)
                acc += dys[(size_t)o * hwo + q];
            db[o] += (float)acc;
        }
    // dy channels-last: 16x16 transposes, the last pixels one by one
    size_t qf = hwo & ~(size_t)15;
    for (int o0 = 0; o0 < cout; o0 += 16) {
        for (size_t q0 = 0; q0 < qf; q0 += 16)
            transpose16(dys + (size_t)o0 * hwo + q0, hwo, dycl + q0 * cout + o0, (size_t)cout, NULL,
                        16);
        for (int o = o0; o < o0 + 16; o++)
            for (size_t q = qf; q < hwo; q++)
                dycl[q * cout + o] = dys[(size_t)o * hwo + q];
    }
    // dM[xi][tile][o] = (A dY A^T)[xi]: rows (y0, y0 + y1, y0 - y1, -y1), then the
    // same down the columns
    for (int ti = 0; ti < z.th; ti++)
        for (int tj = 0; tj < z.tw; tj++) {
            int          i = 2 * ti, j = 2 * tj;
            bool         right = j + 1 < wo, down = i + 1 < ho;
            const float *y0 = dycl + ((size_t)i * wo + j) * cout, *y1 = y0 + (size_t)wo * cout;
            float       *dst = dM + ((size_t)ti * z.tw + tj) * cout;
            for (int o0 = 0; o0 < cout; o0 += 16) {
                __m512 a     = _mm512_loadu_ps(y0 + o0),
                       b     = right ? _mm512_loadu_ps(y0 + cout + o0) : zero;
                __m512 c     = down ? _mm512_loadu_ps(y1 + o0) : zero,
                       e     = down && right ? _mm512_loadu_ps(y1 + cout + o0) : zero;
                __m512 r0[4] = {a, _mm512_add_ps(a, b), _mm512_sub_ps(a, b),
                                _mm512_sub_ps(zero, b)};
                __m512 r1[4] = {c, _mm512_add_ps(c, e), _mm512_sub_ps(c, e),
                                _mm512_sub_ps(zero, e)};
                UNROLL(4) for (int bb = 0; bb < 4; bb++) {
                    float *q = dst + o0 + (size_t)bb * mst;
                    _mm512_storeu_ps(q, r0[bb]);
                    _mm512_storeu_ps(q + 4 * mst, _mm512_add_ps(r0[bb], r1[bb]));
                    _mm512_storeu_ps(q + 8 * mst, _mm512_sub_ps(r0[bb], r1[bb]));
                    _mm512_storeu_ps(q + 12 * mst, _mm512_sub_ps(zero, r1[bb]));
                }
            }
        }
    for (int xi = 0; xi < 16; xi++) {
        const float *v = Vt + (size_t)xi * vst, *m = dM + (size_t)xi * mst;
        float       *u = dU + (size_t)xi * cin * cout;
        for (int c0 = 0; c0 < cin; c0 += R)
            for (int o0 = 0; o0 < cout; o0 += 16 * Vw) {
                if (Vw == 2)
                    wdw_8x2(v, m, T, cout, c0, o0, u);
                else if (R == 16)
                    wdw_16x1(v, m, T, cout, c0, o0, u);
                else
                    wdw_8x1(v, m, T, cout, c0, o0, u);
            }
    }
}

// dw[o][c] += G^T dU[.][c][o] G, in double (baseline code, called out of line, before
// the folder was compiled for AVX-512: DT_NO_FMA keeps its roundings).
DT_NO_FMA static void wino_dw_end(const wino_dwc *d, float *dw) {
    int cin = d->p->cin, cout = d->p->cout;
    for (int o = 0; o < cout; o++)
        for (int c = 0; c < cin; c++) {
            double t[4][3] = {{0}};
            for (int a = 0; a < 4; a++)
                for (int kj = 0; kj < 3; kj++)
                    for (int bb = 0; bb < 4; bb++)
                        t[a][kj] +=
                            (double)d->dU[((size_t)(a * 4 + bb) * cin + c) * cout + o] * G[bb][kj];
            float *g = dw + ((size_t)o * cin + c) * 9;
            for (int ki = 0; ki < 3; ki++)
                for (int kj = 0; kj < 3; kj++)
                    g[ki * 3 + kj] += (float)(G[0][ki] * t[0][kj] + G[1][ki] * t[1][kj] +
                                              G[2][ki] * t[2][kj] + G[3][ki] * t[3][kj]);
        }
}

CL_TARGET void dt_kwino_dw(const dt_kconv *p, int n, int h, int w, const float *x, const float *dy,
                           float *dw, float *db, float *scratch) {
    wino_dwc d;
    wino_dw_begin(&d, p, h, w, scratch);
    for (int s = 0; s < n; s++)
        wino_dw_sample(&d, x + (size_t)s * p->cin * h * w, dy + (size_t)s * p->cout * d.ho * d.wo,
                       db);
    wino_dw_end(&d, dw);
}

// Both gradients, sample by sample, so each sample's dy is read from memory once: the
// input gradient as the Winograd forward of the transposed convolution (the flipped
// weights), the weight gradient as above.
CL_TARGET void dt_kwino_backward(const dt_kconv *p, int n, int h, int w, const float *x,
                                 const float *wt, const float *dy, float *dx, float *dw, float *db,
                                 float *scratch) {
    dt_kconv t  = transposed_conv(p);
    int      ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2, kk = 9;
    float   *wf = scratch, *fs = wf + (size_t)kk * p->cin * p->cout;
    float   *ds = fs + dt_kwino_scratch(&t, ho, wo);
    for (int o = 0; o < p->cout; o++) // wf[c][o][ki][kj] = w[o][c][2-ki][2-kj]
        for (int c = 0; c < p->cin; c++)
            for (int t2 = 0; t2 < kk; t2++)
                wf[((size_t)c * p->cout + o) * kk + t2] =
                    wt[((size_t)o * p->cin + c) * kk + kk - 1 - t2];
    wino_fwd f;
    wino_dwc d;
    wino_fwd_begin(&f, &t, ho, wo, wf, fs);
    wino_dw_begin(&d, p, h, w, ds);
    for (int s = 0; s < n; s++) {
        const float *dys = dy + (size_t)s * p->cout * ho * wo;
        wino_fwd_sample(&f, dys, NULL, dx + (size_t)s * p->cin * h * w);
        wino_dw_sample(&d, x + (size_t)s * p->cin * h * w, dys, db);
    }
    wino_dw_end(&d, dw);
}
#endif
