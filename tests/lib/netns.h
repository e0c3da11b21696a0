// netns.h: two "machines" for tests that need a real network between processes: two
// network namespaces joined by a veth pair, <subnet>.1/24 in the first and <subnet>.2/24
// in the second, loopback up in both. Needs root; namespaces left by earlier runs of
// the same test that died before cleaning up (their pid is gone) are removed first.
#ifndef DTRAIN_TESTS_NETNS_H
#define DTRAIN_TESTS_NETNS_H

#include "dtrain/core.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct netns_pair {
    char ns[2][64];   // namespace names: <prefix>-<pid>-a and -b
    char veth[2][16]; // the pair's ends, ns[i]'s end is veth[i]
    bool made;        // the namespaces exist (teardown has work to do)
} netns_pair;

// Runs a shell command built from fmt; returns its exit status (-1 when it did not exit).
int netns_sh(const char *fmt, ...) DT_PRINTF(1, 2);

// Builds the pair. prefix names the namespaces (e.g. "dtlive"), tag (3 characters)
// the veth ends, subnet the first three octets ("10.201.0"). False with the reason in
// why when it cannot (not root, no iproute2, no namespace support); p->made says
// whether namespaces were left to tear down.
bool netns_pair_setup(netns_pair *p, const char *prefix, const char *tag, const char *subnet,
                      char *why, size_t n);

// Deletes both namespaces (each takes its end of the veth pair along). Safe to repeat.
void netns_pair_teardown(netns_pair *p);

#endif
