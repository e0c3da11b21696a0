// compress.h: the 16-bit gradient compression hooks of ddp.h (dt_ddp_compress).
#ifndef DTRAIN_DDP_COMPRESS_H
#define DTRAIN_DDP_COMPRESS_H

#include "dtrain/ddp.h"

// Makes the state of a bf16 or fp16 compression hook for a group of `world` ranks and
// fills *hook with its functions; *state is freed with ddp_compress_free.
dt_status ddp_compress_new(void **state, dt_ddp_comm_hook *hook, dt_ddp_compress kind, int world);
void      ddp_compress_free(void *state); // NULL-safe

#endif // DTRAIN_DDP_COMPRESS_H
