// data_impl.h: what the loader needs from the sampler beyond the public header.
#ifndef DTRAIN_DATA_IMPL_H
#define DTRAIN_DATA_IMPL_H

#include "core/file.h"
#include "dtrain/data.h"

#include <stdio.h>

// Fills a dataset's general fields from its type, ndim, shape and data (set by the
// constructor) and the options: sample size, h and w, normalisation channels and
// tables, augmentation. DT_ERR_ARG when the options do not fit the shape.
dt_status dt_data_dataset_finish(dt_dataset *ds, const dt_dataset_opts *o);

// Frees what dt_data_dataset_finish and the general constructors own (not images or
// labels).
void dt_data_dataset_free_extra(dt_dataset *ds);

// Records that the loader handed out `count` more indices of the current pass.
void dt_data_sampler_advance(dt_sampler *s, size_t count);

#endif // DTRAIN_DATA_IMPL_H
