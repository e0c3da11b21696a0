// fuzz_ckpt.c: libFuzzer target for the checkpoint file reader over arbitrary bytes.
// Every input must either pass every check of dt_ckpt_verify_bytes or fail with a
// DT_ERR_FORMAT message naming the input; nothing may crash or read outside the input.
// Inputs that pass are then compared with a small model's parameter table and decoded
// section by section, the paths a load takes (DT_ERR_MISMATCH is then allowed).
// Fuzzing builds (DT_FUZZ) do not enforce checksums, so mutations reach the decoders.
#include "ckpt/ckpt_impl.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dt_model *model(void) {
    static dt_model *m;
    if (!m) {
        // The seed corpus was written from this model: 8 inputs, linear(3).
        dt_model_new(&m, 8, 1, 1);
        if (!m || dt_model_add_linear(m, 3) || dt_model_finalize(m, 1))
            abort();
    }
    return m;
}

static bool named_fuzz(void) {
    return strncmp(dt_last_error(), "fuzz: ", 6) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_status st = dt_ckpt_verify_bytes(data, size, "fuzz");
    if (st != DT_OK) {
        if (st != DT_ERR_FORMAT || !named_fuzz())
            abort();
        return 0;
    }
    ck_file f;
    if (dt_ckpt_parse(data, size, "fuzz", &f) != DT_OK)
        abort(); // verified above: parsing again cannot fail
    const ck_sec *s;
    ck_parm       parm;
    if ((s = dt_ckpt_find(&f, CK_TAG_PARM)) && dt_ckpt_decode_parm(&f, s, &parm) == DT_OK) {
        volatile uint8_t sum = 0; // touch every float byte
        for (uint64_t i = 0; i < parm.count * 4; i++)
            sum ^= parm.floats[i];
        (void)sum;
        if ((s = dt_ckpt_find(&f, CK_TAG_PTAB))) {
            st = dt_ckpt_check_ptab(&f, s, parm.count, dt_model_as_params(model()), false);
            if (st != DT_OK && st != DT_ERR_MISMATCH && st != DT_ERR_FORMAT)
                abort();
        }
    }
    // Version 2: the buffers and their table, checked against the model's (empty) one.
    if ((s = dt_ckpt_find(&f, CK_TAG_BUFS)) && dt_ckpt_decode_parm(&f, s, &parm) == DT_OK &&
        (s = dt_ckpt_find(&f, CK_TAG_BTAB))) {
        st = dt_ckpt_check_ptab(&f, s, parm.count, dt_model_as_params(model()), true);
        if (st != DT_OK && st != DT_ERR_MISMATCH && st != DT_ERR_FORMAT)
            abort();
    }
    if ((s = dt_ckpt_find(&f, CK_TAG_KVAL))) {
        dt_ckpt_kv *kv;
        int         n;
        if (dt_ckpt_decode_kval(&f, s, &kv, &n) != DT_OK)
            abort();
        for (int i = 0; i < n; i++)
            if (strlen(kv[i].key) < 1 || strlen(kv[i].key) > DT_CKPT_NAME_MAX)
                abort();
        dt_free(kv);
    }
    if ((s = dt_ckpt_find(&f, CK_TAG_RNGS))) {
        dt_rng g;
        bool   found;
        if (dt_ckpt_check_rngs(&f, s, "dropout", &g, &found) != DT_OK)
            abort();
    }
    if ((s = dt_ckpt_find(&f, CK_TAG_MANI))) {
        char     name[DT_CKPT_NAME_MAX + 1];
        uint64_t sz;
        uint32_t crc;
        for (uint32_t i = 0; dt_ckpt_mani_entry(s, i, name, &sz, &crc); i++)
            if (strchr(name, '/'))
                abort();
    }
    return 0;
}
