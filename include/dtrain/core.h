// core.h: status codes and error messages, logging, allocation, clocks and
// environment parsing. Every other module builds on these; this one needs libc only.
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_API                      __attribute__((visibility("default")))
#define DT_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))

#define DT_VERSION_MAJOR  0
#define DT_VERSION_MINOR  1
#define DT_VERSION_PATCH  0
#define DT_VERSION_STRING "0.1.0"

// ---------------------------------------------------------------------------- errors

// Every fallible call returns a dt_status; DT_OK is 0 so `if (st)` reads as "failed".
typedef enum dt_status {
    DT_OK = 0,
    DT_ERR_ARG,         // the caller passed something invalid
    DT_ERR_NOMEM,       // an allocation failed
    DT_ERR_IO,          // a system call failed; the message carries strerror
    DT_ERR_FORMAT,      // bad, truncated or corrupt file or wire message
    DT_ERR_TIMEOUT,     // a wait ran out of time
    DT_ERR_PEER,        // a peer rank died or closed its connection
    DT_ERR_MISMATCH,    // ranks disagree (size, dtype, op, world size, shapes)
    DT_ERR_UNSUPPORTED, // valid request this build or backend cannot do
    DT_ERR_STATE,       // the call is not valid now (after abort, before init)
    DT_ERR_INTERNAL,    // a bug in dtrain
    DT_STATUS_COUNT_
} dt_status;

// Short name of a status ("DT_ERR_FORMAT"); never NULL.
DT_API const char *dt_status_str(dt_status s);

// The message of the last failure recorded on this thread ("" if none). The
// pointer stays valid until the next dt_fail* on the same thread.
DT_API const char *dt_last_error(void);
DT_API dt_status   dt_last_status(void);
DT_API void        dt_clear_error(void);

// Records `s` with a printf-formatted message on this thread and returns `s`, so an
// error path is one line: `return dt_fail(DT_ERR_FORMAT, "%s: expected ..., found ...", ...)`.
DT_API dt_status dt_fail(dt_status s, const char *fmt, ...) DT_PRINTF(2, 3);
DT_API dt_status dt_failv(dt_status s, const char *fmt, va_list ap);
// Same, appending ": <strerror(errno)>" with the errno seen at entry.
DT_API dt_status dt_fail_errno(dt_status s, const char *fmt, ...) DT_PRINTF(2, 3);
// Prefixes the recorded message with "<context>: " and returns the recorded status;
// used where a caller adds what it was doing to a callee's message.
DT_API dt_status dt_fail_context(const char *fmt, ...) DT_PRINTF(1, 2);

// Returns the status of `expr` from the enclosing function when it failed.
#define DT_TRY(expr)                                                                               \
    do {                                                                                           \
        dt_status dt_try_s_ = (expr);                                                              \
        if (dt_try_s_ != DT_OK)                                                                    \
            return dt_try_s_;                                                                      \
    } while (0)

// Bugs, not errors: abort with file:line and the expression. Never for user input,
// files or peers. DT_DEBUG_ASSERT compiles away unless DT_DEBUG_BUILD is defined
// (BUILD=debug).
DT_API __attribute__((noreturn)) void dt_assert_fail(const char *file, int line, const char *expr);
#define DT_ASSERT(cond) ((cond) ? (void)0 : dt_assert_fail(__FILE__, __LINE__, #cond))
#ifdef DT_DEBUG_BUILD
#define DT_DEBUG_ASSERT(cond) DT_ASSERT(cond)
#else
#define DT_DEBUG_ASSERT(cond) ((void)0)
#endif

// --------------------------------------------------------------------------- logging

typedef enum dt_log_level {
    DT_LOG_DEBUG,
    DT_LOG_INFO,
    DT_LOG_WARN,
    DT_LOG_ERROR,
    DT_LOG_OFF,
} dt_log_level;

typedef void (*dt_log_sink)(dt_log_level level, const char *line, void *user);

// Writes one line to stderr (or the sink), prefixed "[dtrain r<rank>/<world> <module>
// +<seconds>s] ". The level threshold comes from DT_LOG_LEVEL=debug|info|warn|error|off
// (default warn) unless dt_log_set_level was called. Thread-safe; one write(2) a line.
DT_API void dt_log(dt_log_level level, const char *module, const char *fmt, ...) DT_PRINTF(3, 4);
DT_API void dt_log_set_level(dt_log_level level);
DT_API dt_log_level dt_log_get_level(void);
DT_API bool         dt_log_enabled(dt_log_level level);
// Rank and world size shown in the prefix; (-1, -1) hides them (the default).
DT_API void dt_log_set_rank(int rank, int world);
// NULL restores stderr.
DT_API void dt_log_set_sink(dt_log_sink sink, void *user);

#define DT_DEBUG(mod, ...) dt_log(DT_LOG_DEBUG, mod, __VA_ARGS__)
#define DT_INFO(mod, ...)  dt_log(DT_LOG_INFO, mod, __VA_ARGS__)
#define DT_WARN(mod, ...)  dt_log(DT_LOG_WARN, mod, __VA_ARGS__)
#define DT_ERROR(mod, ...) dt_log(DT_LOG_ERROR, mod, __VA_ARGS__)

// ----------------------------------------------------------------------------- clock

// Monotonic time (CLOCK_MONOTONIC) in nanoseconds and seconds.
DT_API uint64_t dt_now_ns(void);
DT_API double   dt_now(void);
// Monotonic deadline `timeout_ms` from now, in ns; timeout_ms < 0 means never.
DT_API uint64_t dt_deadline_ns(int64_t timeout_ms);
// Milliseconds left until `deadline_ns` (0 when past; INT32_MAX-ish when never).
DT_API int dt_ms_left(uint64_t deadline_ns);

// ------------------------------------------------------------------------- processes

// A pidfd for process `pid` (Linux >= 5.3, close-on-exec): poll() finds it readable
// (POLLIN) once the process has ended, whoever its parent is. -1 with errno set: ESRCH
// when no such process exists (it already ended), ENOSYS on an older kernel. The one
// place dtrain opens pidfds: the process supervisor (dt_procs, launch.h: the workers of
// dt_spawn and of dtrun) and the shm backend's watch on its peers.
DT_API int dt_pidfd_open(int pid);

// ------------------------------------------------------------------------- allocation

// 64-byte aligned allocation. Returns NULL and records DT_ERR_NOMEM naming the size
// on failure (also when the test hook DT_FAIL_ALLOC_AFTER=N says so: the N+1th
// allocation of the process fails). nbytes == 0 returns a valid unique pointer.
DT_API void *dt_alloc(size_t nbytes);
DT_API void *dt_alloc_zero(size_t nbytes);
DT_API void  dt_free(void *p); // NULL is a no-op
// Live allocation count and bytes through dt_alloc (for tests that assert a steady
// state allocates nothing).
DT_API size_t dt_alloc_live_count(void);
DT_API size_t dt_alloc_total_count(void);

// Page-backed blocks (parameters, gradients, optimizer state): zeroed, page-aligned,
// mapped from the system, so a page costs memory only once written. dt_discard zeroes
// [p, p + nbytes) and gives the whole pages inside back (MADV_DONTNEED: they read as
// zeros and cost nothing until written again); use it only on private memory this
// process writes (a dt_alloc_pages block or a dt_alloc block). dt_resident_bytes: the
// bytes of the resident pages that [p, p + nbytes) touches (mincore).
DT_API void  *dt_alloc_pages(size_t nbytes);         // NULL and DT_ERR_NOMEM on failure
DT_API void   dt_free_pages(void *p, size_t nbytes); // the same nbytes; NULL is a no-op
DT_API void   dt_discard(void *p, size_t nbytes);
DT_API size_t dt_resident_bytes(const void *p, size_t nbytes);
DT_API size_t dt_page_bytes(void);

// Overflow-checked size arithmetic for untrusted numbers: return false on overflow.
static inline bool dt_size_mul(size_t *out, size_t a, size_t b) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool dt_size_add(size_t *out, size_t a, size_t b) {
    return !__builtin_add_overflow(a, b, out);
}

// Duplicates a string with dt_alloc (free with dt_free); NULL on failure.
DT_API char *dt_strdup(const char *s);

// ------------------------------------------------------------------------ environment

// Reads integer environment variable `name` into *out. Unset or empty: *out = def and
// DT_OK. Set but not an integer in [lo, hi]: DT_ERR_ARG naming the variable, the
// expected range and what was found.
DT_API dt_status dt_env_int(const char *name, long lo, long hi, long def, long *out);
// Parses a whole string as an integer in [lo, hi]; `what` names it in the message
// ("--batch-size expects an integer in [1, 65536], found \"abc\"").
DT_API dt_status dt_parse_long(const char *s, long lo, long hi, const char *what, long *out);
DT_API dt_status dt_parse_double(const char *s, double lo, double hi, const char *what,
                                 double *out);

// The DT_* settings: every environment variable dtrain reads is one row of a table
// (src/core/settings.c) with its kind, range, default and help; modules read them by
// name, and `dtrain-mnist --help-env` / `dtrun --help-env` print the table.
typedef enum dt_setting_kind {
    DT_SETTING_INT,    // a number in [lo, hi], default def
    DT_SETTING_CHOICE, // one of the '|'-separated choices; def is the default's index
    DT_SETTING_STRING, // free text, unset by default
} dt_setting_kind;

typedef struct dt_setting {
    const char     *name; // "DT_TIMEOUT_MS"
    const char     *module;
    dt_setting_kind kind;
    long            lo, hi, def;
    const char     *choices; // DT_SETTING_CHOICE: "auto|ring|rdouble"
    const char     *help;
} dt_setting;

// The whole table (n rows), and one row by name (NULL when unknown).
DT_API const dt_setting *dt_settings(size_t *n);
DT_API const dt_setting *dt_setting_find(const char *name);
// The value of a number setting: the variable when set (DT_ERR_ARG naming it, the range
// and what was found when it is not a number in range), else the table's default.
DT_API dt_status dt_setting_int(const char *name, long *out);
// The index of a choice setting's value among its choices (case-insensitive), else the
// default's index; DT_ERR_ARG listing the choices on anything else.
DT_API dt_status dt_setting_choice(const char *name, int *out);
// A string setting's value, NULL when unset or empty.
DT_API const char *dt_setting_str(const char *name);
// DT_* variables in the environment that are not settings, as one message into msg
// ("DT_TIMOUT_MS is not a dtrain setting (did you mean DT_TIMEOUT_MS?)"); returns
// how many. DT_TEST_* and DTRUN_* are the test suite's and dtrun's own, not counted.
DT_API size_t dt_settings_check_unknown(char *msg, size_t n);
// The table, grouped by module, with each variable's current value when set.
DT_API void dt_settings_print(FILE *f);

// --------------------------------------------------------------------------- precision

// The arithmetic of a model's matrix products (Linear, Conv2d), as torch.autocast picks
// it: fp32 everywhere, or bf16 / fp16 operands with fp32 accumulation and fp32 master
// weights (docs/precision.md). Norms, softmax and losses stay fp32 in every mode.
typedef enum dt_precision {
    DT_PREC_FP32 = 0,
    DT_PREC_BF16 = 1,
    DT_PREC_FP16 = 2,
} dt_precision;

// "fp32", "bf16", "fp16" ("?" for anything else).
DT_API const char *dt_precision_name(dt_precision p);
// The reverse (case-sensitive); DT_ERR_ARG naming the accepted words and what was found.
DT_API dt_status dt_precision_parse(const char *s, dt_precision *out);

// --------------------------------------------------------------------------- checksum

// CRC32C (Castagnoli), as used by iSCSI/ext4: crc = dt_crc32c(0, buf, n) for a whole
// buffer; pass a previous result as `crc` to continue it.
DT_API uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_CORE_H
