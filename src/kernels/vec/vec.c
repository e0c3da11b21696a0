// vec.c: the rows this target's vector kernels fill (vec.h).
#include "kernels/vec/vec.h"

void DT_KV(fill)(dt_ktab *t) {
    DT_KV(fill_act)(t);
    DT_KV(fill_conv)(t);
    DT_KV(fill_conv_wide)(t);
    DT_KV(fill_shifted)(t);
    DT_KV(fill_norm)(t);
    DT_KV(fill_attn)(t);
    DT_KV(fill_optim)(t);
    DT_KV(fill_half)(t);
    DT_KV(fill_reduce)(t);
}
