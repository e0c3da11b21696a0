// The progress display (dtrain/watch.h): the seed's log lines, exactly, when not on a
// terminal; a bar redrawn in place (\r) with rate, ETA and loss on one, at most every
// min_redraw_s; terminal detection on a real pseudo-terminal (openpty); and
// dtrain-mnist itself under a pseudo-terminal (forkpty: what `script` does) draws a
// bar, while on a pipe it prints the plain lines.
#include "../check.h"
#include "../lib/prog.h"
#include "dtrain/watch.h"

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *read_back(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *p = calloc(1, (size_t)n + 1);
    if (fread(p, 1, (size_t)n, f) != (size_t)n)
        p[0] = 0;
    return p;
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++)
        n += *s == c;
    return n;
}

static void test_lines(void) {
    check_current      = "lines";
    FILE            *f = tmpfile();
    dt_progress_opts o = dt_progress_opts_default();
    o.out              = f;
    o.log_every        = 3;
    dt_progress *p     = NULL;
    CHECK_OK(dt_progress_new(&p, &o));
    CHECK(!dt_progress_is_bar(p)); // a file is no terminal
    dt_progress_begin_epoch(p, 2, 7);
    for (int i = 0; i < 7; i++)
        dt_progress_step(p, (size_t)i, 64, 0.5 * i);
    dt_progress_end_epoch(p);
    dt_progress_free(p);
    char *s = read_back(f);
    CHECK(strcmp(s, "epoch: 2 [0/7 (0%)]\t training loss: 0.000000\n"
                    "epoch: 2 [3/7 (43%)]\t training loss: 1.500000\n"
                    "epoch: 2 [6/7 (86%)]\t training loss: 3.000000\n") == 0);
    free(s);
    fclose(f);

    CHECK_ERR(dt_progress_new(&p, &(dt_progress_opts){.log_every = 0, .width = 30}), DT_ERR_ARG,
              "log_every");
    CHECK(p == NULL);
    // NULL progress (ranks other than 0): every call is a no-op.
    dt_progress_begin_epoch(NULL, 0, 1);
    dt_progress_step(NULL, 0, 1, 1.0);
    dt_progress_end_epoch(NULL);
    dt_progress_free(NULL);
}

static void test_bar(void) {
    check_current      = "bar";
    FILE            *f = tmpfile();
    dt_progress_opts o = dt_progress_opts_default();
    o.out              = f;
    o.bar              = 1;
    o.min_redraw_s     = 0; // every step
    o.width            = 10;
    o.unit             = "tokens";
    dt_progress *p     = NULL;
    CHECK_OK(dt_progress_new(&p, &o));
    CHECK(dt_progress_is_bar(p));
    dt_progress_begin_epoch(p, 1, 4);
    for (int i = 0; i < 4; i++)
        dt_progress_step(p, (size_t)i, 1000, 2.0 - 0.25 * i);
    dt_progress_end_epoch(p);
    dt_progress_free(p);
    char *s = read_back(f);
    CHECK_EQ(count_char(s, '\r'), 4);
    CHECK_EQ(count_char(s, '\n'), 1);
    CHECK(s[strlen(s) - 1] == '\n');
    CHECK(strstr(s, "\repoch 1 [##........] 1/4  25%") != NULL);
    CHECK(strstr(s, "\repoch 1 [##########] 4/4 100%") != NULL);
    CHECK(strstr(s, "tokens/s") != NULL);
    CHECK(strstr(s, "ETA 0:00") != NULL);
    CHECK(strstr(s, "loss 1.2500") != NULL);
    CHECK(strstr(s, "training loss") == NULL);
    free(s);
    fclose(f);

    // At most one redraw per min_redraw_s, and the last batch always drawn.
    f              = tmpfile();
    o.out          = f;
    o.min_redraw_s = 0.1;
    CHECK_OK(dt_progress_new(&p, &o));
    double t0 = dt_now();
    dt_progress_begin_epoch(p, 0, 200000);
    for (int i = 0; i < 200000; i++)
        dt_progress_step(p, (size_t)i, 1, 1.0);
    double el = dt_now() - t0;
    dt_progress_free(p);
    s     = read_back(f);
    int n = count_char(s, '\r');
    CHECK(n >= 2);                       // the first and the last batch
    CHECK(n <= 2 + (int)(el / 0.1) + 1); // and at most 10 per second between
    CHECK(strstr(s, "200000/200000 100%") != NULL);
    free(s);
    fclose(f);
}

// isatty on a real pseudo-terminal: auto mode draws a bar there.
static void test_pty_detect(void) {
    check_current = "pty detection";
    int master, slave;
    if (!CHECK(openpty(&master, &slave, NULL, NULL, NULL) == 0))
        return;
    FILE            *f = fdopen(slave, "w");
    dt_progress_opts o = dt_progress_opts_default();
    o.out              = f;
    dt_progress *p     = NULL;
    CHECK_OK(dt_progress_new(&p, &o));
    CHECK(p && dt_progress_is_bar(p));
    dt_progress_free(p);
    // Under mpirun every rank's stdout is a pseudo-terminal whatever the job's output
    // is: auto mode prints lines there.
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    p = NULL;
    CHECK_OK(dt_progress_new(&p, &o));
    CHECK(p && !dt_progress_is_bar(p));
    dt_progress_free(p);
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    fclose(f);
    close(master);
}

// Runs cmd (a shell line) with stdout on a pseudo-terminal (pty) or a pipe; returns
// what it printed, NULL after 120 s or a failure.
static char *run_on(const char *cmd, bool pty) {
    int   fd;
    pid_t pid;
    if (pty) {
        pid = forkpty(&fd, NULL, NULL, NULL);
    } else {
        int pp[2];
        if (pipe(pp) != 0)
            return NULL;
        pid = fork();
        if (pid == 0) {
            dup2(pp[1], 1);
            close(pp[0]);
        }
        close(pp[1]);
        fd = pp[0];
    }
    if (pid < 0)
        return NULL;
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    size_t   cap = 1 << 16, n = 0;
    char    *buf = malloc(cap);
    uint64_t end = dt_deadline_ns(120000);
    for (;;) {
        int ms = dt_ms_left(end);
        if (ms <= 0)
            break;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, ms) <= 0)
            continue;
        if (n + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + n, 4096);
        if (k <= 0) // EOF on a pipe; EIO on a pty once the child has gone
            break;
        n += (size_t)k;
    }
    buf[n] = 0;
    close(fd);
    int status = 0;
    if (dt_ms_left(end) <= 0)
        kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "     %s exited with %d:\n%s\n", cmd, status, buf);
        free(buf);
        return NULL;
    }
    return buf;
}

static void test_mnist(void) {
    check_current = "dtrain-mnist on a pty and a pipe";
    char bin[512];
    if (!test_program_path("dtrain-mnist", bin, sizeof bin)) {
        fprintf(stderr, "skipping: no dtrain-mnist built\n");
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s --limit 512 --batch-size 32 --threads 1 --num-processes 2 --no-test "
             "--log-every 4",
             bin);
    char *tty = run_on(cmd, true);
    if (CHECK(tty != NULL)) {
        CHECK(strstr(tty, "\repoch 0 [") != NULL);
        CHECK(strstr(tty, "8/8 100%") != NULL); // 512 / 2 ranks / 32
        CHECK(strstr(tty, "samples/s") != NULL);
        CHECK(strstr(tty, "ETA") != NULL);
        CHECK(strstr(tty, "training loss:") == NULL);
        CHECK(strstr(tty, "Finished training") != NULL);
    }
    free(tty);
    char *pipe_out = run_on(cmd, false);
    if (CHECK(pipe_out != NULL)) {
        CHECK(strstr(pipe_out, "epoch: 0 [0/8 (0%)]\t training loss: ") != NULL);
        CHECK(strstr(pipe_out, "epoch: 0 [4/8 (50%)]\t training loss: ") != NULL);
        CHECK(strchr(pipe_out, '\r') == NULL);
        CHECK(strstr(pipe_out, "ETA") == NULL);
    }
    free(pipe_out);
}

int main(void) {
    test_lines();
    test_bar();
    test_pty_detect();
    test_mnist();
    return check_summary();
}
