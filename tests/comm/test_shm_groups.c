// test_shm_groups.c: test_groups.c (sub-groups: the suite against serial references,
// errors, a rank killed inside a sub-group) on the shm backend.
int groups_main(void);
#define main groups_main
#include "test_groups.c"
#undef main

int main(void) {
    setenv("DT_TEST_BACKEND", "shm", 1);
    return groups_main();
}
