// test_shm_collectives.c: comm's collective suite (test_collectives.c: every collective
// against a serial reference, worlds 1-5, every dtype and op, counts up to 16 Mi, in
// place, async operations in flight) run on the shm backend through the process group.
// The suite is included as it is, its main renamed, so both backends pass the very
// same checks. It runs with the default chunk size, then with 4 KiB chunks so that
// every count above a few hundred elements streams through many chunks (under the
// sanitizers, 5-20x slower, only the latter: test_shm_engine covers the default there).
int collectives_main(void);
#define main collectives_main
#include "test_collectives.c"
#undef main

int main(void) {
    setenv("DT_TEST_BACKEND", "shm", 1);
    int failed = 0;
#ifndef DT_SANITIZE
    unsetenv("DT_SHM_CHUNK_BYTES");
    failed |= collectives_main();
#endif
    setenv("DT_SHM_CHUNK_BYTES", "4096", 1);
    failed |= collectives_main();
    unsetenv("DT_SHM_CHUNK_BYTES");
    return failed ? 1 : 0;
}
