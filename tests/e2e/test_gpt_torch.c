// test_gpt_torch.c: tools/dt_torch.py, dtrain's model files <-> PyTorch state_dicts,
// on dtrain-gpt's tiny model (1 layer, C 32, 2 heads, T 32). Skipped, saying so, when
// /usr/bin/python3 has no torch.
//
// - Round trip: a model dtrain-gpt saved, converted to a state_dict and back (--like
//   the original), is the same file byte for byte; the state_dict's keys and shapes are
//   those of the PyTorch peer's GPT (gpt_bytes.py), which load_state_dict(strict)
//   accepts.
// - The peer's initial weights (its init under torch.manual_seed), exported and given to
//   dtrain-gpt with --load, give the peer's own first two training losses on the same
//   batches, to the printed 6 digits within 2e-5 (fp32 rounding in another order).
#include "../check.h"
#include "../lib/prog.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[PATH_MAX + 64], tool[PATH_MAX + 64], peer[PATH_MAX + 64],
    dir[64] = "/tmp/dt-torch-XXXXXX";

#define TINY "--n-layer 1 --n-embd 32 --n-head 2 --block-size 32 --batch-size 8 --lr 3e-3 "

static int run(const char *cmd, char **out) {
    return test_run(out, "%s", cmd);
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool  same = fa && fb;
    for (int ca = 0, cb = 0; same && (ca != EOF || cb != EOF);) {
        ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

// A corpus of 40,000 bytes: lines of words, as test_gpt writes.
static void write_corpus(const char *path) {
    static const char *w[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"};
    FILE              *f   = fopen(path, "wb");
    uint64_t           x   = 99;
    CHECK(f != NULL);
    for (int n = 0; f && n < 40000;) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        n += fprintf(f, "%s%s", w[(x >> 33) % 8], (x >> 40) % 5 ? " " : ".\n");
    }
    if (f)
        fclose(f);
}

static float grab(const char *out, const char *key) {
    const char *p = strstr(out, key);
    float       v = NAN;
    if (p)
        sscanf(p + strlen(key), "%f", &v);
    return v;
}

static char corpus[128];

static void test_round_trip(void) {
    char cmd[4 * PATH_MAX], *out, m[256], pt[256], back[256];
    snprintf(m, sizeof m, "%s/m.bin", dir);
    snprintf(pt, sizeof pt, "%s/m.pt", dir);
    snprintf(back, sizeof back, "%s/back.bin", dir);
    snprintf(cmd, sizeof cmd,
             "%s --data %s " TINY "--steps 3 --eval-every 0 --threads 1 --save-model %s 2>&1", bin,
             corpus, m);
    CHECK_EQ(run(cmd, &out), 0);
    free(out);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s to-torch %s %s 2>&1", tool, m, pt);
    CHECK_EQ(run(cmd, &out), 0);
    CHECK(strstr(out, "wrote 16 tensors") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s from-torch %s %s --like %s 2>&1", tool, pt, back,
             m);
    CHECK_EQ(run(cmd, &out), 0);
    free(out);
    CHECK(same_file(m, back)); // byte for byte: tables, floats and every CRC
    if (!exists(peer))
        return;
    // The peer's module takes the state_dict as it is (strict: the same keys and shapes).
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import sys, torch; sys.path.insert(0, '%s'); import gpt_bytes; "
             "g = gpt_bytes.GPT(1, 2, 32, 32); g.load_state_dict(torch.load('%s')); "
             "print('loaded', sum(p.numel() for p in g.parameters()))\" 2>&1",
             peer, pt);
    CHECK_EQ(run(cmd, &out), 0);
    CHECK(strstr(out, "loaded 21984") != NULL);
    free(out);
    // A wrong shape is refused, naming the tensor.
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import torch; sd = torch.load('%s'); "
             "sd['wpe.weight'] = torch.zeros(16, 32); torch.save(sd, '%s.bad')\" && "
             "/usr/bin/python3 %s from-torch %s.bad %s/bad.bin --like %s 2>&1",
             pt, pt, tool, pt, dir, m);
    CHECK_EQ(run(cmd, &out), 1);
    CHECK(strstr(out, "wpe.weight") != NULL);
    free(out);
}

static void test_peer_init(void) {
    if (!exists(peer)) {
        printf("     skipped: the peer's gpt_bytes.py is not at %s\n", peer);
        return;
    }
    char cmd[4 * PATH_MAX], *out, pt[256], m[256], like[256];
    snprintf(pt, sizeof pt, "%s/peer.pt", dir);
    snprintf(m, sizeof m, "%s/peer.bin", dir);
    snprintf(like, sizeof like, "%s/m.bin", dir);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import sys, torch; sys.path.insert(0, '%s'); import gpt_bytes; "
             "g = gpt_bytes.GPT(1, 2, 32, 32); torch.manual_seed(5); g.init_weights(); "
             "torch.save(g.state_dict(), '%s')\" && /usr/bin/python3 %s from-torch %s %s --like %s "
             "2>&1",
             peer, pt, tool, pt, m, like);
    CHECK_EQ(run(cmd, &out), 0);
    free(out);
    const char *common = TINY "--steps 2 --seed 5 --eval-every 0 --threads 1 --log-every 1";
    snprintf(cmd, sizeof cmd, "%s --data %s %s --load %s 2>&1", bin, corpus, common, m);
    char *mine;
    CHECK_EQ(run(cmd, &mine), 0);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/gpt_bytes.py --undistributed --data %s %s 2>&1",
             peer, corpus, common);
    CHECK_EQ(run(cmd, &out), 0);
    for (int s = 1; s <= 2; s++) {
        char key[64];
        snprintf(key, sizeof key, "step %d/2 | loss ", s);
        float a = grab(mine, key), b = grab(out, key);
        CHECK(fabsf(a - b) < 2e-5f);
        if (!(fabsf(a - b) < 2e-5f))
            fprintf(stderr, "     step %d: dtrain-gpt %.6f, peer %.6f\n", s, a, b);
    }
    free(mine);
    free(out);
}

int main(void) {
    if (!test_program_path("dtrain-gpt", bin, sizeof bin)) {
        CHECK(!"dtrain-gpt is not built");
        return check_summary();
    }
    char *out;
    int   rc = run("/usr/bin/python3 -c 'import torch' 2>&1", &out);
    free(out);
    if (rc != 0) {
        printf("skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)\n");
        return check_summary();
    }
    // The tool and the peer, from the repository root (the tests' working directory).
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    snprintf(tool, sizeof tool, "%s/tools/dt_torch.py", cwd);
    snprintf(peer, sizeof peer, "%s/../shared/bench/peer/gpt_bytes.py", cwd);
    *strrchr(peer, '/') = '\0'; // its folder
    if (!exists(tool)) {
        CHECK(!"tools/dt_torch.py not found: run the test from the repository root");
        return check_summary();
    }
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return check_summary();
    }
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    write_corpus(corpus);
    RUN(test_round_trip);
    RUN(test_peer_init);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
