// netns.h: "machines" for tests that need a real network between processes: n network
// namespaces (2 to NETNS_MAX) on one switch, <subnet>.<i+1>/24 in namespace i, loopback
// up in each. The switch is a bridge in a namespace of its own (the hub), one veth pair
// per node: the node's end in the node, the other end in the bridge; cutting a node's
// link (`ip -n ns[i] link set veth[i] down`) cuts that node off from all the others.
// Needs root; namespaces left by earlier runs of the same test that died before
// cleaning up (their pid is gone) are removed first.
#ifndef DTRAIN_TESTS_NETNS_H
#define DTRAIN_TESTS_NETNS_H

#include "dtrain/core.h"

#include <stdbool.h>
#include <stddef.h>

#define NETNS_MAX 8

typedef struct netns_net {
    int  n;                   // nodes
    char ns[NETNS_MAX][64];   // node namespaces: <prefix>-<pid>-a, -b, ...
    char veth[NETNS_MAX][16]; // node i's end of its link, in ns[i]
    char hub[64];             // the bridge's namespace: <prefix>-<pid>-hub
    bool made;                // namespaces exist (teardown has work to do)
} netns_net;

// Runs a shell command built from fmt; returns its exit status (-1 when it did not exit).
int netns_sh(const char *fmt, ...) DT_PRINTF(1, 2);

// Builds n nodes on the switch. prefix names the namespaces (e.g. "dtlive"), tag (3
// characters) the veth ends, subnet the first three octets ("10.201.0"). False with the
// reason in why when it cannot (not root, no iproute2, no namespace or bridge support,
// n outside 2..NETNS_MAX); p->made says whether namespaces were left to tear down.
bool netns_setup(netns_net *p, int n, const char *prefix, const char *tag, const char *subnet,
                 char *why, size_t why_n);

// Deletes the namespaces (each takes its veth ends along). Safe to repeat.
void netns_teardown(netns_net *p);

#endif
