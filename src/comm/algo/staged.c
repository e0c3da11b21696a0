// staged.c: the shared-memory family of the algorithm layer (algo.h): collectives over
// shm's segment (shm/shm.h), where every rank stages its data in working buffers that
// the others read directly, with one synchronisation per chunk of the engine's step
// counters (shm_impl.h: "rank r has passed step t"). The segment is a transport like
// the transfer slots are; the table in table.c picks these where a group has one.
// docs/shm.md describes the algorithms with their step tables.
//
// Reductions combine ranks in rank order 0, 1, 2, ... whatever the arrival order (or in
// the tree order of an all_reduce that asks for it: dt_reduce_n), so every rank gets the
// same bits, from run to run.
#include "comm/algo/algo.h"
#include "comm/reduce.h"
#include "comm/shm/shm_impl.h"

#include <string.h>

// ---------------------------------------------------------------------- all_reduce

// Small buffers: one synchronisation. Every rank stages its whole input, waits for
// all, and reduces the whole buffer from the world staged copies itself (its own
// from src), in rank order, so every rank computes the same bits.
static dt_status all_reduce_small(shm_op *o, const unsigned char *src, unsigned char *dst,
                                  size_t count, size_t es, int root) {
    dt_shm      *s    = o->s;
    const dt_op *op   = o->op;
    uint32_t     base = s->step;
    uint64_t     b    = s->next_buf;
    DT_TRY(dt_shm_acquire_buf(o, b));
    memcpy(buf_of(s, s->rank, b), src, count * es);
    DT_TRY(dt_shm_arrive(o, base));
    if (root < 0 || root == s->rank) {
        for (int r = 0; r < s->world; r++)
            s->in[r] = r == s->rank ? (const void *)src : (const void *)buf_of(s, r, b);
        dt_reduce_n(dst, NULL, false, s->in, s->world, count, op->dtype, op->op,
                    (dt_reduce_order)op->fp.order);
    }
    set_step(s, base + 2);
    s->free_step[b % NBUF] = base + 2;
    s->next_buf++;
    return DT_OK;
}

// Large buffers: chunks of `chunk` bytes stream through the NBUF (3) buffers of every
// rank. Chunk k is cut into world slices; slice r is rank r's share. Staging chunk k
// means copying every slice but one's own into one's buffer k % 3. Then, with one
// synchronisation per chunk (step base+1+k: "staged chunk k, reduced chunk k-1"):
//
//   step        every rank r does, between waiting for all at the step and raising it
//   base+1      stage 0 (and publish the fingerprint)
//   base+2      reduce slice r of chunk 0 (own part from src) -> dst and buffer; stage 1
//   base+2+k    reduce slice r of chunk k; gather chunk k-1 (others' reduced slices
//               from their buffers -> dst); stage chunk k+1
//   base+2+n    gather chunk n-1
//
// Staging chunk k+1 reuses the buffer of chunk k-2, whose last readers (the gathers
// of step base+1+k) are done once everyone passed base+1+k: the wait that opens the
// step. Each byte of src is read once and each byte of dst written once.
static dt_status all_reduce_large(shm_op *o, const unsigned char *src, unsigned char *dst,
                                  size_t count, size_t es, int root, bool *used_nt) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    int          me = s->rank, world = s->world;
    size_t       ce      = s->chunk / es; // elements per chunk
    size_t       nchunks = div_up(count, ce);
    size_t       align   = 64 / es;
    uint32_t     base    = s->step;
    bool         want    = root < 0 || root == me;
    bool         nt      = want && count * es >= s->nt_bytes;
    *used_nt             = nt;
    const void **in      = s->in;
    dt_status    st      = DT_OK;

#define CHUNK_LEN(k) min_sz(ce, count - (size_t)(k)*ce)
#define SLICE(n)     (div_up(div_up((n), (size_t)world), align) * align)
#define STAGE(k)                                                                                   \
    do {                                                                                           \
        size_t               n_ = CHUNK_LEN(k), sl_ = SLICE(n_);                                   \
        size_t               lo_ = min_sz(n_, (size_t)me * sl_);                                   \
        size_t               hi_ = min_sz(n_, lo_ + sl_);                                          \
        uint64_t             b_  = s->next_buf + (uint64_t)(k);                                    \
        const unsigned char *p_  = src + (size_t)(k)*ce * es;                                      \
        unsigned char       *q_  = buf_of(s, me, b_);                                              \
        if ((st = dt_shm_acquire_buf(o, b_)))                                                      \
            goto out;                                                                              \
        memcpy(q_, p_, lo_ *es);                                                                   \
        memcpy(q_ + hi_ * es, p_ + hi_ * es, (n_ - hi_) * es);                                     \
    } while (0)

    STAGE(0);
    if ((st = dt_shm_arrive(o, base)))
        goto out;
    for (size_t k = 0; k <= nchunks; k++) {
        uint32_t at = base + 1 + (uint32_t)k; // everyone staged k and reduced k-1
        if (k > 0 && (st = dt_shm_wait_all(o, at)))
            goto out;
        if (k < nchunks) {
            size_t   n = CHUNK_LEN(k), sl = SLICE(n);
            size_t   lo = min_sz(n, (size_t)me * sl), hi = min_sz(n, lo + sl);
            uint64_t b   = s->next_buf + (uint64_t)k;
            size_t   off = k * ce * es;
            if (hi > lo) {
                for (int r = 0; r < world; r++)
                    in[r] = r == me ? (const void *)(src + off + lo * es)
                                    : (const void *)(buf_of(s, r, b) + lo * es);
                dt_reduce_n(buf_of(s, me, b) + lo * es, want ? dst + off + lo * es : NULL, nt, in,
                            world, hi - lo, op->dtype, op->op, (dt_reduce_order)op->fp.order);
            }
        }
        if (k > 0 && want) {
            size_t   n = CHUNK_LEN(k - 1), sl = SLICE(n);
            uint64_t b   = s->next_buf + (uint64_t)(k - 1);
            size_t   off = (k - 1) * ce * es;
            for (int r = 0; r < world; r++) {
                size_t rlo = min_sz(n, (size_t)r * sl), rhi = min_sz(n, rlo + sl);
                if (r != me && rhi > rlo)
                    dt_copy_nt(dst + off + rlo * es, buf_of(s, r, b) + rlo * es, (rhi - rlo) * es,
                               nt);
            }
        }
        if (k > 0) // chunk k-1 is read by all once they pass this step
            s->free_step[(s->next_buf + k - 1) % NBUF] = at + 1;
        if (k + 1 < nchunks)
            STAGE(k + 1);
        set_step(s, at + 1);
    }
    s->next_buf += nchunks;
out:
    return st;
#undef STAGE
#undef SLICE
#undef CHUNK_LEN
}

// -------------------------------------------------------------- one-to-all, all-to-one

// broadcast and scatter: root stages piece k, the others copy it out. Piece k is
// ready at root's step base+1+k (base+1 is the arrival), and rank r has read it once
// r passes base+2+k. Broadcast pieces are whole buffers; scatter cuts root's buffer
// into world slots, slot r carrying piece k of block r.
static dt_status fan_out(shm_op *o, const unsigned char *src, unsigned char *dst, size_t nbytes,
                         int root, bool scatter) {
    dt_shm  *s  = o->s;
    int      me = s->rank, world = s->world;
    size_t   piece = scatter ? slot_bytes(s) : s->chunk;
    size_t   n     = div_up(nbytes, piece);
    uint32_t base  = s->step;
    bool     nt    = nbytes >= s->nt_bytes;
    int      nslot = scatter ? world : 1;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k)*piece)
#define STAGE(k)                                                                                   \
    do {                                                                                           \
        uint64_t b_ = s->next_buf + (uint64_t)(k);                                                 \
        DT_TRY(dt_shm_acquire_buf(o, b_));                                                         \
        for (int r_ = 0; r_ < nslot; r_++)                                                         \
            if (!scatter || r_ != me)                                                              \
                memcpy(buf_of(s, me, b_) + (size_t)r_ * piece,                                     \
                       src + (size_t)r_ * nbytes + (size_t)(k)*piece, PIECE(k));                   \
    } while (0)
    if (me == root) {
        if (n > 0)
            STAGE(0);
        if (scatter)
            dt_copy_nt(dst, src + (size_t)me * nbytes, nbytes, false);
    }
    DT_TRY(dt_shm_arrive(o, base));
    for (size_t k = 0; k < n; k++) {
        uint64_t b = s->next_buf + (uint64_t)(k);
        if (me == root) {
            s->free_step[b % NBUF] = base + 2 + (uint32_t)k;
            if (k + 1 < n)
                STAGE(k + 1);
        } else {
            if (k > 0)
                DT_TRY(dt_shm_wait_step(o, root, base + 1 + (uint32_t)k));
            dt_copy_nt(dst + k * piece, buf_of(s, root, b) + (scatter ? (size_t)me * piece : 0),
                       PIECE(k), nt);
        }
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += n;
    if (nt)
        dt_store_fence();
    return DT_OK;
#undef STAGE
#undef PIECE
}

// gather (root reads) and all_gather (everyone reads): rank r stages piece k of its
// block, ready at r's step base+1+k; readers pass base+2+k after copying it.
static dt_status fan_in(shm_op *o, const unsigned char *src, unsigned char *dst, size_t nbytes,
                        int root) {
    dt_shm  *s  = o->s;
    int      me = s->rank, world = s->world;
    size_t   piece = s->chunk;
    size_t   n     = div_up(nbytes, piece);
    uint32_t base  = s->step;
    bool     reads = root < 0 || root == me;
    bool     stage = root < 0 || root != me;
    bool     nt    = reads && nbytes * (size_t)world >= s->nt_bytes;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k)*piece)
    if (stage && n > 0) {
        DT_TRY(dt_shm_acquire_buf(o, s->next_buf));
        memcpy(buf_of(s, me, s->next_buf), src, PIECE(0));
    }
    if (reads && dst + (size_t)me * nbytes != src)
        memcpy(dst + (size_t)me * nbytes, src, nbytes);
    DT_TRY(dt_shm_arrive(o, base));
    for (size_t k = 0; k < n; k++) {
        uint64_t b = s->next_buf + (uint64_t)(k);
        if (reads) {
            if (k > 0)
                DT_TRY(dt_shm_wait_all(o, base + 1 + (uint32_t)k));
            for (int r = 0; r < world; r++)
                if (r != me)
                    dt_copy_nt(dst + (size_t)r * nbytes + k * piece, buf_of(s, r, b), PIECE(k), nt);
        }
        if (stage) {
            s->free_step[b % NBUF] = base + 2 + (uint32_t)k;
            if (k + 1 < n) {
                DT_TRY(dt_shm_acquire_buf(o, b + 1));
                memcpy(buf_of(s, me, b + 1), src + (k + 1) * piece, PIECE(k + 1));
            }
        }
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += n;
    if (nt)
        dt_store_fence();
    return DT_OK;
#undef PIECE
}

// reduce_scatter and all_to_all: every rank stages piece k of each block j != r in
// slot j of its buffer; rank r then takes slot r of every buffer (reducing them with
// its own block from src, or copying each to its place in dst). One synchronisation
// per piece: the next pieces are staged right after this one is taken.
static dt_status exchange(shm_op *o, const unsigned char *src, unsigned char *dst, bool reduce) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    int          me = s->rank, world = s->world;
    size_t       es     = dt_dtype_size(op->dtype);
    size_t       nbytes = op->count * es;
    size_t       piece  = slot_bytes(s);
    size_t       n      = div_up(nbytes, piece);
    uint32_t     base   = s->step;
    bool         nt     = nbytes * (reduce ? 1 : (size_t)world) >= s->nt_bytes;
    const void **in     = s->in;
    dt_status    st     = DT_OK;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k)*piece)
#define STAGE(k)                                                                                   \
    do {                                                                                           \
        uint64_t b_ = s->next_buf + (uint64_t)(k);                                                 \
        if ((st = dt_shm_acquire_buf(o, b_)))                                                      \
            goto out;                                                                              \
        for (int r_ = 0; r_ < world; r_++)                                                         \
            if (r_ != me)                                                                          \
                memcpy(buf_of(s, me, b_) + (size_t)r_ * piece,                                     \
                       src + (size_t)r_ * nbytes + (size_t)(k)*piece, PIECE(k));                   \
    } while (0)

    if (n > 0)
        STAGE(0);
    // all_to_all keeps its own block (in place, it is already where it belongs).
    if (!reduce)
        dt_copy_nt(dst + (size_t)me * nbytes, src + (size_t)me * nbytes, nbytes, false);
    if ((st = dt_shm_arrive(o, base)))
        goto out;
    for (size_t k = 0; k < n; k++) {
        uint64_t b   = s->next_buf + (uint64_t)(k);
        size_t   off = k * piece;
        if (k > 0 && (st = dt_shm_wait_all(o, base + 1 + (uint32_t)k)))
            goto out;
        if (reduce) {
            for (int r = 0; r < world; r++)
                in[r] = r == me ? (const void *)(src + (size_t)me * nbytes + off)
                                : (const void *)(buf_of(s, r, b) + (size_t)me * piece);
            dt_reduce_n(dst + off, NULL, false, in, world, PIECE(k) / es, op->dtype, op->op,
                        DT_ORDER_ANY);
        } else {
            for (int r = 0; r < world; r++)
                if (r != me)
                    dt_copy_nt(dst + (size_t)r * nbytes + off, buf_of(s, r, b) + (size_t)me * piece,
                               PIECE(k), nt);
        }
        s->free_step[b % NBUF] = base + 2 + (uint32_t)k;
        if (k + 1 < n)
            STAGE(k + 1);
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += n;
out:
    if (nt)
        dt_store_fence();
    return st;
#undef STAGE
#undef PIECE
}

// ------------------------------------------------------------------------ dispatch

// The small all_reduce has every rank read all `world` staged copies: keep what it reads
// near 2 * small_bytes (the measured 2-rank crossover) whatever the world; and the whole
// buffer must fit one working buffer.
bool dt_algo_staged_flat_fits(const dt_shm *s, const dt_op *op) {
    size_t nbytes = op->count * dt_dtype_size(op->dtype);
    return nbytes * (size_t)s->world <= 2 * s->small && nbytes <= s->chunk;
}

static dt_status all_reduce(shm_op *o, int root, dt_staged_id id) {
    const dt_op *op = o->op;
    size_t       es = dt_dtype_size(op->dtype);
    bool         nt = false;
    dt_status    st;
    if (id == DT_STAGED_FLAT && dt_algo_staged_flat_fits(o->s, op))
        st = all_reduce_small(o, op->src, op->dst, op->count, es, root);
    else
        st = all_reduce_large(o, op->src, op->dst, op->count, es, root, &nt);
    if (nt)
        dt_store_fence(); // the results are read by whichever thread gets them
    return st;
}

dt_status dt_algo_staged(dt_shm *s, const dt_op *op, dt_staged_id id) {
    shm_op o;
    DT_TRY(dt_shm_begin(s, &o, op));
    size_t es = dt_dtype_size(op->dtype);
    switch (op->kind) {
    case DT_COLL_ALL_REDUCE:
        return all_reduce(&o, -1, id);
    case DT_COLL_REDUCE:
        return all_reduce(&o, op->root, id);
    case DT_COLL_BROADCAST:
        return fan_out(&o, op->dst, op->dst, op->count * es, op->root, false);
    case DT_COLL_SCATTER:
        return fan_out(&o, op->src, op->dst, op->count * es, op->root, true);
    case DT_COLL_GATHER:
        return fan_in(&o, op->src, op->dst, op->count * es, op->root);
    case DT_COLL_ALL_GATHER:
        return fan_in(&o, op->src, op->dst, op->count * es, -1);
    case DT_COLL_REDUCE_SCATTER:
        return exchange(&o, op->src, op->dst, true);
    case DT_COLL_ALL_TO_ALL:
        return exchange(&o, op->src, op->dst, false);
    case DT_COLL_BARRIER:
    case DT_COLL_INIT:
        return dt_shm_arrive(&o, s->step);
    case DT_COLL_SEND:
        return dt_shm_send(&o);
    case DT_COLL_RECV:
        return dt_shm_recv(&o);
    default:
        return dt_fail(DT_ERR_ARG, "%s: unknown operation kind %d", op->name, (int)op->kind);
    }
}
