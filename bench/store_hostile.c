// store_hostile.c: the RSS of a process running the dtrain TCP store while N strangers
// (no token) each send a request header claiming a 64 MiB value and then M MiB of it,
// without ever reading. Prints the server's RSS before and under the flood, and how
// many connections the server has closed after 2 s.
//
//   cc -O2 -Iinclude -Isrc -o build/bench/store_hostile bench/store_hostile.c \
//      build/release/lib/libdtrain.a -lpthread -lm
//   build/bench/store_hostile [N=100] [M=4]
#include "dtrain/comm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long  v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

int main(int argc, char **argv) {
    int    n    = argc > 1 ? atoi(argv[1]) : 100;
    size_t mib  = argc > 2 ? (size_t)atoi(argv[2]) : 4;
    int    p[2] = {-1, -1};
    if (pipe(p) != 0)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    pid_t pid = fork();
    if (pid == 0) {
        dt_store_opts o = {.timeout_ms = 600000, .token = "secret"};
        dt_store     *s = NULL;
        dt_store_new_tcp(&s, NULL, 0, true, &o);
        int port = s ? dt_store_port(s) : -1;
        if (write(p[1], &port, sizeof port) != sizeof port)
            _exit(1);
        for (;;)
            pause();
    }
    int port = -1;
    if (read(p[0], &port, sizeof port) != sizeof port || port <= 0)
        return 1;
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    long    before          = rss_kb(pid);
    uint8_t hdr[24 + 4 + 1] = {0};
    memcpy(hdr, "DTS1", 4);
    hdr[4]         = 2; // set
    hdr[6]         = 2; // two parts
    uint32_t claim = 64u << 20;
    memcpy(hdr + 16, &claim, 4); // little-endian hosts
    char *junk = calloc(1, 1 << 20);
    int  *fds  = calloc((size_t)n, sizeof *fds);
    for (int i = 0; i < n; i++) {
        fds[i]               = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr    = htonl(INADDR_LOOPBACK);
        if (connect(fds[i], (struct sockaddr *)&a, sizeof a) != 0)
            continue;
        fcntl(fds[i], F_SETFL, O_NONBLOCK);
        (void)!write(fds[i], hdr, 24);
    }
    // Feed every connection M MiB, round robin, as far as the server takes it.
    for (size_t k = 0; k < mib * 16; k++)
        for (int i = 0; i < n; i++)
            (void)!write(fds[i], junk, 65536);
    ts.tv_sec  = 2;
    ts.tv_nsec = 0;
    nanosleep(&ts, NULL);
    long after  = rss_kb(pid);
    int  closed = 0;
    for (int i = 0; i < n; i++) {
        char          b[512];
        struct pollfd pf = {.fd = fds[i], .events = POLLIN};
        if (poll(&pf, 1, 0) == 1) {
            ssize_t r;
            while ((r = read(fds[i], b, sizeof b)) > 0) {
            }
            closed += r == 0 || (r < 0 && (pf.revents & (POLLHUP | POLLERR)));
        }
    }
    printf("connections %d, claimed 64 MiB each, sent up to %zu MiB each: server RSS %ld kB "
           "before, %ld kB under the flood (+%ld kB); %d closed by the server\n",
           n, mib, before, after, after - before, closed);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}
