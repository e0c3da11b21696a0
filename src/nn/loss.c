// loss.c: NLL and cross-entropy with mean reduction, and an accuracy count.
#include "dtrain/nn.h"

#include <math.h>
#include <string.h>

// The words of every classification loss that finds no class targets: a batch of a
// dataset with float targets (dt_batch.t) has none (dt_batch.y is NULL).
#define NO_CLASS_TARGETS                                                                           \
    "expected int32 class indices as targets, found none (NULL): a dataset whose labels are "      \
    "floats has regression targets (dt_batch.t), which a classification loss cannot take; "        \
    "store the labels as integers (an integer .npy) or use a regression loss (dt_loss_mse)"

static dt_status check_targets(const int32_t *target, int batch, int classes) {
    if (!target)
        return dt_fail(DT_ERR_ARG, "loss: " NO_CLASS_TARGETS);
    if (batch < 1 || classes < 1)
        return dt_fail(DT_ERR_ARG, "loss: expected batch >= 1 and classes >= 1, found %d and %d",
                       batch, classes);
    for (int s = 0; s < batch; s++)
        if (target[s] < 0 || target[s] >= classes)
            return dt_fail(DT_ERR_ARG, "loss: target of sample %d is %d, expected 0 to %d", s,
                           (int)target[s], classes - 1);
    return DT_OK;
}

static dt_status check_over(int batch, int over) {
    if (over < batch)
        return dt_fail(DT_ERR_ARG,
                       "loss: expected a divisor of the mean at least the batch (%d), found %d",
                       batch, over);
    return DT_OK;
}

dt_status dt_loss_nll(const float *logp, const int32_t *target, int batch, int classes, float *loss,
                      float *dlogp) {
    return dt_loss_nll_over(logp, target, batch, classes, batch, loss, dlogp);
}

dt_status dt_loss_nll_over(const float *logp, const int32_t *target, int batch, int classes,
                           int over, float *loss, float *dlogp) {
    DT_TRY(check_targets(target, batch, classes));
    DT_TRY(check_over(batch, over));
    double sum = 0.0;
    for (int s = 0; s < batch; s++)
        sum -= logp[(size_t)s * classes + target[s]];
    *loss = (float)(sum / batch);
    if (dlogp) {
        memset(dlogp, 0, sizeof(float) * (size_t)batch * classes);
        for (int s = 0; s < batch; s++)
            dlogp[(size_t)s * classes + target[s]] = -1.0f / (float)over;
    }
    return DT_OK;
}

dt_status dt_loss_cross_entropy(const float *logits, const int32_t *target, int batch, int classes,
                                float *loss, float *dlogits) {
    return dt_loss_cross_entropy_over(logits, target, batch, classes, batch, loss, dlogits);
}

dt_status dt_loss_cross_entropy_over(const float *logits, const int32_t *target, int batch,
                                     int classes, int over, float *loss, float *dlogits) {
    DT_TRY(check_targets(target, batch, classes));
    DT_TRY(check_over(batch, over));
    double sum = 0.0;
    for (int s = 0; s < batch; s++) {
        const float *x = logits + (size_t)s * classes;
        float        m = x[0];
        for (int i = 1; i < classes; i++)
            m = x[i] > m ? x[i] : m;
        double z = 0.0;
        for (int i = 0; i < classes; i++)
            z += exp((double)(x[i] - m));
        double lse = m + log(z);
        sum += lse - x[target[s]];
        if (dlogits) { // (softmax - onehot) / over
            float *d = dlogits + (size_t)s * classes;
            for (int i = 0; i < classes; i++)
                d[i] = (float)(exp((double)x[i] - lse) / over);
            d[target[s]] -= 1.0f / (float)over;
        }
    }
    *loss = (float)(sum / batch);
    return DT_OK;
}

int dt_count_correct(const float *scores, const int32_t *target, int batch, int classes) {
    int correct = 0;
    for (int s = 0; s < batch; s++) {
        const float *x    = scores + (size_t)s * classes;
        int          best = 0;
        for (int i = 1; i < classes; i++)
            if (x[i] > x[best])
                best = i;
        correct += best == target[s];
    }
    return correct;
}
