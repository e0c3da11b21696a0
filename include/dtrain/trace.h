// trace.h: a timeline recorder for training runs, written as one Chrome-trace JSON
// (chrome://tracing, https://ui.perfetto.dev) for all ranks.
//
// Recording is process-wide and off by default. While off, every instrumentation point
// costs one predictable branch on a global flag. While on, each thread appends complete
// spans (name, category, start, duration, one integer argument) to a buffer of its own:
// no lock and no allocation on the hot path except when a 4096-event chunk fills.
//
//     dt_trace_start(NULL);                       // every rank, before training
//     ... DT_TRACE_BEGIN(t); work(); DT_TRACE_END(t, "nn", "forward", "layer", i); ...
//     dt_trace_save(pg, "run.json");              // every rank: rank 0 writes the file
//
// Clocks: spans are stamped with CLOCK_MONOTONIC. dt_trace_save (pg given) measures each
// rank's offset to rank 0's clock (best of several broadcast rounds, see trace_out.c) and
// shifts that rank's spans by it, so all ranks share rank 0's time axis; time 0 is when
// rank 0 called dt_trace_start.
#ifndef DTRAIN_TRACE_H
#define DTRAIN_TRACE_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_pg dt_pg;

typedef struct dt_trace_opts {
    int64_t max_events; // per process, over all threads; later spans are counted, dropped.
                        // 0 = 4,000,000 (48 bytes each: about 190 MiB)
} dt_trace_opts;

DT_API dt_trace_opts dt_trace_opts_default(void);

// Starts recording on this process (clears what an earlier start recorded).
// DT_ERR_STATE when already recording.
DT_API dt_status dt_trace_start(const dt_trace_opts *opts);
// Stops recording; what was recorded stays until the next start or dt_trace_reset.
DT_API void dt_trace_stop(void);
// Stops and frees every buffer.
DT_API void dt_trace_reset(void);
// Names the calling thread in the trace ("main", "loader 0"); the string is copied.
DT_API void dt_trace_thread_name(const char *name);
// Spans kept and spans dropped (over max_events) since the last start.
DT_API void dt_trace_counts(int64_t *kept, int64_t *dropped);

// Records one span [t0_ns, now) of the calling thread. name, cat and arg_name must be
// string literals or otherwise outlive the trace (only the pointers are kept);
// arg_name NULL = no argument.
DT_API void dt_trace_span(const char *cat, const char *name, const char *arg_name, int64_t arg,
                          uint64_t t0_ns);

// Writes this process's spans as Chrome-trace event objects, separated by commas and
// without the enclosing brackets, into *out (malloc'd, *len bytes, NUL-terminated):
// pid = rank, tid = the thread's number in this process, process name
// "rank N (host)", thread names; timestamps shifted by offset_ns (added to this
// process's clock to get rank 0's) and given relative to origin_ns (on rank 0's clock).
DT_API dt_status dt_trace_serialize(int rank, int64_t offset_ns, uint64_t origin_ns, char **out,
                                    size_t *len);
// This process's dt_trace_start time (CLOCK_MONOTONIC ns); 0 before the first start.
DT_API uint64_t dt_trace_origin(void);

// Collective over pg (NULL = this process alone): stops recording, aligns the ranks'
// clocks to rank 0, sends every rank's spans to rank 0, and rank 0 writes
// {"traceEvents": [...], "displayTimeUnit": "ms"} to path (via a temporary file and a
// rename). path is read on rank 0 only. Every rank must call it.
DT_API dt_status dt_trace_save(dt_pg *pg, const char *path);

// ------------------------------------------------------------ instrumentation points

// The flag the macros test: read relaxed, set by dt_trace_start/stop.
extern DT_API int dt_trace_on_;

#define DT_TRACE_ON() __builtin_expect(__atomic_load_n(&dt_trace_on_, __ATOMIC_RELAXED), 0)
// Declares `uint64_t var`: the start time when tracing, else 0.
#define DT_TRACE_BEGIN(var) uint64_t var = DT_TRACE_ON() ? dt_now_ns() : 0
// Ends the span begun by DT_TRACE_BEGIN(var) (nothing when it was not recording).
#define DT_TRACE_END(var, cat, name, arg_name, arg)                                                \
    do {                                                                                           \
        if (__builtin_expect((var) != 0, 0))                                                       \
            dt_trace_span((cat), (name), (arg_name), (int64_t)(arg), (var));                       \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif // DTRAIN_TRACE_H
