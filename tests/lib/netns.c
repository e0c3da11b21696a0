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

bool netns_setup(netns_net *p, int n, const char *prefix, const char *tag, const char *subnet,
                 char *why, size_t why_n) {
    memset(p, 0, sizeof *p);
    if (n < 2 || n > NETNS_MAX) {
        snprintf(why, why_n, "expected 2 to %d nodes, found %d", NETNS_MAX, n);
        return false;
    }
    if (geteuid() != 0) {
        snprintf(why, why_n, "not root (network namespaces need CAP_SYS_ADMIN)");
        return false;
    }
    remove_stale(prefix);
    int pid = (int)getpid();
    p->n    = n;
    snprintf(p->hub, sizeof p->hub, "%s-%d-hub", prefix, pid);
    for (int i = 0; i < n; i++) {
        snprintf(p->ns[i], sizeof p->ns[i], "%s-%d-%c", prefix, pid, 'a' + i);
        snprintf(p->veth[i], sizeof p->veth[i], "%.3s%d%c", tag, pid % 100000, 'a' + i);
    }
    if (netns_sh("ip netns add %s 2>/dev/null", p->hub) != 0) {
        snprintf(why, why_n, "\"ip netns add\" failed (no iproute2, or no namespace support)");
        return false;
    }
    p->made = true;
    if (netns_sh("ip -n %s link add br0 type bridge", p->hub) ||
        netns_sh("ip -n %s link set br0 up", p->hub)) {
        snprintf(why, why_n, "could not create the bridge (no bridge support?)");
        return false;
    }
    // Node i's end is veth[i] in ns[i]; the switch's end, veth[i] with an 's', in the hub.
    for (int i = 0; i < n; i++)
        if (netns_sh("ip netns add %s", p->ns[i]) ||
            netns_sh("ip link add %s type veth peer name %ss", p->veth[i], p->veth[i]) ||
            netns_sh("ip link set %s netns %s", p->veth[i], p->ns[i]) ||
            netns_sh("ip link set %ss netns %s", p->veth[i], p->hub) ||
            netns_sh("ip -n %s link set %ss master br0 up", p->hub, p->veth[i]) ||
            netns_sh("ip -n %s addr add %s.%d/24 dev %s", p->ns[i], subnet, i + 1, p->veth[i]) ||
            netns_sh("ip -n %s link set lo up", p->ns[i]) ||
            netns_sh("ip -n %s link set %s up", p->ns[i], p->veth[i])) {
            snprintf(why, why_n, "could not link node %d (namespace %s) to the bridge", i,
                     p->ns[i]);
            return false;
        }
    return true;
}

void netns_teardown(netns_net *p) {
    if (!p->made)
        return;
    for (int i = 0; i < p->n; i++)
        netns_sh("ip netns del %s 2>/dev/null", p->ns[i]);
    netns_sh("ip netns del %s 2>/dev/null", p->hub);
    p->made = false;
}
