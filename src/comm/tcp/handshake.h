// handshake.h: how two ranks of the tcp backend prove to each other that they belong to
// one job before a connection of the mesh is used (handshake.c). Private to tcp/.
#ifndef DTRAIN_COMM_TCP_HANDSHAKE_H
#define DTRAIN_COMM_TCP_HANDSHAKE_H

#include "comm/comm_impl.h"

// Who this rank is: the job token (NULL: none), its rank and the world size.
typedef struct dt_tcp_self {
    const char *token;
    int         rank, world;
} dt_tcp_self;

// Connecting side, on a connected socket `fd` to rank `r` (< self's rank): runs the
// handshake until `deadline` (rank r answers once it has connected to the ranks below
// it). DT_ERR_MISMATCH when the process there does not hold the token.
dt_status dt_tcp_handshake_connect(const dt_tcp_self *self, int fd, int r, uint64_t deadline,
                                   const char *what);

// Accepting side: accepts on the listening socket `lfd` until every rank above self's
// has connected and proven the token, running the handshakes of all connections at once
// (a connection that does not finish within 2 s is dropped, at most 64 are in flight).
// fds[r] (world entries) receives rank r's connection, blocking; entries >= 0 on entry
// count as connected. Says every DT_WAIT_NOTICE_MS which ranks it still waits for.
// DT_ERR_TIMEOUT at `deadline`, naming them.
dt_status dt_tcp_accept_ranks(const dt_tcp_self *self, int lfd, int *fds, uint64_t deadline);

#endif // DTRAIN_COMM_TCP_HANDSHAKE_H
