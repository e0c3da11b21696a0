// shm_init.c: the shared-memory engine's segment (shm.h): its layout (header, a slot
// per rank, a channel per ordered pair, the working buffers), created by rank 0 in
// /dev/shm and attached by the others (init words watched with pidfds so that a rank that
// dies while attaching is named), and freeing it. The operations are in shm.c.
#include "comm/shm/shm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

// ------------------------------------------------------------------ init and free

int dt_shm_rank(const dt_shm *s) {
    return s->rank;
}
int dt_shm_world(const dt_shm *s) {
    return s->world;
}
size_t dt_shm_chunk_bytes(const dt_shm *s) {
    return s->chunk;
}

static size_t round_up(size_t a, size_t m) {
    return (a + m - 1) / m * m;
}

typedef struct shm_plan {
    size_t chunk, small, pchunk;
    size_t slots_off, chans_off, bufs_off, pbufs_off, total;
} shm_plan;

static dt_status plan_layout(int world, size_t chunk, size_t small, shm_plan *p) {
    // A chunk holds world slots of at least 64 bytes and is whole pages.
    size_t min_chunk = round_up((size_t)world * 64, 4096);
    p->chunk         = round_up(chunk < min_chunk ? min_chunk : chunk, 4096);
    p->small         = small;
    // Channels: world^2 of them with two buffers each; keep their total near 4 MiB.
    size_t w2    = (size_t)world * (size_t)world;
    size_t pc    = ((size_t)4 << 20) / (2 * w2);
    pc           = pc < 4096 ? 4096 : pc & ~(size_t)4095;
    p->pchunk    = pc > p->chunk ? p->chunk : pc;
    p->slots_off = 4096;
    p->chans_off = round_up(p->slots_off + sizeof(shm_slot) * (size_t)world, 4096);
    p->bufs_off  = round_up(p->chans_off + sizeof(shm_chan) * w2, 4096);
    size_t bufs, pbufs;
    if (!dt_size_mul(&bufs, (size_t)world * NBUF, p->chunk) ||
        !dt_size_mul(&pbufs, w2 * 2, sizeof(shm_msg) + p->pchunk) ||
        !dt_size_add(&p->pbufs_off, p->bufs_off, bufs) ||
        !dt_size_add(&p->total, p->pbufs_off, pbufs))
        return dt_fail(DT_ERR_ARG, "shm: segment for world %d and chunk %zu overflows", world,
                       chunk);
    p->total = round_up(p->total, 4096);
    return DT_OK;
}

static void map_views(dt_shm *s) {
    shm_header *h = s->hdr;
    s->slots      = (shm_slot *)(void *)(s->base + h->slots_off);
    s->chans      = (shm_chan *)(void *)(s->base + h->chans_off);
    s->bufs       = s->base + h->bufs_off;
    s->pbufs      = s->base + h->pbufs_off;
    s->chunk      = h->chunk_bytes;
    s->small      = h->small_bytes;
    s->pchunk     = h->p2p_bytes;
}

// Sleeps on the init words (attached / ready), watching `watch` ranks for death.
static dt_status init_wait(dt_shm *s, shm_word *w, uint32_t target, uint64_t deadline,
                           const char *what) {
    for (;;) {
        uint32_t v = atomic_load_explicit(&w->value, memory_order_acquire);
        if (reached(v, target))
            return DT_OK;
        if (atomic_load(&s->hdr->abort_state) == 2)
            return dt_fail((dt_status)s->hdr->abort_status, "shm init: %s", s->hdr->abort_msg);
        if (s->aborted && s->aborted(s->aborted_arg))
            return dt_fail(DT_ERR_STATE, "shm init: interrupted: the group was aborted");
        // Open pidfds for ranks that appeared since the last look.
        for (int r = 0; r < s->world; r++) {
            int pid = atomic_load(&s->slots[r].pid);
            if (r != s->rank && s->pidfds[r] < 0 && pid > 0) {
                s->pidfds[r] = dt_pidfd_open(pid);
                if (s->pidfds[r] < 0 && errno == ESRCH)
                    return dt_fail(DT_ERR_PEER,
                                   "shm init: rank %d (process %d) died while "
                                   "the group was attaching",
                                   r, pid);
            }
        }
        int dead = dt_shm_exited_peer(s, 0);
        if (dead >= 0)
            return dt_fail(DT_ERR_PEER,
                           "shm init: rank %d (process %d) died while the group "
                           "was attaching",
                           dead, (int)atomic_load(&s->slots[dead].pid));
        uint64_t now = dt_now_ns();
        if (deadline != UINT64_MAX && now >= deadline) {
            char   who[256];
            size_t at = 0;
            who[0]    = '\0';
            for (int r = 0; r < s->world && at < sizeof who - 16; r++)
                if (atomic_load(&s->slots[r].pid) == 0)
                    at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", at ? ", " : "", r);
            return dt_fail(DT_ERR_TIMEOUT,
                           "shm init: timed out waiting for %s (ranks not "
                           "attached: %s)",
                           what, who[0] ? who : "none");
        }
        atomic_fetch_add(&w->waiters, 1);
        if (!reached(atomic_load(&w->value), target)) {
            int64_t slice = 20 * 1000000;
            if (deadline != UINT64_MAX && (int64_t)(deadline - now) < slice)
                slice = (int64_t)(deadline - now);
            futex_wait(&w->value, v, slice);
        }
        atomic_fetch_sub(&w->waiters, 1);
    }
}

// A size setting whose 0 (the table's default) means `def`.
static dt_status env_size(const char *name, size_t def, size_t *out) {
    long v;
    DT_TRY(dt_setting_int(name, &v));
    *out = v > 0 ? (size_t)v : def;
    return DT_OK;
}

static size_t default_chunk(int world) {
    size_t def_chunk = DEFAULT_CHUNK_BYTES;
    if (def_chunk * NBUF * (size_t)world > MAX_DEFAULT_BUFS)
        def_chunk = MAX_DEFAULT_BUFS / (NBUF * (size_t)world);
    return def_chunk;
}

size_t dt_shm_segment_bytes(int world) {
    size_t   chunk;
    shm_plan p = {0};
    if (world < 1 || env_size("DT_SHM_CHUNK_BYTES", default_chunk(world), &chunk) != DT_OK ||
        plan_layout(world, chunk, DEFAULT_SMALL_BYTES, &p) != DT_OK) {
        dt_clear_error();
        return 0;
    }
    return p.total;
}

static dt_status shm_init_impl(const dt_shm_opts *o, dt_shm *s, int *fd_out) {
    int      fd       = -1;
    uint64_t deadline = o->deadline_ns;
    size_t   want_chunk, want_small;
    DT_TRY(env_size("DT_SHM_CHUNK_BYTES", o->chunk_bytes ? o->chunk_bytes : default_chunk(o->world),
                    &want_chunk));
    DT_TRY(env_size("DT_SHM_SMALL_BYTES", o->small_bytes ? o->small_bytes : DEFAULT_SMALL_BYTES,
                    &want_small));
    if (o->rank == 0) {
        shm_plan p = {0};
        DT_TRY(plan_layout(o->world, want_chunk, want_small, &p));
        // Free space first: a segment that cannot fit is refused before anything is
        // created (fallocate below still catches a race with another job).
        struct statvfs fs;
        if (statvfs("/dev/shm", &fs) == 0 &&
            (double)p.total > (double)fs.f_bavail * (double)fs.f_frsize)
            return dt_fail(DT_ERR_IO,
                           "shm: /dev/shm has %.1f MiB free, the segment of %d ranks needs %.1f "
                           "MiB (use fewer processes, lower DT_SHM_CHUNK_BYTES, the tcp backend, "
                           "or enlarge /dev/shm)",
                           (double)fs.f_bavail * (double)fs.f_frsize / 1048576.0, o->world,
                           (double)p.total / 1048576.0);
        fd = shm_open(o->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot create segment /dev/shm%s", o->name);
        *fd_out = fd;
        if (ftruncate(fd, (off_t)p.total) != 0)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot size segment /dev/shm%s to %zu bytes",
                                 o->name, p.total);
        // Reserve the pages now: a full /dev/shm then fails here with a message instead
        // of killing a process with SIGBUS in the middle of a collective.
        int e = posix_fallocate(fd, 0, (off_t)p.total);
        if (e != 0) {
            struct statvfs v;
            double         avail = statvfs("/dev/shm", &v) == 0
                                       ? (double)v.f_bavail * (double)v.f_frsize / 1048576.0
                                       : -1.0;
            errno                = e;
            return dt_fail_errno(DT_ERR_IO,
                                 "shm: /dev/shm cannot hold the %.1f MiB segment "
                                 "(%.1f MiB free; lower DT_SHM_CHUNK_BYTES or enlarge "
                                 "/dev/shm)",
                                 (double)p.total / 1048576.0, avail);
        }
        void *m = mmap(NULL, p.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot map %zu bytes of /dev/shm%s", p.total,
                                 o->name);
        s->base       = m;
        s->seg_bytes  = p.total;
        shm_header *h = s->hdr = m;
        h->version             = SHM_VERSION;
        h->world               = (uint32_t)o->world;
        h->nonce               = o->nonce;
        h->seg_bytes           = p.total;
        h->chunk_bytes         = p.chunk;
        h->small_bytes         = p.small;
        h->p2p_bytes           = p.pchunk;
        h->slots_off           = p.slots_off;
        h->chans_off           = p.chans_off;
        h->bufs_off            = p.bufs_off;
        h->pbufs_off           = p.pbufs_off;
        map_views(s);
        atomic_store(&s->slots[0].pid, (int32_t)getpid());
        atomic_store(&h->attached.value, 1);
        atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
        return DT_OK;
    }
    // Other ranks: the name may not exist yet (rank 0 still creating it) when the
    // caller did not wait for rank 0 to publish it.
    unsigned sleep_us = 200;
    for (;;) {
        fd = shm_open(o->name, O_RDWR | O_CLOEXEC, 0);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= 4096) {
                void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
                if (m == MAP_FAILED)
                    return dt_fail_errno(DT_ERR_IO, "shm: cannot map /dev/shm%s", o->name);
                const shm_header *h = m;
                uint64_t          magic =
                    atomic_load_explicit(&((shm_header *)m)->magic, memory_order_acquire);
                if (magic == SHM_MAGIC) {
                    shm_header copy;
                    memcpy(&copy, h, sizeof copy);
                    munmap(m, 4096);
                    if (copy.version != SHM_VERSION || copy.world != (uint32_t)o->world ||
                        (o->nonce && copy.nonce != o->nonce) ||
                        copy.seg_bytes != (uint64_t)st.st_size) {
                        close(fd);
                        return dt_fail(DT_ERR_MISMATCH,
                                       "shm: segment /dev/shm%s is not this group's: expected "
                                       "version %u, world %d, nonce %016llx, found version %u, "
                                       "world %u, nonce %016llx (%llu of %lld bytes)",
                                       o->name, SHM_VERSION, o->world, (unsigned long long)o->nonce,
                                       copy.version, copy.world, (unsigned long long)copy.nonce,
                                       (unsigned long long)copy.seg_bytes, (long long)st.st_size);
                    }
                    void *full =
                        mmap(NULL, copy.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                    if (full == MAP_FAILED) {
                        close(fd);
                        return dt_fail_errno(DT_ERR_IO,
                                             "shm: cannot map %llu bytes of "
                                             "/dev/shm%s",
                                             (unsigned long long)copy.seg_bytes, o->name);
                    }
                    *fd_out      = fd;
                    s->base      = full;
                    s->seg_bytes = copy.seg_bytes;
                    s->hdr       = full;
                    map_views(s);
                    atomic_store(&s->slots[o->rank].pid, (int32_t)getpid());
                    atomic_fetch_add(&s->hdr->attached.value, 1);
                    futex_wake(&s->hdr->attached.value);
                    return DT_OK;
                }
                munmap(m, 4096);
            }
            close(fd);
        } else if (errno != ENOENT) {
            return dt_fail_errno(DT_ERR_IO, "shm: cannot open segment /dev/shm%s", o->name);
        } else if (o->must_exist) {
            return dt_fail(DT_ERR_UNSUPPORTED,
                           "shm init: segment /dev/shm%s, created by rank 0, "
                           "does not exist for rank %d: the ranks do not "
                           "share /dev/shm (separate containers?); use "
                           "backend \"tcp\"",
                           o->name, o->rank);
        }
        if (dt_now_ns() >= deadline)
            return dt_fail(DT_ERR_TIMEOUT,
                           "shm init: rank %d timed out waiting for rank 0 to "
                           "create segment /dev/shm%s",
                           o->rank, o->name);
        usleep(sleep_us);
        if (sleep_us < 10000)
            sleep_us *= 2;
    }
}

dt_status dt_shm_init(const dt_shm_opts *o, dt_shm **out) {
    *out = NULL;
    if (!o || o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return dt_fail(DT_ERR_ARG, "shm init: expected 0 <= rank < world, found rank %d, world %d",
                       o ? o->rank : -1, o ? o->world : -1);
    if (!o->name || o->name[0] != '/' || strchr(o->name + 1, '/') || strlen(o->name) > 200)
        return dt_fail(DT_ERR_ARG,
                       "shm init: expected a segment name like \"/dtrain-x\", "
                       "found \"%s\"",
                       o->name ? o->name : "(null)");
    dt_shm *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return dt_last_status();
    s->rank    = o->rank;
    s->world   = o->world;
    size_t w   = (size_t)o->world;
    s->pidfds  = dt_alloc(sizeof(int) * w);
    s->sent    = dt_alloc_zero(sizeof(uint32_t) * w);
    s->pending = dt_alloc_zero(sizeof(shm_pending *) * w);
    s->in      = dt_alloc(sizeof(void *) * w);
    s->taken   = dt_alloc_zero(sizeof(uint32_t) * w);
    s->xs_head = dt_alloc_zero(sizeof(dt_xfer *) * 4 * w); // xs_head, xs_tail, xr_head, xr_tail
    if (!s->pidfds || !s->sent || !s->taken || !s->pending || !s->in || !s->xs_head) {
        dt_shm_free(s);
        return DT_ERR_NOMEM;
    }
    s->xs_tail = s->xs_head + w;
    s->xr_head = s->xs_head + 2 * w;
    s->xr_tail = s->xs_head + 3 * w;
    for (int r = 0; r < o->world; r++) {
        s->pidfds[r] = -1;
        if (o->pids && r != o->rank && o->pids[r] > 0)
            s->pidfds[r] = dt_pidfd_open(o->pids[r]);
    }
    // 1 ms of spinning and yielding before sleeping: longer than a futex wake-up on a
    // VM (tens of microseconds, which would otherwise be paid at every step), short
    // enough not to matter when a peer is really late.
    // (The table's default DT_SHM_SPIN_US is 1000.)
    long      spin_us = 0;
    dt_status st      = dt_setting_int("DT_SHM_SPIN_US", &spin_us);
    s->spin_ns        = spin_us * 1000;
    // More ranks than CPUs: some peer is always descheduled, so yield from the start.
    long yield_us = -1; // -1, the default: automatic
    if (st == DT_OK)
        st = dt_setting_int("DT_SHM_YIELD_AFTER_US", &yield_us);
    if (yield_us < 0)
        yield_us = o->world > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 50;
    s->yield_ns = yield_us * 1000;
    // Non-temporal stores for results of at least DT_SHM_NT_KIB: off by default, since
    // plain stores were as fast or faster at every size here, in place or not (A/B in
    // docs/shm.md); kept as a knob for machines where writing around the cache pays.
    long nt_kib = 0;
    if (st == DT_OK)
        st = dt_setting_int("DT_SHM_NT_KIB", &nt_kib);
    s->nt_bytes = nt_kib > 0 ? (size_t)nt_kib << 10 : SIZE_MAX;
    int fd      = -1;
    if (st == DT_OK)
        st = shm_init_impl(o, s, &fd);
    s->aborted     = o->aborted;
    s->aborted_arg = o->aborted_arg;
    s->push        = o->push;
    s->push_arg    = o->push_arg;
    if (st == DT_OK && o->rank == 0 && o->created)
        st = o->created(o->created_arg);
    if (st == DT_OK) {
        uint64_t deadline = o->deadline_ns;
        if (o->rank == 0) {
            st = init_wait(s, &s->hdr->attached, (uint32_t)o->world, deadline,
                           "every rank to map the segment");
            if (st == DT_OK) {
                shm_unlink(o->name);
                word_set(&s->hdr->ready, 1);
            }
        } else {
            st = init_wait(s, &s->hdr->ready, 1, deadline, "rank 0 to finish setting up");
        }
    }
    if (fd >= 0)
        close(fd);
    if (st != DT_OK) {
        // Rank 0 owns the name; another rank removes it only when rank 0 is gone or late,
        // never when the segment belongs to someone else (a mismatch).
        if (o->rank == 0 || st == DT_ERR_TIMEOUT || st == DT_ERR_PEER)
            shm_unlink(o->name);
        if (s->hdr && s->slots && st != DT_ERR_MISMATCH) {
            char msg[400];
            snprintf(msg, sizeof msg, "rank %d failed while attaching: %s", o->rank,
                     dt_last_error());
            dt_shm_publish_abort(s, st, o->rank, msg);
        }
        dt_status keep = st;
        char      msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_shm_free(s);
        return dt_fail(keep, "%s", msg);
    }
    for (int r = 0; r < o->world; r++) {
        if (r == o->rank || s->pidfds[r] >= 0)
            continue;
        s->pidfds[r] = dt_pidfd_open(atomic_load(&s->slots[r].pid));
        if (s->pidfds[r] < 0 && errno != ESRCH)
            DT_WARN("comm",
                    "shm: cannot watch rank %d (pidfd_open: %s); its death will only "
                    "show as a timeout",
                    r, strerror(errno));
    }
    // Children forked later (data loader workers) do not inherit the mapping.
    madvise(s->base, s->seg_bytes, MADV_DONTFORK);
    s->last_check_ns = dt_now_ns();
    *out             = s;
    return DT_OK;
}

void dt_shm_free(dt_shm *s) {
    if (!s)
        return;
    if (s->base) {
        if (s->slots) {
            atomic_store(&s->slots[s->rank].departed, 1);
            dt_shm_wake_everyone(s); // whoever sleeps on us re-checks and sees we left
        }
        munmap(s->base, s->seg_bytes);
    }
    if (s->pidfds)
        for (int r = 0; r < s->world; r++)
            if (s->pidfds[r] >= 0)
                close(s->pidfds[r]);
    dt_free(s->pidfds);
    dt_free(s->sent);
    for (int r = 0; s->pending && r < s->world; r++)
        while (s->pending[r]) {
            shm_pending *m = s->pending[r];
            s->pending[r]  = m->next;
            dt_free(m->data);
            dt_free(m);
        }
    dt_free(s->pending);
    dt_free(s->in);
    dt_free(s->taken);
    dt_free(s->xs_head);
    dt_free(s);
}
