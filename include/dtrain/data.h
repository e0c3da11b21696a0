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
    uint64_t hash; // a 64-bit hash of the records kept (data), taken as they were read
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

#define DT_DATASET_MAX_DIMS     4  // per-sample dimensions
#define DT_DATASET_MAX_CHANNELS 16 // per-channel normalisation

typedef struct dt_dataset_opts {
    size_t limit;       // keep the first `limit` samples; 0 keeps all
    int    num_classes; // labels must be < num_classes; default 10 (0: no upper bound,
                        // for the datasets of dt_dataset_init_desc / dt_dataset_load_npy)
    // Per-pixel normalisation x = (p / 255 - mean) / std of byte samples (floats: x =
    // (v - mean) / std). Default mean 0, std 1: p / 255, torchvision's ToTensor. (The
    // seed's Fashion-MNIST constants, 0.1302 and 0.3069, are examples/mnist/fmnist.h's.)
    float mean;
    float std; // must be > 0
    // Per-channel normalisation (the channel is the first per-sample dimension, C of
    // (C, H, W)): channels 0 (the default) uses mean/std above for every element;
    // channels = C uses ch_mean[c], ch_std[c] for channel c.
    int   channels;
    float ch_mean[DT_DATASET_MAX_CHANNELS];
    float ch_std[DT_DATASET_MAX_CHANNELS];
    // Augmentation of samples of 2 or more dimensions (the last two are H, W), as
    // torchvision's RandomCrop(size=(H, W), padding=crop_pad) then RandomHorizontalFlip():
    // pad by crop_pad zeros (raw value 0, normalised like any pixel) on each side, take
    // the H x W window at a random offset in [0, 2 crop_pad]^2, then mirror it with
    // probability 1/2. The draws are keyed by (aug_seed, epoch, dataset index) alone, so
    // a sample is augmented the same way whatever the world size, rank, batch size or
    // resume point. Defaults: crop_pad 0 (no crop), hflip false, aug_seed 0.
    int      crop_pad;
    bool     hflip;
    uint64_t aug_seed;
} dt_dataset_opts;

DT_API dt_dataset_opts dt_dataset_opts_default(void);

// Images as bytes (N, H, W) and labels (N). Fields are read-only for users; the
// dataset is immutable after loading, so any number of threads may read it.
// Since 0.2 a dataset holds samples of any shape (see "General datasets" below); the
// first fields keep their meaning for the byte-image datasets of this section.
typedef dt_status (*dt_dataset_fill_fn)(void *user, size_t index, float *x, int32_t *y, float *t);

typedef enum dt_sample_type {
    DT_SAMPLE_U8,  // bytes; a batch holds p / 255, then normalised (torchvision's ToTensor)
    DT_SAMPLE_F32, // floats, normalised as they are
} dt_sample_type;

typedef struct dt_dataset {
    uint8_t *images; // (N, H, W), owned: the samples of a byte dataset (else NULL)
    uint8_t *labels; // (N), owned: labels of the IDX/dt_dataset_init datasets (else NULL)
    size_t   n;      // N
    int      h, w;   // the last two per-sample dimensions (h 1 for 1-d samples)
    int      num_classes;
    float    mean, std;
    float    lut[256]; // lut[p] = (p / 255 - mean) / std, computed in float

    // General description, filled for every dataset.
    dt_sample_type     type;
    int                ndim;                       // per-sample dimensions, 1..4
    int                shape[DT_DATASET_MAX_DIMS]; // (1, H, W) for the IDX datasets
    size_t             sample_elems;               // product of shape: floats per sample
    void              *data;                       // (N, shape) of type, owned (== images for U8)
    int32_t           *labels32;                   // (N) int labels, owned, or NULL
    float             *targets;      // (N, target_elems) float targets, owned, or NULL
    size_t             target_elems; // 0 without float targets
    int                channels;     // normalisation channels: 1, or shape[0]
    float              ch_mean[DT_DATASET_MAX_CHANNELS], ch_std[DT_DATASET_MAX_CHANNELS];
    float             *ch_lut;   // channels * 256 entries for U8 samples, owned
    int                crop_pad; // augmentation (see dt_dataset_opts)
    bool               hflip;
    uint64_t           aug_seed;
    dt_dataset_fill_fn fill; // a callback dataset's function (data is NULL), else NULL
    void              *user;
    bool               has_labels; // batches carry y
    // What ranks compare to know they train on the same data: a 64-bit hash of the
    // samples and labels as read from the files (dt_dataset_load_idx, _mnist, _npy:
    // the readers' hashes, taken while they read), so two files of the same size and
    // other bytes differ here; 0 for a dataset built from memory.
    uint64_t content_hash;
} dt_dataset;

// Loads an image file (N, H, W) and a label file (N) of IDX format. The counts must
// agree (else DT_ERR_FORMAT naming both counts and both files) and every label must be
// < num_classes (else DT_ERR_FORMAT naming the label and its index). `opts` NULL means
// defaults. Free with dt_dataset_free.
DT_API dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images_path,
                                     const char *labels_path, const dt_dataset_opts *opts);

// Loads the MNIST-format files of `dir`: train-images-idx3-ubyte and
// train-labels-idx1-ubyte (train) or t10k-* (test), each plain or with ".gz"
// (the plain file wins when both exist). `dir` NULL (or "") means $DT_DATA_DIR;
// DT_ERR_ARG when that is unset too. DT_ERR_IO listing the paths tried when a file is
// missing, or naming what was found when a name exists but is not a regular file
// ("<dir>/train-images-idx3-ubyte is a directory, expected a regular file ...").
DT_API dt_status dt_dataset_load_mnist(dt_dataset *ds, const char *dir, bool train,
                                       const dt_dataset_opts *opts);

// Builds a dataset from caller memory (copied): n images of h*w bytes and n labels.
DT_API dt_status dt_dataset_init(dt_dataset *ds, const uint8_t *images, const uint8_t *labels,
                                 size_t n, int h, int w, const dt_dataset_opts *opts);

DT_API void dt_dataset_free(dt_dataset *ds); // NULL is a no-op; zeroes *ds

// Checks that the samples of `ds` have the per-sample input shape (c, h, w) of the
// model they are about to feed (nn.h: dt_model_input_shape), before the first step and
// before an evaluation: a model reads c*h*w floats per sample, so a smaller sample
// would be read past its end and a larger one trained as garbage. Shapes are compared
// without their leading and trailing dimensions of size 1, so (1, 28, 28) images fit
// a (1, 28, 28) model and (784) samples a flat (784, 1, 1) one. Works for every kind
// of dataset. DT_ERR_ARG naming `name` (e.g. "training set"; NULL means "dataset") and
// both shapes: "training set: expected samples of the model's input shape (1, 28, 28),
// found (1, 14, 14)". The trainer calls it for the model it is given (dt_trainer_loader
// then a dt_trainer_prepare_*); a program that feeds a model itself calls it too.
DT_API dt_status dt_dataset_check_shape(const dt_dataset *ds, const char *name, int c, int h,
                                        int w);
// The same for a per-sample shape of any rank (0 to DT_DATASET_MAX_DIMS dimensions): a
// graph input's (dt_graph_input_shape), (20) features, (3, 32, 32) images, ...
DT_API dt_status dt_dataset_check_dims(const dt_dataset *ds, const char *name, int ndim,
                                       const int64_t *dims);

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
// So with batch b per rank, the R local batches k together hold positions
// [k R b, (k + 1) R b) of the list: the one-process batch k of batch R b, whenever R
// divides N (no padding). That, with dropout keyed by dataset index
// (dt_model_set_sample_keys), is what makes R ranks train the one-process model.
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

// A sampler over n samples (n <= UINT32_MAX) into *out (NULL on failure: DT_ERR_ARG for
// a rank out of range, R < 1 or n too large; DT_ERR_NOMEM). Allocates its lists here;
// passes allocate nothing. Free with dt_sampler_free.
DT_API dt_status dt_sampler_new(dt_sampler **out, size_t n, const dt_sampler_opts *opts);
DT_API void      dt_sampler_free(dt_sampler *s); // NULL is a no-op

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
// y (B) int32 labels (in general x (B, shape...), and y or float targets t). Samples are
// made by dt_dataset_gather_at with the epoch of the sampler's pass, so augmentation is
// reproducible across resumes and world sizes. A failing callback dataset ends the
// epoch: dt_loader_next returns false and dt_loader_status gives its status and message.
// With prefetch on, a background thread prepares the next batch while the caller
// trains on the current one (two buffers); dt_loader_next blocks only when that batch
// is not ready yet. The batches depend only on the sampler's order,
// never on thread timing. All buffers are allocated by dt_loader_new; an epoch
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
    float          *x;       // (size, 1, h, w), in general (size, shape...)
    int32_t        *y;       // (size) labels; NULL for a dataset of float targets
    const uint32_t *indices; // (size) dataset indices of the samples
    size_t          size;    // B, or fewer for a last short batch
    int             h, w;
    size_t          index;        // batch number within the epoch
    float          *t;            // (size, t_elems) float targets, or NULL
    size_t          t_elems;      // floats per target (0 without)
    size_t          sample_elems; // floats per sample in x
    int             ndim;         // per-sample shape, as the dataset's
    int             shape[DT_DATASET_MAX_DIMS];
} dt_batch;

// A loader over `ds` in the order of `sampler`; both are borrowed (they must outlive
// the loader) and the loader drives the sampler (begin and position). `sampler` NULL
// means a sequential pass over the whole dataset (owned by the loader). The sampler
// must cover ds->n samples, else DT_ERR_ARG. *out stays NULL on failure (DT_ERR_ARG,
// DT_ERR_NOMEM, DT_ERR_IO if the thread cannot start). Free with dt_loader_free.
DT_API dt_status dt_loader_new(dt_loader **out, const dt_dataset *ds, dt_sampler *sampler,
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

// ------------------------------------------------------------------------------ NPY
//
// numpy's .npy format (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html),
// versions 1.0, 2.0 and 3.0: the magic "\x93NUMPY", a version, the header length, then a
// header dict {'descr': ..., 'fortran_order': ..., 'shape': (...)} and the raw data.
// The reader is strict: exactly those three keys, a plain dtype among |u1 <u2 <i4 <i8
// <f4 <f8 (little-endian; '=' is accepted as native, which is little-endian here),
// a header of at most DT_NPY_MAX_HEADER bytes, at most DT_NPY_MAX_DIMS dimensions, and
// exactly as many data bytes as the shape needs. Fortran-order arrays are transposed
// on reading into C order (same shape), so `data` is always C order.
// Write fixtures with numpy: np.save("x.npy", a.astype("<f4")).

#define DT_NPY_MAX_DIMS   8
#define DT_NPY_MAX_HEADER 65536

typedef enum dt_npy_dtype {
    DT_NPY_U8,  // |u1
    DT_NPY_U16, // <u2
    DT_NPY_I32, // <i4
    DT_NPY_I64, // <i8
    DT_NPY_F32, // <f4
    DT_NPY_F64, // <f8
} dt_npy_dtype;

typedef struct dt_npy {
    void        *data;                   // owned, C order, count * elem_size bytes
    dt_npy_dtype dtype;                  // as in the file (until dt_npy_convert)
    size_t       elem_size;              // bytes per element
    int          ndim;                   // 0 (a scalar) .. DT_NPY_MAX_DIMS
    size_t       shape[DT_NPY_MAX_DIMS]; // unused dims are 0
    size_t       count;                  // product of the shape (1 for a scalar)
    size_t       nbytes;                 // count * elem_size
    uint64_t     hash; // a 64-bit hash of the data bytes as stored (read or parsed)
} dt_npy;

// Reads the .npy file at `path` into *out (free with dt_npy_free). Every defect is
// DT_ERR_FORMAT "<path>: expected ..., found ...": wrong magic or version, a header
// that is not the dict above (the message quotes the text where parsing stopped), an
// unsupported descr (named as found: "expected dtype one of |u1 <u2 <i4 <i8 <f4 <f8,
// found descr '<c8'"), big-endian data (with the astype to convert it), a structured
// dtype, a shape whose size overflows, truncated data or bytes after it (expected and
// found byte counts). The data buffer is allocated only once the header's size equals
// the file's, so a lying header cannot cause a large allocation. DT_ERR_IO when the
// file cannot be opened or read, or is not a regular file. On failure *out is zeroed.
DT_API dt_status dt_npy_read(const char *path, dt_npy *out);

// The same checks on an .npy image held in memory; `name` (NULL: "npy") stands for the
// path in messages. Used by the fuzzer.
DT_API dt_status dt_npy_parse(const void *buf, size_t nbytes, const char *name, dt_npy *out);

DT_API void dt_npy_free(dt_npy *a); // frees data and zeroes *a; NULL is a no-op

// Converts the elements of *a to dtype `to` in place (a new buffer). Integer targets
// accept integer sources only, and every value must fit (else DT_ERR_FORMAT naming
// the value and its element index, and *a is unchanged); float targets accept any
// source (f64 -> f32 rounds to nearest). `name` names the array in messages.
DT_API dt_status dt_npy_convert(dt_npy *a, dt_npy_dtype to, const char *name);

DT_API const char *dt_npy_dtype_name(dt_npy_dtype t); // "<f4"; "unknown" if not a dtype
DT_API size_t      dt_npy_dtype_size(dt_npy_dtype t); // 4 for DT_NPY_F32; 0 if unknown

// ---------------------------------------------------------------- token streams
//
// A language model's corpus as one stream of tokens: uint8 (a byte-level model) or
// uint16 little-endian (a BPE vocabulary up to 65,536), as llm.c stores them. Training
// samples are windows of T + 1 tokens at a start offset o:
//   x = tokens[o .. o+T),  y = tokens[o+1 .. o+T+1)   (y is x shifted by one)
// The offsets of a batch are drawn as PyTorch scripts draw them
// (torch.randint(0, n - T, (B,), generator=torch.Generator().manual_seed(s)), rng.h's
// MT19937), so a batch equals the one a PyTorch script builds from the same seed.

// Where dt_corpus_read looks when given no path (Debian's fortunes package).
#define DT_FORTUNES_DIR "/usr/share/games/fortunes"

typedef struct dt_tokens {
    const void *data;  // token i at data + i * width, little-endian
    size_t      n;     // tokens
    int         width; // bytes per token: 1 (uint8) or 2 (uint16)
    void       *owned; // the buffer this stream frees (NULL for a view)
    uint64_t    hash;  // a 64-bit hash of the tokens as read (dt_tokens_read,
                       // dt_corpus_read: taken while reading); 0 for the other streams
} dt_tokens;

// Reads a file of raw tokens of `width` bytes (1 or 2). A width-2 file may start with
// llm.c's 1024-byte header (int32 magic 20240520, version 1, token count, then zeros):
// it is recognised, checked against the file size and skipped. DT_ERR_FORMAT when the
// size is not a multiple of the width or the llm.c header disagrees with the file;
// DT_ERR_IO when the file cannot be read or is not a regular file.
DT_API dt_status dt_tokens_read(const char *path, int width, dt_tokens *out);

// A stream copied from n tokens of `width` bytes at `data`. DT_ERR_ARG, DT_ERR_NOMEM.
DT_API dt_status dt_tokens_init(dt_tokens *t, const void *data, size_t n, int width);

// tokens[begin .. end) of `t` as a view (owns nothing; valid while t lives) into *out.
// DT_ERR_ARG unless begin <= end <= t->n.
DT_API dt_status dt_tokens_slice(const dt_tokens *t, size_t begin, size_t end, dt_tokens *out);

// The split of the PyTorch peers: train = the first 9n/10 tokens (rounded down),
// val = the rest; both views of `all`.
DT_API void dt_tokens_split(const dt_tokens *all, dt_tokens *train, dt_tokens *val);

DT_API void dt_tokens_free(dt_tokens *t); // frees an owned buffer, zeroes *t; NULL: no-op

// Token i (i < t->n, checked in debug builds).
DT_API uint32_t dt_tokens_at(const dt_tokens *t, size_t i);

// Checks every token is < vocab (a model's embedding has `vocab` rows): DT_ERR_FORMAT
// naming `name`, the first token out of range and its position. vocab 0 is DT_ERR_ARG.
DT_API dt_status dt_tokens_check_vocab(const dt_tokens *t, uint32_t vocab, const char *name);

// Windows at offsets[0..count) of T + 1 tokens into x and y (count, T), as int32.
// DT_ERR_ARG if an offset + T + 1 exceeds t->n (naming it). Allocates nothing.
DT_API dt_status dt_tokens_windows(const dt_tokens *t, const uint64_t *offsets, size_t count,
                                   size_t T, int32_t *x, int32_t *y);

// The B offsets of one global batch: torch.randint(0, n - T, (B,)) from a generator
// seeded with `seed` (so every offset + T + 1 <= n). DT_ERR_ARG unless n > T.
DT_API dt_status dt_tokens_draw(const dt_tokens *t, uint64_t seed, size_t B, size_t T,
                                uint64_t *offsets);

// One process's share of a global batch: draws the B offsets of `seed` as
// dt_tokens_draw (the same draw on every rank) and fills x, y (B / world, T) with the
// windows of global sequences rank, rank + world, rank + 2 world, ... (b = B / world of
// them: the positions a distributed sampler gives a rank, which the trainer's gradient
// shards of --invariant assume, so that row j of rank r is global row r + world j). So
// the global batch does not depend on the world size, and at world 1 it equals the peer's
// get_batch(train, B, T, seed) (gpt_bytes.py seeds step s with seed * 1000 + s).
// `offsets` is scratch of B entries. DT_ERR_ARG when world does not divide B, rank is
// out of range, or the stream is too short.
DT_API dt_status dt_tokens_batch(const dt_tokens *t, uint64_t seed, size_t B, size_t T, int rank,
                                 int world, uint64_t *offsets, int32_t *x, int32_t *y);

// Reads a corpus of bytes as a width-1 stream, the PyTorch peers' way: a directory
// gives every regular file directly in it whose name has no dot (so fortunes' *.dat and
// *.u8 are skipped; symbolic links are followed), in byte order of their names,
// concatenated; a file gives itself. `path` NULL means DT_FORTUNES_DIR. `limit` > 0
// keeps only the first `limit` bytes. *nfiles (may be NULL) gets the number of files.
// DT_ERR_IO naming the path when it does not exist (with the hint to install fortunes
// or pass a file) or a directory has no such file.
DT_API dt_status dt_corpus_read(const char *path, size_t limit, dt_tokens *out, size_t *nfiles);

// --------------------------------------------------------------- general datasets
//
// Datasets of float or byte samples of any per-sample shape (up to 4 dimensions, e.g.
// (C, H, W) images or (F) feature vectors) with int labels, float targets or neither,
// held in memory or made by a callback. They feed the same sampler and loader as the
// IDX datasets; every sample goes through the same steps in dt_dataset_gather_at:
//   1. raw floats: a byte p becomes p / 255 (torchvision's ToTensor), a float stays;
//      a callback writes raw floats itself;
//   2. augmentation, when configured (crop with padding, horizontal flip; see
//      dt_dataset_opts), keyed by (aug_seed, epoch, index);
//   3. normalisation (x - mean[c]) / std[c], per channel c or one mean/std for all.
// Without augmentation, byte samples take a per-channel 256-entry table with the same
// float operations, so the results are identical either way.

typedef enum dt_target_kind {
    DT_TARGET_NONE,  // batches carry samples only
    DT_TARGET_LABEL, // one int label per sample (batch y)
    DT_TARGET_FLOAT, // target_elems floats per sample (batch t), e.g. regression
} dt_target_kind;

// What a dataset holds. Memory given here is copied by dt_dataset_init_desc.
typedef struct dt_dataset_desc {
    size_t         n;                          // samples
    int            ndim;                       // per-sample dimensions, 1..4
    int            shape[DT_DATASET_MAX_DIMS]; // each >= 1
    dt_sample_type type;                       // of data (a callback always gives F32)
    const void    *data;                       // (n, shape) samples; NULL with fill
    dt_target_kind target;
    const int32_t *labels;       // n labels for DT_TARGET_LABEL (NULL with fill)
    const float   *targets;      // (n, target_elems) for DT_TARGET_FLOAT (NULL with fill)
    size_t         target_elems; // >= 1 with DT_TARGET_FLOAT
    // A callback dataset: fill(user, index, x, y, t) writes sample `index`'s raw floats
    // into x (sample_elems of them), its label into *y (DT_TARGET_LABEL, else y is
    // NULL) and its targets into t (DT_TARGET_FLOAT, else NULL). It is called from the
    // loader's threads, possibly two at once for different indices (set the loader's
    // prefetch off for a function that is not thread-safe), and must depend only on the
    // index for batches to be reproducible. A status other than DT_OK ends the epoch
    // with the callback's message, prefixed by the index.
    dt_dataset_fill_fn fill;
    void              *user;
} dt_dataset_desc;

// Options for the datasets of this section: no normalisation (mean 0, std 1),
// num_classes 0 (labels need only be >= 0), no augmentation, no limit.
DT_API dt_dataset_opts dt_dataset_opts_plain(void);

// A dataset from a description (copied; the callback and user pointer are kept).
// `opts` NULL means dt_dataset_opts_plain(). DT_ERR_ARG naming the field when the
// shape, type, targets, channels (must be 0, 1 or shape[0], and ndim >= 2 for more
// than one) or augmentation (needs ndim >= 2, 0 <= crop_pad <= 4096) do not fit;
// DT_ERR_FORMAT naming the label and its index for a negative label or one >=
// num_classes (when num_classes > 0). Free with dt_dataset_free.
DT_API dt_status dt_dataset_init_desc(dt_dataset *ds, const dt_dataset_desc *d,
                                      const dt_dataset_opts *opts);

// A dataset from .npy files: samples `x_path` (N, shape...) of |u1 (kept as bytes),
// <f4 or <f8 (as floats) or <u2/<i4/<i8 (converted to floats), 1 to 4 dimensions after
// N (an (N) array is N samples of shape (1)); targets `y_path` (NULL: none) of N
// entries: integers (any npy integer dtype, as int labels) or floats (<f4/<f8, as
// float targets of the shape after N). DT_ERR_FORMAT when the counts differ (naming
// both files and counts), plus every dt_npy_read error. `opts` NULL means
// dt_dataset_opts_plain().
DT_API dt_status dt_dataset_load_npy(dt_dataset *ds, const char *x_path, const char *y_path,
                                     const dt_dataset_opts *opts);

// Makes samples indices[0..count) of any dataset as a batch: x (count, shape) through
// the steps above with `epoch` keying the augmentation, y (count) labels when the
// dataset has labels (else y may be NULL), t (count, target_elems) when it has float
// targets (else t may be NULL). DT_ERR_ARG for an index >= n; a callback's failure
// with its message prefixed "dataset sample <index>". Allocates nothing; any number
// of threads may gather from one dataset at once. (dt_dataset_gather is this with
// epoch 0, for the datasets whose gather cannot fail.)
DT_API dt_status dt_dataset_gather_at(const dt_dataset *ds, uint64_t epoch, const uint32_t *indices,
                                      size_t count, float *x, int32_t *y, float *t);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_DATA_H
