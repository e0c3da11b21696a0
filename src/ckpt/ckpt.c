// ckpt.c: checkpoint directories and the collective save and load. A checkpoint
// becomes visible only when rank 0 renames its completion marker into place, after
// every rank has written its files; deletions remove the marker first. So at every
// instant each step-* directory is either a whole checkpoint or ignored, and a kill at
// any point leaves the previous checkpoints whole. File bytes live in format.c.
#include "ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP CK_PATH_CAP

dt_ckpt_opts dt_ckpt_opts_default(void) {
    return (dt_ckpt_opts){0};
}

void dt_ckpt_info_free(dt_ckpt_info *info) {
    if (!info)
        return;
    dt_free(info->kvs);
    memset(info, 0, sizeof *info);
    info->step = -1;
}

const char *dt_ckpt_info_get(const dt_ckpt_info *info, const char *key) {
    for (int i = 0; info && i < info->nkvs; i++)
        if (strcmp(info->kvs[i].key, key) == 0)
            return info->kvs[i].value;
    return NULL;
}

dt_status dt_ckpt_path(const char *dir, int64_t step, char *buf, size_t n) {
    if (!dir || step < 0)
        return dt_fail(DT_ERR_ARG,
                       "checkpoint: expected a directory and a step >= 0, found %s "
                       "and %lld",
                       dir ? dir : "NULL", (long long)step);
    if ((size_t)snprintf(buf, n, "%s/step-%06lld", dir, (long long)step) >= n)
        return dt_fail(DT_ERR_ARG, "checkpoint: path of %s/step-%06lld is longer than %zu bytes",
                       dir, (long long)step, n);
    return DT_OK;
}

dt_status dt_ckpt_join(char *out, const char *dir, const char *name) {
    if ((size_t)snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return dt_fail(DT_ERR_ARG, "checkpoint: path %s/%s is too long", dir, name);
    return DT_OK;
}

static void rank_file_name(int rank, char out[32]) {
    snprintf(out, 32, CK_RANK_FILE_FMT, rank);
}

// ------------------------------------------------------------------------ listing

typedef struct entry {
    int64_t step;
    bool    complete;
} entry;

// What a directory name under a checkpoint folder is: not a checkpoint's ("pp0-tp0",
// "step-000120.tmp": not all digits after "step-"), a checkpoint's (the name
// dt_ckpt_path gives its step), or digits written otherwise ("step-4", "step-0000120",
// too many digits): a directory someone made or renamed, which a reader must not list
// as step 4 and then load from step-000004.
typedef enum { STEP_NOT_OURS, STEP_OURS, STEP_MISNAMED } step_name;

static step_name parse_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step-", 5) != 0 || !name[5])
        return STEP_NOT_OURS;
    int64_t v  = 0;
    bool    ok = true;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9')
            return STEP_NOT_OURS;
        ok = ok && v <= (INT64_MAX - 9) / 10;
        v  = ok ? v * 10 + (*p - '0') : v;
    }
    char canon[32];
    snprintf(canon, sizeof canon, "%06lld", (long long)v);
    *step = ok ? v : -1; // -1: more digits than a step has
    return ok && strcmp(canon, name + 5) == 0 ? STEP_OURS : STEP_MISNAMED;
}

bool dt_ckpt_is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_entry(const void *a, const void *b) {
    int64_t x = ((const entry *)a)->step, y = ((const entry *)b)->step;
    return (x > y) - (x < y);
}

// Every step-* directory under dir, ascending. A missing dir is an empty list.
static dt_status scan(const char *dir, entry **out, size_t *n) {
    *out   = NULL;
    *n     = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return DT_OK;
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot list %s", dir);
    }
    size_t         cap = 0;
    entry         *e   = NULL;
    struct dirent *de;
    dt_status      s = DT_OK;
    while ((de = readdir(d))) {
        int64_t   step = -1;
        char      sub[PATH_CAP], marker[PATH_CAP];
        step_name kind = parse_step_name(de->d_name, &step);
        if (kind == STEP_NOT_OURS)
            continue;
        if (dt_ckpt_join(sub, dir, de->d_name) || dt_ckpt_join(marker, sub, CK_MARKER_FILE)) {
            dt_clear_error();
            continue;
        }
        struct stat sb;
        if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if (kind == STEP_MISNAMED) {
            char want[64] = "";
            if (step >= 0)
                snprintf(want, sizeof want, ", step-%06lld for step %lld", (long long)step,
                         (long long)step);
            s = dt_fail(DT_ERR_FORMAT,
                        "%s: expected a checkpoint directory named as a save names it (\"step-\" "
                        "and the step in 6 digits or more%s), found %s; rename or remove it",
                        sub, want, de->d_name);
            break;
        }
        if (*n == cap) {
            size_t cap2 = cap ? 2 * cap : 16;
            entry *e2   = dt_alloc(cap2 * sizeof *e2);
            if (!e2) {
                s = DT_ERR_NOMEM;
                break;
            }
            if (*n)
                memcpy(e2, e, *n * sizeof *e);
            dt_free(e);
            e   = e2;
            cap = cap2;
        }
        e[(*n)++] = (entry){.step = step, .complete = dt_ckpt_is_file(marker)};
    }
    closedir(d);
    if (s) {
        dt_free(e);
        *n = 0;
        return s;
    }
    if (*n)
        qsort(e, *n, sizeof *e, cmp_entry);
    *out = e;
    return DT_OK;
}

dt_status dt_ckpt_list(const char *dir, int64_t **steps, size_t *n) {
    entry *e;
    size_t ne;
    *steps = NULL;
    *n     = 0;
    DT_TRY(scan(dir, &e, &ne));
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        k += e[i].complete;
    if (k) {
        if (!(*steps = dt_alloc(k * sizeof(int64_t)))) {
            dt_free(e);
            return DT_ERR_NOMEM;
        }
        for (size_t i = 0, j = 0; i < ne; i++)
            if (e[i].complete)
                (*steps)[j++] = e[i].step;
    }
    *n = k;
    dt_free(e);
    return DT_OK;
}

// The newest complete step below `below`, -1 when none.
static dt_status newest_below(const char *dir, int64_t below, int64_t *step) {
    entry *e;
    size_t n;
    *step = -1;
    DT_TRY(scan(dir, &e, &n));
    for (size_t i = n; i-- > 0;)
        if (e[i].complete && e[i].step < below) {
            *step = e[i].step;
            break;
        }
    dt_free(e);
    return DT_OK;
}

dt_status dt_ckpt_latest(const char *dir, int64_t *step) {
    return newest_below(dir, INT64_MAX, step);
}

// ---------------------------------------------------------------------- removing

// Where a save of step N writes when step-N/ is already a complete checkpoint: beside
// it, swapped in whole at the commit, so the old one stays loadable until then.
#define NEXT_SUFFIX ".next"

// Empties a checkpoint directory, marker first (then fsync), so that an interruption
// leaves an incomplete directory, never a marker naming missing files.
static dt_status empty_dir(const char *cdir) {
    char path[PATH_CAP];
    DT_TRY(dt_ckpt_join(path, cdir, CK_MARKER_FILE));
    if (unlink(path) == 0)
        DT_TRY(dt_ckpt_fsync_dir(cdir));
    else if (errno != ENOENT)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot remove %s", path);
    DIR *d = opendir(cdir);
    if (!d)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot list %s", cdir);
    struct dirent *de;
    dt_status      s = DT_OK;
    while (!s && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if ((s = dt_ckpt_join(path, cdir, de->d_name)))
            break;
        if (unlink(path) != 0 && errno != ENOENT)
            s = dt_fail_errno(DT_ERR_IO, "checkpoint: cannot remove %s", path);
    }
    closedir(d);
    return s;
}

static dt_status remove_ckpt(const char *cdir) {
    DT_TRY(empty_dir(cdir));
    if (rmdir(cdir) != 0 && errno != ENOENT)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot remove directory %s", cdir);
    return DT_OK;
}

// Deletes every step-<digits>.next directory: a replacement of a complete checkpoint
// that was interrupted before its commit (the one being committed is gone by now).
static void remove_stale_next(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    size_t         sl = strlen(NEXT_SUFFIX);
    while ((de = readdir(d))) {
        size_t  len = strlen(de->d_name);
        char    name[256], cdir[PATH_CAP];
        int64_t step;
        if (len <= sl || len >= sizeof name || strcmp(de->d_name + len - sl, NEXT_SUFFIX) != 0)
            continue;
        memcpy(name, de->d_name, len - sl);
        name[len - sl] = '\0';
        if (parse_step_name(name, &step) != STEP_OURS || dt_ckpt_join(cdir, dir, de->d_name))
            continue;
        if (remove_ckpt(cdir))
            DT_WARN("ckpt", "could not delete the interrupted save %s: %s", cdir, dt_last_error());
    }
    closedir(d);
}

// After step `step` is complete: keep the `keep` newest complete checkpoints at or
// below it, delete older complete ones and every interrupted save. Newer complete
// checkpoints (left by a run that was rewound to an older one) are not touched.
// Failures here are warnings: the new checkpoint is already safe.
static void prune(const char *dir, int64_t step, int keep) {
    entry *e;
    size_t n;
    if (scan(dir, &e, &n)) {
        DT_WARN("ckpt", "not pruning old checkpoints: %s", dt_last_error());
        return;
    }
    // From the newest down; `step` itself is complete and is the first one kept.
    int kept = 0;
    for (size_t i = n; i-- > 0;) {
        bool drop;
        if (!e[i].complete)
            drop = e[i].step != step;
        else if (e[i].step > step)
            drop = false;
        else
            drop = keep > 0 && ++kept > keep;
        char cdir[PATH_CAP];
        if (drop && !dt_ckpt_path(dir, e[i].step, cdir, sizeof cdir) && remove_ckpt(cdir))
            DT_WARN("ckpt", "could not delete the old checkpoint %s: %s", cdir, dt_last_error());
    }
    dt_free(e);
    remove_stale_next(dir);
    if (dt_ckpt_fsync_dir(dir))
        DT_WARN("ckpt", "%s", dt_last_error());
}

static dt_status mkdir_p(const char *dir) {
    char p[PATH_CAP];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return dt_fail(DT_ERR_ARG, "checkpoint: directory name too long: %s", dir);
    for (char *q = p + 1;; q++) {
        if (*q == '/' || *q == '\0') {
            char c = *q;
            *q     = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot create directory %s", p);
            *q = c;
            if (!c)
                break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_fail(DT_ERR_IO,
                       "checkpoint: expected %s to be a directory, found another kind "
                       "of file",
                       dir);
    return DT_OK;
}

// ------------------------------------------------------------------- agreement

// Every rank contributes its status and two numbers (gathered into tab: 3 per rank).
// When any rank failed, the lowest failing rank's message is broadcast, so every rank
// returns the same status with the message that explains it. With pg NULL, the local
// status. A collective is also a barrier: no rank passes before every rank arrived.
static dt_status agree(dt_pg *pg, dt_status mine, int64_t a, int64_t b, int64_t *tab) {
    if (!pg) {
        tab[0] = mine, tab[1] = a, tab[2] = b;
        return mine;
    }
    enum { MSG = 1024 };
    union {
        char    c[MSG];
        int32_t i[MSG / 4];
    } msg = {{0}};
    if (mine)
        snprintf(msg.c, MSG, "%s", dt_last_error());
    int       rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    int64_t   v[3] = {mine, a, b};
    dt_status cs   = dt_pg_all_gather(pg, v, tab, 3, DT_INT64);
    if (cs)
        return mine ? dt_fail(mine, "%s", msg.c) : cs;
    int bad = -1;
    for (int r = 0; r < world && bad < 0; r++)
        if (tab[3 * r] != DT_OK)
            bad = r;
    if (bad < 0)
        return DT_OK;
    cs = dt_pg_broadcast(pg, msg.i, MSG / 4, DT_INT32, bad);
    if (rank == bad)
        return dt_fail(mine, "%s", msg.c);
    if (cs)
        return cs;
    msg.c[MSG - 1] = '\0';
    int64_t st     = tab[3 * bad];
    if (st <= DT_OK || st >= DT_STATUS_COUNT_)
        st = DT_ERR_INTERNAL;
    return dt_fail((dt_status)st, "rank %d: %s", bad, msg.c);
}

// ---------------------------------------------------------------------- saving

// A name of an RNG or a key: 1..DT_CKPT_NAME_MAX bytes.
static dt_status check_name(const char *what, int i, const char *name) {
    size_t len = name ? strlen(name) : 0;
    if (len < 1 || len > DT_CKPT_NAME_MAX)
        return dt_fail(DT_ERR_ARG,
                       "checkpoint: %s %d: expected a name of 1..%d bytes, found %zu "
                       "bytes",
                       what, i, DT_CKPT_NAME_MAX, len);
    return DT_OK;
}

// The parameters a state names: its dt_params, else its model's.
static dt_params *state_params(const dt_ckpt_state *st) {
    return st->params ? st->params : st->model ? dt_model_as_params(st->model) : NULL;
}

static dt_status check_state(const dt_ckpt_state *st, bool saving) {
    if (!st || !state_params(st) || !dt_params_ready(state_params(st)))
        return dt_fail(DT_ERR_ARG,
                       "checkpoint: expected a state with parameters (a dt_params with storage "
                       "or a finalized model), found %s",
                       st ? "none" : "NULL");
    if (st->nrngs < 0 || (st->nrngs && !st->rngs) || st->nkvs < 0 ||
        (saving && st->nkvs && !st->kvs))
        return dt_fail(DT_ERR_ARG,
                       "checkpoint: expected arrays holding nrngs %d generators and "
                       "nkvs %d key/values",
                       st->nrngs, st->nkvs);
    if (saving && st->step < 0)
        return dt_fail(DT_ERR_ARG, "checkpoint: expected a step >= 0, found %lld",
                       (long long)st->step);
    for (int i = 0; i < st->nrngs; i++) {
        const char *nm = st->rngs[i].name;
        DT_TRY(check_name("RNG", i, nm));
        if (!st->rngs[i].rng)
            return dt_fail(DT_ERR_ARG, "checkpoint: RNG \"%s\": expected a generator, found NULL",
                           nm);
        for (int j = 0; j < i; j++)
            if (!strcmp(nm, st->rngs[j].name))
                return dt_fail(DT_ERR_ARG,
                               "checkpoint: expected unique RNG names, found \"%s\" "
                               "twice",
                               nm);
    }
    for (int i = 0; saving && i < st->nkvs; i++) {
        const char *k = st->kvs[i].key, *v = st->kvs[i].value;
        DT_TRY(check_name("key", i, k));
        if (!v || strlen(v) > DT_CKPT_VALUE_MAX)
            return dt_fail(DT_ERR_ARG,
                           "checkpoint: value of \"%s\": expected text of at most %d "
                           "bytes, found %s",
                           k, DT_CKPT_VALUE_MAX, v ? "more" : "NULL");
        for (int j = 0; j < i; j++)
            if (!strcmp(k, st->kvs[j].key))
                return dt_fail(DT_ERR_ARG, "checkpoint: expected unique keys, found \"%s\" twice",
                               k);
    }
    return DT_OK;
}

// full: a sharded optimizer's gathered state (nfull floats), else NULL.
static dt_status write_state_file(const char *cdir, const dt_ckpt_state *st, int world,
                                  const float *full, size_t nfull, uint64_t *size, uint32_t *crc) {
    char path[PATH_CAP];
    DT_TRY(dt_ckpt_join(path, cdir, CK_STATE_FILE));
    ck_section secs[CK_MODEL_SECTIONS + 2];
    int        n = CK_MODEL_SECTIONS;
    dt_ckpt_model_sections(secs, state_params(st));
    if (st->optim) {
        size_t       nf = 0, np;
        const float *sf = dt_optim_state(st->optim, &nf);
        dt_optim_sharded(st->optim, &np, NULL);
        if (full)
            sf = full, nf = nfull;
        secs[n] = (ck_section){.tag = CK_TAG_OPTM, .data = sf, .data_len = nf * sizeof(float)};
        dt_ckpt_buf_str(&secs[n].head, dt_optim_name(st->optim));
        dt_ckpt_buf_u64(&secs[n].head, (uint64_t)dt_optim_step_count(st->optim));
        dt_ckpt_buf_u64(&secs[n].head, np);
        dt_ckpt_buf_u64(&secs[n].head, nf);
        n++;
    }
    secs[n] = (ck_section){.tag = CK_TAG_KVAL};
    dt_ckpt_buf_u32(&secs[n].head, (uint32_t)st->nkvs);
    for (int i = 0; i < st->nkvs; i++) {
        dt_ckpt_buf_str(&secs[n].head, st->kvs[i].key);
        dt_ckpt_buf_str(&secs[n].head, st->kvs[i].value);
    }
    n++;
    ck_header h = {.kind = CK_KIND_STATE, .step = st->step, .world = (uint32_t)world, .rank = 0};
    dt_status s = dt_ckpt_write_file(path, &h, secs, n, size, crc);
    dt_ckpt_free_sections(secs, n);
    return s;
}

static dt_status write_rank_file(const char *cdir, const dt_ckpt_state *st, int rank, int world,
                                 uint64_t *size, uint32_t *crc) {
    char name[32], path[PATH_CAP];
    rank_file_name(rank, name);
    DT_TRY(dt_ckpt_join(path, cdir, name));
    ck_section secs[2];
    int        n = 0;
    if (st->sampler) {
        secs[n]   = (ck_section){.tag = CK_TAG_SMPL};
        ck_buf *b = &secs[n].head;
        dt_ckpt_buf_u64(b, dt_sampler_epoch(st->sampler));
        dt_ckpt_buf_u64(b, dt_sampler_position(st->sampler));
        dt_ckpt_buf_u64(b, dt_sampler_num_samples(st->sampler));
        dt_ckpt_buf_u64(b, dt_sampler_total_size(st->sampler));
        dt_ckpt_buf_u64(b, dt_sampler_dataset_size(st->sampler));
        n++;
    }
    // Always present, even empty: every rank file says which generators it restores.
    secs[n]   = (ck_section){.tag = CK_TAG_RNGS};
    ck_buf *b = &secs[n].head;
    dt_ckpt_buf_u32(b, (uint32_t)st->nrngs);
    for (int i = 0; i < st->nrngs; i++) {
        const dt_rng *g = st->rngs[i].rng;
        dt_ckpt_buf_str(b, st->rngs[i].name);
        for (int k = 0; k < 2; k++)
            dt_ckpt_buf_u32(b, g->key[k]);
        for (int k = 0; k < 4; k++)
            dt_ckpt_buf_u32(b, g->ctr[k]);
        for (int k = 0; k < 4; k++)
            dt_ckpt_buf_u32(b, g->buf[k]);
        dt_ckpt_buf_u32(b, (uint32_t)g->left);
    }
    n++;
    ck_header h = {
        .kind = CK_KIND_RANK, .step = st->step, .world = (uint32_t)world, .rank = (uint32_t)rank};
    dt_status s = dt_ckpt_write_file(path, &h, secs, n, size, crc);
    dt_ckpt_free_sections(secs, n);
    return s;
}

// The manifest: the state file, then every rank's file with its size and header CRC
// as gathered (tab: status, size, crc per rank).
static dt_status write_marker(const char *cdir, int64_t step, int world, uint64_t ssize,
                              uint32_t scrc, const int64_t *tab) {
    char path[PATH_CAP];
    DT_TRY(dt_ckpt_join(path, cdir, CK_MARKER_FILE));
    ck_section sec = {.tag = CK_TAG_MANI};
    dt_ckpt_buf_u32(&sec.head, (uint32_t)world + 1);
    dt_ckpt_buf_str(&sec.head, CK_STATE_FILE);
    dt_ckpt_buf_u64(&sec.head, ssize);
    dt_ckpt_buf_u32(&sec.head, scrc);
    for (int r = 0; r < world; r++) {
        char name[32];
        rank_file_name(r, name);
        dt_ckpt_buf_str(&sec.head, name);
        dt_ckpt_buf_u64(&sec.head, (uint64_t)tab[3 * r + 1]);
        dt_ckpt_buf_u32(&sec.head, (uint32_t)tab[3 * r + 2]);
    }
    ck_header h = {.kind = CK_KIND_MARKER, .step = step, .world = (uint32_t)world, .rank = 0};
    dt_status s = dt_ckpt_write_file(path, &h, &sec, 1, NULL, NULL);
    dt_ckpt_buf_free(&sec.head);
    return s;
}

static dt_status next_path(char *out, const char *cdir) {
    if ((size_t)snprintf(out, PATH_CAP, "%s%s", cdir, NEXT_SUFFIX) >= PATH_CAP)
        return dt_fail(DT_ERR_ARG, "checkpoint: path %s%s is too long", cdir, NEXT_SUFFIX);
    return DT_OK;
}

// Creates directory d, or empties it when it exists (leftovers of an interrupted save).
static dt_status fresh_dir(const char *parent, const char *d) {
    if (mkdir(d, 0755) == 0)
        return dt_ckpt_fsync_dir(parent);
    if (errno != EEXIST)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot create directory %s", d);
    struct stat sb;
    if (stat(d, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_fail(DT_ERR_IO,
                       "checkpoint: expected %s to be a directory, found another kind "
                       "of file",
                       d);
    return empty_dir(d);
}

// Rank 0, before anyone writes: the directory exists, and so does an empty directory
// for this save. That is step-N/ itself, unless step-N/ is a complete checkpoint (a
// run rewound to an older step saves N again): then step-N.next/, and *replace is set.
static dt_status prepare(const char *dir, const char *cdir, bool *replace) {
    char marker[PATH_CAP], next[PATH_CAP];
    *replace = false;
    DT_TRY(mkdir_p(dir));
    DT_TRY(dt_ckpt_join(marker, cdir, CK_MARKER_FILE));
    if (!dt_ckpt_is_file(marker))
        return fresh_dir(dir, cdir);
    *replace = true;
    DT_TRY(next_path(next, cdir));
    return fresh_dir(dir, next);
}

// Rank 0, after the marker of step-N.next/ is written: the new checkpoint takes the
// place of the old one in one atomic exchange of the two directories, and the old one
// (now under the .next name) is deleted. Where the file system cannot exchange (NFS),
// the old one is deleted first (marker first), then the new one renamed: a crash in
// between leaves step N missing, the older checkpoints whole.
static dt_status commit_replace(const char *dir, const char *cdir, const char *next) {
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, next, AT_FDCWD, cdir, RENAME_EXCHANGE) == 0) {
        DT_TRY(dt_ckpt_fsync_dir(dir));
        if (remove_ckpt(next))
            DT_WARN("ckpt", "could not delete the replaced checkpoint %s: %s", next,
                    dt_last_error());
        return DT_OK;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot exchange %s with %s", next, cdir);
#endif
    DT_TRY(remove_ckpt(cdir));
    if (rename(next, cdir) != 0)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot rename %s to %s", next, cdir);
    return dt_ckpt_fsync_dir(dir);
}

dt_status dt_ckpt_save(const char *dir, dt_pg *pg, const dt_ckpt_state *st,
                       const dt_ckpt_opts *opts) {
    int          rank = pg ? dt_pg_rank(pg) : 0, world = pg ? dt_pg_size(pg) : 1;
    dt_ckpt_opts o    = opts ? *opts : dt_ckpt_opts_default();
    int          keep = o.keep == 0 ? 3 : o.keep;
    char         cdir[PATH_CAP];
    int64_t     *tab = dt_alloc(3 * sizeof(int64_t) * (size_t)world);
    if (!tab)
        return DT_ERR_NOMEM;

    // 1. Rank 0 prepares the directory while the others wait; all check the arguments.
    dt_status s = dir ? check_state(st, true)
                      : dt_fail(DT_ERR_ARG, "checkpoint: expected a directory, found NULL");
    if (!s)
        s = dt_ckpt_path(dir, st->step, cdir, sizeof cdir);
    bool replace = false;
    if (!s && rank == 0)
        s = prepare(dir, cdir, &replace);
    if ((s = agree(pg, s, st && !s ? st->step : -1, replace, tab)))
        goto out;
    for (int r = 1; r < world; r++)
        if (tab[3 * r + 1] != tab[1]) {
            s = dt_fail(DT_ERR_MISMATCH,
                        "checkpoint save: expected the same step on every rank, found %lld on "
                        "rank 0 and %lld on rank %d",
                        (long long)tab[1], (long long)tab[3 * r + 1], r);
            goto out;
        }

    // 2. Every rank writes its own file, rank 0 the shared state too, into the
    // directory rank 0 chose (its choice came with the agreement); then all wait.
    replace = tab[2] != 0;
    char wdir[PATH_CAP];
    if (replace)
        s = next_path(wdir, cdir);
    else
        memcpy(wdir, cdir, sizeof wdir);
    uint64_t size = 0, ssize = 0;
    uint32_t crc = 0, scrc = 0;
    // A sharded optimizer (ZeRO) is saved whole: every rank sends rank 0 its shard.
    float *full  = NULL;
    size_t nfull = 0;
    if (!s && st->optim && dt_optim_sharded(st->optim, NULL, NULL))
        s = dt_ckpt_gather_optim(pg, st->optim, &full, &nfull);
    if (!s)
        s = write_rank_file(wdir, st, rank, world, &size, &crc);
    if (!s && rank == 0)
        s = write_state_file(wdir, st, world, full, nfull, &ssize, &scrc);
    dt_free(full);
    if ((s = agree(pg, s, (int64_t)size, (int64_t)crc, tab)))
        goto out;

    // 3. Rank 0 commits with the marker (and, replacing, the exchange), then prunes;
    // everyone learns the outcome.
    if (rank == 0) {
        s = write_marker(wdir, st->step, world, ssize, scrc, tab);
        if (!s && replace)
            s = commit_replace(dir, cdir, wdir);
        if (!s)
            prune(dir, st->step, keep);
    }
    s = agree(pg, s, 0, 0, tab);
out:
    dt_free(tab);
    return s;
}

// --------------------------------------------------------------------- loading

// One checkpoint read and checked by one rank, not yet applied.
typedef struct staged {
    uint8_t    *sbuf, *rbuf, *mbuf;
    ck_file     sf, rf, mf;
    ck_parm     parm, bufs;
    bool        has_optm, has_smpl;
    ck_optm     optm;
    ck_smpl     smpl;
    dt_rng     *rngs;
    dt_ckpt_kv *kvs;
    int         nkvs;
} staged;

static void staged_free(staged *g) {
    dt_free(g->sbuf);
    dt_free(g->rbuf);
    dt_free(g->mbuf);
    dt_free(g->rngs);
    dt_free(g->kvs);
    memset(g, 0, sizeof *g);
}

// Reads one file of checkpoint cdir and checks it against the marker's manifest (size
// and header CRC), its step and world, and its kind, all from its header before its
// body is read; then checks it whole.
dt_status dt_ckpt_read_member(const char *cdir, const char *name, uint32_t kind, const ck_file *mf,
                              int64_t step, char *path, uint8_t **buf, ck_file *f) {
    uint64_t size = 0;
    uint32_t crc  = 0;
    bool     found;
    DT_TRY(dt_ckpt_join(path, cdir, name));
    DT_TRY(dt_ckpt_check_mani(mf, dt_ckpt_find(mf, CK_TAG_MANI), name, &size, &crc, &found));
    if (!found)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected %s among the files of its marker %s, found "
                       "it missing",
                       path, name, mf->name);
    ck_reader r;
    DT_TRY(dt_ckpt_open(path, &r, f));
    dt_status s = dt_ckpt_expect_kind(f, kind, 0);
    if (!s && (f->step != step || f->world != mf->world))
        s = dt_fail(DT_ERR_FORMAT,
                    "%s: expected step %lld of world size %u (its marker's), found step %lld "
                    "of world size %u",
                    path, (long long)step, mf->world, (long long)f->step, f->world);
    if (!s && (size != f->size || crc != f->header_crc))
        s = dt_fail(DT_ERR_FORMAT,
                    "%s: expected the file its marker lists (%llu bytes, header CRC32C %08x), "
                    "found %llu bytes, header CRC32C %08x (a file of another save)",
                    path, (unsigned long long)size, crc, (unsigned long long)f->size,
                    f->header_crc);
    if (s) {
        dt_ckpt_close(&r);
        return s;
    }
    DT_TRY(dt_ckpt_read_body(&r, buf, f));
    return dt_ckpt_check_file(f);
}

dt_status dt_ckpt_read_marker(const char *cdir, int64_t step, char *path, uint8_t **buf,
                              ck_file *f) {
    DT_TRY(dt_ckpt_join(path, cdir, CK_MARKER_FILE));
    ck_reader r;
    DT_TRY(dt_ckpt_open(path, &r, f));
    dt_status s = dt_ckpt_expect_kind(f, CK_KIND_MARKER, 0);
    if (!s && step >= 0 && f->step != step)
        s = dt_fail(DT_ERR_FORMAT, "%s: expected step %lld (its directory's name), found %lld",
                    path, (long long)step, (long long)f->step);
    if (s) {
        dt_ckpt_close(&r);
        return s;
    }
    DT_TRY(dt_ckpt_read_body(&r, buf, f));
    return dt_ckpt_check_file(f);
}

static dt_status stage(const char *cdir, int64_t step, const dt_ckpt_state *st, int rank, int world,
                       bool allow_reshard, staged *g) {
    char path[PATH_CAP], rname[32];
    DT_TRY(dt_ckpt_read_marker(cdir, step, path, &g->mbuf, &g->mf));
    bool reshard = g->mf.world != (uint32_t)world;
    if (reshard && !allow_reshard)
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: expected a checkpoint of world size %d (this job's), found world size "
                       "%u (dt_ckpt_opts.reshard loads the shared state at another size)",
                       path, world, g->mf.world);
    if (reshard && (st->sampler || st->nrngs))
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: expected a checkpoint of world size %d to restore a sampler and "
                       "generators per rank, found world size %u (resharding loads the shared "
                       "state only)",
                       path, world, g->mf.world);

    // Shared state: parameters, optimizer, key/values.
    DT_TRY(dt_ckpt_read_member(cdir, CK_STATE_FILE, CK_KIND_STATE, &g->mf, step, path, &g->sbuf,
                               &g->sf));
    DT_TRY(dt_ckpt_check_params(&g->sf, state_params(st), &g->parm, &g->bufs));
    const ck_sec *s = dt_ckpt_find(&g->sf, CK_TAG_OPTM);
    if (st->optim) {
        size_t nf = 0, np = dt_optim_num_params(st->optim), full_n;
        dt_optim_state(st->optim, &nf);
        if (dt_optim_sharded(st->optim, &full_n, NULL)) // the whole state is saved
            nf = np ? nf / np * full_n : 0, np = full_n;
        const char *want = dt_optim_name(st->optim);
        if (!s)
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: optimizer mismatch: expected %s state (the "
                           "program's optimizer), found no optimizer state",
                           path, want);
        DT_TRY(dt_ckpt_decode_optm(&g->sf, s, &g->optm));
        if (strcmp(g->optm.name, want) != 0)
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: optimizer mismatch: expected %s state (the "
                           "program's optimizer), found %s state",
                           path, want, g->optm.name);
        if (g->optm.nfloats != nf || g->optm.num_params != np)
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: optimizer mismatch: expected %s state of %zu floats for %zu "
                           "parameters (the program's), found %llu floats for %llu",
                           path, want, nf, np, (unsigned long long)g->optm.nfloats,
                           (unsigned long long)g->optm.num_params);
        g->has_optm = true;
    }
    DT_TRY(dt_ckpt_need(&g->sf, CK_TAG_KVAL, &s));
    DT_TRY(dt_ckpt_decode_kval(&g->sf, s, &g->kvs, &g->nkvs));

    if (reshard)
        return DT_OK; // this rank's sampler and generators belong to the saving world size
    // This rank's own state: sampler and generators.
    rank_file_name(rank, rname);
    DT_TRY(dt_ckpt_read_member(cdir, rname, CK_KIND_RANK, &g->mf, step, path, &g->rbuf, &g->rf));
    if (g->rf.rank != (uint32_t)rank)
        return dt_fail(DT_ERR_FORMAT, "%s: expected the state of rank %d, found rank %u's", path,
                       rank, g->rf.rank);
    if ((s = dt_ckpt_find(&g->rf, CK_TAG_SMPL))) {
        DT_TRY(dt_ckpt_decode_smpl(&g->rf, s, &g->smpl));
        g->has_smpl = true;
    }
    if (st->sampler) {
        dt_sampler *sm = st->sampler;
        if (!g->has_smpl)
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: expected sampler state (the program has a "
                           "sampler), found none",
                           path);
        if (g->smpl.num_samples != dt_sampler_num_samples(sm) ||
            g->smpl.total_size != dt_sampler_total_size(sm) ||
            g->smpl.dataset_size != dt_sampler_dataset_size(sm))
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: sampler mismatch: expected a dataset of %zu samples, %zu per "
                           "rank and pass, %zu in all (the program's sampler), found %llu, %llu "
                           "and %llu",
                           path, dt_sampler_dataset_size(sm), dt_sampler_num_samples(sm),
                           dt_sampler_total_size(sm), (unsigned long long)g->smpl.dataset_size,
                           (unsigned long long)g->smpl.num_samples,
                           (unsigned long long)g->smpl.total_size);
    }
    DT_TRY(dt_ckpt_need(&g->rf, CK_TAG_RNGS, &s));
    if (st->nrngs && !(g->rngs = dt_alloc(sizeof(dt_rng) * (size_t)st->nrngs)))
        return DT_ERR_NOMEM;
    for (int i = 0; i < st->nrngs; i++) {
        bool found;
        DT_TRY(dt_ckpt_check_rngs(&g->rf, s, st->rngs[i].name, &g->rngs[i], &found));
        if (!found)
            return dt_fail(DT_ERR_MISMATCH, "%s: expected an RNG state named \"%s\", found none",
                           path, st->rngs[i].name);
    }
    return DT_OK;
}

// Cannot fail: everything was checked by stage().
static void apply(const staged *g, const dt_ckpt_state *st) {
    dt_ckpt_copy_params(state_params(st), &g->parm, &g->bufs);
    if (g->has_optm) {
        size_t nf;
        float *sf = dt_optim_state(st->optim, &nf);
        if (dt_optim_sharded(st->optim, NULL, NULL))
            dt_ckpt_scatter_optim(st->optim, g->optm.floats);
        else if (nf)
            memcpy(sf, g->optm.floats, nf * sizeof(float));
        dt_optim_set_step_count(st->optim, g->optm.steps);
    }
    if (st->sampler && g->has_smpl)
        dt_sampler_resume(st->sampler, g->smpl.epoch, (size_t)g->smpl.position);
    for (int i = 0; i < st->nrngs; i++)
        *st->rngs[i].rng = g->rngs[i];
}

dt_status dt_ckpt_load(const char *dir, dt_pg *pg, const dt_ckpt_state *st,
                       const dt_ckpt_opts *opts, dt_ckpt_info *info) {
    int          rank = pg ? dt_pg_rank(pg) : 0, world = pg ? dt_pg_size(pg) : 1;
    dt_ckpt_opts o = opts ? *opts : dt_ckpt_opts_default();
    dt_ckpt_info local;
    if (!info)
        info = &local;
    memset(info, 0, sizeof *info);
    info->step   = -1;
    int64_t *tab = dt_alloc(3 * sizeof(int64_t) * (size_t)world);
    if (!tab)
        return DT_ERR_NOMEM;
    dt_status s = dir ? check_state(st, false)
                      : dt_fail(DT_ERR_ARG, "checkpoint: expected a directory, found NULL");
    if ((s = agree(pg, s, 0, 0, tab)))
        goto out;

    int64_t   below           = o.below > 0 ? o.below : INT64_MAX;
    dt_status first           = DT_OK;
    char      first_msg[1024] = "";
    for (;;) {
        // Rank 0 picks, so every rank loads the same step whatever it sees listed.
        int64_t cand = -1;
        s            = rank == 0 ? newest_below(dir, below, &cand) : DT_OK;
        if ((s = agree(pg, s, cand, 0, tab)))
            break;
        cand = tab[1];
        if (cand < 0) {
            if (first)
                s = dt_fail(first,
                            "%s: no complete checkpoint could be loaded (%d refused); the "
                            "newest was refused: %s",
                            dir, info->refused, first_msg);
            break;
        }
        char   cdir[PATH_CAP];
        staged g = {0};
        s        = dt_ckpt_path(dir, cand, cdir, sizeof cdir);
        if (!s)
            s = stage(cdir, cand, st, rank, world, o.reshard, &g);
        s = agree(pg, s, 0, 0, tab);
        if (!s) {
            apply(&g, st);
            info->found       = true;
            info->step        = cand;
            info->world       = (int)g.mf.world;
            info->has_sampler = g.has_smpl;
            info->epoch       = g.smpl.epoch;
            info->position    = (size_t)g.smpl.position;
            info->kvs         = g.kvs;
            info->nkvs        = g.nkvs;
            g.kvs             = NULL;
            snprintf(info->path, sizeof info->path, "%s", cdir);
            staged_free(&g);
            break;
        }
        staged_free(&g);
        // A collective failure (a dead peer) is not a refusal: nothing older would help.
        if (s == DT_ERR_PEER || s == DT_ERR_TIMEOUT || s == DT_ERR_STATE)
            break;
        info->refused++;
        if (!first) {
            first = s;
            snprintf(first_msg, sizeof first_msg, "%s", dt_last_error());
        }
        if (!o.fallback)
            break;
        if (rank == 0)
            DT_WARN("ckpt", "refusing checkpoint %s: %s; trying an older one", cdir,
                    dt_last_error());
        below = cand;
    }
out:
    dt_free(tab);
    if (info == &local)
        dt_ckpt_info_free(&local);
    return s;
}

// --------------------------------------------------------------------- verifying

static dt_status verify_dir(const char *cdir) {
    char          mpath[PATH_CAP], path[PATH_CAP], name[DT_CKPT_NAME_MAX + 1];
    uint8_t      *mbuf = NULL;
    ck_file       mf;
    dt_status     s  = dt_ckpt_read_marker(cdir, -1, mpath, &mbuf, &mf);
    const ck_sec *ms = s ? NULL : dt_ckpt_find(&mf, CK_TAG_MANI);
    // Every rank's file and the state file must be listed.
    for (uint32_t r = 0; !s && r <= mf.world; r++) {
        char want[32];
        if (r == mf.world)
            snprintf(want, sizeof want, "%s", CK_STATE_FILE);
        else
            rank_file_name((int)r, want);
        uint64_t sz;
        uint32_t c;
        bool     found;
        if (!(s = dt_ckpt_check_mani(&mf, ms, want, &sz, &c, &found)) && !found)
            s = dt_fail(DT_ERR_FORMAT, "%s: expected %s among its files, found it missing", mpath,
                        want);
    }
    uint64_t sz;
    uint32_t c;
    for (uint32_t i = 0; !s && dt_ckpt_mani_entry(ms, i, name, &sz, &c); i++) {
        uint8_t *buf = NULL;
        ck_file  f;
        bool     rank = strncmp(name, "rank-", 5) == 0;
        s = dt_ckpt_read_member(cdir, name, rank ? CK_KIND_RANK : CK_KIND_STATE, &mf, mf.step, path,
                                &buf, &f);
        if (!s && rank) {
            char want[32];
            rank_file_name((int)f.rank, want);
            if (strcmp(want, name) != 0)
                s = dt_fail(DT_ERR_FORMAT,
                            "%s: expected the state of the rank its name says, "
                            "found rank %u's",
                            path, f.rank);
        }
        dt_free(buf);
    }
    dt_free(mbuf);
    return s;
}

dt_status dt_ckpt_verify(const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot find %s", path ? path : "NULL");
    if (S_ISDIR(sb.st_mode)) {
        char marker[PATH_CAP];
        DT_TRY(dt_ckpt_join(marker, path, CK_MARKER_FILE));
        if (!dt_ckpt_is_file(marker))
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected a checkpoint directory holding %s, found "
                           "none (an interrupted save, or not a checkpoint)",
                           path, CK_MARKER_FILE);
        return verify_dir(path);
    }
    uint8_t  *buf;
    ck_file   f;
    dt_status s = dt_ckpt_read(path, &buf, &f);
    if (!s)
        s = dt_ckpt_check_file(&f);
    dt_free(buf);
    return s;
}
