// shard.c: whole optimizer state from the shards of a sharded optimizer (ZeRO, zero.h)
// and back. Checkpoints hold the whole state, as DDP's do, so they load at any world
// size: saving gathers every rank's shard to rank 0, which places each piece at its
// offset in the whole table; loading copies this rank's pieces out of the whole state.
#include "ckpt_impl.h"

#include <string.h>

// Floats per state block of o (its numel: the shard's when sharded) and the blocks.
static void blocks_of(dt_optim *o, size_t *ns, size_t *nblocks) {
    size_t nf = 0;
    dt_optim_state(o, &nf);
    *ns      = dt_optim_num_params(o);
    *nblocks = *ns ? nf / *ns : 0;
}

dt_status dt_ckpt_gather_optim(dt_pg *pg, dt_optim *o, float **full, size_t *nfull) {
    *full = NULL, *nfull = 0;
    size_t        full_n, ns, nblocks;
    const size_t *flat_off;
    dt_optim_sharded(o, &full_n, &flat_off);
    blocks_of(o, &ns, &nblocks);
    dt_params *sh = dt_optim_params(o);
    int        k = dt_params_count(sh), world = pg ? dt_pg_size(pg) : 1;
    int        rank = pg ? dt_pg_rank(pg) : 0;
    // Every rank's shard size, pieces and blocks, so all can pad to the largest.
    int64_t   mine[3] = {(int64_t)ns, k, (int64_t)nblocks};
    int64_t  *hdr     = dt_alloc(sizeof(int64_t) * 3 * (size_t)world);
    int64_t  *tab = NULL, *tabs = NULL;
    float    *pad = NULL, *pads = NULL;
    dt_status s = hdr ? DT_OK : DT_ERR_NOMEM;
    if (!s)
        s = pg ? dt_pg_all_gather(pg, mine, hdr, 3, DT_INT64) : (memcpy(hdr, mine, sizeof mine), 0);
    size_t maxns = 0, maxk = 0, nb = nblocks;
    for (int r = 0; !s && r < world; r++) {
        maxns = (size_t)hdr[3 * r] > maxns ? (size_t)hdr[3 * r] : maxns;
        maxk  = (size_t)hdr[3 * r + 1] > maxk ? (size_t)hdr[3 * r + 1] : maxk;
        if ((size_t)hdr[3 * r + 2] != nb && hdr[3 * r])
            s = dt_fail(DT_ERR_MISMATCH,
                        "checkpoint: expected optimizer state of %zu blocks on every rank, found "
                        "%lld on rank %d",
                        nb, (long long)hdr[3 * r + 2], r);
    }
    if (!s) {
        tab        = dt_alloc_zero(sizeof(int64_t) * 2 * (maxk ? maxk : 1));
        size_t per = nb * maxns > 0 ? nb * maxns : 1;
        pad        = dt_alloc_zero(sizeof(float) * per);
        tabs = rank == 0 ? dt_alloc(sizeof(int64_t) * 2 * (maxk ? maxk : 1) * (size_t)world) : NULL;
        pads = rank == 0 ? dt_alloc(sizeof(float) * per * (size_t)world) : NULL;
        if (!tab || !pad || (rank == 0 && (!tabs || !pads)))
            s = DT_ERR_NOMEM;
    }
    if (!s) {
        float *state = dt_optim_state(o, NULL);
        for (int i = 0; i < k; i++) {
            tab[2 * i]     = (int64_t)flat_off[i];
            tab[2 * i + 1] = (int64_t)dt_params_info(sh, i)->count;
        }
        for (size_t b = 0; b < nb && ns; b++)
            memcpy(pad + b * maxns, state + b * ns, ns * sizeof(float));
        if (pg) {
            s = dt_pg_gather(pg, tab, tabs, 2 * maxk, DT_INT64, 0);
            if (!s)
                s = dt_pg_gather(pg, pad, pads, nb * maxns, DT_FLOAT32, 0);
        } else {
            memcpy(tabs, tab, sizeof(int64_t) * 2 * maxk);
            memcpy(pads, pad, sizeof(float) * nb * maxns);
        }
    }
    if (!s && rank == 0) {
        *nfull = nb * full_n;
        *full  = dt_alloc_zero(sizeof(float) * (*nfull ? *nfull : 1));
        if (!*full)
            s = DT_ERR_NOMEM;
        for (int r = 0; !s && r < world; r++) {
            const int64_t *t    = tabs + 2 * maxk * (size_t)r;
            const float   *st   = pads + nb * maxns * (size_t)r;
            size_t         soff = 0;
            for (int64_t i = 0; i < hdr[3 * r + 1]; i++) {
                size_t off = (size_t)t[2 * i], cnt = (size_t)t[2 * i + 1];
                if (off + cnt > full_n || soff + cnt > (size_t)hdr[3 * r]) {
                    s = dt_fail(DT_ERR_STATE,
                                "checkpoint: rank %d's optimizer shard piece %lld [%zu, +%zu) "
                                "lies outside the %zu parameters",
                                r, (long long)i, off, cnt, full_n);
                    break;
                }
                for (size_t b = 0; b < nb; b++)
                    memcpy(*full + b * full_n + off, st + b * maxns + soff, cnt * sizeof(float));
                soff += cnt;
            }
        }
        if (s) {
            dt_free(*full);
            *full = NULL, *nfull = 0;
        }
    }
    dt_free(hdr), dt_free(tab), dt_free(pad), dt_free(tabs), dt_free(pads);
    return s;
}

void dt_ckpt_scatter_optim(dt_optim *o, const uint8_t *full) {
    size_t        full_n, ns, nblocks;
    const size_t *flat_off;
    dt_optim_sharded(o, &full_n, &flat_off);
    blocks_of(o, &ns, &nblocks);
    dt_params *sh    = dt_optim_params(o);
    float     *state = dt_optim_state(o, NULL);
    for (int i = 0; i < dt_params_count(sh); i++) {
        const dt_param_info *pi = dt_params_info(sh, i);
        for (size_t b = 0; b < nblocks; b++)
            memcpy(state + b * ns + pi->offset, full + (b * full_n + flat_off[i]) * sizeof(float),
                   pi->count * sizeof(float));
    }
}
