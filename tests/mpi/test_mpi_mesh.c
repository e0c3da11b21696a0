// test_mpi_mesh.c: dtrain-gpt on a device mesh started by mpirun, unchanged (no dtrain
// launcher): 4 ranks as pp 2 x tp 2 (backend auto: shm on this host) and as dp 2 x pp 2
// under ZeRO-1 on the mpi backend (its sub-groups' sends and receives), on the tiny
// model of test_gpt_mesh. Each ends with the validation loss of the same model trained
// in one process, to its printed 6 digits.
#include "../lib/mpirun.h"
#include "../lib/prog.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char corpus[256];

static void write_corpus(void) {
    static const char *w[] = {"the", "quick", "brown", "fox",    "jumps", "over", "lazy",
                              "dog", "and",   "cat",   "sleeps", "under", "warm", "sun"};
    snprintf(corpus, sizeof corpus, "/tmp/dt-mpi-mesh-%d.txt", (int)getpid());
    FILE    *f = fopen(corpus, "w");
    uint64_t x = 777;
    for (long n = 0; f && n < 30000;) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        n += fprintf(f, "%s%s", w[(x >> 33) % 14], (x >> 20) % 7 ? " " : ".\n");
    }
    if (f)
        fclose(f);
}

static double val_loss(const char *out) {
    const char *p = strstr(out, "\"rank\": 0,");
    p             = p ? strstr(p, "\"val_loss\": ") : NULL;
    return p ? strtod(p + 12, NULL) : NAN;
}

// dtrain-gpt with the tiny model and `extra` (NULL-terminated), under mpirun -np np (0:
// once, in one process); rank 0's validation loss. The ranks are the program's, which
// report no check counts: its exit code and output are checked here (expect_failure).
static double run(const char *bin, int np, const char *const *extra, const char *mesh) {
    const char *argv[40] = {bin,    "--n-layer",    "3",   "--n-embd",     "32", "--n-head",
                            "4",    "--block-size", "16",  "--batch-size", "8",  "--lr",
                            "3e-3", "--steps",      "8",   "--eval-every", "0",  "--threads",
                            "1",    "--data",       corpus};
    int         n        = 21;
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n]         = NULL;
    mpirun_opts   o = {.np = np, .argv = argv, .timeout_ms = 120000, .expect_failure = true};
    mpirun_result r;
    MPIRUN(&o, &r);
    CHECK_EQ(r.exit_code, 0);
    double v = val_loss(r.output);
    if (mesh)
        CHECK(strstr(r.output, mesh) != NULL);
    if (r.exit_code != 0 || !isfinite(v) || (mesh && !strstr(r.output, mesh)))
        fprintf(stderr, "%s\n", r.output);
    mpirun_result_free(&r);
    return v;
}

static void test_layouts(void) {
    const char *bin = mpirun_program("dtrain-gpt");
    if (!CHECK(bin != NULL)) {
        fprintf(stderr, "     dtrain-gpt is not built (make programs)\n");
        return;
    }
    write_corpus();
    double ref = run(bin, 0, NULL, NULL);
    CHECK(isfinite(ref));
    double a =
        run(bin, 4, (const char *[]){"--pp", "2", "--tp", "2", NULL}, "mesh: dp 1 x pp 2 x tp 2");
    double b = run(
        bin, 4, (const char *[]){"--dp", "2", "--pp", "2", "--zero", "1", "--backend", "mpi", NULL},
        "mesh: dp 2 x pp 2 x tp 1");
    CHECK(fabs(a - ref) <= 2e-6);
    CHECK(fabs(b - ref) <= 2e-6);
    fprintf(stderr,
            "     val loss: 1 process %.6f, mpirun pp 2 x tp 2 %.6f, dp 2 x pp 2 (mpi) %.6f\n", ref,
            a, b);
    unlink(corpus);
}

int main(int argc, char **argv) {
    if (mpirun_child_case(argc, argv))
        return MPIRUN_CHILD_DONE();
    if (!mpirun_available()) {
        printf("SKIP test_mpi_mesh: mpirun not found (apt-get install openmpi-bin)\n");
        return check_summary();
    }
    RUN(test_layouts);
    return check_summary();
}
