// memory.c: the trainer's memory budget (--max-rank-memory) and what --zero 3 needs
// from the loop: the whole parameters gathered for a checkpoint or a saved model and
// given back after, the state's size and traffic for the program's report.
#include "train_impl.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_train_parse_bytes(const char *s, uint64_t *out) {
    char  *end = NULL;
    double v   = s ? strtod(s, &end) : NAN;
    double k   = 1;
    if (end && *end) {
        switch (toupper((unsigned char)*end)) {
        case 'K':
            k = 1024.0, end++;
            break;
        case 'M':
            k = 1048576.0, end++;
            break;
        case 'G':
            k = 1073741824.0, end++;
            break;
        case 'T':
            k = 1099511627776.0, end++;
            break;
        default:
            break;
        }
        if (k > 1 && (*end == 'i' || *end == 'I') && toupper((unsigned char)end[1]) == 'B')
            end += 2;
        else if (k > 1 && toupper((unsigned char)*end) == 'B')
            end++;
    }
    if (!s || end == s || *end || !(v * k >= 1) || v * k > 9e18)
        return dt_fail(DT_ERR_ARG,
                       "--max-rank-memory expects a size in bytes, with K, M, G or T for 2^10, "
                       "2^20, 2^30 or 2^40 (\"512M\", \"1.5G\"), found \"%s\"",
                       s ? s : "");
    *out = (uint64_t)(v * k);
    return DT_OK;
}

static double mib(size_t b) {
    return (double)b / 1048576.0;
}

dt_status dt_train_plan_memory(dt_trainer *t, dt_params *p, dt_optim *opt, dt_zero_opts *zo) {
    dt_zero_memory m;
    int            world = dt_train_dp_size(t); // the ranks ZeRO shards over (the mesh's dp)
    DT_TRY(dt_zero_plan_memory(p, opt, world, zo, &m));
    t->plan_bytes = m.total;
    char work[64] = "";
    if (zo->stage == 3)
        snprintf(work, sizeof work, " + the largest unit's %.2f", mib(m.working));
    char name[32] = "plain DDP (--zero 0)";
    if (zo->stage)
        snprintf(name, sizeof name, "ZeRO-%d", zo->stage);
    if (t->budget && m.total > t->budget) {
        char hint[160] = "";
        if (zo->stage < 3 && world > 1) {
            dt_zero_opts   z3 = *zo;
            dt_zero_memory m3;
            z3.stage = 3;
            if (dt_zero_plan_memory(p, opt, world, &z3, &m3) == DT_OK)
                snprintf(hint, sizeof hint, "; --zero 3 needs %.2f MiB per rank at %d ranks%s",
                         mib(m3.total), world, m3.total <= t->budget ? " and fits" : "");
        } else if (world == 1) {
            snprintf(hint, sizeof hint, "; more ranks with --zero 3 share it");
        }
        return dt_fail(DT_ERR_ARG,
                       "--max-rank-memory: %s needs %.2f MiB per rank for parameters (%.2f), "
                       "gradients (%.2f) and %s state (%.2f)%s, over the budget of %.2f MiB%s",
                       name, mib(m.total), mib(m.params), mib(m.grads), dt_optim_name(opt),
                       mib(m.optim), work, mib(t->budget), hint);
    }
    if (zo->stage == 3 && t->budget) // what the shard leaves to the gathered units
        zo->max_live_bytes = t->budget - (m.total - m.working);
    char budget[48] = "";
    if (t->budget)
        snprintf(budget, sizeof budget, " (budget %.2f MiB)", mib(t->budget));
    if (zo->stage == 3 || t->budget)
        dt_trainer_print(t,
                         "memory per rank: parameters %.2f + gradients %.2f + %s state %.2f%s = "
                         "%.2f MiB%s\n",
                         mib(m.params), mib(m.grads), dt_optim_name(opt), mib(m.optim), work,
                         mib(m.total), budget);
    return DT_OK;
}

void dt_trainer_state_bytes(const dt_trainer *t, double *peak, double *moved_per_step) {
    dt_strategy_state_bytes(t->strat, peak, moved_per_step);
}
