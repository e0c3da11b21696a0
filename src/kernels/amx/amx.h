// amx.h: the bf16 GEMM through AMX tiles (amx.c), the amx target's row, and its software
// model. Not selected by auto: only DT_PRECISION_PATH=amx (or dt_prec_path_set, nn/prec.h)
// uses it, since it has run on one AMX machine only and was not measured there. Its driver
// and packing are tested everywhere through a software model of the tiles (dt_gemm_amx
// with emulate = true).
#ifndef DTRAIN_KERNELS_AMX_AMX_H
#define DTRAIN_KERNELS_AMX_AMX_H

#include "kernels/table.h"

#if defined(__x86_64__)
// Whether the amx target is on (the CPU has AMX-TILE and AMX-BF16, and DT_ISA allows it)
// and the kernel let this process use tile data (arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA), asked once).
bool dt_amx_usable(void);
// C (+)= op(A) op(B) through 16 x 16 x 32 bf16 tiles (TDPBF16PS), or through the
// software model of the same tile operations when emulate is true (any x86-64 CPU).
dt_status dt_gemm_amx(bool emulate, bool trans_a, bool trans_b, int m, int n, int k, dt_gemm_opnd a,
                      dt_gemm_opnd b, float *c, int ldc, bool accumulate);
#else
// Other machine families build no amx folder (the Makefile leaves it out): no tiles.
static inline bool dt_amx_usable(void) {
    return false;
}
#endif

#endif // DTRAIN_KERNELS_AMX_AMX_H
