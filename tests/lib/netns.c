// netns.c: see netns.h.
#include "netns.h"

#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int netns_sh(const char *fmt, ...) {
    char    cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Namespaces <prefix>-<pid>-* of earlier runs whose process is gone.
static void remove_stale(const char *prefix) {
    DIR *d = opendir("/var/run/netns");
    if (!d)
        return;
    size_t         pl = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        if (strncmp(e->d_name, prefix, pl) == 0 && e->d_name[pl] == '-' &&
            sscanf(e->d_name + pl + 1, "%d-", &pid) == 1 && pid != (int)getpid() &&
            kill(pid, 0) != 0)
            netns_sh("ip netns del %s 2>/dev/null", e->d_name);
    }
    closedir(d);
}

bool netns_pair_setup(netns_pair *p, const char *prefix, const char *tag, const char *subnet,
                      char *why, size_t n) {
    memset(p, 0, sizeof *p);
    if (geteuid() != 0) {
        snprintf(why, n, "not root (network namespaces need CAP_SYS_ADMIN)");
        return false;
    }
    remove_stale(prefix);
    for (int i = 0; i < 2; i++) {
        snprintf(p->ns[i], sizeof p->ns[i], "%s-%d-%c", prefix, (int)getpid(), 'a' + i);
        snprintf(p->veth[i], sizeof p->veth[i], "%.3s%d%c", tag, (int)getpid() % 100000, 'a' + i);
    }
    if (netns_sh("ip netns add %s 2>/dev/null", p->ns[0]) != 0) {
        snprintf(why, n, "\"ip netns add\" failed (no iproute2, or no namespace support)");
        return false;
    }
    p->made = true;
    if (netns_sh("ip netns add %s", p->ns[1]) ||
        netns_sh("ip link add %s type veth peer name %s", p->veth[0], p->veth[1]) ||
        netns_sh("ip link set %s netns %s", p->veth[0], p->ns[0]) ||
        netns_sh("ip link set %s netns %s", p->veth[1], p->ns[1]) ||
        netns_sh("ip -n %s addr add %s.1/24 dev %s", p->ns[0], subnet, p->veth[0]) ||
        netns_sh("ip -n %s addr add %s.2/24 dev %s", p->ns[1], subnet, p->veth[1])) {
        snprintf(why, n, "could not create the veth pair between the namespaces");
        return false;
    }
    for (int i = 0; i < 2; i++)
        if (netns_sh("ip -n %s link set lo up", p->ns[i]) ||
            netns_sh("ip -n %s link set %s up", p->ns[i], p->veth[i])) {
            snprintf(why, n, "could not bring the links up");
            return false;
        }
    return true;
}

void netns_pair_teardown(netns_pair *p) {
    if (!p->made)
        return;
    for (int i = 0; i < 2; i++)
        netns_sh("ip netns del %s 2>/dev/null", p->ns[i]);
    p->made = false;
}
