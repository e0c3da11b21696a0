// guard.c: the trainer's start-up checks (output paths, settings shared by every rank)
// and the SIGTERM stop at an agreed step boundary (see train_impl.h).
#include "train_impl.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// Creates and removes a file in dir: the one test that also catches read-only mounts,
// ACLs and root on a file system that refuses it. `what` is the flag, for the message.
static dt_status probe_dir(const char *dir, const char *what, const char *shown) {
    char tmpl[PATH_MAX];
    if (snprintf(tmpl, sizeof tmpl, "%s/.dtrain-probe-XXXXXX", dir) >= (int)sizeof tmpl)
        return dt_fail(DT_ERR_ARG, "%s %s: path too long", what, shown);
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return dt_fail_errno(DT_ERR_IO, "%s %s: cannot create a file in %s", what, shown, dir);
    close(fd);
    unlink(tmpl);
    return DT_OK;
}

dt_status dt_train_check_save_model(const char *path) {
    if (!path)
        return DT_OK;
    if (!*path)
        return dt_fail(DT_ERR_ARG, "--save-model expects a file path, found \"\"");
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return dt_fail(DT_ERR_ARG, "--save-model %s: expected a file path, found a %s", path,
                       S_ISDIR(st.st_mode) ? "directory" : "special file");
    char        dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0)
        return dt_fail_errno(DT_ERR_IO, "--save-model %s: its directory %s", path, dir);
    if (!S_ISDIR(st.st_mode))
        return dt_fail(DT_ERR_IO, "--save-model %s: %s is not a directory", path, dir);
    return probe_dir(dir, "--save-model", path);
}

// mkdir -p: every missing component, 0777 & ~umask.
static dt_status make_dirs(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dt_fail(DT_ERR_ARG, "--checkpoint-dir %s: path too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s     = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return dt_fail_errno(DT_ERR_IO, "--checkpoint-dir %s: cannot create %s", dir, p);
        *s = c;
        if (!c)
            return DT_OK;
    }
}

dt_status dt_train_check_checkpoint_dir(const char *dir) {
    if (!dir)
        return DT_OK;
    if (!*dir)
        return dt_fail(DT_ERR_ARG, "--checkpoint-dir expects a directory, found \"\"");
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            return dt_fail_errno(DT_ERR_IO, "--checkpoint-dir %s", dir);
        DT_TRY(make_dirs(dir));
        if (stat(dir, &st) != 0)
            return dt_fail_errno(DT_ERR_IO, "--checkpoint-dir %s", dir);
    }
    if (!S_ISDIR(st.st_mode))
        return dt_fail(DT_ERR_IO, "--checkpoint-dir %s: expected a directory, found a file", dir);
    return probe_dir(dir, "--checkpoint-dir", dir);
}

int64_t dt_train_text_hash(const char *text) {
    if (!text)
        return 0;
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h ? (int64_t)h : 1;
}

int64_t dt_train_path_hash(const char *path) {
    struct stat st;
    char        id[64];
    if (!path || stat(path, &st) != 0)
        return dt_train_text_hash(path);
    snprintf(id, sizeof id, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    return dt_train_text_hash(id);
}

// This machine, as the process group tells hosts apart (host name and boot id;
// DT_HOST_ID overrides it, as in comm): ranks with the same value share a machine.
static int64_t host_hash(void) {
    const char *o = dt_setting_str("DT_HOST_ID");
    char        id[256], host[160] = "unknown", boot[64] = "";
    if (o && *o) {
        snprintf(id, sizeof id, "%s", o);
    } else {
        gethostname(host, sizeof host - 1);
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (f) {
            if (fgets(boot, sizeof boot, f))
                boot[strcspn(boot, "\n")] = '\0';
            fclose(f);
        }
        snprintf(id, sizeof id, "%s/%s", host, boot);
    }
    return dt_train_text_hash(id);
}

static void format_setting(const dt_train_setting *s, int64_t v, const char *text, char *buf,
                           size_t n) {
    if (s->is_text && !v) {
        snprintf(buf, n, "none");
    } else if (s->is_text) {
        snprintf(buf, n, "\"%s\"", text);
    } else if (s->is_double) {
        double d;
        memcpy(&d, &v, sizeof d);
        snprintf(buf, n, "%.9g", d);
    } else if (s->is_bool) {
        snprintf(buf, n, "%s", v ? "on" : "off");
    } else if (s->is_hex) {
        snprintf(buf, n, "0x%016llx", (unsigned long long)v);
    } else {
        snprintf(buf, n, "%lld", (long long)v);
    }
}

#define TEXT_MAX 256 // bytes of a text setting shown in a message

// The first difference in all (world rows of n settings and the host's hash): the
// setting *at, its reference rank *ref and the differing rank *r; false when none.
static bool first_difference(const dt_train_setting *s, int n, int world, const int64_t *all,
                             int *at, int *ref, int *r) {
    size_t row = (size_t)n + 1;
    for (int k = 1; k < world; k++)
        for (int i = 0; i < n; i++) {
            int64_t v = all[(size_t)k * row + (size_t)i];
            int     q = 0; // the reference: rank 0, or the machine's first rank
            if (s[i].per_host) {
                while (all[(size_t)q * row + (size_t)n] != all[(size_t)k * row + (size_t)n])
                    q++;
                if ((v != 0) != (all[i] != 0)) // given on some ranks only: against rank 0
                    q = 0;
            }
            if (q != k && v != all[(size_t)q * row + (size_t)i]) {
                *at = i, *ref = q, *r = k;
                return true;
            }
        }
    return false;
}

dt_status dt_train_check_settings(dt_pg *pg, const dt_train_setting *s, int n) {
    if (!pg || n <= 0)
        return DT_OK;
    int      world = dt_pg_size(pg);
    size_t   row   = (size_t)n + 1; // the settings, then the host's hash
    int64_t *mine  = dt_alloc(sizeof(int64_t) * row);
    int64_t *all   = dt_alloc(sizeof(int64_t) * row * (size_t)world);
    char    *texts = NULL;
    if (!mine || !all) {
        dt_free(mine);
        dt_free(all);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        mine[i] = s[i].value;
    mine[n]      = host_hash();
    dt_status st = dt_pg_all_gather(pg, mine, all, row, DT_INT64);
    int       i, q, r;
    if (st == DT_OK && first_difference(s, n, world, all, &i, &q, &r)) {
        // Every rank found the same difference (they all hold the same table): a text is
        // then gathered from every rank to name both values.
        char v0[TEXT_MAX + 8], vr[TEXT_MAX + 8];
        if (s[i].is_text) {
            int64_t mine_text[TEXT_MAX / 8] = {0}; // bytes, moved as int64s
            snprintf((char *)mine_text, TEXT_MAX, "%s", s[i].text ? s[i].text : "");
            if (!(texts = dt_alloc_zero((size_t)TEXT_MAX * (size_t)world)))
                st = DT_ERR_NOMEM;
            if (st == DT_OK)
                st = dt_pg_all_gather(pg, mine_text, texts, TEXT_MAX / 8, DT_INT64);
        }
        if (st == DT_OK) {
            format_setting(&s[i], all[(size_t)q * row + (size_t)i],
                           texts ? texts + (size_t)q * TEXT_MAX : NULL, v0, sizeof v0);
            format_setting(&s[i], all[(size_t)r * row + (size_t)i],
                           texts ? texts + (size_t)r * TEXT_MAX : NULL, vr, sizeof vr);
            bool given =
                (all[(size_t)q * row + (size_t)i] != 0) == (all[(size_t)r * row + (size_t)i] != 0);
            if (s[i].per_host && given)
                st = dt_fail(DT_ERR_MISMATCH,
                             "%s must name the same folder on the ranks of one machine: rank %d "
                             "has %s, rank %d on the same machine has %s (other machines may "
                             "reach it under another path)",
                             s[i].flag, q, v0, r, vr);
            else if (s[i].per_host)
                st = dt_fail(DT_ERR_MISMATCH,
                             "%s must be given on every rank or on none: rank 0 has %s, rank "
                             "%d has %s",
                             s[i].flag, v0, r, vr);
            else
                st = dt_fail(DT_ERR_MISMATCH,
                             "%s must be the same on every rank: rank 0 has %s, rank %d has %s "
                             "(%s)",
                             s[i].flag, v0, r, vr,
                             s[i].is_hex ? "the ranks read different data: give every rank "
                                           "the same files"
                                         : "start every rank with the same flags");
        }
    }
    dt_free(mine);
    dt_free(all);
    dt_free(texts);
    return st;
}

// SIGTERM is blocked in every thread the program starts (they inherit the mask). Where
// it lands:
//   - a watcher thread (dt_train_preempt_watch) takes it with sigwait: while training is
//     armed it becomes a stop request for the next step boundary; otherwise the process
//     ends at once, by the signal, as it would without any of this (a rank stuck in its
//     rendezvous can still be stopped with kill);
//   - without a watcher (the parent of --num-processes), it stays pending for dt_spawn,
//     which forwards it to the workers;
//   - threads started before main (a BLAS library's pool) do not block it, and the
//     kernel may pick one of them: the handler passes it on to the target thread.
static pid_t      target_tid; // the watcher, else the main thread
static atomic_int armed, requested;

static void pass_on(int sig) {
    int saved = errno;
    syscall(SYS_tgkill, getpid(), target_tid, sig);
    errno = saved;
}

static void term_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
}

// Ends the process by SIGTERM from the calling thread (default action, unblocked).
static void die_by_sigterm(void) {
    sigset_t         set;
    struct sigaction act = {.sa_handler = SIG_DFL};
    term_set(&set);
    fflush(NULL);
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    pthread_kill(pthread_self(), SIGTERM);
    _exit(128 + SIGTERM); // not reached
}

void dt_train_preempt_block(void) {
    sigset_t set;
    term_set(&set);
    target_tid           = (pid_t)syscall(SYS_gettid);
    struct sigaction act = {.sa_handler = pass_on, .sa_flags = SA_RESTART};
    sigfillset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static atomic_int watcher_tid;

static void *watch(void *arg) {
    (void)arg;
    atomic_store(&watcher_tid, (int)syscall(SYS_gettid));
    sigset_t set;
    term_set(&set);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0 || sig != SIGTERM)
            continue;
        if (atomic_load(&armed)) {
            atomic_store(&requested, 1);
            // The release may have run between the two lines above: whoever takes the
            // request acts on it (sequentially consistent atomics: exactly one does).
            if (!atomic_load(&armed) && atomic_exchange(&requested, 0))
                die_by_sigterm();
        } else {
            die_by_sigterm();
        }
    }
    return NULL;
}

void dt_train_preempt_watch(void) {
    pthread_t      t;
    pthread_attr_t attr;
    atomic_store(&watcher_tid, 0);
    atomic_store(&armed, 0);
    atomic_store(&requested, 0);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, watch, NULL) == 0) {
        while (!atomic_load(&watcher_tid)) // microseconds: the thread's first statement
            sched_yield();
        target_tid = (pid_t)atomic_load(&watcher_tid);
    }
    pthread_attr_destroy(&attr);
}

void dt_train_preempt_arm(void) {
    atomic_store(&armed, 1);
}

bool dt_train_preempt_pending(void) {
    if (atomic_exchange(&requested, 0))
        return true;
    // Without a watcher the signal waits, blocked, for this thread.
    sigset_t set;
    term_set(&set);
    struct timespec zero = {0, 0};
    return sigtimedwait(&set, NULL, &zero) == SIGTERM;
}

dt_status dt_train_preempt_agree(dt_pg *pg, bool *stop) {
    int64_t flag = *stop || dt_train_preempt_pending();
    if (pg)
        DT_TRY(dt_pg_all_reduce(pg, &flag, &flag, 1, DT_INT64, DT_REDUCE_MAX));
    *stop = flag != 0;
    return DT_OK;
}

void dt_train_preempt_release(void) {
    atomic_store(&armed, 0);
    if (dt_train_preempt_pending())
        die_by_sigterm(); // came after the last step's agreement: as without a watcher
}

// The flags that change what a collective or a step computes, and the program's
// settings: every rank must have rank 0's values, checked once at start-up instead of a
// mismatch (or a silent difference) later.
dt_status dt_train_check_shared(dt_trainer *t) {
    if (!t->pg)
        return DT_OK;
    dt_train_setting s[2 * MAX_COMMON + MAX_SETTINGS + 2];
    char             names[2 * MAX_COMMON][72];
    int              n = 0;
    for (int k = 0; t->tables[k]; k++)
        for (const dt_flag *f = t->tables[k]; f->name && n < 2 * MAX_COMMON; f++) {
            if (!(f->flags & DT_FLAG_SHARED) || !f->target)
                continue;
            snprintf(names[n], sizeof names[n], "--%s", f->name);
            dt_train_setting x = {.flag = names[n]};
            if (f->type == DT_FLAG_BOOL)
                x.value = *(bool *)f->target, x.is_bool = true;
            else if (f->type == DT_FLAG_LONG)
                x.value = *(long *)f->target;
            else if (f->type == DT_FLAG_DOUBLE)
                memcpy(&x.value, f->target, sizeof x.value), x.is_double = true;
            else if (f->flags & DT_FLAG_SHARED_GIVEN)
                x.value = *(const char **)f->target != NULL, x.is_bool = true;
            else if (f->flags & DT_FLAG_SHARED_HOST) // the folder it names, per machine
                x.text = *(const char **)f->target, x.value = dt_train_path_hash(x.text),
                x.is_text = true, x.per_host = true;
            else // by its text: --cuts a,b and --cuts c are not the same model
                x.text = *(const char **)f->target, x.value = dt_train_text_hash(x.text),
                x.is_text = true;
            s[n++] = x;
        }
    // The resolved --invariant: its default follows the cores, so machines of different
    // sizes would otherwise sum gradients by different trees.
    s[n++] = (dt_train_setting){.flag  = "--invariant (its default follows the cores: give it "
                                         "explicitly on machines of different sizes)",
                                .value = t->inv_v};
    s[n++] =
        (dt_train_setting){.flag = "--max-rank-memory (in bytes)", .value = (int64_t)t->budget};
    for (int i = 0; i < t->nextra; i++)
        s[n++] = (dt_train_setting){
            .flag = t->extra[i].what, .value = t->extra[i].value, .is_hex = t->extra[i].hex};
    return dt_train_check_settings(t->pg, s, n);
}
