// scaler.c: dynamic loss scaling (optim.h), torch.cuda.amp.GradScaler's state machine.
// The check for inf/NaN across ranks goes through a callback, so this module needs no
// communication (ddp.h provides one over a dt_pg).
#include "dtrain/optim.h"

#include "kernels/table.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_grad_scaler {
    dt_grad_scaler_opts  o;
    dt_grad_scaler_state st;
    bool                 unscaled;  // unscale done this step
    bool                 found_inf; // its (agreed) result
};

dt_grad_scaler_opts dt_grad_scaler_opts_default(void) {
    return (dt_grad_scaler_opts){.init_scale      = 65536.0f,
                                 .growth_factor   = 2.0f,
                                 .backoff_factor  = 0.5f,
                                 .growth_interval = 2000,
                                 .enabled         = true};
}

static bool scale_ok(float x) {
    return isfinite(x) && x > 0;
}

dt_status dt_grad_scaler_new(dt_grad_scaler **out, const dt_grad_scaler_opts *opts) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "grad scaler: expected an output pointer, found NULL");
    *out                  = NULL;
    dt_grad_scaler_opts o = opts ? *opts : dt_grad_scaler_opts_default();
    if (!scale_ok(o.init_scale))
        return dt_fail(DT_ERR_ARG, "grad scaler: init_scale must be finite and > 0, found %g",
                       (double)o.init_scale);
    if (!(o.growth_factor > 1.0f) || !isfinite(o.growth_factor))
        return dt_fail(DT_ERR_ARG, "grad scaler: growth_factor must be > 1, found %g",
                       (double)o.growth_factor);
    if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f))
        return dt_fail(DT_ERR_ARG, "grad scaler: backoff_factor must be in (0, 1), found %g",
                       (double)o.backoff_factor);
    if (o.growth_interval < 1)
        return dt_fail(DT_ERR_ARG, "grad scaler: growth_interval must be >= 1, found %d",
                       o.growth_interval);
    dt_grad_scaler *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->o        = o;
    s->st.scale = o.init_scale;
    *out        = s;
    return DT_OK;
}

void dt_grad_scaler_free(dt_grad_scaler *s) {
    dt_free(s);
}

float dt_grad_scaler_scale(const dt_grad_scaler *s) {
    return s->o.enabled ? s->st.scale : 1.0f;
}

bool dt_grad_scaler_found_inf(const dt_grad_scaler *s) {
    return s->unscaled && s->found_inf;
}

dt_status dt_grad_scaler_unscale(dt_grad_scaler *s, dt_params *p) {
    if (!s || !p || !dt_params_ready(p))
        return dt_fail(DT_ERR_ARG, "grad scaler: expected a scaler and parameters with storage, "
                                   "found NULL or none");
    if (s->unscaled)
        return dt_fail(DT_ERR_STATE, "grad scaler: unscale was already called this step "
                                     "(expected update first)");
    bool inf = false;
    if (s->o.enabled) {
        float  inv = (float)(1.0 / (double)s->st.scale);
        float *g   = dt_params_grads(p);
        for (int t = 0; t < dt_params_count(p); t++) {
            const dt_param_info *pi = dt_params_info(p, t);
            if (pi->trainable)
                inf |= dt_k()->unscale_check(g + pi->offset, pi->count, inv);
        }
        if (s->o.agree) {
            float     flag = inf ? 1.0f : 0.0f;
            dt_status st   = s->o.agree(s->o.agree_user, &flag);
            if (st != DT_OK)
                return st;
            inf = flag != 0.0f;
        }
    }
    s->unscaled  = true;
    s->found_inf = inf;
    return DT_OK;
}

dt_status dt_grad_scaler_step(dt_grad_scaler *s, dt_optim *o, bool *stepped) {
    if (stepped)
        *stepped = false;
    if (!s || !o)
        return dt_fail(DT_ERR_ARG, "grad scaler: expected a scaler and an optimizer, found NULL");
    if (!s->unscaled) {
        dt_status st = dt_grad_scaler_unscale(s, dt_optim_params(o));
        if (st != DT_OK)
            return st;
    }
    if (s->found_inf)
        return DT_OK;
    dt_optim_step(o);
    if (stepped)
        *stepped = true;
    return DT_OK;
}

dt_status dt_grad_scaler_update(dt_grad_scaler *s) {
    if (!s)
        return dt_fail(DT_ERR_ARG, "grad scaler: expected a scaler, found NULL");
    if (!s->unscaled)
        return dt_fail(DT_ERR_STATE, "grad scaler: update without unscale or step this step");
    s->unscaled = false;
    if (!s->o.enabled)
        return DT_OK;
    if (s->found_inf) {
        s->st.scale *= s->o.backoff_factor;
        s->st.growth_tracker = 0;
    } else if (++s->st.growth_tracker == s->o.growth_interval) {
        float grown = s->st.scale * s->o.growth_factor;
        if (isfinite(grown))
            s->st.scale = grown;
        s->st.growth_tracker = 0;
    }
    s->found_inf = false;
    return DT_OK;
}

void dt_grad_scaler_get_state(const dt_grad_scaler *s, dt_grad_scaler_state *st) {
    *st = s->st;
}

dt_status dt_grad_scaler_set_state(dt_grad_scaler *s, const dt_grad_scaler_state *st) {
    if (!s || !st)
        return dt_fail(DT_ERR_ARG, "grad scaler: expected a scaler and a state, found NULL");
    if (!scale_ok(st->scale))
        return dt_fail(DT_ERR_ARG, "grad scaler: state scale must be finite and > 0, found %g",
                       (double)st->scale);
    if (st->growth_tracker < 0 || st->growth_tracker >= s->o.growth_interval)
        return dt_fail(DT_ERR_ARG,
                       "grad scaler: state growth_tracker must be in [0, %d), found %" PRId64,
                       s->o.growth_interval, st->growth_tracker);
    s->st        = *st;
    s->unscaled  = false;
    s->found_inf = false;
    return DT_OK;
}

int dt_grad_scaler_state_str(const dt_grad_scaler *s, char *buf, size_t n) {
    return snprintf(buf, n, "scale=%a growth_tracker=%" PRId64, (double)s->st.scale,
                    s->st.growth_tracker);
}

dt_status dt_grad_scaler_load_str(dt_grad_scaler *s, const char *text) {
    if (!s || !text)
        return dt_fail(DT_ERR_ARG, "grad scaler: expected a scaler and text, found NULL");
    double  scale;
    int64_t tracker;
    int     used = -1;
    if (sscanf(text, "scale=%la growth_tracker=%" SCNd64 "%n", &scale, &tracker, &used) != 2 ||
        used < 0 || text[used] != '\0' || !(scale == (double)(float)scale))
        return dt_fail(DT_ERR_FORMAT,
                       "grad scaler: expected \"scale=<hex float> growth_tracker=<int>\", "
                       "found \"%.80s\"",
                       text);
    dt_grad_scaler_state st = {.scale = (float)scale, .growth_tracker = tracker};
    if (dt_grad_scaler_set_state(s, &st) != DT_OK) {
        char why[200];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_fail(DT_ERR_FORMAT, "grad scaler: state text \"%.80s\": %s", text, why);
    }
    return DT_OK;
}
