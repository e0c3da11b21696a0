// gpt.h: dtrain-gpt's tiny model as the tests run it, and its saved models compared.
#ifndef DTRAIN_TESTS_GPT_H
#define DTRAIN_TESTS_GPT_H

#include "dtrain/params.h"

#include <stdbool.h>

// The tiny model's flags (1 layer, C 32, 2 heads, T 32, global batch 8).
#define GPT_TINY "--n-layer 1 --n-embd 32 --n-head 2 --block-size 32 --batch-size 8 --lr 3e-3 "

// The tiny model's table as dtrain-gpt names it (allocated; NULL when it could not be
// made), for dt_ckpt_load_params.
dt_params *gpt_tiny_table(void);

// Two of the tiny model's --save-model files: the largest difference of a parameter in
// *maxd and the sum of |a| (how far a moved from zero) in *moved; false when either
// does not load.
bool gpt_tiny_diff(const char *a, const char *b, double *maxd, double *moved);

// Writes the tests' corpus to path: 40,000 bytes of lines of 4..9 words drawn from 20
// (a byte is well predicted by the bytes before it in its word). *unigram (when not
// NULL): the unigram entropy (nats) of its first 9/10, dtrain-gpt's training split.
bool gpt_write_corpus(const char *path, double *unigram);

#endif // DTRAIN_TESTS_GPT_H
