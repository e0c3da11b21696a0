// tree.h: the fixed reduction tree over n values that gradient shards and DT_ORDER_TREE
// share (nn.h, dt_model_set_grad_shards; comm.h, dt_reduce_order). Value k takes value
// k + h for h = the largest power of two below n, then h/2, ..., 1, for every k < h with
// k + h < n; the sum ends in value 0. Six values: 0+=4, 1+=5; 0+=2, 1+=3; 0+=1.
//
// Why it splits across ranks: with the batch's V shards dealt to N ranks round-robin
// (rank r holds shards r, r + N, ...), the steps h that N divides pair shards of one
// rank, and they are that rank's own tree over its V/N shards; the steps below N are
// the tree over the ranks. That holds when N is a power of two dividing V, and when
// N = V (one shard each); for other N (3 of 6) the first step already pairs shards of
// two ranks, and no single tree can serve both 2 and 3 ranks out of 6 (a tree whose
// subtrees are both {0,2,4} and {0,3} does not exist): dt_tree_splits says which. (An
// order that splits for every divisor, contiguous shards and a chain across the ranks,
// is designed in docs/dtrun.md, "Every divisor of V"; not built.)
//
// The same additions are not yet the same numbers: each sample's loss gradient must
// have one divisor in every world. A rank that divides by its own batch B/N, its sum
// then averaged over N, rounds unlike one division by B unless N is a power of two; so
// under --invariant every rank divides by the global batch and DDP sums the ranks
// (train.h, dt_trainer_loss_over; ddp.h, dt_ddp_set_sum): then every world of
// dt_tree_splits, N = V = 3 or 6 included, is bitwise the one-process model.
#ifndef DTRAIN_CORE_TREE_H
#define DTRAIN_CORE_TREE_H

#include <stdbool.h>

// The first step of the tree over n values: the largest power of two below n; 0 when
// n <= 1 (nothing to add).
static inline int dt_tree_top(int n) {
    int h = 1;
    while (2 * h < n)
        h *= 2;
    return n > 1 ? h : 0;
}

// Whether the tree over v values equals each of `ranks` ranks' tree over its v/ranks
// shards (dealt round-robin) followed by the tree over the ranks: ranks divides v and
// is a power of two or v itself.
static inline bool dt_tree_splits(long v, long ranks) {
    return ranks >= 1 && v >= 1 && v % ranks == 0 && ((ranks & (ranks - 1)) == 0 || ranks == v);
}

#endif
