// check.h: the test harness. Each test binary is one translation unit that includes
// this header, runs its checks and ends with `return check_summary();`, which prints
// "N passed, N failed" and returns non-zero when anything failed.
#ifndef DTRAIN_TESTS_CHECK_H
#define DTRAIN_TESTS_CHECK_H

#include "dtrain/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int         check_passed;
static int         check_failed;
static const char *check_current = "";

static inline int check_report(int ok, const char *what, const char *file, int line) {
    if (ok) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "FAIL %s:%d [%s] %s\n", file, line, check_current, what);
    }
    return ok;
}

#define CHECK(cond) check_report(!!(cond), #cond, __FILE__, __LINE__)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                            \
        if (!check_report(check_a_ == check_b_, #a " == " #b, __FILE__, __LINE__))                 \
            fprintf(stderr, "     found %lld, expected %lld\n", check_a_, check_b_);               \
    } while (0)

// |a - b| <= tol
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double check_a_ = (double)(a), check_b_ = (double)(b), check_t_ = (double)(tol);           \
        if (!check_report(fabs(check_a_ - check_b_) <= check_t_ && !isnan(check_a_) &&             \
                              !isnan(check_b_),                                                    \
                          #a " ~= " #b, __FILE__, __LINE__))                                       \
            fprintf(stderr, "     found %.9g, expected %.9g (tolerance %.3g)\n", check_a_,         \
                    check_b_, check_t_);                                                           \
    } while (0)

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        dt_status check_s_ = (expr);                                                               \
        if (!check_report(check_s_ == DT_OK, #expr, __FILE__, __LINE__))                           \
            fprintf(stderr, "     returned %s: %s\n", dt_status_str(check_s_), dt_last_error());   \
    } while (0)

// expr must fail with `status` and a message containing `needle`.
#define CHECK_ERR(expr, status, needle)                                                            \
    do {                                                                                           \
        dt_status   check_s_  = (expr);                                                            \
        const char *check_m_  = dt_last_error();                                                   \
        int         check_ok_ = check_s_ == (status) && strstr(check_m_, (needle)) != NULL;        \
        if (!check_report(check_ok_, #expr " fails with " #status, __FILE__, __LINE__))            \
            fprintf(stderr, "     returned %s: \"%s\"; expected %s containing \"%s\"\n",           \
                    dt_status_str(check_s_), check_m_, dt_status_str(status), (needle));           \
    } while (0)

// Runs one test function under a name shown in failure lines. CHECK_ONLY=name in the
// environment runs only the test functions whose names contain it (to rerun one by hand).
#define RUN(fn)                                                                                    \
    do {                                                                                           \
        const char *check_only_ = getenv("CHECK_ONLY");                                            \
        if (check_only_ && !strstr(#fn, check_only_))                                              \
            break;                                                                                 \
        check_current             = #fn;                                                           \
        int             check_f0_ = check_failed;                                                  \
        struct timespec check_t0_, check_t1_;                                                      \
        clock_gettime(CLOCK_MONOTONIC, &check_t0_);                                                \
        fn();                                                                                      \
        clock_gettime(CLOCK_MONOTONIC, &check_t1_);                                                \
        fprintf(stderr, "%s %s (%.1f s)\n", check_failed == check_f0_ ? "ok  " : "FAIL", #fn,      \
                (double)(check_t1_.tv_sec - check_t0_.tv_sec) +                                    \
                    1e-9 * (double)(check_t1_.tv_nsec - check_t0_.tv_nsec));                       \
    } while (0)

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    fflush(stdout);
    return check_failed ? 1 : 0;
}

#endif // DTRAIN_TESTS_CHECK_H
