// fill.c: the ref target's hand-written rows (the vector kernels of vec/ fill the rest).
#include "kernels/fill.h"

void dt_kfill_ref(dt_ktab *t) {
    t->sgemm = dt_k_sgemm_ref;
    dt_kfill_half_ref(t);
}
