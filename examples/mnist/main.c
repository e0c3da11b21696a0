// dtrain-mnist: the seed chapter's ConvNet on (Fashion-)MNIST, in one process or
// data-parallel over many.
//
//   conv(1->16, 3x3) -> ReLU -> conv(16->32, 3x3) -> ReLU -> maxpool 2 -> Dropout2d(0.10)
//   -> flatten (4608) -> linear(64) -> ReLU -> dropout(0.25) -> linear(10) -> log_softmax
//
// NLL loss, Adadelta (lr 0.5), batch 128 per process; the loss every 10 batches, the
// training time and the test accuracy, as the seed script prints them.
//
// Three ways to run:
//   dtrain-mnist                          one process, no process group
//   dtrain-mnist --num-processes P [--num-machines M --machine-id K]
//                                         the seed's launch style: P workers forked here,
//                                         rank = K*P + local rank, world = M*P
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. dtrain-mnist
//                                         one worker of a job started by a launcher
//   mpirun -np N dtrain-mnist [--backend mpi]   (or srun): the same, rank and size from
//                                         MPI's variables, the store's address over MPI
//
// The plumbing (flags, launch, DDP, checkpoints, SIGTERM, summaries) is the trainer's
// (dtrain/train.h). What is left here is what a user writes: the model, the data, the
// loop and the evaluation. A resumed run (--checkpoint-dir D --resume) ends bitwise
// equal to an uninterrupted one: the trainer saves parameters, Adadelta's state, each
// rank's sampler position and the dropout stream, whose masks depend only on (seed,
// epoch, sample).
//
// One process versus many: this program is the same text for both (the launch is a flag
// or a launcher). Against a plain single-process loop without the trainer, the loop
// differs in seven lines and main in two (docs/trainer.md shows the diff):
// dt_trainer_loader for the loader, dt_trainer_prepare_model after the optimizer,
// dt_trainer_next for the epoch and batch loops, no zero_grad, dt_trainer_step for
// dt_optim_step, dt_trainer_finish at the end; dt_trainer_new and dt_trainer_run in main.
#include "convnet.h"
#include "fmnist.h"

#include "dtrain/train.h"

#include <stdio.h>

// The program's own flags, beside the trainer's common table.
typedef struct args {
    long        batch_size, limit;
    double      lr;
    const char *data_dir;
} args;

// What every worker shares: the datasets, loaded once before forking so forked workers
// share the pages.
typedef struct job {
    args       a;
    dt_dataset train, test;
} job;

static const char epilogue[] =
    "The sampler advances its epoch by itself every pass (and is told the epoch each\n"
    "epoch anyway), so no two epochs repeat an order. Every rank must be given the same\n"
    "training flags: they are compared at start-up.\n"
    "Preemption: SIGTERM to any worker (or to dtrun) stops every rank at the same step\n"
    "boundary, saves a checkpoint there when --checkpoint-dir is set, and exits with\n"
    "status 75 (EX_TEMPFAIL); --resume then continues bitwise. Local processes: at most\n"
    "4 per online CPU and 256 (DT_MAX_LOCAL_PROCS overrides).\n"
    "Exit status: 0 done, 1 failed, 2 usage error, 75 stopped by SIGTERM.\n";

// A worker's model, for the evaluation.
typedef struct worker {
    const job *j;
    dt_model  *m;
    int64_t    hits; // correct test predictions, over all ranks
} worker;

// Test-set mean loss and accuracy, each rank evaluating its share (every sample once
// across ranks), summed over ranks. Also the trainer's per-epoch evaluation for --plot.
static dt_status evaluate(dt_trainer *t, void *user, double *mean_loss) {
    worker    *w = user;
    dt_loader *l;
    DT_TRY(dt_trainer_loader(t, &w->j->test, (size_t)w->j->a.batch_size, DT_SPLIT_EVAL, &l));
    dt_model_train(w->m, false);
    dt_loader_begin_epoch(l, 0);
    dt_batch b;
    double   total = 0;
    int64_t  hits  = 0;
    while (dt_loader_next(l, &b)) {
        float loss;
        DT_TRY(dt_model_forward(w->m, b.x, (int)b.size));
        DT_TRY(dt_loss_nll(dt_model_output(w->m), b.y, (int)b.size, 10, &loss, NULL));
        total += (double)loss * (double)b.size;
        hits += dt_count_correct(dt_model_output(w->m), b.y, (int)b.size, 10);
    }
    DT_TRY(dt_loader_status(l));
    dt_model_train(w->m, true);
    if (dt_trainer_pg(t)) {
        float lsum = (float)total;
        DT_TRY(dt_trainer_all_reduce(t, &hits, 1, DT_INT64, DT_REDUCE_SUM));
        DT_TRY(dt_trainer_all_reduce(t, &lsum, 1, DT_FLOAT32, DT_REDUCE_SUM));
        total = lsum;
    }
    w->hits    = hits;
    *mean_loss = total / (double)w->j->test.n;
    return DT_OK;
}

// One worker: rank r of the job, or the only process.
// A replica of the model (dt_trainer_forward_backward; --data-parallel N builds N more):
// the ConvNet and its loss gradient's buffer.
typedef struct replica {
    dt_model *m;
    float    *dlogp;
} replica;

// What the replicas' functions see: the job, and the trainer (--precision, the fp16
// loss scale).
typedef struct fb_ctx {
    const job  *j;
    dt_trainer *t;
} fb_ctx;

static dt_status make_replica(void *user, int index, dt_dp_replica *out) {
    (void)index; // its parameters are the master's, copied every step
    const fb_ctx *c = user;
    const job    *j = c->j;
    replica      *r = dt_alloc_zero(sizeof *r);
    if (!r || !(r->dlogp = dt_alloc(sizeof(float) * 10 * (size_t)j->a.batch_size)) ||
        mnist_convnet_new(&r->m, 0, 0.10f, 0.25f) ||
        dt_model_set_precision(r->m, dt_trainer_precision(c->t))) {
        if (r && r->m)
            dt_model_free(r->m);
        if (r)
            dt_free(r->dlogp);
        dt_free(r);
        return dt_last_status() ? dt_last_status() : DT_ERR_NOMEM;
    }
    *out = (dt_dp_replica){.obj = r, .params = dt_model_as_params(r->m), .model = r->m};
    return DT_OK;
}

static void drop_replica(void *user, dt_dp_replica *d) {
    (void)user;
    replica *r = d->obj;
    dt_model_free(r->m);
    dt_free(r->dlogp);
    dt_free(r);
}

static dt_status forward_backward(void *user, dt_dp_replica *d, const dt_batch *b, float *loss) {
    const fb_ctx *c = user;
    replica      *r = d->obj;
    DT_TRY(dt_model_forward(r->m, b->x, (int)b->size));
    DT_TRY(dt_loss_nll(dt_model_output(r->m), b->y, (int)b->size, 10, loss, r->dlogp));
    float scale = dt_trainer_loss_scale(c->t); // --precision fp16: the loss scaler's
    for (size_t i = 0; scale != 1.0f && i < 10 * b->size; i++)
        r->dlogp[i] *= scale;
    return dt_model_backward(r->m, r->dlogp);
}

static dt_status train(dt_trainer *t, void *user) {
    const job           *j = user;
    const dt_train_args *a = dt_trainer_args(t);
    dt_model            *m;
    dt_loader           *ld;
    DT_TRY(dt_trainer_loader(t, &j->train, (size_t)j->a.batch_size, DT_SPLIT_TRAIN, &ld));
    DT_TRY(mnist_convnet_new(&m, (uint64_t)a->seed, 0.10f, 0.25f));
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = (float)j->a.lr;
    dt_optim *opt       = NULL;
    DT_TRY(dt_adadelta_new(&opt, dt_model_as_params(m), &ao));
    // What --device cuda computes on the GPU: the NLL of the log-softmax (forward_backward
    // below runs there by itself).
    DT_TRY(dt_trainer_set_loss(t, &(dt_loss_spec){DT_LOSS_NLL, -100, 0.0f, 1.0f}));
    DT_TRY(dt_trainer_prepare_model(t, m, opt, NULL)); // the trainer's from here: --load,
                                                       // --resume, DDP
    worker w = {j, m, 0};
    dt_trainer_set_eval(t, evaluate, &w); // --plot's test loss after each epoch
    replica master = {m, dt_alloc(sizeof(float) * 10 * (size_t)j->a.batch_size)};
    if (!master.dlogp)
        return DT_ERR_NOMEM;
    fb_ctx    ctx = {j, t};
    dt_dp_ops ops = {make_replica, drop_replica, forward_backward, &ctx};
    dt_status st  = dt_trainer_set_replicas(
         t, &ops, &(dt_dp_replica){.obj = &master, .params = dt_model_as_params(m), .model = m});
    dt_batch b;
    while (!st && dt_trainer_next(t, &b)) { // the loss lines (or a bar) are the trainer's
        float loss;                         // forward, loss, backward (or N replicas')
        if ((st = dt_trainer_forward_backward(t, &b, &loss)) || (st = dt_trainer_step(t, loss)))
            break;
    }
    dt_free(master.dlogp);
    double accuracy = -1, loss;
    if (st || (st = dt_trainer_finish(t)))
        return st;
    if (!a->no_test) {
        DT_TRY(evaluate(t, &w, &loss));
        DT_TRY(dt_trainer_log_val(t, loss));
        accuracy = 100.0 * (double)w.hits / (double)j->test.n;
        dt_trainer_print_local(t, "Test accuracy: %.2f%% (%lld/%zu), average loss %.4f\n", accuracy,
                               (long long)w.hits, j->test.n, loss);
    }
    return dt_trainer_report(t, accuracy); // --plot, --stats
}

// The datasets against the model's input shape, before any process starts training:
// images of another size would be read past their end (smaller) or trained as garbage
// (larger). The model is built only to ask its shape.
static dt_status load_data(job *j, bool test) {
    dt_model       *m;
    int             c, h, w;
    dt_dataset_opts dopts = fmnist_opts(); // the seed's normalisation
    const char     *dir   = fmnist_dir(j->a.data_dir);
    dopts.limit           = (size_t)j->a.limit;
    DT_TRY(dt_dataset_load_mnist(&j->train, dir, true, &dopts));
    dopts.limit = 0;
    if (test)
        DT_TRY(dt_dataset_load_mnist(&j->test, dir, false, &dopts));
    DT_TRY(mnist_convnet_new(&m, 0, 0.0f, 0.0f));
    dt_model_input_shape(m, &c, &h, &w);
    dt_model_free(m);
    DT_TRY(dt_dataset_check_shape(&j->train, "training set", c, h, w));
    return test ? dt_dataset_check_shape(&j->test, "test set", c, h, w) : DT_OK;
}

int main(int argc, char **argv) {
    job             j       = {0};
    const dt_flag   flags[] = {{"batch-size", DT_FLAG_LONG, &j.a.batch_size, "128", 1, 65536, "B",
                                "samples per step and process (default 128)", "training",
                                DT_FLAG_SHARED | DT_FLAG_CKPT_REFUSE, 0, 0},
                               {"lr", DT_FLAG_DOUBLE, &j.a.lr, "0.5", 0.0, 1e6, "X",
                                "Adadelta learning rate (default 0.5)", "training",
                                DT_FLAG_SHARED | DT_FLAG_CKPT_WARN, 0, 0},
                               {"data-dir", DT_FLAG_STRING, &j.a.data_dir, NULL, 0, 0, "D",
                                "folder of MNIST-format files, plain or .gz\n"
                                  "(default $DT_DATA_DIR, else " FMNIST_DIR ")",
                                "training", 0, 0, 0},
                               {"limit", DT_FLAG_LONG, &j.a.limit, NULL, 1, 1L << 32, "N",
                                "train on the first N samples only (default all)", "training",
                                DT_FLAG_SHARED, 0, 0},
                               {0}};
    dt_trainer_opts o       = dt_trainer_opts_default();
    o.program               = "dtrain-mnist";
    o.flags                 = flags;
    o.epilogue              = epilogue;
    o.model_parallel        = true; // --dp and --zero; --pp and --tp refused, saying why
    o.no_model_split        = "the seed's ConvNet is one Sequential model, with no cut between "
                              "pipeline stages and no layer split over ranks";
    dt_trainer *t;
    dt_status   st = dt_trainer_new(&t, argc, argv, &o);
    if (st || !t)
        return st == DT_ERR_ARG ? 2 : st ? 1 : 0;
    bool test = !dt_trainer_args(t)->no_test;
    int  rc   = 1;
    if (load_data(&j, test) ||
        dt_trainer_add_setting(t, "the training set's size (--data-dir, --limit)",
                               (int64_t)j.train.n) ||
        dt_trainer_add_setting(t, "the test set's size (--data-dir)", (int64_t)j.test.n) ||
        dt_trainer_add_content(t, "the training set's content (--data-dir, --limit)",
                               j.train.content_hash) ||
        dt_trainer_add_content(t, "the test set's content (--data-dir)", j.test.content_hash))
        fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
    else
        rc = dt_trainer_run(t, train, &j);
    dt_dataset_free(&j.train);
    dt_dataset_free(&j.test);
    dt_trainer_free(t);
    return rc;
}
