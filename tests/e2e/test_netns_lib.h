// test_netns_lib.h: what the tests with network namespaces as nodes share (after
// test_dtrun_lib.h; static functions, included once per test binary): starting a command
// as node i of a tests/lib/netns.h network, and finding the processes a scenario left.
#ifndef DTRAIN_TESTS_E2E_NETNS_LIB_H
#define DTRAIN_TESTS_E2E_NETNS_LIB_H

#include "../lib/netns.h"
#include "test_dtrun_lib.h"

#include <sched.h>

// Starts argv (a dtrun or a program) as node i of net inside its namespace (setns before
// exec; same pid), stdout and stderr in dir/node<i>.out and .err (tag, when not NULL,
// replaces "node<i>"), with the harness's variables (DT_HOST_ID node-a, node-b, ...: the
// namespaces share a hostname; DT_TIMEOUT_MS; the scenario's marker) and then those of
// env ("NAME=value", NULL-terminated; may be NULL).
DTRUN_TEST_FN void start_in_ns(const netns_net *net, run *r, const char *dir, int i,
                               const char *tag, char **argv, const char *timeout_ms,
                               const char *const *env) {
    memset(r, 0, sizeof *r);
    r->rc = -1;
    char name[32], host[16];
    snprintf(name, sizeof name, "node%d", i);
    snprintf(host, sizeof host, "node-%c", 'a' + i);
    snprintf(r->out_path, sizeof r->out_path, "%s/%s.out", dir, tag ? tag : name);
    snprintf(r->err_path, sizeof r->err_path, "%s/%s.err", dir, tag ? tag : name);
    char nspath[128];
    snprintf(nspath, sizeof nspath, "/var/run/netns/%s", net->ns[i]);
    fflush(NULL);
    r->start = mono_s();
    r->pid   = fork();
    if (r->pid == 0) {
        int fd = open(nspath, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
            _exit(126);
        int o = open(r->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(r->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        setenv("DT_HOST_ID", host, 1);
        setenv("DT_TIMEOUT_MS", timeout_ms, 1);
        setenv("DTRUN_TEST_MARK", mark, 1);
        unsetenv("MASTER_ADDR");
        unsetenv("MASTER_PORT");
        unsetenv("RANK");
        unsetenv("WORLD_SIZE");
        for (int j = 0; env && env[j]; j++)
            putenv((char *)(uintptr_t)env[j]);
        execv(argv[0], argv);
        _exit(127);
    }
}

// Processes whose environment holds the marker (the workers inherit dtrun's).
DTRUN_TEST_FN int env_marker_procs(void) {
    DIR *d = opendir("/proc");
    int  n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == (int)getpid())
            continue;
        char path[64], buf[65536];
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t k = read(fd, buf, sizeof buf);
        close(fd);
        if (k > 0 && memmem(buf, (size_t)k, mark, strlen(mark)))
            n++;
    }
    closedir(d);
    return n;
}

// Whether the scenario's processes are all gone (waiting up to wait_s).
DTRUN_TEST_FN bool none_left(double wait_s) {
    double deadline = mono_s() + wait_s;
    int    n;
    while ((n = env_marker_procs()) > 0 && mono_s() < deadline)
        sleep_s(0.02);
    if (n)
        fprintf(stderr, "     %d process(es) of the job left behind\n", n);
    return n == 0;
}

#endif
