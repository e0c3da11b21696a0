// dtrain-mnist: the seed chapter's ConvNet on (Fashion-)MNIST, in one process or
// data-parallel over many: the seed's loop, written plainly on the trainer (train.h).
//
//   conv(1->16, 3x3) -> ReLU -> conv(16->32, 3x3) -> ReLU -> maxpool 2 -> Dropout2d(0.10)
//   -> flatten (4608) -> linear(64) -> ReLU -> dropout(0.25) -> linear(10) -> log_softmax
//
// NLL loss, Adadelta (lr 0.5), batch 128 per process; the loss every 10 batches, the
// training time and the test accuracy, as the seed script prints them.
//
//   dtrain-mnist                          one process, no process group
//   dtrain-mnist --num-processes P [--num-machines M --machine-id K]
//                                         P workers forked here, rank = K*P + local rank
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. dtrain-mnist   (or dtrun, mpirun,
//                                         srun): one worker of a job started by a launcher
//
// The plumbing (flags, launch, DDP, checkpoints, SIGTERM, summaries) is the trainer's;
// what is left is what a user writes: the model, the data, the loop, the evaluation. A
// resumed run (--checkpoint-dir D --resume) ends bitwise equal to an uninterrupted one.
// Threads instead of processes (--data-parallel N): examples/dataparallel.
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

static const char epilogue[] =
    "Every rank must be given the same training flags: they are compared at start-up.\n"
    "Preemption: SIGTERM to any worker (or to dtrun) stops every rank at the same step\n"
    "boundary, saves a checkpoint there when --checkpoint-dir is set, and exits with\n"
    "status 75 (EX_TEMPFAIL); --resume then continues bitwise. Local processes: at most\n"
    "4 per online CPU and 256 (DT_MAX_LOCAL_PROCS overrides).\n"
    "Exit status: 0 done, 1 failed, 2 usage error, 75 stopped by SIGTERM.\n";

// The test set's mean loss and correct predictions, each rank evaluating its share
// (every sample once across ranks), summed over ranks.
static dt_status evaluate(dt_trainer *t, dt_model *m, const dt_dataset *test, size_t batch,
                          double *mean_loss, int64_t *hits) {
    dt_loader *l;
    DT_TRY(dt_trainer_loader(t, test, batch, DT_SPLIT_EVAL, &l));
    dt_model_train(m, false);
    dt_loader_begin_epoch(l, 0);
    dt_batch b;
    double   total = 0;
    *hits          = 0;
    while (dt_loader_next(l, &b)) {
        float loss;
        DT_TRY(dt_model_forward(m, b.x, (int)b.size));
        DT_TRY(dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, NULL));
        total += (double)loss * (double)b.size;
        *hits += dt_count_correct(dt_model_output(m), b.y, (int)b.size, 10);
    }
    DT_TRY(dt_loader_status(l));
    dt_model_train(m, true);
    float sum = (float)total; // over the ranks (the trainer's reductions: no-ops alone)
    DT_TRY(dt_trainer_all_reduce(t, hits, 1, DT_INT64, DT_REDUCE_SUM));
    DT_TRY(dt_trainer_all_reduce(t, &sum, 1, DT_FLOAT32, DT_REDUCE_SUM));
    *mean_loss = (dt_trainer_pg(t) ? (double)sum : total) / (double)test->n;
    return DT_OK;
}

// The datasets, checked against the model's input shape before any worker trains, and
// told to the trainer: every rank must hold the same.
static dt_status load_data(dt_trainer *t, const args *a, dt_dataset *train, dt_dataset *test) {
    dt_model       *m;
    int             c, h, w;
    dt_dataset_opts dopts = fmnist_opts(); // the seed's normalisation
    dopts.limit           = (size_t)a->limit;
    DT_TRY(dt_dataset_load_mnist(train, fmnist_dir(a->data_dir), true, &dopts));
    dopts.limit = 0;
    if (!dt_trainer_args(t)->no_test)
        DT_TRY(dt_dataset_load_mnist(test, fmnist_dir(a->data_dir), false, &dopts));
    DT_TRY(mnist_convnet_new(&m, 0, 0.0f, 0.0f)); // built only to ask its shape
    dt_model_input_shape(m, &c, &h, &w);
    dt_model_free(m);
    DT_TRY(dt_dataset_check_shape(train, "training set", c, h, w));
    if (test->n)
        DT_TRY(dt_dataset_check_shape(test, "test set", c, h, w));
    DT_TRY(dt_trainer_add_setting(t, "the training set's size (--data-dir, --limit)",
                                  (int64_t)train->n));
    DT_TRY(dt_trainer_add_setting(t, "the test set's size (--data-dir)", (int64_t)test->n));
    DT_TRY(dt_trainer_add_content(t, "the training set's content (--data-dir, --limit)",
                                  train->content_hash));
    return dt_trainer_add_content(t, "the test set's content (--data-dir)", test->content_hash);
}

int main(int argc, char **argv) {
    args          a       = {0};
    const dt_flag flags[] = {
        {"batch-size", DT_FLAG_LONG, &a.batch_size, "128", 1, 65536, "B",
         "samples per step and process (default 128)", "training",
         DT_FLAG_SHARED | DT_FLAG_CKPT_REFUSE, 0, 0},
        {"lr", DT_FLAG_DOUBLE, &a.lr, "0.5", 0.0, 1e6, "X", "Adadelta learning rate (default 0.5)",
         "training", DT_FLAG_SHARED | DT_FLAG_CKPT_WARN, 0, 0},
        {"data-dir", DT_FLAG_STRING, &a.data_dir, NULL, 0, 0, "D",
         "folder of MNIST-format files, plain or .gz\n"
         "(default $DT_DATA_DIR, else " FMNIST_DIR ")",
         "training", 0, 0, 0},
        {"limit", DT_FLAG_LONG, &a.limit, NULL, 1, 1L << 32, "N",
         "train on the first N samples only (default all)", "training", DT_FLAG_SHARED, 0, 0},
        {0}};
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "dtrain-mnist";
    o.flags           = flags;
    o.epilogue        = epilogue;
    o.model_parallel  = true; // --dp and --zero; --pp and --tp refused, saying why
    o.no_model_split  = "the seed's ConvNet is one Sequential model, with no cut between "
                        "pipeline stages and no layer split over ranks";
    dt_trainer *t;
    dt_status   st = dt_trainer_new(&t, argc, argv, &o);
    if (st || !t)
        return st == DT_ERR_ARG ? 2 : st ? 1 : 0;
    const dt_train_args *ta    = dt_trainer_args(t);
    dt_dataset           train = {0}, test = {0};
    st = load_data(t, &a, &train, &test); // once: the workers forked below share it
    if (st || !dt_trainer_start(t)) {
        int rc = dt_trainer_exit(t, st);
        dt_dataset_free(&train), dt_dataset_free(&test);
        return rc;
    }
    // A worker from here: rank r of the job, or the only process.
    size_t           batch = (size_t)a.batch_size;
    dt_loader       *ld    = NULL;
    dt_model        *m     = NULL;
    dt_optim        *opt   = NULL;
    dt_adadelta_opts ao    = dt_adadelta_opts_default();
    ao.lr                  = (float)a.lr;
    float *dlogp           = dt_alloc(sizeof(float) * 10 * batch);
    st = dlogp ? dt_trainer_loader(t, &train, batch, DT_SPLIT_TRAIN, &ld) : DT_ERR_NOMEM;
    if (!st)
        st = mnist_convnet_new(&m, (uint64_t)ta->seed, 0.10f, 0.25f);
    if (!st)
        st = dt_adadelta_new(&opt, dt_model_as_params(m), &ao);
    if (!st) // what --device cuda computes on the GPU: the NLL of the log-softmax
        st = dt_trainer_set_loss(t, &(dt_loss_spec){DT_LOSS_NLL, -100, 0.0f, 1.0f});
    if (!st) // the trainer owns them from here: --load, --resume, DDP
        st = dt_trainer_prepare_model(t, m, opt, NULL);
    else
        dt_model_free(m);
    long     epoch = dt_trainer_epoch(t);
    double   loss_test;
    int64_t  hits;
    dt_batch b;
    while (!st && dt_trainer_next(t, &b)) { // the loss lines (or a bar) are the trainer's
        if (ta->plot && !ta->no_test && dt_trainer_epoch(t) != epoch) { // --plot: test loss
            epoch = dt_trainer_epoch(t);                                // after each epoch
            if ((st = evaluate(t, m, &test, batch, &loss_test, &hits)) ||
                (st = dt_trainer_log_val(t, loss_test)))
                break;
        }
        float loss;
        if (dt_trainer_on_gpu(t)) { // --device cuda: the same step on the GPU
            if ((st = dt_trainer_device_step(t, (const void *[]){b.x}, b.y, (int)b.size, &loss)) ||
                (st = dt_trainer_step(t, loss)))
                break;
            continue;
        }
        int over = (int)dt_trainer_loss_over(t, b.size); // --invariant: the global batch
        if ((st = dt_model_forward(m, b.x, (int)b.size)) ||
            (st = dt_loss_nll_over(dt_model_output(m), b.y, (int)b.size, 10, over, &loss, dlogp)))
            break;
        dt_trainer_scale_loss_grad(t, dlogp, 10 * b.size); // --precision fp16's loss scale
        if ((st = dt_model_backward(m, dlogp)) || (st = dt_trainer_step(t, loss)))
            break;
    }
    dt_free(dlogp);
    if (!st) // the last checkpoint, "Finished training", the replica checksum
        st = dt_trainer_finish(t);
    double accuracy = -1;
    if (!st && !ta->no_test && !(st = evaluate(t, m, &test, batch, &loss_test, &hits)) &&
        !(st = dt_trainer_log_val(t, loss_test))) {
        accuracy = 100.0 * (double)hits / (double)test.n;
        dt_trainer_print_local(t, "Test accuracy: %.2f%% (%lld/%zu), average loss %.4f\n", accuracy,
                               (long long)hits, test.n, loss_test);
    }
    if (!st)
        st = dt_trainer_report(t, accuracy); // --plot, --stats
    int rc = dt_trainer_exit(t, st);
    dt_dataset_free(&train), dt_dataset_free(&test);
    return rc;
}
