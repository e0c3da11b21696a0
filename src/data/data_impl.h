// data_impl.h: what the loader needs from the sampler beyond the public header.
#ifndef DTRAIN_DATA_IMPL_H
#define DTRAIN_DATA_IMPL_H

#include "dtrain/data.h"

// Records that the loader handed out `count` more indices of the current pass.
void dt_data_sampler_advance(dt_sampler *s, size_t count);

// What a stat mode is, for messages: "a directory", "a FIFO (named pipe)", ...
const char *dt_data_file_kind(unsigned mode);

#endif // DTRAIN_DATA_IMPL_H
