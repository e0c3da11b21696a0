// test_agree.c: what the ranks of one job must agree on before they train, as a user's
// own program on the trainer meets it (2 hand-launched ranks, each with its own command
// line and files):
//
// - data files of the same size and other bytes, loaded inside the training function:
//   dt_trainer_prepare* compares the training set's and the evaluation sets' content
//   hashes (taken by the readers as they read) and refuses on every rank, naming both;
//   the same files pass;
// - a string flag of the program's table marked DT_FLAG_SHARED is compared by its text
//   (it was compared by whether it was given), and one marked DT_FLAG_SHARED_GIVEN only
//   by whether it was given.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/train.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 24, F = 6 };

static char tmp[128];

typedef struct shared {
    int  rc[2];
    char msg[2][600];
} shared;

// A v1.0 .npy file (numpy's layout, written here independently of the reader).
static void write_npy(const char *path, const char *descr, int ndim, const size_t *shape,
                      const void *data, size_t nbytes) {
    char dict[256], sh[64] = "";
    int  k = 0;
    for (int i = 0; i < ndim; i++)
        k += snprintf(sh + k, sizeof sh - (size_t)k, "%zu,%s", shape[i], i + 1 < ndim ? " " : "");
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                      descr, sh);
    int hl = (int)((10 + dl + 1 + 63) / 64 * 64 - 10);
    FILE *f = fopen(path, "wb");
    if (!CHECK(f != NULL))
        return;
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hl, (uint8_t)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)dl, f);
    for (int i = dl; i < hl - 1; i++)
        fputc(' ', f);
    fputc('\n', f);
    CHECK_EQ(fwrite(data, 1, nbytes, f), nbytes);
    fclose(f);
}

// x.npy and y.npy, and x-other.npy: x with one float changed (the same size).
static void write_data(void) {
    float   x[N * F];
    int32_t y[N];
    for (int i = 0; i < N * F; i++)
        x[i] = (float)((i * 7) % 11) / 11.0f;
    for (int i = 0; i < N; i++)
        y[i] = i % 3;
    char p[256];
    snprintf(p, sizeof p, "%s/x.npy", tmp);
    write_npy(p, "<f4", 2, (size_t[]){N, F}, x, sizeof x);
    snprintf(p, sizeof p, "%s/y.npy", tmp);
    write_npy(p, "<i4", 1, (size_t[]){N}, y, sizeof y);
    x[17] += 1.0f;
    snprintf(p, sizeof p, "%s/x-other.npy", tmp);
    write_npy(p, "<f4", 2, (size_t[]){N, F}, x, sizeof x);
}

// The program's flags: --train X.npy --eval X.npy (the data), --mode a|b (shared, by its
// text), --note TEXT (shared, only whether given).
static const char *f_train, *f_eval, *f_mode, *f_note;

static dt_status train_fn(dt_trainer *t, void *user) {
    (void)user;
    char y[256];
    snprintf(y, sizeof y, "%s/y.npy", tmp);
    dt_dataset tr = {0}, ev = {0};
    dt_status  st = dt_dataset_load_npy(&tr, f_train, y, NULL);
    if (!st)
        st = dt_dataset_load_npy(&ev, f_eval, y, NULL);
    dt_loader *ld = NULL, *el = NULL;
    if (!st)
        st = dt_trainer_loader(t, &tr, 4, DT_SPLIT_TRAIN, &ld);
    if (!st)
        st = dt_trainer_loader(t, &ev, 4, DT_SPLIT_EVAL, &el);
    dt_params *p   = NULL;
    dt_optim  *opt = NULL;
    if (!st)
        st = dt_params_new(&p, NULL);
    if (!st)
        st = dt_params_add(p, "w", 1, (int64_t[]){F}, 0);
    if (!st)
        st = dt_params_alloc(p);
    dt_sgd_opts so = dt_sgd_opts_default();
    if (!st)
        st = dt_sgd_new(&opt, p, &so);
    if (!st)
        st = dt_trainer_prepare(t, p, opt, NULL); // owns p and opt from here, even failing
    else
        dt_optim_free(opt), dt_params_free(p);
    dt_dataset_free(&tr);
    dt_dataset_free(&ev);
    return st;
}

typedef struct run_args {
    const char *argv1[2][12]; // each rank's flags
} run_args;

static void ranks(int rank, int world, void *arg) {
    (void)world;
    const run_args *a       = arg;
    shared         *sh      = mp_shared();
    const dt_flag   flags[] = {
          {"train", DT_FLAG_STRING, &f_train, NULL, 0, 0, "X", "training samples", "d", 0, 0, 0},
          {"eval", DT_FLAG_STRING, &f_eval, NULL, 0, 0, "X", "evaluation samples", "d", 0, 0, 0},
          {"mode", DT_FLAG_STRING, &f_mode, "a", 0, 0, "M", "a mode", "d", DT_FLAG_SHARED, "a b",
           "a or b"},
          {"note", DT_FLAG_STRING, &f_note, NULL, 0, 0, "T", "a note", "d",
           DT_FLAG_SHARED | DT_FLAG_SHARED_GIVEN, 0, 0},
          {0}};
    char *argv[16] = {"test_agree", "--threads", "1",
                      "--no-test",  "--backend", (char *)(uintptr_t)mp_backend()};
    int   argc     = 6;
    for (int i = 0; a->argv1[rank][i]; i++)
        argv[argc++] = (char *)(uintptr_t)a->argv1[rank][i];
    argv[argc]        = NULL;
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "test_agree";
    o.flags           = flags;
    dt_trainer *t     = NULL;
    CHECK_OK(dt_trainer_new(&t, argc, argv, &o));
    if (!t)
        return;
    sh->rc[rank] = dt_trainer_exit(t, dt_trainer_start(t) ? train_fn(t, NULL) : DT_OK);
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", sh->rc[rank] ? dt_last_error() : "");
}

// Runs the two ranks; true when both exited with rc and, when want is set, both said it.
static bool run(const run_args *a, int rc, const char *want) {
    mp_opts o = {.world = 2, .timeout_ms = 60000};
    MP_RUN(&o, ranks, (void *)(uintptr_t)a);
    const shared *sh = mp_shared();
    bool          ok = true;
    for (int r = 0; r < 2; r++) {
        ok &= CHECK(sh->rc[r] == rc);
        if (want)
            ok &= CHECK(strstr(sh->msg[r], want) != NULL);
        if (!ok)
            fprintf(stderr, "     rank %d: exit %d: %s\n", r, sh->rc[r], sh->msg[r]);
    }
    return ok;
}

static void test_data(void) {
    char x[256], other[256];
    snprintf(x, sizeof x, "%s/x.npy", tmp);
    snprintf(other, sizeof other, "%s/x-other.npy", tmp);
    run_args same = {{{"--train", x, "--eval", x, NULL}, {"--train", x, "--eval", x, NULL}}};
    run(&same, 0, NULL);
    run_args train = {{{"--train", x, "--eval", x, NULL}, {"--train", other, "--eval", x, NULL}}};
    run(&train, 1,
        "the training set's content (a hash of the samples and labels read from its files) must "
        "be the same on every rank: rank 0 has 0x");
    run(&train, 1, "(the ranks read different data: give every rank the same files)");
    run_args eval = {{{"--train", x, "--eval", x, NULL}, {"--train", x, "--eval", other, NULL}}};
    run(&eval, 1,
        "evaluation set 1's content (a hash of the samples and labels read from its "
        "files) must be the same on every rank");
}

static void test_string_flags(void) {
    char x[256];
    snprintf(x, sizeof x, "%s/x.npy", tmp);
    run_args mode = {{{"--train", x, "--eval", x, "--mode", "a", NULL},
                      {"--train", x, "--eval", x, "--mode", "b", NULL}}};
    run(&mode, 1, "--mode must be the same on every rank: rank 0 has \"a\", rank 1 has \"b\"");
    run_args note = {{{"--train", x, "--eval", x, "--note", "here", NULL},
                      {"--train", x, "--eval", x, "--note", "there", NULL}}};
    run(&note, 0, NULL);
    run_args given = {
        {{"--train", x, "--eval", x, "--note", "here", NULL}, {"--train", x, "--eval", x, NULL}}};
    run(&given, 1, "--note must be the same on every rank: rank 0 has on, rank 1 has off");
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/dtrain-test-agree-XXXXXX");
    if (!CHECK(mkdtemp(tmp)))
        return check_summary();
    write_data();
    RUN(test_data);
    RUN(test_string_flags);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (check_failed == 0 && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp);
    return check_summary();
}
