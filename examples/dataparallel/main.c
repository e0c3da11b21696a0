// dtrain-dataparallel: DataParallel, threads instead of processes (PyTorch's
// nn.DataParallel without the GIL; dp.h): an MLP on (Fashion-)MNIST whose every batch is
// cut into --data-parallel N slices, each run forward and backward by a replica of the
// model on a thread of its own, their gradients summed into the master's in replica
// order, then one optimizer step. With several processes too (--num-processes P), DDP
// then averages the masters' gradients over them.
//
//   dtrain-dataparallel --data-parallel 4 --threads 4
//   dtrain-dataparallel --data-parallel 2 --threads 2 --num-processes 2
//
// What a program writes for it: its model as a replica (how to build one, how to run
// forward and backward on a slice), and dt_trainer_forward_backward in the loop where a
// plain loop calls forward, loss and backward (examples/mnist). --data-parallel 1 is
// bitwise the plain loop.
#include "dtrain/train.h"

#include <stdio.h>

enum { CLASSES = 10, HIDDEN = 128 };

// A replica: the model, and its loss gradient's buffer.
typedef struct replica {
    dt_model *m;
    float    *dlogp;
} replica;

typedef struct ctx {
    dt_trainer *t;
    size_t      batch;
} ctx;

static dt_status mlp_new(dt_model **out, uint64_t seed) {
    *out = NULL;
    DT_TRY(dt_model_new(out, 1, 28, 28));
    dt_status st;
    if ((st = dt_model_add_flatten(*out)) || (st = dt_model_add_linear(*out, HIDDEN)) ||
        (st = dt_model_add_relu(*out)) || (st = dt_model_add_linear(*out, CLASSES)) ||
        (st = dt_model_add_log_softmax(*out)) || (st = dt_model_finalize(*out, seed))) {
        dt_model_free(*out);
        *out = NULL;
    }
    return st;
}

// ops->make: replica `index`; its parameters are the master's, copied every step.
static dt_status make_replica(void *user, int index, dt_dp_replica *out) {
    (void)index;
    const ctx *c = user;
    replica   *r = dt_alloc_zero(sizeof *r);
    if (r && (r->dlogp = dt_alloc(sizeof(float) * CLASSES * c->batch)) && !mlp_new(&r->m, 0)) {
        *out = (dt_dp_replica){.obj = r, .params = dt_model_as_params(r->m), .model = r->m};
        return DT_OK;
    }
    if (r)
        dt_free(r->dlogp);
    dt_free(r);
    return dt_last_status() ? dt_last_status() : DT_ERR_NOMEM;
}

static void drop_replica(void *user, dt_dp_replica *d) {
    (void)user;
    replica *r = d->obj;
    dt_model_free(r->m);
    dt_free(r->dlogp);
    dt_free(r);
}

// ops->work: forward, loss and backward of one slice (the gradient of its mean loss; of
// the mean over the global batch in one replica under --invariant: dt_trainer_loss_over).
static dt_status forward_backward(void *user, dt_dp_replica *d, const dt_batch *b, float *loss) {
    const ctx *c    = user;
    replica   *r    = d->obj;
    int        over = (int)dt_trainer_loss_over(c->t, b->size); // --invariant: the global batch
    DT_TRY(dt_model_forward(r->m, b->x, (int)b->size));
    DT_TRY(
        dt_loss_nll_over(dt_model_output(r->m), b->y, (int)b->size, CLASSES, over, loss, r->dlogp));
    dt_trainer_scale_loss_grad(c->t, r->dlogp, CLASSES * b->size); // --precision fp16
    return dt_model_backward(r->m, r->dlogp);
}

int main(int argc, char **argv) {
    long            batch = 0, limit = 0;
    const char     *dir     = NULL;
    const dt_flag   flags[] = {{"batch-size", DT_FLAG_LONG, &batch, "128", 1, 65536, "B",
                                "samples per step and process, cut over the replicas", "training",
                                DT_FLAG_SHARED | DT_FLAG_CKPT_REFUSE, 0, 0},
                               {"data-dir", DT_FLAG_STRING, &dir, NULL, 0, 0, "D",
                                "folder of MNIST-format files (default $DT_DATA_DIR, else\n"
                                  "/usr/share/datasets/fashion-mnist)",
                                "training", 0, 0, 0},
                               {"limit", DT_FLAG_LONG, &limit, NULL, 1, 1L << 32, "N",
                                "train on the first N samples only (default all)", "training",
                                DT_FLAG_SHARED, 0, 0},
                               {0}};
    dt_trainer_opts o       = dt_trainer_opts_default();
    o.program               = "dtrain-dataparallel";
    o.flags                 = flags;
    dt_trainer *t;
    dt_status   st = dt_trainer_new(&t, argc, argv, &o);
    if (st || !t)
        return st == DT_ERR_ARG ? 2 : st ? 1 : 0;
    dt_dataset train = {0};
    if (!dir && !dt_setting_str("DT_DATA_DIR"))
        dir = "/usr/share/datasets/fashion-mnist";
    dt_dataset_opts dopts = dt_dataset_opts_default();
    dopts.limit           = (size_t)limit;
    st                    = dt_dataset_load_mnist(&train, dir, true, &dopts);
    if (!st)
        st = dt_trainer_add_content(t, "the training set (--data-dir)", train.content_hash);
    if (st || !dt_trainer_start(t)) {
        int rc = dt_trainer_exit(t, st);
        dt_dataset_free(&train);
        return rc;
    }
    ctx        c      = {t, (size_t)batch};
    replica    master = {0};
    dt_optim  *opt    = NULL;
    dt_loader *ld     = NULL;
    st                = dt_trainer_loader(t, &train, c.batch, DT_SPLIT_TRAIN, &ld);
    if (!st)
        st = mlp_new(&master.m, (uint64_t)dt_trainer_args(t)->seed);
    if (!st)
        st = dt_adadelta_new(&opt, dt_model_as_params(master.m), NULL);
    if (!st)
        st = dt_trainer_prepare_model(t, master.m, opt, NULL);
    else
        dt_model_free(master.m);
    if (!st && !(master.dlogp = dt_alloc(sizeof(float) * CLASSES * c.batch)))
        st = DT_ERR_NOMEM;
    dt_dp_ops ops = {make_replica, drop_replica, forward_backward, &c};
    if (!st)
        st = dt_trainer_set_replicas(t, &ops,
                                     &(dt_dp_replica){.obj    = &master,
                                                      .params = dt_model_as_params(master.m),
                                                      .model  = master.m});
    dt_batch b;
    while (!st && dt_trainer_next(t, &b)) {
        float loss; // the master alone, or the replicas on their slices
        if ((st = dt_trainer_forward_backward(t, &b, &loss)) || (st = dt_trainer_step(t, loss)))
            break;
    }
    if (!st && !(st = dt_trainer_finish(t)))
        st = dt_trainer_report(t, -1); // --stats, --plot
    int rc = dt_trainer_exit(t, st);   // the replicas are the trainer's, freed here
    dt_free(master.dlogp);
    dt_dataset_free(&train);
    return rc;
}
