// fixture.h: the reader of the PyTorch fixtures in tests/golden/data (written by gen.py
// and gen_graph.py: "DTGF", version 1, a count, then named float32/int32 tensors) and
// the tolerance check every golden test uses, shared by the golden tests. Header-only
// because the checks count into the including test's harness (check.h).
#ifndef DTRAIN_TESTS_GOLDEN_FIXTURE_H
#define DTRAIN_TESTS_GOLDEN_FIXTURE_H

#include "../check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct gtensor {
    char   name[32];
    int    dtype; // 0 float32, 1 int32
    int    ndim;
    int    shape[8];
    size_t count;
    void  *data;
} gtensor;

typedef struct fixture {
    char    name[64];
    int     n;
    gtensor t[64];
} fixture;

static inline uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void fx_free(fixture *f) {
    for (int i = 0; i < f->n; i++)
        free(f->t[i].data);
    f->n = 0;
}

// Reads <dir>/<name>.bin; false (with a failed check naming the problem) when absent or
// malformed.
static inline bool fx_load(fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    const char *env = getenv("DT_GOLDEN_DIR");
    char        dir[512], path[640];
    if (env) {
        snprintf(dir, sizeof dir, "%s", env);
    } else { // the directory of this source file, then data/
        snprintf(dir, sizeof dir, "%s", __FILE__);
        char *slash = strrchr(dir, '/');
        if (slash)
            snprintf(slash, sizeof dir - (size_t)(slash - dir), "/data");
        else
            snprintf(dir, sizeof dir, "data");
    }
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!CHECK(fp != NULL)) {
        fprintf(stderr, "     cannot open %s\n", path);
        return false;
    }
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    bool           ok  = buf && fread(buf, 1, (size_t)size, fp) == (size_t)size;
    fclose(fp);
    size_t pos = 12;
    ok         = ok && size >= 12 && memcmp(buf, "DTGF", 4) == 0 && rd_u32(buf + 4) == 1;
    int count  = ok ? (int)rd_u32(buf + 8) : 0;
    ok         = ok && count <= 64;
    for (int i = 0; ok && i < count; i++) {
        gtensor *t  = &f->t[i];
        ok          = pos + 4 <= (size_t)size;
        uint32_t nl = ok ? rd_u32(buf + pos) : 0;
        ok          = ok && nl < sizeof t->name && pos + 12 + nl <= (size_t)size;
        if (!ok)
            break;
        memcpy(t->name, buf + pos + 4, nl);
        pos += 4 + nl;
        t->dtype = (int)rd_u32(buf + pos);
        t->ndim  = (int)rd_u32(buf + pos + 4);
        pos += 8;
        ok       = t->dtype <= 1 && t->ndim <= 8 && pos + 4 * (size_t)t->ndim <= (size_t)size;
        t->count = 1;
        for (int d = 0; ok && d < t->ndim; d++) {
            t->shape[d] = (int)rd_u32(buf + pos + 4 * (size_t)d);
            t->count *= (size_t)t->shape[d];
        }
        pos += 4 * (size_t)t->ndim;
        ok = ok && pos + 4 * t->count <= (size_t)size;
        if (!ok)
            break;
        t->data = malloc(4 * t->count + 4);
        for (size_t j = 0; j < t->count; j++) { // little-endian on disk, host order here
            uint32_t v = rd_u32(buf + pos + 4 * j);
            memcpy((char *)t->data + 4 * j, &v, 4);
        }
        pos += 4 * t->count;
        f->n = i + 1;
    }
    free(buf);
    if (!CHECK(ok && pos == (size_t)size)) {
        fprintf(stderr, "     %s: malformed fixture (at byte %zu of %ld)\n", path, pos, size);
        fx_free(f);
        return false;
    }
    return true;
}

static inline gtensor *fx_get(fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    fprintf(stderr, "     %s: no tensor \"%s\"\n", f->name, name);
    abort(); // a fixture/test mismatch is a bug in the test
}

static inline float *fx_f32(fixture *f, const char *name) {
    return fx_get(f, name)->data;
}
static inline int32_t *fx_i32(fixture *f, const char *name) {
    return fx_get(f, name)->data;
}
static inline int fx_cfg(fixture *f, int i) {
    gtensor *t = fx_get(f, "cfg");
    DT_ASSERT((size_t)i < t->count);
    return ((int32_t *)t->data)[i];
}

// max|got - want| <= tol * max|want|, reported with the tensor's name.
static inline void fx_expect(fixture *f, const char *name, const float *got, double tol) {
    gtensor     *t      = fx_get(f, name);
    double       maxref = 0.0, maxerr = 0.0;
    size_t       worst = 0;
    const float *want  = t->data;
    for (size_t i = 0; i < t->count; i++) {
        double r = fabs(want[i]), e = fabs((double)got[i] - want[i]);
        maxref = r > maxref ? r : maxref;
        if (e > maxerr || isnan(got[i])) {
            maxerr = isnan(got[i]) ? INFINITY : e;
            worst  = i;
        }
    }
    double bound = tol * (maxref > 0 ? maxref : 1.0);
    if (!check_report(maxerr <= bound, name, __FILE__, __LINE__))
        fprintf(stderr, "     %s/%s: max error %.3g > %.3g (element %zu: %.9g, torch %.9g)\n",
                f->name, name, maxerr, bound, worst, (double)got[worst], (double)want[worst]);
}

#endif
