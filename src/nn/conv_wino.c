// conv_wino.c: stride-1 3x3 convolutions as Winograd F(2x2, 3x3) (conv_cl_impl.h), on
// the register blocks of conv_cl.c: the forward, and through it the input gradient (a
// convolution of dy with the flipped weights).
#include "nn/conv_cl_impl.h"

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
bool dt_nn_wino_fits(const dt_nn_conv2d *p) {
    return CL_KERNELS && p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 && p->groups == 1 &&
           p->cout % 16 == 0;
}

bool dt_nn_wino_ok(const dt_nn_conv2d *p, int h, int w) {
    int tiles = ((h + 2 * p->ph - 1) / 2) * ((w + 2 * p->pw - 1) / 2);
    if (!dt_nn_wino_fits(p) || getenv_is("DT_CONV_WINO", "0"))
        return false;
    return getenv_is("DT_CONV_WINO", "1") || (p->cin >= 16 && tiles >= 16);
}

// Floats between the 16 planes of V and of M: 64 bytes more than their size, so that
// the 16 loads or stores of one tile's transform do not all fall in one cache set (at
// 7x7, 16 tiles x 64 channels is exactly 4 KiB).
static size_t wino_vst(const dt_nn_conv2d *p, int T) {
    return (size_t)p->cin * T + 16;
}
static size_t wino_mst(const dt_nn_conv2d *p, int T) {
    return (size_t)T * p->cout + 16;
}

static wino wino_of(const dt_nn_conv2d *p, int h, int w) {
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

size_t dt_nn_wino_scratch(const dt_nn_conv2d *p, int h, int w) {
    wino z = wino_of(p, h, w);
    return z.ycl + ((size_t)4 * z.T + 16) * p->cout;
}

bool dt_nn_wino_dx(const dt_nn_conv2d *p, int h, int w) {
    if (p->sh != 1 || p->sw != 1)
        return false;
    dt_nn_conv2d t  = transposed_conv(p);
    int          ho = h + 2 * p->ph - p->kh + 1, wo = w + 2 * p->pw - p->kw + 1;
    return t.ph >= 0 && t.pw >= 0 && dt_nn_wino_ok(&t, ho, wo);
}

#if CL_KERNELS
CL_TARGET void dt_nn_wino_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                                  const float *wt, const float *b, float *y, float *scratch) {
    wino   z   = wino_of(p, h, w);
    int    cin = p->cin, cout = p->cout, ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2;
    int    T = z.T, W2 = 2 * z.tw;
    size_t vst = wino_vst(p, T), mst = wino_mst(p, T);
    float *U = scratch + z.u, *xp = scratch + z.xp, *Vt = scratch + z.v, *M = scratch + z.m,
          *ycl                  = scratch + z.ycl;
    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    for (int o = 0; o < cout; o++) // U[xi][c][o] = (G g G^T)[xi]
        for (int c = 0; c < cin; c++) {
            const float *g = wt + ((size_t)o * cin + c) * 9;
            double       t[4][3];
            for (int a = 0; a < 4; a++)
                for (int j = 0; j < 3; j++)
                    t[a][j] = G[a][0] * g[j] + G[a][1] * g[3 + j] + G[a][2] * g[6 + j];
            for (int a = 0; a < 4; a++)
                for (int bb = 0; bb < 4; bb++)
                    U[((size_t)(a * 4 + bb) * cin + c) * cout + o] =
                        (float)(t[a][0] * G[bb][0] + t[a][1] * G[bb][1] + t[a][2] * G[bb][2]);
        }
    memset(xp, 0, sizeof(float) * ((size_t)cin * z.hx * z.lx + 32));
    int           V = cout % 32 == 0 ? 2 : 1, lanes = 16 * V;
    const int     zero[1] = {0};
    const __m512i i0 = _mm512_set_epi32(0, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0),
                  i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(1)),
                  i2 = _mm512_add_epi32(i0, _mm512_set1_epi32(2)),
                  i3 = _mm512_add_epi32(i0, _mm512_set1_epi32(3));
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * cin * h * w;
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
        // M[xi][og][tile][lane] = sum_c V[xi][c][tile] * U[xi][c][og*lanes + lane]: the
        // register blocks write their tiles straight into M
        for (int xi = 0; xi < 16; xi++)
            for (int t0 = 0; t0 < T;) {
                int np = 0;
                for (int o0 = 0; o0 < cout; o0 += lanes)
                    np = core_run(V, T - t0, Vt + (size_t)xi * vst + t0, zero, zero, 1, cin,
                                  (size_t)T, U + (size_t)xi * cin * cout + o0, cout,
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
                        _mm512_storeu_ps(d,
                                         _mm512_add_ps(_mm512_add_ps(t[r][0], t[r][1]), t[r][2]));
                        _mm512_storeu_ps(d + cout,
                                         _mm512_sub_ps(_mm512_sub_ps(t[r][1], t[r][2]), t[r][3]));
                    }
                }
        float *ys = y + (size_t)s * cout * ho * wo;
        for (int i = 0; i < ho; i++)
            for (int j0 = 0; j0 < wo; j0 += 16)
                for (int c0 = 0; c0 < cout; c0 += 16)
                    transpose16(ycl + ((size_t)i * W2 + j0) * cout + c0, (size_t)cout,
                                ys + ((size_t)c0 * ho + i) * wo + j0, (size_t)ho * wo,
                                p->bias ? b + c0 : NULL, wo - j0);
    }
}
#endif
