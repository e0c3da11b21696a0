// dataset.c: image datasets kept as bytes (N, H, W) with uint8 labels, loaded from IDX
// files, and the gather that turns samples into a normalised float batch.
//
// Images stay bytes: 60,000 28x28 images are 47 MB as bytes and 188 MB as floats.
// Normalisation happens per batch through a 256-entry table.
#include "data_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

dt_dataset_opts dt_dataset_opts_default(void) {
    return (dt_dataset_opts){
        .limit       = 0,
        .num_classes = 10,
        .mean        = 0.0f,
        .std         = 1.0f,
    };
}

static dt_status check_opts(const dt_dataset_opts *o) {
    if (o->num_classes < 1 || o->num_classes > 256)
        return dt_fail(DT_ERR_ARG, "dataset: expected num_classes in [1, 256], found %d",
                       o->num_classes);
    if (!(o->std > 0.0f) || !(o->mean == o->mean))
        return dt_fail(DT_ERR_ARG,
                       "dataset: expected std > 0 and a finite mean, found std %g, mean %g",
                       (double)o->std, (double)o->mean);
    return DT_OK;
}

static void fill_lut(dt_dataset *ds) {
    // The same float operations as torchvision's ToTensor (p / 255) then Normalize.
    for (int p = 0; p < 256; p++)
        ds->lut[p] = ((float)p / 255.0f - ds->mean) / ds->std;
}

// The general description of a byte-image dataset: samples (1, H, W) with labels.
static dt_status describe(dt_dataset *ds, const dt_dataset_opts *o) {
    ds->type       = DT_SAMPLE_U8;
    ds->ndim       = 3;
    ds->shape[0]   = 1;
    ds->shape[1]   = ds->h;
    ds->shape[2]   = ds->w;
    ds->data       = ds->images;
    ds->has_labels = true;
    dt_status st   = dt_data_dataset_finish(ds, o);
    if (st)
        dt_dataset_free(ds);
    return st;
}

static dt_status check_labels(const uint8_t *labels, size_t n, int num_classes, const char *where) {
    for (size_t i = 0; i < n; i++)
        if (labels[i] >= num_classes)
            return dt_fail(DT_ERR_FORMAT, "%s: expected labels in [0, %d), found %d at index %zu",
                           where, num_classes, labels[i], i);
    return DT_OK;
}

dt_status dt_dataset_init(dt_dataset *ds, const uint8_t *images, const uint8_t *labels, size_t n,
                          int h, int w, const dt_dataset_opts *opts) {
    memset(ds, 0, sizeof *ds);
    dt_dataset_opts o = opts ? *opts : dt_dataset_opts_default();
    DT_TRY(check_opts(&o));
    if (h < 1 || w < 1)
        return dt_fail(DT_ERR_ARG, "dataset: expected images of at least 1x1, found %dx%d", h, w);
    if (o.limit && o.limit < n)
        n = o.limit;
    size_t bytes;
    if (!dt_size_mul(&bytes, n, (size_t)h * (size_t)w))
        return dt_fail(DT_ERR_ARG, "dataset: %zu images of %dx%d overflow size_t", n, h, w);
    DT_TRY(check_labels(labels, n, o.num_classes, "dataset"));
    ds->images = dt_alloc(bytes);
    ds->labels = dt_alloc(n);
    if (!ds->images || !ds->labels) {
        dt_dataset_free(ds);
        return DT_ERR_NOMEM;
    }
    memcpy(ds->images, images, bytes);
    memcpy(ds->labels, labels, n);
    ds->n           = n;
    ds->h           = h;
    ds->w           = w;
    ds->num_classes = o.num_classes;
    ds->mean        = o.mean;
    ds->std         = o.std;
    fill_lut(ds);
    return describe(ds, &o);
}

dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images_path, const char *labels_path,
                              const dt_dataset_opts *opts) {
    memset(ds, 0, sizeof *ds);
    dt_dataset_opts o = opts ? *opts : dt_dataset_opts_default();
    DT_TRY(check_opts(&o));
    dt_idx img = {0}, lab = {0};
    DT_TRY(dt_idx_read_first(images_path, o.limit, &img));
    dt_status st = DT_OK;
    if (img.ndim != 3)
        st = dt_fail(DT_ERR_FORMAT, "%s: expected images of 3 dimensions (N, H, W), found %d",
                     images_path, img.ndim);
    else if (img.dims[0] == 0 || img.dims[1] == 0 || img.dims[2] == 0 || img.dims[1] > INT32_MAX ||
             img.dims[2] > INT32_MAX)
        st = dt_fail(DT_ERR_FORMAT,
                     "%s: expected at least one image of at least 1x1 pixels, found (%u, %u, %u)",
                     images_path, img.dims[0], img.dims[1], img.dims[2]);
    if (st == DT_OK)
        st = dt_idx_read_first(labels_path, o.limit, &lab);
    if (st == DT_OK && lab.ndim != 1)
        st = dt_fail(DT_ERR_FORMAT, "%s: expected labels of 1 dimension (N), found %d", labels_path,
                     lab.ndim);
    // Compare the counts of the headers, so a mismatch is caught even under a limit.
    if (st == DT_OK && lab.dims[0] != img.dims[0])
        st = dt_fail(DT_ERR_FORMAT,
                     "expected as many labels as images, found %u images in %s and %u labels "
                     "in %s",
                     img.dims[0], images_path, lab.dims[0], labels_path);
    if (st == DT_OK)
        st = check_labels(lab.data, lab.nrecords, o.num_classes, labels_path);
    if (st) {
        dt_idx_free(&img);
        dt_idx_free(&lab);
        return st;
    }
    ds->images       = img.data; // ownership moves to the dataset
    ds->labels       = lab.data;
    ds->n            = img.nrecords;
    ds->h            = (int)img.dims[1];
    ds->w            = (int)img.dims[2];
    ds->num_classes  = o.num_classes;
    ds->mean         = o.mean;
    ds->std          = o.std;
    ds->content_hash = dt_data_hash_pair(img.hash, lab.hash); // of the records read
    fill_lut(ds);
    return describe(ds, &o);
}

// Whether `path` names something: false (errno ENOENT or ENOTDIR) when nothing is there.
static bool exists(const char *path, struct stat *sb) {
    return stat(path, sb) == 0;
}

// Finds "<dir>/<stem>" or "<dir>/<stem>.gz" into out. Whatever is found under either
// name must be a regular file: a directory, a FIFO or a device is named, not skipped.
static dt_status find_file(const char *dir, const char *stem, char *out, size_t n) {
    char gz[4096];
    if (snprintf(out, n, "%s/%s", dir, stem) >= (int)n ||
        snprintf(gz, sizeof gz, "%s/%s.gz", dir, stem) >= (int)sizeof gz)
        return dt_fail(DT_ERR_ARG, "dataset directory name too long (%zu bytes)", strlen(dir));
    const char *names[2] = {out, gz};
    for (int i = 0; i < 2; i++) {
        struct stat sb;
        if (!exists(names[i], &sb))
            continue;
        if (!S_ISREG(sb.st_mode))
            return dt_fail(DT_ERR_IO,
                           "%s is %s, expected a regular file (the MNIST-format file %s, plain "
                           "or .gz)",
                           names[i], dt_file_kind(sb.st_mode), stem);
        if (i == 1)
            snprintf(out, n, "%s", gz);
        return DT_OK;
    }
    return dt_fail(DT_ERR_IO, "expected the MNIST-format file %s in %s, found neither %s nor %s",
                   stem, dir, out, gz);
}

dt_status dt_dataset_load_mnist(dt_dataset *ds, const char *dir, bool train,
                                const dt_dataset_opts *opts) {
    memset(ds, 0, sizeof *ds);
    if (!dir || !*dir)
        dir = dt_setting_str("DT_DATA_DIR");
    if (!dir || !*dir)
        return dt_fail(DT_ERR_ARG, "dt_dataset_load_mnist: expected a folder of MNIST-format "
                                   "files, found none given and DT_DATA_DIR unset");
    const char *set = train ? "train" : "t10k";
    char        stem[64], images[4096], labels[4096];
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", set);
    DT_TRY(find_file(dir, stem, images, sizeof images));
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", set);
    DT_TRY(find_file(dir, stem, labels, sizeof labels));
    return dt_dataset_load_idx(ds, images, labels, opts);
}

// Writes "(a, b, c)" into buf.
static void shape_str(const int *shape, int ndim, char *buf, size_t n) {
    size_t at = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, i ? ", %d" : "%d", shape[i]);
    if (at < n)
        snprintf(buf + at, n - at, ndim == 1 ? ",)" : ")");
}

// The dimensions of `shape` between its leading and trailing dimensions of size 1.
static const int *core_dims(const int *shape, int ndim, int *core) {
    int lo = 0, hi = ndim;
    while (lo < hi && shape[lo] == 1)
        lo++;
    while (hi > lo && shape[hi - 1] == 1)
        hi--;
    *core = hi - lo;
    return shape + lo;
}

// layout: how the model names its dimensions (" (C, H, W)"), or "".
static dt_status check_dims(const dt_dataset *ds, const char *name, int ndim, const int64_t *dims,
                            const char *layout) {
    const char *what = name && *name ? name : "dataset";
    if (!ds || ds->ndim < 1 || ds->ndim > DT_DATASET_MAX_DIMS || !ds->sample_elems)
        return dt_fail(DT_ERR_ARG, "%s: expected a loaded dataset, found none", what);
    if (ndim < 0 || ndim > DT_DATASET_MAX_DIMS || (ndim > 0 && !dims))
        return dt_fail(DT_ERR_ARG,
                       "%s: expected a model input shape of 0 to %d dimensions, found %d", what,
                       DT_DATASET_MAX_DIMS, ndim);
    int model[DT_DATASET_MAX_DIMS], nm, nd;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 1 || dims[i] > INT32_MAX)
            return dt_fail(DT_ERR_ARG, "%s: expected positive model input dimensions, found %lld",
                           what, (long long)dims[i]);
        model[i] = (int)dims[i];
    }
    const int *cm = core_dims(model, ndim, &nm), *cd = core_dims(ds->shape, ds->ndim, &nd);
    if (nm != nd || memcmp(cm, cd, sizeof(int) * (size_t)nm) != 0) {
        char want[96], found[96];
        shape_str(model, ndim, want, sizeof want);
        shape_str(ds->shape, ds->ndim, found, sizeof found);
        return dt_fail(DT_ERR_ARG, "%s: expected samples of the model's input shape %s%s, found %s",
                       what, want, layout, found);
    }
    return DT_OK;
}

dt_status dt_dataset_check_dims(const dt_dataset *ds, const char *name, int ndim,
                                const int64_t *dims) {
    return check_dims(ds, name, ndim, dims, "");
}

dt_status dt_dataset_check_shape(const dt_dataset *ds, const char *name, int c, int h, int w) {
    return check_dims(ds, name, 3, (const int64_t[]){c, h, w}, " (C, H, W)");
}

void dt_dataset_free(dt_dataset *ds) {
    if (!ds)
        return;
    dt_data_dataset_free_extra(ds);
    dt_free(ds->images);
    dt_free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

void dt_dataset_gather(const dt_dataset *ds, const uint32_t *indices, size_t count, float *x,
                       int32_t *y) {
    if (ds->ch_lut && ds->channels == 1 && ds->type == DT_SAMPLE_U8 && !ds->crop_pad &&
        !ds->hflip && ds->labels && !ds->target_elems) {
        size_t hw = ds->sample_elems; // the byte-image fast path, as before
        for (size_t i = 0; i < count; i++) {
            DT_DEBUG_ASSERT(indices[i] < ds->n);
            const uint8_t *p   = ds->images + (size_t)indices[i] * hw;
            float         *dst = x + i * hw; // (1, H, W) of sample i
            for (size_t j = 0; j < hw; j++)
                dst[j] = ds->ch_lut[p[j]];
            y[i] = ds->labels[indices[i]];
        }
        return;
    }
    dt_status st = dt_dataset_gather_at(ds, 0, indices, count, x, y, NULL);
    DT_DEBUG_ASSERT(st == DT_OK);
    (void)st;
}
