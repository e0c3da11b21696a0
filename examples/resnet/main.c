// dtrain-resnet: a small ResNet on Fashion-MNIST, in one process or data-parallel over
// many: the model of the PyTorch peer resnet_fmnist.py, with its flags and its lines.
//
//   conv3x3(1->16) BN ReLU -> BasicBlock 16 (s1) -> 32 (s2) -> 64 (s2)
//   -> AdaptiveAvgPool(1) -> Linear(64->10)                          77,754 parameters
//   BasicBlock: conv3x3-BN-ReLU-conv3x3-BN, plus the input (or conv1x1(s)+BN when the
//   shape changes), then ReLU. Convolutions have no bias; PyTorch's default init.
//
// Cross-entropy, SGD (lr 0.05, momentum 0.9, Nesterov, weight decay 5e-4 on every
// parameter), one epoch. --batch-size is the GLOBAL batch: each of the N ranks takes
// batch/N samples per step (rank r the global positions r, r+N, ...), so the samples of
// a step do not depend on N. BatchNorm normalises with each rank's local batch, and
// rank 0's running statistics are copied to every rank before each step (PyTorch DDP's
// broadcast_buffers). --sync-bn makes the statistics those of the global batch
// (SyncBatchNorm): N ranks then train the model of one rank, up to rounding.
//
// Launch as dtrain-mnist: one process; --num-processes P [--num-machines M --machine-id
// K]; or one worker under dtrun, torchrun-style variables, mpirun or srun. The plumbing
// (flags, launch, DDP, checkpoints, --resume, SIGTERM, --save-model/--load) is the
// trainer's (dtrain/train.h); what is left here is the model, the loop and the test.
#include "../mnist/fmnist.h" // the seed's data: folder, normalisation

#include "dtrain/graph.h"
#include "dtrain/train.h"

#include <stdarg.h>
#include <stdio.h>

typedef struct args { // the program's own flags, beside the trainer's table
    long        batch_size, limit;
    double      lr, momentum, weight_decay;
    bool        sync_bn, undistributed, no_fuse;
    const char *data_dir;
} args;

typedef struct job { // loaded once, before any worker is forked
    args       a;
    dt_dataset train, test;
} job;

static const char summary[] =
    "A small ResNet (3 BasicBlocks + BatchNorm, 77,754 parameters) on Fashion-MNIST,\n"
    "trained as /usr/bin/python3 resnet_fmnist.py does (the PyTorch peer).\n";

static const char epilogue[] =
    "Output (rank 0): the model line; every --log-every batches `epoch: E [b/B (p%)]\\t\n"
    "training loss: L` (rank 0's local batch); `Finished training in X secs (the training\n"
    "loop; Y secs from start-up)`: X times the loop only, as the peer's line does, Y from\n"
    "the program's start (the seed's and dtrain-mnist's meaning); then `Test set: average\n"
    "loss L, accuracy C/10000 (NN.NN%)` (evaluation mode, rank 0's weights and running\n"
    "statistics). The peer's --port is --master-port here; its --blas-threads has no\n"
    "counterpart (dtrain's kernels use --threads). Exit status: 0 done, 1 failed, 2 usage\n"
    "error, 75 stopped by SIGTERM (run again with --resume to continue bitwise).\n";

// ------------------------------------------------------------------------------ model

static char *name(char *buf, const char *fmt, ...) { // a node name, "layer2.conv1"
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, DT_GRAPH_NAME_MAX + 1, fmt, ap);
    va_end(ap);
    return buf;
}

static dt_status conv(dt_graph *g, const char *node, const char *in, int cin, int cout, int k,
                      int stride) {
    dt_conv2d_opts o = dt_conv2d_opts_default();
    o.sh = o.sw = stride, o.ph = o.pw = k / 2, o.bias = false;
    dt_layer *l;
    DT_TRY(dt_layer_conv2d_new(&l, cin, cout, k, k, &o));
    return dt_graph_add(g, node, l, in);
}

static dt_status bn(dt_graph *g, const char *node, const char *in, int c,
                    const dt_batchnorm_opts *o) {
    dt_layer *l;
    DT_TRY(dt_layer_batchnorm2d_new(&l, c, o));
    return dt_graph_add(g, node, l, in);
}

static dt_status relu(dt_graph *g, const char *node, const char *in) {
    dt_layer *l;
    DT_TRY(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    return dt_graph_add(g, node, l, in);
}

// BasicBlock `b` ("layer1") on input `in`; its output node is "<b>.out". Nodes are named
// as PyTorch's state_dict keys ("layer2.shortcut.0.weight").
static dt_status basic_block(dt_graph *g, const char *b, const char *in, int cin, int cout,
                             int stride, const dt_batchnorm_opts *o) {
    char n1[48], n2[48], sc[48];
    DT_TRY(conv(g, name(n1, "%s.conv1", b), in, cin, cout, 3, stride));
    DT_TRY(bn(g, name(n2, "%s.bn1", b), n1, cout, o));
    DT_TRY(relu(g, name(n1, "%s.relu1", b), n2));
    DT_TRY(conv(g, name(n2, "%s.conv2", b), n1, cout, cout, 3, 1));
    DT_TRY(bn(g, name(n1, "%s.bn2", b), n2, cout, o));
    const char *shortcut = in;
    if (stride != 1 || cin != cout) {
        DT_TRY(conv(g, name(n2, "%s.shortcut.0", b), in, cin, cout, 1, stride));
        DT_TRY(bn(g, shortcut = name(sc, "%s.shortcut.1", b), n2, cout, o));
    }
    dt_layer *l;
    DT_TRY(dt_layer_add_new(&l, NULL));
    DT_TRY(dt_graph_add(g, name(n2, "%s.add", b), l, n1, shortcut));
    return relu(g, name(n1, "%s.out", b), n2);
}

// The SmallResNet; `pg` non-NULL makes every BatchNorm a SyncBatchNorm over it. With
// `fuse`, each BatchNorm and the ReLU (or Add + ReLU) after it run as one node
// (dt_graph_fuse): the same model, with fewer passes over memory and less of it.
static dt_status resnet_new(dt_graph **out, uint64_t seed, dt_pg *pg, bool fuse) {
    dt_batchnorm_opts o = dt_batchnorm_opts_default();
    if (pg)
        DT_TRY(dt_syncbn_opts(&o, pg));
    dt_graph *g;
    dt_layer *l;
    DT_TRY(dt_graph_new(&g, NULL));
    dt_status st;
    if ((st = dt_graph_input(g, "x", &(dt_shape){3, {1, 28, 28}, DT_ELEM_F32})) ||
        (st = conv(g, "conv1", "x", 1, 16, 3, 1)) || (st = bn(g, "bn1", "conv1", 16, &o)) ||
        (st = relu(g, "relu", "bn1")) || (st = basic_block(g, "layer1", "relu", 16, 16, 1, &o)) ||
        (st = basic_block(g, "layer2", "layer1.out", 16, 32, 2, &o)) ||
        (st = basic_block(g, "layer3", "layer2.out", 32, 64, 2, &o)) ||
        (st = dt_layer_adaptive_avgpool2d_new(&l, 1, 1, NULL)) ||
        (st = dt_graph_add(g, "pool", l, "layer3.out")) || (st = dt_layer_flatten_new(&l, NULL)) ||
        (st = dt_graph_add(g, "flatten", l, "pool")) ||
        (st = dt_layer_linear_new(&l, 64, 10, NULL)) ||
        (st = dt_graph_add(g, "fc", l, "flatten")) || (fuse && (st = dt_graph_fuse(g, NULL))) ||
        (st = dt_graph_finalize(g, seed))) {
        dt_graph_free(g);
        return st;
    }
    *out = g;
    return DT_OK;
}

// Training FLOPs per sample: 3x the forward's convolutions and Linear, less the stem's
// input gradient (the peer's count: 55.85 MFLOP).
static double train_flops_per_sample(void) {
    double stem = 28 * 28 * 1 * 16 * 9, l1 = 2 * 28 * 28 * 16 * 16 * 9;
    double l2 = 14 * 14 * (16 * 32 * 9 + 32 * 32 * 9 + 16 * 32);
    double l3 = 7 * 7 * (32 * 64 * 9 + 64 * 64 * 9 + 32 * 64);
    return 6 * (stem + l1 + l2 + l3 + 64 * 10) - 2 * stem;
}

// --------------------------------------------------------------------------- training

typedef struct worker {
    const job *j;
    dt_graph  *g;
    size_t     batch; // per rank
    int64_t    hits;
} worker;

// The test set, each rank its share (every sample once), summed over ranks: rank 0's
// model, since every rank holds rank 0's weights and running statistics.
static dt_status evaluate(dt_trainer *t, void *user, double *mean_loss) {
    worker    *w = user;
    dt_loader *l;
    DT_TRY(dt_trainer_loader(t, &w->j->test, w->batch, DT_SPLIT_EVAL, &l));
    dt_graph_train(w->g, false);
    dt_loader_begin_epoch(l, 0);
    dt_batch b;
    float    total = 0; // the loss summed over samples
    int64_t  hits  = 0;
    while (dt_loader_next(l, &b)) {
        float loss;
        DT_TRY(dt_graph_forward(w->g, (const void *[]){b.x}, (int)b.size));
        DT_TRY(dt_loss_cross_entropy_ex(dt_graph_output(w->g), b.y, (int)b.size, 10, -100, 0.0f,
                                        &loss, NULL));
        total += loss * (float)b.size;
        hits += dt_count_correct(dt_graph_output(w->g), b.y, (int)b.size, 10);
    }
    DT_TRY(dt_loader_status(l));
    dt_graph_train(w->g, true);
    DT_TRY(dt_trainer_all_reduce(t, &total, 1, DT_FLOAT32, DT_REDUCE_SUM));
    DT_TRY(dt_trainer_all_reduce(t, &hits, 1, DT_INT64, DT_REDUCE_SUM));
    w->hits    = hits;
    *mean_loss = (double)total / (double)w->j->test.n;
    return DT_OK;
}

static void commas(char *buf, long v) { // 77754 -> "77,754"
    if (v >= 1000)
        snprintf(buf, 32, "%ld,%03ld", v / 1000, v % 1000);
    else
        snprintf(buf, 32, "%ld", v);
}

static dt_status train(dt_trainer *t, void *user) {
    const job           *j     = user;
    const args          *a     = &j->a;
    const dt_train_args *ta    = dt_trainer_args(t);
    int                  world = dt_trainer_world(t);
    if (a->batch_size % world)
        return dt_fail(DT_ERR_ARG,
                       "--batch-size %ld: expected a multiple of the %d ranks (it is the global "
                       "batch, split evenly), found a remainder of %ld",
                       a->batch_size, world, a->batch_size % world);
    worker     w = {j, NULL, (size_t)(a->batch_size / world), 0};
    dt_loader *ld;
    DT_TRY(dt_trainer_loader(t, &j->train, w.batch, DT_SPLIT_TRAIN, &ld));
    // SyncBatchNorm only matters with more than one rank (PyTorch's SyncBatchNorm also
    // runs plain BatchNorm at world size 1).
    bool sync = a->sync_bn && world > 1;
    DT_TRY(resnet_new(&w.g, (uint64_t)ta->seed, sync ? dt_trainer_pg(t) : NULL, !a->no_fuse));
    dt_params  *p  = dt_graph_params(w.g);
    dt_sgd_opts so = dt_sgd_opts_default();
    so.lr = (float)a->lr, so.momentum = (float)a->momentum;
    so.weight_decay = (float)a->weight_decay, so.nesterov = true;
    dt_optim *opt = NULL;
    // The graph and optimizer are the trainer's from here: threads, --load, --resume, DDP.
    dt_status st = dt_sgd_new(&opt, p, &so);
    if (!st) // what --device cuda computes on the GPU (the loop below on the CPU)
        st = dt_trainer_set_loss(t, &(dt_loss_spec){DT_LOSS_CROSS_ENTROPY, -100, 0.0f, 1.0f});
    if (st)
        dt_graph_free(w.g);
    else
        st = dt_trainer_prepare_graph(t, w.g, opt, NULL);
    char np[32], ni[32];
    commas(np, (long)dt_params_trainable_numel(p));
    commas(ni, (long)j->train.n);
    if (!st)
        dt_trainer_print(t,
                         "model: SmallResNet, parameters: %s | %.2f MFLOP trained per sample | "
                         "%s training images, global batch %ld over %d rank(s), %ld epoch(s)%s\n",
                         np, train_flops_per_sample() / 1e6, ni, a->batch_size, world, ta->epochs,
                         sync ? ", SyncBatchNorm" : "");
    float *dlogits = st ? NULL : dt_alloc(sizeof(float) * 10 * w.batch);
    if (!st && !dlogits)
        st = DT_ERR_NOMEM;
    dt_batch b;
    while (!st && dt_trainer_next(t, &b)) { // the loss lines are the trainer's
        float loss;
        if (dt_trainer_on_gpu(t)) { // --device cuda: the same step on the GPU
            if ((st = dt_trainer_device_step(t, (const void *[]){b.x}, b.y, (int)b.size, &loss)) ||
                (st = dt_trainer_step(t, loss)))
                break;
            continue;
        }
        if ((st = dt_graph_forward(w.g, (const void *[]){b.x}, (int)b.size)) ||
            (st = dt_loss_cross_entropy_ex(dt_graph_output(w.g), b.y, (int)b.size, 10, -100, 0.0f,
                                           &loss, dlogits)) ||
            (dt_trainer_scale_loss_grad(t, dlogits, 10 * b.size),
             (st = dt_graph_backward(w.g, dlogits))) ||
            (st = dt_trainer_step(t, loss)))
            break;
    }
    dt_free(dlogits);
    double accuracy = -1, loss;
    if (!st)
        st = dt_trainer_finish(t);
    if (!st && !ta->no_test && !(st = evaluate(t, &w, &loss)) &&
        !(st = dt_trainer_log_val(t, loss))) {
        accuracy = 100.0 * (double)w.hits / (double)j->test.n;
        dt_trainer_print(t, "Test set: average loss %.4f, accuracy %lld/%zu (%.2f%%)\n", loss,
                         (long long)w.hits, j->test.n, accuracy);
    }
    return st ? st : dt_trainer_report(t, accuracy); // --plot, --stats
}

int main(int argc, char **argv) {
    job           j       = {0};
    args         *a       = &j.a;
    const dt_flag flags[] = {
        {"batch-size", DT_FLAG_LONG, &a->batch_size, "128", 1, 65536, "B",
         "GLOBAL batch per step (default 128): each of the N ranks takes B/N\n"
         "(B must be a multiple of N), as the peer's --batch-size",
         "training", DT_FLAG_SHARED | DT_FLAG_CKPT_REFUSE, 0, 0},
        {"lr", DT_FLAG_DOUBLE, &a->lr, "0.05", 0.0, 1e6, "X", "SGD learning rate (default 0.05)",
         "training", DT_FLAG_SHARED | DT_FLAG_CKPT_WARN, 0, 0},
        {"momentum", DT_FLAG_DOUBLE, &a->momentum, "0.9", 1e-9, 1.0, "X",
         "SGD momentum, Nesterov (default 0.9)", "training", DT_FLAG_SHARED | DT_FLAG_CKPT_WARN, 0,
         0},
        {"weight-decay", DT_FLAG_DOUBLE, &a->weight_decay, "5e-4", 0.0, 1.0, "X",
         "L2 weight decay on every parameter (default 5e-4)", "training",
         DT_FLAG_SHARED | DT_FLAG_CKPT_WARN, 0, 0},
        {"sync-bn", DT_FLAG_BOOL, &a->sync_bn, NULL, 0, 0, "",
         "SyncBatchNorm: batch statistics over all ranks' samples, so N ranks\n"
         "train as one (no effect with one rank)",
         "training", DT_FLAG_SHARED | DT_FLAG_CKPT_REFUSE, 0, 0},
        {"no-fuse", DT_FLAG_BOOL, &a->no_fuse, NULL, 0, 0, "",
         "run BatchNorm, Add and ReLU as separate nodes (default: fused, the\n"
         "same model with fewer passes over memory)",
         "training", 0, 0, 0},
        {"limit", DT_FLAG_LONG, &a->limit, NULL, 1, 1L << 32, "N",
         "train on the first N training images only (default all 60,000)", "training",
         DT_FLAG_SHARED, 0, 0},
        {"data-dir", DT_FLAG_STRING, &a->data_dir, NULL, 0, 0, "D",
         "folder of Fashion-MNIST IDX files, plain or .gz\n"
         "(default $DT_DATA_DIR, else " FMNIST_DIR ")",
         "training", 0, 0, 0},
        {"undistributed", DT_FLAG_BOOL, &a->undistributed, NULL, 0, 0, "",
         "one process, no group: the default without --num-processes or a\n"
         "launcher (accepted for the peer's command lines)",
         "launch", 0, 0, 0},
        {0}};
    dt_trainer_opts o        = dt_trainer_opts_default();
    o.program                = "dtrain-resnet";
    o.summary                = summary;
    o.epilogue               = epilogue;
    o.flags                  = flags;
    o.hide_accumulate        = true;
    o.loop_time              = true; // the peer's "Finished training" line
    o.broadcast_buffers      = true; // the peer's DDP default
    o.train_flops_per_sample = train_flops_per_sample();
    o.model_parallel         = true; // --dp and --zero; --pp and --tp refused, saying why
    o.no_model_split = "its BatchNorm layers need whole batches (a pipeline's micro-batches would "
                       "change their statistics) and its convolutions have no tensor-parallel "
                       "split";
    dt_trainer *t;
    dt_status   st = dt_trainer_new(&t, argc, argv, &o);
    if (st || !t)
        return st == DT_ERR_ARG ? 2 : st ? 1 : 0;
    const dt_train_args *ta    = dt_trainer_args(t);
    long                 world = ta->num_processes * (ta->num_machines ? ta->num_machines : 1);
    if (a->undistributed && ta->num_processes) {
        fprintf(stderr,
                "dtrain-resnet: --undistributed: expected no --num-processes, found "
                "--num-processes %ld\n",
                ta->num_processes);
        dt_trainer_exit(t, DT_OK);
        return 2;
    }
    if (world > 1 && a->batch_size % world) {
        fprintf(stderr,
                "dtrain-resnet: --batch-size %ld: expected a multiple of the %ld processes (it is "
                "the global batch, split evenly), found a remainder of %ld\n",
                a->batch_size, world, a->batch_size % world);
        dt_trainer_exit(t, DT_OK);
        return 2;
    }
    dt_dataset_opts dopts = fmnist_opts(), topts = fmnist_opts(); // the seed's normalisation
    dopts.limit     = (size_t)a->limit;
    const char *dir = fmnist_dir(a->data_dir);
    if ((st = dt_dataset_load_mnist(&j.train, dir, true, &dopts)) ||
        (!ta->no_test && (st = dt_dataset_load_mnist(&j.test, dir, false, &topts))) ||
        (st = dt_dataset_check_shape(&j.train, "training set", 1, 28, 28)) ||
        (!ta->no_test && (st = dt_dataset_check_shape(&j.test, "test set", 1, 28, 28))) ||
        (st = dt_trainer_add_setting(t, "the training set's size (--data-dir, --limit)",
                                     (int64_t)j.train.n)) ||
        (st = dt_trainer_add_content(t, "the training set's content (--data-dir, --limit)",
                                     j.train.content_hash)) ||
        (st =
             dt_trainer_add_content(t, "the test set's content (--data-dir)", j.test.content_hash)))
        ;                         // dt_trainer_exit prints it
    else if (dt_trainer_start(t)) // a worker: train (the parent of forked workers waits)
        st = train(t, &j);
    int rc = dt_trainer_exit(t, st);
    dt_dataset_free(&j.train);
    dt_dataset_free(&j.test);
    return rc;
}
