// test_forged_resume.c: dtrain-mnist --resume (and --load) on checkpoints forged by
// hand, each with every CRC and its marker fixed, so that only the forged field is off:
// an optimizer step of 2^62, another program's name, a key/value section with no keys
// or without a refused flag's key, a sampler epoch of 2^63 - 1, a NaN weight, and a
// FIFO where the state file or the model file should be. Each run fails (exit 1) with a
// message naming the file, the field, what was expected and what was found, and the
// checkpoint folder is left as it was.
#include "../lib/prog.h"
#include "ckpt_test.h"

#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>

static char       bin[PATH_MAX + 64], tmp[128], dir[256], cdir[320];
static const char common[] = "--limit 64 --batch-size 16 --epochs 2 --threads 1 --seed 3 --no-test";

// The three files of the checkpoint as the program wrote them.
static const char    *names[3] = {"state.dtck", "rank-00000.dtck", "complete.dtck"};
static unsigned char *pristine[3];
static size_t         pristine_n[3];

// Runs dtrain-mnist under a deadline (a reader that blocks on a FIFO fails the test
// instead of hanging it: timeout's exit status is 124).
static int run(char **out, const char *fmt, ...) DT_PRINTF(2, 3);
static int run(char **out, const char *fmt, ...) {
    char    args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return test_run(out, "timeout 60 %s %s 2>&1", bin, args);
}

// The checkpoint as written, and nothing else in the folder (a resume that was not
// refused has saved newer ones).
static void restore(void) {
    DIR           *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "step-000003") != 0) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            ct_rm_tree(path);
        }
    if (d)
        closedir(d);
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", cdir, names[i]);
        unlink(path);
        ct_write(path, pristine[i], pristine_n[i]);
    }
}

// File i of the checkpoint, its section `tag` replaced by q (m bytes), resealed.
static void forge_section(int i, const char *tag, const void *q, size_t m) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", cdir, names[i]);
    size_t         n = pristine_n[i];
    unsigned char *b = malloc(n);
    memcpy(b, pristine[i], n);
    ct_set_section(&b, &n, tag, q, m);
    ct_write(path, b, n);
    free(b);
    ct_fix_marker(cdir, names[i]);
}

// A copy of section `tag` of file i (malloc'd), its length in *m.
static unsigned char *section_of(int i, const char *tag, size_t *m) {
    ct_section        s[8];
    int               k  = ct_sections(pristine[i], pristine_n[i], s, 8);
    const ct_section *at = ct_find(s, k, tag);
    if (!at)
        abort();
    unsigned char *q = malloc(at->len + 1);
    memcpy(q, pristine[i] + at->payload_at, at->len);
    *m = at->len;
    return q;
}

// The key/values of the state file without the key `drop`, and with `set`'s value
// replaced by `value` (either may be NULL): a KVAL payload into out, its length.
static size_t kval_without(const char *drop, const char *set, const char *value,
                           unsigned char *out) {
    size_t         m;
    unsigned char *q = section_of(0, "KVAL", &m), *p = q + 4;
    uint32_t       count = ct_get32(q), kept = 0;
    size_t         at = 4;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t    klen = ct_get32(p), vlen = ct_get32(p + 4 + klen);
        const char *key = (const char *)p + 4, *val = (const char *)p + 8 + klen;
        bool        is_drop = drop && klen == strlen(drop) && !memcmp(key, drop, klen);
        bool        is_set  = set && klen == strlen(set) && !memcmp(key, set, klen);
        if (!is_drop) {
            uint32_t vl = is_set ? (uint32_t)strlen(value) : vlen;
            ct_put32(out + at, klen);
            memcpy(out + at + 4, key, klen);
            ct_put32(out + at + 4 + klen, vl);
            memcpy(out + at + 8 + klen, is_set ? value : val, vl);
            at += 8 + klen + vl;
            kept++;
        }
        p += 8 + klen + vlen;
    }
    ct_put32(out, kept);
    free(q);
    return at;
}

// --resume refused with exit 1 and a message containing want; the folder untouched
// (the forged checkpoint still the only one, its files as forged).
static void resume_refused(const char *what, const char *want) {
    unsigned char *before[3];
    size_t         bn[3];
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", cdir, names[i]);
        before[i] = ct_read(path, &bn[i]);
    }
    char *out;
    int   rc = run(&out, "%s --checkpoint-dir %s --resume", common, dir);
    bool  ok = rc == 1, named = strstr(out, want) != NULL;
    CHECK_EQ(rc, 1);
    CHECK(named);
    int64_t *steps = NULL;
    size_t   n     = 0;
    CHECK_OK(dt_ckpt_list(dir, &steps, &n));
    CHECK(n == 1 && steps[0] == 3);
    dt_free(steps);
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", cdir, names[i]);
        size_t         an;
        unsigned char *after = ct_read(path, &an);
        CHECK(after && before[i] && an == bn[i] && memcmp(after, before[i], an) == 0);
        free(after), free(before[i]);
    }
    if (!ok || !named)
        fprintf(stderr, "     %s: exit %d, expected 1 and \"%s\":\n%s\n", what, rc, want, out);
    free(out);
    restore();
}

static void test_forged(void) {
    char *out;
    snprintf(dir, sizeof dir, "%s/ckpt", tmp);
    snprintf(cdir, sizeof cdir, "%s/step-000003", dir);
    CHECK_EQ(run(&out, "%s --checkpoint-dir %s --max-steps 3", common, dir), 0);
    free(out);
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", cdir, names[i]);
        pristine[i] = ct_read(path, &pristine_n[i]);
        CHECK(pristine[i] != NULL);
    }
    // The pristine checkpoint resumes.
    CHECK_EQ(run(&out, "%s --checkpoint-dir %s --resume --max-steps 3", common, dir), 0);
    CHECK(strstr(out, "resumed from ") != NULL);
    free(out);
    restore();

    // OPTM: string name, i64 step count, ...: 2^62 steps.
    size_t         m;
    unsigned char *q = section_of(0, "OPTM", &m);
    ct_put64(q + 4 + ct_get32(q), (uint64_t)1 << 62);
    forge_section(0, "OPTM", q, m);
    free(q);
    resume_refused("optimizer steps", "step-000003/state.dtck: section OPTM: expected an "
                                      "optimizer step count <= 3 (the checkpoint's step: one "
                                      "optimizer step per step at most), found "
                                      "4611686018427387904");

    unsigned char kv[4096];
    forge_section(0, "KVAL", kv, kval_without(NULL, "program", "dtrain-gpt", kv));
    resume_refused("another program", "step-000003/state.dtck: expected the key program = "
                                      "dtrain-mnist (a checkpoint of this program), found a "
                                      "checkpoint of dtrain-gpt");
    unsigned char none[4] = {0};
    forge_section(0, "KVAL", none, sizeof none);
    resume_refused("no keys", "expected the key program = dtrain-mnist (a checkpoint of this "
                              "program), found no such key");
    forge_section(0, "KVAL", kv, kval_without("seed", NULL, NULL, kv));
    resume_refused("no seed", "step-000003/state.dtck: expected the key seed (--seed, 3 in this "
                              "run), found no such key");

    // SMPL: u64 epoch first.
    q = section_of(1, "SMPL", &m);
    ct_put64(q, (uint64_t)INT64_MAX);
    forge_section(1, "SMPL", q, m);
    free(q);
    resume_refused("epoch", "step-000003/rank-00000.dtck: section SMPL: expected an epoch <= 3 "
                            "(the checkpoint's step: every epoch takes a step at least), found "
                            "9223372036854775807");

    // PARM: u64 count, then the floats.
    q         = section_of(0, "PARM", &m);
    float nan = NAN;
    memcpy(q + 8 + 4 * 5, &nan, 4);
    forge_section(0, "PARM", q, m);
    free(q);
    resume_refused("NaN weight", "step-000003/state.dtck: section PARM: tensor \"0.weight\" "
                                 "(PTAB) element 5: expected a finite value, found nan");

    // A FIFO as the state file, and as --load's model file.
    char path[512];
    snprintf(path, sizeof path, "%s/state.dtck", cdir);
    CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
    CHECK_EQ(run(&out, "%s --checkpoint-dir %s --resume", common, dir), 1);
    CHECK(strstr(out, "step-000003/state.dtck: expected a regular file, found a FIFO") != NULL);
    free(out);
    restore();
    snprintf(path, sizeof path, "%s/model.fifo", tmp);
    CHECK(mkfifo(path, 0600) == 0);
    CHECK_EQ(run(&out, "%s --load %s", common, path), 1);
    CHECK(strstr(out, "model.fifo: expected a regular file, found a FIFO") != NULL);
    free(out);
    for (int i = 0; i < 3; i++)
        free(pristine[i]);
}

int main(void) {
    if (!CHECK(test_program_path("dtrain-mnist", bin, sizeof bin))) {
        fprintf(stderr, "dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    ct_tmpdir(tmp, sizeof tmp, "forged-resume");
    RUN(test_forged);
    if (!check_failed)
        ct_rm_tree(tmp);
    else
        fprintf(stderr, "files kept in %s\n", tmp);
    return check_summary();
}
