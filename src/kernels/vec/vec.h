// vec.h: the portable vector kernels. Each file of src/kernels/vec is written once, in C
// with GCC's vector extensions on the target's own vector (vf of VL lanes:
// kernels/vmath.h), and compiled once per target by the Makefile: plain (ref), and on
// x86-64 with -march=x86-64-v3 (avx2) and -march=x86-64-v4 (avx512), DT_KVEC naming the
// target. Its kernels are static; its fill function, suffixed by the target (DT_KV), puts
// them in the table, and vec.c's dt_kvec_fill_<target> calls every file's. The compiler
// alone decides the instructions, so the arithmetic of a kernel on a target is what GCC
// makes of the C for that instruction set (with FMA contraction from avx2 up): the same
// on every CPU of that target.
#ifndef DTRAIN_KERNELS_VEC_H
#define DTRAIN_KERNELS_VEC_H

#include "kernels/table.h"
#include "kernels/vmath.h"

#ifndef DT_KVEC
#error "src/kernels/vec/*.c are compiled per target with -DDT_KVEC=<target> (Makefile)"
#endif

#define DT_KV_CAT_(a, b) a##_##b
#define DT_KV_CAT(a, b)  DT_KV_CAT_(a, b)
// name_<target>: dt_kvec_fill_act_avx2 for DT_KV(fill_act) in the avx2 object
#define DT_KV(name) DT_KV_CAT(dt_kvec_##name, DT_KVEC)
// this object's target, as a dt_isa
#define DT_KVEC_ISA_ref    DT_ISA_REF
#define DT_KVEC_ISA_avx2   DT_ISA_AVX2
#define DT_KVEC_ISA_avx512 DT_ISA_AVX512
#define DT_KVEC_ISA_neon   DT_ISA_NEON
#define DT_KV_ISA_(t)      DT_KVEC_ISA_##t
#define DT_KV_ISA(t)       DT_KV_ISA_(t)
#define DT_KVEC_ISA        DT_KV_ISA(DT_KVEC)

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// One per file of this folder.
void DT_KV(fill_act)(dt_ktab *t);
void DT_KV(fill_conv)(dt_ktab *t);
void DT_KV(fill_conv_wide)(dt_ktab *t);
void DT_KV(fill_shifted)(dt_ktab *t);
void DT_KV(fill_norm)(dt_ktab *t);
void DT_KV(fill_attn)(dt_ktab *t);
void DT_KV(fill_optim)(dt_ktab *t);
void DT_KV(fill_half)(dt_ktab *t);
void DT_KV(fill_reduce)(dt_ktab *t);
// vec.c: all of the above
void DT_KV(fill)(dt_ktab *t);

#endif // DTRAIN_KERNELS_VEC_H
