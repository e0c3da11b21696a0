// tcp_pair.c: the ceiling of loopback TCP on this machine, without dtrain: two
// processes exchange `bytes` over one connection per iteration, both directions at
// once (or one way with "oneway"), through a poll loop with 128 KiB calls like
// dtrain's tcp backend (and reno congestion control, as dtrain uses between ranks of
// one host). Prints the median per-direction throughput.
//
//   cc -O2 -o build/bench/tcp_pair bench/tcp_pair.c
//   build/bench/tcp_pair 67108864 [oneway]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (128 << 10)
#define ITERS 30

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t             n      = argc > 1 ? strtoull(argv[1], NULL, 10) : (64u << 20);
    int                oneway = argc > 2 && strcmp(argv[2], "oneway") == 0;
    int                l      = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a      = {.sin_family = AF_INET};
    a.sin_addr.s_addr         = htonl(INADDR_LOOPBACK);
    socklen_t len             = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || getsockname(l, (struct sockaddr *)&a, &len) ||
        listen(l, 1)) {
        perror("tcp_pair: listen");
        return 1;
    }
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a)) {
        perror("tcp_pair: connect");
        return 1;
    }
    int   s   = accept(l, NULL, NULL);
    pid_t pid = fork();
    int   fd = pid == 0 ? c : s, one = 1;
    int   sender = pid == 0 || !oneway, receiver = pid != 0 || !oneway;
    close(pid == 0 ? s : c);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4); // as dtrain on one host
    fcntl(fd, F_SETFL, O_NONBLOCK);
    char  *out = malloc(n), *in = malloc(n);
    double t[ITERS];
    memset(out, 1, n);
    memset(in, 2, n);
    for (int it = 0; it < ITERS; it++) {
        size_t sent = sender ? 0 : n, got = receiver ? 0 : n;
        double t0 = now();
        while (sent < n || got < n) {
            int     progress = 0;
            ssize_t k;
            if (sent < n &&
                (k = send(fd, out + sent, n - sent < CHUNK ? n - sent : CHUNK, MSG_DONTWAIT)) > 0)
                sent += (size_t)k, progress = 1;
            if (got < n &&
                (k = recv(fd, in + got, n - got < CHUNK ? n - got : CHUNK, MSG_DONTWAIT)) > 0)
                got += (size_t)k, progress = 1;
            if (!progress) {
                struct pollfd p = {fd, (short)((sent < n ? POLLOUT : 0) | (got < n ? POLLIN : 0)),
                                   0};
                poll(&p, 1, -1);
            }
        }
        t[it] = now() - t0;
        if (oneway) { // a one-byte acknowledgement keeps the iterations apart
            char b = 0;
            if (pid == 0)
                while (recv(fd, &b, 1, 0) != 1) {
                }
            else
                while (send(fd, &b, 1, 0) != 1) {
                }
        }
    }
    if (pid != 0) {
        wait(NULL);
        qsort(t, ITERS, sizeof t[0], cmp);
        printf("%zu bytes %s: median %.1f us, %.2f GB/s per direction\n", n,
               oneway ? "one way" : "both ways at once", t[ITERS / 2] * 1e6,
               (double)n / t[ITERS / 2] / 1e9);
    }
    return 0;
}
