// buckets.c: see buckets.h.
#include "ddp/buckets.h"

dt_status dt_bucket_plan(const dt_params *p, size_t cap_bytes, size_t first_bytes,
                         dt_bucket_span *spans, int *nb, int *tensor_bucket) {
    size_t cap   = cap_bytes ? cap_bytes : (size_t)25 << 20;
    size_t first = first_bytes ? first_bytes : cap_bytes ? cap : (size_t)1 << 20;
    int    n     = dt_params_count(p);
    int    last  = -1; // the last trainable tensor
    for (int t = 0; t < n; t++)
        if (dt_params_info(p, t)->trainable)
            last = t;
    int    k = 0, start = -1, ntrain = 0;
    size_t bytes = 0, limit = first;
    for (int t = 0; t <= last; t++) { // in definition order into spans[0..k)
        const dt_param_info *pi = dt_params_info(p, t);
        if (!pi->trainable)
            continue;
        if (start < 0)
            start = t;
        ntrain++;
        bytes += pi->count * sizeof(float);
        if (bytes >= limit || t == last) {
            const dt_param_info *p0 = dt_params_info(p, start);
            spans[k++]              = (dt_bucket_span){.offset   = p0->offset,
                                                       .count    = pi->offset + pi->count - p0->offset,
                                                       .first    = start,
                                                       .ntensors = t - start + 1,
                                                       .ntrain   = ntrain};
            start = -1, ntrain = 0, bytes = 0, limit = cap;
        }
    }
    for (int i = 0; i < k / 2; i++) { // reversed: bucket 0 is the last tensors'
        dt_bucket_span s = spans[i];
        spans[i]         = spans[k - 1 - i];
        spans[k - 1 - i] = s;
    }
    for (int t = 0; t < n; t++)
        tensor_bucket[t] = -1;
    for (int i = 0; i < k; i++)
        for (int t = spans[i].first; t < spans[i].first + spans[i].ntensors; t++)
            tensor_bucket[t] = dt_params_info(p, t)->trainable ? i : -1;
    *nb = k;
    return DT_OK;
}
