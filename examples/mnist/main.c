// dtrain-mnist: the seed chapter's ConvNet on (Fashion-)MNIST.
//
//   conv(1->16, 3x3) -> ReLU -> conv(16->32, 3x3) -> ReLU -> maxpool 2 -> Dropout2d(0.10)
//   -> flatten (4608) -> linear(64) -> ReLU -> dropout(0.25) -> linear(10) -> log_softmax
//
// NLL loss, Adadelta (lr 0.5), batch 128; the loss every 10 batches, the training
// time and the test accuracy, as the seed script prints them.
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct args {
    long        epochs, batch_size, limit, seed, threads, log_every;
    double      lr;
    const char *data_dir;
    bool        no_test, stats, profile;
} args;

static const char usage[] =
    "usage: dtrain-mnist [options]\n"
    "  --epochs N        passes over the training set (default 1)\n"
    "  --batch-size B    samples per step (default 128)\n"
    "  --lr X            Adadelta learning rate (default 0.5)\n"
    "  --seed S          seed of initialisation, shuffling and dropout (default 0)\n"
    "  --data-dir D      folder of MNIST-format files, plain or .gz\n"
    "                    (default $DT_DATA_DIR, else " DT_DATA_DIR_DEFAULT ")\n"
    "  --limit N         train on the first N samples only (default all)\n"
    "  --threads T       threads splitting each batch (default: the cores, " "%ld here)\n"
    "  --log-every K     print the loss every K batches (default 10)\n"
    "  --no-test         skip the test-set evaluation\n"
    "  --stats           print a STATS line (JSON: time, samples/s, GFLOP/s, peak RSS)\n"
    "  --profile         print forward and backward time per layer\n"
    "  --help            this text\n";

static int parse_args(int argc, char **argv, args *a) {
    *a = (args){.epochs = 1, .batch_size = 128, .lr = 0.5, .log_every = 10,
                .threads = sysconf(_SC_NPROCESSORS_ONLN)};
    if (a->threads < 1)
        a->threads = 1;
    enum { EPOCHS = 1000, BATCH, LR, SEED, DATA, LIMIT, THREADS, LOG_EVERY, NO_TEST, STATS,
           PROFILE, HELP };
    static const struct option opts[] = {
        {"epochs", required_argument, 0, EPOCHS},   {"batch-size", required_argument, 0, BATCH},
        {"lr", required_argument, 0, LR},           {"seed", required_argument, 0, SEED},
        {"data-dir", required_argument, 0, DATA},   {"limit", required_argument, 0, LIMIT},
        {"threads", required_argument, 0, THREADS}, {"log-every", required_argument, 0, LOG_EVERY},
        {"no-test", no_argument, 0, NO_TEST},       {"stats", no_argument, 0, STATS},
        {"profile", no_argument, 0, PROFILE},       {"help", no_argument, 0, HELP},
        {0, 0, 0, 0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        dt_status st = DT_OK;
        switch (c) {
        case EPOCHS: st = dt_parse_long(optarg, 1, 100000, "--epochs", &a->epochs); break;
        case BATCH: st = dt_parse_long(optarg, 1, 65536, "--batch-size", &a->batch_size); break;
        case LR: st = dt_parse_double(optarg, 0.0, 1e6, "--lr", &a->lr); break;
        case SEED: st = dt_parse_long(optarg, 0, 0x7fffffffffffffffL, "--seed", &a->seed); break;
        case DATA: a->data_dir = optarg; break;
        case LIMIT: st = dt_parse_long(optarg, 1, 1L << 32, "--limit", &a->limit); break;
        case THREADS: st = dt_parse_long(optarg, 1, 256, "--threads", &a->threads); break;
        case LOG_EVERY: st = dt_parse_long(optarg, 1, 1L << 30, "--log-every", &a->log_every); break;
        case NO_TEST: a->no_test = true; break;
        case STATS: a->stats = true; break;
        case PROFILE: a->profile = true; break;
        case HELP: printf(usage, a->threads); exit(0);
        default:
            fprintf(stderr, "dtrain-mnist: unknown option \"%s\"\n", argv[optind - 1]);
            fprintf(stderr, usage, a->threads);
            return 2;
        }
        if (st != DT_OK) {
            fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dtrain-mnist: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    return 0;
}

// Test-set accuracy and mean loss, in evaluation mode, in batches of `batch`.
static dt_status evaluate(dt_model *m, const dt_dataset *test, size_t batch, int *correct,
                          double *mean_loss) {
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = batch;
    dt_loader *l      = dt_loader_init(test, NULL, &lo);
    if (!l)
        return dt_last_status();
    dt_model_train(m, false);
    dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
    dt_batch  b;
    double    total = 0;
    dt_status st    = DT_OK;
    *correct        = 0;
    while (st == DT_OK && dt_loader_next(l, &b)) {
        float loss;
        if ((st = dt_model_forward(m, b.x, (int)b.size)) ||
            (st = dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, NULL)))
            break;
        total += (double)loss * (double)b.size;
        *correct += dt_count_correct(dt_model_output(m), b.y, (int)b.size, 10);
    }
    if (st == DT_OK)
        st = dt_loader_status(l);
    dt_model_train(m, true);
    dt_loader_free(l);
    *mean_loss = total / (double)test->n;
    return st;
}

static void print_profile(const dt_model *m, double train_secs) {
    double total = 0;
    printf("%-4s %-12s %10s %10s %7s\n", "layer", "kind", "forward_s", "backward_s", "share");
    for (int i = 0; i < dt_model_num_layers(m); i++) {
        double f, b;
        dt_model_profile(m, i, &f, &b);
        total += f + b;
    }
    for (int i = 0; i < dt_model_num_layers(m); i++) {
        double f, b;
        dt_model_profile(m, i, &f, &b);
        printf("%-4d %-12s %10.3f %10.3f %6.1f%%\n", i, dt_model_layer_kind(m, i), f, b,
               100.0 * (f + b) / train_secs);
    }
    printf("%-17s %21.3f %6.1f%%  (the rest: data, loss, optimizer, waits)\n", "all layers", total,
           100.0 * total / train_secs);
}

static int run(const args *a) {
    double     start = dt_now();
    dt_dataset train = {0}, test = {0};
    dt_model  *m     = NULL;
    dt_optim  *opt   = NULL;
    dt_sampler *smp  = NULL;
    dt_loader *ld    = NULL;
    float     *dlogp = NULL;
    int        rc    = 1;
    double     accuracy = -1;

    dt_dataset_opts dopts = dt_dataset_opts_default();
    dopts.limit           = (size_t)a->limit;
    if (dt_dataset_load_mnist(&train, a->data_dir, true, &dopts) ||
        (!a->no_test && dt_dataset_load_mnist(&test, a->data_dir, false, NULL)) ||
        dt_model_init_mnist_convnet(&m, (uint64_t)a->seed, 0.10f, 0.25f) ||
        dt_model_set_threads(m, (int)a->threads))
        goto done;
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = (float)a->lr;
    if (!(opt = dt_optim_init_adadelta(dt_model_params(m), dt_model_grads(m),
                                       dt_model_num_params(m), &ao)))
        goto done;
    dt_sampler_opts so = dt_sampler_opts_default();
    so.seed            = (uint64_t)a->seed;
    dt_loader_opts lo  = dt_loader_opts_default();
    lo.batch_size      = (size_t)a->batch_size;
    if (!(smp = dt_sampler_init(train.n, &so)) || !(ld = dt_loader_init(&train, smp, &lo)) ||
        !(dlogp = dt_alloc(sizeof(float) * 10 * (size_t)a->batch_size)) ||
        dt_model_reserve(m, (int)a->batch_size))
        goto done;

    dt_model_set_profile(m, a->profile);
    double train_start = dt_now();
    size_t nbatches = (dt_sampler_num_samples(smp) + (size_t)a->batch_size - 1) / (size_t)a->batch_size;
    // Dropout masks: a stream of their own under the seed, split by epoch and step.
    dt_rng base = dt_rng_init((uint64_t)a->seed);
    dt_rng root = dt_rng_split(&base, 0x64726f70 /* "drop" */);
    for (long epoch = 0; epoch < a->epochs; epoch++) {
        dt_loader_begin_epoch(ld, epoch);
        dt_rng   er = dt_rng_split(&root, (uint64_t)epoch);
        dt_batch b;
        while (dt_loader_next(ld, &b)) {
            dt_rng sr = dt_rng_split(&er, b.index);
            float  loss;
            dt_model_set_rng(m, &sr);
            if (dt_model_forward(m, b.x, (int)b.size) ||
                dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp))
                goto done;
            dt_model_zero_grad(m);
            if (dt_model_backward(m, dlogp))
                goto done;
            dt_optim_step(opt);
            if (b.index % (size_t)a->log_every == 0)
                printf("epoch: %ld [%zu/%zu (%.0f%%)]\t training loss: %.6f\n", epoch, b.index,
                       nbatches, 100.0 * (double)b.index / (double)nbatches, (double)loss);
        }
        if (dt_loader_status(ld))
            goto done;
    }
    double finished = dt_now();
    printf("Finished training in %.2f secs\n", finished - start);
    fflush(stdout);
    if (a->profile)
        print_profile(m, finished - train_start);
    if (!a->no_test) {
        int    correct   = 0;
        double mean_loss = 0;
        if (evaluate(m, &test, (size_t)a->batch_size, &correct, &mean_loss))
            goto done;
        printf("Test accuracy: %.2f%% (%d/%zu), average loss %.4f\n",
               100.0 * correct / (double)test.n, correct, test.n, mean_loss);
        accuracy = 100.0 * correct / (double)test.n;
    }
    if (a->stats) {
        double samples = (double)train.n * (double)a->epochs;
        double flops   = samples * dt_model_train_flops_per_sample(m);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf("STATS {\"secs\": %.3f, \"train_loop_secs\": %.3f, \"samples_per_sec\": %.1f, "
               "\"gflops\": %.1f, \"peak_rss_mib\": %.1f, \"threads\": %ld, "
               "\"accuracy\": %.2f, \"blas\": \"%s\"}\n",
               finished - start, finished - train_start, samples / (finished - train_start),
               flops / (finished - train_start) * 1e-9, (double)ru.ru_maxrss / 1024.0, a->threads,
               accuracy, dt_blas_info());
    }
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
    dt_free(dlogp);
    dt_loader_free(ld);
    dt_sampler_free(smp);
    dt_optim_free(opt);
    dt_model_free(m);
    dt_dataset_free(&train);
    dt_dataset_free(&test);
    return rc;
}

int main(int argc, char **argv) {
    args a;
    int  rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    return run(&a);
}
