// norm.c: BatchNorm's statistics, normalisation and backward over a range of channels
// or rows, and LayerNorm over the last dimension (the rows behind nn/ops.h's dt_nn_bn_*
// and dt_nn_layernorm_*; vec.h). BatchNorm's statistics add rows up in double: a
// channel of the ResNet's stem holds n*784 values, and one float sum of squares over
// that many would lose the digits the golden tests ask for. Every channel's and row's
// sums are added in the same order whatever range a call covers, so threads that split
// the channels or rows differently get the same bits.
#include "kernels/vec/vec.h"

#include <math.h>

// For one row of l values: sum of a, and sum of a * (b - bm) (b = a, bm = 0: the sum of
// squares), in sixteen float lanes (VH vectors); the rows are then added up in double. Lanes hold
// at most a row's l/16 terms (49 for a 28x28 plane), so float loses nothing that matters.
DT_VINLINE void row_moments(const float *a, const float *b, float bm, int l, double *s, double *q) {
    vf  sa[VH] = {0}, sq[VH] = {0}, mv = vsplat(bm);
    int j = 0;
    for (; j + 16 <= l; j += 16)
        UNROLL(2) for (int h = 0; h < VH; h++) {
            vf va = vload(a + j + h * VL);
            sa[h] += va;
            sq[h] += va * (vload(b + j + h * VL) - mv);
        }
    float ts = vhsum16(sa), tq = vhsum16(sq);
    for (; j < l; j++) {
        ts += a[j];
        tq += a[j] * (b[j] - bm);
    }
    *s += ts;
    *q += tq;
}

// For one row of l values: the sum of x - k and of (x - k)^2, in sixteen float lanes (VH vectors);
// the rows are then added up in double. Lanes hold at most a row's l/16 terms (49 for a
// 28x28 plane), so float loses nothing that matters.
DT_VINLINE void row_shifted(const float *x, float k, int l, double *s, double *q) {
    vf  sa[VH] = {0}, sq[VH] = {0}, kv = vsplat(k);
    int j = 0;
    for (; j + 16 <= l; j += 16)
        UNROLL(2) for (int h = 0; h < VH; h++) {
            vf d = vload(x + j + h * VL) - kv;
            sa[h] += d;
            sq[h] += d * d;
        }
    float ts = vhsum16(sa), tq = vhsum16(sq);
    for (; j < l; j++) {
        float d = x[j] - k;
        ts += d;
        tq += d * d;
    }
    *s += ts;
    *q += tq;
}

// The per-channel sums below walk the batch in memory order (sample by sample, the
// channels of a sample in turn) rather than channel by channel, which would jump a
// sample's size between rows: the same additions in the same order per channel.
//
// The variance is never formed as E[x^2] - E[x]^2: when the mean is large against the
// spread that difference cancels, and the rounding of the sum of squares (2^-24 of
// E[x^2]) becomes an error of E[x^2]/var times that in the variance, which BatchNorm
// divides by (and SyncBatchNorm, whose sums travel as floats, rounded differently from
// one process). The squares are taken about a shift k near the mean instead: the mean
// of the channel's first row. m2 = sum (x - k)^2 - (sum (x - k))^2 / count then
// cancels only by (mean - k)^2 / var, the spread of one row's mean, not by E[x^2]/var.
enum { CH_BLOCK = 64 }; // channels whose double sums stay on the stack at a time

static void bn_stats(int n, int c, int c0, int c1, int l, const float *x, double *sum, double *m2) {
    double count = (double)n * l;
    for (int b0 = c0; b0 < c1; b0 += CH_BLOCK) {
        int    b1          = b0 + CH_BLOCK < c1 ? b0 + CH_BLOCK : c1;
        double s[CH_BLOCK] = {0}, q[CH_BLOCK] = {0};
        float  k[CH_BLOCK];
        for (int ch = b0; ch < b1; ch++) { // the shift: the first row's mean
            double s0 = 0, q0 = 0;
            row_shifted(x + (size_t)ch * l, 0.0f, l, &s0, &q0);
            k[ch - b0] = n > 0 ? (float)(s0 / l) : 0.0f;
        }
        for (int i = 0; i < n; i++)
            for (int ch = b0; ch < b1; ch++)
                row_shifted(x + ((size_t)i * c + ch) * l, k[ch - b0], l, &s[ch - b0], &q[ch - b0]);
        for (int ch = b0; ch < b1; ch++) {
            double sd = s[ch - b0], dev = count > 0 ? q[ch - b0] - sd * sd / count : 0.0;
            sum[ch - c0] = sd + count * k[ch - b0];
            m2[ch - c0]  = dev > 0.0 ? dev : 0.0; // rounding, for a constant channel
        }
    }
}

// The normalisation as one multiply-add, y = x * scale + shift, for channel ch.
DT_VINLINE void scale_shift(int ch, const float *mean, const float *invstd, const float *gamma,
                            const float *beta, float *scale, float *shift) {
    *scale = invstd[ch] * (gamma ? gamma[ch] : 1.0f);
    *shift = (beta ? beta[ch] : 0.0f) - mean[ch] * *scale;
}

// y = x * scale + shift (+ r) (then max(0, .)), one row of l values.
DT_VINLINE void apply_row(const float *x, const float *r, bool relu, float scale, float shift,
                          int l, float *y) {
    vf  sc = vsplat(scale), sh = vsplat(shift);
    int j = 0;
    for (; j + VL <= l; j += VL) {
        vf v = vload(x + j) * sc + sh;
        if (r)
            v += vload(r + j);
        vstore(y + j, relu ? vkeep_positive(v, v) : v);
    }
    for (; j < l; j++) {
        float v = x[j] * scale + shift;
        if (r)
            v += r[j];
        y[j] = relu && !(v > 0.0f) ? 0.0f : v;
    }
}

static void bn_apply(int n, int c, int l, int r0, int r1, const float *x, const float *mean,
                     const float *invstd, const float *gamma, const float *beta, const float *res,
                     bool relu, float *y) {
    (void)n;
    for (int row = r0; row < r1; row++) {
        int   ch = row % c;
        float scale, shift; // y = x * scale + shift, one multiply-add per value
        scale_shift(ch, mean, invstd, gamma, beta, &scale, &shift);
        size_t o = (size_t)row * l;
        apply_row(x + o, res ? res + o : NULL, relu, scale, shift, l, y + o);
    }
}

// The gradient reaching the normalisation in one row: dy, or behind a ReLU, dy where
// the ReLU's input was positive: from its output y, or recomputed from x with the
// forward's own multiply-add (so the same lanes pass).
typedef struct grad_row {
    const float *dy, *y, *x;
    int          mode; // 0: no ReLU; 1: mask from y; 2: from x * sc + sh
    float        sc, sh;
} grad_row;

// (DT_NO_FMA: the shift of mode 2 is rounded after its product on every target, as it
// always was; the forward's apply_row contracts it from avx2 up, so the recomputed mask
// can differ from the forward's where x * sc + sh is within a rounding of 0.)
DT_NO_FMA static grad_row grad_row_of(const dt_kbn_relu *relu, size_t o, int ch, const float *x,
                                      const float *dy, const float *mean, const float *invstd) {
    grad_row g = {dy + o, NULL, x + o, 0, 0.0f, 0.0f};
    if (relu && relu->y) {
        g.y    = relu->y + o;
        g.mode = 1;
    } else if (relu) {
        g.mode = 2;
        scale_shift(ch, mean, invstd, relu->gamma, relu->beta, &g.sc, &g.sh);
    }
    return g;
}

DT_VINLINE vf grad_in_v(const grad_row *g, int j) {
    vf d = vload(g->dy + j);
    if (g->mode == 1)
        return vkeep_positive(vload(g->y + j), d);
    if (g->mode == 2)
        return vkeep_positive(vload(g->x + j) * vsplat(g->sc) + vsplat(g->sh), d);
    return d;
}
DT_VINLINE float grad_in(const grad_row *g, int j) {
    if (g->mode == 1)
        return g->y[j] > 0.0f ? g->dy[j] : 0.0f;
    if (g->mode == 2)
        return g->x[j] * g->sc + g->sh > 0.0f ? g->dy[j] : 0.0f;
    return g->dy[j];
}

static void bn_bwd_stats(int n, int c, int c0, int c1, int l, const float *x, const float *dy,
                         const dt_kbn_relu *relu, const float *mean, const float *invstd,
                         float *sum_dy, float *sum_dyx, float *dres) {
    for (int b0 = c0; b0 < c1; b0 += CH_BLOCK) {
        int    b1          = b0 + CH_BLOCK < c1 ? b0 + CH_BLOCK : c1;
        double s[CH_BLOCK] = {0}, q[CH_BLOCK] = {0};
        for (int i = 0; i < n; i++)
            for (int ch = b0; ch < b1; ch++) {
                size_t o = ((size_t)i * c + ch) * l;
                float  m = mean[ch];
                if (!relu && !dres) { // the plain BatchNorm
                    row_moments(dy + o, x + o, m, l, &s[ch - b0], &q[ch - b0]);
                    continue;
                }
                // as row_moments, on the gradient behind the ReLU, which goes to dres too
                grad_row g      = grad_row_of(relu, o, ch, x, dy, mean, invstd);
                vf       sa[VH] = {0}, sq[VH] = {0}, mv = vsplat(m);
                int      j = 0;
                for (; j + 16 <= l; j += 16)
                    UNROLL(2) for (int h = 0; h < VH; h++) {
                        int jh = j + h * VL;
                        vf  d  = grad_in_v(&g, jh);
                        if (dres)
                            vstore(dres + o + jh, d);
                        sa[h] += d;
                        sq[h] += d * (vload(g.x + jh) - mv);
                    }
                float ts = vhsum16(sa), tq = vhsum16(sq);
                for (; j < l; j++) {
                    float d = grad_in(&g, j);
                    if (dres)
                        dres[o + j] = d;
                    ts += d;
                    tq += d * (g.x[j] - m);
                }
                s[ch - b0] += ts;
                q[ch - b0] += tq;
            }
        for (int ch = b0; ch < b1; ch++) {
            sum_dy[ch]  = (float)s[ch - b0];
            sum_dyx[ch] = (float)(q[ch - b0] * invstd[ch]);
        }
    }
}

static void bn_bwd_apply(int n, int c, int l, int r0, int r1, const float *x, const float *dy,
                         const dt_kbn_relu *relu, const float *mean, const float *invstd,
                         const float *gamma, const float *sum_dy, const float *sum_dyx,
                         double count, float *dx) {
    (void)n;
    for (int row = r0; row < r1; row++) {
        int      ch = row % c;
        size_t   o  = (size_t)row * l;
        grad_row g  = grad_row_of(relu, o, ch, x, dy, mean, invstd);
        float   *gr = dx + o;
        float    gs = invstd[ch] * (gamma ? gamma[ch] : 1.0f);
        // dx = gs (dy - a - (x - mean) b): a = mean of dy, b = invstd * mean of dy xhat
        // (evaluation, count 0: the statistics are constants, dx = gs dy)
        float a  = count > 0 ? (float)(sum_dy[ch] / count) : 0.0f;
        float b  = count > 0 ? (float)(sum_dyx[ch] / count) * invstd[ch] : 0.0f;
        float m  = mean[ch];
        vf    av = vsplat(a), bv = vsplat(b), mv = vsplat(m), gv = vsplat(gs);
        int   j = 0;
        for (; j + VL <= l; j += VL)
            vstore(gr + j, gv * (grad_in_v(&g, j) - av - (vload(g.x + j) - mv) * bv));
        for (; j < l; j++)
            gr[j] = gs * (grad_in(&g, j) - a - (g.x[j] - m) * b);
    }
}

// Sums of a row in sixteen running lanes (vectorised; the order is fixed, so every CPU
// gives the same result).
DT_VINLINE float row_sum16(const float *x, int d) {
    vf  acc[VH] = {0};
    int i       = 0;
    for (; i + 16 <= d; i += 16)
        UNROLL(2) for (int h = 0; h < VH; h++) acc[h] += vload(x + i + h * VL);
    float s = vhsum16(acc);
    for (; i < d; i++)
        s += x[i];
    return s;
}

static void ln_fwd(int rows, int d, float eps, const float *x, const float *gamma,
                   const float *beta, float *y, float *mean, float *rstd) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float       *yr = y + (size_t)r * d;
        // two passes: the mean, then the squared deviations (no cancellation)
        float m  = row_sum16(xr, d) / (float)d;
        vf    mv = vsplat(m), acc[VH] = {0};
        int   i = 0;
        for (; i + 16 <= d; i += 16)
            UNROLL(2) for (int h = 0; h < VH; h++) {
                vf c = vload(xr + i + h * VL) - mv;
                acc[h] += c * c;
            }
        float q = vhsum16(acc);
        for (; i < d; i++)
            q += (xr[i] - m) * (xr[i] - m);
        float rs = 1.0f / sqrtf(q / (float)d + eps);
        mean[r]  = m;
        rstd[r]  = rs;
        for (i = 0; i + VL <= d; i += VL) {
            vf v = (vload(xr + i) - mv) * rs;
            vstore(yr + i, gamma ? v * vload(gamma + i) + vload(beta + i) : v);
        }
        for (; i < d; i++) {
            float v = (xr[i] - m) * rs;
            yr[i]   = gamma ? v * gamma[i] + beta[i] : v;
        }
    }
}

static void ln_bwd(int rows, int d, const float *x, const float *gamma, const float *mean,
                   const float *rstd, const float *dy, float *dx, float *dgamma, float *dbeta) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        const float *dr = dy + (size_t)r * d;
        float        m = mean[r], rs = rstd[r];
        // g = dy * gamma; dx = rs (g - mean(g) - xhat mean(g xhat))
        vf  mv = vsplat(m), sg[VH] = {0}, sgx[VH] = {0};
        int i = 0;
        for (; i + 16 <= d; i += 16)
            UNROLL(2) for (int h = 0; h < VH; h++) {
                int ih = i + h * VL;
                vf  xh = (vload(xr + ih) - mv) * rs, dv = vload(dr + ih);
                vf  g = gamma ? dv * vload(gamma + ih) : dv;
                sg[h] += g;
                sgx[h] += g * xh;
                if (dgamma) {
                    vstore(dgamma + ih, vload(dgamma + ih) + dv * xh);
                    vstore(dbeta + ih, vload(dbeta + ih) + dv);
                }
            }
        float a = vhsum16(sg), b = vhsum16(sgx);
        for (; i < d; i++) {
            float xh = (xr[i] - m) * rs;
            float g  = gamma ? dr[i] * gamma[i] : dr[i];
            a += g;
            b += g * xh;
            if (dgamma) {
                dgamma[i] += dr[i] * xh;
                dbeta[i] += dr[i];
            }
        }
        if (!dx)
            continue;
        float *gr = dx + (size_t)r * d;
        a /= (float)d;
        b /= (float)d;
        for (i = 0; i + VL <= d; i += VL) {
            vf xh = (vload(xr + i) - mv) * rs, dv = vload(dr + i);
            vf g = gamma ? dv * vload(gamma + i) : dv;
            vstore(gr + i, rs * (g - a - xh * b));
        }
        for (; i < d; i++) {
            float xh = (xr[i] - m) * rs;
            float g  = gamma ? dr[i] * gamma[i] : dr[i];
            gr[i]    = rs * (g - a - xh * b);
        }
    }
}

void DT_KV(fill_norm)(dt_ktab *t) {
    t->bn_stats     = bn_stats;
    t->bn_apply     = bn_apply;
    t->bn_bwd_stats = bn_bwd_stats;
    t->bn_bwd_apply = bn_bwd_apply;
    t->ln_fwd       = ln_fwd;
    t->ln_bwd       = ln_bwd;
}
