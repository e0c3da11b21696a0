// dataset_any.c: datasets of any per-sample shape (bytes or floats, labels or float
// targets, in memory or from a callback), their per-channel normalisation and their
// augmentation (random crop with padding, horizontal flip) keyed by
// (seed, epoch, dataset index). See data.h, "General datasets".
#include "data_impl.h"
#include "dtrain/rng.h"

#include <stdio.h>
#include <string.h>

#define MAX_CROP_PAD 4096

dt_dataset_opts dt_dataset_opts_plain(void) {
    dt_dataset_opts o = dt_dataset_opts_default();
    o.num_classes     = 0;
    o.mean            = 0.0f;
    o.std             = 1.0f;
    return o;
}

void dt_data_dataset_free_extra(dt_dataset *ds) {
    if (ds->data != ds->images)
        dt_free(ds->data);
    dt_free(ds->labels32);
    dt_free(ds->targets);
    dt_free(ds->ch_lut);
    ds->data     = NULL;
    ds->labels32 = NULL;
    ds->targets  = NULL;
    ds->ch_lut   = NULL;
}

static dt_status check_shape(int ndim, const int *shape, size_t *elems, const char *who) {
    if (ndim < 1 || ndim > DT_DATASET_MAX_DIMS)
        return dt_fail(DT_ERR_ARG, "%s: expected 1 to %d per-sample dimensions, found %d", who,
                       DT_DATASET_MAX_DIMS, ndim);
    size_t e = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return dt_fail(DT_ERR_ARG, "%s: expected per-sample dimensions >= 1, found %d at %d",
                           who, shape[i], i);
        if (!dt_size_mul(&e, e, (size_t)shape[i]) || e > (size_t)1 << 40)
            return dt_fail(DT_ERR_ARG, "%s: the per-sample size overflows", who);
    }
    *elems = e;
    return DT_OK;
}

dt_status dt_data_dataset_finish(dt_dataset *ds, const dt_dataset_opts *o) {
    const char *who = "dataset";
    DT_TRY(check_shape(ds->ndim, ds->shape, &ds->sample_elems, who));
    ds->h = ds->ndim >= 2 ? ds->shape[ds->ndim - 2] : 1;
    ds->w = ds->shape[ds->ndim - 1];
    if (!(o->std > 0.0f) || !(o->mean == o->mean))
        return dt_fail(DT_ERR_ARG, "%s: expected std > 0 and a finite mean, found std %g, mean %g",
                       who, (double)o->std, (double)o->mean);
    ds->mean = o->mean;
    ds->std  = o->std;
    for (int p = 0; p < 256; p++) // the IDX datasets' table, kept for their users
        ds->lut[p] = ((float)p / 255.0f - ds->mean) / ds->std;
    int c = o->channels;
    if (c == 0 || c == 1) {
        ds->channels   = 1;
        ds->ch_mean[0] = c ? o->ch_mean[0] : o->mean;
        ds->ch_std[0]  = c ? o->ch_std[0] : o->std;
    } else {
        if (c < 0 || c > DT_DATASET_MAX_CHANNELS || ds->ndim < 2 || c != ds->shape[0])
            return dt_fail(DT_ERR_ARG,
                           "%s: expected normalisation channels 0, 1 or the first per-sample "
                           "dimension (%d, of %d dimensions; at most %d), found %d",
                           who, ds->shape[0], ds->ndim, DT_DATASET_MAX_CHANNELS, c);
        ds->channels = c;
        memcpy(ds->ch_mean, o->ch_mean, (size_t)c * sizeof(float));
        memcpy(ds->ch_std, o->ch_std, (size_t)c * sizeof(float));
    }
    for (int i = 0; i < ds->channels; i++)
        if (!(ds->ch_std[i] > 0.0f) || !(ds->ch_mean[i] == ds->ch_mean[i]))
            return dt_fail(DT_ERR_ARG,
                           "%s: expected std > 0 and a finite mean for channel %d, found std %g, "
                           "mean %g",
                           who, i, (double)ds->ch_std[i], (double)ds->ch_mean[i]);
    if (o->crop_pad < 0 || o->crop_pad > MAX_CROP_PAD)
        return dt_fail(DT_ERR_ARG, "%s: expected crop_pad in [0, %d], found %d", who, MAX_CROP_PAD,
                       o->crop_pad);
    if ((o->crop_pad || o->hflip) && ds->ndim < 2)
        return dt_fail(DT_ERR_ARG,
                       "%s: expected samples of at least 2 dimensions (..., H, W) for crop or "
                       "flip, found %d",
                       who, ds->ndim);
    ds->crop_pad = o->crop_pad;
    ds->hflip    = o->hflip;
    ds->aug_seed = o->aug_seed;
    if (ds->type == DT_SAMPLE_U8 && !ds->fill) {
        ds->ch_lut = dt_alloc((size_t)ds->channels * 256 * sizeof(float));
        if (!ds->ch_lut)
            return DT_ERR_NOMEM;
        for (int ch = 0; ch < ds->channels; ch++)
            for (int p = 0; p < 256; p++)
                ds->ch_lut[ch * 256 + p] = ((float)p / 255.0f - ds->ch_mean[ch]) / ds->ch_std[ch];
    }
    return DT_OK;
}

static dt_status check_labels32(const int32_t *y, size_t n, int num_classes, const char *where) {
    for (size_t i = 0; i < n; i++)
        if (y[i] < 0 || (num_classes > 0 && y[i] >= num_classes)) {
            if (num_classes > 0)
                return dt_fail(DT_ERR_FORMAT,
                               "%s: expected labels in [0, %d), found %d at index %zu", where,
                               num_classes, y[i], i);
            return dt_fail(DT_ERR_FORMAT, "%s: expected labels >= 0, found %d at index %zu", where,
                           y[i], i);
        }
    return DT_OK;
}

static void *copy_of(const void *p, size_t n) {
    void *q = dt_alloc(n);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

// Adopts *steal (a dt_alloc buffer) when it is `src`, else copies `src`.
static void *take_or_copy(const void *src, size_t bytes, void **steal) {
    if (steal && *steal && *steal == src) {
        void *p = *steal;
        *steal  = NULL;
        return p;
    }
    return copy_of(src, bytes);
}

// dt_dataset_init_desc; the buffers of x and y (when given) are adopted, not copied.
static dt_status init_desc(dt_dataset *ds, const dt_dataset_desc *d, const dt_dataset_opts *opts,
                           dt_npy *x, dt_npy *y) {
    memset(ds, 0, sizeof *ds);
    dt_dataset_opts o   = opts ? *opts : dt_dataset_opts_plain();
    const char     *who = "dataset";
    size_t          elems;
    DT_TRY(check_shape(d->ndim, d->shape, &elems, who));
    if (d->type != DT_SAMPLE_U8 && d->type != DT_SAMPLE_F32)
        return dt_fail(DT_ERR_ARG,
                       "%s: expected sample type DT_SAMPLE_U8 or DT_SAMPLE_F32, found %d", who,
                       (int)d->type);
    if (d->target != DT_TARGET_NONE && d->target != DT_TARGET_LABEL && d->target != DT_TARGET_FLOAT)
        return dt_fail(DT_ERR_ARG, "%s: expected a dt_target_kind, found %d", who, (int)d->target);
    if (d->target == DT_TARGET_FLOAT && d->target_elems < 1)
        return dt_fail(DT_ERR_ARG, "%s: expected target_elems >= 1 for float targets, found 0",
                       who);
    bool missing = !d->fill && d->n &&
                   (!d->data || (d->target == DT_TARGET_LABEL && !d->labels) ||
                    (d->target == DT_TARGET_FLOAT && !d->targets));
    if (missing)
        return dt_fail(DT_ERR_ARG,
                       "%s: expected sample data and the labels or targets the description names, "
                       "found NULL",
                       who);
    if (o.num_classes < 0)
        return dt_fail(DT_ERR_ARG, "%s: expected num_classes >= 0, found %d", who, o.num_classes);
    size_t n = o.limit && o.limit < d->n ? o.limit : d->n;
    if (n > UINT32_MAX)
        return dt_fail(DT_ERR_ARG, "%s: expected at most %u samples, found %zu", who, UINT32_MAX,
                       n);
    ds->type         = d->fill ? DT_SAMPLE_F32 : d->type;
    ds->ndim         = d->ndim;
    ds->n            = n;
    ds->num_classes  = o.num_classes;
    ds->fill         = d->fill;
    ds->user         = d->user;
    ds->has_labels   = d->target == DT_TARGET_LABEL;
    ds->target_elems = d->target == DT_TARGET_FLOAT ? d->target_elems : 0;
    memcpy(ds->shape, d->shape, (size_t)d->ndim * sizeof(int));
    dt_status st = DT_OK;
    if (!d->fill) {
        size_t es = d->type == DT_SAMPLE_U8 ? 1 : sizeof(float), bytes, tbytes = 0;
        if (!dt_size_mul(&bytes, n, elems) || !dt_size_mul(&bytes, bytes, es) ||
            !dt_size_mul(&tbytes, n, ds->target_elems) ||
            !dt_size_mul(&tbytes, tbytes, sizeof(float)))
            return dt_fail(DT_ERR_ARG, "%s: %zu samples overflow size_t", who, n);
        if (ds->has_labels)
            DT_TRY(check_labels32(d->labels, n, o.num_classes, who));
        ds->data = take_or_copy(d->data, bytes, x ? &x->data : NULL);
        if (ds->has_labels)
            ds->labels32 = take_or_copy(d->labels, n * sizeof(int32_t), y ? &y->data : NULL);
        if (ds->target_elems)
            ds->targets = take_or_copy(d->targets, tbytes, y ? &y->data : NULL);
        if (!ds->data || (ds->has_labels && !ds->labels32) || (ds->target_elems && !ds->targets))
            st = DT_ERR_NOMEM;
        if (ds->type == DT_SAMPLE_U8)
            ds->images = ds->data;
    }
    if (st == DT_OK)
        st = dt_data_dataset_finish(ds, &o);
    if (st)
        dt_dataset_free(ds);
    return st;
}

dt_status dt_dataset_init_desc(dt_dataset *ds, const dt_dataset_desc *d,
                               const dt_dataset_opts *opts) {
    return init_desc(ds, d, opts, NULL, NULL);
}

dt_status dt_dataset_load_npy(dt_dataset *ds, const char *x_path, const char *y_path,
                              const dt_dataset_opts *opts) {
    memset(ds, 0, sizeof *ds);
    dt_dataset_opts o = opts ? *opts : dt_dataset_opts_plain();
    dt_npy          x = {0}, y = {0};
    DT_TRY(dt_npy_read(x_path, &x));
    dt_status st = DT_OK;
    // The array's dimensions: N, then 0 to DT_DATASET_MAX_DIMS per sample (an (N) array
    // is N samples of shape (1)). A scalar has no N at all.
    if (x.ndim < 1)
        st = dt_fail(DT_ERR_FORMAT,
                     "%s: expected an array of shape (N, ...) (N samples), found a scalar "
                     "(shape ())",
                     x_path);
    else if (x.ndim > DT_DATASET_MAX_DIMS + 1)
        st = dt_fail(DT_ERR_FORMAT,
                     "%s: expected samples of shape (N, ...) with at most %d dimensions after N, "
                     "found %d",
                     x_path, DT_DATASET_MAX_DIMS, x.ndim - 1);
    for (int i = 1; st == DT_OK && i < x.ndim; i++)
        if (x.shape[i] < 1 || x.shape[i] > INT32_MAX)
            st = dt_fail(DT_ERR_FORMAT, "%s: expected per-sample dimensions in [1, %d], found %zu",
                         x_path, INT32_MAX, x.shape[i]);
    if (st == DT_OK && x.dtype != DT_NPY_U8 && x.dtype != DT_NPY_F32)
        st = dt_npy_convert(&x, DT_NPY_F32, x_path);
    dt_dataset_desc d = {.n = x.ndim ? x.shape[0] : 0, .ndim = x.ndim > 1 ? x.ndim - 1 : 1};
    d.shape[0]        = 1;
    for (int i = 1; i < x.ndim && i <= DT_DATASET_MAX_DIMS; i++)
        d.shape[i - 1] = (int)x.shape[i];
    d.type = x.dtype == DT_NPY_U8 ? DT_SAMPLE_U8 : DT_SAMPLE_F32;
    d.data = x.data; // after the conversion above
    if (st == DT_OK && y_path) {
        st = dt_npy_read(y_path, &y);
        if (st == DT_OK && y.ndim < 1)
            st = dt_fail(DT_ERR_FORMAT,
                         "%s: expected an array of N = %zu targets (shape (N, ...)), found a "
                         "scalar (shape ())",
                         y_path, d.n);
        else if (st == DT_OK && y.shape[0] != d.n)
            st = dt_fail(DT_ERR_FORMAT,
                         "expected as many targets as samples, found %zu samples in %s and %zu "
                         "targets in %s",
                         d.n, x_path, y.shape[0], y_path);
        if (st == DT_OK && (y.dtype == DT_NPY_F32 || y.dtype == DT_NPY_F64)) {
            st             = dt_npy_convert(&y, DT_NPY_F32, y_path);
            d.target       = DT_TARGET_FLOAT;
            d.targets      = y.data;
            d.target_elems = d.n ? y.count / d.n : 1;
        } else if (st == DT_OK) {
            st       = dt_npy_convert(&y, DT_NPY_I32, y_path);
            d.target = DT_TARGET_LABEL;
            d.labels = y.data;
            if (st == DT_OK && y.ndim != 1)
                st = dt_fail(DT_ERR_FORMAT,
                             "%s: expected integer labels of shape (N,), found %d "
                             "dimensions",
                             y_path, y.ndim);
        }
    }
    if (st == DT_OK) {
        uint64_t hash    = dt_data_hash_pair(x.hash, y_path ? y.hash : 0); // the files' data
        st               = init_desc(ds, &d, &o, &x, &y); // adopts the arrays' buffers
        ds->content_hash = st == DT_OK ? hash : 0;
        if (st && strncmp(dt_last_error(), "dataset:", 8) == 0) // name the file at fault
            dt_fail_context("%s", y_path && strstr(dt_last_error(), "labels") ? y_path : x_path);
    }
    dt_npy_free(&x);
    dt_npy_free(&y);
    return st;
}

// ---------------------------------------------------------------------- gather

// Shifts each H x W plane of x in place: out(i, j) = in(i + sy, j + sx), 0 outside.
static void shift_planes(float *x, size_t planes, int H, int W, int sy, int sx) {
    for (size_t p = 0; p < planes; p++) {
        float *a = x + p * (size_t)H * (size_t)W;
        for (int k = 0; k < H; k++) {
            int i  = sy >= 0 ? k : H - 1 - k; // never read a row already written
            int si = i + sy;
            for (int m = 0; m < W; m++) {
                int j  = sx >= 0 ? m : W - 1 - m;
                int sj = j + sx;
                a[(size_t)i * W + j] =
                    si >= 0 && si < H && sj >= 0 && sj < W ? a[(size_t)si * W + sj] : 0.0f;
            }
        }
    }
}

static void flip_planes(float *x, size_t planes, int H, int W) {
    for (size_t r = 0; r < planes * (size_t)H; r++) {
        float *row = x + r * (size_t)W;
        for (int a = 0, b = W - 1; a < b; a++, b--) {
            float t = row[a];
            row[a]  = row[b];
            row[b]  = t;
        }
    }
}

// Byte sample -> cropped, flipped, normalised floats in one pass through the tables
// (the same values as raw floats, shift_planes, flip_planes and normalise: the table
// holds those float operations, and padding is the table's entry for 0).
static void crop_flip_u8(const dt_dataset *ds, const uint8_t *src, float *dst, int sy, int sx,
                         bool flip) {
    int    H = ds->h, W = ds->w;
    size_t hw = (size_t)H * (size_t)W, planes = ds->sample_elems / hw;
    size_t per_channel = planes / (size_t)ds->channels;
    for (size_t p = 0; p < planes; p++) {
        const float   *lut = ds->ch_lut + (p / per_channel) * 256;
        const uint8_t *a   = src + p * hw;
        float         *d   = dst + p * hw;
        float          pad = lut[0];
        for (int i = 0; i < H; i++) {
            int    si  = i + sy;
            float *row = d + (size_t)i * W;
            if (si < 0 || si >= H) {
                for (int j = 0; j < W; j++)
                    row[j] = pad;
                continue;
            }
            // Output columns j0 .. j1 - 1 read inside the row; the others are padding.
            const uint8_t *in = a + (size_t)si * W;
            int            j0 = flip ? (sx > 0 ? sx : 0) : (sx < 0 ? -sx : 0);
            int            j1 = flip ? (sx < 0 ? W + sx : W) : (sx > 0 ? W - sx : W);
            j0                = j0 < W ? j0 : W; // a shift past the border: all padding
            j1                = j1 > j0 ? j1 : j0;
            for (int j = 0; j < j0; j++)
                row[j] = pad;
            if (flip)
                for (int j = j0; j < j1; j++)
                    row[j] = lut[in[W - 1 - j + sx]];
            else
                for (int j = j0; j < j1; j++)
                    row[j] = lut[in[j + sx]];
            for (int j = j1; j < W; j++)
                row[j] = pad;
        }
    }
}

static void normalise(const dt_dataset *ds, float *x) {
    size_t per = ds->sample_elems / (size_t)ds->channels;
    for (int c = 0; c < ds->channels; c++) {
        float  m = ds->ch_mean[c], s = ds->ch_std[c];
        float *p = x + (size_t)c * per;
        for (size_t j = 0; j < per; j++)
            p[j] = (p[j] - m) / s;
    }
}

dt_status dt_dataset_gather_at(const dt_dataset *ds, uint64_t epoch, const uint32_t *indices,
                               size_t count, float *x, int32_t *y, float *t) {
    size_t E = ds->sample_elems, per = E / (size_t)ds->channels, te = ds->target_elems;
    bool   aug = ds->crop_pad > 0 || ds->hflip;
    int    H = ds->h, W = ds->w;
    size_t planes = E / ((size_t)H * (size_t)W);
    dt_rng base = dt_rng_init(ds->aug_seed), ep = dt_rng_split(&base, epoch);
    for (size_t i = 0; i < count; i++) {
        size_t k = indices[i];
        if (k >= ds->n)
            return dt_fail(DT_ERR_ARG, "dataset: expected sample indices < %zu, found %zu", ds->n,
                           k);
        float *dst = x + i * E;
        if (ds->fill) {
            int32_t   label = 0;
            dt_status st = ds->fill(ds->user, k, dst, ds->has_labels ? (y ? y + i : &label) : NULL,
                                    te && t ? t + i * te : NULL);
            if (st)
                return dt_fail_context("dataset sample %zu", k);
        } else {
            if (ds->has_labels && y)
                y[i] = ds->labels32 ? ds->labels32[k] : ds->labels[k];
            if (te && t)
                memcpy(t + i * te, ds->targets + k * te, te * sizeof(float));
            if (ds->type == DT_SAMPLE_U8) {
                const uint8_t *src = (const uint8_t *)ds->data + k * E;
                if (!aug) { // the table: same operations as steps 1 and 3
                    for (int c = 0; c < ds->channels; c++) {
                        const float   *lut = ds->ch_lut + c * 256;
                        const uint8_t *s   = src + (size_t)c * per;
                        float         *d   = dst + (size_t)c * per;
                        for (size_t j = 0; j < per; j++)
                            d[j] = lut[s[j]];
                    }
                    continue;
                }
                dt_rng r  = dt_rng_split(&ep, k);
                int    sy = 0, sx = 0;
                if (ds->crop_pad > 0) { // the draws of the general path below, in order
                    int P = ds->crop_pad;
                    sy    = (int)dt_rng_below(&r, (uint64_t)(2 * P + 1)) - P;
                    sx    = (int)dt_rng_below(&r, (uint64_t)(2 * P + 1)) - P;
                }
                bool flip = ds->hflip && (dt_rng_u32(&r) >> 31);
                crop_flip_u8(ds, src, dst, sy, sx, flip);
                continue;
            } else {
                memcpy(dst, (const float *)ds->data + k * E, E * sizeof(float));
            }
        }
        if (aug) {
            dt_rng r = dt_rng_split(&ep, k);
            if (ds->crop_pad > 0) {
                int P  = ds->crop_pad;
                int dy = (int)dt_rng_below(&r, (uint64_t)(2 * P + 1));
                int dx = (int)dt_rng_below(&r, (uint64_t)(2 * P + 1));
                shift_planes(dst, planes, H, W, dy - P, dx - P);
            }
            if (ds->hflip && (dt_rng_u32(&r) >> 31))
                flip_planes(dst, planes, H, W);
        }
        normalise(ds, dst);
    }
    return DT_OK;
}
