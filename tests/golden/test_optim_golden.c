// test_optim_golden.c: optimizers with parameter groups, gradient-norm clipping and
// learning-rate schedules against PyTorch 1.13 (fixtures written by gen_optim.py, whose
// docstring gives the format and the cases). Agreement: per step, the clipped norm to
// 1e-5 relative, and max|dtrain - torch| <= 1e-5 * max|torch| over the parameters;
// schedule values to 1e-6 relative. Runs from the repository root.
#include "../check.h"
#include "dtrain/optim.h"

#include <stdio.h>
#include <stdlib.h>

#define DATA "tests/golden/data/"

typedef struct arr {
    char   name[32];
    float *v;
    size_t n;
} arr;

typedef struct fixture {
    arr a[32];
    int n;
} fixture;

static bool load(const char *path, fixture *fx) {
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    uint32_t len, nd, d;
    while (fx->n < 32 && fread(&len, 4, 1, f) == 1) {
        arr *a = &fx->a[fx->n++];
        if (len >= sizeof a->name || fread(a->name, 1, len, f) != len || fread(&nd, 4, 1, f) != 1)
            break;
        a->n = 1;
        for (uint32_t i = 0; i < nd; i++)
            a->n *= fread(&d, 4, 1, f) == 1 ? d : 0;
        a->v = malloc(a->n * 4 + 4);
        if (fread(a->v, 4, a->n, f) != a->n)
            a->n = 0;
    }
    fclose(f);
    return fx->n > 0;
}

static const arr *get(const fixture *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (strcmp(fx->a[i].name, name) == 0)
            return &fx->a[i];
    CHECK(!"fixture array missing");
    fprintf(stderr, "     missing \"%s\"\n", name);
    return NULL;
}

static void release(fixture *fx) {
    for (int i = 0; i < fx->n; i++)
        free(fx->a[i].v);
}

static bool is_b(const dt_param_info *t, void *user) {
    (void)user;
    return strcmp(t->name, "b") == 0;
}

static void run_optim(const char *file, bool adamw) {
    fixture fx;
    if (!CHECK(load(file, &fx))) {
        fprintf(stderr, "     cannot read %s (run from the repository root)\n", file);
        return;
    }
    const arr *h = get(&fx, "hyper"), *init = get(&fx, "init");
    if (!h || !init || !CHECK(init->n == 24))
        goto out;
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t w[2] = {4, 3}, b[1] = {4}, v[2] = {2, 4};
    CHECK_OK(dt_params_add(p, "w", 2, w, 0));
    CHECK_OK(dt_params_add(p, "b", 1, b, DT_PARAM_NO_DECAY));
    CHECK_OK(dt_params_add(p, "v", 2, v, 0));
    CHECK_OK(dt_params_alloc(p));
    memcpy(dt_params_data(p), init->v, 24 * 4);
    dt_optim *o = NULL;
    if (adamw) {
        dt_adam_opts ao = dt_adamw_opts_default();
        ao.lr = h->v[0], ao.weight_decay = h->v[1], ao.beta1 = h->v[3], ao.beta2 = h->v[4];
        ao.eps = h->v[5];
        CHECK_OK(dt_adamw_new(&o, p, &ao));
    } else {
        dt_sgd_opts so = dt_sgd_opts_default();
        so.lr = h->v[0], so.weight_decay = h->v[1], so.momentum = h->v[3];
        so.dampening = h->v[4];
        CHECK_OK(dt_sgd_new(&o, p, &so));
    }
    dt_param_group_opts g = dt_param_group_opts_default();
    g.lr = h->v[2], g.weight_decay = 0;
    CHECK_OK(dt_optim_add_group(o, is_b, NULL, &g, NULL));
    for (int k = 0; o && k < 3; k++) {
        char gn[24], nn[24], pn[24];
        snprintf(gn, sizeof gn, "grad%d", k);
        snprintf(nn, sizeof nn, "norm%d", k);
        snprintf(pn, sizeof pn, "param%d", k);
        const arr *ga = get(&fx, gn), *na = get(&fx, nn), *pa = get(&fx, pn);
        if (!ga || !na || !pa)
            break;
        memcpy(dt_params_grads(p), ga->v, 24 * 4);
        float norm = 0;
        CHECK_OK(dt_clip_grad_norm(p, 0.5f, &norm));
        CHECK_NEAR(norm, na->v[0], 1e-5 * fabs(na->v[0]));
        dt_optim_step(o);
        double maxd = 0, maxt = 0;
        for (int i = 0; i < 24; i++) {
            maxd = fmax(maxd, fabs((double)dt_params_data(p)[i] - pa->v[i]));
            maxt = fmax(maxt, fabs((double)pa->v[i]));
        }
        if (!CHECK(maxd <= 1e-5 * maxt))
            fprintf(stderr, "     %s step %d: max|dtrain - torch| %.3g, max|torch| %.3g\n", file, k,
                    maxd, maxt);
    }
    dt_optim_free(o);
    dt_params_free(p);
out:
    release(&fx);
}

static void test_sgd_groups_clip(void) {
    run_optim(DATA "optim_sgd.bin", false);
}

static void test_adamw_groups_clip(void) {
    run_optim(DATA "optim_adamw.bin", true);
}

static void check_sched(const fixture *fx, const char *name, dt_sched_opts o) {
    const arr *a = get(fx, name);
    dt_sched  *s = NULL;
    CHECK_OK(dt_sched_new(&s, &o));
    for (size_t t = 0; a && s && t < a->n; t++)
        if (!CHECK(fabs(dt_sched_lr_at(s, (int64_t)t) - a->v[t]) <= 1e-6 * 0.1))
            fprintf(stderr, "     %s at step %zu: %.9g, torch %.9g\n", name, t,
                    (double)dt_sched_lr_at(s, (int64_t)t), (double)a->v[t]);
    dt_sched_free(s);
}

static void test_schedules(void) {
    fixture fx;
    if (!CHECK(load(DATA "optim_sched.bin", &fx)))
        return;
    dt_sched_opts o = dt_sched_opts_default();
    o.base_lr       = 0.1f;
    o.kind          = DT_SCHED_STEP;
    o.step_size     = 3;
    o.gamma         = 0.5f;
    check_sched(&fx, "step", o);
    o.kind        = DT_SCHED_COSINE;
    o.total_steps = 10;
    o.min_lr      = 0.001f;
    check_sched(&fx, "cosine", o);
    o.kind         = DT_SCHED_LINEAR;
    o.start_factor = 0.25f;
    o.end_factor   = 1;
    o.total_steps  = 4;
    check_sched(&fx, "linear", o);
    o.kind                = DT_SCHED_COSINE;
    o.total_steps         = 10;
    o.min_lr              = 0;
    o.warmup_steps        = 5;
    o.warmup_start_factor = 0.2f;
    check_sched(&fx, "warmcos", o);
    release(&fx);
}

int main(void) {
    RUN(test_sgd_groups_clip);
    RUN(test_adamw_groups_clip);
    RUN(test_schedules);
    return check_summary();
}
