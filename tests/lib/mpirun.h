// mpirun.h: run a test's ranks under a real mpirun. The test binary re-executes itself
// as `mpirun --allow-run-as-root --oversubscribe -np N <itself> --mpirun-child <case>`;
// main() sees the case with mpirun_child_case(), runs it, and reports its CHECK counts
// with MPIRUN_CHILD_DONE(), which the parent adds to its own. Everything is bounded: at
// the deadline mpirun's process group gets SIGTERM, then SIGKILL, and the run fails
// with a message. Ranks die with mpirun (PR_SET_PDEATHSIG).
//
//     int main(int argc, char **argv) {
//         const char *c = mpirun_child_case(argc, argv);
//         if (c) { run_case(c); return MPIRUN_CHILD_DONE(); }
//         if (!mpirun_available()) { ...skip...; return check_summary(); }
//         mpirun_opts o = {.np = 3, .child = "suite"};
//         mpirun_result r;
//         MPIRUN(&o, &r);
//         mpirun_result_free(&r);
//         return check_summary();
//     }
//
// Under AddressSanitizer the ranks get LSAN_OPTIONS with a suppression file naming only
// Open MPI's own libraries (mpirun.c says why); dtrain's allocations are still checked.
#ifndef DTRAIN_TESTS_MPIRUN_H
#define DTRAIN_TESTS_MPIRUN_H

#include "../check.h"
#include "dtrain/comm.h"

typedef struct mpirun_opts {
    int                np;         // ranks; 0 = run the program once without mpirun
    int64_t            timeout_ms; // the whole run; 0 = 120000
    const char        *child;      // the case each rank runs (with argv NULL)
    const char *const *argv;       // or this program and its arguments (NULL-terminated)
    const char *const *env;        // "NAME=value" for every rank, NULL-terminated; may be NULL
    bool expect_failure; // the run is meant to fail (the caller checks exit code and output);
                         // otherwise a non-zero exit, a timeout or a rank that did not report
                         // is a failed check, with mpirun's output shown
} mpirun_opts;

typedef struct mpirun_result {
    int    exit_code; // mpirun's exit status, 128 + signal if killed, -1 if not started
    bool   timed_out;
    int    reported; // ranks that reported their counts
    double secs;     // wall time of the run
    char  *output;   // mpirun's stdout and stderr, NUL-terminated (owned)
} mpirun_result;

// True when mpirun is on PATH.
bool mpirun_available(void);
// The case this process runs as a rank ("--mpirun-child <case>"), or NULL in the parent.
const char *mpirun_child_case(int argc, char **argv);
// Runs and waits; adds every rank's counts to *passed / *failed. Use MPIRUN.
void mpirun_run_impl(const mpirun_opts *o, mpirun_result *res, int *passed, int *failed);
#define MPIRUN(o, res) mpirun_run_impl((o), (res), &check_passed, &check_failed)
void mpirun_result_free(mpirun_result *r);
// In a rank: records this rank's counts for the parent (may be called again later, the
// last call counts; call it before something meant to kill the process). Returns 0.
int mpirun_child_done_impl(int passed, int failed);
#define MPIRUN_CHILD_DONE() mpirun_child_done_impl(check_passed, check_failed)
// In a rank: this rank's number and the world size, from the launcher's variables.
int mpirun_child_rank(void);
int mpirun_child_world(void);
// The path of a program of this build (e.g. "dtrain-mnist"), or NULL if not built.
const char *mpirun_program(const char *name);

#endif // DTRAIN_TESTS_MPIRUN_H
