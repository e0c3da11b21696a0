// file.h: opening files to read without trusting what the path names. Every reader of
// a file a user names (data sets, checkpoints, model files, a checkpoint folder's
// layout) opens it here, so that a FIFO, a device or a directory given as a file is
// refused at once instead of blocking open() or read() for ever.
#ifndef DTRAIN_CORE_FILE_H
#define DTRAIN_CORE_FILE_H

#include "dtrain/core.h"

#include <stdint.h>
#include <stdio.h>

// Opens `path` for reading if it is a regular file (a FIFO is never waited on) and
// gives its size. DT_ERR_IO "<path>: expected a regular file, found a FIFO (named
// pipe)" (a directory, a device, ...) or naming the failed call.
dt_status dt_open_regular(const char *path, FILE **out, uint64_t *size);
// What a stat mode names, for messages: "a directory", "a FIFO (named pipe)", ...
const char *dt_file_kind(unsigned mode);

#endif // DTRAIN_CORE_FILE_H
