// prog.h: the programs of the build variant a test belongs to.
#ifndef DTRAIN_TESTS_PROG_H
#define DTRAIN_TESTS_PROG_H

#include "dtrain/core.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

// Writes into out the path of program `name` (dtrain-mnist, dtrun, ...) built with the
// calling test: <out>/bin/name, or build/bin/name for release (the test itself is
// <out>/tests/<group>/test_x). False when no such executable exists.
bool test_program_path(const char *name, char *out, size_t n);

// Runs the shell command built from fmt and returns its exit status (128 + the signal
// when killed, -1 when it could not start), with its standard output in *out (malloc'd,
// NUL-terminated; the caller frees it).
int test_run(char **out, const char *fmt, ...) DT_PRINTF(2, 3);
int test_vrun(char **out, const char *fmt, va_list ap);

#endif // DTRAIN_TESTS_PROG_H
