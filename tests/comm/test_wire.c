// test_wire.c: the tcp message header and the store protocol parser on their own:
// round trips of random headers, every single-bit corruption caught, truncation and
// out-of-range fields refused with a message naming the check; fingerprints matched
// and printed (the reduce order too); the reduction kernels against plain loops, and
// the n-operand kernel in rank and in tree order.
#include "../check.h"
#include "comm/comm_impl.h"
#include "comm/reduce.h"
#include "comm/tcp/wire.h"
#include "dtrain/rng.h"

#include <string.h>

static void random_header(dt_rng *r, dt_wire_header *h) {
    memset(h, 0, sizeof *h);
    h->kind     = DT_WIRE_DATA;
    h->fp.coll  = (uint8_t)dt_rng_below(r, DT_COLL_COUNT_);
    h->fp.dtype = (uint8_t)dt_rng_below(r, DT_DTYPE_COUNT_);
    h->fp.op    = (uint8_t)dt_rng_below(r, DT_REDUCE_COUNT_);
    h->fp.order = (uint8_t)dt_rng_below(r, DT_ORDER_COUNT_);
    h->fp.seq   = dt_rng_u64(r);
    h->fp.count = dt_rng_u64(r);
    h->fp.root  = (int32_t)dt_rng_u32(r);
    h->step     = dt_rng_u32(r);
    h->nbytes   = dt_rng_below(r, DT_WIRE_MAX_PAYLOAD + 1);
    h->src_rank = dt_rng_u32(r);
}

static void test_header_round_trip(void) {
    dt_rng r = dt_rng_init(dt_now_ns());
    for (int i = 0; i < 1000; i++) {
        dt_wire_header h, g;
        uint8_t        b[DT_WIRE_HEADER_BYTES];
        random_header(&r, &h);
        dt_wire_encode(&h, b);
        CHECK_OK(dt_wire_decode(b, sizeof b, &g));
        CHECK(memcmp(&h, &g, sizeof h) == 0);
    }
}

static void test_header_corruption(void) {
    dt_rng         r = dt_rng_init(7);
    dt_wire_header h, g;
    uint8_t        b[DT_WIRE_HEADER_BYTES];
    random_header(&r, &h);
    dt_wire_encode(&h, b);
    int caught = 0;
    for (int bit = 0; bit < DT_WIRE_HEADER_BYTES * 8; bit++) {
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        caught += dt_wire_decode(b, sizeof b, &g) == DT_ERR_FORMAT;
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    CHECK_EQ(caught, DT_WIRE_HEADER_BYTES * 8);
    CHECK_ERR(dt_wire_decode(b, 47, &g), DT_ERR_FORMAT, "expected 48 bytes, found 47");
    b[0] = 'X';
    CHECK_ERR(dt_wire_decode(b, sizeof b, &g), DT_ERR_FORMAT, "expected magic");
    // Field checks run on headers with a valid checksum.
    h.fp.dtype = 9;
    dt_wire_encode(&h, b);
    CHECK_ERR(dt_wire_decode(b, sizeof b, &g), DT_ERR_FORMAT, "expected dtype < 3, found 9");
    h.fp.dtype = 0;
    h.fp.order = 5;
    dt_wire_encode(&h, b);
    CHECK_ERR(dt_wire_decode(b, sizeof b, &g), DT_ERR_FORMAT, "expected reduce order < 2, found 5");
    h.fp.order = 0;
    h.nbytes   = DT_WIRE_MAX_PAYLOAD + 1;
    dt_wire_encode(&h, b);
    CHECK_ERR(dt_wire_decode(b, sizeof b, &g), DT_ERR_FORMAT, "payload bytes");
    h.kind   = DT_WIRE_ABORT;
    h.nbytes = 5000;
    dt_wire_encode(&h, b);
    CHECK_ERR(dt_wire_decode(b, sizeof b, &g), DT_ERR_FORMAT, "reason of at most 1024");
    h.kind = 77;
    dt_wire_encode(&h, b);
    CHECK_ERR(dt_wire_decode(b, sizeof b, &g), DT_ERR_FORMAT, "expected kind 1..4, found 77");
}

static void test_fingerprints(void) {
    dt_fingerprint a = {.seq   = 42,
                        .count = 1000,
                        .root  = -1,
                        .coll  = DT_COLL_ALL_REDUCE,
                        .dtype = DT_FLOAT32,
                        .op    = DT_REDUCE_SUM};
    dt_fingerprint b = a;
    CHECK(dt_fp_match(&a, &b));
    b.count = 999;
    CHECK(!dt_fp_match(&a, &b));
    b = a, b.op = DT_REDUCE_AVG;
    CHECK(!dt_fp_match(&a, &b));
    b = a, b.seq = 43;
    CHECK(!dt_fp_match(&a, &b));
    b = a, b.order = DT_ORDER_TREE;
    CHECK(!dt_fp_match(&a, &b)); // ranks must agree on the order
    char buf[160];
    CHECK(strcmp(dt_fp_format(&a, buf, sizeof buf), "all_reduce #42 (float32 sum, count 1000)") ==
          0);
    CHECK(strcmp(dt_fp_format(&b, buf, sizeof buf),
                 "all_reduce #42 (float32 sum in tree order, count 1000)") == 0);
    dt_fingerprint s = {.seq = 3, .count = 5, .root = 9, .coll = DT_COLL_SEND, .dtype = DT_INT64};
    dt_fingerprint t = s;
    t.coll           = DT_COLL_RECV;
    CHECK(dt_fp_match(&s, &t)); // a send matches a receive
    t.root = 8;
    CHECK(!dt_fp_match(&s, &t)); // different tags
    CHECK(strcmp(dt_fp_format(&s, buf, sizeof buf), "send #3 (int64, count 5, tag 9)") == 0);
    dt_fingerprint c = {
        .seq = 7, .count = 3, .root = 1, .coll = DT_COLL_BROADCAST, .dtype = DT_INT32};
    CHECK(strcmp(dt_fp_format(&c, buf, sizeof buf), "broadcast #7 (int32, count 3, root 1)") == 0);
}

static size_t request(uint8_t *out, uint8_t cmd, int64_t arg, int nparts, const char **parts) {
    size_t payload = 0;
    for (int i = 0; i < nparts; i++)
        payload += 4 + strlen(parts[i]);
    memset(out, 0, DT_STORE_HEADER_BYTES);
    memcpy(out, "DTS1", 4);
    out[4] = cmd;
    out[6] = (uint8_t)nparts;
    memcpy(out + 8, &arg, 8); // little-endian host
    uint32_t pl = (uint32_t)payload;
    memcpy(out + 16, &pl, 4);
    uint8_t *p = out + DT_STORE_HEADER_BYTES;
    for (int i = 0; i < nparts; i++) {
        uint32_t l = (uint32_t)strlen(parts[i]);
        memcpy(p, &l, 4);
        memcpy(p + 4, parts[i], l);
        p += 4 + l;
    }
    return DT_STORE_HEADER_BYTES + payload;
}

static void test_store_messages(void) {
    uint8_t      b[256];
    const char  *parts[2] = {"key", "value"};
    size_t       n        = request(b, DT_STORE_SET, 0, 2, parts);
    dt_store_msg m;
    size_t       used;
    // Every strict prefix asks for more bytes; the whole message parses.
    for (size_t k = 0; k < n; k++) {
        CHECK_OK(dt_store_msg_parse(b, k, true, &m, &used));
        CHECK_EQ(used, 0);
    }
    CHECK_OK(dt_store_msg_parse(b, n, true, &m, &used));
    CHECK_EQ(used, n);
    CHECK_OK(dt_store_msg_check_request(&m));
    size_t         cur = 0;
    const uint8_t *p;
    uint32_t       len;
    CHECK(dt_store_msg_part(&m, &cur, &p, &len) && len == 3 && memcmp(p, "key", 3) == 0);
    CHECK(dt_store_msg_part(&m, &cur, &p, &len) && len == 5 && memcmp(p, "value", 5) == 0);
    CHECK(!dt_store_msg_part(&m, &cur, &p, &len));
    // Part lengths that do not tile the payload.
    b[DT_STORE_HEADER_BYTES] = 200;
    CHECK_ERR(dt_store_msg_parse(b, n, true, &m, &used), DT_ERR_FORMAT, "part 0");
    request(b, DT_STORE_SET, 0, 2, parts);
    b[6] = 1; // one part declared, two present
    CHECK_ERR(dt_store_msg_parse(b, n, true, &m, &used), DT_ERR_FORMAT, "parts add up");
    request(b, 99, 0, 2, parts);
    CHECK_ERR(dt_store_msg_parse(b, n, true, &m, &used), DT_ERR_FORMAT, "expected a command");
    request(b, DT_STORE_SET, 0, 2, parts);
    uint32_t huge = 0x7fffffff;
    memcpy(b + 16, &huge, 4);
    CHECK_ERR(dt_store_msg_parse(b, n, true, &m, &used), DT_ERR_FORMAT, "payload bytes");
    // A set with one part is refused by the command check.
    n = request(b, DT_STORE_SET, 0, 1, parts);
    CHECK_OK(dt_store_msg_parse(b, n, true, &m, &used));
    CHECK_ERR(dt_store_msg_check_request(&m), DT_ERR_FORMAT, "expected 2..2 parts");
    const char *empty[1] = {""};
    n                    = request(b, DT_STORE_GET, 0, 1, empty);
    CHECK_OK(dt_store_msg_parse(b, n, true, &m, &used));
    CHECK_ERR(dt_store_msg_check_request(&m), DT_ERR_FORMAT, "expected a key");
}

// dt_reduce against a plain loop, every dtype and op, with odd lengths and aliasing.
static void test_reduce_kernels(void) {
    dt_rng r = dt_rng_init(11);
    for (int t = 0; t < DT_DTYPE_COUNT_; t++)
        for (int op = 0; op < DT_REDUCE_COUNT_; op++) {
            if (op == DT_REDUCE_AVG)
                continue;
            size_t   n = 1 + dt_rng_below(&r, 1000), esz = dt_dtype_size(t);
            uint8_t *a = dt_alloc(n * esz), *b = dt_alloc(n * esz), *d = dt_alloc(n * esz);
            for (size_t i = 0; i < n * esz; i++)
                a[i] = (uint8_t)dt_rng_u32(&r), b[i] = (uint8_t)dt_rng_u32(&r);
            if (t == DT_FLOAT32)
                for (size_t i = 0; i < n; i++)
                    ((float *)a)[i]         = dt_rng_uniform_range(&r, -2, 2),
                            ((float *)b)[i] = dt_rng_uniform_range(&r, -2, 2);
            dt_reduce(t, op, d, a, b, n);
            bool ok = true;
            for (size_t i = 0; i < n && ok; i++) {
                if (t == DT_FLOAT32) {
                    float x = ((float *)a)[i], y = ((float *)b)[i], w;
                    w  = op == DT_REDUCE_SUM    ? x + y
                         : op == DT_REDUCE_PROD ? x * y
                         : op == DT_REDUCE_MAX  ? (x > y ? x : y)
                                                : (x < y ? x : y);
                    ok = ((float *)d)[i] == w;
                } else if (t == DT_INT32) {
                    int32_t x = ((int32_t *)a)[i], y = ((int32_t *)b)[i];
                    int32_t w = op == DT_REDUCE_SUM    ? (int32_t)((uint32_t)x + (uint32_t)y)
                                : op == DT_REDUCE_PROD ? (int32_t)((uint32_t)x * (uint32_t)y)
                                : op == DT_REDUCE_MAX  ? (x > y ? x : y)
                                                       : (x < y ? x : y);
                    ok        = ((int32_t *)d)[i] == w;
                } else {
                    int64_t x = ((int64_t *)a)[i], y = ((int64_t *)b)[i];
                    int64_t w = op == DT_REDUCE_SUM    ? (int64_t)((uint64_t)x + (uint64_t)y)
                                : op == DT_REDUCE_PROD ? (int64_t)((uint64_t)x * (uint64_t)y)
                                : op == DT_REDUCE_MAX  ? (x > y ? x : y)
                                                       : (x < y ? x : y);
                    ok        = ((int64_t *)d)[i] == w;
                }
            }
            CHECK(ok);
            // In place into either operand gives the same bytes.
            dt_reduce(t, op, a, a, b, n);
            CHECK(memcmp(a, d, n * esz) == 0);
            dt_free(a);
            dt_free(b);
            dt_free(d);
        }
    float x[3] = {2, 4, -6};
    dt_reduce_div(DT_FLOAT32, x, 3, 4);
    CHECK(x[0] == 0.5f && x[1] == 1.0f && x[2] == -1.5f);
    float nan_in[2] = {__builtin_nanf(""), 1}, other[2] = {3, __builtin_nanf("")}, out[2];
    dt_reduce(DT_FLOAT32, DT_REDUCE_MAX, out, nan_in, other, 2);
    CHECK(out[0] != out[0] && out[1] != out[1]); // NaN propagates either way
}

// dt_reduce_n: nin operands combined in rank order ((x0 + x1) + x2) + ... or in the tree
// of DT_ORDER_TREE, bitwise against the fold written here, for 1 to 9 operands and
// counts that cross the kernel's blocks; values of very different magnitudes so that
// the two orders give different sums (checked: a kernel ignoring the order fails).
// Both outputs, with and without non-temporal stores; in place; AVG.
static void test_reduce_n_orders(void) {
    dt_rng       r = dt_rng_init(5);
    const size_t n = 5000;
    float       *x[9], want[5000], v[9], got[5000], got2[5000];
    for (int k = 0; k < 9; k++) {
        x[k] = dt_alloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            x[k][i] = dt_rng_uniform_range(&r, -1, 1) * (k % 3 == 0 ? 1e7f : 1.0f);
    }
    int orders_differ = 0;
    for (int nin = 1; nin <= 9; nin++)
        for (int order = DT_ORDER_ANY; order <= DT_ORDER_TREE; order++) {
            const void *in[9];
            for (int k = 0; k < nin; k++)
                in[k] = x[k];
            for (size_t i = 0; i < n; i++) {
                for (int k = 0; k < nin; k++)
                    v[k] = x[k][i];
                if (order == DT_ORDER_ANY) {
                    for (int k = 1; k < nin; k++)
                        v[0] += v[k];
                } else {
                    int top = 1;
                    while (2 * top < nin)
                        top *= 2;
                    for (int h = top; h >= 1; h /= 2)
                        for (int k = 0; k < h && k + h < nin; k++)
                            v[k] += v[k + h];
                }
                if (order == DT_ORDER_TREE && memcmp(&want[i], &v[0], 4) != 0)
                    orders_differ++; // want still holds the rank-order sum
                want[i] = v[0];
            }
            dt_reduce_n(got, got2, true, in, nin, n, DT_FLOAT32, DT_REDUCE_SUM,
                        (dt_reduce_order)order);
            dt_store_fence();
            CHECK(memcmp(got, want, sizeof want) == 0);
            CHECK(memcmp(got2, want, sizeof want) == 0);
            // AVG: the same sum divided by nin.
            dt_reduce_n(got, NULL, false, in, nin, n, DT_FLOAT32, DT_REDUCE_AVG,
                        (dt_reduce_order)order);
            bool avg_ok = true;
            for (size_t i = 0; i < n; i++)
                avg_ok &= got[i] == (nin > 1 ? want[i] / (float)nin : want[i]);
            CHECK(avg_ok);
        }
    CHECK(orders_differ > 1000);
    // In place: the output is the first operand.
    float      *a = dt_alloc(n * sizeof(float));
    const void *in3[3];
    memcpy(a, x[0], n * sizeof(float));
    in3[0] = a, in3[1] = x[1], in3[2] = x[2];
    dt_reduce_n(a, NULL, false, in3, 3, n, DT_FLOAT32, DT_REDUCE_SUM, DT_ORDER_TREE);
    bool ok = true;
    for (size_t i = 0; i < n; i++)
        ok &= a[i] == (x[0][i] + x[2][i]) + x[1][i];
    CHECK(ok);
    // Integer AVG truncates; integer sums wrap in either order.
    int32_t     i0[2] = {7, INT32_MAX}, i1[2] = {-2, 1}, i2[2] = {0, 1}, io[2];
    const void *ii[3] = {i0, i1, i2};
    dt_reduce_n(io, NULL, false, ii, 3, 2, DT_INT32, DT_REDUCE_AVG, DT_ORDER_ANY);
    CHECK(io[0] == 1);
    dt_reduce_n(io, NULL, false, ii, 3, 2, DT_INT32, DT_REDUCE_SUM, DT_ORDER_TREE);
    CHECK(io[0] == 5 && io[1] == INT32_MIN + 1);
    dt_free(a);
    // Many operands (a host's ranks): the tree's scratch blocks shrink to one cache line
    // (8 int64s) from 129 operands on; 512 is the most. Exact against the tree's fold.
    enum { MANY = 512, MN = 100 };
    int64_t    *big = dt_alloc(sizeof(int64_t) * MANY * MN), mwant[MN], mgot[MN];
    const void *min[MANY];
    for (int k = 0; k < MANY; k++) {
        min[k] = big + (size_t)k * MN;
        for (int i = 0; i < MN; i++)
            big[(size_t)k * MN + (size_t)i] = (int64_t)(dt_rng_u64(&r) >> 1) - INT64_MAX / 2;
    }
    for (int nin = 127; nin <= MANY; nin = nin < 300 ? nin * 2 + 1 : MANY) {
        int top = 1;
        while (2 * top < nin)
            top *= 2;
        for (int i = 0; i < MN; i++) {
            uint64_t u[MANY];
            for (int k = 0; k < nin; k++)
                u[k] = (uint64_t)big[(size_t)k * MN + (size_t)i];
            for (int h = top; h >= 1; h /= 2)
                for (int k = 0; k < h && k + h < nin; k++)
                    u[k] += u[k + h];
            mwant[i] = (int64_t)u[0];
        }
        dt_reduce_n(mgot, NULL, false, min, nin, MN, DT_INT64, DT_REDUCE_SUM, DT_ORDER_TREE);
        CHECK(memcmp(mgot, mwant, sizeof mwant) == 0);
        if (nin == MANY)
            break;
    }
    dt_free(big);
    for (int k = 0; k < 9; k++)
        dt_free(x[k]);
}

int main(void) {
    RUN(test_header_round_trip);
    RUN(test_header_corruption);
    RUN(test_fingerprints);
    RUN(test_store_messages);
    RUN(test_reduce_kernels);
    RUN(test_reduce_n_orders);
    return check_summary();
}
