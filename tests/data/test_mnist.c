// test_mnist.c: the real Fashion-MNIST files (Debian's dataset-fashion-mnist, or
// $DT_DATA_DIR), when present: counts, shapes, labels, and every byte against an
// independent read through zlib's gzread. Skipped (with a note) when absent.
#include "../check.h"
#include "../lib/mnist.h"
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

// The whole decompressed file through zlib's own gz reader; NULL if unreadable.
static uint8_t *gunzip_file(const char *path, size_t *n) {
    gzFile g = gzopen(path, "rb");
    if (!g)
        return NULL;
    size_t   cap = 1 << 20, len = 0;
    uint8_t *p = malloc(cap);
    int      r;
    while ((r = gzread(g, p + len, (unsigned)(cap - len))) > 0) {
        len += (size_t)r;
        if (len == cap)
            p = realloc(p, cap *= 2);
    }
    gzclose(g);
    *n = len;
    return p;
}

static void check_set(const char *dir, bool train) {
    size_t     want_n = train ? 60000 : 10000;
    dt_dataset ds;
    double     t0 = dt_now();
    CHECK_OK(dt_dataset_load_mnist(&ds, dir, train, NULL));
    double secs = dt_now() - t0;
    fprintf(stderr, "     loaded %s set (%zu images) in %.3f s\n", train ? "training" : "test",
            ds.n, secs);
    CHECK_EQ(ds.n, want_n);
    CHECK_EQ(ds.h, 28);
    CHECK_EQ(ds.w, 28);
    size_t per_class[256] = {0};
    for (size_t i = 0; i < ds.n; i++)
        per_class[ds.labels[i]]++;
    size_t sum = 0;
    for (int c = 0; c < 10; c++) {
        CHECK(per_class[c] > 0);
        sum += per_class[c];
    }
    CHECK_EQ(sum, want_n); // every label < 10

    char path[512];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, train ? "train" : "t10k");
    size_t   n;
    uint8_t *raw = gunzip_file(path, &n);
    if (raw) {
        CHECK_EQ(n, 16 + want_n * 784);
        CHECK(n == 16 + want_n * 784 && memcmp(raw + 16, ds.images, want_n * 784) == 0);
        free(raw);
    }
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, train ? "train" : "t10k");
    raw = gunzip_file(path, &n);
    if (raw) {
        CHECK_EQ(n, 8 + want_n);
        CHECK(n == 8 + want_n && memcmp(raw + 8, ds.labels, want_n) == 0);
        free(raw);
    }
    dt_dataset_free(&ds);

    // A limit reads only the first records.
    dt_dataset_opts o = dt_dataset_opts_default();
    o.limit           = 1000;
    CHECK_OK(dt_dataset_load_mnist(&ds, dir, train, &o));
    CHECK_EQ(ds.n, 1000);
    dt_dataset_free(&ds);
}

static void spin_us(double us) {
    double t0 = dt_now();
    while ((dt_now() - t0) * 1e6 < us) {
    }
}

// One epoch of the real training set through the loader at batch 128: every sample
// exactly once, labels as in the dataset. Prints (does not assert) the time the caller
// spends in dt_loader_next per batch, inline and with the prefetch thread while the
// caller spends 300 us per batch on "training".
static void check_loader(const char *dir) {
    dt_dataset ds;
    CHECK_OK(dt_dataset_load_mnist(&ds, dir, true, NULL));
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        dt_sampler *s = NULL;
        dt_sampler_new(&s, ds.n, NULL);
        dt_loader_opts o = dt_loader_opts_default();
        o.batch_size     = 128;
        o.prefetch       = prefetch;
        dt_loader *l     = NULL;
        dt_loader_new(&l, &ds, s, &o);
        uint8_t *seen = calloc(ds.n, 1);
        size_t   nb = 0, bad = 0;
        double   in_next = 0;
        dt_batch b;
        dt_loader_begin_epoch(l, 0);
        for (;;) {
            double t0 = dt_now();
            bool   ok = dt_loader_next(l, &b);
            in_next += dt_now() - t0;
            if (!ok)
                break;
            for (size_t i = 0; i < b.size; i++) {
                seen[b.indices[i]]++;
                bad += b.y[i] != ds.labels[b.indices[i]];
            }
            nb++;
            if (prefetch)
                spin_us(300);
        }
        size_t once = 0;
        for (size_t i = 0; i < ds.n; i++)
            once += seen[i] == 1;
        CHECK_EQ(once, ds.n);
        CHECK_EQ(bad, 0);
        CHECK_EQ(nb, (ds.n + 127) / 128);
        fprintf(stderr, "     loader batch 128, %s: %.1f us per batch in dt_loader_next\n",
                prefetch ? "prefetch thread, caller busy 300 us per batch" : "inline",
                in_next / (double)nb * 1e6);
        free(seen);
        dt_loader_free(l);
        dt_sampler_free(s);
    }
    dt_dataset_free(&ds);
}

int main(void) {
    const char *dir = tl_fmnist_dir();
    char        probe[512];
    struct stat sb;
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", dir);
    if (stat(probe, &sb) != 0) {
        fprintf(stderr, "skipped: %s not found (install dataset-fashion-mnist)\n", probe);
        return check_summary();
    }
    check_set(dir, true);
    check_set(dir, false);
    check_loader(dir);
    return check_summary();
}
