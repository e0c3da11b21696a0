// nccl.c: the NCCL backend's operations (src/comm/nccl/nccl_abi.h). Not written yet:
// the plugin offers no NCCL table, and asking for --backend nccl says so.
#include "cuda/cuda_impl.h"

const void *const cu_nccl_api = NULL;
