// test_gpt_startup.c: what dtrain-gpt checks before it trains, in real processes.
//
// - A corpus too small for its splits is refused naming the file, its size and what
//   each split needs.
// - Hand-launched ranks given corpora of the same size and other bytes, or different
//   --cuts, stop at start-up naming what differs and both values, on every rank.
#include "../check.h"
#include "../lib/mp.h"
#include "../lib/prog.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char bin[PATH_MAX + 64], dir[64] = "/tmp/dtrain-gpt-startup-XXXXXX";

#define TINY "--n-layer 1 --n-embd 32 --n-head 2 --block-size 32 --batch-size 8 --steps 2 "

// n bytes of text at dir/name (a corpus); its path in out.
static void write_corpus(const char *name, size_t n, char flip, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", dir, name);
    FILE *f = fopen(out, "wb");
    if (!CHECK(f != NULL))
        return;
    for (size_t i = 0; i < n; i++)
        fputc(i == n / 2 && flip ? flip : "the quick brown fox.\n"[i % 21], f);
    fclose(f);
}

static void show_on_failure(int before, const char *out) {
    if (check_failed != before)
        fprintf(stderr, "---- output:\n%s\n----\n", out);
}

static void test_small_corpus(void) {
    char path[256], *out;
    int  f0 = check_failed;
    write_corpus("small.txt", 500, 0, path, sizeof path);
    CHECK_EQ(test_run(&out, "%s --data %s " TINY "2>&1", bin, path), 1);
    char want[400];
    snprintf(want, sizeof want, "dtrain-gpt: --data %s: 500 bytes, split 9:1; expected a", path);
    CHECK(strstr(out, want) != NULL);
    CHECK(strstr(out, "found 50 and 450 bytes") != NULL);
    show_on_failure(f0, out);
    free(out);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void test_mismatch(void) {
    char a[256], b[256], fa[300], fb[300], ca[400], cb[400];
    write_corpus("a.txt", 30000, 0, a, sizeof a);
    write_corpus("b.txt", 30000, '#', b, sizeof b); // one byte apart
    snprintf(fa, sizeof fa, "--data %s", a);
    snprintf(fb, sizeof fb, "--data %s", b);
    snprintf(ca, sizeof ca, "--data %s --pp 2 --cuts auto", a);
    snprintf(cb, sizeof cb, "--data %s --pp 2 --cuts uniform", a);
    struct {
        const char *flags0, *flags1, *want;
    } cases[] = {
        {fa, fb,
         "the corpus's content (--data, --limit) must be the same on every rank: rank 0 has "
         "0x"},
        {ca, cb,
         "--cuts must be the same on every rank: rank 0 has \"auto\", rank 1 has "
         "\"uniform\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int   f0 = check_failed, port = mp_free_port();
        int   rc = test_run(&out,
                            "export MASTER_ADDR=127.0.0.1 MASTER_PORT=%d WORLD_SIZE=2 "
                              "DT_JOB_TOKEN=gm DT_TIMEOUT_MS=60000; "
                              "RANK=1 LOCAL_RANK=1 %s " TINY "%s >%s/r1.log 2>&1 & "
                              "RANK=0 LOCAL_RANK=0 %s " TINY "%s 2>&1; "
                              "r=$?; wait $!; r1=$?; echo \"==== rank 1 exit $r1\"; "
                              "cat %s/r1.log; exit $r",
                            port, bin, cases[i].flags1, dir, bin, cases[i].flags0, dir);
        CHECK_EQ(rc, 1);
        CHECK_EQ(count(out, "==== rank 1 exit 1"), 1);
        CHECK_EQ(count(out, cases[i].want), 2); // rank 0 and rank 1 alike
        CHECK(strstr(out, "step 1") == NULL);
        show_on_failure(f0, out);
        free(out);
    }
}

int main(void) {
    if (!CHECK(test_program_path("dtrain-gpt", bin, sizeof bin)) || !CHECK(mkdtemp(dir)))
        return check_summary();
    RUN(test_small_corpus);
    RUN(test_mismatch);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (check_failed == 0 && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
