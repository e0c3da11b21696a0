// mnist.c: the example's ConvNet constructor, built into the tests' library (mnist.h),
// and the short test split of the sanitizer builds.
#include "../../examples/mnist/convnet.c"

#include "mnist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char  short_dir[64];
static pid_t short_owner; // a forked child that calls exit() leaves the folder to its maker

static void remove_short_dir(void) {
    if (getpid() != short_owner)
        return;
    static const char *const names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    char                     p[PATH_MAX];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", short_dir, names[i]);
        unlink(p);
    }
    rmdir(short_dir);
}

bool tl_fmnist_short_test(size_t n) {
    if (short_dir[0])
        return true;
    const char *from                  = tl_fmnist_dir();
    char        dir[sizeof short_dir] = "/tmp/dt-fmnist-short-XXXXXX", a[PATH_MAX], b[PATH_MAX];
    if (!mkdtemp(dir))
        return false;
    memcpy(short_dir, dir, sizeof dir);
    short_owner = getpid();
    atexit(remove_short_dir);
    static const char *const train[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", from, train[i]);
        snprintf(b, sizeof b, "%s/%s", dir, train[i]);
        if (symlink(a, b) != 0)
            return false;
    }
    static const char *const test[] = {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 2; i++) {
        dt_idx x;
        snprintf(a, sizeof a, "%s/%s.gz", from, test[i]);
        snprintf(b, sizeof b, "%s/%s.gz", dir, test[i]);
        if (dt_idx_read_first(a, n, &x) != DT_OK)
            return false;
        x.dims[0]    = (uint32_t)x.nrecords;
        dt_status st = dt_idx_write(b, x.data, x.ndim, x.dims, true);
        dt_idx_free(&x);
        if (st != DT_OK)
            return false;
    }
    return setenv("DT_DATA_DIR", dir, 1) == 0;
}
