// dt_trace_save: aligns the ranks' clocks, gathers every rank's spans on rank 0 and
// writes one Chrome-trace JSON file.
//
// Clock alignment (NTP's idea over the process group): for each rank r > 0, in turn,
// ALIGN_ROUNDS ping-pongs: r reads t1 and sends a ping to rank 0; rank 0 answers with
// its clock t0; r reads t2 on arrival. Rank 0's reading lies in [t1, t2] of r's clock,
// so offset = t0 - (t1 + t2) / 2 is off by at most (t2 - t1) / 2; the round with the
// smallest t2 - t1 is kept. On one host CLOCK_MONOTONIC is shared and the offset comes
// out within a few microseconds of 0; across hosts it removes the boot-time difference.
#include "dtrain/comm.h"
#include "dtrain/trace.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN_ROUNDS  8
#define TAG_ALIGN     0x7472
#define TAG_DATA      0x7473
#define MAX_PART_SIZE ((int64_t)1 << 34) // 16 GiB: more than max_events can produce

static dt_status align_clock(dt_pg *pg, int rank, int world, int64_t *offset) {
    *offset = 0;
    for (int r = 1; r < world; r++) {
        int64_t best_rtt = INT64_MAX;
        for (int k = 0; k < ALIGN_ROUNDS; k++) {
            int64_t ping = k, t0 = 0;
            if (rank == 0) {
                DT_TRY(dt_pg_recv(pg, &ping, 1, DT_INT64, r, TAG_ALIGN));
                t0 = (int64_t)dt_now_ns();
                DT_TRY(dt_pg_send(pg, &t0, 1, DT_INT64, r, TAG_ALIGN));
            } else if (rank == r) {
                int64_t t1 = (int64_t)dt_now_ns();
                DT_TRY(dt_pg_send(pg, &ping, 1, DT_INT64, 0, TAG_ALIGN));
                DT_TRY(dt_pg_recv(pg, &t0, 1, DT_INT64, 0, TAG_ALIGN));
                int64_t t2 = (int64_t)dt_now_ns();
                if (t2 - t1 < best_rtt) {
                    best_rtt = t2 - t1;
                    *offset  = t0 - (t1 + (t2 - t1) / 2);
                }
            }
        }
    }
    return DT_OK;
}

static dt_status write_all(FILE *f, const char *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n)
        return dt_fail_errno(DT_ERR_IO, "trace: writing %zu bytes to %s", n, path);
    return DT_OK;
}

// Rank 0: the file, its part first, then each other rank's in rank order.
// Keeps the first failure and its message (later receives clear the thread's error).
static void keep(dt_status *st, char *msg, size_t n, dt_status s) {
    if (!*st && s) {
        *st = s;
        snprintf(msg, n, "%s", dt_last_error());
    }
}

static dt_status gather_write(dt_pg *pg, int world, const char *mine, size_t len,
                              const char *path) {
    // A failure here still receives every part (and drops it): no sender is left waiting.
    char      tmp[4096] = "";
    FILE     *f         = NULL;
    dt_status st        = DT_OK;
    char      msg[1024] = "";
#define KEEP(s) keep(&st, msg, sizeof msg, (s))
    int k = path ? snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) : 0;
    if (!path || !path[0])
        KEEP(dt_fail(DT_ERR_ARG, "trace: expected a file name to write the trace to"));
    else if (k < 0 || (size_t)k >= sizeof tmp)
        KEEP(dt_fail(DT_ERR_ARG, "trace: expected a path under %zu bytes, found %zu bytes",
                     sizeof tmp - 16, strlen(path)));
    else if (!(f = fopen(tmp, "wb")))
        KEEP(dt_fail_errno(DT_ERR_IO, "trace: cannot create %s", tmp));
    static const char head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    if (!st)
        KEEP(write_all(f, head, sizeof head - 1, tmp));
    if (!st)
        KEEP(write_all(f, mine, len, tmp));
    for (int r = 1; r < world; r++) {
        int64_t   n  = 0;
        dt_status rs = dt_pg_recv(pg, &n, 1, DT_INT64, r, TAG_DATA);
        if (rs) {
            KEEP(rs);
            break;
        }
        if (n < 0 || n > MAX_PART_SIZE) {
            KEEP(dt_fail(DT_ERR_FORMAT,
                         "trace: expected a part of 0..%lld bytes from rank %d, found %lld",
                         (long long)MAX_PART_SIZE, r, (long long)n));
            break;
        }
        size_t words = ((size_t)n + 3) / 4;
        char  *part  = malloc(words * 4 + 1);
        if (!part) {
            KEEP(dt_fail(DT_ERR_NOMEM, "trace: %lld bytes for rank %d's part", (long long)n, r));
            break;
        }
        rs = dt_pg_recv(pg, part, words, DT_INT32, r, TAG_DATA);
        if (rs) {
            free(part);
            KEEP(rs);
            break;
        }
        if (memchr(part, 0, (size_t)n)) {
            KEEP(dt_fail(DT_ERR_FORMAT, "trace: rank %d's part holds a NUL byte", r));
        } else if (!st && n) {
            KEEP(write_all(f, ",\n", 2, tmp));
            if (!st)
                KEEP(write_all(f, part, (size_t)n, tmp));
        }
        free(part);
    }
    if (f && !st)
        KEEP(write_all(f, "\n]}\n", 4, tmp));
    if (f && fclose(f) != 0)
        KEEP(dt_fail_errno(DT_ERR_IO, "trace: closing %s", tmp));
    if (f && !st && rename(tmp, path) != 0)
        KEEP(dt_fail_errno(DT_ERR_IO, "trace: renaming %s to %s", tmp, path));
    if (f && st)
        unlink(tmp);
#undef KEEP
    return st ? dt_fail(st, "%s", msg) : DT_OK;
}

dt_status dt_trace_save(dt_pg *pg, const char *path) {
    dt_trace_stop();
    int     rank = pg ? dt_pg_rank(pg) : 0, world = pg ? dt_pg_size(pg) : 1;
    int64_t offset = 0;
    if (pg)
        DT_TRY(align_clock(pg, rank, world, &offset));
    // Time 0: the earliest start over the ranks, on rank 0's clock.
    int64_t start = dt_trace_origin() ? (int64_t)dt_trace_origin() + offset : INT64_MAX;
    if (pg)
        DT_TRY(dt_pg_all_reduce(pg, &start, &start, 1, DT_INT64, DT_REDUCE_MIN));
    if (start == INT64_MAX)
        start = 0;
    char  *mine = NULL;
    size_t len  = 0;
    DT_TRY(dt_trace_serialize(rank, offset, (uint64_t)start, &mine, &len));
    dt_status st = DT_OK;
    if (rank == 0) {
        st = gather_write(pg, world, mine, len, path);
    } else {
        int64_t n = (int64_t)len;
        st        = dt_pg_send(pg, &n, 1, DT_INT64, 0, TAG_DATA);
        if (!st) {
            size_t words = (len + 3) / 4;
            char  *pad   = realloc(mine, words * 4 + 1);
            if (!pad) {
                st = dt_fail(DT_ERR_NOMEM, "trace: %zu bytes to send", words * 4);
            } else {
                mine = pad;
                memset(mine + len, ' ', words * 4 - len);
                st = dt_pg_send(pg, mine, words, DT_INT32, 0, TAG_DATA);
            }
        }
    }
    free(mine);
    // Rank 0's verdict, so every rank returns the same status.
    if (pg) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", st ? dt_last_error() : "");
        int32_t   ok = st == DT_OK;
        dt_status bs = dt_pg_broadcast(pg, &ok, 1, DT_INT32, 0);
        if (st)
            return dt_fail(st, "%s", msg); // the broadcast cleared the thread's message
        if (bs)
            return bs;
        if (!ok)
            return dt_fail(DT_ERR_PEER, "trace: rank 0 could not write the trace to the file");
    }
    return st;
}
