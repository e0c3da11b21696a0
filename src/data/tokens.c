// tokens.c: token streams for language models (uint8 or uint16 files, llm.c's header),
// their fixed-length windows, batches drawn as PyTorch draws them, and the byte corpus
// of the PyTorch peers (a directory's dot-less files, concatenated).
#include "data_impl.h"
#include "dtrain/rng.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LLMC_MAGIC        20240520
#define LLMC_HEADER_BYTES 1024

static dt_status check_width(int width, const char *who) {
    if (width != 1 && width != 2)
        return dt_fail(DT_ERR_ARG, "%s: expected a token width of 1 or 2 bytes, found %d", who,
                       width);
    return DT_OK;
}

// Reads exactly n bytes of an open file into dst, adding them to h (unless NULL).
static dt_status read_exact(FILE *f, void *dst, size_t n, const char *path, dt_data_hash *h) {
    size_t got = h ? dt_data_read_hashed(dst, n, f, h) : fread(dst, 1, n, f);
    if (got == n)
        return DT_OK;
    if (ferror(f))
        return dt_fail_errno(DT_ERR_IO, "%s: read failed", path);
    return dt_fail(DT_ERR_IO, "%s: expected %zu bytes, found %zu (did the file shrink?)", path, n,
                   got);
}

dt_status dt_tokens_read(const char *path, int width, dt_tokens *out) {
    memset(out, 0, sizeof *out);
    DT_TRY(check_width(width, path));
    FILE    *f;
    uint64_t fsize;
    DT_TRY(dt_open_regular(path, &f, &fsize));
    dt_status st   = DT_OK;
    uint8_t  *buf  = NULL;
    size_t    size = (size_t)fsize, skip = 0;
    if (width == 2 && size >= LLMC_HEADER_BYTES) {
        int32_t h[3];
        if ((st = read_exact(f, h, sizeof h, path, NULL)) != DT_OK)
            goto done;
        if (h[0] == LLMC_MAGIC) {
            if (h[1] != 1) {
                st = dt_fail(DT_ERR_FORMAT,
                             "%s: expected llm.c token file version 1 (uint16 tokens), found %d",
                             path, h[1]);
                goto done;
            }
            if (h[2] < 0 || (uint64_t)h[2] * 2 != size - LLMC_HEADER_BYTES) {
                st = dt_fail(DT_ERR_FORMAT,
                             "%s: llm.c header: expected a token count of %zu (the file's size), "
                             "found %d",
                             path, (size - LLMC_HEADER_BYTES) / 2, h[2]);
                goto done;
            }
            skip = LLMC_HEADER_BYTES;
        }
        if (fseek(f, (long)skip, SEEK_SET) != 0) {
            st = dt_fail_errno(DT_ERR_IO, "%s: seek failed", path);
            goto done;
        }
    }
    size -= skip;
    if (size % (size_t)width) {
        st = dt_fail(DT_ERR_FORMAT,
                     "%s: expected a whole number of %d-byte tokens, found %zu bytes of data", path,
                     width, size);
        goto done;
    }
    buf = dt_alloc(size);
    if (!buf) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    dt_data_hash hash;
    dt_data_hash_init(&hash);
    st = read_exact(f, buf, size, path, &hash);
    if (st == DT_OK) {
        out->data  = buf;
        out->owned = buf;
        out->n     = size / (size_t)width;
        out->width = width;
        out->hash  = dt_data_hash_end(&hash);
        buf        = NULL;
    }
done:
    dt_free(buf);
    fclose(f);
    return st;
}

dt_status dt_tokens_init(dt_tokens *t, const void *data, size_t n, int width) {
    memset(t, 0, sizeof *t);
    DT_TRY(check_width(width, "dt_tokens_init"));
    size_t bytes;
    if (!dt_size_mul(&bytes, n, (size_t)width))
        return dt_fail(DT_ERR_ARG, "dt_tokens_init: %zu tokens overflow size_t", n);
    void *p = dt_alloc(bytes);
    if (!p)
        return DT_ERR_NOMEM;
    if (bytes)
        memcpy(p, data, bytes);
    t->data  = p;
    t->owned = p;
    t->n     = n;
    t->width = width;
    return DT_OK;
}

dt_status dt_tokens_slice(const dt_tokens *t, size_t begin, size_t end, dt_tokens *out) {
    if (begin > end || end > t->n)
        return dt_fail(DT_ERR_ARG,
                       "dt_tokens_slice: expected begin <= end <= %zu, found [%zu, %zu)", t->n,
                       begin, end);
    *out = (dt_tokens){
        .data  = (const uint8_t *)t->data + begin * (size_t)t->width,
        .n     = end - begin,
        .width = t->width,
        .owned = NULL,
    };
    return DT_OK;
}

void dt_tokens_split(const dt_tokens *all, dt_tokens *train, dt_tokens *val) {
    // 9 * n / 10 without overflow: n = 10q + r -> 9q + 9r/10.
    size_t q = all->n / 10, r = all->n % 10, cut = 9 * q + 9 * r / 10;
    dt_tokens_slice(all, 0, cut, train);
    dt_tokens_slice(all, cut, all->n, val);
}

void dt_tokens_free(dt_tokens *t) {
    if (!t)
        return;
    dt_free(t->owned);
    memset(t, 0, sizeof *t);
}

uint32_t dt_tokens_at(const dt_tokens *t, size_t i) {
    DT_DEBUG_ASSERT(i < t->n);
    const uint8_t *p = (const uint8_t *)t->data;
    if (t->width == 1)
        return p[i];
    return (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
}

dt_status dt_tokens_check_vocab(const dt_tokens *t, uint32_t vocab, const char *name) {
    name = name ? name : "tokens";
    if (vocab == 0)
        return dt_fail(DT_ERR_ARG, "%s: expected a vocabulary of at least 1 token, found 0", name);
    if (t->width == 1 && vocab >= 256)
        return DT_OK;
    for (size_t i = 0; i < t->n; i++) {
        uint32_t v = dt_tokens_at(t, i);
        if (v >= vocab)
            return dt_fail(DT_ERR_FORMAT,
                           "%s: expected tokens < %u (the vocabulary), found %u at position %zu",
                           name, vocab, v, i);
    }
    return DT_OK;
}

dt_status dt_tokens_windows(const dt_tokens *t, const uint64_t *offsets, size_t count, size_t T,
                            int32_t *x, int32_t *y) {
    for (size_t i = 0; i < count; i++)
        if (T >= t->n || offsets[i] > t->n - T - 1)
            return dt_fail(DT_ERR_ARG,
                           "token windows: expected offsets + %zu <= %zu tokens, found offset "
                           "%llu (sequence %zu)",
                           T + 1, t->n, (unsigned long long)offsets[i], i);
    const uint8_t *p = t->data;
    for (size_t i = 0; i < count; i++) {
        size_t   o  = (size_t)offsets[i];
        int32_t *xi = x + i * T, *yi = y + i * T;
        if (t->width == 1) {
            const uint8_t *s = p + o;
            for (size_t j = 0; j < T; j++) {
                xi[j] = s[j];
                yi[j] = s[j + 1];
            }
        } else {
            for (size_t j = 0; j < T; j++) {
                xi[j] = (int32_t)dt_tokens_at(t, o + j);
                yi[j] = (int32_t)dt_tokens_at(t, o + j + 1);
            }
        }
    }
    return DT_OK;
}

dt_status dt_tokens_draw(const dt_tokens *t, uint64_t seed, size_t B, size_t T, uint64_t *offsets) {
    if (T >= t->n)
        return dt_fail(DT_ERR_ARG,
                       "token batch: expected a stream longer than the window T = %zu, found %zu "
                       "tokens",
                       T, t->n);
    dt_mt19937 g;
    DT_TRY(dt_mt19937_init(&g, seed));
    return dt_mt19937_randint(&g, t->n - T, B, offsets);
}

dt_status dt_tokens_batch(const dt_tokens *t, uint64_t seed, size_t B, size_t T, int rank,
                          int world, uint64_t *offsets, int32_t *x, int32_t *y) {
    if (world < 1 || rank < 0 || rank >= world || B % (size_t)world)
        return dt_fail(DT_ERR_ARG,
                       "token batch: expected 0 <= rank < world and world dividing the global "
                       "batch, found rank %d, world %d, batch %zu",
                       rank, world, B);
    DT_TRY(dt_tokens_draw(t, seed, B, T, offsets));
    size_t b = B / (size_t)world;
    for (size_t j = 0; j < b; j++) // rank + world * j >= j: in place, front to back
        offsets[j] = offsets[(size_t)rank + (size_t)world * j];
    return dt_tokens_windows(t, offsets, b, T, x, y);
}

// ------------------------------------------------------------------------ corpus

typedef struct file_ent {
    char  *path;
    size_t size;
} file_ent;

typedef struct file_list {
    file_ent *e;
    size_t    n, cap;
} file_list;

static int cmp_paths(const void *a, const void *b) {
    return strcmp(((const file_ent *)a)->path, ((const file_ent *)b)->path);
}

static void list_free(file_list *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->e[i].path);
    free(l->e);
    memset(l, 0, sizeof *l);
}

static dt_status list_add(file_list *l, const char *path, size_t size) {
    if (l->n == l->cap) {
        size_t    cap = l->cap ? 2 * l->cap : 64;
        file_ent *e   = realloc(l->e, cap * sizeof *e);
        if (!e)
            return dt_fail(DT_ERR_NOMEM, "corpus: out of memory listing files");
        l->e   = e;
        l->cap = cap;
    }
    char *p = strdup(path);
    if (!p)
        return dt_fail(DT_ERR_NOMEM, "corpus: out of memory listing files");
    l->e[l->n++] = (file_ent){p, size};
    return DT_OK;
}

// The regular files (links followed) directly in `dir` with no dot in their names,
// sorted by name bytes (Python's str order for UTF-8 names: same prefix, same order).
static dt_status list_dir(const char *dir, file_list *l) {
    DIR *d = opendir(dir);
    if (!d)
        return dt_fail_errno(DT_ERR_IO, "%s: cannot open the directory", dir);
    dt_status      st = DT_OK;
    struct dirent *e;
    char           path[4096];
    while (st == DT_OK && (e = readdir(d)) != NULL) {
        if (strchr(e->d_name, '.'))
            continue; // also skips "." and ".."
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
            st = dt_fail(DT_ERR_ARG, "corpus: path too long under %s", dir);
            break;
        }
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            st = list_add(l, path, (size_t)sb.st_size);
    }
    closedir(d);
    if (st == DT_OK && l->n == 0)
        st = dt_fail(DT_ERR_IO, "%s: expected files without a dot in their names, found none", dir);
    if (st == DT_OK)
        qsort(l->e, l->n, sizeof *l->e, cmp_paths);
    return st;
}

dt_status dt_corpus_read(const char *path, size_t limit, dt_tokens *out, size_t *nfiles) {
    memset(out, 0, sizeof *out);
    if (nfiles)
        *nfiles = 0;
    if (!path || !*path)
        path = DT_FORTUNES_DIR;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dt_fail_errno(DT_ERR_IO,
                             "%s: no such file or directory (Debian: apt-get install fortunes, or "
                             "pass a file of bytes)",
                             path);
    file_list l  = {0};
    dt_status st = DT_OK;
    if (S_ISDIR(sb.st_mode))
        st = list_dir(path, &l);
    else if (S_ISREG(sb.st_mode))
        st = list_add(&l, path, (size_t)sb.st_size);
    else
        st = dt_fail(DT_ERR_IO, "%s: expected a regular file or a directory, found %s", path,
                     dt_file_kind(sb.st_mode));
    size_t total = 0;
    for (size_t i = 0; st == DT_OK && i < l.n; i++)
        if (!dt_size_add(&total, total, l.e[i].size))
            st = dt_fail(DT_ERR_ARG, "%s: the corpus size overflows size_t", path);
    if (limit && limit < total)
        total = limit;
    uint8_t *buf = st == DT_OK ? dt_alloc(total) : NULL;
    if (st == DT_OK && !buf)
        st = DT_ERR_NOMEM;
    size_t       at = 0;
    dt_data_hash hash; // of the bytes kept, over all the files
    dt_data_hash_init(&hash);
    for (size_t i = 0; st == DT_OK && i < l.n && at < total; i++) {
        size_t   take = l.e[i].size < total - at ? l.e[i].size : total - at;
        FILE    *f;
        uint64_t fsize;
        if ((st = dt_open_regular(l.e[i].path, &f, &fsize)) != DT_OK)
            break;
        st = read_exact(f, buf + at, take, l.e[i].path, &hash);
        fclose(f);
        at += take;
    }
    if (st == DT_OK) {
        out->data  = buf;
        out->owned = buf;
        out->n     = total;
        out->width = 1;
        out->hash  = dt_data_hash_end(&hash);
        if (nfiles)
            *nfiles = l.n;
    } else {
        dt_free(buf);
    }
    list_free(&l);
    return st;
}
