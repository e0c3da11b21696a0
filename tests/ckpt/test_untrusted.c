// test_untrusted.c: checkpoint and model files that a reader must not trust.
//
// - A FIFO named as a model file, as a checkpoint's state file or given to verify is
//   refused at once, naming what it is, instead of blocking open() for ever.
// - A large file with a bad header is refused after its header, without the process's
//   memory growing by the file's size; a rank file of another size than its marker
//   records is refused before its body is read.
// - Forged files whose every CRC checks out: a marker that lists no files (or one file
//   twice), NaN or infinite weights and optimizer state, and a checkpoint directory
//   whose name is not the one a save gives its step ("step-4" would be listed as step 4
//   and loaded from step-000004). Each is refused naming the file, the field, what was
//   expected and what was found.
#include "ckpt_test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[128];

// A read that blocks (the FIFO cases on a reader that waits for a writer) must fail the
// test, not hang it.
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test_untrusted: a reader blocked (open or read of a FIFO)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

// A one-rank checkpoint of step `step` under dir, of a small model with Adam.
static void save_one(const char *dir, int64_t step) {
    dt_model *m = ct_model(7, 5);
    dt_optim *o = NULL;
    CHECK_OK(dt_adam_new(&o, dt_model_as_params(m), NULL));
    dt_optim_set_step_count(o, step);
    dt_rng        g  = dt_rng_init(3);
    dt_ckpt_rng   r  = {"dropout", &g};
    dt_ckpt_state st = {.model = m, .optim = o, .step = step, .rngs = &r, .nrngs = 1};
    CHECK_OK(dt_ckpt_save(dir, NULL, &st, NULL));
    dt_optim_free(o);
    dt_model_free(m);
}

// Loads dir into a fresh model and optimizer like save_one's; the status.
static dt_status load_one(const char *dir) {
    dt_model *m = ct_model(8, 5);
    dt_optim *o = NULL;
    dt_adam_new(&o, dt_model_as_params(m), NULL);
    dt_rng        g  = dt_rng_init(4);
    dt_ckpt_rng   r  = {"dropout", &g};
    dt_ckpt_state st = {.model = m, .optim = o, .rngs = &r, .nrngs = 1};
    dt_status     s  = dt_ckpt_load(dir, NULL, &st, NULL, NULL);
    dt_optim_free(o);
    dt_model_free(m);
    return s;
}

// ------------------------------------------------------------------------ FIFOs

static void test_fifo(void) {
    char fifo[256], dir[256], state[320];
    snprintf(fifo, sizeof fifo, "%s/model.bin", tmp);
    CHECK(mkfifo(fifo, 0600) == 0);
    signal(SIGALRM, on_alarm);
    alarm(60);
    dt_model *m = ct_model(1, 5);
    CHECK_ERR(dt_ckpt_load_model(fifo, m), DT_ERR_IO,
              "model.bin: expected a regular file, found "
              "a FIFO (named pipe)");
    CHECK_ERR(dt_ckpt_verify(fifo), DT_ERR_IO, "expected a regular file, found a FIFO");
    dt_model_free(m);
    // A checkpoint whose state file is a FIFO: refused, naming it.
    snprintf(dir, sizeof dir, "%s/fifo-ckpt", tmp);
    save_one(dir, 3);
    snprintf(state, sizeof state, "%s/step-000003/state.dtck", dir);
    CHECK(unlink(state) == 0 && mkfifo(state, 0600) == 0);
    CHECK_ERR(load_one(dir), DT_ERR_IO,
              "step-000003/state.dtck: expected a regular file, found "
              "a FIFO");
    char cdir[300];
    snprintf(cdir, sizeof cdir, "%s/step-000003", dir);
    CHECK_ERR(dt_ckpt_verify(cdir), DT_ERR_IO, "state.dtck: expected a regular file");
    alarm(0);
}

// ----------------------------------------------------------- header before body

// The process's peak resident memory so far, in bytes, after resetting the peak to the
// current size where the kernel allows it.
static uint64_t peak_rss(bool reset) {
    if (reset) {
        FILE *c = fopen("/proc/self/clear_refs", "w");
        if (c) {
            fputs("5", c);
            fclose(c);
        }
    }
    FILE    *f = fopen("/proc/self/status", "r");
    char     line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", (unsigned long long *)&kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

#define BIG      (256u << 20) // a file a reader must not read whole to refuse it
#define BIG_GROW (32u << 20)  // what a refusal may cost in peak memory, at most

static void test_header_first(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/big.bin", tmp);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, BIG) == 0); // sparse: no magic, all zeros
    close(fd);
    dt_model *m      = ct_model(1, 5);
    uint64_t  before = peak_rss(true);
    CHECK_ERR(dt_ckpt_load_model(path, m), DT_ERR_FORMAT, "big.bin: expected the magic");
    CHECK_ERR(dt_ckpt_verify(path), DT_ERR_FORMAT, "big.bin: expected the magic");
    uint64_t grew = peak_rss(false) - before;
    CHECK(grew < BIG_GROW);
    fprintf(stderr, "     %u MiB file with a bad header refused; peak memory grew %.1f MiB\n",
            BIG >> 20, (double)grew / 1048576);
    dt_model_free(m);

    // A rank file that is a whole, valid file by itself, but of another size than its
    // marker records: one more (unknown, so skipped) section of BIG zero bytes.
    char dir[256], rank[320], cdir[300];
    snprintf(dir, sizeof dir, "%s/big-rank", tmp);
    save_one(dir, 2);
    snprintf(cdir, sizeof cdir, "%s/step-000002", dir);
    snprintf(rank, sizeof rank, "%s/rank-00000.dtck", cdir);
    size_t         n = 0;
    unsigned char *b = ct_read(rank, &n);
    unsigned char *g = calloc(1, n + 24);
    memcpy(g, b, n);
    unsigned char *sh = g + n; // the new section's header: tag, flags, length, CRC
    memcpy(sh, "ZZZZ", 4);
    ct_put64(sh + 8, BIG);
    uint32_t       crc  = dt_crc32c(0, sh, 16);
    unsigned char *zero = calloc(1, 1 << 20);
    for (unsigned i = 0; i < BIG >> 20; i++)
        crc = dt_crc32c(crc, zero, 1 << 20);
    ct_put32(sh + 16, crc);
    ct_put32(g + 20, ct_get32(g + 20) + 1);
    ct_put64(g + 40, (uint64_t)n + 24 + BIG);
    ct_put32(g + 48, dt_crc32c(ct_get32(g + 48), sh, 24)); // the table's CRC runs on
    ct_put32(g + 60, dt_crc32c(0, g, 60));
    ct_write(rank, g, n + 24);
    CHECK(truncate(rank, (off_t)(n + 24 + BIG)) == 0);
    free(zero), free(g), free(b);
    before = peak_rss(true);
    CHECK_ERR(load_one(dir), DT_ERR_FORMAT, "rank-00000.dtck: expected the file its marker lists");
    CHECK_ERR(dt_ckpt_verify(cdir), DT_ERR_FORMAT, "expected the file its marker lists");
    grew = peak_rss(false) - before;
    CHECK(grew < BIG_GROW);
    fprintf(stderr,
            "     rank file of %u MiB against its marker's %zu bytes refused; peak memory grew "
            "%.1f MiB\n",
            BIG >> 20, n, (double)grew / 1048576);
}

// ----------------------------------------------------------------- forged fields

static void test_manifest(void) {
    char dir[256], marker[320], cdir[300];
    snprintf(dir, sizeof dir, "%s/mani", tmp);
    save_one(dir, 1);
    snprintf(cdir, sizeof cdir, "%s/step-000001", dir);
    snprintf(marker, sizeof marker, "%s/complete.dtck", cdir);
    size_t         n;
    unsigned char *b = ct_read(marker, &n), *orig = malloc(n);
    memcpy(orig, b, n);
    size_t n0 = n;
    // No files at all: nothing left to check against.
    unsigned char none[4] = {0};
    ct_set_section(&b, &n, "MANI", none, sizeof none);
    ct_write(marker, b, n);
    CHECK_ERR(dt_ckpt_verify(marker), DT_ERR_FORMAT,
              "complete.dtck: section MANI: expected 2 files (state.dtck and one per rank of "
              "world size 1), found 0");
    CHECK_ERR(load_one(dir), DT_ERR_FORMAT, "section MANI: expected 2 files");
    // The state file twice, the rank's file never.
    ct_section        s[4];
    int               k  = ct_sections(orig, n0, s, 4);
    const ct_section *ms = ct_find(s, k, "MANI");
    unsigned char     two[256];
    uint32_t          elen = 4 + 10 + 12; // "state.dtck", size, CRC
    ct_put32(two, 2);
    memcpy(two + 4, orig + ms->payload_at + 4, elen);
    memcpy(two + 4 + elen, orig + ms->payload_at + 4, elen);
    free(b);
    b = malloc(n0), n = n0;
    memcpy(b, orig, n0);
    ct_set_section(&b, &n, "MANI", two, 4 + 2 * elen);
    ct_write(marker, b, n);
    CHECK_ERR(dt_ckpt_verify(marker), DT_ERR_FORMAT,
              "section MANI: file 1: expected state.dtck or rank-<R>.dtck for a rank below 1, "
              "each once, found \"state.dtck\" again");
    free(b), free(orig);
}

// Float `index` of section `tag` (after its `skip` header bytes) of file name in cdir set
// to v, resealed, and the marker fixed (when cdir is a checkpoint).
static void forge_float(const char *cdir, const char *name, const char *tag, size_t skip,
                        size_t index, float v) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", cdir, name);
    size_t            n;
    unsigned char    *b = ct_read(path, &n);
    ct_section        s[8];
    int               k  = ct_sections(b, n, s, 8);
    const ct_section *at = ct_find(s, k, tag);
    if (!CHECK(at != NULL))
        return;
    memcpy(b + at->payload_at + skip + 4 * index, &v, 4);
    ct_reseal(b, n);
    ct_write(path, b, n);
    free(b);
    snprintf(path, sizeof path, "%s/complete.dtck", cdir);
    if (strcmp(name, "complete.dtck") != 0 && ct_exists(path))
        ct_fix_marker(cdir, name);
}

static void test_nonfinite(void) {
    char dir[256], cdir[300];
    snprintf(dir, sizeof dir, "%s/nan", tmp);
    save_one(dir, 2);
    snprintf(cdir, sizeof cdir, "%s/step-000002", dir);
    CHECK_OK(load_one(dir));
    // PARM: u64 count, then the floats: "0.weight" (27), "0.bias" (3), ...
    forge_float(cdir, "state.dtck", "PARM", 8, 28, NAN);
    CHECK_ERR(load_one(dir), DT_ERR_FORMAT,
              "step-000002/state.dtck: section PARM: tensor \"0.bias\" (PTAB) element 1: "
              "expected a finite value, found nan");
    CHECK_ERR(dt_ckpt_verify(cdir), DT_ERR_FORMAT, "expected a finite value, found nan");
    forge_float(cdir, "state.dtck", "PARM", 8, 28, 0.5f);
    CHECK_OK(load_one(dir));
    // OPTM: string "adam" (8 bytes), i64 steps, u64 parameters, u64 n, then the floats.
    forge_float(cdir, "state.dtck", "OPTM", 32, 7, -INFINITY);
    CHECK_ERR(load_one(dir), DT_ERR_FORMAT,
              "state.dtck: section OPTM: float 7: expected a finite value, found -inf");
    // A model file with an infinite weight.
    char      model[256];
    dt_model *m = ct_model(2, 5);
    snprintf(model, sizeof model, "%s/inf.dtck", tmp);
    CHECK_OK(dt_ckpt_save_model(model, m));
    forge_float(tmp, "inf.dtck", "PARM", 8, 0, INFINITY);
    CHECK_ERR(dt_ckpt_load_model(model, m), DT_ERR_FORMAT,
              "inf.dtck: section PARM: tensor \"0.weight\" (PTAB) element 0: expected a finite "
              "value, found inf");
    dt_model_free(m);
}

static void test_step_names(void) {
    char dir[256], from[320], to[320];
    snprintf(dir, sizeof dir, "%s/names", tmp);
    save_one(dir, 4);
    snprintf(from, sizeof from, "%s/step-000004", dir);
    snprintf(to, sizeof to, "%s/step-4", dir);
    CHECK(rename(from, to) == 0);
    int64_t *steps = NULL;
    size_t   n     = 0;
    CHECK_ERR(dt_ckpt_list(dir, &steps, &n), DT_ERR_FORMAT,
              "names/step-4: expected a checkpoint directory named as a save names it (\"step-\" "
              "and the step in 6 digits or more, step-000004 for step 4), found step-4");
    CHECK_EQ(n, 0);
    dt_free(steps);
    CHECK_ERR(load_one(dir), DT_ERR_FORMAT, "found step-4; rename or remove it");
    // Seven digits for a step of six: not the saver's name either.
    snprintf(from, sizeof from, "%s/step-0000004", dir);
    CHECK(rename(to, from) == 0);
    CHECK_ERR(load_one(dir), DT_ERR_FORMAT, "step-000004 for step 4), found step-0000004");
    // Renamed back, it loads; an interrupted save's leftovers are still not ours.
    snprintf(to, sizeof to, "%s/step-000004", dir);
    CHECK(rename(from, to) == 0);
    snprintf(from, sizeof from, "%s/step-000005.next", dir);
    CHECK(mkdir(from, 0700) == 0);
    CHECK_OK(load_one(dir));
}

int main(void) {
    ct_tmpdir(tmp, sizeof tmp, "ckpt-untrusted");
    RUN(test_header_first); // first: the memory measured is this process's peak
    RUN(test_fifo);
    RUN(test_manifest);
    RUN(test_nonfinite);
    RUN(test_step_names);
    if (!check_failed)
        ct_rm_tree(tmp);
    else
        fprintf(stderr, "files kept in %s\n", tmp);
    return check_summary();
}
