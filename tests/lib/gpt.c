// gpt.c: dtrain-gpt's tiny model (gpt.h).
#include "gpt.h"

#include "dtrain/ckpt.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

dt_params *gpt_tiny_table(void) {
    dt_params *p = NULL;
    if (dt_params_new(&p, NULL) != DT_OK)
        return NULL;
    static const struct {
        const char *n;
        int64_t     d0, d1;
    } t[]        = {{"wte.weight", 256, 32},
                    {"wpe.weight", 32, 32},
                    {"h.0.ln_1.weight", 32, 0},
                    {"h.0.ln_1.bias", 32, 0},
                    {"h.0.attn.c_attn.weight", 96, 32},
                    {"h.0.attn.c_attn.bias", 96, 0},
                    {"h.0.attn.c_proj.weight", 32, 32},
                    {"h.0.attn.c_proj.bias", 32, 0},
                    {"h.0.ln_2.weight", 32, 0},
                    {"h.0.ln_2.bias", 32, 0},
                    {"h.0.mlp.c_fc.weight", 128, 32},
                    {"h.0.mlp.c_fc.bias", 128, 0},
                    {"h.0.mlp.c_proj.weight", 32, 128},
                    {"h.0.mlp.c_proj.bias", 32, 0},
                    {"ln_f.weight", 32, 0},
                    {"ln_f.bias", 32, 0}};
    dt_status st = DT_OK;
    for (size_t i = 0; st == DT_OK && i < sizeof t / sizeof *t; i++) {
        int64_t d[2] = {t[i].d0, t[i].d1};
        st           = dt_params_add(p, t[i].n, t[i].d1 ? 2 : 1, d, 0);
    }
    if (st == DT_OK)
        st = dt_params_alloc(p);
    if (st != DT_OK) {
        dt_params_free(p);
        return NULL;
    }
    return p;
}

bool gpt_tiny_diff(const char *a, const char *b, double *maxd, double *moved) {
    dt_params *pa = gpt_tiny_table(), *pb = gpt_tiny_table();
    bool       ok =
        pa && pb && dt_ckpt_load_params(a, pa) == DT_OK && dt_ckpt_load_params(b, pb) == DT_OK;
    *maxd = 0, *moved = 0;
    for (size_t i = 0; ok && i < dt_params_numel(pa); i++) {
        *maxd = fmax(*maxd, fabs((double)dt_params_data(pa)[i] - dt_params_data(pb)[i]));
        *moved += fabs((double)dt_params_data(pa)[i]);
    }
    dt_params_free(pa);
    dt_params_free(pb);
    return ok;
}

bool gpt_write_corpus(const char *path, double *unigram) {
    static const char *w[] = {"the",   "quick", "brown", "fox",    "jumps", "over", "lazy",
                              "dog",   "and",   "cat",   "sleeps", "under", "warm", "sun",
                              "while", "birds", "sing",  "songs",  "of",    "old"};
    enum { N = 40000 };
    char    *s = malloc(N + 64);
    size_t   n = 0;
    uint64_t x = 12345;
    if (!s)
        return false;
    while (n < N) {
        x      = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int nw = 4 + (int)((x >> 33) % 6);
        for (int i = 0; i < nw && n < N; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            n += (size_t)snprintf(s + n, 64, "%s%s", i ? " " : "", w[(x >> 33) % 20]);
        }
        n += (size_t)snprintf(s + n, 64, ".\n");
    }
    FILE *f  = fopen(path, "wb");
    bool  ok = f && fwrite(s, 1, N, f) == N;
    if (f)
        ok &= fclose(f) == 0;
    double count[256] = {0}, h = 0, ntr = 9 * N / 10;
    for (int i = 0; i < 9 * N / 10; i++)
        count[(unsigned char)s[i]]++;
    for (int c = 0; c < 256; c++)
        if (count[c] > 0)
            h -= count[c] / ntr * log(count[c] / ntr);
    if (unigram)
        *unigram = h;
    free(s);
    return ok;
}
