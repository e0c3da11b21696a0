// sampler.c: PyTorch's DistributedSampler (torch/utils/data/distributed.py), plus an
// automatic epoch advance and an evaluation mode without padding (see data.h).
//
// The padded list never exists: padding repeats the list from its front, so position
// p of the padded list is list[p mod N], and rank r's i-th index is
// list[(r + i*R) mod N]. With drop_last every position is below total_size <= N.
#include "data_impl.h"

#include "dtrain/rng.h"

#include <string.h>

struct dt_sampler {
    dt_sampler_opts o;
    size_t          n;              // dataset size N
    size_t          num_samples;    // this rank's count per pass
    size_t          total_size;     // num_samples * R (N in evaluation mode)
    uint32_t       *perm;           // (N) shuffled list of the pass; NULL without shuffle
    uint32_t       *mine;           // (num_samples) this rank's indices of the pass
    uint64_t        epoch;          // epoch of the current pass, or of the next before any
    bool            epoch_set;      // set_epoch/resume since the last begin
    bool            begun;          // a pass has started
    size_t          position;       // indices of the pass consumed
    bool            resume_pending; // dt_sampler_resume waits for its epoch's pass
    uint64_t        resume_epoch;
    size_t          resume_position;
};

dt_sampler_opts dt_sampler_opts_default(void) {
    return (dt_sampler_opts){
        .num_replicas = 1,
        .rank         = 0,
        .shuffle      = true,
        .seed         = 0,
        .drop_last    = false,
        .auto_epoch   = true,
        .eval         = false,
    };
}

static dt_sampler *sampler_create(size_t n, const dt_sampler_opts *opts) {
    dt_sampler_opts o = opts ? *opts : dt_sampler_opts_default();
    if (o.num_replicas < 1) {
        dt_fail(DT_ERR_ARG, "sampler: expected num_replicas >= 1, found %d", o.num_replicas);
        return NULL;
    }
    if (o.rank < 0 || o.rank >= o.num_replicas) {
        dt_fail(DT_ERR_ARG, "sampler: expected a rank in [0, %d), found %d", o.num_replicas,
                o.rank);
        return NULL;
    }
    if (n > UINT32_MAX) {
        dt_fail(DT_ERR_ARG, "sampler: expected at most %u samples, found %zu", UINT32_MAX, n);
        return NULL;
    }
    size_t R = (size_t)o.num_replicas, r = (size_t)o.rank;
    size_t num_samples, total_size;
    if (o.eval) {
        num_samples = r < n ? (n - r + R - 1) / R : 0;
        total_size  = n;
    } else {
        // PyTorch: drop_last and N % R != 0 gives ceil((N - R) / R), which is floor(N / R);
        // when N % R == 0 both rules give N / R.
        num_samples = o.drop_last ? n / R : (n + R - 1) / R;
        total_size  = num_samples * R;
    }
    dt_sampler *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return NULL;
    s->o           = o;
    s->n           = n;
    s->num_samples = num_samples;
    s->total_size  = total_size;
    s->epoch       = 0;
    s->mine        = dt_alloc_zero(num_samples * sizeof *s->mine);
    if (o.shuffle)
        s->perm = dt_alloc(n * sizeof *s->perm);
    if (!s->mine || (o.shuffle && !s->perm)) {
        dt_sampler_free(s);
        return NULL;
    }
    return s;
}

dt_status dt_sampler_new(dt_sampler **out, size_t n, const dt_sampler_opts *opts) {
    *out = sampler_create(n, opts);
    if (*out)
        return DT_OK;
    dt_status st = dt_last_status();
    return st != DT_OK ? st : dt_fail(DT_ERR_STATE, "sampler_create: failed without a message");
}

void dt_sampler_free(dt_sampler *s) {
    if (!s)
        return;
    dt_free(s->perm);
    dt_free(s->mine);
    dt_free(s);
}

size_t dt_sampler_num_samples(const dt_sampler *s) {
    return s->num_samples;
}
size_t dt_sampler_total_size(const dt_sampler *s) {
    return s->total_size;
}
size_t dt_sampler_dataset_size(const dt_sampler *s) {
    return s->n;
}
uint64_t dt_sampler_epoch(const dt_sampler *s) {
    return s->epoch;
}
size_t dt_sampler_position(const dt_sampler *s) {
    return s->position;
}

void dt_sampler_set_epoch(dt_sampler *s, uint64_t epoch) {
    s->epoch     = epoch;
    s->epoch_set = true;
    if (s->resume_pending && s->resume_epoch != epoch)
        s->resume_pending = false;
}

dt_status dt_sampler_resume(dt_sampler *s, uint64_t epoch, size_t position) {
    if (position > s->num_samples)
        return dt_fail(DT_ERR_ARG,
                       "sampler resume: expected a position in [0, %zu] (samples per pass), "
                       "found %zu",
                       s->num_samples, position);
    dt_sampler_set_epoch(s, epoch);
    s->resume_pending  = true;
    s->resume_epoch    = epoch;
    s->resume_position = position;
    return DT_OK;
}

void dt_sampler_begin(dt_sampler *s) {
    if (s->begun && !s->epoch_set && s->o.auto_epoch)
        s->epoch++;
    s->epoch_set = false;
    s->begun     = true;

    size_t R = (size_t)s->o.num_replicas, r = (size_t)s->o.rank, n = s->n;
    if (s->o.shuffle) {
        // Seeded with seed + epoch alone: every rank builds the same permutation, which is
        // what makes the rank slices a partition.
        dt_rng rng = dt_rng_init(s->o.seed + s->epoch);
        dt_rng_permutation(&rng, s->perm, n);
    }
    size_t p = r; // position in the (virtually padded) list
    for (size_t i = 0; i < s->num_samples; i++, p += R) {
        size_t q   = p < n ? p : p % n;
        s->mine[i] = s->perm ? s->perm[q] : (uint32_t)q;
    }
    s->position = 0;
    if (s->resume_pending && s->resume_epoch == s->epoch)
        s->position = s->resume_position;
    s->resume_pending = false;
}

bool dt_sampler_next(dt_sampler *s, size_t *index) {
    if (!s->begun || s->position >= s->num_samples)
        return false;
    *index = s->mine[s->position++];
    return true;
}

const uint32_t *dt_sampler_indices(const dt_sampler *s, size_t *count) {
    if (count)
        *count = s->num_samples;
    return s->mine;
}

void dt_data_sampler_advance(dt_sampler *s, size_t count) {
    s->position += count;
    DT_DEBUG_ASSERT(s->position <= s->num_samples);
}
