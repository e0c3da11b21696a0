// device.c: the trainer on a GPU (--device cuda[:N], --num-gpu-processes N). The
// model's graph runs through an executor (exec.h): the trainer places the parameters,
// buffers and optimizer state on the device after --load and --resume, runs each
// micro-batch's forward, loss and backward there (dt_trainer_device_step; the loss is
// the program's dt_trainer_set_loss), and steps the optimizer there. The host copies
// (the graph's dt_params, the optimizer's state) are what checkpoints, evaluations and
// --save-model read: they are brought back whenever one of those is about to read them
// (host_stale). DDP reduces over the process group through host memory: at a window's
// last micro-batch the device's gradients come back, DDP's buckets reduce them, and the
// averaged gradients go back before the step; with the nccl backend (each process on a
// GPU of its own) the device's gradients are averaged in place instead, one all-reduce
// before the step (no overlap with backward yet).
#include "train_impl.h"

#include <math.h>
#include <string.h>

bool dt_train_device_wanted(const dt_trainer *t) {
    return t->a.device && strncmp(t->a.device, "cuda", 4) == 0;
}

dt_status dt_train_device_args(dt_train_args *a) {
    const char *d  = a->device;
    bool        ok = !d || !strcmp(d, "cpu") || !strcmp(d, "cuda");
    if (d && !ok && !strncmp(d, "cuda:", 5) && d[5]) { // cuda:N, N decimal
        ok = true;
        for (const char *c = d + 5; *c; c++)
            ok &= *c >= '0' && *c <= '9';
    }
    if (!ok)
        return dt_fail(DT_ERR_ARG, "--device expects cpu, cuda or cuda:N, found \"%s\"", d);
    if (a->num_gpu_processes > 0) {
        if (a->num_processes > 0 && a->num_processes != a->num_gpu_processes)
            return dt_fail(DT_ERR_ARG, "--num-gpu-processes %ld and --num-processes %ld: give one",
                           a->num_gpu_processes, a->num_processes);
        if (a->device && strcmp(a->device, "cpu") == 0)
            return dt_fail(DT_ERR_ARG, "--num-gpu-processes trains on GPUs; --device cpu "
                                       "contradicts it");
        a->num_processes = a->num_gpu_processes;
        if (!a->device)
            a->device = "cuda";
    }
    return DT_OK;
}

// The backend of a worker's group: --backend as given; with --device cuda and --backend
// auto (or none), nccl when every local rank has a GPU of its own (NCCL refuses two
// ranks on one GPU), else auto's choice (shm or tcp, through host memory). In the worker,
// before the group: CUDA is first touched here, never in a parent that forks.
const char *dt_train_device_backend(const dt_trainer *t) {
    const char *b = t->a.backend;
    if (!dt_train_device_wanted(t) || (b && strcmp(b, "auto") != 0))
        return b;
    long local = 0;
    int  gpus  = 0;
    if (dt_env_int("LOCAL_WORLD_SIZE", 0, 1 << 20, 0, &local) != DT_OK || local <= 0 ||
        dt_device_cuda_count(&gpus) != DT_OK || gpus < local) {
        dt_clear_error(); // the device's own error comes with dt_trainer_prepare*
        return b;
    }
    return "nccl";
}

// Whether the group reduces device buffers in place (nccl) rather than through DDP's
// host buckets.
static bool reduces_on_device(const dt_trainer *t) {
    return t->pg && strcmp(dt_pg_backend(t->pg), "nccl") == 0;
}

// What the GPU path does not do yet, refused at start with the reason.
static dt_status check_supported(const dt_trainer *t) {
    const dt_train_args *a   = &t->a;
    const char          *why = NULL;
    if (!t->m && !t->g)
        why = "the model is not a graph (a hand-written network's own code runs on the CPU)";
    else if (t->prec == DT_PREC_FP16)
        why = "--precision fp16 (bf16 runs on the GPU; fp16's loss scaling does not yet)";
    else if (a->zero > 0)
        why = "--zero (ZeRO's sharded steps run on host buffers)";
    else if (dt_train_mesh_on(t))
        why = "--pp or --tp (pipeline stages and tensor-parallel splits run on the CPU)";
    else if (a->data_parallel > 1)
        why = "--data-parallel (replicas are threads of the CPU)";
    else if (t->join)
        why = "uneven inputs (DT_SPLIT_TRAIN_UNEVEN)";
    else if (a->ddp_compress && strcmp(a->ddp_compress, "none") != 0)
        why = "--ddp-compress";
    return why ? dt_fail(DT_ERR_UNSUPPORTED, "--device %s: not with %s", a->device, why) : DT_OK;
}

// The device of this rank: "cuda" is GPU LOCAL_RANK % count, as torchrun's users pick it
// (torch.cuda.set_device(local_rank)); "cuda:N" is N.
static dt_status pick_device(dt_trainer *t, dt_device **d) {
    const char *spec = t->a.device;
    if (strcmp(spec, "cuda") != 0)
        return dt_device_get(d, spec);
    int n = 0;
    DT_TRY(dt_device_cuda_count(&n));
    char name[24];
    snprintf(name, sizeof name, "cuda:%d", t->local_rank % n);
    return dt_device_get(d, name);
}

dt_status dt_train_device_start(dt_trainer *t) {
    if (!dt_train_device_wanted(t))
        return DT_OK;
    DT_TRY(check_supported(t));
    if (!t->dloss_set)
        return dt_fail(DT_ERR_STATE,
                       "--device %s: the program did not say its loss "
                       "(dt_trainer_set_loss before dt_trainer_prepare*)",
                       t->a.device);
    DT_TRY(pick_device(t, &t->dev));
    dt_graph    *g = t->g ? t->g : dt_model_graph(t->m);
    dt_exec_opts o = dt_exec_opts_default();
    o.precision    = t->prec;
    o.max_batch    = t->batch ? (int)t->batch : (int)t->step_samples;
    DT_TRY(dt_exec_new(&t->exec, g, t->dev, &o));
    if (dt_optim_step_count(t->opt) > 0) // resumed: the optimizer's state goes along
        DT_TRY(dt_exec_push(t->exec, DT_EXEC_OPTIM, t->opt));
    char buf[256];
    dt_trainer_print_local(t, "Training on %s: %s\n", dt_device_name(t->dev),
                           dt_device_describe(t->dev, buf, sizeof buf));
    return DT_OK;
}

dt_status dt_train_device_pull(dt_trainer *t) {
    if (!t->exec || !t->host_stale)
        return DT_OK;
    DT_TRY(dt_exec_pull(t->exec, DT_EXEC_PARAMS | DT_EXEC_BUFFERS | DT_EXEC_OPTIM, t->opt));
    t->host_stale = false;
    return DT_OK;
}

void dt_train_device_release(dt_trainer *t) {
    dt_exec_free(t->exec);
    t->exec = NULL, t->dev = NULL, t->host_stale = false;
}

// ------------------------------------------------------------------------ public

bool dt_trainer_on_gpu(const dt_trainer *t) {
    return dt_train_device_wanted(t);
}

dt_exec *dt_trainer_exec(dt_trainer *t) {
    return t->exec;
}

dt_status dt_trainer_set_loss(dt_trainer *t, const dt_loss_spec *l) {
    if (!l)
        return dt_fail(DT_ERR_ARG, "dt_trainer_set_loss: expected a loss");
    t->dloss     = *l;
    t->dloss_set = true;
    return DT_OK;
}

dt_status dt_trainer_device_step(dt_trainer *t, const void *const *inputs, const void *targets,
                                 int batch, float *loss) {
    if (!t->exec)
        return dt_fail(DT_ERR_STATE, "dt_trainer_device_step: expected --device cuda and "
                                     "dt_trainer_prepare first");
    if (t->micro == 0) // a window's first micro-batch: the gradients start from zero
        DT_TRY(dt_exec_zero_grad(t->exec));
    if (t->micro == 0 && dt_train_dp_group(t) && t->o.broadcast_buffers) { // rank 0's
        DT_TRY(dt_exec_pull(t->exec, DT_EXEC_BUFFERS, NULL));              // statistics
        DT_TRY(dt_strategy_share_buffers(t->strat));
        DT_TRY(dt_exec_push(t->exec, DT_EXEC_BUFFERS, NULL));
    }
    dt_exec_set_rng(t->exec, &t->er);
    DT_TRY(dt_exec_set_sample_keys(t->exec, t->total_steps > 0 ? NULL : t->keys,
                                   t->total_steps > 0 ? 0 : batch));
    DT_TRY(dt_exec_train_step(t->exec, inputs, targets, batch, &t->dloss, loss));
    t->host_stale = true;
    if (dt_train_dp_group(t) && t->sync && !reduces_on_device(t)) { // to the host; DDP's
        DT_TRY(dt_exec_pull(t->exec, DT_EXEC_GRADS, NULL));         // buckets reduce it
        DT_TRY(dt_strategy_grads_ready(t->strat));
    }
    return DT_OK;
}

// A window's end on the device: the reduced gradients back (DDP), their mean over the
// window's micro-batches, clipping, the schedule's rate and the optimizer's step.
dt_status dt_train_device_update(dt_trainer *t) {
    if (t->pg && reduces_on_device(t)) { // NCCL: the mean over the ranks, in place
        dt_params *dp = dt_exec_params(t->exec);
        DT_TRY(dt_pg_all_reduce(t->pg, dt_params_device_grads(dp), dt_params_device_grads(dp),
                                dt_params_numel(dp), DT_FLOAT32, DT_REDUCE_AVG));
    } else if (dt_train_dp_group(t)) { // DDP's buckets, on the host
        DT_TRY(dt_strategy_reduce(t->strat, 1, 0));
        DT_TRY(dt_exec_push(t->exec, DT_EXEC_GRADS, NULL));
    }
    if (t->window > 1)
        DT_TRY(dt_exec_scale_grads(t->exec, 1.0f / (float)t->window));
    if (t->a.clip_grad > 0) { // torch.nn.utils.clip_grad_norm_
        DT_TRY(dt_exec_grad_norm(t->exec, &t->grad_norm));
        float c = (float)t->a.clip_grad / (t->grad_norm + 1e-6f);
        if (isfinite(t->grad_norm) && c < 1.0f)
            DT_TRY(dt_exec_scale_grads(t->exec, c));
    }
    if (t->sched && t->opt)
        DT_TRY(dt_sched_apply(t->sched, t->opt, t->step));
    DT_TRY(dt_exec_optim_step(t->exec, t->opt));
    t->host_stale = true;
    return DT_OK;
}
