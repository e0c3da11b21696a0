// dtrain-custom: bring your own gradients. A 2-layer MLP on (Fashion-)MNIST whose
// forward and backward are plain C loops (llm.c style), trained data-parallel by
// describing its buffers to dtrain (params.h): DDP, AdamW with a no-decay group,
// gradient clipping, a warmup + cosine schedule and a checkpoint, with no dt_model and
// no trainer: the layers below it (comm.h, ddp.h, data.h, optim.h, ckpt.h), and the
// public flag table (train.h's dt_flags_parse) for the command line.
//
//   dtrain-custom [--num-processes P] [--epochs E] [--batch-size B] [--lr X]
//                 [--limit N] [--data-dir D] [--save PATH]
//
// With --num-processes P it forks P workers (like dtrain-mnist); under dtrun or any
// launcher that sets RANK/WORLD_SIZE it is one worker; otherwise it runs alone.
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"
#include "dtrain/optim.h"
#include "dtrain/train.h" // the flag table

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Fashion-MNIST where Debian's dataset-fashion-mnist installs it, and the seed script's
// per-pixel normalisation, x = (p / 255 - 0.1302) / 0.3069.
#define DATA_DIR  "/usr/share/datasets/fashion-mnist"
#define DATA_MEAN 0.1302f
#define DATA_STD  0.3069f

enum { IN = 784, HID = 128, OUT = 10 };

typedef struct opts {
    long        nproc, epochs, batch, limit;
    double      lr;
    const char *data_dir, *save;
    dt_dataset  train;
} opts;

// ---------------------------------------------------------------- the model
typedef struct mlp {
    dt_params *p;
    float     *w1, *b1, *w2, *b2;     // views into dt_params_data
    float     *g1, *gb1, *g2, *gb2;   // views into dt_params_grads
    float     *h, *logp, *dlogp, *dh; // activations (B, HID), (B, OUT)
} mlp;

static dt_status mlp_init(mlp *m, int batch, uint64_t seed) {
    int64_t w1[2] = {HID, IN}, b1[1] = {HID}, w2[2] = {OUT, HID}, b2[1] = {OUT};
    DT_TRY(dt_params_new(&m->p, NULL));
    DT_TRY(dt_params_add(m->p, "fc1.weight", 2, w1, 0));
    DT_TRY(dt_params_add(m->p, "fc1.bias", 1, b1, DT_PARAM_NO_DECAY));
    DT_TRY(dt_params_add(m->p, "fc2.weight", 2, w2, 0));
    DT_TRY(dt_params_add(m->p, "fc2.bias", 1, b2, DT_PARAM_NO_DECAY));
    DT_TRY(dt_params_alloc(m->p));
    float *w = dt_params_data(m->p), *g = dt_params_grads(m->p);
    m->w1 = w, m->b1 = w + HID * IN, m->w2 = m->b1 + HID, m->b2 = m->w2 + OUT * HID;
    m->g1 = g, m->gb1 = g + HID * IN, m->g2 = m->gb1 + HID, m->gb2 = m->g2 + OUT * HID;
    // nn.Linear's default: uniform in +-1/sqrt(fan_in) (rank 0's is broadcast by DDP).
    dt_rng r = dt_rng_init(seed);
    for (int i = 0; i < HID * IN + HID; i++)
        w[i] = dt_rng_uniform_range(&r, -1 / sqrtf(IN), 1 / sqrtf(IN));
    for (int i = HID * IN + HID; i < HID * IN + HID + OUT * HID + OUT; i++)
        w[i] = dt_rng_uniform_range(&r, -1 / sqrtf(HID), 1 / sqrtf(HID));
    m->h     = calloc((size_t)batch * HID, sizeof(float));
    m->dh    = calloc((size_t)batch * HID, sizeof(float));
    m->logp  = calloc((size_t)batch * OUT, sizeof(float));
    m->dlogp = calloc((size_t)batch * OUT, sizeof(float));
    return m->h && m->dh && m->logp && m->dlogp ? DT_OK : DT_ERR_NOMEM;
}

static void mlp_free(mlp *m) {
    dt_params_free(m->p);
    free(m->h), free(m->dh), free(m->logp), free(m->dlogp);
}

// x (B, IN) -> h = relu(x W1^T + b1) (B, HID) -> logp = log_softmax(h W2^T + b2) (B, OUT)
static void mlp_forward(mlp *m, const float *x, int B) {
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < HID; j++) {
            float s = m->b1[j];
            for (int k = 0; k < IN; k++)
                s += x[i * IN + k] * m->w1[j * IN + k];
            m->h[i * HID + j] = s > 0 ? s : 0;
        }
        float *z = m->logp + i * OUT, mx = -INFINITY, se = 0;
        for (int o = 0; o < OUT; o++) {
            z[o] = m->b2[o];
            for (int j = 0; j < HID; j++)
                z[o] += m->h[i * HID + j] * m->w2[o * HID + j];
            mx = fmaxf(mx, z[o]);
        }
        for (int o = 0; o < OUT; o++)
            se += expf(z[o] - mx);
        for (int o = 0; o < OUT; o++)
            z[o] -= mx + logf(se);
    }
}

// Adds the gradients of the loss (its gradient w.r.t. logp in dlogp). After each
// layer, dt_params_grad_ready: DDP starts reducing that layer's bucket while the
// next layer's backward runs.
static dt_status mlp_backward(mlp *m, const float *x, int B) {
    memset(m->dh, 0, sizeof(float) * (size_t)B * HID);
    for (int i = 0; i < B; i++) {
        const float *d = m->dlogp + i * OUT, *lp = m->logp + i * OUT;
        float        sd = 0;
        for (int o = 0; o < OUT; o++)
            sd += d[o];
        for (int o = 0; o < OUT; o++) {
            float dz = d[o] - expf(lp[o]) * sd; // through log_softmax
            m->gb2[o] += dz;
            for (int j = 0; j < HID; j++) {
                m->g2[o * HID + j] += dz * m->h[i * HID + j];
                m->dh[i * HID + j] += dz * m->w2[o * HID + j];
            }
        }
    }
    DT_TRY(dt_params_grad_ready(m->p, HID * IN + HID, OUT * HID + OUT)); // fc2 is final
    for (int i = 0; i < B; i++)
        for (int j = 0; j < HID; j++) {
            float d = m->h[i * HID + j] > 0 ? m->dh[i * HID + j] : 0;
            m->gb1[j] += d;
            for (int k = 0; d != 0 && k < IN; k++)
                m->g1[j * IN + k] += d * x[i * IN + k];
        }
    return dt_params_grad_ready(m->p, 0, HID * IN + HID); // fc1 is final
}

// ---------------------------------------------------------------- training
static int worker(opts *a, dt_pg *pg) {
    int         world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    mlp         m   = {0};
    dt_ddp     *ddp = NULL;
    dt_optim   *opt = NULL;
    dt_sched   *sch = NULL;
    dt_sampler *smp = NULL;
    dt_loader  *ld  = NULL;
    dt_status   st  = mlp_init(&m, (int)a->batch, 1);
    if (!st && pg)
        st = dt_ddp_new(&ddp, m.p, pg, NULL); // checks tables, broadcasts rank 0's weights
    dt_adam_opts ao        = dt_adamw_opts_default();
    ao.lr                  = (float)a->lr;
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0; // no decay on biases
    if (!st && !(st = dt_adamw_new(&opt, m.p, &ao)))
        st = dt_optim_add_group(opt, dt_param_no_decay, NULL, &nd, NULL);
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas = world, so.rank = rank, so.seed = 1;
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = (size_t)a->batch;
    if (!st && !(st = dt_sampler_new(&smp, a->train.n, &so)))
        st = dt_loader_new(&ld, &a->train, smp, &lo);
    int64_t       steps = ld ? a->epochs * (int64_t)dt_loader_num_batches(ld) : 1, step = 0;
    dt_sched_opts sc = dt_sched_opts_default();
    sc.kind = DT_SCHED_COSINE, sc.warmup_steps = steps / 10, sc.total_steps = steps - steps / 10;
    sc.min_lr = (float)a->lr / 10;
    if (!st)
        st = dt_sched_new(&sch, &sc);
    for (long e = 0; !st && e < a->epochs; e++) {
        dt_loader_begin_epoch(ld, (uint64_t)e);
        dt_batch b;
        while (!st && dt_loader_next(ld, &b)) {
            float loss, norm;
            mlp_forward(&m, b.x, (int)b.size);
            dt_params_zero_grad(m.p);
            if ((st = dt_loss_nll(m.logp, b.y, (int)b.size, OUT, &loss, m.dlogp)) ||
                (st = mlp_backward(&m, b.x, (int)b.size)) || (ddp && (st = dt_ddp_sync(ddp))) ||
                (st = dt_clip_grad_norm(m.p, 1.0f, &norm)) || (st = dt_sched_apply(sch, opt, step)))
                break;
            dt_optim_step(opt);
            if (rank == 0 && (step++ % 20 == 0 || step == steps))
                printf("epoch %ld step %lld loss %.4f grad norm %.3f lr %.2e\n", e,
                       (long long)step - 1, (double)loss, (double)norm, (double)dt_optim_lr(opt));
        }
        if (!st)
            st = dt_loader_status(ld);
    }
    if (!st && a->save && rank == 0 && !(st = dt_ckpt_save_params(a->save, m.p)))
        printf("saved %s\n", a->save);
    if (st)
        fprintf(stderr, "dtrain-custom: rank %d: %s\n", rank, dt_last_error());
    dt_sched_free(sch), dt_loader_free(ld), dt_sampler_free(smp);
    dt_optim_free(opt), dt_ddp_free(ddp), mlp_free(&m);
    return st ? 1 : 0;
}

static int from_env(int local_rank, void *arg) {
    (void)local_rank;
    dt_pg *pg = NULL;
    if (dt_pg_new_from_env(&pg, NULL) != DT_OK) {
        fprintf(stderr, "dtrain-custom: %s\n", dt_last_error());
        return 1;
    }
    int rc = worker(arg, pg);
    if (rc)
        dt_pg_abort(pg, "a worker failed");
    dt_pg_free(pg);
    return rc;
}

int main(int argc, char **argv) {
    opts          a    = {0};
    bool          help = false, help_env = false;
    const dt_flag flags[] = {
        {.name    = "num-processes",
         .type    = DT_FLAG_LONG,
         .target  = &a.nproc,
         .lo      = 1,
         .hi      = 256,
         .metavar = "P",
         .help    = "fork P workers here"},
        {.name    = "epochs",
         .type    = DT_FLAG_LONG,
         .target  = &a.epochs,
         .def     = "1",
         .lo      = 1,
         .hi      = 1000,
         .metavar = "E",
         .help    = "passes over the data (default 1)"},
        {.name    = "batch-size",
         .type    = DT_FLAG_LONG,
         .target  = &a.batch,
         .def     = "64",
         .lo      = 1,
         .hi      = 65536,
         .metavar = "B",
         .help    = "samples per step and rank (default 64)"},
        {.name    = "limit",
         .type    = DT_FLAG_LONG,
         .target  = &a.limit,
         .def     = "10000",
         .lo      = 1,
         .hi      = 1L << 32,
         .metavar = "N",
         .help    = "train on the first N samples (default 10000)"},
        {.name    = "lr",
         .type    = DT_FLAG_DOUBLE,
         .target  = &a.lr,
         .def     = "1e-3",
         .lo      = 0,
         .hi      = 10,
         .metavar = "X",
         .help    = "AdamW's peak learning rate (default 1e-3)"},
        {.name    = "data-dir",
         .type    = DT_FLAG_STRING,
         .target  = &a.data_dir,
         .metavar = "D",
         .help    = "MNIST-format files (default $DT_DATA_DIR, else " DATA_DIR ")"},
        {.name    = "save",
         .type    = DT_FLAG_STRING,
         .target  = &a.save,
         .metavar = "PATH",
         .help    = "save the trained parameters there"},
        {.name    = "help-env",
         .type    = DT_FLAG_BOOL,
         .target  = &help_env,
         .metavar = "",
         .help    = "every DT_* environment variable"},
        {0}};
    const dt_flag *const tables[] = {flags, NULL};
    if (dt_flags_parse(tables, argc, argv, &help) != DT_OK) {
        fprintf(stderr, "dtrain-custom: %s (see --help)\n", dt_last_error());
        return 2;
    }
    if (help || help_env) {
        if (help)
            printf("usage: dtrain-custom [flags]\n");
        help ? dt_flags_print_help(tables, stdout) : dt_settings_print(stdout);
        return 0;
    }
    dt_dataset_opts dopts = dt_dataset_opts_default();
    dopts.mean = DATA_MEAN, dopts.std = DATA_STD, dopts.limit = (size_t)a.limit;
    const char   *dir = a.data_dir ? a.data_dir : dt_setting_str("DT_DATA_DIR") ? NULL : DATA_DIR;
    dt_launch_env le;
    if (dt_dataset_load_mnist(&a.train, dir, true, &dopts)) {
        fprintf(stderr, "dtrain-custom: %s\n", dt_last_error());
        return 1;
    }
    int rc;
    if (a.nproc > 0)
        rc = dt_spawn((int)a.nproc, from_env, &a, NULL) ? 1 : 0;
    else if (dt_launch_env_read(&le) != DT_OK || le.launcher != DT_LAUNCHER_NONE)
        rc = from_env(0, &a);
    else
        rc = worker(&a, NULL);
    dt_dataset_free(&a.train);
    return rc;
}
