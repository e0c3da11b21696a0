// data_impl.h: what the loader needs from the sampler beyond the public header.
#ifndef DTRAIN_DATA_IMPL_H
#define DTRAIN_DATA_IMPL_H

#include "dtrain/data.h"

#include <stdio.h>

// Fills a dataset's general fields from its type, ndim, shape and data (set by the
// constructor) and the options: sample size, h and w, normalisation channels and
// tables, augmentation. DT_ERR_ARG when the options do not fit the shape.
dt_status dt_data_dataset_finish(dt_dataset *ds, const dt_dataset_opts *o);

// Frees what dt_data_dataset_finish and the general constructors own (not images or
// labels).
void dt_data_dataset_free_extra(dt_dataset *ds);

// Opens `path` for reading if it is a regular file (a FIFO is never waited on) and
// gives its size. DT_ERR_IO "<path>: expected a regular file, found a directory" (a
// FIFO, a device, ...) or naming the failed call.
dt_status   dt_data_open_regular(const char *path, FILE **out, uint64_t *size);
const char *dt_data_mode_kind(unsigned mode); // "a directory", "a FIFO (named pipe)", ...

// Records that the loader handed out `count` more indices of the current pass.
void dt_data_sampler_advance(dt_sampler *s, size_t count);

#endif // DTRAIN_DATA_IMPL_H
