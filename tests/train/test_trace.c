// The trace recorder and writer (dtrain/trace.h): the file parses as JSON (our strict
// reader), has one process track per rank named "rank N (host)", every thread's spans
// nest properly, names are escaped, the off state records nothing, the event cap
// holds, ranks' clocks agree (a barrier ends after every rank entered it), and
// dtrain-mnist --trace on 2 processes shows per-layer forward and backward spans,
// bucket reductions, waits, the optimizer and data loading on both ranks.
#include "../check.h"
#include "../lib/json.h"
#include "../lib/mp.h"
#include "../lib/prog.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"
#include "dtrain/trace.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct span {
    int         pid, tid;
    int64_t     ts, end; // ns
    const char *name, *cat;
} span;

typedef struct trace {
    json *root;
    span *s;
    int   n;
    char  pnames[8][128]; // process names of pids 0..7
    int   npnames[8];     // how many process_name events each pid has
} trace;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    *len    = fread(p, 1, (size_t)n, f);
    p[*len] = 0;
    fclose(f);
    return p;
}

static int64_t us_to_ns(double us) {
    return (int64_t)(us * 1000.0 + (us < 0 ? -0.5 : 0.5));
}

// Reads a trace file; false (with CHECK failures) when it is not a well-formed trace.
static bool load_trace(const char *path, trace *t) {
    memset(t, 0, sizeof *t);
    size_t len  = 0;
    char  *text = slurp(path, &len);
    if (!CHECK(text != NULL))
        return false;
    const char *err = NULL;
    t->root         = json_parse(text, len, &err);
    free(text);
    if (!CHECK(t->root != NULL)) {
        fprintf(stderr, "     %s: %s\n", path, err ? err : "?");
        return false;
    }
    const json *ev = json_get(t->root, "traceEvents");
    if (!CHECK(ev && ev->type == JSON_ARR))
        return false;
    t->s    = calloc((size_t)ev->n + 1, sizeof(span));
    bool ok = true;
    for (int i = 0; i < ev->n; i++) {
        const json *e = &ev->items[i], *ph = json_get(e, "ph"), *pid = json_get(e, "pid"),
                   *tid = json_get(e, "tid"), *name = json_get(e, "name");
        if (!ph || ph->type != JSON_STR || !pid || pid->type != JSON_NUM || !tid ||
            tid->type != JSON_NUM || !name || name->type != JSON_STR) {
            ok = false;
            continue;
        }
        int p = (int)pid->num;
        if (strcmp(ph->str, "M") == 0 && strcmp(name->str, "process_name") == 0 && p >= 0 &&
            p < 8) {
            const json *a = json_get(json_get(e, "args"), "name");
            if (a && a->type == JSON_STR)
                snprintf(t->pnames[p], sizeof t->pnames[p], "%s", a->str);
            t->npnames[p]++;
        } else if (strcmp(ph->str, "X") == 0) {
            const json *ts = json_get(e, "ts"), *dur = json_get(e, "dur"),
                       *cat = json_get(e, "cat");
            if (!ts || ts->type != JSON_NUM || !dur || dur->type != JSON_NUM || dur->num < 0) {
                ok = false;
                continue;
            }
            span *s = &t->s[t->n++];
            s->pid  = p;
            s->tid  = (int)tid->num;
            s->ts   = us_to_ns(ts->num);
            s->end  = s->ts + us_to_ns(dur->num);
            s->name = name->str;
            s->cat  = cat && cat->type == JSON_STR ? cat->str : "";
        }
    }
    CHECK(ok);
    return ok;
}

static void free_trace(trace *t) {
    json_free(t->root);
    free(t->s);
}

static int by_track_then_time(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid - y->pid;
    if (x->tid != y->tid)
        return x->tid - y->tid;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->end > y->end ? -1 : x->end < y->end; // the outer span first
}

// Every two spans of one thread are disjoint or one holds the other. Returns the
// number of violations (0 when nested properly).
static int nesting_violations(trace *t) {
    qsort(t->s, (size_t)t->n, sizeof(span), by_track_then_time);
    int64_t stack[64];
    int     depth = 0, bad = 0;
    for (int i = 0; i < t->n; i++) {
        if (i > 0 && (t->s[i].pid != t->s[i - 1].pid || t->s[i].tid != t->s[i - 1].tid))
            depth = 0;
        while (depth > 0 && stack[depth - 1] <= t->s[i].ts)
            depth--;
        if (depth > 0 && t->s[i].end > stack[depth - 1]) {
            if (bad++ < 3)
                fprintf(stderr, "     span %s [%lld, %lld] crosses its parent's end %lld\n",
                        t->s[i].name, (long long)t->s[i].ts, (long long)t->s[i].end,
                        (long long)stack[depth - 1]);
        }
        if (depth < 64)
            stack[depth++] = t->s[i].end;
    }
    return bad;
}

static int count_spans(const trace *t, int pid, const char *name) {
    int n = 0;
    for (int i = 0; i < t->n; i++)
        if ((pid < 0 || t->s[i].pid == pid) && strcmp(t->s[i].name, name) == 0)
            n++;
    return n;
}

// Spans whose name starts with `prefix` ("conv2d": also the fused "conv2d+relu").
static int count_prefixed(const trace *t, int pid, const char *prefix) {
    int n = 0;
    for (int i = 0; i < t->n; i++)
        if ((pid < 0 || t->s[i].pid == pid) && strncmp(t->s[i].name, prefix, strlen(prefix)) == 0)
            n++;
    return n;
}

static void busy_us(int us) {
    uint64_t end = dt_now_ns() + (uint64_t)us * 1000u;
    while (dt_now_ns() < end) {
    }
}

static const char weird[] = "quote\" back\\slash\nnew\tline \x01";

static void *side_thread(void *arg) {
    dt_trace_thread_name((const char *)arg);
    for (int i = 0; i < 5; i++) {
        DT_TRACE_BEGIN(outer);
        busy_us(50);
        DT_TRACE_BEGIN(inner);
        busy_us(50);
        DT_TRACE_END(inner, "test", "inner", "i", i);
        DT_TRACE_END(outer, "test", "outer", "i", i);
    }
    return NULL;
}

static void test_one_process(void) {
    check_current = "one process";
    char path[256];
    snprintf(path, sizeof path, "/tmp/dt_test_trace_%d.json", (int)getpid());

    // Off: nothing is recorded and the macro's start time is 0.
    DT_TRACE_BEGIN(off);
    CHECK_EQ(off, 0);
    DT_TRACE_END(off, "test", "never", NULL, 0);
    int64_t kept = -1, dropped = -1;
    dt_trace_counts(&kept, &dropped);
    CHECK_EQ(kept, 0);

    CHECK_OK(dt_trace_start(NULL));
    CHECK_ERR(dt_trace_start(NULL), DT_ERR_STATE, "already recording");
    dt_trace_thread_name("main \"thread\"");
    DT_TRACE_BEGIN(all);
    pthread_t th[2];
    pthread_create(&th[0], NULL, side_thread, "side a");
    pthread_create(&th[1], NULL, side_thread, "side b");
    for (int i = 0; i < 3; i++) {
        DT_TRACE_BEGIN(t0);
        busy_us(30);
        DT_TRACE_END(t0, "test", weird, "i", i);
    }
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    DT_TRACE_END(all, "test", "all", NULL, 0);
    dt_trace_counts(&kept, &dropped);
    CHECK_EQ(kept, 3 + 1 + 2 * 10);
    CHECK_EQ(dropped, 0);
    CHECK_OK(dt_trace_save(NULL, path));
    // Stopped by the save: later spans are not recorded.
    DT_TRACE_BEGIN(after);
    CHECK_EQ(after, 0);

    trace t;
    if (load_trace(path, &t)) {
        CHECK_EQ(t.n, 24);
        CHECK_EQ(t.npnames[0], 1);
        CHECK(strncmp(t.pnames[0], "rank 0 (", 8) == 0);
        CHECK_EQ(count_spans(&t, 0, weird), 3); // escaped on the way out, equal coming back
        CHECK_EQ(count_spans(&t, 0, "outer"), 10);
        CHECK_EQ(nesting_violations(&t), 0);
        // The three threads have three different tids; the inner spans sit in outers.
        int tids[3] = {-1, -1, -1}, ntids = 0;
        for (int i = 0; i < t.n; i++) {
            bool seen = false;
            for (int k = 0; k < ntids; k++)
                seen |= tids[k] == t.s[i].tid;
            if (!seen && ntids < 3)
                tids[ntids++] = t.s[i].tid;
        }
        CHECK_EQ(ntids, 3);
        for (int i = 0; i < t.n; i++)
            CHECK(t.s[i].ts >= 0);
        // Thread names come through escaped too.
        const json *ev    = json_get(t.root, "traceEvents");
        bool        named = false;
        for (int i = 0; i < ev->n; i++) {
            const json *a = json_get(json_get(&ev->items[i], "args"), "name");
            named |= a && a->type == JSON_STR && strcmp(a->str, "main \"thread\"") == 0;
        }
        CHECK(named);
        free_trace(&t);
    }
    unlink(path);

    // The cap: later spans are counted, not kept.
    dt_trace_opts o = dt_trace_opts_default();
    o.max_events    = 10;
    CHECK_OK(dt_trace_start(&o));
    for (int i = 0; i < 25; i++) {
        DT_TRACE_BEGIN(c);
        DT_TRACE_END(c, "test", "capped", NULL, 0);
    }
    dt_trace_counts(&kept, &dropped);
    CHECK_EQ(kept, 10);
    CHECK_EQ(dropped, 15);
    dt_trace_reset();
    dt_trace_counts(&kept, &dropped);
    CHECK_EQ(kept, 0);

    // A path rank 0 cannot write.
    CHECK_OK(dt_trace_start(NULL));
    CHECK_ERR(dt_trace_save(NULL, "/nonexistent-dir/x.json"), DT_ERR_IO, "/nonexistent-dir/");
    dt_trace_reset();
}

// Each rank: a few steps of spans around collectives; rank 1 enters the last barrier
// 30 ms late, so on a shared time axis every rank's barrier ends after rank 1's starts.
static void ranks(int rank, int world, void *arg) {
    const char *path = arg;
    dt_pg      *pg   = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    CHECK_OK(dt_trace_start(NULL));
    float x[256];
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < 256; i++)
            x[i] = (float)(rank + i);
        DT_TRACE_BEGIN(st);
        busy_us(200 * (rank + 1));
        CHECK_OK(dt_pg_all_reduce(pg, x, x, 256, DT_FLOAT32, DT_REDUCE_SUM));
        DT_TRACE_END(st, "test", "step", "step", step);
    }
    if (rank == 1)
        usleep(30000);
    CHECK_OK(dt_pg_barrier(pg));
    CHECK_OK(dt_trace_save(pg, path));
    if (rank == 0) {
        trace t;
        if (load_trace(path, &t)) {
            for (int r = 0; r < world; r++) {
                CHECK_EQ(t.npnames[r], 1);
                char want[32];
                snprintf(want, sizeof want, "rank %d (", r);
                CHECK(strncmp(t.pnames[r], want, strlen(want)) == 0);
                CHECK_EQ(count_spans(&t, r, "step"), 4);
                CHECK_EQ(count_spans(&t, r, "all_reduce"), 4);
                CHECK_EQ(count_spans(&t, r, "barrier"), 1);
            }
            CHECK_EQ(t.npnames[world], 0);
            CHECK_EQ(nesting_violations(&t), 0);
            int64_t latest_start = INT64_MIN, earliest_end = INT64_MAX;
            for (int i = 0; i < t.n; i++)
                if (strcmp(t.s[i].name, "barrier") == 0) {
                    if (t.s[i].ts > latest_start)
                        latest_start = t.s[i].ts;
                    if (t.s[i].end < earliest_end)
                        earliest_end = t.s[i].end;
                }
            // 1 ms of slack for the clock estimate (its error is half a round trip).
            CHECK(earliest_end + 1000000 >= latest_start);
            // Rank 0 waited in the barrier for rank 1's 30 ms.
            for (int i = 0; i < t.n; i++)
                if (t.s[i].pid == 0 && strcmp(t.s[i].name, "barrier") == 0)
                    CHECK(t.s[i].end - t.s[i].ts >= 20000000);
            free_trace(&t);
        }
        unlink(path);
    }
    // Rank 0 given no file: every rank returns an error, none waits for the timeout.
    CHECK_OK(dt_trace_start(NULL));
    uint64_t t0 = dt_now_ns();
    if (rank == 0)
        CHECK_ERR(dt_trace_save(pg, ""), DT_ERR_ARG, "expected a file name");
    else
        CHECK_ERR(dt_trace_save(pg, path), DT_ERR_PEER, "rank 0 could not write");
    CHECK(dt_now_ns() - t0 < 10000000000ull);
    dt_trace_reset();
    dt_pg_free(pg);
}

static void test_ranks(int world) {
    check_current = world == 2 ? "2 ranks" : "3 ranks";
    char path[256];
    snprintf(path, sizeof path, "/tmp/dt_test_trace_mp_%d.json", (int)getpid());
    mp_opts o = {.world = world};
    MP_RUN(&o, ranks, path);
}

// dtrain-mnist --trace on 2 processes: the instrumented library end to end.
static void test_mnist(void) {
    check_current = "dtrain-mnist --trace";
    char bin[512];
    if (!test_program_path("dtrain-mnist", bin, sizeof bin)) {
        fprintf(stderr, "skipping: no dtrain-mnist built\n");
        return;
    }
    char path[256], cmd[1200];
    snprintf(path, sizeof path, "/tmp/dt_test_trace_mnist_%d.json", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "%s --limit 256 --batch-size 32 --threads 2 --num-processes 2 --no-test "
             "--trace %s > /dev/null",
             bin, path);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    trace t;
    if (!load_trace(path, &t))
        return;
    for (int r = 0; r < 2; r++) {
        CHECK_EQ(t.npnames[r], 1);
        CHECK_EQ(count_spans(&t, r, "forward"), 4); // 256 / 2 ranks / 32 per batch
        CHECK_EQ(count_spans(&t, r, "backward"), 4);
        // 2 convolutions (fused with their ReLU, and pool) x 2 passes x 4 steps
        CHECK(count_prefixed(&t, r, "conv2d") >= 16);
        CHECK(count_spans(&t, r, "linear") >= 16);
        CHECK_EQ(count_spans(&t, r, "optimizer step"), 4);
        CHECK_EQ(count_spans(&t, r, "ddp sync"), 4);
        CHECK(count_spans(&t, r, "bucket start") >= 4);
        CHECK(count_spans(&t, r, "bucket wait") >= 4);
        CHECK(count_spans(&t, r, "all_reduce") >= 4);
        CHECK_EQ(count_spans(&t, r, "wait for batch"), 4);
    }
    CHECK_EQ(nesting_violations(&t), 0);
    free_trace(&t);
    unlink(path);
}

// A model graph's nodes are traced too: one forward and one backward span per node.
static void test_graph(void) {
    check_current = "graph nodes";
    dt_graph *g   = NULL;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {6, 1, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "flat", l, "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "act", l, "flat"));
    CHECK_OK(dt_graph_finalize(g, 1));
    float x[12], dy[12];
    for (int i = 0; i < 12; i++) {
        x[i]  = (float)i - 5.5f;
        dy[i] = 1.0f;
    }
    char path[256];
    snprintf(path, sizeof path, "/tmp/dt_test_trace_graph_%d.json", (int)getpid());
    CHECK_OK(dt_trace_start(NULL));
    for (int k = 0; k < 3; k++) {
        CHECK_OK(dt_graph_forward(g, (const void *[]){x}, 2));
        CHECK_OK(dt_graph_backward(g, dy));
    }
    CHECK_OK(dt_trace_save(NULL, path));
    trace t;
    if (load_trace(path, &t)) {
        int fwd = 0, bwd = 0;
        for (int i = 0; i < t.n; i++) {
            fwd += strcmp(t.s[i].cat, "forward") == 0;
            bwd += strcmp(t.s[i].cat, "backward") == 0;
        }
        CHECK_EQ(fwd, 6); // 2 nodes x 3 passes
        CHECK_EQ(bwd, 6);
        CHECK_EQ(count_spans(&t, 0, "relu"), 6);
        free_trace(&t);
    }
    dt_trace_reset();
    unlink(path);
    dt_graph_free(g);
}

int main(void) {
    test_one_process();
    test_graph();
    test_ranks(2);
    test_ranks(3);
    test_mnist();
    return check_summary();
}
