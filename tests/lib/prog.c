// prog.c: see prog.h.
#include "prog.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

bool test_program_path(const char *name, char *out, size_t n) {
    char    exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return false;
    exe[len] = '\0';
    for (int up = 0; up < 3; up++) { // strip test_x, the group, tests
        char *s = strrchr(exe, '/');
        if (!s)
            return false;
        *s = '\0';
    }
    static const char *const dirs[] = {"/bin/", "/../bin/"};
    for (int i = 0; i < 2; i++) {
        int w = snprintf(out, n, "%s%s%s", exe, dirs[i], name);
        if (w > 0 && (size_t)w < n && access(out, X_OK) == 0)
            return true;
    }
    return false;
}

int test_vrun(char **out, const char *fmt, va_list ap) {
    char cmd[4 * PATH_MAX];
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    size_t cap = 1 << 16, len = 0, k;
    *out    = calloc(cap, 1);
    FILE *p = popen(cmd, "r");
    if (!p || !*out) {
        if (p)
            pclose(p);
        return -1;
    }
    while ((k = fread(*out + len, 1, cap - len - 1, p)) > 0)
        if ((len += k) + 1 >= cap) {
            char *bigger = realloc(*out, cap *= 2);
            if (!bigger)
                break;
            *out = bigger;
        }
    (*out)[len] = '\0';
    int st      = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int test_run(char **out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = test_vrun(out, fmt, ap);
    va_end(ap);
    return rc;
}
