// params.h: the parameter contract ("bring your own gradients"). What DDP, optimizers
// and checkpoints consume: a flat float buffer of parameters, a flat buffer of their
// gradients (same length, same layout), the table of named tensors that slices them,
// a separate flat buffer of non-trainable state (BatchNorm running statistics: saved in
// checkpoints and broadcast from rank 0 when DDP starts, never reduced or optimised)
// with a table of its own, and the gradient-ready hook.
//
// dt_model is one provider (dt_model_as_params). A network with a hand-written
// backward, or another framework's buffers, is another: describe the tensors, then
// either let dt_params allocate the buffers or bind your own.
//
//     dt_params *p;
//     dt_params_new(&p, NULL);
//     int64_t w1[2] = {128, 784}, b1[1] = {128};
//     dt_params_add(p, "fc1.weight", 2, w1, 0);
//     dt_params_add(p, "fc1.bias", 1, b1, DT_PARAM_NO_DECAY);
//     dt_params_alloc(p);                     // or dt_params_bind(p, my_w, my_g, NULL)
//     float *w = dt_params_data(p), *g = dt_params_grads(p);
//     ... backward writes g; after the last write to a tensor's gradient:
//     dt_params_grad_ready(p, offset, count); // DDP starts reducing that bucket
//
// Tensors are laid out contiguously in registration order: tensor i starts where
// tensor i - 1 ends (offsets in floats). Buffers likewise, in their own buffer.
#ifndef DTRAIN_PARAMS_H
#define DTRAIN_PARAMS_H

#include "dtrain/core.h"
#include "dtrain/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_params dt_params;

#define DT_PARAM_NAME_MAX 63 // bytes in a tensor name
#define DT_PARAM_MAX_DIMS 4

// Per-tensor flags (hints for consumers; none changes the layout).
enum {
    DT_PARAM_FROZEN = 1u << 0,   // not trainable (requires_grad=False): optimizers skip it,
                                 // DDP does not wait for its gradient, clipping ignores it
    DT_PARAM_NO_DECAY = 1u << 1, // a bias or a norm's scale/shift: exclude from weight
                                 // decay (dt_param_no_decay selects these)
};

// A tensor that is one rank's part of a larger one split over ranks (tensor
// parallelism, tp.h): the whole tensor's dimension `axis` is cut into `groups` equal
// blocks, each block into `parts` equal pieces, and this tensor is piece `part` of every
// block, concatenated in block order. Megatron's column-parallel Linear holds rows (axis
// 0) of the weight, its fused q|k|v weight piece `part` of each of its 3 blocks
// (groups 3), a row-parallel one columns (axis 1). parts 0 or 1: not split (the
// zeroed default). Consumers: gradient norms summed over the group, whole models
// gathered from the parts (--save-model) or cut into them (--load, initialisation).
typedef struct dt_param_split {
    int axis, parts, part, groups; // groups 0 means 1
} dt_param_split;

// One named tensor: a slice of the flat parameter (or buffer) storage. Names of a
// dt_model follow PyTorch's nn.Sequential state_dict keys: "<layer>.weight".
typedef struct dt_param_info {
    char           name[DT_PARAM_NAME_MAX + 1];
    size_t         offset; // in floats, into dt_params_data / dt_params_grads (or the buffers)
    size_t         count;  // floats: the product of the shape
    int            ndim;   // 1..4
    int64_t        shape[DT_PARAM_MAX_DIMS]; // unused dimensions are 1
    int            layer;                    // the owning layer of a dt_model; -1 otherwise
    bool           trainable;                // !(flags & DT_PARAM_FROZEN)
    uint32_t       flags;                    // DT_PARAM_*
    dt_param_split split;                    // tensor parallelism: this rank's part (parts > 1)
} dt_param_info;

// Called when floats [offset, offset + count) of the gradient buffer are final for this
// backward (they will not be written again until the next one), on the producer's
// thread. Ranges cover whole tensors; in a backward they usually arrive last tensor
// first. DDP's reducer is such a consumer. A failure (a range that cuts a tensor, a
// tensor reported twice, a reduction that could not start) is returned: the producer's
// dt_params_grad_ready returns it, and so the backward that reported the range.
typedef dt_status (*dt_grad_ready_fn)(void *user, size_t offset, size_t count);

typedef struct dt_params_opts {
    int max_hooks; // gradient-ready consumers that may be registered at once (0 = 4)
} dt_params_opts;

DT_API dt_params_opts dt_params_opts_default(void);

// An empty table. *out stays NULL on failure. Free with dt_params_free.
DT_API dt_status dt_params_new(dt_params **out, const dt_params_opts *opts);
DT_API void      dt_params_free(dt_params *p); // NULL-safe; frees owned buffers only

// Declares the next trainable tensor (or, with DT_PARAM_FROZEN, a frozen one) of the
// parameter buffer, or the next tensor of the buffer storage. Names are 1..63 bytes
// and unique within their table; ndim 1..4; every dimension >= 1. DT_ERR_STATE after
// dt_params_alloc / dt_params_bind. Offsets follow from the order (dt_params_info).
DT_API dt_status dt_params_add(dt_params *p, const char *name, int ndim, const int64_t *shape,
                               uint32_t flags);
DT_API dt_status dt_params_add_buffer(dt_params *p, const char *name, int ndim,
                                      const int64_t *shape, uint32_t flags);
// Also records the owning layer index (providers like dt_model).
DT_API dt_status dt_params_add_ex(dt_params *p, const char *name, int ndim, const int64_t *shape,
                                  uint32_t flags, int layer, bool buffer);

// Marks parameter tensor i as one part of a split tensor (shape: the part's, as declared).
// DT_ERR_ARG unless 0 <= part < parts, 0 <= axis < ndim and the part's dimension `axis`
// divides into `groups` blocks. Before the storage is set, like dt_params_add.
DT_API dt_status dt_params_set_split(dt_params *p, int i, const dt_param_split *split);

// Allocates zeroed parameter, gradient and buffer storage (64-byte aligned), owned.
DT_API dt_status dt_params_alloc(dt_params *p);
// Uses the caller's storage instead (borrowed: it must outlive p): params and grads
// hold dt_params_numel floats each, buffers dt_params_buffer_numel (NULL when 0).
DT_API dt_status dt_params_bind(dt_params *p, float *params, float *grads, float *buffers);
DT_API bool      dt_params_ready(const dt_params *p); // allocated or bound

// --------------------------------------------------------------------- inspecting
DT_API float *dt_params_data(dt_params *p);    // numel floats (NULL before alloc/bind)
DT_API float *dt_params_grads(dt_params *p);   // numel floats
DT_API float *dt_params_buffers(dt_params *p); // buffer_numel floats (NULL when none)
DT_API size_t dt_params_numel(const dt_params *p);
DT_API size_t dt_params_buffer_numel(const dt_params *p);
DT_API int    dt_params_count(const dt_params *p);        // parameter tensors
DT_API int    dt_params_buffer_count(const dt_params *p); // buffer tensors
// Tensor i of the parameter (or buffer) table; NULL when out of range.
DT_API const dt_param_info *dt_params_info(const dt_params *p, int i);
DT_API const dt_param_info *dt_params_buffer_info(const dt_params *p, int i);
// Index of the tensor named `name`, or -1.
DT_API int dt_params_find(const dt_params *p, const char *name);
// Floats of trainable tensors (the optimizer's work).
DT_API size_t dt_params_trainable_numel(const dt_params *p);

// Sets every gradient to 0 (with dt_params_set_discard_grads, by dt_params_discard).
DT_API void dt_params_zero_grad(dt_params *p);

// Whether a split describes a tensor cut into parts (parts > 1).
DT_API bool dt_param_split_on(const dt_param_split *s);
// The whole tensor's shape from a part's (the split axis times parts) into whole[ndim].
DT_API void dt_param_split_whole_shape(const dt_param_split *s, int ndim, const int64_t *part,
                                       int64_t *whole);
// Copies between a whole tensor (the unsplit shape) and its part `s->part` (shape
// part_shape, ndim dims): to_whole false takes the part's elements out of `whole`, true
// writes them into their places in `whole` (the other parts' places untouched).
DT_API void dt_param_split_copy(const dt_param_split *s, int ndim, const int64_t *part_shape,
                                float *whole, float *part, bool to_whole);
// ------------------------------------------------------------------------- pages
// dt_params_alloc maps the parameter and gradient buffers page by page (core.h's
// dt_alloc_pages): a page costs memory only once written. Sharding over ranks (ZeRO-3,
// zero.h) keeps only a rank's share of them written and gives the rest back:
// dt_params_discard sets floats [offset, offset + count) of the gradients (grads true)
// or of the parameters to 0 and returns the whole pages among them to the system (a
// range reaching the end takes the padding after the last float too). With storage
// bound by dt_params_bind it only writes zeros. DT_ERR_ARG outside the buffer.
DT_API dt_status dt_params_discard(dt_params *p, bool grads, size_t offset, size_t count);
// Bytes of the resident pages that floats [offset, offset + count) touch (mincore).
DT_API size_t dt_params_resident(dt_params *p, bool grads, size_t offset, size_t count);
// dt_params_zero_grad discards the whole gradient buffer instead of writing zeros over
// it (ZeRO-3 sets this: writing zeros would bring every page back).
DT_API void dt_params_set_discard_grads(dt_params *p, bool on);

// ------------------------------------------------------------ parameter-use hook
// A provider that runs a model (the graph does) announces, around each step of a
// forward or backward pass, which parameter tensors that step reads (and, in backward,
// whose gradients it adds to), so that a consumer keeping the parameters elsewhere can
// bring them in just before and drop them after: ZeRO-3 (zero.h) gathers a tensor
// from the ranks that own it. A pass is DT_USE_BEGIN, then per step DT_USE_ACQUIRE and
// DT_USE_RELEASE of its tensors (indices into the table, each once), then DT_USE_END;
// `backward` tells the passes apart. A consumer's failure (a collective that failed)
// is returned to the provider, which stops the pass with it.
typedef enum dt_param_use {
    DT_USE_BEGIN,   // a pass starts (tensors NULL, n 0)
    DT_USE_ACQUIRE, // the step about to run reads tensors[0..n)
    DT_USE_RELEASE, // that step is done with them
    DT_USE_END,     // the pass is over
} dt_param_use;
typedef dt_status (*dt_param_use_fn)(void *user, dt_param_use what, bool backward,
                                     const int *tensors, int n);
// Providers: announces an event to the consumer (DT_OK when none is set). DT_ERR_ARG for
// a tensor index outside the table.
DT_API dt_status dt_params_use(dt_params *p, dt_param_use what, bool backward, const int *tensors,
                               int n);
// Providers that announce every read this way say so once (the graph does when it is
// finalized); ZeRO-3 needs such a provider.
DT_API void dt_params_set_announces_use(dt_params *p, bool on);
DT_API bool dt_params_announces_use(const dt_params *p);
// Consumers: the one consumer (fn NULL removes it). DT_ERR_STATE when another is set.
DT_API dt_status dt_params_set_use_hook(dt_params *p, dt_param_use_fn fn, void *user);
DT_API bool      dt_params_has_use_hook(const dt_params *p);

// A predicate over tensors: parameter groups, selection.
typedef bool (*dt_param_pred)(const dt_param_info *t, void *user);
// True for tensors flagged DT_PARAM_NO_DECAY (biases, norms).
DT_API bool dt_param_no_decay(const dt_param_info *t, void *user);

// ------------------------------------------------------------- gradient-ready hook

// Producers: floats [offset, offset + count) of the gradients are final for this
// backward. Calls every registered consumer in registration order and returns the first
// failure among them (every consumer is called even so). A range must lie within the
// buffer (DT_ERR_ARG otherwise); consumers may require whole tensors.
DT_API dt_status dt_params_grad_ready(dt_params *p, size_t offset, size_t count);
// Consumers: registers fn(user, offset, count). DT_ERR_STATE when max_hooks are set.
DT_API dt_status dt_params_add_grad_hook(dt_params *p, dt_grad_ready_fn fn, void *user);
// Removes the (fn, user) registration; a no-op when absent.
DT_API void dt_params_remove_grad_hook(dt_params *p, dt_grad_ready_fn fn, void *user);

// ------------------------------------------------------------------------ devices
// A table's storage may live on a device (device.h): a GPU executor (exec.h) binds its
// device memory with dt_params_bind_device. For such a table dt_params_data,
// dt_params_grads and dt_params_buffers return NULL and record DT_ERR_STATE naming the
// device (host code must never be handed a device pointer); dt_params_device_data,
// _grads and _buffers return the device pointers; dt_params_to_host and
// dt_params_from_host copy the parameters and buffers (not the gradients) between it and
// a host table of the same layout: checkpoints always write host copies. For a host
// table, dt_params_device is NULL and the _device_ accessors return the host pointers.
// dt_params_zero_grad works on either; dt_params_discard is host-only
// (DT_ERR_UNSUPPORTED).
DT_API dt_status  dt_params_bind_device(dt_params *p, dt_device *d, void *params, void *grads,
                                        void *buffers);
DT_API dt_device *dt_params_device(const dt_params *p); // NULL: host storage
DT_API void      *dt_params_device_data(dt_params *p);
DT_API void      *dt_params_device_grads(dt_params *p);
DT_API void      *dt_params_device_buffers(dt_params *p);
// DT_ERR_MISMATCH naming both layouts when they differ; DT_ERR_ARG when `host` is not
// host storage.
DT_API dt_status dt_params_to_host(dt_params *src, dt_params *host);
DT_API dt_status dt_params_from_host(dt_params *dst, dt_params *host);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_PARAMS_H
