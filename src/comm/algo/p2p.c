// p2p.c: the point-to-point family of the algorithm layer (algo.h): the collective
// algorithms written once over a transport's transfer slots (xfer_post / xfer_wait), as
// Gloo's collectives sit on its Pair transport and Open MPI's coll/base on its PML. The
// tables of table.c say which runs when; this file only runs the one it is given.
// Reductions always combine operands in an order fixed by rank, so results are
// identical on every rank and reproducible for a fixed world size.
#include "comm/algo/algo.h"
#include "comm/reduce.h"

#include <string.h>

static dt_status grow(void **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return DT_OK;
    void *p = dt_alloc(need);
    if (!p)
        return DT_ERR_NOMEM;
    dt_free(*buf);
    *buf = p;
    *cap = need;
    return DT_OK;
}

// ------------------------------------------------------------------- transfer helpers

typedef struct algo {
    const dt_xport *t;
    const dt_op    *op;
    dt_algo_cfg    *cfg;
    int             rank, world;
    size_t          esz;
} algo;

// `peer` is a rank of the group; the transfer slots get theirs (dt_xport.peers).
static dt_status post(algo *a, dt_xfer *x, int peer, bool send, const void *buf, size_t nbytes,
                      int alg, uint32_t step) {
    memset(x, 0, sizeof *x);
    x->peer    = a->t->peers ? a->t->peers[peer] : peer;
    x->is_send = send;
    x->buf     = (void *)(uintptr_t)buf; // sends do not write through it
    x->nbytes  = nbytes;
    x->step    = ((uint32_t)alg << 24) | (step & 0xffffffu);
    return a->t->xfer_post(a->t->xfer_ctx, a->op, x);
}

static dt_status wait(algo *a, dt_xfer *x) {
    if (x->done)
        return DT_OK;
    return a->t->xfer_wait(a->t->xfer_ctx, a->op, x);
}

static dt_status xfers(algo *a, size_t n, dt_xfer **out) {
    if (grow((void **)&a->cfg->xfers, &a->cfg->xfer_cap, n * sizeof(dt_xfer)) != DT_OK)
        return dt_op_fail(a->op, DT_ERR_NOMEM, "out of memory for %zu transfers", n);
    *out = a->cfg->xfers;
    return DT_OK;
}

static dt_status part_buffer(algo *a, size_t nbytes, char **out) {
    if (grow(&a->cfg->part_buf, &a->cfg->part_cap, nbytes ? nbytes : 1) != DT_OK)
        return dt_op_fail(a->op, DT_ERR_NOMEM, "out of memory for a %zu-byte scratch buffer",
                          nbytes);
    *out = a->cfg->part_buf;
    return DT_OK;
}

static int mod(int x, int n) {
    return ((x % n) + n) % n;
}

// Balanced split: element offset of piece i when n elements go into k pieces.
static size_t split(size_t n, size_t k, size_t i) {
    return (n / k) * i + (i < n % k ? i : n % k);
}

// ----------------------------------------------------------------------------- ring
//
// Ring reduce-scatter and/or all-gather over P ranks, each chunk cut into S segments
// that flow through the ring one after another, so sending segment j, receiving
// segment j+1 and reducing segment j-1 overlap. Send to rank+1, receive from rank-1.
//
// Reduce-scatter, step s = 0..P-2: send chunk (r-1-s), receive chunk (r-2-s) and
// reduce it with our own contribution; after P-1 steps rank r holds chunk r reduced
// over all ranks. All-gather, step s = 0..P-2: send chunk (r-s), receive chunk
// (r-1-s) into place. P = 3, all_reduce of chunks A|B|C, "a0" = rank 0's part of A:
//
//   after      rank 0              rank 1              rank 2
//   RS s=0     B: b2+b0            C: c0+c1            A: a1+a2
//   RS s=1     A: a1+a2+a0 (done)  B: b2+b0+b1 (done)  C: c0+c1+c2 (done)
//   AG s=0     A, C                B, A                C, B
//   AG s=1     A, B, C             A, B, C             A, B, C
//
// Chunk c is reduced in the order x_{c+1}, x_{c+2}, ..., x_c (fixed by rank). Cost
// per rank: 2(P-1)/P of the buffer sent and received (bandwidth-optimal), 2(P-1)S
// messages. Transfers are numbered t = s*S + j over both phases; send t needs the
// result of t-S (or own data when t < S); receives go into `slots` rotating slots
// (reduce-scatter) or straight into place (all-gather).

typedef struct ring {
    bool        rs, ag;      // phases to run
    size_t      count;       // total elements (P chunks)
    size_t      chunk_fixed; // > 0: every chunk has this many elements (rs/ag kinds)
    const char *mine;        // our contribution, chunk c at chunk_off(c)
    char       *out;         // where reduce-scatter partials go (chunk_off layout)
    char       *final_rs;    // where our fully reduced chunk goes (NULL = in out)
    char       *ag_buf;      // all-gather buffer (chunk_off layout)
} ring;

static size_t chunk_off(const algo *a, const ring *g, int c) {
    if (g->chunk_fixed || g->count == 0)
        return (size_t)c * g->chunk_fixed;
    return split(g->count, (size_t)a->world, (size_t)c);
}

static size_t chunk_len(const algo *a, const ring *g, int c) {
    return chunk_off(a, g, c + 1) - chunk_off(a, g, c);
}

// The segment transfer t carries when `who` sends it: chunk, element offset, length.
// Reduce-scatter step s sends chunk who-1-s, all-gather step s sends chunk who-s; the
// receiver of t evaluates this with who = its left neighbour.
static void ring_seg(const algo *a, const ring *g, size_t t, size_t R, size_t S, int who,
                     int *chunk, size_t *off, size_t *len) {
    size_t s = t < R ? t / S : (t - R) / S, j = t % S;
    int    c  = t < R ? mod(who - 1 - (int)s, a->world) : mod(who - (int)s, a->world);
    size_t cl = chunk_len(a, g, c);
    if (chunk)
        *chunk = c;
    *off = chunk_off(a, g, c) + split(cl, S, j);
    *len = split(cl, S, j + 1) - split(cl, S, j);
}

// The order in which a rank sends (and its right neighbour receives) the transfers
// t = s*S + j (step s, segment j): by key j + s*lag, ties by step. With lag L the
// wire carries step s's segments L ahead of step s+1's: for 2 ranks, reduce-scatter
// segments 0..L, then all-gather 0, reduce-scatter L+1, all-gather 1, ... so a segment
// goes back out while its reduction is still in cache, instead of after the whole
// reduce-scatter (which, for buffers beyond the caches, reads it again from memory).
// A transfer only ever waits for one with a smaller key, so the order cannot deadlock.
typedef struct wire_iter {
    size_t key, s, steps, S, lag;
} wire_iter;

static bool wire_next(wire_iter *w, size_t *t) {
    for (;;) {
        if (w->s == w->steps) {
            w->s = 0;
            w->key++;
        }
        if (w->steps == 0 || w->key >= w->S + (w->steps - 1) * w->lag)
            return false;
        size_t s = w->s++;
        if (w->key >= s * w->lag && w->key - s * w->lag < w->S) {
            *t = s * w->S + (w->key - s * w->lag);
            return true;
        }
    }
}

static dt_status ring_run(algo *a, const ring *g) {
    const int    P = a->world, r = a->rank, right = mod(r + 1, P), left = mod(r - 1, P);
    const size_t esz       = a->esz;
    size_t       max_chunk = 0;
    for (int c = 0; c < P; c++)
        if (chunk_len(a, g, c) > max_chunk)
            max_chunk = chunk_len(a, g, c);
    size_t seg_elems = a->cfg->segment_bytes / esz;
    if (seg_elems == 0)
        seg_elems = 1;
    const size_t S          = max_chunk ? (max_chunk + seg_elems - 1) / seg_elems : 1;
    const size_t R          = g->rs ? (size_t)(P - 1) * S : 0; // reduce-scatter transfers
    const size_t T          = R + (g->ag ? (size_t)(P - 1) * S : 0);
    const int    K          = a->cfg->slots;
    size_t       slot_bytes = ((max_chunk + S - 1) / S) * esz;
    if (grow(&a->cfg->slot_buf, &a->cfg->slot_cap, (size_t)K * slot_bytes + 1) != DT_OK ||
        grow((void **)&a->cfg->ready_buf, &a->cfg->ready_cap, T + 1) != DT_OK)
        return dt_op_fail(a->op, DT_ERR_NOMEM, "out of memory for ring slots");
    char    *slots = a->cfg->slot_buf;
    uint8_t *ready = a->cfg->ready_buf; // receive t done (and reduced)
    memset(ready, 0, T);
    dt_xfer *x;
    DT_TRY(xfers(a, 2 * T, &x));
    dt_xfer *sx = x, *rx = x + T;

    const wire_iter start = {.steps = T / S, .S = S, .lag = a->cfg->ring_lag};
    wire_iter       si = start, ri = start, di = start; // sends, receives posted, completed
    size_t          ts, tr, td;
    bool            more_s = wire_next(&si, &ts);
    size_t          posted = 0, done = 0, rs_posted = 0, rs_done = 0;
    while (done < T || more_s) {
        // Sends in wire order, as their data is ready: own data (t < S) or t-S received.
        while (more_s && (ts < S || ready[ts - S])) {
            size_t off, len;
            ring_seg(a, g, ts, R, S, r, NULL, &off, &len);
            const char *src;
            if (ts < R)
                src = ts < S ? g->mine + off * esz : g->out + off * esz;
            else if (ts - R < S) // first all-gather step: our own finished chunk
                src = (g->rs ? (g->final_rs ? g->final_rs + (off - chunk_off(a, g, r)) * esz
                                            : g->out + off * esz)
                             : g->ag_buf + off * esz);
            else
                src = g->ag_buf + off * esz;
            DT_TRY(post(a, &sx[ts], right, true, src, len * esz, DT_ALGO_RING, (uint32_t)ts));
            more_s = wire_next(&si, &ts);
        }
        // Receives in the same order, up to K ahead of completion; reduce-scatter ones
        // into rotating slots, all-gather ones straight into place.
        while (posted < T && posted < done + (size_t)K && wire_next(&ri, &tr)) {
            size_t off, len;
            ring_seg(a, g, tr, R, S, left, NULL, &off, &len);
            char *dst =
                tr < R ? slots + (rs_posted++ % (size_t)K) * slot_bytes : g->ag_buf + off * esz;
            DT_TRY(post(a, &rx[tr], left, false, dst, len * esz, DT_ALGO_RING, (uint32_t)tr));
            posted++;
        }
        if (done < T && wire_next(&di, &td)) {
            DT_TRY(wait(a, &rx[td]));
            if (td < R) {
                size_t off, len;
                ring_seg(a, g, td, R, S, left, NULL, &off, &len);
                const char *in  = slots + (rs_done++ % (size_t)K) * slot_bytes;
                bool        fin = td / S == (size_t)(P - 2); // last step: our own chunk
                char *dst = fin && g->final_rs ? g->final_rs + (off - chunk_off(a, g, r)) * esz
                                               : g->out + off * esz;
                // Partial from the left first, then ours: the fold order of the table.
                dt_reduce(a->op->dtype, a->op->op, dst, in, g->mine + off * esz, len);
            }
            ready[td] = 1;
            done++;
        }
    }
    for (size_t t = 0; t < T; t++)
        DT_TRY(wait(a, &sx[t]));
    return DT_OK;
}

// ---------------------------------------------------------------- recursive doubling
//
// all_reduce for small buffers, and the one in tree order (comm.h, DT_ORDER_TREE) at
// any size: over P' = the largest power of two <= P. Ranks r >= P' first hand their
// buffer to r - P', which folds it in (x_{r-P'} op x_r), and get the result back at the
// end; then lg(P') exchange steps between partners r ^ h for h = P'/2, ..., 1. Every
// exchange combines op(lower rank's block, higher rank's block), so both partners
// compute bitwise the same value, and the values meet in the fixed tree of
// DT_ORDER_TREE. P = 4:
//
//   after   rank 0            rank 1            rank 2            rank 3
//   h=2     x0+x2             x1+x3             x0+x2             x1+x3
//   h=1     (x0+x2)+(x1+x3) on every rank
//
// P = 5: rank 4 hands x4 to rank 0 (x0+x4), the four run the table above from there,
// and rank 0 hands the result back to rank 4. lg(P') + 2 steps of the whole buffer.
static dt_status rdouble_run(algo *a, void *buf, size_t count) {
    const int    P = a->world, r = a->rank;
    const size_t nbytes = count * a->esz;
    int          p2     = 1;
    while (p2 * 2 <= P)
        p2 *= 2;
    char *tmp;
    DT_TRY(part_buffer(a, nbytes, &tmp));
    dt_xfer  x[2];
    uint32_t step = 0;
    if (r >= p2) { // an extra rank: hand over, get the result back
        DT_TRY(post(a, &x[0], r - p2, true, buf, nbytes, DT_ALGO_RDOUBLE, step));
        DT_TRY(wait(a, &x[0]));
        DT_TRY(post(a, &x[1], r - p2, false, buf, nbytes, DT_ALGO_RDOUBLE, 1000));
        return wait(a, &x[1]);
    }
    if (r + p2 < P) {
        DT_TRY(post(a, &x[1], r + p2, false, tmp, nbytes, DT_ALGO_RDOUBLE, step));
        DT_TRY(wait(a, &x[1]));
        dt_reduce(a->op->dtype, a->op->op, buf, buf, tmp, count);
    }
    for (int h = p2 / 2; h >= 1; h /= 2) {
        step++;
        int peer = r ^ h;
        DT_TRY(post(a, &x[0], peer, true, buf, nbytes, DT_ALGO_RDOUBLE, step));
        DT_TRY(post(a, &x[1], peer, false, tmp, nbytes, DT_ALGO_RDOUBLE, step));
        DT_TRY(wait(a, &x[1]));
        DT_TRY(wait(a, &x[0])); // buf is read by the send: finish it before reducing
        if (peer < r)
            dt_reduce(a->op->dtype, a->op->op, buf, tmp, buf, count);
        else
            dt_reduce(a->op->dtype, a->op->op, buf, buf, tmp, count);
    }
    if (r + p2 < P) {
        DT_TRY(post(a, &x[0], r + p2, true, buf, nbytes, DT_ALGO_RDOUBLE, 1000));
        DT_TRY(wait(a, &x[0]));
    }
    return DT_OK;
}

// ----------------------------------------------------------------------- all_reduce

static dt_status all_reduce(algo *a, int id) {
    const dt_op *op     = a->op;
    size_t       nbytes = op->count * a->esz;
    if (id == DT_ALGO_RDOUBLE) {
        if (op->src != op->dst && nbytes)
            memcpy(op->dst, op->src, nbytes);
        return rdouble_run(a, op->dst, op->count);
    }
    ring g = {.rs     = true,
              .ag     = true,
              .count  = op->count,
              .mine   = op->src,
              .out    = op->dst,
              .ag_buf = op->dst};
    return ring_run(a, &g);
}

static dt_status reduce_scatter(algo *a) {
    const dt_op *op  = a->op;
    size_t       cpr = op->count, total = cpr * (size_t)a->world * a->esz;
    char        *part;
    DT_TRY(part_buffer(a, total, &part));
    ring g = {.rs          = true,
              .count       = cpr * (size_t)a->world,
              .chunk_fixed = cpr,
              .mine        = op->src,
              .out         = part,
              .final_rs    = op->dst};
    if (cpr == 0)
        g.chunk_fixed = 0, g.count = 0;
    // In place (dst = src + rank*cpr): our chunk of `mine` is read for the last time by
    // the reduction that writes final_rs, element by element, so the aliasing is safe.
    return ring_run(a, &g);
}

static dt_status all_gather(algo *a) {
    const dt_op *op  = a->op;
    size_t       one = op->count * a->esz;
    char        *dst = op->dst;
    if (one && op->src != dst + (size_t)a->rank * one)
        memcpy(dst + (size_t)a->rank * one, op->src, one);
    ring g = {
        .ag = true, .count = op->count * (size_t)a->world, .chunk_fixed = op->count, .ag_buf = dst};
    if (op->count == 0)
        g.chunk_fixed = 0, g.count = 0;
    return ring_run(a, &g);
}

// ------------------------------------------------------------------ broadcast, reduce
//
// Binomial tree rooted at `root` over virtual ranks vr = (r - root) mod P: a rank
// receives from vr - 2^k (k = its lowest set bit), then sends to vr + 2^j for the
// smaller j. lg(P) steps. P = 5: 0 -> 4; 0 -> 2, 4 idle; 0 -> 1, 2 -> 3.
static dt_status bcast_tree(algo *a, void *buf, size_t nbytes) {
    const int P = a->world, vr = mod(a->rank - a->op->root, P);
    dt_xfer   x;
    int       mask = 1;
    while (mask < P) {
        if (vr & mask) {
            int parent = mod(vr - mask + a->op->root, P);
            DT_TRY(post(a, &x, parent, false, buf, nbytes, DT_ALGO_TREE, 0));
            DT_TRY(wait(a, &x));
            break;
        }
        mask <<= 1;
    }
    dt_xfer kids[32];
    int     nk = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < P) {
            int child = mod(vr + mask + a->op->root, P);
            DT_TRY(post(a, &kids[nk++], child, true, buf, nbytes, DT_ALGO_TREE, 0));
        }
    for (int i = 0; i < nk; i++)
        DT_TRY(wait(a, &kids[i]));
    return DT_OK;
}

// Pipelined chain for large broadcasts: root -> root+1 -> ... -> root-1, segment by
// segment, so every link carries data at once; (P-1) + S - 1 segment times.
static dt_status bcast_chain(algo *a, char *buf, size_t count) {
    const int P = a->world, vr = mod(a->rank - a->op->root, P);
    const int next = mod(a->rank + 1, P), prev = mod(a->rank - 1, P);
    size_t    seg = a->cfg->segment_bytes / a->esz;
    if (seg == 0)
        seg = 1;
    size_t   S = count ? (count + seg - 1) / seg : 1;
    dt_xfer *x;
    DT_TRY(xfers(a, 2 * S, &x));
    dt_xfer *sx = x, *rx = x + S;
    bool     recv = vr != 0, send = vr != P - 1;
    size_t   nr = 0;
    for (size_t j = 0; j < S; j++) {
        size_t off = split(count, S, j), len = split(count, S, j + 1) - off;
        if (recv) {
            // Keep a few receives posted ahead so the stream never waits on us.
            while (nr < S && nr <= j + 4) {
                size_t o2 = split(count, S, nr), l2 = split(count, S, nr + 1) - o2;
                DT_TRY(post(a, &rx[nr], prev, false, buf + o2 * a->esz, l2 * a->esz, DT_ALGO_CHAIN,
                            (uint32_t)nr));
                nr++;
            }
            DT_TRY(wait(a, &rx[j]));
        }
        if (send)
            DT_TRY(post(a, &sx[j], next, true, buf + off * a->esz, len * a->esz, DT_ALGO_CHAIN,
                        (uint32_t)j));
    }
    if (send)
        for (size_t j = 0; j < S; j++)
            DT_TRY(wait(a, &sx[j]));
    return DT_OK;
}

static dt_status broadcast(algo *a, int id) {
    if (id == DT_ALGO_CHAIN)
        return bcast_chain(a, a->op->dst, a->op->count);
    return bcast_tree(a, a->op->dst, a->op->count * a->esz);
}

// Binomial-tree reduce (the broadcast tree run backwards): a rank folds in its
// children's partials from the nearest up, then sends to its parent. The partial of
// lower virtual ranks always comes first in the operation.
static dt_status reduce_tree(algo *a, char *acc, char *tmp) {
    const int    P = a->world, vr = mod(a->rank - a->op->root, P);
    const size_t count = a->op->count, nbytes = count * a->esz;
    dt_xfer      x;
    for (int mask = 1; mask < P; mask <<= 1) {
        if (vr & mask) {
            int parent = mod(vr - mask + a->op->root, P);
            DT_TRY(post(a, &x, parent, true, acc, nbytes, DT_ALGO_TREE, (uint32_t)mask));
            return wait(a, &x);
        }
        if (vr + mask < P) {
            int child = mod(vr + mask + a->op->root, P);
            DT_TRY(post(a, &x, child, false, tmp, nbytes, DT_ALGO_TREE, (uint32_t)mask));
            DT_TRY(wait(a, &x));
            dt_reduce(a->op->dtype, a->op->op, acc, acc, tmp, count);
        }
    }
    return DT_OK;
}

static dt_status reduce(algo *a, int id) {
    const dt_op *op = a->op;
    const int    P = a->world, r = a->rank, root = op->root;
    const size_t nbytes  = op->count * a->esz;
    bool         is_root = r == root;
    if (id == DT_ALGO_TREE) {
        // acc: root's dst, or scratch elsewhere; tmp: scratch after it.
        char *scratch;
        DT_TRY(part_buffer(a, 2 * nbytes, &scratch));
        char *acc = is_root ? op->dst : scratch, *tmp = scratch + nbytes;
        if (nbytes && acc != op->src)
            memcpy(acc, op->src, nbytes);
        return reduce_tree(a, acc, tmp);
    }
    // Large: ring reduce-scatter (root keeps its partials in dst), then every rank
    // sends its reduced chunk to the root.
    char *out = op->dst;
    if (!is_root)
        DT_TRY(part_buffer(a, nbytes, &out));
    ring g = {.rs = true, .count = op->count, .mine = op->src, .out = out};
    DT_TRY(ring_run(a, &g));
    dt_xfer *x;
    DT_TRY(xfers(a, (size_t)P, &x));
    if (!is_root) {
        size_t off = chunk_off(a, &g, r), len = chunk_len(a, &g, r);
        DT_TRY(post(a, &x[0], root, true, out + off * a->esz, len * a->esz, DT_ALGO_DIRECT, 0));
        return wait(a, &x[0]);
    }
    for (int q = 0; q < P; q++) {
        if (q == root)
            continue;
        size_t off = chunk_off(a, &g, q), len = chunk_len(a, &g, q);
        DT_TRY(post(a, &x[q], q, false, out + off * a->esz, len * a->esz, DT_ALGO_DIRECT, 0));
    }
    for (int q = 0; q < P; q++)
        if (q != root)
            DT_TRY(wait(a, &x[q]));
    return DT_OK;
}

// ------------------------------------------------------- gather, scatter, all_to_all

// Direct gather (to_root) or scatter: each rank's slice straight to or from the root,
// the root's own slice copied in place.
static dt_status direct(algo *a, bool to_root) {
    const dt_op *op = a->op;
    const int    P = a->world, r = a->rank, root = op->root;
    const size_t one = op->count * a->esz;
    dt_xfer     *x;
    DT_TRY(xfers(a, (size_t)P, &x));
    if (r != root) {
        DT_TRY(post(a, &x[0], root, to_root, to_root ? op->src : op->dst, one, DT_ALGO_DIRECT, 0));
        return wait(a, &x[0]);
    }
    for (int q = 0; q < P; q++) // into (gather) or from (scatter) the root's whole buffer
        if (q != root)
            DT_TRY(post(a, &x[q], q, !to_root,
                        (const char *)(to_root ? op->dst : op->src) + (size_t)q * one, one,
                        DT_ALGO_DIRECT, 0));
    char       *dst = (char *)op->dst + (to_root ? (size_t)r * one : 0);
    const char *src = (const char *)op->src + (to_root ? 0 : (size_t)r * one);
    if (one && dst != src) // the root's own slice
        memcpy(dst, src, one);
    for (int q = 0; q < P; q++)
        if (q != root)
            DT_TRY(wait(a, &x[q]));
    return DT_OK;
}

// Pairwise exchange: in step s a rank sends to r+s and receives from r-s; all steps
// are posted at once and the transport interleaves them.
static dt_status all_to_all(algo *a) {
    const dt_op *op = a->op;
    const int    P = a->world, r = a->rank;
    const size_t one = op->count * a->esz;
    const char  *src = op->src;
    char        *dst = op->dst;
    dt_xfer     *x;
    DT_TRY(xfers(a, 2 * (size_t)P, &x));
    for (int s = 1; s < P; s++) {
        int to = mod(r + s, P), from = mod(r - s, P);
        DT_TRY(post(a, &x[2 * s], from, false, dst + (size_t)from * one, one, DT_ALGO_PAIRWISE,
                    (uint32_t)s));
        DT_TRY(post(a, &x[2 * s + 1], to, true, src + (size_t)to * one, one, DT_ALGO_PAIRWISE,
                    (uint32_t)s));
    }
    if (one)
        memcpy(dst + (size_t)r * one, src + (size_t)r * one, one);
    for (int s = 1; s < P; s++) {
        DT_TRY(wait(a, &x[2 * s]));
        DT_TRY(wait(a, &x[2 * s + 1]));
    }
    return DT_OK;
}

// Dissemination barrier: in round k a rank signals r + 2^k and waits for r - 2^k;
// after ceil(lg P) rounds every rank has heard, indirectly, from every other.
static dt_status barrier(algo *a) {
    const int P = a->world, r = a->rank;
    dt_xfer   x[2];
    uint32_t  round = 0;
    for (int k = 1; k < P; k <<= 1, round++) {
        DT_TRY(post(a, &x[0], mod(r - k, P), false, NULL, 0, DT_ALGO_DISSEMINATION, round));
        DT_TRY(post(a, &x[1], mod(r + k, P), true, NULL, 0, DT_ALGO_DISSEMINATION, round));
        DT_TRY(wait(a, &x[0]));
        DT_TRY(wait(a, &x[1]));
    }
    return DT_OK;
}

static dt_status p2p(algo *a) {
    const dt_op *op = a->op;
    dt_xfer      x;
    size_t       nbytes = op->count * a->esz;
    if (op->kind == DT_COLL_SEND)
        DT_TRY(post(a, &x, op->peer, true, op->src, nbytes, DT_ALGO_DIRECT, 0));
    else
        DT_TRY(post(a, &x, op->peer, false, op->dst, nbytes, DT_ALGO_DIRECT, 0));
    return wait(a, &x);
}

dt_status dt_algo_p2p(const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op, int id) {
    algo a = {.t     = t,
              .op    = op,
              .cfg   = cfg,
              .rank  = t->rank,
              .world = t->world,
              .esz   = dt_dtype_size(op->dtype)};
    switch (op->kind) {
    case DT_COLL_ALL_REDUCE:
        return all_reduce(&a, id);
    case DT_COLL_BROADCAST:
        return broadcast(&a, id);
    case DT_COLL_REDUCE:
        return reduce(&a, id);
    case DT_COLL_ALL_GATHER:
        return all_gather(&a);
    case DT_COLL_REDUCE_SCATTER:
        return reduce_scatter(&a);
    case DT_COLL_GATHER:
        return direct(&a, true);
    case DT_COLL_SCATTER:
        return direct(&a, false);
    case DT_COLL_ALL_TO_ALL:
        return all_to_all(&a);
    case DT_COLL_BARRIER:
    case DT_COLL_INIT:
        return barrier(&a);
    case DT_COLL_SEND:
    case DT_COLL_RECV:
        return p2p(&a);
    default:
        return dt_op_fail(op, DT_ERR_INTERNAL, "unknown operation kind %d", (int)op->kind);
    }
}
