// test_datasets.c: general datasets (float or byte samples of any shape, int labels or
// float targets, .npy files, a callback), per-channel normalisation, random crop and
// flip. Each batch of the loader is checked against values computed here from the raw
// arrays; augmentation is checked to be a zero-padded shift and/or a mirror of the
// sample, reproducible, and the same for a dataset index whatever the world size,
// rank, batch size or resume point. Runs under ThreadSanitizer (make tsan).
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char tmpdir[64];

static const char *tmp(const char *name) {
    static char buf[4][256];
    static int  k;
    char       *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

// A v1.0 .npy file written here (independently of the reader).
static void write_npy(const char *path, const char *descr, int ndim, const size_t *shape,
                      const void *data, size_t nbytes) {
    char dict[256], sh[128] = "";
    int  k = 0;
    for (int i = 0; i < ndim; i++)
        k += snprintf(sh + k, sizeof sh - (size_t)k, "%zu,%s", shape[i], i + 1 < ndim ? " " : "");
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                      descr, sh);
    int hl = (int)((10 + dl + 1 + 63) / 64 * 64 - 10); // padded like numpy
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hl, (uint8_t)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)dl, f);
    for (int i = dl; i < hl - 1; i++)
        fputc(' ', f);
    fputc('\n', f);
    CHECK_EQ(fwrite(data, 1, nbytes, f), nbytes);
    fclose(f);
}

static dt_sampler *make_sampler(size_t n, int R, int r, uint64_t seed) {
    dt_sampler_opts o = dt_sampler_opts_default();
    o.num_replicas    = R;
    o.rank            = r;
    o.seed            = seed;
    dt_sampler *s     = NULL;
    dt_sampler_new(&s, n, &o);
    return s;
}

// ---------------------------------------------------------------- NPY datasets

#define NS 23 // samples
#define C  3
#define SH 4
#define SW 5
#define E  (C * SH * SW)

static const float mean3[C] = {0.25f, -1.0f, 3.0f}, std3[C] = {0.5f, 2.0f, 0.125f};

static dt_dataset_opts channel_opts(void) {
    dt_dataset_opts o = dt_dataset_opts_plain();
    o.channels        = C;
    for (int c = 0; c < C; c++) {
        o.ch_mean[c] = mean3[c];
        o.ch_std[c]  = std3[c];
    }
    return o;
}

static void test_npy_dataset_loader(void) {
    static float   xf[NS * E];
    static uint8_t xb[NS * E];
    int64_t        lab[NS];
    double         tg[NS * 2];
    for (size_t i = 0; i < NS * E; i++) {
        xf[i] = (float)((int)(i * 37 % 101) - 50) * 0.03125f;
        xb[i] = (uint8_t)(i * 91 + 7);
    }
    for (int i = 0; i < NS; i++) {
        lab[i]        = (i * 7) % 11;
        tg[2 * i]     = i * 0.5;
        tg[2 * i + 1] = -i;
    }
    write_npy(tmp("xf.npy"), "<f4", 4, (size_t[]){NS, C, SH, SW}, xf, sizeof xf);
    write_npy(tmp("xb.npy"), "|u1", 4, (size_t[]){NS, C, SH, SW}, xb, sizeof xb);
    write_npy(tmp("y.npy"), "<i8", 1, (size_t[]){NS}, lab, sizeof lab);
    write_npy(tmp("t.npy"), "<f8", 2, (size_t[]){NS, 2}, tg, sizeof tg);

    for (int bytes = 0; bytes < 2; bytes++) {
        dt_dataset      ds;
        dt_dataset_opts o = channel_opts();
        CHECK_OK(dt_dataset_load_npy(&ds, tmp(bytes ? "xb.npy" : "xf.npy"), tmp("y.npy"), &o));
        CHECK(ds.n == NS && ds.ndim == 3 && ds.shape[0] == C && ds.h == SH && ds.w == SW);
        CHECK(ds.sample_elems == E && ds.has_labels && ds.target_elems == 0);
        CHECK_EQ(ds.type, bytes ? DT_SAMPLE_U8 : DT_SAMPLE_F32);
        // Every rank of 2, shuffled, batches of 4: each sample as computed here.
        size_t seen = 0, bad = 0;
        for (int r = 0; r < 2; r++) {
            dt_sampler    *s  = make_sampler(NS, 2, r, 5);
            dt_loader_opts lo = dt_loader_opts_default();
            lo.batch_size     = 4;
            dt_loader *l      = NULL;
            dt_loader_new(&l, &ds, s, &lo);
            CHECK(l != NULL);
            if (!l)
                break;
            dt_loader_begin_epoch(l, 0);
            dt_batch     b;
            static float direct[4 * E];
            int32_t      dy[4];
            while (dt_loader_next(l, &b)) {
                CHECK(b.y && !b.t && b.sample_elems == E && b.ndim == 3 && b.shape[0] == C);
                // The same as a direct gather of the batch's indices.
                CHECK_OK(dt_dataset_gather_at(&ds, 0, b.indices, b.size, direct, dy, NULL));
                bad += memcmp(direct, b.x, b.size * E * sizeof(float)) != 0;
                bad += memcmp(dy, b.y, b.size * sizeof(int32_t)) != 0;
                for (size_t i = 0; i < b.size; i++) {
                    uint32_t ix = b.indices[i];
                    bad += b.y[i] != lab[ix];
                    for (int j = 0; j < E; j++) {
                        int   c   = j / (SH * SW);
                        float raw = bytes ? (float)xb[ix * E + j] / 255.0f : xf[ix * E + j];
                        bad += b.x[i * E + (size_t)j] != (raw - mean3[c]) / std3[c];
                    }
                    seen++;
                }
            }
            CHECK_OK(dt_loader_status(l));
            dt_loader_free(l);
            dt_sampler_free(s);
        }
        CHECK_EQ(bad, 0);
        CHECK_EQ(seen, 24); // 23 padded to 2 x 12
        dt_dataset_free(&ds);
    }
    // Float targets (N, 2) from <f8; batches carry t and no y.
    dt_dataset ds;
    CHECK_OK(dt_dataset_load_npy(&ds, tmp("xf.npy"), tmp("t.npy"), NULL));
    CHECK(ds.target_elems == 2 && !ds.has_labels);
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = 5;
    lo.prefetch       = false;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &ds, NULL, &lo);
    CHECK(l != NULL);
    size_t bad = 0, seen = 0;
    if (l) {
        dt_loader_begin_epoch(l, 0);
        dt_batch b;
        while (dt_loader_next(l, &b)) {
            CHECK(b.t && !b.y && b.t_elems == 2);
            for (size_t i = 0; i < b.size; i++, seen++) {
                uint32_t ix = b.indices[i];
                bad += b.t[2 * i] != (float)tg[2 * ix] || b.t[2 * i + 1] != (float)tg[2 * ix + 1];
                bad += b.x[i * E + 7] != xf[ix * E + 7]; // plain options: no normalisation
            }
        }
        dt_loader_free(l);
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(seen, NS);
    dt_dataset_free(&ds);
    // Refusals.
    write_npy(tmp("y5.npy"), "<i4", 1, (size_t[]){5}, lab, 20);
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("xf.npy"), tmp("y5.npy"), NULL), DT_ERR_FORMAT,
              "found 23 samples");
    CHECK(ds.data == NULL && ds.n == 0);
    dt_dataset_opts o = dt_dataset_opts_plain();
    o.num_classes     = 10;
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("xf.npy"), tmp("y.npy"), &o), DT_ERR_FORMAT,
              "y.npy: dataset: expected labels in [0, 10), found 10 at index 3");
    o          = channel_opts();
    o.channels = 4;
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("xf.npy"), NULL, &o), DT_ERR_ARG, "found 4");
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("none.npy"), NULL, NULL), DT_ERR_IO, "none.npy");
    // A scalar (shape ()) has no sample count: said as such, not as "-1 dimensions".
    float one = 1.0f;
    write_npy(tmp("scalar.npy"), "<f4", 0, NULL, &one, 4);
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("scalar.npy"), NULL, NULL), DT_ERR_FORMAT,
              "scalar.npy: expected an array of shape (N, ...) (N samples), found a scalar "
              "(shape ())");
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("xf.npy"), tmp("scalar.npy"), NULL), DT_ERR_FORMAT,
              "scalar.npy: expected an array of N = 23 targets (shape (N, ...)), found a scalar");
    // Too many dimensions counts those after N; an (N) array (none after N) is accepted.
    write_npy(tmp("x6.npy"), "<f4", 6, (size_t[]){1, 1, 1, 1, 1, 1}, &one, 4);
    CHECK_ERR(dt_dataset_load_npy(&ds, tmp("x6.npy"), NULL, NULL), DT_ERR_FORMAT,
              "with at most 4 dimensions after N, found 5");
}

// The IDX path and a U8 dataset of the same bytes described generally agree exactly.
static void test_legacy_equals_general(void) {
    size_t   n = 9, h = 4, w = 6;
    uint8_t *img = malloc(n * h * w), lab[9];
    int32_t  lab32[9];
    for (size_t i = 0; i < n * h * w; i++)
        img[i] = (uint8_t)(i * 13 + 1);
    for (size_t i = 0; i < n; i++)
        lab32[i] = lab[i] = (uint8_t)(i % 10);
    dt_dataset a, b;
    CHECK_OK(dt_dataset_init(&a, img, lab, n, (int)h, (int)w, NULL));
    CHECK(a.ndim == 3 && a.shape[0] == 1 && a.shape[1] == 4 && a.shape[2] == 6 &&
          a.sample_elems == 24);
    dt_dataset_desc d = {.n      = n,
                         .ndim   = 3,
                         .shape  = {1, 4, 6},
                         .type   = DT_SAMPLE_U8,
                         .data   = img,
                         .target = DT_TARGET_LABEL,
                         .labels = lab32};
    CHECK_OK(dt_dataset_init_desc(&b, &d, (dt_dataset_opts[]){dt_dataset_opts_default()}));
    uint32_t idx[9] = {8, 0, 3, 3, 1, 7, 2, 6, 5};
    float    xa[9 * 24], xb[9 * 24];
    int32_t  ya[9], yb[9];
    dt_dataset_gather(&a, idx, 9, xa, ya);
    CHECK_OK(dt_dataset_gather_at(&b, 3, idx, 9, xb, yb, NULL));
    CHECK(memcmp(xa, xb, sizeof xa) == 0 && memcmp(ya, yb, sizeof ya) == 0);
    CHECK(xa[0] == a.lut[img[8 * 24]]);
    idx[2] = 9;
    CHECK_ERR(dt_dataset_gather_at(&b, 0, idx, 9, xb, yb, NULL), DT_ERR_ARG, "found 9");
    dt_dataset_free(&a);
    dt_dataset_free(&b);
    free(img);
}

// ------------------------------------------------------------ callback datasets

typedef struct cb_user {
    size_t fail_at; // index that fails (SIZE_MAX: none)
} cb_user;

static float cb_value(size_t i, size_t j) {
    return (float)(i * 100 + j) * 0.25f;
}

static dt_status cb_fill(void *user, size_t i, float *x, int32_t *y, float *t) {
    const cb_user *u = user;
    if (i == u->fail_at)
        return dt_fail(DT_ERR_IO, "cannot read record %zu", i);
    for (size_t j = 0; j < 6; j++)
        x[j] = cb_value(i, j);
    if (y)
        *y = (int32_t)(i % 3);
    (void)t;
    return DT_OK;
}

static void test_callback_dataset(void) {
    cb_user         u = {SIZE_MAX};
    dt_dataset_desc d = {.n      = 31,
                         .ndim   = 2,
                         .shape  = {2, 3},
                         .target = DT_TARGET_LABEL,
                         .fill   = cb_fill,
                         .user   = &u};
    dt_dataset_opts o = dt_dataset_opts_plain();
    o.mean            = 1.0f;
    o.std             = 4.0f;
    dt_dataset ds;
    CHECK_OK(dt_dataset_init_desc(&ds, &d, &o));
    CHECK(ds.data == NULL && ds.fill == cb_fill && ds.type == DT_SAMPLE_F32);
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        dt_sampler    *s  = make_sampler(31, 1, 0, 9);
        dt_loader_opts lo = dt_loader_opts_default();
        lo.batch_size     = 4;
        lo.prefetch       = prefetch;
        dt_loader *l      = NULL;
        dt_loader_new(&l, &ds, s, &lo);
        CHECK(l != NULL);
        if (!l)
            return;
        size_t bad = 0, seen = 0;
        dt_loader_begin_epoch(l, 0);
        dt_batch b;
        while (dt_loader_next(l, &b))
            for (size_t i = 0; i < b.size; i++, seen++) {
                bad += b.y[i] != (int32_t)(b.indices[i] % 3);
                for (size_t j = 0; j < 6; j++)
                    bad += b.x[i * 6 + j] != (cb_value(b.indices[i], j) - 1.0f) / 4.0f;
            }
        CHECK_EQ(bad, 0);
        CHECK_EQ(seen, 31);
        // A failing sample ends the epoch with the callback's message and index, and
        // the sampler's position stays at the batches handed out.
        // (The order of epoch 1 from a twin sampler, so the callback's state is set
        // before any thread reads it.)
        dt_sampler *twin = make_sampler(31, 1, 0, 9);
        dt_sampler_set_epoch(twin, 1);
        dt_sampler_begin(twin);
        const uint32_t *order = dt_sampler_indices(twin, NULL);
        u.fail_at             = order[9]; // in batch 2
        dt_loader_begin_epoch(l, 1);
        size_t got = 0;
        while (dt_loader_next(l, &b))
            got++;
        CHECK_EQ(got, 2);
        CHECK_EQ(dt_loader_status(l), DT_ERR_IO);
        char want[96];
        snprintf(want, sizeof want, "dataset sample %u: cannot read record %u", order[9], order[9]);
        CHECK(strstr(dt_last_error(), want) != NULL);
        CHECK(strstr(dt_last_error(), "batch 2") != NULL);
        CHECK_EQ(dt_sampler_position(s), 8);
        dt_loader_free(l);
        u.fail_at = SIZE_MAX;
        dt_sampler_free(twin);
        dt_sampler_free(s);
    }
    dt_dataset_free(&ds);
    d.shape[0] = 0;
    CHECK_ERR(dt_dataset_init_desc(&ds, &d, NULL), DT_ERR_ARG, "dimensions >= 1");
}

// ------------------------------------------------------------------ augmentation

#define AN 40
#define AH 5
#define AW 7

static uint8_t aug_src[AN * 2 * AH * AW];

static dt_dataset make_aug_dataset(int pad, bool flip, uint64_t seed) {
    for (size_t i = 0; i < sizeof aug_src; i++)
        aug_src[i] = (uint8_t)(1 + i % 250); // never 0: padding is recognisable
    int32_t lab[AN];
    for (int i = 0; i < AN; i++)
        lab[i] = i;
    dt_dataset_desc d = {.n      = AN,
                         .ndim   = 3,
                         .shape  = {2, AH, AW},
                         .type   = DT_SAMPLE_U8,
                         .data   = aug_src,
                         .target = DT_TARGET_LABEL,
                         .labels = lab};
    dt_dataset_opts o = dt_dataset_opts_plain();
    o.crop_pad        = pad;
    o.hflip           = flip;
    o.aug_seed        = seed;
    dt_dataset ds;
    CHECK_OK(dt_dataset_init_desc(&ds, &d, &o));
    return ds;
}

// Which (shift, flip) turns sample i into x; -1 if none does.
static int classify(size_t i, const float *x, int pad, int *sy_out, int *sx_out, int *fl_out) {
    for (int fl = 0; fl < 2; fl++)
        for (int sy = -pad; sy <= pad; sy++)
            for (int sx = -pad; sx <= pad; sx++) {
                int ok = 1;
                for (int c = 0; c < 2 && ok; c++)
                    for (int y = 0; y < AH && ok; y++)
                        for (int xx = 0; xx < AW && ok; xx++) {
                            int   cx = fl ? AW - 1 - xx : xx; // flip after crop
                            int   yy = y + sy, xs = cx + sx;
                            float want = yy >= 0 && yy < AH && xs >= 0 && xs < AW
                                             ? (float)aug_src[(i * 2 + (size_t)c) * AH * AW +
                                                              (size_t)yy * AW + (size_t)xs] /
                                                   255.0f
                                             : 0.0f;
                            ok         = x[(c * AH + y) * AW + xx] == want;
                        }
                if (ok) {
                    *sy_out = sy;
                    *sx_out = sx;
                    *fl_out = fl;
                    return 0;
                }
            }
    return -1;
}

static void test_crop_flip_semantics(void) {
    dt_dataset ds = make_aug_dataset(2, true, 77);
    uint32_t   idx[AN];
    for (uint32_t i = 0; i < AN; i++)
        idx[i] = i;
    static float x[AN * 2 * AH * AW], x2[AN * 2 * AH * AW];
    int32_t      y[AN];
    CHECK_OK(dt_dataset_gather_at(&ds, 0, idx, AN, x, y, NULL));
    size_t bad = 0, flips = 0, shifted = 0, shifts_seen[5][5] = {{0}};
    for (size_t i = 0; i < AN; i++) {
        int sy, sx, fl;
        if (classify(i, x + i * 2 * AH * AW, 2, &sy, &sx, &fl)) {
            bad++;
            continue;
        }
        flips += (size_t)fl;
        shifted += sy || sx;
        shifts_seen[sy + 2][sx + 2]++;
        bad += y[i] != (int32_t)i;
    }
    CHECK_EQ(bad, 0);
    CHECK(flips >= 8 && flips <= 32); // 40 fair coins
    CHECK(shifted >= 25);             // 24 of 25 offsets shift
    size_t distinct = 0;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++)
            distinct += shifts_seen[a][b] > 0;
    CHECK(distinct >= 12);
    // Reproducible for an epoch; another epoch or seed draws differently.
    CHECK_OK(dt_dataset_gather_at(&ds, 0, idx, AN, x2, y, NULL));
    CHECK(memcmp(x, x2, sizeof x) == 0);
    CHECK_OK(dt_dataset_gather_at(&ds, 1, idx, AN, x2, y, NULL));
    CHECK(memcmp(x, x2, sizeof x) != 0);
    dt_dataset other = make_aug_dataset(2, true, 78);
    CHECK_OK(dt_dataset_gather_at(&other, 0, idx, AN, x2, y, NULL));
    CHECK(memcmp(x, x2, sizeof x) != 0);
    dt_dataset_free(&other);
    // A sample's augmentation depends on its index, not on its batch neighbours.
    uint32_t one = 17;
    CHECK_OK(dt_dataset_gather_at(&ds, 0, &one, 1, x2, y, NULL));
    CHECK(memcmp(x2, x + 17 * 2 * AH * AW, 2 * AH * AW * sizeof(float)) == 0);
    dt_dataset_free(&ds);
    // The byte path (tables) and the float path (raw, shift, flip, normalise) agree
    // bitwise on the same pixels, with per-channel normalisation.
    {
        static float    fsrc[AN * 2 * AH * AW];
        int32_t         lab[AN] = {0};
        dt_dataset_opts o       = dt_dataset_opts_plain();
        o.crop_pad = 9, o.hflip = true, o.aug_seed = 9, o.channels = 2; // 9 > AW, AH
        o.ch_mean[0] = 0.3f, o.ch_mean[1] = -0.7f, o.ch_std[0] = 0.2f, o.ch_std[1] = 1.7f;
        for (size_t i = 0; i < sizeof aug_src; i++)
            fsrc[i] = (float)aug_src[i] / 255.0f;
        dt_dataset_desc d = {.n      = AN,
                             .ndim   = 3,
                             .shape  = {2, AH, AW},
                             .type   = DT_SAMPLE_U8,
                             .data   = aug_src,
                             .target = DT_TARGET_LABEL,
                             .labels = lab};
        dt_dataset      bu, fl;
        CHECK_OK(dt_dataset_init_desc(&bu, &d, &o));
        d.type = DT_SAMPLE_F32;
        d.data = fsrc;
        CHECK_OK(dt_dataset_init_desc(&fl, &d, &o));
        for (uint64_t ep = 0; ep < 3; ep++) {
            CHECK_OK(dt_dataset_gather_at(&bu, ep, idx, AN, x, y, NULL));
            CHECK_OK(dt_dataset_gather_at(&fl, ep, idx, AN, x2, y, NULL));
            CHECK(memcmp(x, x2, sizeof x) == 0);
        }
        dt_dataset_free(&bu);
        dt_dataset_free(&fl);
        o.crop_pad = 2; // and with shifts inside the image
        d.type     = DT_SAMPLE_U8;
        d.data     = aug_src;
        CHECK_OK(dt_dataset_init_desc(&bu, &d, &o));
        d.type = DT_SAMPLE_F32;
        d.data = fsrc;
        CHECK_OK(dt_dataset_init_desc(&fl, &d, &o));
        for (uint64_t ep = 0; ep < 3; ep++) {
            CHECK_OK(dt_dataset_gather_at(&bu, ep, idx, AN, x, y, NULL));
            CHECK_OK(dt_dataset_gather_at(&fl, ep, idx, AN, x2, y, NULL));
            CHECK(memcmp(x, x2, sizeof x) == 0);
        }
        dt_dataset_free(&bu);
        dt_dataset_free(&fl);
    }
    // Flip only: the sample or its mirror, nothing shifted.
    ds = make_aug_dataset(0, true, 3);
    CHECK_OK(dt_dataset_gather_at(&ds, 0, idx, AN, x, y, NULL));
    bad = 0;
    for (size_t i = 0; i < AN; i++) {
        int sy, sx, fl;
        bad += classify(i, x + i * 2 * AH * AW, 0, &sy, &sx, &fl) != 0;
    }
    CHECK_EQ(bad, 0);
    dt_dataset_free(&ds);
    // Crop or flip need (..., H, W) samples.
    dt_dataset_desc d = {
        .n = 1, .ndim = 1, .shape = {4}, .type = DT_SAMPLE_F32, .data = (float[4]){0}};
    dt_dataset_opts o = dt_dataset_opts_plain();
    o.hflip           = true;
    CHECK_ERR(dt_dataset_init_desc(&ds, &d, &o), DT_ERR_ARG, "at least 2 dimensions");
    o.hflip    = false;
    o.crop_pad = -1;
    CHECK_ERR(dt_dataset_init_desc(&ds, &d, &o), DT_ERR_ARG, "crop_pad in [0, 4096]");
}

// Every rank of worlds 1, 2, 4 with different batch sizes, and a resumed run, sees for
// each dataset index of an epoch exactly the same augmented sample.
static void test_world_size_invariance(void) {
    dt_dataset   ds = make_aug_dataset(2, true, 5);
    size_t       SE = 2 * AH * AW;
    static float ref[AN * 2 * AH * AW];
    static bool  have[AN];
    int          worlds[3] = {1, 2, 4}, batches[3] = {8, 3, 5};
    size_t       bad = 0, compared = 0;
    for (int wi = 0; wi < 3; wi++)
        for (int r = 0; r < worlds[wi]; r++) {
            dt_sampler    *s  = make_sampler(AN, worlds[wi], r, 11);
            dt_loader_opts lo = dt_loader_opts_default();
            lo.batch_size     = (size_t)batches[wi];
            dt_loader *l      = NULL;
            dt_loader_new(&l, &ds, s, &lo);
            if (!CHECK(l != NULL))
                return;
            dt_loader_begin_epoch(l, 2);
            dt_batch b;
            while (dt_loader_next(l, &b))
                for (size_t i = 0; i < b.size; i++) {
                    uint32_t ix = b.indices[i];
                    if (!have[ix]) {
                        memcpy(ref + ix * SE, b.x + i * SE, SE * sizeof(float));
                        have[ix] = wi == 0;
                        continue;
                    }
                    bad += memcmp(ref + ix * SE, b.x + i * SE, SE * sizeof(float)) != 0;
                    compared++;
                }
            dt_loader_free(l);
            dt_sampler_free(s);
        }
    CHECK_EQ(bad, 0);
    CHECK(compared >= 2 * AN);
    // Resume in the middle of epoch 2 at world 2, rank 1: the rest is the same.
    dt_sampler    *s  = make_sampler(AN, 2, 1, 11);
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = 3;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &ds, s, &lo);
    CHECK(l != NULL);
    CHECK_OK(dt_sampler_resume(s, 2, 6));
    dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
    dt_batch b;
    size_t   got = 0;
    bad          = 0;
    while (l && dt_loader_next(l, &b))
        for (size_t i = 0; i < b.size; i++, got++)
            bad += memcmp(ref + b.indices[i] * SE, b.x + i * SE, SE * sizeof(float)) != 0;
    CHECK_EQ(bad, 0);
    CHECK_EQ(got, AN / 2 - 6);
    dt_loader_free(l);
    dt_sampler_free(s);
    dt_dataset_free(&ds);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_datasets_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    RUN(test_npy_dataset_loader);
    RUN(test_legacy_equals_general);
    RUN(test_callback_dataset);
    RUN(test_crop_flip_semantics);
    RUN(test_world_size_invariance);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_summary();
}
