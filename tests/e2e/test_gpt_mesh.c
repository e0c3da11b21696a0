// test_gpt_mesh.c: dtrain-gpt on a device mesh (docs/parallel.md), launched by dtrun
// unchanged, on a tiny model (3 layers, C 32, 4 heads, T 16, global batch 8, 8 steps).
//
// - Every layout at world 2 (dp, pp, tp) and 4 (pp 4 under GPipe, tp 4, pp 2 x tp 2,
//   dp 2 x pp 2 under ZeRO-1, dp 2 x tp 2 under ZeRO-2) ends with the 1-process run's
//   validation loss to its printed 6 digits, and --save-model gathers the parts into
//   the 1-process model's file, equal to it to rounding (1e-5 after 8 AdamW steps of
//   lr 3e-3, seen: 7e-7; a part out of place, a tied copy counted twice or a wrong
//   slice moves it by ~1e-2).
// - The cuts: named by --cuts (one in the middle of a block, after its attention),
//   spread evenly, balanced by measured cost: the same model.
//   A whole model file (--load) is cut into a layout's parts: --eval-only there gives
//   the 1-process evaluation of it.
// - A pipeline stage killed (SIGKILL) mid-run under dtrun --max-restarts 1: dtrun names
//   it, stops the others and restarts the group, which resumes from the checkpoints of
//   each part and ends with the bytes of the model of the same run uninterrupted.
// - Resuming a checkpoint directory with another layout is refused, naming both: the
//   whole model's folder with --pp 2, a --pp 2 folder with --tp 2 or without a mesh;
//   so is a folder with one part's checkpoints missing; each leaves the folder as it
//   was. --fallback on a mesh loads the newest step that every part loads.
#include "test_dtrun_lib.h"

#include "dtrain/ckpt.h"

#include <ftw.h>
#include <math.h>

static char gpt_path[PATH_MAX + 64], corpus[PATH_MAX + 32];

#define NL 3
#define TINY                                                                                       \
    "--n-layer", "3", "--n-embd", "32", "--n-head", "4", "--block-size", "16", "--batch-size",     \
        "8", "--lr", "3e-3", "--eval-every", "0", "--threads", "1"

static void write_corpus(const char *dir) {
    static const char *w[] = {"the",   "quick", "brown", "fox",    "jumps", "over", "lazy",
                              "dog",   "and",   "cat",   "sleeps", "under", "warm", "sun",
                              "while", "birds", "sing",  "songs",  "of",    "old"};
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE    *f = fopen(corpus, "w");
    uint64_t x = 12345;
    for (long n = 0; f && n < 30000;) {
        x      = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int nw = 4 + (int)((x >> 33) % 6);
        for (int i = 0; i < nw; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            n += fprintf(f, "%s%s", i ? " " : "", w[(x >> 33) % 20]);
        }
        n += fprintf(f, ".\n");
    }
    if (f)
        fclose(f);
}

// argv: [dtrun --nproc-per-node n [extra dtrun flags]] dtrain-gpt TINY --data C flags...
static void build_argv(char **v, int nproc, const char *const *dtrun_flags,
                       const char *const *flags) {
    static char np[16];
    int         k = 0;
    if (nproc > 0) {
        snprintf(np, sizeof np, "%d", nproc);
        v[k++] = dtrun_path;
        v[k++] = "--nproc-per-node";
        v[k++] = np;
        for (int i = 0; dtrun_flags && dtrun_flags[i]; i++)
            v[k++] = (char *)(uintptr_t)dtrun_flags[i];
    }
    v[k++]                 = gpt_path;
    static const char *t[] = {TINY, NULL};
    for (int i = 0; t[i]; i++)
        v[k++] = (char *)(uintptr_t)t[i];
    v[k++] = "--data";
    v[k++] = corpus;
    for (int i = 0; flags && flags[i]; i++)
        v[k++] = (char *)(uintptr_t)flags[i];
    v[k] = NULL;
}

// Rank 0's validation loss from its STATS line (NAN when none).
static double val_loss(const char *out) {
    const char *p = strstr(out, "\"rank\": 0,");
    p             = p ? strstr(p, "\"val_loss\": ") : NULL;
    return p ? strtod(p + 12, NULL) : NAN;
}

// The tiny model's table, as dtrain-gpt (and any layout's --save-model) writes it.
static dt_params *table(void) {
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    struct {
        const char *n;
        int64_t     d0, d1;
    } blk[] = {
        {"ln_1.weight", 32, 0},      {"ln_1.bias", 32, 0},           {"attn.c_attn.weight", 96, 32},
        {"attn.c_attn.bias", 96, 0}, {"attn.c_proj.weight", 32, 32}, {"attn.c_proj.bias", 32, 0},
        {"ln_2.weight", 32, 0},      {"ln_2.bias", 32, 0},           {"mlp.c_fc.weight", 128, 32},
        {"mlp.c_fc.bias", 128, 0},   {"mlp.c_proj.weight", 32, 128}, {"mlp.c_proj.bias", 32, 0}};
    CHECK_OK(dt_params_add(p, "wte.weight", 2, (int64_t[]){256, 32}, 0));
    CHECK_OK(dt_params_add(p, "wpe.weight", 2, (int64_t[]){16, 32}, 0));
    for (int l = 0; l < NL; l++)
        for (size_t i = 0; i < sizeof blk / sizeof *blk; i++) {
            char n[64];
            snprintf(n, sizeof n, "h.%d.%s", l, blk[i].n);
            int64_t d[2] = {blk[i].d0, blk[i].d1};
            CHECK_OK(dt_params_add(p, n, blk[i].d1 ? 2 : 1, d, 0));
        }
    CHECK_OK(dt_params_add(p, "ln_f.weight", 1, (int64_t[]){32}, 0));
    CHECK_OK(dt_params_add(p, "ln_f.bias", 1, (int64_t[]){32}, 0));
    CHECK_OK(dt_params_alloc(p));
    return p;
}

// Largest |a - b| over two model files (INFINITY when one does not load), and the sum
// of |a| (the model moved from zero).
static double model_diff(const char *fa, const char *fb, double *mass) {
    dt_params *a = table(), *b = table();
    double     d = INFINITY;
    if (dt_ckpt_load_params(fa, a) == DT_OK && dt_ckpt_load_params(fb, b) == DT_OK) {
        d = 0, *mass = 0;
        for (size_t i = 0; i < dt_params_numel(a); i++) {
            d = fmax(d, fabs((double)dt_params_data(a)[i] - dt_params_data(b)[i]));
            *mass += fabs((double)dt_params_data(a)[i]);
        }
    } else {
        fprintf(stderr, "     %s\n", dt_last_error());
    }
    dt_params_free(a);
    dt_params_free(b);
    return d;
}

static char   dir[1024], ref_model[PATH_MAX + 16];
static double ref_val;

// Runs dtrain-gpt (under dtrun with nproc > 0) and waits; the run's output in *r.
static int run_gpt(run *r, const char *tag, int nproc, const char *const *dtrun_flags,
                   const char *const *flags, double timeout_s) {
    char *argv[64];
    build_argv(argv, nproc, dtrun_flags, flags);
    run_start(r, dir, tag, argv, NULL);
    return run_wait(r, timeout_s);
}

static void test_layouts(void) {
    snprintf(ref_model, sizeof ref_model, "%s/ref.bin", dir);
    run r;
    CHECK_EQ(run_gpt(&r, "one", 0, NULL,
                     (const char *[]){"--steps", "8", "--save-model", ref_model, NULL}, 60),
             0);
    ref_val = val_loss(r.out);
    CHECK(isfinite(ref_val));
    run_free(&r);
    struct {
        int         world;
        const char *flags[8];
        const char *mesh; // its "mesh:" line, NULL for data parallelism alone
    } lay[] = {
        {2, {NULL}, NULL},
        {2, {"--pp", "2", NULL}, "mesh: dp 1 x pp 2 x tp 1"},
        {2, {"--tp", "2", NULL}, "mesh: dp 1 x pp 1 x tp 2"},
        {4, {"--pp", "4", "--schedule", "gpipe", NULL}, "mesh: dp 1 x pp 4 x tp 1"},
        {4, {"--tp", "4", NULL}, "mesh: dp 1 x pp 1 x tp 4"},
        {4, {"--pp", "2", "--tp", "2", NULL}, "mesh: dp 1 x pp 2 x tp 2"},
        {4, {"--dp", "2", "--pp", "2", "--zero", "1", NULL}, "mesh: dp 2 x pp 2 x tp 1"},
        {4, {"--dp", "2", "--tp", "2", "--zero", "2", NULL}, "mesh: dp 2 x pp 1 x tp 2"},
        {3, {"--pp", "3", "--cuts", "h.0.res_1,h.1.res_2", NULL}, "cuts after h.0.res_1,h.1.res_2"},
        {2,
         {"--pp", "2", "--cuts", "uniform", "--micro-batches", "3", NULL},
         "cuts after h.1.res_1"},
    };
    for (size_t i = 0; i < sizeof lay / sizeof *lay; i++) {
        char        model[PATH_MAX + 32], tag[16];
        const char *f[16];
        int         k = 0;
        snprintf(tag, sizeof tag, "lay%zu", i);
        snprintf(model, sizeof model, "%s/%s.bin", dir, tag);
        f[k++] = "--steps", f[k++] = "8", f[k++] = "--save-model", f[k++] = model;
        for (int j = 0; lay[i].flags[j]; j++)
            f[k++] = lay[i].flags[j];
        f[k]      = NULL;
        int    rc = run_gpt(&r, tag, lay[i].world, NULL, f, 60);
        double v = val_loss(r.out), mass = 0, d = rc == 0 ? model_diff(ref_model, model, &mass) : 1;
        bool   ok = CHECK(rc == 0) && CHECK(fabs(v - ref_val) <= 2e-6) && CHECK(d < 1e-5) &&
                  CHECK(mass > 1) && CHECK(!lay[i].mesh || strstr(r.out, lay[i].mesh));
        fprintf(stderr, "     %s world %d", ok ? "ok  " : "FAIL", lay[i].world);
        for (int j = 0; lay[i].flags[j]; j++)
            fprintf(stderr, " %s", lay[i].flags[j]);
        fprintf(stderr, ": val loss %.6f (1 process %.6f), max |model - 1 process| %.2g\n", v,
                ref_val, d);
        if (!ok)
            run_dump(&r, tag);
        run_free(&r);
    }
    // A world the layout does not divide: refused before anything runs, naming the flags.
    int rc = run_gpt(&r, "bad", 3, NULL, (const char *[]){"--steps", "8", "--pp", "2", NULL}, 60);
    CHECK(rc != 0 && strstr(r.err, "--pp 2 with 3 rank(s)") != NULL);
    run_free(&r);
    // The whole 1-process model cut into a pp 2 x tp 2 layout: its evaluation there.
    CHECK_EQ(run_gpt(&r, "load", 4, NULL,
                     (const char *[]){"--steps", "8", "--load", ref_model, "--eval-only", "--pp",
                                      "2", "--tp", "2", NULL},
                     60),
             0);
    double v = val_loss(r.out);
    CHECK(fabs(v - ref_val) < 1e-5);
    fprintf(stderr, "     1-process model loaded into pp 2 x tp 2: val loss %.6f\n", v);
    run_free(&r);
}

static void test_kill_stage(void) {
    char full[PATH_MAX], killed[PATH_MAX], ck[PATH_MAX], ck2[PATH_MAX];
    snprintf(full, sizeof full, "%s/uninterrupted.bin", dir);
    snprintf(killed, sizeof killed, "%s/killed.bin", dir);
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(ck2, sizeof ck2, "%s/ckpt-full", dir);
    // pp 2 x tp 2: rank 2 is stage 1's first tensor-parallel rank. The cuts are fixed:
    // balanced ones follow each run's timings, and other cuts sum the gradient norm in
    // another order (a resumed run keeps its checkpoints' cuts, which the uninterrupted
    // reference may not have chosen).
    const char *common[] = {
        "--steps", "40",     "--pp",    "2", "--tp", "2", "--log-every", "1", "--checkpoint-every",
        "4",       "--cuts", "uniform", NULL};
    const char *f[24];
    int         k = 0;
    for (; common[k]; k++)
        f[k] = common[k];
    int n  = k;
    f[k++] = "--checkpoint-dir", f[k++] = ck2, f[k++] = "--save-model", f[k++] = full, f[k] = NULL;
    run r;
    CHECK_EQ(run_gpt(&r, "full", 4, NULL, f, 120), 0);
    run_free(&r);
    k      = n;
    f[k++] = "--checkpoint-dir", f[k++] = ck, f[k++] = "--resume", f[k++] = "--save-model";
    f[k++] = killed, f[k] = NULL;
    char *argv[64];
    build_argv(argv, 4, (const char *[]){"--max-restarts", "1", NULL}, f);
    run_start(&r, dir, "killed", argv, NULL);
    double deadline = dt_now() + 60;
    bool   reached  = false;
    while (!reached && dt_now() < deadline) { // past its second checkpoint
        char *o = read_file(r.out_path);
        reached = strstr(o, "step 10/40") != NULL;
        free(o);
        if (!reached)
            sleep_s(0.001);
    }
    int pid = worker_pid(r.pid, 2);
    CHECK(reached && pid > 0);
    double t0 = dt_now(), gone = -1;
    if (pid > 0)
        kill(pid, SIGKILL);
    // dtrun stops the three others and restarts the group: within the liveness bound
    // (DT_LIVENESS_MS, 5 s) plus slack for a loaded machine.
    while (gone < 0 && dt_now() < t0 + 30) {
        char *e = read_file(r.err_path);
        if (strstr(e, "restarting the group"))
            gone = dt_now() - t0;
        free(e);
        sleep_s(0.005);
    }
    CHECK(gone >= 0 && gone < 20);
    CHECK_EQ(run_wait(&r, 120), 0);
    CHECK(strstr(r.err, "root cause: rank 2 (local rank 2 on node 0") != NULL);
    CHECK(strstr(r.err, "was killed by signal 9 (SIGKILL)") != NULL);
    CHECK(strstr(r.out, "resumed from ") != NULL);
    // The three others stopped by themselves, each naming the dead process.
    char dead[48];
    snprintf(dead, sizeof dead, "(process %d ended", pid);
    int named = 0;
    for (int q = 0; q < 4; q++) {
        char who[64];
        snprintf(who, sizeof who, "[rank %d] dtrain-gpt: rank %d: ", q, q);
        const char *l = strstr(r.err, who), *e = l ? strchr(l, '\n') : NULL;
        named += l && e && memmem(l, (size_t)(e - l), dead, strlen(dead)) != NULL;
    }
    CHECK_EQ(named, 3); // (dtrun's SIGTERM only asks a training rank to stop at a step's end)
    bool same = same_file(full, killed);
    CHECK(same); // bitwise
    fprintf(stderr,
            "     stage 1 (rank 2) killed: %d of 3 others failed naming it, the group restarted "
            "after %.2f s; resumed run %s\n",
            named, gone, same ? "equals the uninterrupted one bitwise" : "DIFFERS");
    if (check_failed)
        run_dump(&r, "killed");
    run_free(&r);
    // The same directory resumed by another layout: refused, naming both.
    k      = 0;
    f[k++] = "--steps", f[k++] = "40", f[k++] = "--pp", f[k++] = "2", f[k++] = "--checkpoint-dir";
    f[k++] = ck, f[k++] = "--resume", f[k] = NULL;
    CHECK_EQ(run_gpt(&r, "other", 2, NULL, f, 60), 1);
    bool named_both = strstr(r.err, "--pp 2 --tp 2, expected --pp 2 --tp 1") != NULL;
    CHECK(named_both);
    if (!named_both)
        run_dump(&r, "other layout");
    run_free(&r);
}

// A fingerprint of a folder's files (names, sizes and bytes, in any order) and their count.
static uint32_t tree_crc;
static int      tree_files;

static int tree_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)f;
    if (flag != FTW_F)
        return 0;
    uint32_t      c = dt_crc32c((uint32_t)sb->st_size, p, strlen(p));
    unsigned char buf[4096];
    size_t        n;
    FILE         *fp = fopen(p, "rb");
    while (fp && (n = fread(buf, 1, sizeof buf, fp)) > 0)
        c = dt_crc32c(c, buf, n);
    if (fp)
        fclose(fp);
    tree_crc ^= c;
    tree_files++;
    return 0;
}

static uint64_t tree_sum(const char *d) {
    tree_crc = 0, tree_files = 0;
    nftw(d, tree_one, 16, FTW_PHYS);
    return (uint64_t)tree_files << 32 | tree_crc;
}

// A copy of the checkpoint folder `from` (a pristine one) as `to`, so that each case
// starts from the folder as its run left it, whatever an earlier case did to its copy.
static void copy_tree(const char *from, const char *to) {
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
    CHECK(system(cmd) == 0);
}

static char work[PATH_MAX + 16];

// Resumes (--resume) a copy of the folder ck with `flags` in `world` processes, after
// `edit` (NULL: none) changed the copy; refused (exit 1) with `want` in its messages,
// and the copy left as it was.
static void refused(const char *tag, int world, const char *ck, const char *const *flags,
                    void (*edit)(const char *), const char *want) {
    const char *f[24];
    int         k = 0;
    copy_tree(ck, work);
    if (edit)
        edit(work);
    f[k++] = "--steps", f[k++] = "4", f[k++] = "--checkpoint-every", f[k++] = "2";
    f[k++] = "--checkpoint-dir", f[k++] = work, f[k++] = "--resume";
    for (int i = 0; flags[i]; i++)
        f[k++] = flags[i];
    f[k]            = NULL;
    uint64_t before = tree_sum(work);
    run      r;
    int      rc = run_gpt(&r, tag, world, NULL, f, 60);
    bool     ok = rc == 1 && strstr(r.err, want) != NULL;
    CHECK_EQ(rc, 1);
    CHECK(strstr(r.err, want) != NULL);
    CHECK(tree_sum(work) == before);
    if (!ok)
        run_dump(&r, tag);
    run_free(&r);
}

// Part pp1-tp0 of a checkpoint folder gone, and step 4 of it corrupt.
static void drop_part(const char *ck) {
    char part[PATH_MAX + 16];
    snprintf(part, sizeof part, "%s/pp1-tp0", ck);
    remove_tree(part);
}

static void corrupt_part(const char *ck) {
    char state[PATH_MAX + 64];
    snprintf(state, sizeof state, "%s/pp1-tp0/step-000004/state.dtck", ck);
    FILE *fs = fopen(state, "r+b");
    CHECK(fs && fseek(fs, 2000, SEEK_SET) == 0 && fputc('x', fs) != EOF);
    if (fs)
        fclose(fs);
}

static void test_folder_layouts(void) {
    char whole[PATH_MAX], pp2[PATH_MAX];
    snprintf(whole, sizeof whole, "%s/ck-whole", dir);
    snprintf(pp2, sizeof pp2, "%s/ck-pp2", dir);
    snprintf(work, sizeof work, "%s/ck-work", dir);
    // Checkpoints of steps 2 and 4: the whole model's (1 process), and --pp 2's.
    run r;
    CHECK_EQ(run_gpt(&r, "whole", 0, NULL,
                     (const char *[]){"--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir",
                                      whole, NULL},
                     60),
             0);
    run_free(&r);
    const char *pp2_flags[] = {"--pp", "2", "--cuts", "uniform", NULL};
    CHECK_EQ(run_gpt(&r, "pp2", 2, NULL,
                     (const char *[]){"--steps", "4", "--checkpoint-every", "2", "--pp", "2",
                                      "--cuts", "uniform", "--checkpoint-dir", pp2, NULL},
                     60),
             0);
    run_free(&r);
    refused("whole-pp2", 2, whole, pp2_flags, NULL,
            "holds the checkpoints of the whole model (--pp 1 --tp 1), expected --pp 2 --tp 1 "
            "(this run's)");
    refused("pp2-tp2", 2, pp2, (const char *[]){"--tp", "2", NULL}, NULL,
            "holds the checkpoints of a model cut over --pp 2 --tp 1, expected --pp 1 --tp 2 "
            "(this run's)");
    refused("pp2-whole", 1, pp2, (const char *[]){NULL}, NULL,
            "holds the checkpoints of a model cut over --pp 2 --tp 1, expected --pp 1 --tp 1");
    // One part's folder gone: the other's steps 2 and 4 are no step of the whole model.
    refused("part-missing", 2, pp2, pp2_flags, drop_part,
            "ck-work/pp1-tp0 holds no checkpoint while");
    // Step 4 of one part corrupt: refused; with --fallback, step 2 of every part.
    refused("corrupt", 2, pp2, pp2_flags, corrupt_part,
            "pp1-tp0/step-000004/state.dtck: corrupt section");
    copy_tree(pp2, work);
    corrupt_part(work);
    CHECK_EQ(run_gpt(&r, "fallback", 2, NULL,
                     (const char *[]){"--steps", "4", "--checkpoint-every", "2", "--pp", "2",
                                      "--cuts", "uniform", "--checkpoint-dir", work, "--resume",
                                      "--fallback", NULL},
                     60),
             0);
    bool fell = strstr(r.out, "resumed from ") && strstr(r.out, "pp0-tp0/step-000002") &&
                strstr(r.out, "after refusing newer checkpoints");
    CHECK(fell);
    if (!fell)
        run_dump(&r, "fallback");
    run_free(&r);
}

int main(void) {
    if (!CHECK(find_bins() || test_program_path("dtrun", dtrun_path, sizeof dtrun_path)) ||
        !CHECK(test_program_path("dtrain-gpt", gpt_path, sizeof gpt_path))) {
        fprintf(stderr, "dtrun or dtrain-gpt not found next to the tests (make programs)\n");
        return check_summary();
    }
    make_tmp_root("gpt-mesh-test");
    snprintf(dir, sizeof dir, "%s", tmp_root);
    write_corpus(dir);
    RUN(test_layouts);
    RUN(test_kill_stage);
    RUN(test_folder_layouts);
    if (!check_failed)
        remove_tree(tmp_root);
    return check_summary();
}
