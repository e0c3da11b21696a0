// simd.h: run-time dispatch for our own hot loops. DT_CLONES asks GCC for an AVX-512,
// an AVX2+FMA and a baseline x86-64 version of a function and an ifunc resolver that
// picks one when the program loads, so one binary runs on any x86-64 and uses the
// widest vectors the CPU has. Empty with other compilers, under NATIVE=1 builds
// (everything is already compiled for the build machine) and under sanitizers.
#ifndef DTRAIN_SIMD_H
#define DTRAIN_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(DT_NO_CLONES) && \
    !defined(DT_SANITIZE)
#define DT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DT_CLONES
#endif

#endif // DTRAIN_SIMD_H
