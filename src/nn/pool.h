// pool.h: the threads that split a batch inside one process. The calling thread is
// thread 0; dt_pool_run returns when every thread has finished the task. Inside a
// task, dt_pool_barrier lines all threads up (spinning briefly, then sleeping on a
// futex so oversubscribed cores are not burnt).
#ifndef DTRAIN_NN_POOL_H
#define DTRAIN_NN_POOL_H

#include "dtrain/core.h"

typedef struct dt_pool dt_pool;
typedef void (*dt_pool_fn)(void *arg, int ith, int nth);

dt_pool *dt_pool_init(int nthreads); // NULL on failure (message recorded)
void     dt_pool_free(dt_pool *p);   // NULL-safe; joins the threads
int      dt_pool_size(const dt_pool *p);
void     dt_pool_run(dt_pool *p, dt_pool_fn fn, void *arg);
void     dt_pool_barrier(dt_pool *p);

#endif // DTRAIN_NN_POOL_H
