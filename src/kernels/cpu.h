// cpu.h: the one place that asks the CPU what it is. Features, cache sizes and the
// model name are probed once; DT_ISA caps the kernel targets the table may use, each
// level including those below it (ref < avx2 < avx512 < avx512bf16 < amx on x86-64,
// ref < neon on arm64), as ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA do for PyTorch.
// Every other file asks this one (dt_cpu_get, dt_isa_on) instead of cpuid.
#ifndef DTRAIN_KERNELS_CPU_H
#define DTRAIN_KERNELS_CPU_H

#include "dtrain/core.h"

// Kernel targets, in the order of DT_ISA's levels: a target is usable when the CPU
// has it and it is not above the cap. The x86 and arm targets never meet: on one
// machine the other family's targets are absent.
typedef enum dt_isa {
    DT_ISA_REF = 0,    // portable C, every machine
    DT_ISA_AVX2,       // x86-64-v3: AVX2, FMA, F16C, BMI2
    DT_ISA_AVX512,     // x86-64-v4: AVX-512 F, BW, DQ, VL
    DT_ISA_AVX512BF16, // and AVX512-BF16 (VDPBF16PS)
    DT_ISA_AMX,        // and AMX tiles with bf16
    DT_ISA_NEON,       // arm64 Advanced SIMD (every arm64 CPU)
    DT_ISA_COUNT_
} dt_isa;

typedef struct dt_cpu {
    char   model[64];          // "AMD EPYC 7B13", "Neoverse-N1", ...
    dt_isa best;               // the highest target the CPU has
    dt_isa cap;                // DT_ISA's cap (best when unset)
    bool   has[DT_ISA_COUNT_]; // which targets the CPU has (before the cap)
    bool   avx512fp16;         // reported only: no kernel uses it yet
    size_t l1d, l2, l3;        // bytes: L1 data and L2 per core, L3 per package
    int    cores;              // online CPUs
} dt_cpu;

// The probe's result (probed on first use; thread-safe). An unknown DT_ISA value is
// reported by dt_cpu_check and ignored here (the cap is then the CPU's best).
const dt_cpu *dt_cpu_get(void);
// DT_ERR_ARG naming the value and the choices when DT_ISA is not one of them, or names
// a target of the other architecture; DT_OK otherwise. The graph and the trainer call
// it when they start, so a mistyped DT_ISA stops a run before it trains.
dt_status dt_cpu_check(void);
// Whether kernels of target t may run: the CPU has it and it is within the cap.
bool dt_isa_on(dt_isa t);
// The highest usable target of the machine's family ("avx2", "neon", "ref").
dt_isa      dt_isa_top(void);
const char *dt_isa_name(dt_isa t);
// One line naming the CPU, its caches and the kernel targets in use, e.g.
// "AMD EPYC 7B13 (L1d 32 KiB, L2 512 KiB, L3 32 MiB, 2 CPUs): kernels avx2 (DT_ISA
// unset; has avx2)"; into buf, which it returns.
const char *dt_cpu_describe(char *buf, size_t n);

#endif // DTRAIN_KERNELS_CPU_H
