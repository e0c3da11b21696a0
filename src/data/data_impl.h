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

// The content hash of bytes given in pieces of any sizes (hash.c): the same bytes give
// the same value however they are split. The readers take it as they read
// (dt_idx.hash, dt_npy.hash, dt_tokens.hash, dt_dataset.content_hash).
typedef struct dt_data_hash {
    uint64_t lane[4], total;
    uint8_t  tail[32];
    size_t   ntail;
} dt_data_hash;
void     dt_data_hash_init(dt_data_hash *h);
void     dt_data_hash_add(dt_data_hash *h, const void *data, size_t n);
uint64_t dt_data_hash_end(const dt_data_hash *h); // h stays usable
uint64_t dt_data_hash_bytes(const void *data, size_t n);
uint64_t dt_data_hash_pair(uint64_t a, uint64_t b); // samples' and labels' hashes, as one
// fread of n bytes into dst that adds what it read to h, in pieces (a short count at
// the end of the file or on an error, as fread).
size_t dt_data_read_hashed(void *dst, size_t n, FILE *f, dt_data_hash *h);

// Records that the loader handed out `count` more indices of the current pass.
void dt_data_sampler_advance(dt_sampler *s, size_t count);

#endif // DTRAIN_DATA_IMPL_H
