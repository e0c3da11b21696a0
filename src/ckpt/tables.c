// tables.c: the parameters and buffers of a checkpoint: their tables and floats as
// sections (written by state and model files), the checks of a file's tables against a
// dt_params, and the model files (dt_ckpt_save_params / dt_ckpt_load_params).
#include "ckpt_impl.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define PATH_CAP CK_PATH_CAP

// A tensor table (version 2 layout: with flags).
static void put_ptab(ck_buf *b, const dt_params *m, bool buffers) {
    int n = buffers ? dt_params_buffer_count(m) : dt_params_count(m);
    dt_ckpt_buf_u32(b, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        const dt_param_info *pi = buffers ? dt_params_buffer_info(m, i) : dt_params_info(m, i);
        dt_ckpt_buf_str(b, pi->name);
        dt_ckpt_buf_u32(b, (uint32_t)pi->ndim);
        for (int d = 0; d < pi->ndim; d++)
            dt_ckpt_buf_u64(b, (uint64_t)pi->shape[d]);
        dt_ckpt_buf_u64(b, pi->offset);
        dt_ckpt_buf_u64(b, pi->count);
        dt_ckpt_buf_u32(b, (uint32_t)pi->layer);
        dt_ckpt_buf_u32(b, pi->flags);
    }
}

void dt_ckpt_free_sections(ck_section *s, int n) {
    for (int i = 0; i < n; i++)
        dt_ckpt_buf_free(&s[i].head);
}

// Parameters and buffers (and their tables) as sections 0..3 of secs.
void dt_ckpt_model_sections(ck_section *secs, dt_params *m) {
    secs[0] = (ck_section){.tag = CK_TAG_PTAB};
    put_ptab(&secs[0].head, m, false);
    secs[1] = (ck_section){.tag = CK_TAG_PARM};
    dt_ckpt_buf_u64(&secs[1].head, dt_params_numel(m));
    secs[1].data     = dt_params_data(m);
    secs[1].data_len = dt_params_numel(m) * sizeof(float);
    secs[2]          = (ck_section){.tag = CK_TAG_BTAB};
    put_ptab(&secs[2].head, m, true);
    secs[3] = (ck_section){.tag = CK_TAG_BUFS};
    dt_ckpt_buf_u64(&secs[3].head, dt_params_buffer_numel(m));
    secs[3].data     = dt_params_buffers(m);
    secs[3].data_len = dt_params_buffer_numel(m) * sizeof(float);
}

// Parameters and buffers of a state or model file checked against the program's.
dt_status dt_ckpt_check_params(const ck_file *f, const dt_params *m, ck_parm *parm, ck_parm *bufs) {
    const ck_sec *ps, *pt;
    DT_TRY(dt_ckpt_need(f, CK_TAG_PARM, &ps));
    DT_TRY(dt_ckpt_decode_parm(f, ps, parm));
    DT_TRY(dt_ckpt_need(f, CK_TAG_PTAB, &pt));
    DT_TRY(dt_ckpt_check_ptab(f, pt, parm->count, m, false));
    if (parm->count != dt_params_numel(m))
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: model mismatch: expected %zu parameters (the "
                       "model's), found %llu",
                       f->name, dt_params_numel(m), (unsigned long long)parm->count);
    *bufs = (ck_parm){0};
    if (f->version < 2) { // no buffers in version 1
        if (dt_params_buffer_numel(m))
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: model mismatch: expected %d buffer tensors (the program's), "
                           "found none (a version-%u file has no buffers)",
                           f->name, dt_params_buffer_count(m), f->version);
        return DT_OK;
    }
    DT_TRY(dt_ckpt_need(f, CK_TAG_BUFS, &ps));
    DT_TRY(dt_ckpt_decode_parm(f, ps, bufs));
    DT_TRY(dt_ckpt_need(f, CK_TAG_BTAB, &pt));
    DT_TRY(dt_ckpt_check_ptab(f, pt, bufs->count, m, true));
    if (bufs->count != dt_params_buffer_numel(m))
        return dt_fail(DT_ERR_MISMATCH,
                       "%s: model mismatch: expected %zu buffer floats (the program's), found "
                       "%llu",
                       f->name, dt_params_buffer_numel(m), (unsigned long long)bufs->count);
    return DT_OK;
}

void dt_ckpt_copy_params(dt_params *m, const ck_parm *parm, const ck_parm *bufs) {
    if (parm->count)
        memcpy(dt_params_data(m), parm->floats, (size_t)parm->count * sizeof(float));
    if (bufs->count)
        memcpy(dt_params_buffers(m), bufs->floats, (size_t)bufs->count * sizeof(float));
}

// ------------------------------------------------------------------------ models

dt_status dt_ckpt_save_params(const char *path, dt_params *m) {
    if (!path || !m || !dt_params_ready(m))
        return dt_fail(DT_ERR_ARG,
                       "checkpoint: expected a path and parameters with storage (or a finalized "
                       "model)");
    ck_section secs[CK_MODEL_SECTIONS];
    dt_ckpt_model_sections(secs, m);
    ck_header h = {.kind = CK_KIND_MODEL, .step = 0, .world = 1, .rank = 0};
    dt_status s = dt_ckpt_write_file(path, &h, secs, CK_MODEL_SECTIONS, NULL, NULL);
    dt_ckpt_free_sections(secs, CK_MODEL_SECTIONS);
    return s;
}

dt_status dt_ckpt_save_model(const char *path, dt_model *m) {
    return dt_ckpt_save_params(path, m ? dt_model_as_params(m) : NULL);
}

dt_status dt_ckpt_load_model(const char *path, dt_model *m) {
    return dt_ckpt_load_params(path, m ? dt_model_as_params(m) : NULL);
}

dt_status dt_ckpt_load_params(const char *path, dt_params *m) {
    if (!path || !m || !dt_params_ready(m))
        return dt_fail(DT_ERR_ARG,
                       "checkpoint: expected a path and parameters with storage (or a finalized "
                       "model)");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dt_fail_errno(DT_ERR_IO, "checkpoint: cannot find %s", path);
    uint8_t  *buf = NULL, *mbuf = NULL;
    ck_file   f, mf;
    ck_parm   parm, bufs;
    char      p[PATH_CAP], cdir[PATH_CAP];
    dt_status s;
    if (S_ISDIR(sb.st_mode)) {
        // A checkpoint directory, or a directory of them (its newest complete one).
        DT_TRY(dt_ckpt_join(p, path, CK_MARKER_FILE));
        if (dt_ckpt_is_file(p)) {
            snprintf(cdir, sizeof cdir, "%s", path);
        } else {
            int64_t step;
            DT_TRY(dt_ckpt_latest(path, &step));
            if (step < 0)
                return dt_fail(DT_ERR_FORMAT,
                               "%s: expected a model file, a checkpoint directory or a directory "
                               "of checkpoints, found a directory without any complete checkpoint",
                               path);
            DT_TRY(dt_ckpt_path(path, step, cdir, sizeof cdir));
        }
        s = dt_ckpt_read_marker(cdir, -1, p, &mbuf, &mf);
        if (!s)
            s = dt_ckpt_read_member(cdir, CK_STATE_FILE, CK_KIND_STATE, &mf, mf.step, p, &buf, &f);
    } else {
        ck_reader r;
        s = dt_ckpt_open(path, &r, &f);
        if (!s && (s = dt_ckpt_expect_kind(&f, CK_KIND_MODEL, CK_KIND_STATE)))
            dt_ckpt_close(&r);
        if (!s)
            s = dt_ckpt_read_body(&r, &buf, &f);
        if (!s)
            s = dt_ckpt_check_file(&f);
    }
    if (!s)
        s = dt_ckpt_check_params(&f, m, &parm, &bufs);
    if (!s)
        dt_ckpt_copy_params(m, &parm, &bufs);
    dt_free(buf);
    dt_free(mbuf);
    return s;
}
