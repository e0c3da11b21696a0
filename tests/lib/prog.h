// prog.h: the programs of the build variant a test belongs to.
#ifndef DTRAIN_TESTS_PROG_H
#define DTRAIN_TESTS_PROG_H

#include <stdbool.h>
#include <stddef.h>

// Writes into out the path of program `name` (dtrain-mnist, dtrun, ...) built with the
// calling test: <out>/bin/name, or build/bin/name for release (the test itself is
// <out>/tests/<group>/test_x). False when no such executable exists.
bool test_program_path(const char *name, char *out, size_t n);

#endif // DTRAIN_TESTS_PROG_H
