// conv_cl.c: Conv2d with the channels in the vector lanes, for small images and any
// stride (conv_cl.h). The shifted GEMMs of shifted.c put output positions in the lanes;
// on the ResNet's 14x14 and 7x7 images and on stride 2 that wastes lanes (rows of 7 or
// 14 in 16-wide vectors, the wide layout's padding columns) or needs im2col. Here a
// register block is P output pixels x 16*V channels (P*V vectors, up to 28), every
// step loads V weight vectors and broadcasts P input values, so no lane is ever idle
// when the channel count is a multiple of 16.
//
// Forward: the padded input is split into stride phases (sh*sw planes per channel:
// padded pixel (Y, X) goes to plane (Y % sh, X % sw) at (Y / sh, X / sw)), so the
// inputs of consecutive output pixels are consecutive floats for every tap and every
// stride, and a broadcast is one load at a constant offset. Input gradient: the
// transposed convolution, one pass per phase of the input pixels (those with equal
// (Y % sh, X % sw) take the same taps and read consecutive output-gradient pixels),
// from the output gradient padded with zeros. Weight gradient: for each tap and block
// of input channels, a reduction over the output pixels with the output channels in
// the lanes, reading channels-last copies of the input and of the output gradient.
//
// Stride-1 3x3 convolutions (forward, the input gradient as a convolution of dy, and
// the weight gradient) go through Winograd F(2x2, 3x3) instead (conv_wino.c), on the
// same register blocks; a 1-channel 3x3 stem has its own kernel with pixels in the lanes.
//
// Sums run in a fixed order (taps, then channels, then pixels row by row; per sample,
// then over samples), so results do not vary from run to run.
#include "kernels/avx512/conv_cl.h"

// The table holds these kernels only where the avx512 target is on (fill.c).
static bool cpu_ok(void) {
    return CL_KERNELS;
}

bool dt_kcl_forward_ok(const dt_kconv *p) {
    return p->groups == 1 && p->cout % 16 == 0 && cpu_ok();
}

static bool stem_ok(const dt_kconv *p, int w);

bool dt_kcl_backward_ok(const dt_kconv *p, int w, bool input_grad) {
    return ((p->groups == 1 && p->cout % 16 == 0 && p->cin % 8 == 0 &&
             (!input_grad || p->cin % 16 == 0)) ||
            (stem_ok(p, w) && !input_grad)) &&
           cpu_ok();
}

#define STEM_LD 48 // the stem's padded rows: 32 lanes + the kernel's 2 extra columns, rounded up

static int out_len(int in, int pad, int k, int stride) {
    return (in + 2 * pad - k) / stride + 1;
}

// The geometry of one call: padded input (hp, wp), its phase planes (hq, wq) and the
// zero-margined output gradient (hg, wg, margin mg).
typedef struct geom {
    int    ho, wo, hp, wp, hq, wq, kk, mg, hg, wg;
    size_t cst; // floats between one channel's phase planes and the next's
    size_t gst; // floats between output-gradient planes
} geom;

static geom geom_of(const dt_kconv *p, int h, int w) {
    geom g;
    g.ho  = out_len(h, p->ph, p->kh, p->sh);
    g.wo  = out_len(w, p->pw, p->kw, p->sw);
    g.hp  = h + 2 * p->ph;
    g.wp  = w + 2 * p->pw;
    g.hq  = (g.hp + p->sh - 1) / p->sh;
    g.wq  = (g.wp + p->sw - 1) / p->sw;
    g.kk  = p->kh * p->kw;
    g.cst = (size_t)p->sh * p->sw * g.hq * g.wq;
    g.mg  = (p->kh > p->kw ? p->kh : p->kw) + 1;
    g.hg  = g.ho + 2 * g.mg;
    g.wg  = g.wo + 2 * g.mg;
    g.gst = (size_t)g.hg * g.wg;
    return g;
}

static size_t ints_in_floats(size_t n) {
    return (n * sizeof(int) + sizeof(float) - 1) / sizeof(float);
}

size_t dt_kcl_scratch(const dt_kconv *p, int h, int w) {
    geom   g     = geom_of(p, h, w);
    size_t wsize = (size_t)g.kk * p->cin * p->cout;
    size_t fwd   = wsize + (size_t)p->cin * g.cst + ints_in_floats(2 * (size_t)g.kk) + g.wp + 64;
    size_t bwd   = 2 * wsize + (size_t)p->cout * g.gst + (size_t)g.ho * g.wo * p->cout +
                 (size_t)g.hp * g.wp * p->cin +
                 ints_in_floats(2 * (size_t)g.kk + (size_t)p->sh * p->sw + 1) +
                 ((size_t)h * w + 16) * p->cin;
    if (p->sh == 1 && p->sw == 1) {
        dt_kconv t = transposed_conv(p);
        if (t.ph >= 0 && t.pw >= 0 && dt_kwino_fits(&t)) {
            size_t d = 3 * wsize + (size_t)p->cout * g.gst + (size_t)g.ho * g.wo * p->cout +
                       (size_t)g.hp * g.wp * p->cin + dt_kwino_scratch(&t, g.ho, g.wo);
            bwd = bwd > d ? bwd : d;
        }
    }
    if (dt_kwino_fits(p)) {
        size_t d = dt_kwino_dw_scratch(p, h, w), e = dt_kwino_backward_scratch(p, h, w);
        bwd = bwd > d ? bwd : d;
        bwd = bwd > e ? bwd : e;
    }
    size_t stem = (size_t)g.hp * STEM_LD + (size_t)p->cout * 9 * 16; // + the backward's sums
    if (dt_kwino_fits(p)) {
        size_t z = dt_kwino_scratch(p, h, w);
        stem     = stem > z ? stem : z;
    }
    fwd = fwd > stem ? fwd : stem;
    return fwd > bwd ? fwd : bwd;
}

// ------------------------------------------------------------------------- forward

// The stem (one input channel, 3x3, stride 1, rows of at most 32 pixels): 9 taps are
// too few to amortise a channels-last tile, so output pixels go in the lanes instead.
// The 9 shifted input rows of an output row (2 vectors each) stay in registers while
// 4 output channels at a time take their 9 weights as broadcasts; rows are stored
// straight into y with masks.

static bool stem_ok(const dt_kconv *p, int w) {
    return CL_KERNELS && p->cin == 1 && p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 &&
           p->cout % 4 == 0 && w + 2 * p->pw - 2 <= 32;
}

#if CL_KERNELS
CL_TARGET static void stem_forward(const dt_kconv *p, int n, int h, int w, const float *x,
                                   const float *wt, const float *b, float *y, float *xp) {
    int       ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2, hp = h + 2 * p->ph;
    __mmask16 m0 = wo >= 16 ? 0xFFFF : (__mmask16)((1u << wo) - 1),
              m1 = wo > 16 ? (__mmask16)((1u << (wo - 16)) - 1) : 0;
    memset(xp, 0, sizeof(float) * (size_t)hp * STEM_LD);
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < h; i++)
            copy_row(xp + (size_t)(i + p->ph) * STEM_LD + p->pw, x + ((size_t)s * h + i) * w, w);
        float *ys = y + (size_t)s * p->cout * ho * wo;
        for (int i = 0; i < ho; i++) {
            __m512 xv[9][2];
            UNROLL(9) for (int t = 0; t < 9; t++) {
                const float *r = xp + (size_t)(i + t / 3) * STEM_LD + t % 3;
                xv[t][0]       = _mm512_loadu_ps(r);
                xv[t][1]       = _mm512_loadu_ps(r + 16);
            }
            for (int o0 = 0; o0 < p->cout; o0 += 4) {
                __m512 acc[4][2];
                UNROLL(4) for (int k = 0; k < 4; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
                UNROLL(9) for (int t = 0; t < 9; t++) UNROLL(4) for (int k = 0; k < 4; k++) {
                    __m512 wv = _mm512_set1_ps(wt[(size_t)(o0 + k) * 9 + t]);
                    acc[k][0] = _mm512_fmadd_ps(wv, xv[t][0], acc[k][0]);
                    acc[k][1] = _mm512_fmadd_ps(wv, xv[t][1], acc[k][1]);
                }
                UNROLL(4) for (int k = 0; k < 4; k++) {
                    __m512 bo  = _mm512_set1_ps(p->bias ? b[o0 + k] : 0.0f);
                    float *dst = ys + ((size_t)(o0 + k) * ho + i) * wo;
                    _mm512_mask_storeu_ps(dst, m0, _mm512_add_ps(acc[k][0], bo));
                    _mm512_mask_storeu_ps(dst + 16, m1, _mm512_add_ps(acc[k][1], bo));
                }
            }
        }
    }
}

// The stem's weight gradient (its input gradient is never needed: the input is the
// data): dw[o][t] = sum over samples and output pixels of the input shifted by tap t
// times dy[o], with the pixels of an output row in the lanes, as its forward. Each
// (channel, tap) keeps sixteen lane sums over a sample's rows, added into `acc` per
// sample; the lanes are added up once, in double, at the end.
CL_TARGET static void stem_backward(const dt_kconv *p, int n, int h, int w, const float *x,
                                    const float *dy, float *dw, float *db, float *scratch) {
    int       ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2, hp = h + 2 * p->ph;
    __mmask16 m0 = wo >= 16 ? 0xFFFF : (__mmask16)((1u << wo) - 1),
              m1 = wo > 16 ? (__mmask16)((1u << (wo - 16)) - 1) : 0;
    float *xp = scratch, *acc = xp + (size_t)hp * STEM_LD; // acc[(o*9 + t)*16 + lane]
    memset(xp, 0, sizeof(float) * ((size_t)hp * STEM_LD + (size_t)p->cout * 9 * 16));
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < h; i++)
            copy_row(xp + (size_t)(i + p->ph) * STEM_LD + p->pw, x + ((size_t)s * h + i) * w, w);
        const float *dys = dy + (size_t)s * p->cout * ho * wo;
        for (int o = 0; o < p->cout; o++) {
            __m512 a[9];
            UNROLL(9) for (int t = 0; t < 9; t++) a[t] = _mm512_setzero_ps();
            for (int i = 0; i < ho; i++) {
                const float *d = dys + ((size_t)o * ho + i) * wo;
                __m512 d0 = _mm512_maskz_loadu_ps(m0, d), d1 = _mm512_maskz_loadu_ps(m1, d + 16);
                UNROLL(9) for (int t = 0; t < 9; t++) {
                    const float *r = xp + (size_t)(i + t / 3) * STEM_LD + t % 3;
                    a[t]           = _mm512_fmadd_ps(_mm512_loadu_ps(r), d0, a[t]);
                    a[t]           = _mm512_fmadd_ps(_mm512_loadu_ps(r + 16), d1, a[t]);
                }
            }
            float *ac = acc + (size_t)o * 9 * 16;
            UNROLL(9)
            for (int t = 0; t < 9; t++)
                _mm512_storeu_ps(ac + 16 * t, _mm512_add_ps(_mm512_loadu_ps(ac + 16 * t), a[t]));
        }
        if (p->bias && db)
            for (int o = 0; o < p->cout; o++) {
                double sum = 0.0;
                for (int q = 0; q < ho * wo; q++)
                    sum += dys[(size_t)o * ho * wo + q];
                db[o] += (float)sum;
            }
    }
    for (int k = 0; k < p->cout * 9; k++) {
        double sum = 0.0;
        for (int l = 0; l < 16; l++)
            sum += acc[(size_t)k * 16 + l];
        dw[k] += (float)sum;
    }
}
#endif

CL_TARGET void dt_kcl_forward(const dt_kconv *p, int n, int h, int w, const float *x,
                              const float *wt, const float *b, float *y, float *scratch) {
#if CL_KERNELS
    if (stem_ok(p, w)) {
        stem_forward(p, n, h, w, x, wt, b, y, scratch);
        return;
    }
    if (dt_kwino_ok(p, h, w)) {
        dt_kwino_forward(p, n, h, w, x, wt, b, y, scratch);
        return;
    }
    geom   g  = geom_of(p, h, w);
    int    kk = g.kk, cin = p->cin, cout = p->cout, sh = p->sh, sw = p->sw;
    float *wk = scratch, *xq = wk + (size_t)kk * cin * cout;
    int   *toff = (int *)(void *)(xq + (size_t)cin * g.cst), *tw = toff + kk;
    // wk[(t*cin + c)*cout + o] = w[o][c][t]
    for (int o = 0; o < cout; o++)
        for (int c = 0; c < cin; c++)
            for (int t = 0; t < kk; t++)
                wk[((size_t)t * cin + c) * cout + o] = wt[((size_t)o * cin + c) * kk + t];
    size_t pl = (size_t)g.hq * g.wq;
    for (int ki = 0; ki < p->kh; ki++)
        for (int kj = 0; kj < p->kw; kj++) {
            int t   = ki * p->kw + kj;
            toff[t] = (int)(((ki % sh) * sw + kj % sw) * pl) + ki / sh * g.wq + kj / sw;
            tw[t]   = t;
        }
    memset(xq, 0, sizeof(float) * (size_t)cin * g.cst); // padding stays zero
    int   V = cout % 32 == 0 ? 2 : 1, lanes = 16 * V;
    float tile[TILE_MAX];
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * cin * h * w;
        for (int c = 0; c < cin; c++)
            for (int i = 0; i < h; i++) {
                int          Y   = i + p->ph;
                const float *src = xs + ((size_t)c * h + i) * w;
                float *row = xq + c * g.cst + (size_t)(Y % sh) * sw * pl + (size_t)(Y / sh) * g.wq;
                if (sw == 1)
                    copy_row(row + p->pw, src, w);
                else if (sw == 2) {
                    split2(src, w, p->pw, row, row + pl);
                } else // phase by phase: column j = X - pw with X % sw == rx
                    for (int rx = 0; rx < sw; rx++) {
                        int    j0  = ((rx - p->pw) % sw + sw) % sw;
                        float *dst = row + (size_t)rx * pl + (j0 + p->pw) / sw;
                        for (int j = j0, q = 0; j < w; j += sw, q++)
                            dst[q] = src[j];
                    }
            }
        float *ys = y + (size_t)s * cout * g.ho * g.wo;
        for (int i = 0; i < g.ho; i++) {
            if (V == 2 && g.wo == 7 && i + 1 < g.ho && !getenv_is("DT_CONV_2ROWS", "0")) {
                for (int o0 = 0; o0 < cout; o0 += lanes) {
                    core2_7x2(xq + (size_t)i * g.wq, (size_t)g.wq, toff, kk, cin, g.cst, wk + o0,
                              cout, tile);
                    for (int r = 0; r < 2; r++)
                        store_tile(tile + (size_t)16 * r * lanes, 7, lanes,
                                   ys + ((size_t)o0 * g.ho + i + r) * g.wo, (size_t)g.ho * g.wo,
                                   p->bias ? b + o0 : NULL);
                }
                i++;
                continue;
            }
            for (int j0 = 0; j0 < g.wo;) {
                int np = 0;
                for (int o0 = 0; o0 < cout; o0 += lanes) {
                    np = core_run(V, g.wo - j0, xq + (size_t)i * g.wq + j0, toff, tw, kk, cin,
                                  g.cst, wk + o0, cout, tile);
                    store_tile(tile, np, lanes, ys + ((size_t)o0 * g.ho + i) * g.wo + j0,
                               (size_t)g.ho * g.wo, p->bias ? b + o0 : NULL);
                }
                j0 += np;
            }
        }
    }
#else // never called: dt_kcl_forward_ok says no
    (void)p, (void)n, (void)h, (void)w, (void)x, (void)wt, (void)b, (void)y, (void)scratch;
    (void)stem_ok;
#endif
}

// ------------------------------------------------------------------------ backward

// One weight-gradient block: dwt[(t*cin + c0 + r)*cout + o0 + lane] += sum over output
// pixels (i, j) of xcl[((i*sh + ki)*wp + j*sw + kj)*cin + c0 + r] * dycl[(i*wo + j)*cout
// + o0 + lane], r < R.
// clang-format off
#define DEFINE_DW(name, R, V)                                                                 \
    CL_TARGET static inline __attribute__((always_inline)) void name(                                \
        const float *restrict xcl, const float *restrict dycl, const geom *g, int cin,       \
        int cout, int sh, int sw, int ki, int kj, int c0, int o0, float *restrict dst) {     \
        dt_v16f acc[R][V];                                                                   \
        UNROLL(16) for (int r = 0; r < R; r++) UNROLL(4) for (int v = 0; v < V; v++)         \
            acc[r][v] = ZERO16();                                                    \
        size_t xstep = (size_t)sw * cin;                                                     \
        for (int i = 0; i < g->ho; i++) {                                                    \
            const float *xs = xcl + ((size_t)(i * sh + ki) * g->wp + kj) * cin + c0;         \
            const float *gs = dycl + (size_t)i * g->wo * cout + o0;                          \
            for (int j = 0; j < g->wo; j++, xs += xstep, gs += cout) {                       \
                dt_v16f gv[V];                                                               \
                UNROLL(4) for (int v = 0; v < V; v++) gv[v] = LOAD16(gs + 16 * v);        \
                UNROLL(16) for (int r = 0; r < R; r++) {                                     \
                    dt_v16f xb = BCAST(xs + r);                                          \
                    UNROLL(4) for (int v = 0; v < V; v++) acc[r][v] += xb * gv[v];           \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        UNROLL(16) for (int r = 0; r < R; r++) UNROLL(4) for (int v = 0; v < V; v++) {       \
            float *d = dst + (size_t)r * cout + 16 * v;                                      \
            STORE16(d, LOAD16(d) + acc[r][v]);                                         \
        }                                                                                    \
    }

// clang-format on
DEFINE_DW(dw_16x1, 16, 1)
DEFINE_DW(dw_8x1, 8, 1)
DEFINE_DW(dw_8x2, 8, 2)

CL_TARGET void dt_kcl_backward(const dt_kconv *p, int n, int h, int w, const float *x,
                               const float *wt, const float *dy, float *dx, float *dw, float *db,
                               float *scratch) {
#if CL_KERNELS
    if (stem_ok(p, w) && !dx) {
        stem_backward(p, n, h, w, x, dy, dw, db, scratch);
        return;
    }
    geom   g  = geom_of(p, h, w);
    int    kk = g.kk, cin = p->cin, cout = p->cout, sh = p->sh, sw = p->sw;
    size_t wsize = (size_t)kk * cin * cout, hwo = (size_t)g.ho * g.wo;
    float *wdx = scratch, *dwt = wdx + wsize, *dyp = dwt + wsize, *dycl = dyp + cout * g.gst,
          *xcl = dycl + hwo * cout;
    int *toff = (int *)(void *)(xcl + (size_t)g.hp * g.wp * cin), *tw = toff + kk,
        *ph0 = tw + kk; // taps of phase f: [ph0[f], ph0[f + 1])
    // strided input gradient, channels-last (16 pixels of slack for the transposes)
    float *dxcl = (float *)(void *)(ph0 + sh * sw + 1);
    if (dx && dt_kwino_dx(p, h, w) && dt_kwino_dw_ok(p, h, w)) {
        dt_kwino_backward(p, n, h, w, x, wt, dy, dx, dw, db, scratch);
        return;
    }
    if (dx && dt_kwino_dx(p, h, w)) {
        // dx first, as one Winograd convolution of dy; then dw alone below. Scratch:
        // the weight gradient's buffers, the flipped weights, Winograd's.
        dt_kconv t  = transposed_conv(p);
        float   *wf = xcl + (size_t)g.hp * g.wp * cin, *ws = wf + wsize;
        for (int o = 0; o < cout; o++) // wf[c][o][ki][kj] = w[o][c][kh-1-ki][kw-1-kj]
            for (int c = 0; c < cin; c++)
                for (int t2 = 0; t2 < kk; t2++)
                    wf[((size_t)c * cout + o) * kk + t2] =
                        wt[((size_t)o * cin + c) * kk + kk - 1 - t2];
        dt_kwino_forward(&t, n, g.ho, g.wo, dy, wf, NULL, dx, ws);
        dx = NULL;
    }
    if (!dx && dt_kwino_dw_ok(p, h, w)) { // the weight gradient alone, as Winograd too
        dt_kwino_dw(p, n, h, w, x, dy, dw, db, scratch);
        return;
    }
    if (dx) {
        // wdx[(t*cout + o)*cin + c] = w[o][c][t]
        for (int o = 0; o < cout; o++)
            for (int c = 0; c < cin; c++)
                for (int t = 0; t < kk; t++)
                    wdx[((size_t)t * cout + o) * cin + c] = wt[((size_t)o * cin + c) * kk + t];
        // input pixels with Y % sh == ry and X % sw == rx take taps ki = ry + m*sh,
        // kj = rx + q*sw, reading the output gradient m rows up and q columns left
        int nt = 0;
        for (int ry = 0; ry < sh; ry++)
            for (int rx = 0; rx < sw; rx++) {
                ph0[ry * sw + rx] = nt;
                for (int ki = ry; ki < p->kh; ki += sh)
                    for (int kj = rx; kj < p->kw; kj += sw) {
                        toff[nt] = -(ki - ry) / sh * g.wg - (kj - rx) / sw;
                        tw[nt++] = ki * p->kw + kj;
                    }
            }
        ph0[sh * sw] = nt;
        memset(dyp, 0, sizeof(float) * cout * g.gst); // margins stay zero
    }
    memset(dwt, 0, sizeof(float) * wsize);
    memset(xcl, 0, sizeof(float) * (size_t)g.hp * g.wp * cin);
    int   V = cin % 32 == 0 ? 2 : 1, lanes = 16 * V; // input gradient: cin in lanes
    int   Vw = cout % 32 == 0 ? 2 : 1, Rw = Vw == 1 && cin % 16 == 0 ? 16 : 8;
    float tile[TILE_MAX];
    for (int s = 0; s < n; s++) {
        const float *dys = dy + (size_t)s * cout * hwo, *xs = x + (size_t)s * cin * h * w;
        for (int o = 0; o < cout; o++) {
            const float *src = dys + (size_t)o * hwo;
            if (p->bias && db) {
                double acc = 0.0;
                for (size_t q = 0; q < hwo; q++)
                    acc += src[q];
                db[o] += (float)acc;
            }
            if (dx)
                for (int i = 0; i < g.ho; i++)
                    copy_row(dyp + o * g.gst + (size_t)(i + g.mg) * g.wg + g.mg,
                             src + (size_t)i * g.wo, g.wo);
        }
        // dycl (pixels, cout) and xcl (padded pixels, cin): 16x16 transposes, the last
        // pixels of a plane (or row) one by one
        size_t qf = hwo & ~(size_t)15;
        for (int o0 = 0; o0 < cout; o0 += 16) {
            for (size_t q0 = 0; q0 < qf; q0 += 16)
                transpose16(dys + (size_t)o0 * hwo + q0, hwo, dycl + q0 * cout + o0, (size_t)cout,
                            NULL, 16);
            for (int o = o0; o < o0 + 16; o++)
                for (size_t q = qf; q < hwo; q++)
                    dycl[q * cout + o] = dys[(size_t)o * hwo + q];
        }
        int jf = cin % 16 == 0 ? w & ~15 : 0;
        for (int i = 0; i < h; i++) {
            float *dst = xcl + ((size_t)(i + p->ph) * g.wp + p->pw) * cin;
            for (int c0 = 0; c0 < cin && jf; c0 += 16)
                for (int j0 = 0; j0 < jf; j0 += 16)
                    transpose16(xs + ((size_t)c0 * h + i) * w + j0, (size_t)h * w,
                                dst + (size_t)j0 * cin + c0, (size_t)cin, NULL, 16);
            for (int c = 0; c < cin; c++)
                for (int j = jf; j < w; j++)
                    dst[(size_t)j * cin + c] = xs[((size_t)c * h + i) * w + j];
        }
        for (int ki = 0; ki < p->kh; ki++)
            for (int kj = 0; kj < p->kw; kj++) {
                float *dst = dwt + (size_t)(ki * p->kw + kj) * cin * cout;
                for (int c0 = 0; c0 < cin; c0 += Rw)
                    for (int o0 = 0; o0 < cout; o0 += 16 * Vw) {
                        float *d = dst + (size_t)c0 * cout + o0;
                        if (Vw == 2)
                            dw_8x2(xcl, dycl, &g, cin, cout, sh, sw, ki, kj, c0, o0, d);
                        else if (Rw == 16)
                            dw_16x1(xcl, dycl, &g, cin, cout, sh, sw, ki, kj, c0, o0, d);
                        else
                            dw_8x1(xcl, dycl, &g, cin, cout, sh, sw, ki, kj, c0, o0, d);
                    }
            }
        if (!dx)
            continue;
        float *dxs = dx + (size_t)s * cin * h * w;
        for (int i = 0; i < h; i++) {
            int Y = i + p->ph, ry = Y % sh;
            for (int rx = 0; rx < sw; rx++) {
                int f = ry * sw + rx, nt = ph0[f + 1] - ph0[f];
                // the first input column of this phase, and how many there are
                int j0 = ((rx - p->pw) % sw + sw) % sw;
                if (j0 >= w)
                    continue;
                int np = (w - 1 - j0) / sw + 1;
                if (nt == 0) { // no tap reaches these pixels
                    for (int q = 0; q < np; q++)
                        memset(dxcl + ((size_t)i * w + j0 + (size_t)q * sw) * cin, 0,
                               sizeof(float) * (size_t)cin);
                    continue;
                }
                const float *base = dyp + (size_t)(Y / sh + g.mg) * g.wg + (j0 + p->pw) / sw + g.mg;
                for (int q0 = 0; q0 < np;) {
                    int done = 0;
                    for (int c0 = 0; c0 < cin; c0 += lanes) {
                        done = core_run(V, np - q0, base + q0, toff + ph0[f], tw + ph0[f], nt, cout,
                                        g.gst, wdx + c0, cin, tile);
                        float *d = dxs + ((size_t)c0 * h + i) * w + j0 + (size_t)q0 * sw;
                        if (sw == 1)
                            store_tile(tile, done, lanes, d, (size_t)h * w, NULL);
                        else // channels-last first, transposed below
                            for (int q = 0; q < done; q++)
                                copy_row(dxcl + ((size_t)i * w + j0 + (size_t)(q0 + q) * sw) * cin +
                                             c0,
                                         tile + (size_t)q * lanes, lanes);
                    }
                    q0 += done;
                }
            }
        }
        if (sw > 1)
            for (int i = 0; i < h; i++)
                for (int j0 = 0; j0 < w; j0 += 16)
                    for (int c0 = 0; c0 < cin; c0 += 16)
                        transpose16(dxcl + ((size_t)i * w + j0) * cin + c0, (size_t)cin,
                                    dxs + ((size_t)c0 * h + i) * w + j0, (size_t)h * w, NULL,
                                    w - j0);
    }
    // dw[o][c][t] += dwt[(t*cin + c)*cout + o]
    for (int o = 0; o < cout; o++)
        for (int c = 0; c < cin; c++)
            for (int t = 0; t < kk; t++)
                dw[((size_t)o * cin + c) * kk + t] += dwt[((size_t)t * cin + c) * cout + o];
#else // never called: dt_kcl_backward_ok says no
    (void)p, (void)n, (void)h, (void)w, (void)x, (void)wt, (void)dy, (void)dx, (void)dw, (void)db;
    (void)scratch;
#endif
}
