// test_ckpt.c: checkpoints in one process, on real files.
//
// - Round trip of every section: parameters, optimizer state and step count, sampler
//   epoch and position, RNG states, user key/values, compared with the saved objects.
// - Directories: the newest complete checkpoint is found among several; keep-last-K
//   deletes only older complete ones (and leftovers of interrupted saves); a directory
//   without its marker is ignored; no checkpoint at all is "not found", not an error.
// - Refusals, each with its own message naming the file: a flipped byte in the header
//   and in every section of every file, truncations, a byte appended, another version,
//   another magic, a file of another save, another model, another optimizer, another
//   sampler, a missing RNG state; the objects are untouched after a refusal; fallback to
//   the previous complete checkpoint when asked.
// - Model files (--save-model) and the argument checks.
// - Prints (does not assert) the save and load time of the seed's ConvNet.
#include "../lib/mnist.h"
#include "ckpt_test.h"

#include <math.h>

typedef struct fixture {
    dt_model   *m;
    dt_optim   *o;
    dt_sampler *s;
    dt_rng      ra, rb;
    dt_ckpt_rng rngs[2];
} fixture;

// Everything seeded by `seed`, so two fixtures differ in every byte of state.
static void fx_init(fixture *f, uint64_t seed, int hidden) {
    f->m = ct_model(seed, hidden);
    ct_fill(dt_model_params(f->m), dt_model_num_params(f->m), seed * 3 + 1);
    dt_adam_new(&f->o, dt_model_as_params(f->m), NULL);
    size_t nf    = 0;
    float *state = dt_optim_state(f->o, &nf);
    ct_fill(state, nf, seed * 5 + 2);
    dt_optim_set_step_count(f->o, (int64_t)(seed % 97) + 1);
    dt_sampler_opts so = dt_sampler_opts_default();
    so.seed            = 1234; // configuration, not state: the same in every fixture
    dt_sampler_new(&f->s, 100, &so);
    dt_sampler_set_epoch(f->s, seed % 7);
    dt_sampler_begin(f->s);
    size_t idx;
    for (uint64_t i = 0; i < seed % 50; i++)
        dt_sampler_next(f->s, &idx);
    f->ra = dt_rng_init(seed * 11);
    f->rb = dt_rng_split(&f->ra, seed);
    for (uint64_t i = 0; i < seed % 5; i++)
        dt_rng_u32(&f->rb);
    f->rngs[0] = (dt_ckpt_rng){"dropout", &f->ra};
    f->rngs[1] = (dt_ckpt_rng){"augment", &f->rb};
}

static void fx_free(fixture *f) {
    dt_sampler_free(f->s);
    dt_optim_free(f->o);
    dt_model_free(f->m);
}

static dt_ckpt_state fx_state(fixture *f, int64_t step, const dt_ckpt_kv *kvs, int nkvs) {
    return (dt_ckpt_state){.model   = f->m,
                           .optim   = f->o,
                           .sampler = f->s,
                           .step    = step,
                           .rngs    = f->rngs,
                           .nrngs   = 2,
                           .kvs     = kvs,
                           .nkvs    = nkvs};
}

static bool same_params(dt_model *a, dt_model *b) {
    return dt_model_num_params(a) == dt_model_num_params(b) &&
           memcmp(dt_model_params(a), dt_model_params(b), dt_model_num_params(a) * 4) == 0;
}

static bool same_rng(dt_rng a, dt_rng b) {
    for (int i = 0; i < 9; i++)
        if (dt_rng_u32(&a) != dt_rng_u32(&b))
            return false;
    return true;
}

static void test_round_trip(void) {
    char dir[128], cdir[256];
    ct_tmpdir(dir, sizeof dir, "ckpt-rt");
    fixture a, b;
    fx_init(&a, 42, 8);
    fx_init(&b, 7, 8);
    dt_ckpt_kv    kvs[] = {{"seed", "42"}, {"note", "hello world"}, {"empty", ""}};
    dt_ckpt_state sa = fx_state(&a, 1234, kvs, 3), sb = fx_state(&b, 0, NULL, 0);
    CHECK_OK(dt_ckpt_save(dir, NULL, &sa, NULL));
    CHECK_OK(dt_ckpt_path(dir, 1234, cdir, sizeof cdir));
    CHECK_OK(dt_ckpt_verify(cdir));
    CHECK(!same_params(a.m, b.m));

    dt_ckpt_info info;
    CHECK_OK(dt_ckpt_load(dir, NULL, &sb, NULL, &info));
    CHECK(info.found);
    CHECK_EQ(info.step, 1234);
    CHECK_EQ(info.world, 1);
    CHECK_EQ(info.refused, 0);
    CHECK(strcmp(info.path, cdir) == 0);
    CHECK(strstr(cdir, "/step-001234") != NULL);
    CHECK(same_params(a.m, b.m));
    size_t na, nb;
    float *oa = dt_optim_state(a.o, &na), *ob = dt_optim_state(b.o, &nb);
    CHECK(na == nb && memcmp(oa, ob, na * 4) == 0);
    CHECK_EQ(dt_optim_step_count(b.o), dt_optim_step_count(a.o));
    CHECK(info.has_sampler);
    CHECK_EQ(info.epoch, dt_sampler_epoch(a.s));
    CHECK_EQ(info.position, dt_sampler_position(a.s));
    dt_sampler_begin(b.s); // the resumed pass: same epoch, same position, same order
    CHECK_EQ(dt_sampler_epoch(b.s), dt_sampler_epoch(a.s));
    CHECK_EQ(dt_sampler_position(b.s), dt_sampler_position(a.s));
    size_t ia, ib;
    bool   same_order = true;
    while (dt_sampler_next(a.s, &ia)) {
        same_order = same_order && dt_sampler_next(b.s, &ib) && ia == ib;
    }
    CHECK(same_order && !dt_sampler_next(b.s, &ib));
    CHECK(same_rng(a.ra, b.ra));
    CHECK(same_rng(a.rb, b.rb));
    CHECK_EQ(info.nkvs, 3);
    CHECK(dt_ckpt_info_get(&info, "seed") && !strcmp(dt_ckpt_info_get(&info, "seed"), "42"));
    CHECK(dt_ckpt_info_get(&info, "note") &&
          !strcmp(dt_ckpt_info_get(&info, "note"), "hello world"));
    CHECK(dt_ckpt_info_get(&info, "empty") && !strcmp(dt_ckpt_info_get(&info, "empty"), ""));
    CHECK(dt_ckpt_info_get(&info, "missing") == NULL);
    dt_ckpt_info_free(&info);
    CHECK_EQ(info.nkvs, 0);

    // Without optimizer, sampler and RNGs: still a checkpoint, and loading it into a
    // program that has them is a mismatch, loading into one without them works.
    char bdir[192];
    snprintf(bdir, sizeof bdir, "%s/bare", dir);
    dt_ckpt_state bare = {.model = a.m, .step = 5};
    CHECK_OK(dt_ckpt_save(bdir, NULL, &bare, NULL));
    CHECK_ERR(dt_ckpt_load(bdir, NULL, &sb, NULL, NULL), DT_ERR_MISMATCH,
              "expected adam state (the program's optimizer), found no optimizer state");
    dt_ckpt_state sb2 = sb;
    sb2.optim         = NULL;
    CHECK_ERR(dt_ckpt_load(bdir, NULL, &sb2, NULL, NULL), DT_ERR_MISMATCH,
              "expected sampler state (the program has a sampler), found none");
    dt_ckpt_state sb3 = {.model = b.m};
    ct_fill(dt_model_params(b.m), dt_model_num_params(b.m), 99);
    CHECK_OK(dt_ckpt_load(bdir, NULL, &sb3, NULL, &info));
    CHECK(info.found && info.step == 5 && !info.has_sampler && info.nkvs == 0);
    CHECK(same_params(a.m, b.m));
    dt_ckpt_info_free(&info);
    fx_free(&a);
    fx_free(&b);
    ct_rm_tree(dir);
}

static void test_nothing_to_load(void) {
    char dir[128], missing[192];
    ct_tmpdir(dir, sizeof dir, "ckpt-none");
    snprintf(missing, sizeof missing, "%s/not/there", dir);
    fixture a;
    fx_init(&a, 3, 8);
    dt_ckpt_state st = fx_state(&a, 0, NULL, 0);
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(missing, NULL, &st, NULL, &info));
    CHECK(!info.found);
    CHECK_EQ(info.step, -1);
    dt_ckpt_info_free(&info);
    CHECK_OK(dt_ckpt_load(dir, NULL, &st, NULL, &info));
    CHECK(!info.found);
    int64_t step = 0;
    CHECK_OK(dt_ckpt_latest(missing, &step));
    CHECK_EQ(step, -1);
    // A save creates the missing directories.
    st.step = 3;
    CHECK_OK(dt_ckpt_save(missing, NULL, &st, NULL));
    CHECK_OK(dt_ckpt_latest(missing, &step));
    CHECK_EQ(step, 3);
    fx_free(&a);
    ct_rm_tree(dir);
}

// Checkpoints whose parameters are seeded by their step, so a load says which it was.
static void save_step(const char *dir, fixture *f, int64_t step, int keep) {
    ct_fill(dt_model_params(f->m), dt_model_num_params(f->m), (uint64_t)step);
    dt_ckpt_state st = fx_state(f, step, NULL, 0);
    dt_ckpt_opts  o  = dt_ckpt_opts_default();
    o.keep           = keep;
    CHECK_OK(dt_ckpt_save(dir, NULL, &st, &o));
}

static bool params_of_step(dt_model *m, int64_t step) {
    size_t n = dt_model_num_params(m);
    float *x = malloc(n * 4);
    ct_fill(x, n, (uint64_t)step);
    bool ok = memcmp(x, dt_model_params(m), n * 4) == 0;
    free(x);
    return ok;
}

static void check_list(const char *dir, const int64_t *want, size_t nwant) {
    int64_t *steps;
    size_t   n;
    CHECK_OK(dt_ckpt_list(dir, &steps, &n));
    bool same = n == nwant;
    for (size_t i = 0; same && i < n; i++)
        same = steps[i] == want[i];
    if (!CHECK(same)) {
        fprintf(stderr, "     found steps:");
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %lld", (long long)steps[i]);
        fprintf(stderr, "\n");
    }
    dt_free(steps);
}

static void test_newest_and_keep(void) {
    char dir[128], path[512];
    ct_tmpdir(dir, sizeof dir, "ckpt-keep");
    fixture w, r;
    fx_init(&w, 1, 8);
    fx_init(&r, 2, 8);
    for (int64_t s = 5; s <= 30; s += 5)
        save_step(dir, &w, s, 3);
    check_list(dir, (int64_t[]){20, 25, 30}, 3);
    int64_t step;
    CHECK_OK(dt_ckpt_latest(dir, &step));
    CHECK_EQ(step, 30);
    dt_ckpt_state st = fx_state(&r, 0, NULL, 0);
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(dir, NULL, &st, NULL, &info));
    CHECK_EQ(info.step, 30);
    CHECK(params_of_step(r.m, 30));
    dt_ckpt_info_free(&info);

    // keep < 0 keeps everything.
    for (int64_t s = 31; s <= 35; s++)
        save_step(dir, &w, s, -1);
    check_list(dir, (int64_t[]){20, 25, 30, 31, 32, 33, 34, 35}, 8);

    // A newer complete checkpoint (a run rewound to an older one) is never deleted by
    // keep; older ones are.
    save_step(dir, &w, 100, -1);
    save_step(dir, &w, 40, 2);
    check_list(dir, (int64_t[]){35, 40, 100}, 3);

    // Saving a step again replaces it, contents and all, and leaves no staging
    // directory behind; one left by an interrupted replacement is deleted by the next
    // save.
    ct_fill(dt_model_params(w.m), dt_model_num_params(w.m), 4040);
    dt_ckpt_state again = fx_state(&w, 40, NULL, 0);
    dt_ckpt_opts  o2    = {.keep = 2};
    CHECK_OK(dt_ckpt_save(dir, NULL, &again, &o2));
    check_list(dir, (int64_t[]){35, 40, 100}, 3);
    CHECK_OK(dt_ckpt_path(dir, 40, path, sizeof path));
    CHECK_OK(dt_ckpt_verify(path));
    char next[600], c100[512];
    snprintf(next, sizeof next, "%s.next", path);
    CHECK(!ct_exists(next));
    // An interrupted replacement of step 40, played by the complete step 100.
    CHECK_OK(dt_ckpt_path(dir, 100, c100, sizeof c100));
    CHECK_EQ(rename(c100, next), 0);
    check_list(dir, (int64_t[]){35, 40}, 2);
    CHECK_OK(dt_ckpt_load(dir, NULL, &st, NULL, &info));
    CHECK_EQ(info.step, 40);
    CHECK(params_of_step(r.m, 4040));
    dt_ckpt_info_free(&info);
    save_step(dir, &w, 41, 2);
    CHECK(!ct_exists(next));
    check_list(dir, (int64_t[]){40, 41}, 2);
    fx_free(&w);
    fx_free(&r);
    ct_rm_tree(dir);
}

static void test_incomplete_ignored(void) {
    char dir[128], path[512], cdir[256];
    ct_tmpdir(dir, sizeof dir, "ckpt-marker");
    fixture w, r;
    fx_init(&w, 1, 8);
    fx_init(&r, 2, 8);
    save_step(dir, &w, 10, 3);
    save_step(dir, &w, 20, 3);
    save_step(dir, &w, 30, 3);
    // Step 30 loses its marker: an interrupted save.
    CHECK_OK(dt_ckpt_path(dir, 30, cdir, sizeof cdir));
    snprintf(path, sizeof path, "%s/complete.dtck", cdir);
    CHECK(unlink(path) == 0);
    // Things that are not checkpoints at all.
    snprintf(path, sizeof path, "%s/step-000050.tmp", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/step-000060", dir);
    ct_write(path, "x", 1);
    snprintf(path, sizeof path, "%s/notes", dir);
    mkdir(path, 0755);

    int64_t step;
    CHECK_OK(dt_ckpt_latest(dir, &step));
    CHECK_EQ(step, 20);
    check_list(dir, (int64_t[]){10, 20}, 2);
    dt_ckpt_state st = fx_state(&r, 0, NULL, 0);
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(dir, NULL, &st, NULL, &info));
    CHECK_EQ(info.step, 20);
    CHECK(params_of_step(r.m, 20));
    dt_ckpt_info_free(&info);
    CHECK_ERR(dt_ckpt_verify(cdir), DT_ERR_FORMAT, "found none (an interrupted save");
    CHECK_ERR(dt_ckpt_load_model(cdir, r.m), DT_ERR_FORMAT, "without any complete checkpoint");

    // The next save removes the leftover and keeps the foreign entries.
    save_step(dir, &w, 25, 3);
    CHECK(!ct_exists(cdir));
    CHECK(ct_exists(path));
    check_list(dir, (int64_t[]){10, 20, 25}, 3);
    fx_free(&w);
    fx_free(&r);
    ct_rm_tree(dir);
}

// ------------------------------------------------------------------ refusals

typedef struct target {
    const char    *dir;  // the checkpoint root
    const char    *file; // the file being damaged
    unsigned char *orig; // its bytes
    size_t         n;
    fixture       *f; // loads go into f
} target;

// Writes `bytes` over the file, expects a load to fail with status and `needle` (and the
// file's path in the message), restores the file and checks the objects are untouched.
static void expect_refused(target *t, const unsigned char *bytes, size_t n, dt_status status,
                           const char *needle, const char *what) {
    ct_write(t->file, bytes, n);
    size_t np     = dt_model_num_params(t->f->m);
    float *before = malloc(np * 4);
    memcpy(before, dt_model_params(t->f->m), np * 4);
    dt_ckpt_state st  = fx_state(t->f, 0, NULL, 0);
    const char   *was = check_current;
    check_current     = what;
    CHECK_ERR(dt_ckpt_load(t->dir, NULL, &st, NULL, NULL), status, needle);
    CHECK(strstr(dt_last_error(), t->file) != NULL);
    CHECK(memcmp(before, dt_model_params(t->f->m), np * 4) == 0);
    ct_write(t->file, t->orig, t->n);
    check_current = was;
    free(before);
}

static void damage_file(target *t) {
    char           what[512];
    unsigned char *b = malloc(t->n + 16);
    ct_section     secs[16];
    int            ns   = ct_sections(t->orig, t->n, secs, 16);
    const char    *file = strrchr(t->file, '/') + 1;

    // A byte in each section's payload, and in each section's tag.
    for (int i = 0; i < ns; i++) {
        char needle[128];
        snprintf(needle, sizeof needle, "corrupt section %d (%.4s)", i, secs[i].tag);
        memcpy(b, t->orig, t->n);
        b[secs[i].payload_at + secs[i].len / 2] ^= 0x10;
        snprintf(what, sizeof what, "%.100s: payload of %.4s", file, secs[i].tag);
        expect_refused(t, b, t->n, DT_ERR_FORMAT, needle, what);
        memcpy(b, t->orig, t->n);
        b[secs[i].header_at] ^= 0x01;
        snprintf(what, sizeof what, "%.100s: tag of %.4s", file, secs[i].tag);
        expect_refused(t, b, t->n, DT_ERR_FORMAT, "corrupt section", what);
    }
    // The header: the step field, the section count, the world size.
    size_t fields[] = {24, 20, 32, 40, 48};
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        memcpy(b, t->orig, t->n);
        b[fields[k]] ^= 0x04;
        snprintf(what, sizeof what, "%.100s: header byte %zu", file, fields[k]);
        expect_refused(t, b, t->n, DT_ERR_FORMAT, "corrupt header: expected CRC32C", what);
    }
    // Truncations and an extra byte.
    size_t cuts[] = {t->n - 1, t->n / 2, 64, 63, 5, 0};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        snprintf(what, sizeof what, "%.100s: truncated to %zu", file, cuts[k]);
        expect_refused(t, t->orig, cuts[k], DT_ERR_FORMAT, "truncated: expected", what);
    }
    memcpy(b, t->orig, t->n);
    b[t->n] = 0;
    snprintf(what, sizeof what, "%.100s: one byte appended", file);
    expect_refused(t, b, t->n + 1, DT_ERR_FORMAT, "bytes after the end: expected", what);
    // Another version, written as a later writer would (valid header checksum).
    memcpy(b, t->orig, t->n);
    ct_put32(b + 8, 3);
    ct_put32(b + 60, dt_crc32c(0, b, 60));
    snprintf(what, sizeof what, "%.100s: version 3", file);
    expect_refused(t, b, t->n, DT_ERR_FORMAT, "expected format version 1..2, found version 3",
                   what);
    // Another magic.
    memcpy(b, t->orig, t->n);
    memcpy(b, "PK\x03\x04", 4);
    snprintf(what, sizeof what, "%.100s: magic", file);
    expect_refused(t, b, t->n, DT_ERR_FORMAT,
                   "expected the magic of a dtrain checkpoint file (89 44 54 43 4b 50 54 0a), "
                   "found 50 4b 03 04",
                   what);
    free(b);
}

static void test_refusals(void) {
    char dir[128], cdir[256], path[640];
    ct_tmpdir(dir, sizeof dir, "ckpt-bad");
    fixture w, r;
    fx_init(&w, 1, 8);
    fx_init(&r, 2, 8);
    save_step(dir, &w, 7, 3);
    CHECK_OK(dt_ckpt_path(dir, 7, cdir, sizeof cdir));
    const char *files[] = {"state.dtck", "rank-00000.dtck", "complete.dtck"};
    int         nsec[]  = {6, 2, 1}; // PTAB PARM BTAB BUFS OPTM KVAL; SMPL RNGS; MANI
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", cdir, files[i]);
        target t = {.dir = dir, .file = path, .f = &r};
        t.orig   = ct_read(path, &t.n);
        ct_section secs[16];
        CHECK_EQ(ct_sections(t.orig, t.n, secs, 16), nsec[i]);
        damage_file(&t);
        // The whole checkpoint still verifies after every restore.
        CHECK_OK(dt_ckpt_verify(cdir));
        free(t.orig);
    }
    fx_free(&w);
    fx_free(&r);
    ct_rm_tree(dir);
}

// Two saves of the same step with different contents: a file moved from one to the
// other is refused by the marker's manifest.
static void test_file_of_another_save(void) {
    char d1[128], d2[128], c1[256], c2[256], p1[320], p2[320];
    ct_tmpdir(d1, sizeof d1, "ckpt-a");
    ct_tmpdir(d2, sizeof d2, "ckpt-b");
    fixture w, r;
    fx_init(&w, 1, 8);
    fx_init(&r, 2, 8);
    save_step(d1, &w, 9, 3);
    dt_rng_u32(&w.ra); // another RNG state: another rank file
    save_step(d2, &w, 9, 3);
    CHECK_OK(dt_ckpt_path(d1, 9, c1, sizeof c1));
    CHECK_OK(dt_ckpt_path(d2, 9, c2, sizeof c2));
    snprintf(p1, sizeof p1, "%s/rank-00000.dtck", c1);
    snprintf(p2, sizeof p2, "%s/rank-00000.dtck", c2);
    size_t         n;
    unsigned char *b = ct_read(p2, &n);
    ct_write(p1, b, n);
    free(b);
    dt_ckpt_state st = fx_state(&r, 0, NULL, 0);
    CHECK_ERR(dt_ckpt_load(d1, NULL, &st, NULL, NULL), DT_ERR_FORMAT, "(a file of another save)");
    CHECK_ERR(dt_ckpt_verify(c1), DT_ERR_FORMAT, "(a file of another save)");
    CHECK_OK(dt_ckpt_verify(c2));
    // A file moved to another step's directory.
    save_step(d1, &w, 10, 3);
    CHECK_OK(dt_ckpt_path(d1, 10, c1, sizeof c1));
    snprintf(p1, sizeof p1, "%s/rank-00000.dtck", c1);
    b = ct_read(p2, &n);
    ct_write(p1, b, n);
    free(b);
    CHECK_ERR(dt_ckpt_load(d1, NULL, &st, NULL, NULL), DT_ERR_FORMAT,
              "expected step 10 of world size 1 (its marker's), found step 9");
    fx_free(&w);
    fx_free(&r);
    ct_rm_tree(d1);
    ct_rm_tree(d2);
}

static void test_mismatch(void) {
    char dir[128];
    ct_tmpdir(dir, sizeof dir, "ckpt-mis");
    fixture w;
    fx_init(&w, 1, 8);
    save_step(dir, &w, 3, 3);

    // Another model: the hidden layer has 9 units instead of 8.
    fixture other;
    fx_init(&other, 2, 9);
    dt_ckpt_state st = fx_state(&other, 0, NULL, 0);
    CHECK_ERR(dt_ckpt_load(dir, NULL, &st, NULL, NULL), DT_ERR_MISMATCH,
              "model mismatch: parameter tensor 2: expected \"3.weight\" of shape (9, 48) (the "
              "model's), found \"3.weight\" of shape (8, 48)");
    CHECK_ERR(dt_ckpt_load_model(dir, other.m), DT_ERR_MISMATCH, "model mismatch");
    // Fewer tensors: a model without the last linear layer.
    dt_model *small = NULL;
    dt_model_new(&small, 1, 6, 6);
    dt_model_add_conv2d(small, 3, 3, 1, 0);
    dt_model_add_flatten(small);
    dt_model_add_linear(small, 8);
    CHECK_OK(dt_model_finalize(small, 1));
    CHECK_ERR(dt_ckpt_load_model(dir, small), DT_ERR_MISMATCH,
              "model mismatch: expected 4 parameter tensors (the model's), found 6");
    dt_model_free(small);
    fx_free(&other);

    // Another optimizer.
    fixture r;
    fx_init(&r, 2, 8);
    dt_sgd_opts so = dt_sgd_opts_default();
    so.momentum    = 0.9f;
    dt_optim *sgd  = NULL;
    CHECK_OK(dt_sgd_new(&sgd, dt_model_as_params(r.m), &so));
    st       = fx_state(&r, 0, NULL, 0);
    st.optim = sgd;
    CHECK_ERR(dt_ckpt_load(dir, NULL, &st, NULL, NULL), DT_ERR_MISMATCH,
              "optimizer mismatch: expected sgd state (the program's optimizer), found adam state");
    dt_optim_free(sgd);

    // Another dataset size for the sampler.
    dt_sampler *s90 = NULL;
    dt_sampler_new(&s90, 90, NULL);
    st         = fx_state(&r, 0, NULL, 0);
    st.sampler = s90;
    CHECK_ERR(dt_ckpt_load(dir, NULL, &st, NULL, NULL), DT_ERR_MISMATCH,
              "sampler mismatch: expected a dataset of 90 samples");
    dt_sampler_free(s90);

    // A generator the program expects but the checkpoint lacks.
    dt_rng      g      = dt_rng_init(5);
    dt_ckpt_rng more[] = {{"dropout", &r.ra}, {"noise", &g}};
    st                 = fx_state(&r, 0, NULL, 0);
    st.rngs            = more;
    CHECK_ERR(dt_ckpt_load(dir, NULL, &st, NULL, NULL), DT_ERR_MISMATCH,
              "expected an RNG state named \"noise\", found none");
    // The same objects load fine as they are.
    st = fx_state(&r, 0, NULL, 0);
    CHECK_OK(dt_ckpt_load(dir, NULL, &st, NULL, NULL));
    CHECK(params_of_step(r.m, 3));
    fx_free(&r);
    fx_free(&w);
    ct_rm_tree(dir);
}

static void corrupt_state(const char *dir, int64_t step) {
    char cdir[256], path[640];
    dt_ckpt_path(dir, step, cdir, sizeof cdir);
    snprintf(path, sizeof path, "%s/state.dtck", cdir);
    size_t         n;
    unsigned char *b = ct_read(path, &n);
    b[n - 3] ^= 0xff;
    ct_write(path, b, n);
    free(b);
}

static void test_fallback(void) {
    char dir[128];
    ct_tmpdir(dir, sizeof dir, "ckpt-fb");
    fixture w, r;
    fx_init(&w, 1, 8);
    fx_init(&r, 2, 8);
    save_step(dir, &w, 10, 3);
    save_step(dir, &w, 20, 3);
    save_step(dir, &w, 30, 3);
    corrupt_state(dir, 30);
    dt_ckpt_state st = fx_state(&r, 0, NULL, 0);
    dt_ckpt_opts  o  = dt_ckpt_opts_default();
    dt_ckpt_info  info;
    CHECK_ERR(dt_ckpt_load(dir, NULL, &st, &o, &info), DT_ERR_FORMAT, "step-000030/state.dtck");
    CHECK(!info.found);
    CHECK_EQ(info.refused, 1);
    dt_ckpt_info_free(&info);
    o.fallback = true;
    dt_log_set_level(DT_LOG_ERROR); // the refusal warning is expected here
    CHECK_OK(dt_ckpt_load(dir, NULL, &st, &o, &info));
    CHECK(info.found);
    CHECK_EQ(info.step, 20);
    CHECK_EQ(info.refused, 1);
    CHECK(params_of_step(r.m, 20));
    dt_ckpt_info_free(&info);
    corrupt_state(dir, 20);
    corrupt_state(dir, 10);
    CHECK_ERR(dt_ckpt_load(dir, NULL, &st, &o, &info), DT_ERR_FORMAT,
              "no complete checkpoint could be loaded (3 refused); the newest was refused: ");
    CHECK(strstr(dt_last_error(), "step-000030/state.dtck") != NULL);
    dt_ckpt_info_free(&info);
    dt_log_set_level(DT_LOG_WARN);
    fx_free(&w);
    fx_free(&r);
    ct_rm_tree(dir);
}

static void test_model_file(void) {
    char dir[128], path[512], cdir[256], rank[640];
    ct_tmpdir(dir, sizeof dir, "ckpt-model");
    fixture w, r;
    fx_init(&w, 1, 8);
    fx_init(&r, 2, 8);
    snprintf(path, sizeof path, "%s/final.dtck", dir);
    CHECK_OK(dt_ckpt_save_model(path, w.m));
    CHECK_OK(dt_ckpt_verify(path));
    CHECK(!same_params(w.m, r.m));
    CHECK_OK(dt_ckpt_load_model(path, r.m));
    CHECK(same_params(w.m, r.m));
    // A model file is not a checkpoint directory entry, and vice versa.
    char sub[192];
    snprintf(sub, sizeof sub, "%s/ckpts", dir);
    save_step(sub, &w, 4, 3);
    save_step(sub, &w, 8, 3);
    CHECK_OK(dt_ckpt_load_model(sub, r.m)); // the newest complete one
    CHECK(params_of_step(r.m, 8));
    CHECK_OK(dt_ckpt_path(sub, 4, cdir, sizeof cdir));
    CHECK_OK(dt_ckpt_load_model(cdir, r.m)); // a given checkpoint
    CHECK(params_of_step(r.m, 4));
    snprintf(rank, sizeof rank, "%s/state.dtck", cdir);
    ct_fill(dt_model_params(r.m), dt_model_num_params(r.m), 77);
    CHECK_OK(dt_ckpt_load_model(rank, r.m)); // its state file
    CHECK(params_of_step(r.m, 4));
    snprintf(rank, sizeof rank, "%s/rank-00000.dtck", cdir);
    CHECK_ERR(dt_ckpt_load_model(rank, r.m), DT_ERR_FORMAT,
              "expected a model or state file, found a rank file");
    CHECK_ERR(dt_ckpt_load_model(dir, r.m), DT_ERR_FORMAT,
              "found a directory without any complete checkpoint");
    // A model file where a checkpoint is expected is refused by kind.
    snprintf(rank, sizeof rank, "%s/state.dtck", cdir);
    size_t         n;
    unsigned char *b = ct_read(path, &n);
    ct_write(rank, b, n);
    free(b);
    dt_ckpt_state st = fx_state(&r, 0, NULL, 0);
    dt_ckpt_opts  o  = {.fallback = false};
    CHECK_OK(dt_ckpt_load(sub, NULL, &st, &o, NULL)); // step 8 is untouched
    CHECK_ERR(dt_ckpt_verify(cdir), DT_ERR_FORMAT, "expected a state file, found a model file");
    fx_free(&w);
    fx_free(&r);
    ct_rm_tree(dir);
}

static void test_bad_arguments(void) {
    char dir[128], file[192];
    ct_tmpdir(dir, sizeof dir, "ckpt-args");
    fixture w;
    fx_init(&w, 1, 8);
    dt_ckpt_state st = fx_state(&w, -1, NULL, 0);
    CHECK_ERR(dt_ckpt_save(dir, NULL, &st, NULL), DT_ERR_ARG, "expected a step >= 0, found -1");
    st                  = fx_state(&w, 1, NULL, 0);
    dt_ckpt_rng twice[] = {{"a", &w.ra}, {"a", &w.rb}};
    st.rngs             = twice;
    CHECK_ERR(dt_ckpt_save(dir, NULL, &st, NULL), DT_ERR_ARG, "unique RNG names, found \"a\"");
    dt_ckpt_kv kv[] = {{"k", "v"}, {"", "v"}};
    st              = fx_state(&w, 1, kv, 2);
    CHECK_ERR(dt_ckpt_save(dir, NULL, &st, NULL), DT_ERR_ARG, "key 1: expected a name of 1..255");
    dt_ckpt_state none = {.step = 1};
    CHECK_ERR(dt_ckpt_save(dir, NULL, &none, NULL), DT_ERR_ARG, "finalized model");
    CHECK_ERR(dt_ckpt_load(dir, NULL, NULL, NULL, NULL), DT_ERR_ARG, "found NULL");
    int64_t step;
    CHECK_OK(dt_ckpt_latest(dir, &step));
    CHECK_EQ(step, -1); // nothing was written by the refused saves
    // A file where the directory should be: an I/O error naming it.
    snprintf(file, sizeof file, "%s/plain", dir);
    ct_write(file, "x", 1);
    st = fx_state(&w, 1, NULL, 0);
    CHECK_ERR(dt_ckpt_save(file, NULL, &st, NULL), DT_ERR_IO, file);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/sub", file);
    CHECK_ERR(dt_ckpt_save(sub, NULL, &st, NULL), DT_ERR_IO, "cannot create directory");
    CHECK_ERR(dt_ckpt_verify(sub), DT_ERR_IO, "cannot find");
    fx_free(&w);
    ct_rm_tree(dir);
}

// ------------------------------------------------------------------ measurement

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t tree_bytes(const char *cdir) {
    const char *names[] = {"state.dtck", "rank-00000.dtck", "complete.dtck"};
    size_t      total   = 0;
    for (int i = 0; i < 3; i++) {
        char        p[512];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", cdir, names[i]);
        if (stat(p, &sb) == 0)
            total += (size_t)sb.st_size;
    }
    return total;
}

// The seed's ConvNet with Adadelta: save and load times (median of 9), bytes.
static void measure_convnet(void) {
    char dir[128], cdir[256];
    ct_tmpdir(dir, sizeof dir, "ckpt-bench");
    dt_model *m;
    CHECK_OK(mnist_convnet_new(&m, 1, 0.1f, 0.25f));
    dt_optim *o = NULL;
    CHECK_OK(dt_adadelta_new(&o, dt_model_as_params(m), NULL));
    dt_sampler *s = NULL;
    dt_sampler_new(&s, 60000, NULL);
    dt_rng        g    = dt_rng_init(0);
    dt_ckpt_rng   rg[] = {{"dropout", &g}};
    dt_ckpt_state st   = {.model = m, .optim = o, .sampler = s, .rngs = rg, .nrngs = 1};
    enum { REPS = 9 };
    double save[REPS], load[REPS];
    for (int i = 0; i < REPS; i++) {
        st.step   = i;
        double t0 = dt_now();
        CHECK_OK(dt_ckpt_save(dir, NULL, &st, NULL));
        double t1 = dt_now();
        CHECK_OK(dt_ckpt_load(dir, NULL, &st, NULL, NULL));
        save[i] = t1 - t0;
        load[i] = dt_now() - t1;
    }
    qsort(save, REPS, sizeof(double), cmp_double);
    qsort(load, REPS, sizeof(double), cmp_double);
    dt_ckpt_path(dir, REPS - 1, cdir, sizeof cdir);
    printf("ConvNet checkpoint (%zu parameters, Adadelta, 1 rank): %zu bytes; save %.2f ms, "
           "load %.2f ms (medians of %d, fsync included, %s)\n",
           dt_model_num_params(m), tree_bytes(cdir), save[REPS / 2] * 1e3, load[REPS / 2] * 1e3,
           REPS, dir);
    dt_sampler_free(s);
    dt_optim_free(o);
    dt_model_free(m);
    ct_rm_tree(dir);
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_nothing_to_load);
    RUN(test_newest_and_keep);
    RUN(test_incomplete_ignored);
    RUN(test_refusals);
    RUN(test_file_of_another_save);
    RUN(test_mismatch);
    RUN(test_fallback);
    RUN(test_model_file);
    RUN(test_bad_arguments);
    RUN(measure_convnet);
    return check_summary();
}
