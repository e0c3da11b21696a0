// buckets.h: how DDP groups parameter tensors into buckets (PyTorch's
// compute_bucket_assignment_by_size for one dtype), shared by DDP (ddp.c) and ZeRO
// (src/parallel/zero.c), which reduces the same buckets.
#ifndef DTRAIN_DDP_BUCKETS_H
#define DTRAIN_DDP_BUCKETS_H

#include "dtrain/params.h"

#include <stddef.h>

typedef struct dt_bucket_span {
    size_t offset, count;   // floats of the flat buffers
    int    first, ntensors; // parameter tensors [first, first + ntensors)
    int    ntrain;          // the trainable ones among them
} dt_bucket_span;

// Walks the trainable tensors of p in definition order and closes a bucket once it holds
// at least the current limit (first_bytes for the first bucket, then cap_bytes; so a
// bucket can exceed it by one tensor); the buckets come out reversed, bucket 0 holding
// the tensors backward finishes first. 0 for cap_bytes means 25 MiB; 0 for first_bytes
// means 1 MiB, or cap_bytes when that was given. Frozen tensors get no bucket
// (tensor_bucket -1; PyTorch leaves requires_grad=False parameters out); one lying
// between two trainable tensors of a bucket is inside its range and reduced with it,
// harmlessly. spans and tensor_bucket hold dt_params_count(p) entries; *nb receives the
// number of buckets.
dt_status dt_bucket_plan(const dt_params *p, size_t cap_bytes, size_t first_bytes,
                         dt_bucket_span *spans, int *nb, int *tensor_bucket);

#endif
