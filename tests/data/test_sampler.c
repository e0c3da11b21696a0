// test_sampler.c: the DistributedSampler against ANCHORS §3.1's worked examples and
// against a brute-force transcription of PyTorch's __iter__ (build the list, pad it by
// appending, slice it) for many (N, R, drop_last, shuffle, epoch); partition
// properties across ranks; the global batches of R ranks are the one-process batches;
// evaluation mode; auto epoch; resume mid-epoch.
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/rng.h"

#include <stdlib.h>

static dt_sampler *make(size_t n, int R, int r, bool shuffle, bool drop_last, uint64_t seed) {
    dt_sampler_opts o = dt_sampler_opts_default();
    o.num_replicas    = R;
    o.rank            = r;
    o.shuffle         = shuffle;
    o.drop_last       = drop_last;
    o.seed            = seed;
    dt_sampler *s     = NULL;
    dt_sampler_new(&s, n, &o);
    CHECK(s != NULL);
    return s;
}

// Drains one pass through dt_sampler_next into out; returns the count.
static size_t drain(dt_sampler *s, size_t *out, size_t cap) {
    size_t k = 0, idx;
    while (dt_sampler_next(s, &idx)) {
        if (k < cap)
            out[k] = idx;
        k++;
    }
    return k;
}

static void test_anchor_examples(void) {
    // N=10, R=4, no shuffle: padded list 0..9,0,1.
    static const size_t pad[4][3]  = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
    static const size_t drop[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
    for (int r = 0; r < 4; r++) {
        size_t      got[8];
        dt_sampler *s = make(10, 4, r, false, false, 0);
        CHECK_EQ(dt_sampler_num_samples(s), 3);
        CHECK_EQ(dt_sampler_total_size(s), 12);
        dt_sampler_begin(s);
        CHECK_EQ(drain(s, got, 8), 3);
        for (int i = 0; i < 3; i++)
            CHECK_EQ(got[i], pad[r][i]);
        dt_sampler_free(s);

        s = make(10, 4, r, false, true, 0);
        CHECK_EQ(dt_sampler_num_samples(s), 2);
        CHECK_EQ(dt_sampler_total_size(s), 8);
        dt_sampler_begin(s);
        CHECK_EQ(drain(s, got, 8), 2);
        for (int i = 0; i < 2; i++)
            CHECK_EQ(got[i], drop[r][i]);
        dt_sampler_free(s);
    }
}

// PyTorch's DistributedSampler.__iter__, step by step, with the documented generator
// (dt_rng_permutation seeded with seed + epoch). Returns rank r's list (caller frees).
static size_t *reference(size_t N, size_t R, size_t r, bool shuffle, bool drop_last, uint64_t seed,
                         uint64_t epoch, size_t *count) {
    size_t  num_samples = (drop_last && N % R != 0)
                              ? (size_t)ceil(((double)N - (double)R) / (double)R)
                              : (size_t)ceil((double)N / (double)R);
    size_t  total       = num_samples * R;
    size_t  cap         = N + total + 1;
    size_t *list = malloc(cap * sizeof *list), len = N;
    if (shuffle) {
        uint32_t *perm = malloc((N + 1) * sizeof *perm);
        dt_rng    g    = dt_rng_init(seed + epoch);
        dt_rng_permutation(&g, perm, N);
        for (size_t i = 0; i < N; i++)
            list[i] = perm[i];
        free(perm);
    } else {
        for (size_t i = 0; i < N; i++)
            list[i] = i;
    }
    if (!drop_last) {
        size_t padding = total - len;
        if (padding <= len) { // indices += indices[:padding]
            for (size_t i = 0; i < padding; i++)
                list[len + i] = list[i];
        } else { // indices += (indices * ceil(padding / len))[:padding]
            size_t reps = (padding + len - 1) / len, k = 0;
            for (size_t rep = 0; rep < reps; rep++)
                for (size_t i = 0; i < len && k < padding; i++)
                    list[len + k++] = list[i];
        }
        len += padding;
    } else {
        len = total; // indices = indices[:total_size]
    }
    size_t *mine = malloc((num_samples + 1) * sizeof *mine), k = 0;
    for (size_t p = r; p < len; p += R) // indices[rank:total_size:num_replicas]
        mine[k++] = list[p];
    free(list);
    *count = k;
    return mine;
}

static void test_against_reference(void) {
    static const size_t Ns[]       = {0, 1, 2, 3, 5, 7, 10, 12, 13, 16, 31, 64, 100, 257};
    int                 mismatches = 0, cases = 0;
    for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
        size_t N = Ns[ni];
        for (size_t R = 1; R <= 7; R++) {
            for (int flags = 0; flags < 4; flags++) {
                bool     shuffle = flags & 1, drop_last = flags & 2;
                uint64_t seed = 1000 * ni + R;
                // Every rank's list, per epoch; checked against the reference and then
                // as a union.
                size_t *all = malloc((N + 2 * R + 1) * R * sizeof *all);
                for (uint64_t epoch = 0; epoch < 3; epoch++) {
                    size_t nall = 0;
                    for (size_t r = 0; r < R; r++) {
                        dt_sampler *s = make(N, (int)R, (int)r, shuffle, drop_last, seed);
                        if (!s)
                            continue;
                        dt_sampler_set_epoch(s, epoch);
                        dt_sampler_begin(s);
                        CHECK_EQ(dt_sampler_epoch(s), epoch);
                        size_t  rc;
                        size_t *ref = reference(N, R, r, shuffle, drop_last, seed, epoch, &rc);
                        size_t  cnt;
                        const uint32_t *ix = dt_sampler_indices(s, &cnt);
                        cases++;
                        bool same = cnt == rc && cnt == dt_sampler_num_samples(s);
                        for (size_t i = 0; same && i < cnt; i++)
                            same = ix[i] == ref[i];
                        if (!same && mismatches++ < 5)
                            fprintf(stderr,
                                    "     mismatch N=%zu R=%zu r=%zu shuffle=%d drop_last=%d "
                                    "epoch=%llu\n",
                                    N, R, r, shuffle, drop_last, (unsigned long long)epoch);
                        for (size_t i = 0; i < cnt; i++)
                            all[nall++] = ix[i];
                        CHECK_EQ(dt_sampler_total_size(s), cnt * R);
                        free(ref);
                        dt_sampler_free(s);
                    }
                    // Union over ranks: the padded (or truncated) list as a multiset.
                    size_t *hist = calloc(N + 1, sizeof *hist);
                    for (size_t i = 0; i < nall; i++)
                        if (all[i] < N)
                            hist[all[i]]++;
                        else
                            mismatches++;
                    size_t total = nall;
                    if (N > 0 && !drop_last) {
                        // Positions 0..total-1 of the cyclic list: index list[p mod N].
                        // Each sample appears floor(total/N) or that + 1 times.
                        for (size_t i = 0; i < N; i++)
                            if (hist[i] < total / N || hist[i] > total / N + 1)
                                mismatches++;
                    }
                    if (drop_last || (N % R) == 0) {
                        // No padding: disjoint across ranks.
                        for (size_t i = 0; i < N; i++)
                            if (hist[i] > 1)
                                mismatches++;
                        CHECK_EQ(total, (N / R) * R);
                    }
                    free(hist);
                }
                free(all);
            }
        }
    }
    CHECK_EQ(mismatches, 0);
    CHECK(cases > 1000);
}

static void test_eval_mode(void) {
    for (size_t N = 0; N < 40; N += 3) {
        for (int R = 1; R <= 6; R++) {
            int *seen = calloc(N + 1, sizeof *seen);
            for (int r = 0; r < R; r++) {
                dt_sampler_opts o = dt_sampler_opts_default();
                o.num_replicas    = R;
                o.rank            = r;
                o.eval            = true;
                o.shuffle         = (N + (size_t)R) % 2;
                o.drop_last       = true; // ignored in evaluation mode
                dt_sampler *s     = NULL;
                dt_sampler_new(&s, N, &o);
                dt_sampler_begin(s);
                size_t          cnt;
                const uint32_t *ix = dt_sampler_indices(s, &cnt);
                // Rank r gets positions r, r+R, ... < N.
                size_t want = 0;
                for (size_t p = (size_t)r; p < N; p += (size_t)R)
                    want++;
                CHECK_EQ(cnt, want);
                CHECK_EQ(dt_sampler_num_samples(s), want);
                for (size_t i = 0; i < cnt; i++)
                    if (ix[i] < N)
                        seen[ix[i]]++;
                if (!o.shuffle)
                    for (size_t i = 0; i < cnt; i++)
                        CHECK_EQ(ix[i], (size_t)r + i * (size_t)R);
                dt_sampler_free(s);
            }
            int bad = 0;
            for (size_t i = 0; i < N; i++)
                bad += seen[i] != 1;
            CHECK_EQ(bad, 0); // every sample exactly once across ranks
            free(seen);
        }
    }
}

static bool same_order(const uint32_t *a, const uint32_t *b, size_t n) {
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void test_auto_epoch(void) {
    size_t          N = 100, n;
    dt_sampler     *s = make(N, 2, 1, true, false, 42);
    uint32_t        e0[50], e1[50], tmp[50];
    const uint32_t *ix;
    CHECK_EQ(dt_sampler_epoch(s), 0);
    dt_sampler_begin(s);
    CHECK_EQ(dt_sampler_epoch(s), 0);
    ix = dt_sampler_indices(s, &n);
    memcpy(e0, ix, sizeof e0);
    // A second pass without set_epoch moves to epoch 1 by itself.
    dt_sampler_begin(s);
    CHECK_EQ(dt_sampler_epoch(s), 1);
    memcpy(e1, dt_sampler_indices(s, NULL), sizeof e1);
    CHECK(!same_order(e0, e1, 50));
    // It is exactly what set_epoch(1) gives on a fresh sampler.
    dt_sampler *f = make(N, 2, 1, true, false, 42);
    dt_sampler_set_epoch(f, 1);
    dt_sampler_begin(f);
    CHECK(same_order(dt_sampler_indices(f, NULL), e1, 50));
    dt_sampler_free(f);
    // An explicit set_epoch wins, even to repeat an epoch.
    dt_sampler_set_epoch(s, 0);
    dt_sampler_begin(s);
    CHECK_EQ(dt_sampler_epoch(s), 0);
    CHECK(same_order(dt_sampler_indices(s, NULL), e0, 50));
    dt_sampler_set_epoch(s, 7);
    dt_sampler_begin(s);
    CHECK_EQ(dt_sampler_epoch(s), 7);
    memcpy(tmp, dt_sampler_indices(s, NULL), sizeof tmp);
    dt_sampler_begin(s); // ... and the passes after it continue from there
    CHECK_EQ(dt_sampler_epoch(s), 8);
    // Calling set_epoch every epoch (the PyTorch idiom) gives exactly those epochs.
    for (uint64_t e = 3; e < 6; e++) {
        dt_sampler_set_epoch(s, e);
        dt_sampler_begin(s);
        CHECK_EQ(dt_sampler_epoch(s), e);
    }
    dt_sampler_free(s);

    // auto_epoch off: PyTorch's behaviour, the same order every pass.
    dt_sampler_opts o = dt_sampler_opts_default();
    o.num_replicas    = 2;
    o.rank            = 1;
    o.seed            = 42;
    o.auto_epoch      = false;
    dt_sampler_new(&s, N, &o);
    dt_sampler_begin(s);
    dt_sampler_begin(s);
    CHECK_EQ(dt_sampler_epoch(s), 0);
    CHECK(same_order(dt_sampler_indices(s, NULL), e0, 50));
    dt_sampler_free(s);

    // Different seeds give different orders; shuffle off ignores the epoch.
    s = make(N, 2, 1, true, false, 43);
    dt_sampler_begin(s);
    CHECK(!same_order(dt_sampler_indices(s, NULL), e0, 50));
    dt_sampler_free(s);
    s = make(N, 2, 1, false, false, 0);
    dt_sampler_begin(s);
    memcpy(tmp, dt_sampler_indices(s, NULL), sizeof tmp);
    dt_sampler_begin(s);
    CHECK_EQ(dt_sampler_epoch(s), 1);
    CHECK(same_order(dt_sampler_indices(s, NULL), tmp, 50));
    dt_sampler_free(s);
}

static void test_single_process_shuffle(void) {
    // R = 1 with shuffle: a permutation of the whole dataset, new each epoch.
    size_t      N = 1000;
    dt_sampler *s = make(N, 1, 0, true, false, 7);
    CHECK_EQ(dt_sampler_num_samples(s), N);
    int *seen = calloc(N, sizeof *seen);
    for (int e = 0; e < 3; e++) {
        dt_sampler_begin(s);
        size_t idx, k = 0, fixed = 0;
        memset(seen, 0, N * sizeof *seen);
        while (dt_sampler_next(s, &idx)) {
            seen[idx]++;
            fixed += idx == k;
            k++;
        }
        CHECK_EQ(k, N);
        int bad = 0;
        for (size_t i = 0; i < N; i++)
            bad += seen[i] != 1;
        CHECK_EQ(bad, 0);
        CHECK(fixed < 20); // shuffled: few fixed points (expected 1)
    }
    free(seen);
    dt_sampler_free(s);
}

static void test_resume(void) {
    size_t      N = 97;
    dt_sampler *a = make(N, 3, 2, true, false, 5);
    size_t      full[40], rest[40], idx;
    dt_sampler_begin(a); // epoch 0
    dt_sampler_begin(a); // epoch 1 (auto)
    CHECK_EQ(drain(a, full, 40), 33);
    // Stop after 14 indices of epoch 1: the state a checkpoint saves.
    dt_sampler_set_epoch(a, 1);
    dt_sampler_begin(a);
    for (int i = 0; i < 14; i++)
        dt_sampler_next(a, &idx);
    uint64_t epoch = dt_sampler_epoch(a);
    size_t   pos   = dt_sampler_position(a);
    CHECK_EQ(epoch, 1);
    CHECK_EQ(pos, 14);
    dt_sampler_free(a);

    dt_sampler *b = make(N, 3, 2, true, false, 5);
    CHECK_OK(dt_sampler_resume(b, epoch, pos));
    dt_sampler_begin(b);
    CHECK_EQ(dt_sampler_epoch(b), 1);
    CHECK_EQ(dt_sampler_position(b), 14);
    size_t k = drain(b, rest, 40);
    CHECK_EQ(k, 33 - 14);
    CHECK(memcmp(rest, full + 14, k * sizeof *rest) == 0);
    // The pass after the resumed one is a whole epoch 2.
    dt_sampler_begin(b);
    CHECK_EQ(dt_sampler_epoch(b), 2);
    CHECK_EQ(dt_sampler_position(b), 0);
    // A set_epoch to another epoch drops the pending position; to the same keeps it.
    CHECK_OK(dt_sampler_resume(b, 4, 10));
    dt_sampler_set_epoch(b, 5);
    dt_sampler_begin(b);
    CHECK_EQ(dt_sampler_position(b), 0);
    CHECK_OK(dt_sampler_resume(b, 4, 10));
    dt_sampler_set_epoch(b, 4);
    dt_sampler_begin(b);
    CHECK_EQ(dt_sampler_position(b), 10);
    CHECK_ERR(dt_sampler_resume(b, 4, 34), DT_ERR_ARG,
              "expected a position in [0, 33] (samples per pass), found 34");
    dt_sampler_free(b);
}

// World-size invariance (DESIGN.md): with a global batch B and R ranks of batch B / R,
// the union of the R local batches k is the one-process batch k, the last short one
// included, for every epoch, whenever R divides N (no padding). Rank r's i-th index is
// list[r + i R], so local batch k covers positions [k B, (k + 1) B) of the same list.
static void test_global_batches(void) {
    enum { N = 1000, B = 48 };
    static bool mark[N];
    size_t      one[N], local[N];
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        dt_sampler *s1 = make(N, 1, 0, true, false, 7);
        dt_sampler_set_epoch(s1, epoch);
        dt_sampler_begin(s1);
        CHECK_EQ(drain(s1, one, N), N);
        dt_sampler_free(s1);
        for (int R = 2; R <= 8; R *= 2) {
            size_t b = B / R, nb = (N / R + b - 1) / b;
            CHECK_EQ(nb, (N + B - 1) / B);
            bool same = true;
            for (size_t k = 0; k < nb; k++) {
                memset(mark, 0, sizeof mark);
                size_t count = 0;
                for (int r = 0; r < R; r++) {
                    dt_sampler *s = make(N, R, r, true, false, 7);
                    dt_sampler_set_epoch(s, epoch);
                    dt_sampler_begin(s);
                    size_t n = drain(s, local, N);
                    for (size_t i = k * b; i < (k + 1) * b && i < n; i++, count++)
                        mark[local[i]] = true;
                    dt_sampler_free(s);
                }
                size_t end = (k + 1) * B < N ? (k + 1) * B : N;
                same &= count == end - k * B;
                for (size_t i = k * B; i < end; i++)
                    same &= mark[one[i]];
            }
            CHECK(same);
        }
    }
}

static void test_bad_args(void) {
    dt_sampler_opts o = dt_sampler_opts_default();
    o.num_replicas    = 4;
    o.rank            = 4;
    CHECK(dt_sampler_new(&(dt_sampler *){NULL}, 10, &o) != DT_OK);
    CHECK(dt_last_status() == DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "expected a rank in [0, 4), found 4") != NULL);
    o.rank = -1;
    CHECK(dt_sampler_new(&(dt_sampler *){NULL}, 10, &o) != DT_OK);
    CHECK(strstr(dt_last_error(), "found -1") != NULL);
    o.num_replicas = 0;
    o.rank         = 0;
    CHECK(dt_sampler_new(&(dt_sampler *){NULL}, 10, &o) != DT_OK);
    CHECK(strstr(dt_last_error(), "expected num_replicas >= 1, found 0") != NULL);
    o.num_replicas = 1;
    CHECK(dt_sampler_new(&(dt_sampler *){NULL}, (size_t)UINT32_MAX + 1, &o) != DT_OK);
    CHECK(strstr(dt_last_error(), "expected at most 4294967295 samples") != NULL);
    // Before the first begin there is nothing to take.
    dt_sampler *s = NULL;
    dt_sampler_new(&s, 5, NULL);
    size_t idx;
    CHECK(!dt_sampler_next(s, &idx));
    dt_sampler_free(s);
    dt_sampler_free(NULL);
}

int main(void) {
    RUN(test_anchor_examples);
    RUN(test_against_reference);
    RUN(test_eval_mode);
    RUN(test_auto_epoch);
    RUN(test_single_process_shuffle);
    RUN(test_resume);
    RUN(test_global_batches);
    RUN(test_bad_args);
    return check_summary();
}
