// openblas.h: OpenBLAS as a provider of the sgemm row (the avx512 targets' GEMM). dtrain
// splits batches over threads of its own (nn/pool.c); OpenBLAS threads inside each call
// would compete with them for the same cores, so it runs on one thread. OpenBLAS chooses
// its kernels when it is loaded, from the CPU or from OPENBLAS_CORETYPE.
#ifndef DTRAIN_KERNELS_OPENBLAS_H
#define DTRAIN_KERNELS_OPENBLAS_H

// Sets OpenBLAS to one thread, once (thread-safe), and logs its configuration.
void dt_k_openblas_init(void);
// "OpenBLAS 0.3.21 ..., kernels Haswell": its build and the kernels it chose.
const char *dt_k_openblas_info(void);

#endif // DTRAIN_KERNELS_OPENBLAS_H
