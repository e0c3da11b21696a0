// test_gpt_startup.c: what dtrain-gpt checks before it trains, in real processes.
//
// - A corpus too small for its splits is refused naming the file, its size and what
//   each split needs.
#include "../check.h"
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

int main(void) {
    if (!CHECK(test_program_path("dtrain-gpt", bin, sizeof bin)) || !CHECK(mkdtemp(dir)))
        return check_summary();
    RUN(test_small_corpus);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (check_failed == 0 && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
