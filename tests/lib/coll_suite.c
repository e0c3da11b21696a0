// coll_suite.c: the collective test suite (see coll_suite.h).
#include "coll_suite.h"

#include <stdlib.h>
#include <string.h>

#ifdef DT_SANITIZE
#define BIG_COUNT ((size_t)(1u << 20) + 3) // sanitizers are 5-20x slower
#else
#define BIG_COUNT ((size_t)16 << 20) // 16 Mi elements
#endif
#define PRIME_COUNT 100003

static uint64_t seed_of_run; // of the current coll_suite_run

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Input element i of `rank` for test case `tag`. Value ranges keep every op exact
// enough: products of up to 5 numbers in [0.5, 1.5] or [-3, 3].
static uint64_t raw(uint64_t tag, int rank, size_t i) {
    return mix(seed_of_run ^ mix(tag * 1000003u + (uint64_t)rank) ^
               (uint64_t)i * 0x632be59bd9b4e019ull);
}

static void gen(dt_dtype t, dt_reduce_op op, uint64_t tag, int rank, size_t i, void *out) {
    uint64_t h = raw(tag, rank, i);
    switch (t) {
    case DT_FLOAT32: {
        float u       = (float)(h >> 40) / (float)(1u << 24); // [0, 1)
        *(float *)out = op == DT_REDUCE_PROD ? 0.5f + u : 2.0f * u - 1.0f;
        break;
    }
    case DT_INT32:
        *(int32_t *)out = op == DT_REDUCE_PROD  ? (int32_t)(h % 7) - 3
                          : op == DT_REDUCE_SUM ? (int32_t)(h % 2000001) - 1000000
                                                : (int32_t)(uint32_t)h;
        break;
    default:
        *(int64_t *)out = op == DT_REDUCE_PROD  ? (int64_t)(h % 7) - 3
                          : op == DT_REDUCE_SUM ? (int64_t)(h >> 4) - (int64_t)(1ll << 58)
                                                : (int64_t)h;
        break;
    }
}

// Fills buf with `count` elements of rank's input, starting at element `first`.
static void fill(void *buf, dt_dtype t, dt_reduce_op op, uint64_t tag, int rank, size_t first,
                 size_t count) {
    size_t esz = dt_dtype_size(t);
    for (size_t i = 0; i < count; i++)
        gen(t, op, tag, rank, first + i, (char *)buf + i * esz);
}

// Reference reduction of element i over ranks 0..world-1 (serial, in rank order) and
// the tolerance the distributed result may differ by (floats only).
static void reference(dt_dtype t, dt_reduce_op op, uint64_t tag, int world, size_t i, void *out,
                      double *tol) {
    *tol = 0;
    if (t == DT_FLOAT32) {
        double acc = 0, mag = 0;
        for (int r = 0; r < world; r++) {
            float v;
            gen(t, op, tag, r, i, &v);
            if (r == 0)
                acc = v;
            else if (op == DT_REDUCE_SUM || op == DT_REDUCE_AVG)
                acc += v;
            else if (op == DT_REDUCE_PROD)
                acc *= v;
            else if (op == DT_REDUCE_MAX)
                acc = v > acc ? v : acc;
            else
                acc = v < acc ? v : acc;
            mag += v < 0 ? -v : v;
        }
        if (op == DT_REDUCE_AVG)
            acc /= world, mag /= world;
        // float rounding of up to 4 operations in some order: a few ulps of the
        // magnitudes involved (products: of the result).
        *tol          = op == DT_REDUCE_PROD ? 1e-6 * (acc < 0 ? -acc : acc) * world
                        : (op == DT_REDUCE_SUM || op == DT_REDUCE_AVG) ? 1e-6 * mag * world
                                                                       : 0;
        *(float *)out = (float)acc;
        return;
    }
    uint64_t acc = 0;
    for (int r = 0; r < world; r++) {
        int64_t v;
        if (t == DT_INT32) {
            int32_t w;
            gen(t, op, tag, r, i, &w);
            v = w;
        } else {
            gen(t, op, tag, r, i, &v);
        }
        if (r == 0)
            acc = (uint64_t)v;
        else if (op == DT_REDUCE_SUM)
            acc += (uint64_t)v;
        else if (op == DT_REDUCE_PROD)
            acc *= (uint64_t)v;
        else if (op == DT_REDUCE_MAX)
            acc = v > (int64_t)acc ? (uint64_t)v : acc;
        else
            acc = v < (int64_t)acc ? (uint64_t)v : acc;
    }
    if (t == DT_INT32)
        *(int32_t *)out = (int32_t)(uint32_t)acc;
    else
        *(int64_t *)out = (int64_t)acc;
}

// Compares element i of got with the reference; returns false (once reported) on a
// difference.
static bool check_elem(dt_dtype t, dt_reduce_op op, uint64_t tag, int world, size_t i,
                       const void *got, const char *what) {
    char   want[8];
    double tol;
    reference(t, op, tag, world, i, want, &tol);
    bool ok;
    if (t == DT_FLOAT32) {
        float g = *(const float *)got, w = *(const float *)want;
        ok = (double)(g > w ? g - w : w - g) <= tol;
        if (!ok)
            fprintf(stderr, "     %s %s %s: element %zu = %.9g, expected %.9g (tol %.3g)\n", what,
                    dt_dtype_name(t), dt_reduce_op_name(op), i, g, w, tol);
    } else if (t == DT_INT32) {
        ok = *(const int32_t *)got == *(const int32_t *)want;
        if (!ok)
            fprintf(stderr, "     %s %s %s: element %zu = %d, expected %d\n", what,
                    dt_dtype_name(t), dt_reduce_op_name(op), i, *(const int32_t *)got,
                    *(const int32_t *)want);
    } else {
        ok = *(const int64_t *)got == *(const int64_t *)want;
        if (!ok)
            fprintf(stderr, "     %s %s %s: element %zu = %lld, expected %lld\n", what,
                    dt_dtype_name(t), dt_reduce_op_name(op), i, (long long)*(const int64_t *)got,
                    (long long)*(const int64_t *)want);
    }
    return ok;
}

// Checks `count` reduced elements starting at element `first`; one CHECK per call.
static void check_reduced(const void *buf, dt_dtype t, dt_reduce_op op, uint64_t tag, int world,
                          size_t first, size_t count, const char *what) {
    size_t esz = dt_dtype_size(t);
    bool   ok  = true;
    for (size_t i = 0; i < count && ok; i++)
        ok = check_elem(t, op, tag, world, first + i, (const char *)buf + i * esz, what);
    CHECK(ok);
}

// Checks that buf holds rank's input elements first..first+count.
static void check_input_op(const void *buf, dt_dtype t, dt_reduce_op op, uint64_t tag, int rank,
                           size_t first, size_t count, const char *what) {
    size_t esz = dt_dtype_size(t);
    char   want[8];
    bool   ok = true;
    for (size_t i = 0; i < count && ok; i++) {
        gen(t, op, tag, rank, first + i, want);
        ok = memcmp((const char *)buf + i * esz, want, esz) == 0;
        if (!ok)
            fprintf(stderr, "     %s %s: element %zu differs from rank %d's input\n", what,
                    dt_dtype_name(t), first + i, rank);
    }
    CHECK(ok);
}

static void check_input(const void *buf, dt_dtype t, uint64_t tag, int rank, size_t first,
                        size_t count, const char *what) {
    check_input_op(buf, t, DT_REDUCE_SUM, tag, rank, first, count, what);
}

// Every rank got bitwise the same bytes: compare a checksum across ranks.
static void check_same_everywhere(dt_pg *pg, const void *buf, size_t nbytes, const char *what) {
    int      world = dt_pg_size(pg);
    int64_t  mine  = dt_crc32c(0, buf, nbytes);
    int64_t *all   = calloc((size_t)world, sizeof *all);
    CHECK_OK(dt_pg_all_gather(pg, &mine, all, 1, DT_INT64));
    bool same = true;
    for (int r = 0; r < world; r++)
        same &= all[r] == mine;
    if (!same)
        fprintf(stderr, "     %s: result differs between ranks\n", what);
    CHECK(same);
    free(all);
}

static const size_t   counts[] = {0, 1, 7, PRIME_COUNT};
static const dt_dtype dtypes[] = {DT_FLOAT32, DT_INT32, DT_INT64};

static bool op_ok(dt_dtype t, dt_reduce_op op) {
    return op != DT_REDUCE_AVG || t == DT_FLOAT32;
}

static void *xalloc(size_t n) {
    void *p = dt_alloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static void test_all_reduce(dt_pg *pg, uint64_t *tag) {
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int op = 0; op < DT_REDUCE_COUNT_; op++) {
                dt_dtype t = dtypes[ti];
                if (!op_ok(t, op))
                    continue;
                size_t   n = counts[ci], nb = n * dt_dtype_size(t);
                char    *src = xalloc(nb), *dst = xalloc(nb);
                uint64_t tg = ++*tag;
                fill(src, t, op, tg, rank, 0, n);
                bool in_place = (ci + op) % 2 == 0;
                CHECK_OK(dt_pg_all_reduce(pg, src, in_place ? src : dst, n, t, op));
                check_reduced(in_place ? src : dst, t, op, tg, world, 0, n, "all_reduce");
                if (!in_place)
                    check_input_op(src, t, op, tg, rank, 0, n, "all_reduce src kept");
                if (n == PRIME_COUNT && t == DT_FLOAT32)
                    check_same_everywhere(pg, in_place ? src : dst, nb, "all_reduce");
                dt_free(src);
                dt_free(dst);
            }
}

static void test_all_reduce_big(dt_pg *pg, uint64_t *tag) {
    int      rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    size_t   n   = BIG_COUNT;
    float   *buf = xalloc(n * 4);
    uint64_t tg  = ++*tag;
    fill(buf, DT_FLOAT32, DT_REDUCE_SUM, tg, rank, 0, n);
    CHECK_OK(dt_pg_all_reduce(pg, buf, buf, n, DT_FLOAT32, DT_REDUCE_SUM));
    check_reduced(buf, DT_FLOAT32, DT_REDUCE_SUM, tg, world, 0, n, "all_reduce 16Mi");
    check_same_everywhere(pg, buf, n * 4, "all_reduce 16Mi");
    dt_free(buf);
}

// The all_reduce in tree order (comm.h, DT_ORDER_TREE) against the tree summed here,
// bitwise: value k takes value k + h for h = the largest power of two below the world
// size, then h/2, ..., 1. AVG divides the sum by the world size (x / 2^k is x * 2^-k
// exactly, so a division is the reference for every world). Counts from one element
// to past the segment and the small-message threshold, so every algorithm the tables
// may pick for it runs.
static void test_all_reduce_tree(dt_pg *pg, uint64_t *tag) {
    int                 rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    static const size_t tcounts[] = {1, 7, PRIME_COUNT, 700001};
    float              *v         = xalloc(sizeof(float) * (size_t)world);
    for (size_t ci = 0; ci < sizeof tcounts / sizeof tcounts[0]; ci++)
        for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
            size_t   n   = tcounts[ci];
            float   *buf = xalloc(n * 4);
            uint64_t tg  = ++*tag;
            fill(buf, DT_FLOAT32, op, tg, rank, 0, n);
            CHECK_OK(dt_pg_all_reduce_ordered(pg, buf, buf, n, DT_FLOAT32, op, DT_ORDER_TREE));
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                for (int r = 0; r < world; r++)
                    gen(DT_FLOAT32, op, tg, r, i, &v[r]);
                int top = 1;
                while (2 * top < world)
                    top *= 2;
                for (int h = top; h >= 1; h /= 2)
                    for (int k = 0; k < h && k + h < world; k++)
                        v[k] += v[k + h];
                float want = op == DT_REDUCE_AVG ? v[0] / (float)world : v[0];
                if (memcmp(&want, &buf[i], 4) != 0 && bad++ < 3)
                    fprintf(stderr,
                            "     all_reduce in tree order (%s, count %zu): element %zu = "
                            "%.9g, expected %.9g\n",
                            dt_reduce_op_name(op), n, i, buf[i], want);
            }
            CHECK_EQ(bad, 0);
            dt_free(buf);
        }
    dt_free(v);
}

static void test_broadcast_reduce(dt_pg *pg, uint64_t *tag) {
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    for (size_t ci = 0; ci < 4; ci++)
        for (int root = 0; root < world; root++) {
            dt_dtype t = dtypes[(ci + (size_t)root) % 3];
            size_t   n = counts[ci], nb = n * dt_dtype_size(t);
            char    *b  = xalloc(nb);
            uint64_t tg = ++*tag;
            fill(b, t, DT_REDUCE_SUM, tg, rank, 0, n);
            CHECK_OK(dt_pg_broadcast(pg, b, n, t, root));
            check_input(b, t, tg, root, 0, n, "broadcast");
            dt_free(b);
            // reduce, one op per (count, root), in place on even roots
            dt_reduce_op op = (dt_reduce_op)((ci + (size_t)root) % DT_REDUCE_COUNT_);
            if (!op_ok(t, op))
                op = DT_REDUCE_MAX;
            char *src = xalloc(nb), *dst = xalloc(nb);
            tg = ++*tag;
            fill(src, t, op, tg, rank, 0, n);
            bool in_place = root % 2 == 0;
            CHECK_OK(dt_pg_reduce(pg, src, in_place ? src : dst, n, t, op, root));
            if (rank == root)
                check_reduced(in_place ? src : dst, t, op, tg, world, 0, n, "reduce");
            dt_free(src);
            dt_free(dst);
        }
}

static void test_gathers(dt_pg *pg, uint64_t *tag) {
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    for (size_t ci = 0; ci < 4; ci++) {
        dt_dtype t = dtypes[ci % 3];
        size_t   n = counts[ci], esz = dt_dtype_size(t), one = n * esz;
        char    *all = xalloc(one * (size_t)world), *mine = xalloc(one);
        // all_gather, out of place then in place
        for (int in_place = 0; in_place < 2; in_place++) {
            uint64_t tg  = ++*tag;
            char    *src = in_place ? all + (size_t)rank * one : mine;
            fill(src, t, DT_REDUCE_SUM, tg, rank, 0, n);
            CHECK_OK(dt_pg_all_gather(pg, src, all, n, t));
            for (int r = 0; r < world; r++)
                check_input(all + (size_t)r * one, t, tg, r, 0, n, "all_gather");
        }
        // reduce_scatter: every op, out of place and in place
        for (int op = 0; op < DT_REDUCE_COUNT_; op++) {
            if (!op_ok(t, op))
                continue;
            uint64_t tg       = ++*tag;
            bool     in_place = op % 2 == 1;
            fill(all, t, op, tg, rank, 0, n * (size_t)world);
            char *dst = in_place ? all + (size_t)rank * one : mine;
            CHECK_OK(dt_pg_reduce_scatter(pg, all, dst, n, t, op));
            check_reduced(dst, t, op, tg, world, (size_t)rank * n, n, "reduce_scatter");
        }
        // gather and scatter to/from every root
        for (int root = 0; root < world; root++) {
            uint64_t tg = ++*tag;
            fill(mine, t, DT_REDUCE_SUM, tg, rank, 0, n);
            CHECK_OK(dt_pg_gather(pg, mine, rank == root ? all : NULL, n, t, root));
            if (rank == root)
                for (int r = 0; r < world; r++)
                    check_input(all + (size_t)r * one, t, tg, r, 0, n, "gather");
            tg = ++*tag;
            if (rank == root)
                fill(all, t, DT_REDUCE_SUM, tg, root, 0, n * (size_t)world);
            CHECK_OK(dt_pg_scatter(pg, rank == root ? all : NULL, mine, n, t, root));
            check_input(mine, t, tg, root, (size_t)rank * n, n, "scatter");
        }
        // all_to_all: block j of rank i = input of rank i at elements j*n..
        char    *out = xalloc(one * (size_t)world);
        uint64_t tg  = ++*tag;
        fill(all, t, DT_REDUCE_SUM, tg, rank, 0, n * (size_t)world);
        CHECK_OK(dt_pg_all_to_all(pg, all, out, n, t));
        for (int r = 0; r < world; r++)
            check_input(out + (size_t)r * one, t, tg, r, (size_t)rank * n, n, "all_to_all");
        dt_free(out);
        dt_free(all);
        dt_free(mine);
    }
}

static void test_barrier_send_recv(dt_pg *pg, uint64_t *tag) {
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    for (int i = 0; i < 3; i++)
        CHECK_OK(dt_pg_barrier(pg));
    if (world == 1)
        return;
    // A ring of messages: send to rank+1, receive from rank-1. Operations run one at a
    // time in issue order and a send may wait for its receiver (comm.h), so even ranks
    // send first and odd ranks receive first, as with MPI_Send.
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (size_t ci = 0; ci < 4; ci++) {
        size_t   n  = counts[ci];
        uint64_t tg = ++*tag;
        float   *s = xalloc(n * 4), *r = xalloc(n * 4);
        fill(s, DT_FLOAT32, DT_REDUCE_SUM, tg, rank, 0, n);
        dt_work *w = NULL;
        if (rank % 2 == 0) {
            CHECK_OK(dt_pg_send_async(pg, s, n, DT_FLOAT32, next, (int)ci, &w));
            CHECK_OK(dt_pg_recv(pg, r, n, DT_FLOAT32, prev, (int)ci));
        } else {
            CHECK_OK(dt_pg_recv_async(pg, r, n, DT_FLOAT32, prev, (int)ci, &w));
            CHECK_OK(dt_pg_send(pg, s, n, DT_FLOAT32, next, (int)ci));
        }
        CHECK_OK(dt_work_wait(w));
        dt_work_free(w);
        check_input(r, DT_FLOAT32, tg, prev, 0, n, "send/recv");
        dt_free(s);
        dt_free(r);
    }
}

// Several operations in flight at once, of different kinds, then waited in reverse.
static void test_async(dt_pg *pg, uint64_t *tag) {
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    enum { K = 6 };
    size_t   n = PRIME_COUNT;
    float   *bufs[K];
    uint64_t tags[K];
    dt_work *w[K];
    size_t   m = n / (size_t)world;
    for (int k = 0; k < K; k++) {
        bufs[k] = xalloc(n * (size_t)world * 4);
        tags[k] = ++*tag;
        if (k == 3) // all_gather in place: our block at rank * m
            fill(bufs[k] + (size_t)rank * m, DT_FLOAT32, DT_REDUCE_SUM, tags[k], rank, 0, m);
        else
            fill(bufs[k], DT_FLOAT32, DT_REDUCE_SUM, tags[k], rank, 0, n);
    }
    CHECK_OK(dt_pg_all_reduce_async(pg, bufs[0], bufs[0], n, DT_FLOAT32, DT_REDUCE_SUM, &w[0]));
    CHECK_OK(dt_pg_all_reduce_async(pg, bufs[1], bufs[1], 7, DT_FLOAT32, DT_REDUCE_SUM, &w[1]));
    CHECK_OK(dt_pg_broadcast_async(pg, bufs[2], n, DT_FLOAT32, world - 1, &w[2]));
    CHECK_OK(dt_pg_all_gather_async(pg, bufs[3] + (size_t)rank * m, bufs[3], m, DT_FLOAT32, &w[3]));
    CHECK_OK(dt_pg_barrier_async(pg, &w[4]));
    CHECK_OK(dt_pg_all_reduce_async(pg, bufs[5], bufs[5], n, DT_FLOAT32, DT_REDUCE_SUM, &w[5]));
    // A blocking call issued meanwhile keeps its place in the order.
    float x = (float)rank, sum = 0;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &sum, 1, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK_NEAR(sum, world * (world - 1) / 2.0, 0);
    for (int k = K - 1; k >= 0; k--) {
        CHECK_OK(dt_work_wait(w[k]));
        CHECK(dt_work_test(w[k]));
    }
    check_reduced(bufs[0], DT_FLOAT32, DT_REDUCE_SUM, tags[0], world, 0, n, "async all_reduce");
    check_reduced(bufs[1], DT_FLOAT32, DT_REDUCE_SUM, tags[1], world, 0, 7, "async all_reduce 7");
    check_input(bufs[2], DT_FLOAT32, tags[2], world - 1, 0, n, "async broadcast");
    for (int r = 0; r < world; r++)
        check_input(bufs[3] + (size_t)r * m, DT_FLOAT32, tags[3], r, 0, m, "async all_gather");
    check_reduced(bufs[5], DT_FLOAT32, DT_REDUCE_SUM, tags[5], world, 0, n, "async all_reduce 2");
    for (int k = 0; k < K; k++) {
        dt_work_free(w[k]);
        dt_free(bufs[k]);
    }
    // The steady state allocates nothing: the same async operations again and again.
    float *g      = xalloc(4096 * 4);
    size_t before = 0;
    for (int step = 0; step < 6; step++) {
        if (step == 2)
            before = dt_alloc_total_count();
        dt_work *a, *b;
        CHECK_OK(dt_pg_all_reduce_async(pg, g, g, 4096, DT_FLOAT32, DT_REDUCE_AVG, &a));
        CHECK_OK(dt_pg_all_reduce_async(pg, g, g, 7, DT_FLOAT32, DT_REDUCE_SUM, &b));
        CHECK_OK(dt_work_wait(a));
        CHECK_OK(dt_work_wait(b));
        dt_work_free(a);
        dt_work_free(b);
    }
    CHECK_EQ(dt_alloc_total_count(), before);
    dt_free(g);
    // Freeing a handle that was never waited for waits for it.
    float    y = 1;
    dt_work *u;
    CHECK_OK(dt_pg_all_reduce_async(pg, &y, &y, 1, DT_FLOAT32, DT_REDUCE_SUM, &u));
    dt_work_free(u);
    CHECK_NEAR(y, world, 0);
}

void coll_suite_run_impl(dt_pg *pg, const coll_suite_opts *o, int *passed, int *failed) {
    int p0 = check_passed, f0 = check_failed;
    check_current = "coll_suite";
    seed_of_run   = o->seed;
    uint64_t tag  = 0;
    test_all_reduce(pg, &tag);
    if (o->big)
        test_all_reduce_big(pg, &tag);
    test_all_reduce_tree(pg, &tag);
    test_broadcast_reduce(pg, &tag);
    test_gathers(pg, &tag);
    test_barrier_send_recv(pg, &tag);
    test_async(pg, &tag);
    *passed += check_passed - p0;
    *failed += check_failed - f0;
}
