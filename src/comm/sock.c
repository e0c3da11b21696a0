// sock.c: TCP socket plumbing shared by the store and the tcp backend: listen with a
// clear "port in use" message, connect with retries until a deadline, exact reads
// and writes bounded by a deadline.
#include "comm/comm_impl.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

void dt_sock_tune(int fd, int buf_bytes) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (buf_bytes > 0) {
        // SO_*BUFFORCE goes past net.core.[rw]mem_max when we may (root); otherwise the
        // plain option is capped by the kernel, which is fine.
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf_bytes, sizeof buf_bytes) != 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf_bytes, sizeof buf_bytes);
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf_bytes, sizeof buf_bytes) != 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf_bytes, sizeof buf_bytes);
    }
}

dt_status dt_sock_set_nonblocking(int fd, bool on) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return dt_fail_errno(DT_ERR_IO, "fcntl(F_GETFL)");
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    if (fcntl(fd, F_SETFL, fl) != 0)
        return dt_fail_errno(DT_ERR_IO, "fcntl(F_SETFL)");
    return DT_OK;
}

// Finds the inode of a socket listening on `port` in /proc/net/tcp{,6}, then the
// process that has it open. Best effort: other users' processes may be unreadable.
void dt_sock_port_holder(int port, char *buf, size_t n) {
    if (n == 0)
        return;
    buf[0]                 = '\0';
    unsigned long inode    = 0;
    const char   *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2 && !inode; t++) {
        FILE *f = fopen(tables[t], "r");
        if (!f)
            continue;
        char line[512];
        if (!fgets(line, sizeof line, f)) { // header
            fclose(f);
            continue;
        }
        while (fgets(line, sizeof line, f)) {
            char          local[128];
            unsigned      st;
            unsigned long ino;
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if (sscanf(line, " %*s %127s %*s %x %*s %*s %*s %*s %*s %lu", local, &st, &ino) != 3)
                continue;
            char *colon = strrchr(local, ':');
            if (!colon || st != 0x0A) // 0x0A = TCP_LISTEN
                continue;
            if ((int)strtol(colon + 1, NULL, 16) == port) {
                inode = ino;
                break;
            }
        }
        fclose(f);
    }
    if (!inode)
        return;
    char want[64];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *proc = opendir("/proc");
    if (!proc)
        return;
    struct dirent *de;
    while ((de = readdir(proc)) != NULL && !buf[0]) {
        char *end;
        long  pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char fddir[64];
        snprintf(fddir, sizeof fddir, "/proc/%ld/fd", pid);
        DIR *fds = opendir(fddir);
        if (!fds)
            continue;
        struct dirent *fe;
        while ((fe = readdir(fds)) != NULL) {
            char path[320], target[64];
            snprintf(path, sizeof path, "%s/%s", fddir, fe->d_name);
            ssize_t k = readlink(path, target, sizeof target - 1);
            if (k <= 0)
                continue;
            target[k] = '\0';
            if (strcmp(target, want) == 0) {
                char comm[64] = "?";
                snprintf(path, sizeof path, "/proc/%ld/comm", pid);
                FILE *cf = fopen(path, "r");
                if (cf) {
                    if (fgets(comm, sizeof comm, cf))
                        comm[strcspn(comm, "\n")] = '\0';
                    fclose(cf);
                }
                snprintf(buf, n, "pid %ld (%s)", pid, comm);
                break;
            }
        }
        closedir(fds);
    }
    closedir(proc);
}

dt_status dt_sock_listen(int port, int backlog, const char *what, int *fd_out, int *bound_port) {
    return dt_sock_listen_on(false, port, backlog, what, fd_out, bound_port);
}

bool dt_sock_is_loopback(const char *host) {
    if (!host || !*host)
        return true;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    bool all = res != NULL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            uint32_t a = ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr);
            all        = all && (a >> 24) == 127;
        } else if (ai->ai_family == AF_INET6) {
            all = all && IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        } else {
            all = false;
        }
    }
    freeaddrinfo(res);
    return all;
}

dt_status dt_sock_listen_on(bool loopback_only, int port, int backlog, const char *what,
                            int *fd_out, int *bound_port) {
    *fd_out = -1;
    if (port < 0 || port > 65535)
        return dt_fail(DT_ERR_ARG, "%s: expected a port in [0, 65535], found %d", what, port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dt_fail_errno(DT_ERR_IO, "%s: socket", what);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr    = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE) {
            char holder[128];
            dt_sock_port_holder(port, holder, sizeof holder);
            return dt_fail(DT_ERR_IO,
                           "%s: port %d is already in use%s%s (another job, or a process left "
                           "from an earlier run?); choose another port (MASTER_PORT)",
                           what, port, holder[0] ? " by " : "", holder);
        }
        errno = e;
        return dt_fail_errno(DT_ERR_IO, "%s: bind to port %d", what, port);
    }
    if (listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return dt_fail_errno(DT_ERR_IO, "%s: listen on port %d", what, port);
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    if (bound_port)
        *bound_port = ntohs(a.sin_port);
    *fd_out = fd;
    return DT_OK;
}

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// One connection attempt bounded by deadline_ns; returns 0 or an errno value.
static int connect_once(const struct addrinfo *ai, uint64_t deadline_ns, int *fd_out) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0)
        return errno;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return e;
    }
    if (rc != 0) {
        struct pollfd p  = {.fd = fd, .events = POLLOUT};
        int           ms = dt_ms_left(deadline_ns);
        if (ms > 1000)
            ms = 1000; // re-resolve and retry at least once a second
        rc = poll(&p, 1, ms);
        if (rc <= 0) {
            close(fd);
            return rc == 0 ? ETIMEDOUT : errno;
        }
        int       err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            close(fd);
            return err;
        }
    }
    *fd_out = fd;
    return 0;
}

dt_status dt_sock_connect(const char *host, int port, uint64_t deadline_ns, const char *what,
                          const char *hint, int *fd_out) {
    *fd_out = -1;
    if (!host || !*host)
        return dt_fail(DT_ERR_ARG, "%s: expected a host name or address, found an empty string",
                       what);
    if (port <= 0 || port > 65535)
        return dt_fail(DT_ERR_ARG, "%s: expected a port in [1, 65535], found %d", what, port);
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    uint64_t       start    = dt_now_ns();
    int            delay_ms = 10, last_err = 0, attempts = 0;
    char           last_what[160] = "no attempt finished";
    dt_wait_notice notice;
    dt_wait_notice_start(&notice, deadline_ns);
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int             gai = getaddrinfo(host, service, &hints, &res);
        if (gai == EAI_NONAME || gai == EAI_FAIL || gai == EAI_SERVICE)
            return dt_fail(DT_ERR_ARG, "%s: cannot resolve host \"%s\": %s", what, host,
                           gai_strerror(gai));
        if (gai != 0) {
            snprintf(last_what, sizeof last_what, "resolving \"%s\": %s", host, gai_strerror(gai));
        } else {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int fd   = -1;
                last_err = connect_once(ai, deadline_ns, &fd);
                attempts++;
                if (last_err == 0) {
                    freeaddrinfo(res);
                    dt_sock_set_nonblocking(fd, false);
                    dt_sock_tune(fd, 0);
                    *fd_out = fd;
                    return DT_OK;
                }
                snprintf(last_what, sizeof last_what, "%s", strerror(last_err));
            }
            freeaddrinfo(res);
        }
        if (dt_now_ns() >= deadline_ns) {
            double secs = (double)(dt_now_ns() - start) / 1e9;
            return dt_fail(DT_ERR_TIMEOUT,
                           "%s: could not connect to %s:%d after %.1f s and %d attempts (last "
                           "error: %s)%s%s",
                           what, host, port, secs, attempts, last_what, hint ? "; " : "",
                           hint ? hint : "");
        }
        if (dt_wait_notice_due(&notice)) {
            char t[160];
            dt_wait_notice_times(&notice, t, sizeof t);
            DT_WARN("comm", "%s: no connection to %s:%d yet (last error: %s); %s%s%s", what, host,
                    port, last_what, t, hint ? "; " : "", hint ? hint : "");
        }
        int left = dt_ms_left(deadline_ns);
        sleep_ms(delay_ms < left ? delay_ms : left);
        delay_ms = delay_ms * 2 > 500 ? 500 : delay_ms * 2;
    }
}

static int poll_one(int fd, short events, uint64_t deadline_ns) {
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int rc = poll(&p, 1, dt_ms_left(deadline_ns));
        if (rc < 0 && errno == EINTR)
            continue;
        return rc;
    }
}

int dt_sock_send_frame(int fd, const void *hdr, size_t hlen, const void *body, size_t blen,
                       size_t *done, size_t cap, uint64_t deadline_ns) {
    size_t total = hlen + blen;
    while (*done < total) {
        size_t       d = *done;
        struct iovec iov[2];
        int          niov = 0;
        if (d < hlen)
            iov[niov++] = (struct iovec){(char *)(uintptr_t)hdr + d, hlen - d};
        size_t boff = d > hlen ? d - hlen : 0;
        if (blen > boff) {
            size_t n    = blen - boff;
            iov[niov++] = (struct iovec){(char *)(uintptr_t)body + boff, cap && n > cap ? cap : n};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t       k  = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            *done += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (deadline_ns == 0)
                return 0;
            int ms = dt_ms_left(deadline_ns);
            if (ms <= 0) {
                errno = ETIMEDOUT;
                return -1;
            }
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int           rc = poll(&pf, 1, ms);
            if (rc == 0) {
                errno = ETIMEDOUT;
                return -1;
            }
            if (rc < 0 && errno != EINTR)
                return -1;
            continue;
        }
        if (k == 0)
            errno = EPIPE; // nothing written of a non-empty frame: treat as closed
        return -1;
    }
    return 1;
}

dt_status dt_sock_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns,
                            const char *what) {
    size_t done = 0;
    if (dt_sock_send_frame(fd, buf, n, NULL, 0, &done, 0, deadline_ns ? deadline_ns : 1) == 1)
        return DT_OK;
    if (errno == ETIMEDOUT)
        return dt_fail(DT_ERR_TIMEOUT, "%s: timed out sending", what);
    if (errno == EPIPE || errno == ECONNRESET)
        return dt_fail(DT_ERR_PEER, "%s closed the connection", what);
    return dt_fail_errno(DT_ERR_IO, "%s: send", what);
}

dt_status dt_sock_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns, const char *what) {
    char *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return dt_fail(DT_ERR_PEER, "%s closed the connection", what);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = poll_one(fd, POLLIN, deadline_ns);
            if (rc == 0)
                return dt_fail(DT_ERR_TIMEOUT, "%s: timed out waiting for a reply", what);
            if (rc < 0)
                return dt_fail_errno(DT_ERR_IO, "%s: poll", what);
            continue;
        }
        if (errno == ECONNRESET)
            return dt_fail(DT_ERR_PEER, "%s closed the connection", what);
        return dt_fail_errno(DT_ERR_IO, "%s: recv", what);
    }
    return DT_OK;
}

bool dt_sock_local_addr(int fd, char *buf, size_t n) {
    struct sockaddr_in a;
    socklen_t          len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0 || a.sin_family != AF_INET)
        return false;
    return inet_ntop(AF_INET, &a.sin_addr, buf, (socklen_t)n) != NULL;
}

// The address of this host on the way to `host` (a UDP "connect" sends no packet: the
// kernel picks the outgoing interface); false when unresolvable or a loopback address.
static bool address_towards(const char *host, char *buf, size_t n) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (!host || !*host || getaddrinfo(host, "9", &hints, &res) != 0)
        return false;
    int  fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
              dt_sock_local_addr(fd, buf, n) && strncmp(buf, "127.", 4) != 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return ok;
}

void dt_sock_public_addr(dt_store *store, int rank, bool all_local, char *buf, size_t n) {
    const char *o = dt_setting_str("DT_SOCKET_IFADDR");
    if (o && *o) {
        snprintf(buf, n, "%s", o);
        return;
    }
    // The interface that reaches rank 0's store reaches the other ranks too (in the
    // usual one-network cluster); rank 0 itself talks to its store over loopback, so
    // it uses its host name's address unless everyone is on this host.
    if (rank != 0 && dt_store_local_addr(store, buf, n))
        return;
    if (all_local) {
        snprintf(buf, n, "127.0.0.1");
        return;
    }
    // The others reached rank 0's store at MASTER_ADDR, so that is where rank 0 is (its
    // host name may resolve to loopback, as Debian's 127.0.1.1 entry does).
    if (rank == 0 && address_towards(getenv("MASTER_ADDR"), buf, n))
        return;
    // Otherwise the address of our host name, found by "connecting" a UDP socket (no
    // packet is sent): the kernel picks the outgoing interface.
    char            host[256];
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (gethostname(host, sizeof host) == 0 && getaddrinfo(host, "9", &hints, &res) == 0) {
        int  fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  dt_sock_local_addr(fd, buf, n);
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        if (ok)
            return;
    }
    snprintf(buf, n, "127.0.0.1");
}

int dt_free_port(void) {
    unsigned seed;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (unsigned)dt_now_ns() ^ (unsigned)getpid();
    for (int tries = 0; tries < 500; tries++) {
        int port = 20000 + (int)(rand_r(&seed) % 12768);
        int fd   = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr    = htonl(INADDR_ANY);
        int ok                = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok)
            return port;
    }
    return 0;
}
