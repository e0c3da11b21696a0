// data.h: datasets for training. IDX files (the MNIST format, plain or gzip), an image
// dataset kept as bytes, a DistributedSampler with PyTorch's semantics, and a loader
// that prepares normalised float batches on a background thread.
//
// Knows nothing about models or process groups: a sampler is told its rank and the
// number of replicas; the loader hands out plain buffers.
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ------------------------------------------------------------------------------ IDX
//
// Layout (big-endian): two zero bytes, a type byte, a dimension count byte, one u32
// per dimension, then the data in row-major order. Only type 0x08 (unsigned byte) is
// read; the other IDX types (0x09 signed byte, 0x0B short, 0x0C int, 0x0D float,
// 0x0E double) are rejected by name. A file starting with the gzip magic 1f 8b is
// decompressed on the fly, whatever its name.

#define DT_IDX_MAX_DIMS 4

typedef struct dt_idx {
    uint8_t *data;                  // owned; nrecords * record_bytes bytes
    int      ndim;                  // 1..4
    uint32_t dims[DT_IDX_MAX_DIMS]; // as in the header; unused dims are 0
    size_t   nrecords;              // records held (dims[0], or fewer when limited)
    size_t   record_bytes;          // product of dims[1..ndim-1] (1 for ndim 1)
} dt_idx;

// Reads the IDX file at `path` into *out (free with dt_idx_free). Every defect is
// DT_ERR_FORMAT with "<path>: expected ..., found ...": wrong magic, unsupported type,
// dimension count outside 1..4, sizes that overflow or exceed what the file can hold,
// truncated data, bytes after the data, corrupt gzip (a CRC-32 mismatch is named as
// such). No allocation exceeds what the file actually delivers, and a gzip file is
// never inflated past what its IDX header claims (plus one byte to see the end): the
// header is inflated and checked first, so neither a lying header nor a lying gzip
// trailer can trigger a huge allocation or a long inflation. DT_ERR_IO when the file
// cannot be opened or read, or is not a regular file ("expected a regular file, found
// a directory", "... a FIFO (named pipe)", "... a character device"; a FIFO is never
// waited on). On failure *out is zeroed.
DT_API dt_status dt_idx_read(const char *path, dt_idx *out);

// Same, keeping only the first `max_records` records (0 means all), with the same
// checks: a plain file is checked against its full size, and a gzip file is inflated
// to its end so that the CRC-32 and length of the whole stream are verified (a flipped
// bit in the records kept, or after them, is an error). A gzip file whose data is at
// most 256 MiB is inflated whole (libdeflate) and the records kept copied out; a larger
// one streams the records beyond the limit through a 64 KiB scratch buffer, so memory
// stays at the records kept. Either way the time is that of inflating the whole file:
// about 0.15 s for Fashion-MNIST's 60,000 training images, against 0.002 s for the
// first 1,024 records alone.
DT_API dt_status dt_idx_read_first(const char *path, size_t max_records, dt_idx *out);

// Parses an IDX image held in memory (plain or gzip), with the same checks as
// dt_idx_read; `name` stands for the path in messages. Used by the fuzzer.
DT_API dt_status dt_idx_parse(const void *buf, size_t nbytes, const char *name, dt_idx *out);
// The same with a limit, as dt_idx_read_first: it fails exactly when dt_idx_parse does.
DT_API dt_status dt_idx_parse_first(const void *buf, size_t nbytes, const char *name,
                                    size_t max_records, dt_idx *out);

// Writes an unsigned-byte IDX file: `ndim` (1..4) dims, data of their product bytes,
// gzip-compressed when `gzip` is true. Written to "<path>.tmp.<pid>" and renamed, so
// a failure never leaves a half-written file at `path`. DT_ERR_ARG, DT_ERR_IO.
DT_API dt_status dt_idx_write(const char *path, const uint8_t *data, int ndim, const uint32_t *dims,
                              bool gzip);

DT_API void dt_idx_free(dt_idx *idx); // frees data and zeroes *idx; NULL is a no-op

// -------------------------------------------------------------------------- dataset

// Where dt_dataset_load_mnist looks when given no directory and DT_DATA_DIR is unset
// (Debian's dataset-fashion-mnist package).
#define DT_DATA_DIR_DEFAULT "/usr/share/datasets/fashion-mnist"

// Per-pixel normalisation x = (p / 255 - mean) / std; the seed script's constants.
#define DT_DATA_MEAN_DEFAULT 0.1302f
#define DT_DATA_STD_DEFAULT  0.3069f

typedef struct dt_dataset_opts {
    size_t limit;       // keep the first `limit` samples; 0 keeps all
    int    num_classes; // labels must be < num_classes; default 10
    float  mean;        // default DT_DATA_MEAN_DEFAULT
    float  std;         // default DT_DATA_STD_DEFAULT; must be > 0
} dt_dataset_opts;

DT_API dt_dataset_opts dt_dataset_opts_default(void);

// Images as bytes (N, H, W) and labels (N). Fields are read-only for users; the
// dataset is immutable after loading, so any number of threads may read it.
typedef struct dt_dataset {
    uint8_t *images; // (N, H, W), owned
    uint8_t *labels; // (N), owned
    size_t   n;      // N
    int      h, w;   // image height and width
    int      num_classes;
    float    mean, std;
    float    lut[256]; // lut[p] = (p / 255 - mean) / std, computed in float
} dt_dataset;

// Loads an image file (N, H, W) and a label file (N) of IDX format. The counts must
// agree (else DT_ERR_FORMAT naming both counts and both files) and every label must be
// < num_classes (else DT_ERR_FORMAT naming the label and its index). `opts` NULL means
// defaults. Free with dt_dataset_free.
DT_API dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images_path,
                                     const char *labels_path, const dt_dataset_opts *opts);

// Loads the MNIST-format files of `dir`: train-images-idx3-ubyte and
// train-labels-idx1-ubyte (train) or t10k-* (test), each plain or with ".gz"
// (the plain file wins when both exist). `dir` NULL means $DT_DATA_DIR, or
// DT_DATA_DIR_DEFAULT when that is unset. DT_ERR_IO listing the paths tried when a
// file is missing, or naming what was found when a name exists but is not a regular
// file ("<dir>/train-images-idx3-ubyte is a directory, expected a regular file ...").
DT_API dt_status dt_dataset_load_mnist(dt_dataset *ds, const char *dir, bool train,
                                       const dt_dataset_opts *opts);

// Builds a dataset from caller memory (copied): n images of h*w bytes and n labels.
DT_API dt_status dt_dataset_init(dt_dataset *ds, const uint8_t *images, const uint8_t *labels,
                                 size_t n, int h, int w, const dt_dataset_opts *opts);

DT_API void dt_dataset_free(dt_dataset *ds); // NULL is a no-op; zeroes *ds

// Checks that the samples of `ds` (1, H, W) have the per-sample input shape (c, h, w)
// of the model they are about to feed (nn.h: dt_model_input_shape), before the first
// step and before an evaluation: a model reads c*h*w floats per sample, so a smaller
// image would be read past its end and a larger one trained as garbage. DT_ERR_ARG
// naming `name` (e.g. "training set"; NULL means "dataset") and both shapes.
DT_API dt_status dt_dataset_check_shape(const dt_dataset *ds, const char *name, int c, int h,
                                        int w);

// Gathers samples indices[0..count) into x (count, 1, H, W), normalised through
// ds->lut, and their labels into y (count). Indices must be < ds->n (checked only in
// debug builds: the sampler produces them). Allocates nothing.
DT_API void dt_dataset_gather(const dt_dataset *ds, const uint32_t *indices, size_t count, float *x,
                              int32_t *y);

// -------------------------------------------------------------------------- sampler
//
// PyTorch's DistributedSampler
// (https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler):
// each of R replicas takes every R-th position of one list of N indices that all
// replicas build identically:
//   num_samples = drop_last ? floor(N / R) : ceil(N / R);  total_size = num_samples * R
//   list = shuffle ? permutation of [0, N) : [0, 1, ..., N-1]
//          (permutation: dt_rng_permutation on dt_rng_init(seed + epoch), the same on
//          every rank; not bit-equal to torch.randperm)
//   drop_last: list = list[:total_size]; else pad by repeating the list from its front
//   rank r gets list[r], list[r + R], list[r + 2R], ... (num_samples of them)
//
// Two additions:
// - Auto epoch (on by default): each pass after the first moves to the next epoch by
//   itself, so forgetting set_epoch cannot silently repeat the same order. An explicit
//   dt_sampler_set_epoch(e) always wins: the next pass uses exactly e, the ones after
//   it e + 1, e + 2, ... With auto_epoch off, the epoch changes only through set_epoch
//   (PyTorch's behaviour).
// - Evaluation mode: no padding and no dropping; rank r gets positions r, r + R, ...
//   below N, so every sample is seen exactly once across ranks (ranks may differ in
//   count by one).
// A sampler is not thread-safe; one thread drives it (the loader's caller).

typedef struct dt_sampler dt_sampler;

typedef struct dt_sampler_opts {
    int      num_replicas; // R >= 1 (default 1)
    int      rank;         // 0 <= rank < R (default 0)
    bool     shuffle;      // default true
    uint64_t seed;         // default 0; must be equal on every rank
    bool     drop_last;    // drop the tail instead of padding (default false)
    bool     auto_epoch;   // default true (see above)
    bool     eval;         // evaluation mode (default false); drop_last is ignored
} dt_sampler_opts;

DT_API dt_sampler_opts dt_sampler_opts_default(void);

// A sampler over n samples (n <= UINT32_MAX). Returns NULL with DT_ERR_ARG (rank out
// of range, R < 1, n too large) or DT_ERR_NOMEM. Allocates its lists here; passes
// allocate nothing. Free with dt_sampler_free.
DT_API dt_sampler *dt_sampler_init(size_t n, const dt_sampler_opts *opts);
DT_API void        dt_sampler_free(dt_sampler *s); // NULL is a no-op

// Per-rank count of one pass (len() of the PyTorch sampler) and R * that count.
// In evaluation mode num_samples is this rank's count and total_size is N.
DT_API size_t dt_sampler_num_samples(const dt_sampler *s);
DT_API size_t dt_sampler_total_size(const dt_sampler *s);
DT_API size_t dt_sampler_dataset_size(const dt_sampler *s);

// Sets the epoch the next pass uses (PyTorch's set_epoch). Clears a pending resume
// position unless it was recorded for this same epoch.
DT_API void dt_sampler_set_epoch(dt_sampler *s, uint64_t epoch);

// Starts a pass: picks its epoch (set_epoch's, else the auto-epoch rule), builds this
// rank's list and sets the position to 0 (or to the resume position). Allocates nothing.
DT_API void dt_sampler_begin(dt_sampler *s);

// The next index of the current pass into *index; false at the end of the pass (or
// before the first dt_sampler_begin).
DT_API bool dt_sampler_next(dt_sampler *s, size_t *index);

// This rank's whole list for the current pass (num_samples entries); valid until the
// next dt_sampler_begin or dt_sampler_free. *count may be NULL.
DT_API const uint32_t *dt_sampler_indices(const dt_sampler *s, size_t *count);

// The epoch of the current pass (of the next one before the first begin), and how many
// indices of it were consumed (by dt_sampler_next or by the loader's batches).
// Together they are the state a checkpoint saves.
DT_API uint64_t dt_sampler_epoch(const dt_sampler *s);
DT_API size_t   dt_sampler_position(const dt_sampler *s);

// Makes the next pass be `epoch` and start after `position` indices, as saved from
// dt_sampler_epoch/dt_sampler_position. DT_ERR_ARG if position > num_samples.
DT_API dt_status dt_sampler_resume(dt_sampler *s, uint64_t epoch, size_t position);

// --------------------------------------------------------------------------- loader
//
// Batches of a dataset in a sampler's order: x (B, 1, H, W) normalised floats and
// y (B) int32 labels. With prefetch on, a background thread prepares the next batch
// while the caller trains on the current one (two buffers); dt_loader_next blocks only
// when that batch is not ready yet. The batches depend only on the sampler's order,
// never on thread timing. All buffers are allocated by dt_loader_init; an epoch
// allocates nothing.

typedef struct dt_loader dt_loader;

typedef struct dt_loader_opts {
    size_t batch_size; // B >= 1 (default 64)
    bool   drop_last;  // drop a last batch shorter than B (default false); unrelated to
                       // the sampler's drop_last
    bool prefetch;     // prepare batches on a background thread (default true)
    bool caller_helps; // with prefetch: when the thread has not started the batch the
                       // caller asks for, prepare it on the calling thread instead of
                       // waiting for the thread to be scheduled (default true)
    int timeout_ms;    // longest wait in dt_loader_next for a batch the thread is
                       // preparing (default 60000)
} dt_loader_opts;

DT_API dt_loader_opts dt_loader_opts_default(void);

// One batch. Its buffers belong to the loader and stay valid until the next
// dt_loader_next, dt_loader_begin_epoch or dt_loader_free.
typedef struct dt_batch {
    float          *x;       // (size, 1, h, w)
    int32_t        *y;       // (size)
    const uint32_t *indices; // (size) dataset indices of the samples
    size_t          size;    // B, or fewer for a last short batch
    int             h, w;
    size_t          index; // batch number within the epoch
} dt_batch;

// A loader over `ds` in the order of `sampler`; both are borrowed (they must outlive
// the loader) and the loader drives the sampler (begin and position). `sampler` NULL
// means a sequential pass over the whole dataset (owned by the loader). The sampler
// must cover ds->n samples, else DT_ERR_ARG. Returns NULL on failure (DT_ERR_ARG,
// DT_ERR_NOMEM, DT_ERR_IO if the thread cannot start). Free with dt_loader_free.
DT_API dt_loader *dt_loader_init(const dt_dataset *ds, dt_sampler *sampler,
                                 const dt_loader_opts *opts);

// Stops the background thread (waiting for the batch it is preparing) and frees.
// NULL is a no-op.
DT_API void dt_loader_free(dt_loader *l);

// DT_EPOCH_AUTO leaves the epoch to the sampler (its set_epoch or auto-epoch rule).
#define DT_EPOCH_AUTO (-1)

// Starts an epoch: epoch >= 0 calls dt_sampler_set_epoch(sampler, epoch) first; then
// dt_sampler_begin. Abandons any batches of the previous epoch not yet taken.
DT_API void dt_loader_begin_epoch(dt_loader *l, int64_t epoch);

// The next batch into *b; false at the end of the epoch, or on failure (then
// dt_loader_status is not DT_OK and dt_last_error says why: DT_ERR_STATE before any
// dt_loader_begin_epoch, DT_ERR_TIMEOUT when a batch was not ready within timeout_ms).
// Each batch taken advances the sampler's position.
DT_API bool dt_loader_next(dt_loader *l, dt_batch *b);

// DT_OK, or the failure that ended the current epoch early.
DT_API dt_status dt_loader_status(const dt_loader *l);

// Batches in a full epoch: ceil(num_samples / B), or floor with drop_last.
DT_API size_t dt_loader_num_batches(const dt_loader *l);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_DATA_H
